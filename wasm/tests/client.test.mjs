// The browser client's retry and intent rules, in Node with a scripted fetch,
// an in-memory storage and a recorded (instant) sleep.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as client from '../pkg/client.js';
import * as wasm from '../pkg/node/index.mjs';

class MemoryStorage {
  constructor() { this.map = new Map(); }
  getItem(k) { return this.map.has(k) ? this.map.get(k) : null; }
  setItem(k, v) { this.map.set(k, String(v)); }
  removeItem(k) { this.map.delete(k); }
}

const ORDER = { client_order_id: 'c-1', cart_id: 'cart', amount: 1999, currency: 'EUR', items: [{ sku: 'KB', quantity: 1 }] };
const problem = (slug, status) => JSON.stringify({ type: `https://keyhold.dev/problems/${slug}`, title: slug, status });

/** A fetch that answers from a script; each entry is a Response factory or an Error. */
function scripted(script) {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push({ url, init });
    const next = script[Math.min(calls.length - 1, script.length - 1)];
    if (next instanceof Error) throw next;
    return next(init);
  };
  return { fetch, calls };
}

const created = (init) => new Response(JSON.stringify({ order_id: 'o-1', status: 'CONFIRMED' }), {
  status: 201,
  headers: { 'Content-Type': 'application/json', 'Idempotency-Fingerprint': init.headers['Idempotency-Fingerprint'] },
});
const answer = (status, slug, headers = {}) => () =>
  new Response(problem(slug, status), { status, headers: { 'Content-Type': 'application/problem+json', ...headers } });

function options(storage, fetch, extra = {}) {
  const sleeps = [];
  return {
    opts: { baseUrl: 'http://node.test/', token: 't0k', storage, fetch, sleep: async (ms) => { sleeps.push(ms); }, random: () => 0.5, ...extra },
    sleeps,
  };
}

test('one key per intent, persisted before sending, reused by intentFor', async () => {
  const storage = new MemoryStorage();
  const intent = await client.intentFor(ORDER, { storage });
  assert.match(intent.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(intent.fingerprint, wasm.fingerprint(JSON.stringify(ORDER)));
  assert.deepEqual(client.pendingIntents({ storage }).map((i) => i.key), [intent.key]);
  // Same fingerprinted fields (metadata is not fingerprinted): same key.
  const again = await client.intentFor({ ...ORDER, metadata: { note: 'x' } }, { storage });
  assert.equal(again.key, intent.key);
  // An edited form is a new intent; the unsent old one is dropped.
  const edited = await client.intentFor({ ...ORDER, amount: 2000 }, { storage });
  assert.notEqual(edited.key, intent.key);
  assert.deepEqual(client.pendingIntents({ storage }).map((i) => i.key), [edited.key]);
});

test('sent intents survive an edit; createIntent always makes a new key', async () => {
  const storage = new MemoryStorage();
  const first = await client.intentFor(ORDER, { storage });
  const { fetch } = scripted([new TypeError('offline')]);
  const { opts } = options(storage, fetch, { maxAttempts: 1 });
  await assert.rejects(client.submit(first, opts), (e) => e.retryable === true);
  const edited = await client.intentFor({ ...ORDER, amount: 5 }, { storage });
  assert.deepEqual(client.pendingIntents({ storage }).map((i) => i.key).sort(), [first.key, edited.key].sort());
  const other = await client.createIntent(ORDER, { storage });
  assert.notEqual(other.key, first.key);
});

test('retries network errors, 409 in progress, 429 and 503 with the same key, then clears the intent', async () => {
  const storage = new MemoryStorage();
  const intent = await client.intentFor(ORDER, { storage });
  const { fetch, calls } = scripted([
    new TypeError('Failed to fetch'),
    answer(409, 'request-in-progress', { 'Retry-After': '1' }),
    answer(429, 'rate-limited', { 'Retry-After': '3' }),
    answer(503, 'store-unavailable'),
    created,
  ]);
  const { opts, sleeps } = options(storage, fetch);
  const result = await client.submit(intent, opts);
  assert.equal(result.status, 201);
  assert.equal(result.order.order_id, 'o-1');
  assert.equal(result.attempts, 5);
  assert.equal(result.fingerprint, result.sentFingerprint);
  assert.equal(calls.length, 5);
  for (const c of calls) {
    assert.equal(c.url, 'http://node.test/v1/orders');
    assert.equal(c.init.method, 'POST');
    assert.equal(c.init.headers['Idempotency-Key'], intent.key);
    assert.equal(c.init.headers['Idempotency-Fingerprint'], intent.fingerprint);
    assert.equal(c.init.headers.Authorization, 'Bearer t0k');
    assert.equal(c.init.body, JSON.stringify(ORDER));
  }
  // Full jitter with random() = 0.5: half of 250·2^(n-1); Retry-After wins when longer.
  assert.deepEqual(sleeps, [125, 1000, 3000, 1000]);
  assert.deepEqual(client.pendingIntents({ storage }), []);
});

test('stops on 422 and other 4xx, clearing the intent', async () => {
  for (const [status, slug] of [[422, 'idempotency-key-reused'], [400, 'invalid-request'], [409, 'client-order-id-conflict'], [401, 'unauthenticated']]) {
    const storage = new MemoryStorage();
    const intent = await client.intentFor(ORDER, { storage });
    const { fetch, calls } = scripted([answer(status, slug), created]);
    const { opts } = options(storage, fetch);
    await assert.rejects(client.submit(intent, opts), (e) => {
      assert.equal(e.name, 'SubmitError');
      assert.equal(e.status, status);
      assert.equal(e.retryable, false);
      assert.ok(e.problem.type.endsWith(slug));
      return true;
    });
    assert.equal(calls.length, 1, `${status} must not be retried`);
    assert.deepEqual(client.pendingIntents({ storage }), []);
  }
});

test('gives up after maxAttempts but keeps the intent for later', async () => {
  const storage = new MemoryStorage();
  const intent = await client.intentFor(ORDER, { storage });
  const { fetch, calls } = scripted([new TypeError('offline')]);
  const { opts, sleeps } = options(storage, fetch, { maxAttempts: 4, random: () => 0.999 });
  await assert.rejects(client.submit(intent, opts), (e) => e.retryable && /gave up after 4/.test(e.message));
  assert.equal(calls.length, 4);
  assert.deepEqual(sleeps, [249, 499, 999]);
  const kept = client.pendingIntents({ storage });
  assert.equal(kept.length, 1);
  assert.equal(kept[0].key, intent.key);
  assert.equal(kept[0].attempts, 4);
});

test('backoff is capped full jitter and Retry-After parses seconds and dates', () => {
  const limits = { baseDelayMs: 100, maxDelayMs: 1000 };
  assert.equal(client.backoffMs(1, limits, () => 0), 0);
  assert.equal(client.backoffMs(3, limits, () => 0.999999), 399);
  assert.equal(client.backoffMs(20, limits, () => 0.999999), 999);
  assert.equal(client.retryAfterMs('2'), 2000);
  assert.equal(client.retryAfterMs(null), null);
  assert.equal(client.retryAfterMs('soon'), null);
  const now = Date.parse('2030-01-01T00:00:00Z');
  assert.equal(client.retryAfterMs('Tue, 01 Jan 2030 00:00:05 GMT', now), 5000);
});
