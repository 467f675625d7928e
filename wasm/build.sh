#!/usr/bin/env bash
# Builds the npm package @keyhold/fingerprint into wasm/pkg/ and the demo site
# (wasm/www + the package) into wasm/site/, which `keyhold up --demo-dir
# wasm/site` serves at /demo. Installs what a fresh Debian machine lacks: the
# wasm32 target, wasm-bindgen-cli at the exact version of the wasm-bindgen
# crate in Cargo.lock, and the npm tooling of wasm/package-lock.json (binaryen's
# wasm-opt, playwright-core for the tests).
#
#   wasm/build.sh            # release build (what tests and benchmarks use)
#
# Layout of wasm/pkg/:
#   package.json README.md client.js client.d.ts
#   web/   wasm-bindgen --target web (browser ESM; call the default init() once)
#   node/  wasm-bindgen --target nodejs (CommonJS) + index.mjs (ESM entry)
set -euo pipefail
WASM_DIR="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$WASM_DIR/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
PKG="$WASM_DIR/pkg"
SITE="$WASM_DIR/site"
NAME=keyhold_fingerprint

log() { echo "== build: $*" >&2; }

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    log "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown
fi

# The CLI must match the crate exactly; read the crate's version from Cargo.lock.
WB_VERSION="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$REPO/Cargo.lock")"
[ -n "$WB_VERSION" ] || { echo "wasm-bindgen not found in Cargo.lock" >&2; exit 1; }
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WB_VERSION" ]; then
    log "installing wasm-bindgen-cli $WB_VERSION (a few minutes)"
    cargo install wasm-bindgen-cli --version "$WB_VERSION" --force
fi

# wasm-opt from npm's binaryen (pinned in package-lock.json). Debian's binaryen
# 108 is too old: even with --enable-reference-types it rewrites the externref
# table that wasm-bindgen emits, and the module then fails to instantiate.
if [ ! -x "$WASM_DIR/node_modules/.bin/wasm-opt" ] ||
    ! cmp -s "$WASM_DIR/package-lock.json" "$WASM_DIR/node_modules/.package-lock.json.keyhold"; then
    log "npm ci (binaryen, playwright-core)"
    (cd "$WASM_DIR" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$WASM_DIR/package-lock.json" "$WASM_DIR/node_modules/.package-lock.json.keyhold"
fi
WASM_OPT="$WASM_DIR/node_modules/.bin/wasm-opt"

log "cargo build -p keyhold-wasm --release --target wasm32-unknown-unknown"
# Size-oriented settings for this one artifact only: they apply to the wasm32
# target directory and leave the workspace's native release profile alone.
CARGO_PROFILE_RELEASE_LTO=true \
CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
CARGO_PROFILE_RELEASE_PANIC=abort \
CARGO_PROFILE_RELEASE_DEBUG=0 \
    cargo build -p keyhold-wasm --release --target wasm32-unknown-unknown
RAW="$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/keyhold_wasm.wasm"

rm -rf "$PKG" "$SITE"
mkdir -p "$PKG"
log "wasm-bindgen $WB_VERSION --target web / nodejs"
wasm-bindgen "$RAW" --target web --out-dir "$PKG/web" --out-name "$NAME"
wasm-bindgen "$RAW" --target nodejs --out-dir "$PKG/node" --out-name "$NAME"

# The features rustc enables by default for wasm32 (and nothing newer).
WASM_OPT_FEATURES=(--enable-bulk-memory --enable-reference-types --enable-mutable-globals
    --enable-sign-ext --enable-nontrapping-float-to-int --enable-multivalue)
for target in web node; do
    wasm="$PKG/$target/${NAME}_bg.wasm"
    "$WASM_OPT" -Oz "${WASM_OPT_FEATURES[@]}" --strip-debug --strip-producers "$wasm" -o "$wasm.opt"
    mv "$wasm.opt" "$wasm"
done
log "$(stat -c %s "$PKG/web/${NAME}_bg.wasm") bytes of .wasm after wasm-opt -Oz ($("$WASM_OPT" --version))"

# node/: CommonJS inside an ESM package, plus an ESM entry with the same
# surface as web/ (init is a no-op there: the module loads synchronously).
echo '{ "type": "commonjs" }' >"$PKG/node/package.json"
cat >"$PKG/node/index.mjs" <<'EOF'
// ESM entry of @keyhold/fingerprint for Node: the CommonJS build, plus no-op
// init()/initSync() so code written for the browser build runs unchanged.
import wasm from './keyhold_fingerprint.js';
export const { canonicalize, preimage, fingerprint, fingerprintHmac, specs, version } = wasm;
export function initSync() { return undefined; }
export default async function init() { return undefined; }
EOF

cp "$WASM_DIR/js/client.js" "$WASM_DIR/js/client.d.ts" "$WASM_DIR/js/README.md" "$PKG/"
VERSION="$(awk -F'"' '/^version = / { print $2; exit }' "$REPO/Cargo.toml")"
cat >"$PKG/package.json" <<EOF
{
  "name": "@keyhold/fingerprint",
  "version": "$VERSION",
  "description": "keyhold request fingerprints (RFC 8785 canonical JSON + SHA-256) in WebAssembly, and a browser client that retries orders safely with Idempotency-Key.",
  "license": "Apache-2.0",
  "type": "module",
  "sideEffects": false,
  "main": "./node/$NAME.js",
  "module": "./web/$NAME.js",
  "types": "./web/$NAME.d.ts",
  "exports": {
    ".": {
      "types": "./web/$NAME.d.ts",
      "node": {
        "import": "./node/index.mjs",
        "require": "./node/$NAME.js"
      },
      "default": "./web/$NAME.js"
    },
    "./client": {
      "types": "./client.d.ts",
      "default": "./client.js"
    },
    "./web": {
      "types": "./web/$NAME.d.ts",
      "default": "./web/$NAME.js"
    },
    "./${NAME}_bg.wasm": "./web/${NAME}_bg.wasm",
    "./package.json": "./package.json"
  },
  "files": ["web/", "node/", "client.js", "client.d.ts", "README.md"],
  "engines": { "node": ">=20" }
}
EOF

# The demo site: the static page and, under pkg/, the package it imports.
mkdir -p "$SITE"
cp -r "$WASM_DIR/www/." "$SITE/"
cp -r "$PKG" "$SITE/pkg"
# The two built files the nodes compile in to serve /demo without this script
# (crates/server/src/demo.rs). They are committed; wasm/test.sh fails when a
# fresh build differs from the committed copy.
mkdir -p "$WASM_DIR/dist"
cp "$PKG/web/$NAME.js" "$PKG/web/${NAME}_bg.wasm" "$WASM_DIR/dist/"
log "package in $PKG, demo site in $SITE, compiled-in demo files in $WASM_DIR/dist"
