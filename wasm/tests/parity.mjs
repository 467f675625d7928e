// Checks an implementation against every line of the parity corpus that
// wasm/examples/parity_corpus.rs wrote with the native Rust answers. Used by
// the Node suite and, unchanged, inside headless Chromium.

const show = (v) => (typeof v === 'string' && v.length > 300 ? `${v.slice(0, 300)}…` : v);

/**
 * `api`: { canonicalize, preimage, fingerprint, fingerprintHmac? } — sync or
 * async, throwing errors with rule/offset (or, with { reference: true }, a
 * reference that is only asked about valid cases).
 */
export async function checkCorpus(cases, api, { reference = false, maxFailures = 20 } = {}) {
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  const failures = [];
  const fail = (c, what, got, want) => {
    failed += 1;
    if (failures.length < maxFailures) failures.push({ i: c.i, what, got: show(got), want: show(want), body: show(c.body), spec: c.spec });
  };
  for (const c of cases) {
    if (c.error) {
      if (reference) { skipped += 1; continue; }
      let thrown = null;
      try {
        await api.fingerprint(c.body, c.spec);
      } catch (e) {
        thrown = e;
      }
      const got = thrown && { rule: thrown.rule, offset: thrown.offset ?? null, message: thrown.message, input: thrown.input };
      if (!got) fail(c, 'error', 'no error', c.error);
      else if (got.rule !== c.error.rule || got.offset !== c.error.offset || got.message !== c.error.message || got.input !== 'body') {
        fail(c, 'error', got, c.error);
      } else passed += 1;
      continue;
    }
    try {
      const canonical = await api.canonicalize(c.body);
      if (canonical !== c.canonical) { fail(c, 'canonical', canonical, c.canonical); continue; }
      const pre = await api.preimage(c.body, c.spec);
      if (pre !== c.preimage) { fail(c, 'preimage', pre, c.preimage); continue; }
      const fp = await api.fingerprint(c.body, c.spec);
      if (fp !== c.fingerprint) { fail(c, 'fingerprint', fp, c.fingerprint); continue; }
      if (c.hmac && api.fingerprintHmac) {
        const h = await api.fingerprintHmac(c.body, c.secret, c.spec);
        if (h !== c.hmac) { fail(c, 'hmac', h, c.hmac); continue; }
      }
      passed += 1;
    } catch (e) {
      fail(c, 'threw', `${e?.name}: ${e?.message}`, 'no error');
    }
  }
  return { cases: cases.length, passed, failed, skipped, failures };
}

/** The corpus text (JSON Lines) as case objects. */
export function parseCorpus(text) {
  return text.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

/** The WASM module's exports as a checkCorpus api (secret as UTF-8 bytes). */
export function wasmApi(mod) {
  return {
    canonicalize: (b) => mod.canonicalize(b),
    preimage: (b, s) => mod.preimage(b, s),
    fingerprint: (b, s) => mod.fingerprint(b, s),
    fingerprintHmac: (b, secret, s) => mod.fingerprintHmac(b, new TextEncoder().encode(secret), s),
  };
}

/** The pure-JS reference as a checkCorpus api. */
export function referenceApi(ref) {
  return {
    canonicalize: (b) => ref.canonicalize(b),
    preimage: (b, s) => ref.preimage(b, s),
    fingerprint: (b, s) => ref.fingerprint(b, s),
    fingerprintHmac: (b, secret, s) => ref.hmacSha256(secret, ref.preimage(b, s)),
  };
}
