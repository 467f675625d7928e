// The keyhold demo page: places an order through @keyhold/fingerprint/client,
// shows the submission's state and the cluster as this page sees it (the
// region of the node it talks to, which region answered each attempt, the
// tenant's home region), can drop answers after the server committed ("flaky
// network"), and resumes a pending intent after a reload.

import { intentFor, loadFingerprinter, pendingIntents, submit } from '/demo/pkg/client.js';

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = 'keyhold.demo.token';
let busy = false;

function log(line) {
  const el = $('log');
  el.textContent = `${new Date().toISOString().slice(11, 23)} ${line}\n${el.textContent}`.slice(0, 20_000);
}

function setState(state, detail = '—') {
  $('state').dataset.state = state;
  $('state').textContent = state;
  $('detail').textContent = detail;
}

function show(id, value) {
  $(id).textContent = value ?? '—';
}

function bodyFromForm() {
  return {
    client_order_id: $('client_order_id').value.trim(),
    cart_id: $('cart_id').value.trim(),
    amount: Number($('amount').value),
    currency: $('currency').value.trim(),
    items: [{ sku: $('sku').value.trim(), quantity: Number($('quantity').value) }],
  };
}

function fillForm(body) {
  $('client_order_id').value = body.client_order_id ?? '';
  $('cart_id').value = body.cart_id ?? '';
  $('amount').value = body.amount ?? '';
  $('currency').value = body.currency ?? '';
  $('sku').value = body.items?.[0]?.sku ?? '';
  $('quantity').value = body.items?.[0]?.quantity ?? 1;
}

// "Flaky network": the request goes out and the server commits, then the
// answer is thrown away as if the connection had dropped.
async function flakyFetch(url, init) {
  const response = await fetch(url, init);
  // Every answer names the region that executed or replayed it.
  const region = response.headers.get('Keyhold-Region');
  show('answered-by', region);
  log(`answer ${response.status} from region ${region ?? '?'}`);
  if ($('flaky').checked) {
    await response.arrayBuffer();
    log(`answer ${response.status} dropped by the flaky network`);
    throw new TypeError('flaky network: the answer was lost');
  }
  return response;
}

async function run(intent, how) {
  if (busy) return;
  busy = true;
  $('place').disabled = true;
  setState('processing', how);
  show('key', intent.key);
  show('sent-fp', intent.fingerprint);
  show('server-fp', null);
  show('attempts', String(intent.attempts ?? 0));
  show('order-id', null);
  show('order-status', null);
  show('replayed', null);
  log(`${how}: key ${intent.key}`);
  try {
    const result = await submit(intent, {
      baseUrl: '',
      token: $('token').value,
      fetch: flakyFetch,
      maxAttempts: 60,
      baseDelayMs: 200,
      maxDelayMs: 2000,
      onAttempt: (a) => {
        show('attempts', String(intent.attempts));
        log(`attempt ${a.attempt}: ${a.status ?? `network error (${a.error?.message ?? a.error})`}`);
      },
    });
    show('sent-fp', result.sentFingerprint);
    show('server-fp', result.fingerprint);
    show('order-id', result.order?.order_id);
    show('order-status', result.order?.status);
    show('home', result.order?.home_region);
    show('replayed', String(result.replayed));
    setState('done', `HTTP ${result.status} after ${result.attempts} attempt(s)`);
    log(`done: ${result.status} order ${result.order?.order_id}${result.replayed ? ' (replayed)' : ''}`);
  } catch (error) {
    const detail = error.problem?.detail ?? error.message;
    setState('failed', error.retryable ? `${detail} — the intent is kept; submit again to resume` : detail);
    log(`failed: ${error.message}`);
  } finally {
    busy = false;
    $('place').disabled = false;
  }
}

$('order').addEventListener('submit', async (event) => {
  event.preventDefault();
  localStorage.setItem(TOKEN_KEY, $('token').value);
  try {
    const intent = await intentFor(bodyFromForm());
    await run(intent, intent.attempts > 0 ? 'resubmitting the pending intent' : 'placing a new order');
  } catch (error) {
    setState('failed', error.message);
  }
});

async function start() {
  $('token').value = localStorage.getItem(TOKEN_KEY) ?? '';
  const health = await fetch('/healthz');
  show('this-region', health.headers.get('Keyhold-Region'));
  const cluster = await fetch('/demo/cluster.json').then((r) => (r.ok ? r.json() : null));
  if (cluster) show('regions', cluster.regions.map((r) => r.name).join(', '));
  $('client_order_id').value = `demo-${Math.random().toString(36).slice(2, 10)}`;
  await loadFingerprinter();
  const pending = pendingIntents().filter((i) => i.attempts > 0);
  const last = pending[pending.length - 1];
  if (last) {
    fillForm(last.body);
    if ($('token').value) await run(last, 'resuming the pending intent after a reload');
    else setState('idle', 'a pending intent was found: enter the token and place the order to resume it');
  }
  document.body.dataset.ready = 'true';
}

start().catch((error) => setState('failed', `could not start: ${error.message}`));
