// Node half of the parity suite, and the package's API surface in Node.
// Needs wasm/pkg (wasm/build.sh) and the corpus file named by KEYHOLD_CORPUS
// (wasm/test.sh writes it with the native Rust generator).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import * as wasm from '../pkg/node/index.mjs';
import * as ref from './reference.mjs';
import { checkCorpus, parseCorpus, referenceApi, wasmApi } from './parity.mjs';

const corpusPath = process.env.KEYHOLD_CORPUS;
const cases = corpusPath ? parseCorpus(readFileSync(corpusPath, 'utf8')) : [];

function report(name, result) {
  if (result.failed > 0) {
    assert.fail(`${name}: ${result.failed} of ${result.cases} cases disagree; first: ${JSON.stringify(result.failures, null, 1)}`);
  }
}

test('the corpus is there and large', () => {
  assert.ok(corpusPath, 'set KEYHOLD_CORPUS to the parity corpus (wasm/test.sh does)');
  assert.ok(cases.length >= 10_000, `only ${cases.length} cases`);
  assert.ok(cases.filter((c) => c.error).length > 100, 'too few invalid bodies');
  assert.ok(cases.filter((c) => c.spec && c.spec.includes('"exclude"')).length > 1000, 'too few exclude specs');
  assert.ok(cases.filter((c) => /[\u{10000}-\u{10FFFF}]/u.test(c.canonical ?? '')).length > 1000, 'too few astral characters');
});

test('WASM in Node agrees with native Rust on every case', async () => {
  const result = await checkCorpus(cases, wasmApi(wasm));
  report('wasm (node)', result);
  assert.equal(result.passed, cases.length);
});

test('the pure-JS reference agrees with native Rust on every valid case', async () => {
  const result = await checkCorpus(cases, referenceApi(ref), { reference: true });
  report('reference', result);
  assert.equal(result.passed + result.skipped, cases.length);
  assert.ok(result.passed > 9_000);
});

test('require() gives the same module (CommonJS entry)', () => {
  const require = createRequire(import.meta.url);
  const cjs = require('../pkg/node/keyhold_fingerprint.js');
  const body = '{"amount":1,"currency":"EUR"}';
  assert.equal(cjs.fingerprint(body), wasm.fingerprint(body));
});

test('errors carry the CLI line, rule, offset and input', () => {
  const err = (fn) => {
    try {
      fn();
    } catch (e) {
      return e;
    }
    assert.fail('no error thrown');
  };
  let e = err(() => wasm.canonicalize('{"a":1,"b":2,"a":3}'));
  assert.ok(e instanceof Error);
  assert.equal(e.name, 'FingerprintError');
  assert.equal(e.message, 'duplicate-name: duplicate member name "a" at byte 13');
  assert.equal(e.rule, 'duplicate-name');
  assert.equal(e.offset, 13);
  assert.equal(e.input, 'body');

  e = err(() => wasm.fingerprint('{"a":1}', '{"operation":"x","version":1}'));
  assert.equal(e.rule, 'spec');
  assert.equal(e.input, 'spec');
  assert.equal(e.offset, undefined);

  e = err(() => wasm.fingerprint('{"a":1}', '{"operation":"x","version":1,'));
  assert.equal(e.rule, 'syntax');
  assert.equal(e.input, 'spec');

  // A raw lone surrogate in a JS string: refused where it stands (byte 7 of
  // the UTF-8 form: `{"é":"` is 7 bytes).
  e = err(() => wasm.canonicalize('{"\u00e9":"\ud800x"}'));
  assert.equal(e.rule, 'lone-surrogate');
  assert.equal(e.offset, 7);
  assert.equal(e.message, 'lone-surrogate: lone surrogate \\ud800 at byte 7');
  e = err(() => wasm.canonicalize('["\u{1F600}", "\udc01"]'));
  assert.equal(e.offset, 10);

  e = err(() => wasm.canonicalize(42));
  assert.equal(e.rule, 'type');

  e = err(() => wasm.canonicalize('[1e400]'));
  assert.equal(e.rule, 'non-finite-number');
  assert.equal(e.offset, 1);
});

test('specs() is the server\'s document and fingerprints agree with it', () => {
  const specs = JSON.parse(wasm.specs());
  assert.equal(specs.data.length, 1);
  const orders = specs.data[0];
  assert.equal(orders.operation, 'POST:/v1/orders');
  assert.deepEqual(orders.include, ['/client_order_id', '/cart_id', '/amount', '/currency', '/items', '/shipping_address_id', '/quote_id']);
  const body = '{"client_order_id":"c-1","cart_id":"k","amount":1999,"currency":"EUR","metadata":{"x":1}}';
  assert.equal(wasm.fingerprint(body), wasm.fingerprint(body, 'orders'));
  assert.equal(wasm.fingerprint(body), wasm.fingerprint(body, JSON.stringify(orders)));
  assert.equal(wasm.fingerprint(body), wasm.fingerprint(body, null));
  assert.equal(
    wasm.preimage(body),
    '{"fields":{"/amount":1999,"/cart_id":"k","/client_order_id":"c-1","/currency":"EUR"},"op":"POST:/v1/orders","v":1}',
  );
  assert.match(wasm.fingerprintHmac(body, new TextEncoder().encode('s3cret')), /^hmac-sha256:[0-9a-f]{64}$/);
  assert.match(wasm.version(), /^\d+\.\d+\.\d+$/);
});
