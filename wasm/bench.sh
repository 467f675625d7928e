#!/usr/bin/env bash
# The WASM benchmark of docs/benchmarks.md: .wasm size after wasm-opt, and
# fingerprints per second of a ~500-byte order body natively, in Node and in
# headless Chromium (same Rust code, same body).
#
#   wasm/bench.sh [SECONDS]     (default 3 s per runtime)
set -euo pipefail
WASM_DIR="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$WASM_DIR/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
SECONDS_PER_RUN="${1:-3}"
[ -x /usr/bin/chromium ] || { apt-get install -y chromium >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y chromium >/dev/null; }; }
bash "$WASM_DIR/build.sh" >/dev/null
echo "{\"wasm_bytes\":$(stat -c %s "$WASM_DIR/pkg/web/keyhold_fingerprint_bg.wasm")}"
cargo run -q -p keyhold-wasm --release --example bench_native -- "$SECONDS_PER_RUN"
node "$WASM_DIR/bench/bench.mjs" "$SECONDS_PER_RUN"
