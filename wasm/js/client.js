// @keyhold/fingerprint/client — place orders safely from a browser.
//
// One Idempotency-Key per *intent* (the customer's decision to place this
// order), made once and kept in storage, so every retry — after a timeout, a
// lost answer, a reload or a restart — reuses it and the server can answer
// with the first result instead of creating a second order.
//
//   const intent = await intentFor(body);        // same body -> same key
//   const result = await submit(intent, { baseUrl: '', token });
//
// Storage is localStorage by default (pass { storage } for anything with
// getItem/setItem/removeItem). The fingerprint is computed by the WASM module
// with the built-in orders spec and sent as Idempotency-Fingerprint; the
// server refuses (400 fingerprint-mismatch) if it computes another one.

import init, { fingerprint as wasmFingerprint } from './web/keyhold_fingerprint.js';

const STORAGE_KEY = 'keyhold.intents.v1';
const RETRYABLE_STATUS = new Set([429, 502, 503, 504]);
const DEFAULTS = {
  maxAttempts: 8,
  baseDelayMs: 250,
  maxDelayMs: 10_000,
  maxRetryAfterMs: 60_000,
};

let ready = null;

/**
 * Loads the WASM module once. Browsers fetch it next to this file; Node reads
 * it from disk. Pass bytes, a URL or a WebAssembly.Module to override.
 */
export function loadFingerprinter(source) {
  if (!ready) {
    ready = (async () => {
      let moduleOrPath = source;
      if (moduleOrPath === undefined && typeof process !== 'undefined' && process.versions?.node) {
        const { readFile } = await import('node:fs/promises');
        moduleOrPath = await readFile(new URL('./web/keyhold_fingerprint_bg.wasm', import.meta.url));
      }
      await init(moduleOrPath === undefined ? undefined : { module_or_path: moduleOrPath });
    })();
    ready.catch(() => { ready = null; });
  }
  return ready;
}

/** The orders fingerprint (`sha256:<hex>`) of a body object or JSON text. */
export async function fingerprintOf(body) {
  await loadFingerprinter();
  return wasmFingerprint(typeof body === 'string' ? body : JSON.stringify(body), 'orders');
}

function storageOf(options) {
  const storage = options?.storage ?? globalThis.localStorage;
  if (!storage) throw new Error('no storage: pass { storage } (localStorage is not available here)');
  return storage;
}

/** Every pending intent, oldest first. */
export function pendingIntents(options) {
  const storage = storageOf(options);
  try {
    const list = JSON.parse(storage.getItem(STORAGE_KEY) ?? '[]');
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

function save(list, options) {
  const storage = storageOf(options);
  if (list.length === 0) storage.removeItem(STORAGE_KEY);
  else storage.setItem(STORAGE_KEY, JSON.stringify(list));
}

function update(intent, options) {
  const list = pendingIntents(options);
  const i = list.findIndex((x) => x.key === intent.key);
  if (i >= 0) list[i] = intent;
  else list.push(intent);
  save(list, options);
}

/** Forgets an intent (done, failed for good, or abandoned). */
export function discardIntent(intent, options) {
  save(pendingIntents(options).filter((x) => x.key !== intent.key), options);
}

function newKey() {
  if (globalThis.crypto?.randomUUID) return globalThis.crypto.randomUUID();
  const b = globalThis.crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/**
 * A new intent with a fresh key, persisted before anything is sent:
 * { key, body, fingerprint, createdAt, attempts: 0 }.
 */
export async function createIntent(body, options) {
  const text = JSON.stringify(body);
  const intent = {
    key: newKey(),
    body: JSON.parse(text),
    fingerprint: await fingerprintOf(text),
    createdAt: new Date().toISOString(),
    attempts: 0,
  };
  update(intent, options);
  return intent;
}

/**
 * The pending intent for this body: the stored one with the same fingerprint
 * (same key, so a retry or a re-click is safe), or a new one. An edited form
 * whose fingerprinted fields changed is a new intent with a new key; intents
 * that were never sent are dropped then, those that were sent are kept until
 * a submit settles them (their order may exist).
 */
export async function intentFor(body, options) {
  const fp = await fingerprintOf(body);
  const list = pendingIntents(options);
  const same = list.find((x) => x.fingerprint === fp);
  if (same) return same;
  save(list.filter((x) => x.attempts > 0), options);
  return createIntent(body, options);
}

/** Milliseconds to wait for a Retry-After value (seconds or an HTTP date). */
export function retryAfterMs(value, now = Date.now()) {
  if (value == null || value === '') return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}

/** Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))). */
export function backoffMs(attempt, { baseDelayMs, maxDelayMs }, random = Math.random) {
  return Math.floor(random() * Math.min(maxDelayMs, baseDelayMs * 2 ** (attempt - 1)));
}

/** A submit that ended without an order; `retryable` says if the intent was kept. */
export class SubmitError extends Error {
  constructor(message, { status = null, problem = null, retryable = false, attempts = 0, cause } = {}) {
    super(message, cause ? { cause } : undefined);
    this.name = 'SubmitError';
    this.status = status;
    this.problem = problem;
    this.retryable = retryable;
    this.attempts = attempts;
  }
}

function slugOf(problem) {
  const type = problem && typeof problem.type === 'string' ? problem.type : '';
  return type.slice(type.lastIndexOf('/') + 1);
}

async function readJson(response) {
  const text = await response.text();
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return { raw: text };
  }
}

const sleepFor = (ms, signal) =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  });

/**
 * POST /v1/orders for an intent until there is an answer to act on.
 *
 * Retries (same key, same body) on network errors, 409 request-in-progress,
 * 429, 502, 503 and 504, waiting with exponential backoff and full jitter, and
 * at least as long as Retry-After says. Stops on any other answer. On 2xx the
 * intent is cleared and `{ status, order, replayed, fingerprint, sentFingerprint,
 * key, attempts }` is returned. On a final error (422, other 4xx, 500) the
 * intent is cleared and a SubmitError thrown; when attempts run out or the
 * signal aborts, the intent is kept (retryable: true) so it can be resumed.
 *
 * options: { baseUrl, token, fetch?, storage?, signal?, maxAttempts?,
 *   baseDelayMs?, maxDelayMs?, onAttempt?(info), sleep?(ms, signal), random?() }
 */
export async function submit(intent, options = {}) {
  const opts = { ...DEFAULTS, ...options };
  const doFetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  const sleep = opts.sleep ?? sleepFor;
  const url = `${String(opts.baseUrl ?? '').replace(/\/+$/, '')}/v1/orders`;
  const text = JSON.stringify(intent.body);
  const sentFingerprint = await fingerprintOf(text);
  if (intent.fingerprint && intent.fingerprint !== sentFingerprint) {
    throw new SubmitError('the intent body no longer matches its fingerprint; make a new intent');
  }
  let lastError = null;
  for (let attempt = 1; attempt <= opts.maxAttempts; attempt++) {
    intent.attempts = (intent.attempts ?? 0) + 1;
    intent.lastAttemptAt = new Date().toISOString();
    update(intent, opts);
    let response;
    let waitMs = null;
    try {
      response = await doFetch(url, {
        method: 'POST',
        headers: {
          'Content-Type': 'application/json',
          Authorization: `Bearer ${opts.token}`,
          'Idempotency-Key': intent.key,
          'Idempotency-Fingerprint': sentFingerprint,
        },
        body: text,
        signal: opts.signal,
      });
    } catch (error) {
      if (opts.signal?.aborted) {
        throw new SubmitError('aborted', { retryable: true, attempts: attempt, cause: error });
      }
      lastError = new SubmitError(`network error: ${error?.message ?? error}`, {
        retryable: true, attempts: attempt, cause: error,
      });
      opts.onAttempt?.({ attempt, key: intent.key, error });
    }
    if (response) {
      const status = response.status;
      const body = await readJson(response);
      opts.onAttempt?.({ attempt, key: intent.key, status, body });
      if (status >= 200 && status < 300) {
        discardIntent(intent, opts);
        return {
          status,
          order: body,
          replayed: response.headers.get('Idempotent-Replayed') === 'true',
          fingerprint: response.headers.get('Idempotency-Fingerprint'),
          sentFingerprint,
          key: intent.key,
          attempts: attempt,
        };
      }
      const slug = slugOf(body);
      const retryable =
        RETRYABLE_STATUS.has(status) || (status === 409 && slug === 'request-in-progress');
      const error = new SubmitError(`${status} ${slug || body?.title || 'error'}`, {
        status, problem: body, retryable, attempts: attempt,
      });
      if (!retryable) {
        discardIntent(intent, opts);
        throw error;
      }
      lastError = error;
      waitMs = retryAfterMs(response.headers.get('Retry-After'));
    }
    if (attempt < opts.maxAttempts) {
      const jitter = backoffMs(attempt, opts, opts.random);
      const delay = Math.max(jitter, Math.min(waitMs ?? 0, opts.maxRetryAfterMs));
      try {
        await sleep(delay, opts.signal);
      } catch (cause) {
        throw new SubmitError('aborted', { retryable: true, attempts: attempt, cause });
      }
    }
  }
  lastError.message = `gave up after ${opts.maxAttempts} attempts: ${lastError.message}`;
  throw lastError;
}
