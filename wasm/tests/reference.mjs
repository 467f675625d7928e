// A pure-JS reference of the keyhold fingerprint (contract section 3), written
// from the RFC rather than from the Rust code: JSON.parse, keys sorted by UTF-16
// code units (JS's default string order), JSON.stringify for strings and
// numbers (ECMAScript Number-to-String is what RFC 8785 prescribes), RFC 6901
// pointers, and WebCrypto for SHA-256 / HMAC-SHA256. Runs in Node and browsers.
// It trusts its input to be I-JSON (JSON.parse accepts duplicate names).

const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

/** RFC 8785 serialization of a parsed JSON value. */
export function jcs(value) {
  if (Array.isArray(value)) return `[${value.map(jcs).join(',')}]`;
  if (isObject(value)) {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${jcs(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/** RFC 6901 reference tokens of a pointer string. */
export function tokens(pointer) {
  if (pointer === '') return [];
  return pointer.slice(1).split('/').map((t) => t.replaceAll('~1', '/').replaceAll('~0', '~'));
}

const INDEX = /^(0|[1-9][0-9]*)$/;

function step(value, token) {
  if (Array.isArray(value)) {
    return INDEX.test(token) && Number(token) < value.length ? { v: value[Number(token)] } : null;
  }
  if (isObject(value)) return hasOwn(value, token) ? { v: value[token] } : null;
  return null;
}

function resolve(value, toks) {
  let cur = { v: value };
  for (const t of toks) {
    cur = step(cur.v, t);
    if (!cur) return null;
  }
  return cur;
}

function clone(value) {
  if (Array.isArray(value)) return value.map(clone);
  if (isObject(value)) {
    const out = {};
    for (const k of Object.keys(value)) {
      Object.defineProperty(out, k, { value: clone(value[k]), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  return value;
}

const ORDERS = {
  operation: 'POST:/v1/orders',
  version: 1,
  include: ['/client_order_id', '/cart_id', '/amount', '/currency', '/items', '/shipping_address_id', '/quote_id'],
};

/** The projection P of a parsed body under a parsed spec. */
export function project(body, spec) {
  if (spec.include) {
    const fields = {};
    for (const p of spec.include) {
      if (hasOwn(fields, p)) continue;
      const found = resolve(body, tokens(p));
      if (found) Object.defineProperty(fields, p, { value: found.v, enumerable: true, writable: true, configurable: true });
    }
    return fields;
  }
  const out = clone(body);
  for (const p of spec.exclude) {
    const toks = tokens(p);
    if (toks.length === 0) continue;
    const parent = resolve(out, toks.slice(0, -1));
    if (parent && isObject(parent.v)) delete parent.v[toks[toks.length - 1]];
  }
  return out;
}

/** The canonical preimage of a body text under a spec ("orders", JSON text or null). */
export function preimage(bodyText, specText) {
  const spec = specText == null || specText === 'orders' ? ORDERS : JSON.parse(specText);
  const body = JSON.parse(bodyText);
  return jcs({ fields: project(body, spec), op: spec.operation, v: spec.version });
}

const hex = (buf) => [...new Uint8Array(buf)].map((b) => b.toString(16).padStart(2, '0')).join('');

export async function sha256(text) {
  return `sha256:${hex(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text)))}`;
}

export async function hmacSha256(secret, text) {
  const raw = new TextEncoder().encode(secret);
  // WebCrypto refuses zero-length HMAC keys; HMAC pads keys with zeros to the
  // block size, so one zero byte is the same key.
  const key = await crypto.subtle.importKey('raw', raw.length ? raw : new Uint8Array(1),
    { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  return `hmac-sha256:${hex(await crypto.subtle.sign('HMAC', key, new TextEncoder().encode(text)))}`;
}

export function canonicalize(text) {
  return jcs(JSON.parse(text));
}

export async function fingerprint(bodyText, specText) {
  return sha256(preimage(bodyText, specText));
}
