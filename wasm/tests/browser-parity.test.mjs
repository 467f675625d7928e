// Chromium half of the parity suite: the browser (web target) build of the
// package and the pure-JS reference, both inside headless Chromium, checked
// against every case of the native corpus (KEYHOLD_CORPUS).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch, serveFolder } from './browser.mjs';

const WASM_DIR = fileURLToPath(new URL('..', import.meta.url));
// Intercepted, never contacted; localhost makes it a secure context (WebCrypto).
const ORIGIN = 'http://localhost:8999';
let browser;
let page;
let scratch;

before(async () => {
  assert.ok(process.env.KEYHOLD_CORPUS, 'set KEYHOLD_CORPUS (wasm/test.sh does)');
  // One folder for the page: wasm/ itself (pkg/ and tests/) plus the corpus.
  scratch = mkdtempSync(join(tmpdir(), 'keyhold-parity-'));
  copyFileSync(process.env.KEYHOLD_CORPUS, join(scratch, 'corpus.jsonl'));
  browser = await launch();
  await serveFolder(browser.context, `${ORIGIN}/corpus`, scratch, { readFile, extname });
  await serveFolder(browser.context, `${ORIGIN}/wasm`, WASM_DIR, { readFile, extname });
  page = await browser.context.newPage();
  page.on('pageerror', (e) => console.error('page error:', e));
  await page.goto(`${ORIGIN}/wasm/tests/blank.html`);
});

after(async () => {
  await browser?.close();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

async function inPage(kind) {
  return page.evaluate(async ({ kind, origin }) => {
    const { checkCorpus, parseCorpus, wasmApi, referenceApi } = await import(`${origin}/wasm/tests/parity.mjs`);
    const cases = parseCorpus(await (await fetch(`${origin}/corpus/corpus.jsonl`)).text());
    if (kind === 'wasm') {
      const mod = await import(`${origin}/wasm/pkg/web/keyhold_fingerprint.js`);
      await mod.default();
      return checkCorpus(cases, wasmApi(mod));
    }
    const ref = await import(`${origin}/wasm/tests/reference.mjs`);
    return checkCorpus(cases, referenceApi(ref), { reference: true });
  }, { kind, origin: ORIGIN });
}

test('WASM in Chromium agrees with native Rust on every case', async () => {
  const result = await inPage('wasm');
  assert.equal(result.failed, 0, JSON.stringify(result.failures, null, 1));
  assert.ok(result.cases >= 10_000);
  assert.equal(result.passed, result.cases);
});

test('the pure-JS reference in Chromium agrees on every valid case', async () => {
  const result = await inPage('reference');
  assert.equal(result.failed, 0, JSON.stringify(result.failures, null, 1));
  assert.equal(result.passed + result.skipped, result.cases);
});

test('errors thrown in Chromium carry rule, offset and input', async () => {
  const got = await page.evaluate(async (origin) => {
    const mod = await import(`${origin}/wasm/pkg/web/keyhold_fingerprint.js`);
    await mod.default();
    try {
      mod.fingerprint('{"a":1,"b":2,"a":3}');
      return null;
    } catch (e) {
      return { name: e.name, message: e.message, rule: e.rule, offset: e.offset, input: e.input, isError: e instanceof Error };
    }
  }, ORIGIN);
  assert.deepEqual(got, {
    name: 'FingerprintError',
    message: 'duplicate-name: duplicate member name "a" at byte 13',
    rule: 'duplicate-name',
    offset: 13,
    input: 'body',
    isError: true,
  });
});
