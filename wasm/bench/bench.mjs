// Fingerprints per second of the WASM module for the ~500-byte order body
// (bench/order.json), in Node and in headless Chromium, plus the native number
// from `cargo run --release --example bench_native`. Run through wasm/bench.sh.
// Prints one JSON line per runtime.

import { readFile } from 'node:fs/promises';
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch, serveFolder } from '../tests/browser.mjs';
import * as wasm from '../pkg/node/index.mjs';

const SECONDS = Number(process.argv[2] ?? 3);
const WASM_DIR = fileURLToPath(new URL('..', import.meta.url));
const body = (await readFile(new URL('./order.json', import.meta.url), 'utf8')).trimEnd();

// The same loop in both runtimes: warm up, then batches of 1000 until time is up.
function run(fingerprint, text, seconds) {
  for (let i = 0; i < 2000; i++) fingerprint(text);
  const start = performance.now();
  let count = 0;
  while (performance.now() - start < seconds * 1000) {
    for (let i = 0; i < 1000; i++) fingerprint(text);
    count += 1000;
  }
  const elapsed = (performance.now() - start) / 1000;
  return { count, seconds: Number(elapsed.toFixed(3)), per_second: Math.round(count / elapsed), fingerprint: fingerprint(text) };
}

const bodyBytes = new TextEncoder().encode(body).length;
console.log(JSON.stringify({ runtime: `wasm-node-${process.versions.node}`, body_bytes: bodyBytes, ...run(wasm.fingerprint, body, SECONDS) }));

const browser = await launch();
try {
  const origin = 'http://localhost:8999';
  await serveFolder(browser.context, `${origin}/wasm`, WASM_DIR, { readFile, extname });
  const page = await browser.context.newPage();
  await page.goto(`${origin}/wasm/tests/blank.html`);
  const result = await page.evaluate(async ({ origin, body, seconds, runSource }) => {
    const mod = await import(`${origin}/wasm/pkg/web/keyhold_fingerprint.js`);
    await mod.default();
    // eslint-disable-next-line no-new-func
    const runIn = new Function(`return (${runSource})`)();
    return { version: navigator.userAgent.match(/Chrome\/([\d.]+)/)?.[1], ...runIn(mod.fingerprint, body, seconds) };
  }, { origin, body, seconds: SECONDS, runSource: run.toString() });
  const { version, ...rest } = result;
  console.log(JSON.stringify({ runtime: `wasm-chromium-${version}`, body_bytes: bodyBytes, ...rest }));
} finally {
  await browser.close();
}
