#!/usr/bin/env bash
# Everything that proves the browser side (issue 6), on a fresh Debian machine:
#   1. installs what is missing (chromium + chromium-driver, Node >= 20; build.sh
#      adds the wasm32 target, wasm-bindgen-cli and the npm tooling),
#   2. builds the package and demo site (wasm/build.sh) and checks that the
#      compiled-in demo files (wasm/dist) equal that build,
#   3. native unit tests of keyhold-wasm,
#   4. the parity corpus (10,000 seeded bodies) from native Rust, checked by
#      WASM in Node, WASM in headless Chromium and a pure-JS reference in both,
#   5. the client's retry rules in Node,
#   6. end to end: Chromium, the demo page and a real `keyhold up`.
# Ends with one line `N passed, N failed`; exits non-zero on any failure.
#
#   wasm/test.sh            (KEYHOLD_PARITY_CASES=N for another corpus size)
set -uo pipefail
WASM_DIR="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$WASM_DIR/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
CASES="${KEYHOLD_PARITY_CASES:-10000}"
SEED="${KEYHOLD_PARITY_SEED:-20240611}"
NUMBERS="${KEYHOLD_ES6NUMBERS:-$REPO/../shared/vectors/es6numbers.txt}"
PASSED=0
FAILED=0
WORK="$(mktemp -d "${TMPDIR:-/tmp}/keyhold-wasm-test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

step() { echo "== wasm/test.sh: $*"; }
broken() { # a step that could not run counts as one failure
    echo "FAILED: $*" >&2
    FAILED=$((FAILED + 1))
}
finish() {
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
    exit $?
}

apt_install() { # apt-get update only when the local lists cannot provide them
    apt-get install -y "$@" >/dev/null 2>&1 || {
        apt-get update >/dev/null && apt-get install -y "$@" >/dev/null
    }
}

step "checking the tools"
if [ ! -x /usr/bin/chromium ] || ! command -v chromedriver >/dev/null; then
    step "installing chromium and chromium-driver"
    apt_install chromium chromium-driver || broken "apt-get install chromium chromium-driver"
fi
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' 2>/dev/null; then
    step "installing nodejs and npm"
    apt_install nodejs npm || broken "apt-get install nodejs npm"
    node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' ||
        { broken "Node.js >= 20 is needed (found $(node --version 2>/dev/null || echo none))"; finish; }
fi

step "building the package (wasm/build.sh)"
bash "$WASM_DIR/build.sh" || { broken "wasm/build.sh"; finish; }
# The nodes compile wasm/dist in (the demo at /demo needs no build step), so the
# committed files must be exactly what this build produced.
if git -C "$REPO" diff --quiet -- wasm/dist &&
    [ -z "$(git -C "$REPO" ls-files --others --exclude-standard -- wasm/dist)" ]; then
    PASSED=$((PASSED + 1))
else
    git -C "$REPO" status --short -- wasm/dist
    broken "wasm/dist differs from a fresh build: commit the rebuilt files"
fi
WASM_BYTES="$(stat -c %s "$WASM_DIR/pkg/web/keyhold_fingerprint_bg.wasm")"
echo "   .wasm after wasm-opt: $WASM_BYTES bytes ($((WASM_BYTES / 1024)) KiB)"
if [ "$WASM_BYTES" -le $((150 * 1024)) ]; then PASSED=$((PASSED + 1)); else broken ".wasm over 150 KiB"; fi

step "native unit tests of keyhold-wasm"
if cargo test -p keyhold-wasm --lib >"$WORK/cargo-test.log" 2>&1; then :; else broken "cargo test -p keyhold-wasm"; fi
grep -E "^test |test result" "$WORK/cargo-test.log"
while read -r p f; do
    PASSED=$((PASSED + p)); FAILED=$((FAILED + f))
done < <(sed -nE 's/^test result: [a-zA-Z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' "$WORK/cargo-test.log")

step "building keyhold (for the end-to-end test)"
# A failed build is one failure; the end-to-end test then fails on the missing
# binary, and the other suites still run.
KEYHOLD_BIN="$CARGO_TARGET_DIR/debug/keyhold"
cargo build -p keyhold-cli --bin keyhold >"$WORK/cargo-build.log" 2>&1 ||
    { tail -30 "$WORK/cargo-build.log"; broken "cargo build -p keyhold-cli"; KEYHOLD_BIN="$WORK/no-keyhold-binary"; }

step "parity corpus: $CASES cases, seed $SEED (native Rust)"
CORPUS="$WORK/corpus.jsonl"
cargo run -q -p keyhold-wasm --example parity_corpus -- "$CORPUS" "$CASES" "$SEED" "$NUMBERS" ||
    { broken "parity_corpus"; finish; }

step "node --test (parity in Node and Chromium, client, end to end)"
(
    cd "$WASM_DIR" &&
        KEYHOLD_CORPUS="$CORPUS" KEYHOLD_BIN="$KEYHOLD_BIN" \
            node --test --test-reporter=spec --test-reporter-destination=stdout \
            --test-reporter=tap --test-reporter-destination="$WORK/node.tap" \
            --test-concurrency=1 tests/
) || broken "node --test"
NODE_PASS="$(sed -nE 's/^# pass ([0-9]+)$/\1/p' "$WORK/node.tap" | tail -1)"
NODE_FAIL="$(sed -nE 's/^# fail ([0-9]+)$/\1/p' "$WORK/node.tap" | tail -1)"
if [ -z "$NODE_PASS" ]; then broken "node --test printed no summary"; else
    PASSED=$((PASSED + NODE_PASS)); FAILED=$((FAILED + ${NODE_FAIL:-0}))
    # node --test's own non-zero exit was already counted as its failures.
    [ "${NODE_FAIL:-0}" -gt 0 ] && FAILED=$((FAILED - 1))
fi

finish
