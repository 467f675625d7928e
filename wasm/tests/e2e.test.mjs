// End to end in headless Chromium against a real `keyhold up` (KEYHOLD_BIN)
// started exactly as the README says (no --demo-dir: the demo compiled into
// the binary): place an order with the flaky network dropping every answer
// after the server committed, reload mid-retry, let the page resume, place it
// again — and there is exactly one order, the page shows it as done, and the
// fingerprint the page sent is the one the server computed. The tenant lives
// in region b and the page talks to region a's node, so the page shows the
// forward: this node a, answered by b, home b. Then the live cluster page at
// /admin/: the admin token typed into the page (never in the URL), the
// cluster shown and refreshed while a move runs to its end; then the page's
// own region isolated: the page goes on through another node and follows the
// failover of its region, its result and the reconciliation's orphans; then
// the page's node killed, and the page still live.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { launch } from './browser.mjs';

const BIN = process.env.KEYHOLD_BIN;
const SHOTS = process.env.KEYHOLD_SCREENSHOTS; // optional folder for screenshots

let node; // the keyhold up process
let dataDir;
let browser;
let api; // origin of region a's node
let token;
let adminToken;
let cluster; // cluster.json
let nodeLog = '';

function portFree(port) {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/** A base port whose whole `keyhold up` range (50 ports) is free. */
async function freeBasePort() {
  for (let tries = 0; tries < 40; tries++) {
    const base = 20_000 + Math.floor(Math.random() * 800) * 50;
    let free = true;
    for (let p = base; p < base + 50 && free; p++) free = await portFree(p);
    if (free) return base;
  }
  throw new Error('no free port range');
}

before(async () => {
  assert.ok(BIN && existsSync(BIN), 'set KEYHOLD_BIN to the keyhold binary (wasm/test.sh does)');
  dataDir = mkdtempSync(join(tmpdir(), 'keyhold-e2e-'));
  const base = await freeBasePort();
  // The README's command: `keyhold up --data-dir ./data --base-port 7400`.
  node = spawn(BIN, ['up', '--data-dir', dataDir, '--base-port', String(base)], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: 'warn' },
  });
  node.stdout.on('data', (d) => { nodeLog += d; });
  node.stderr.on('data', (d) => { nodeLog += d; });
  const clusterFile = join(dataDir, 'cluster.json');
  const deadline = Date.now() + 60_000;
  while (!existsSync(clusterFile)) {
    if (node.exitCode !== null) throw new Error(`keyhold up exited ${node.exitCode}:\n${nodeLog}`);
    if (Date.now() > deadline) throw new Error(`keyhold up not ready in 60 s:\n${nodeLog}`);
    await sleep(100);
  }
  cluster = JSON.parse(readFileSync(clusterFile, 'utf8'));
  api = cluster.regions.find((r) => r.name === 'a').api_url;
  token = cluster.tenants.find((t) => t.home_region === 'b').token;
  adminToken = cluster.admin_token;
  browser = await launch();
});

after(async () => {
  await browser?.close();
  if (node && node.exitCode === null) {
    const exited = new Promise((resolve) => node.once('exit', resolve));
    node.kill('SIGTERM');
    const done = await Promise.race([exited.then(() => true), sleep(10_000).then(() => false)]);
    if (!done) {
      node.kill('SIGKILL');
      await exited;
    }
  }
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

test('the node serves the demo and the package with the right types', async () => {
  const redirect = await fetch(`${api}/demo`, { redirect: 'manual' });
  assert.equal(redirect.status, 308);
  assert.equal(redirect.headers.get('location'), '/demo/');
  const page = await fetch(`${api}/demo/`);
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-type'), /^text\/html/);
  const wasm = await fetch(`${api}/demo/pkg/web/keyhold_fingerprint_bg.wasm`);
  assert.equal(wasm.status, 200);
  assert.equal(wasm.headers.get('content-type'), 'application/wasm');
  const js = await fetch(`${api}/demo/pkg/client.js`);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  for (const bad of ['/demo/../cluster.json', '/demo/.hidden', '/demo/nope.js']) {
    const r = await fetch(`${api}${bad}`);
    assert.equal(r.status, 404, bad);
    assert.match(r.headers.get('content-type'), /problem\+json/);
  }
});

test('lost answers, a reload mid-retry and a second click make exactly one order', async () => {
  const page = await browser.context.newPage();
  page.on('pageerror', (e) => { nodeLog += `\npage error: ${e}`; });
  const sent = []; // { key, fingerprint } of every POST /v1/orders
  const answers = []; // { status, fingerprint, replayed, orderId }
  page.on('request', (r) => {
    if (r.method() === 'POST' && r.url().endsWith('/v1/orders')) {
      const h = r.headers();
      sent.push({ key: h['idempotency-key'], fingerprint: h['idempotency-fingerprint'] });
    }
  });
  page.on('response', async (r) => {
    if (r.request().method() === 'POST' && r.url().endsWith('/v1/orders')) {
      // A reload can discard an answer's body before it is read here: such an
      // answer has no orderId and is left out of the order check below.
      const body = await r.json().catch(() => ({}));
      const h = r.headers();
      answers.push({ status: r.status(), fingerprint: h['idempotency-fingerprint'], replayed: h['idempotent-replayed'] === 'true', orderId: body.order_id });
    }
  });
  const clientOrderId = `e2e-${Date.now().toString(36)}`;
  await page.goto(`${api}/demo/`);
  await page.waitForSelector('body[data-ready="true"]');
  await page.fill('#token', token);
  await page.fill('#client_order_id', clientOrderId);
  await page.check('#flaky');
  await page.click('#place');

  // Every answer is dropped: the page keeps retrying with the same key.
  await page.waitForFunction(() => Number(document.getElementById('attempts').textContent) >= 3, null, { timeout: 30_000 });
  assert.equal(await page.textContent('#state'), 'processing');
  assert.ok(answers.length >= 2 && answers.every((a) => a.status === 201 || a.status === 200 || a.status === 409), JSON.stringify(answers));

  // Reload mid-retry: the flaky switch is off again, the pending intent resumes.
  await page.reload();
  await page.waitForSelector('#state[data-state="done"]', { timeout: 30_000 });
  const resumedKey = await page.textContent('#key');
  const orderId = await page.textContent('#order-id');
  assert.equal(await page.inputValue('#client_order_id'), clientOrderId);
  assert.equal(await page.textContent('#replayed'), 'true');
  const sentFp = await page.textContent('#sent-fp');
  assert.equal(await page.textContent('#server-fp'), sentFp);
  assert.equal(await page.textContent('#this-region'), 'a');
  assert.equal(await page.textContent('#answered-by'), 'b');
  assert.equal(await page.textContent('#home'), 'b');
  if (SHOTS) await page.screenshot({ path: join(SHOTS, 'demo-resumed.png'), fullPage: true });

  // One key for every attempt, before and after the reload; one fingerprint.
  assert.ok(sent.length >= 4, `only ${sent.length} requests`);
  assert.deepEqual([...new Set(sent.map((s) => s.key))], [resumedKey]);
  assert.deepEqual([...new Set(sent.map((s) => s.fingerprint))], [sentFp]);

  // Submit again: the intent is settled, so this is a new key for the same
  // client_order_id; the marker answers with the same order.
  await page.click('#place');
  await page.waitForFunction(
    (key) => document.getElementById('state').dataset.state === 'done' && document.getElementById('key').textContent !== key,
    resumedKey, { timeout: 30_000 },
  );
  assert.equal(await page.textContent('#order-id'), orderId);
  assert.equal(await page.textContent('#server-fp'), await page.textContent('#sent-fp'));
  if (SHOTS) await page.screenshot({ path: join(SHOTS, 'demo-again.png'), fullPage: true });

  // Every answer the server gave named the same order, with the fingerprint the page sent.
  const ok = answers.filter((a) => a.status < 300);
  assert.ok(ok.length >= 4);
  assert.deepEqual([...new Set(ok.map((a) => a.orderId).filter(Boolean))], [orderId]);
  assert.deepEqual([...new Set(answers.map((a) => a.fingerprint).filter(Boolean))], [sentFp]);
  // One creation; the rest are replays of it (201, Idempotent-Replayed) or the
  // marker's answer to the second click's new key (200).
  assert.equal(ok.filter((a) => a.status === 201 && !a.replayed).length, 1, JSON.stringify(answers));
  assert.ok(ok.some((a) => a.status === 200), JSON.stringify(answers));

  // And the server has exactly that one order for the business key.
  const found = await fetch(`${api}/v1/orders?client_order_id=${encodeURIComponent(clientOrderId)}`, {
    headers: { Authorization: `Bearer ${token}` },
  });
  assert.equal(found.status, 200);
  const order = await found.json();
  assert.equal(order.order_id, orderId);
  assert.equal(order.client_order_id, clientOrderId);
  await page.close();
});

test('the live cluster page shows regions, nodes, tenants and a move to its end', async () => {
  const page = await browser.context.newPage();
  page.on('pageerror', (e) => { nodeLog += `\npage error: ${e}`; });
  const urls = [];
  page.on('request', (r) => urls.push(r.url()));
  await page.goto(`${api}/admin/`);
  await page.waitForSelector('body[data-ready="true"]');
  await page.fill('#token', adminToken);
  await page.click('#connect');
  await page.waitForSelector('#status[data-state="live"]', { timeout: 15_000 });
  const column = (id, n) => page.$$eval(`#${id} tr`, (rows, i) => rows.map((r) => r.children[i]?.textContent), n);
  assert.deepEqual((await column('regions', 0)).sort(), ['a', 'b', 'c']);
  assert.equal((await column('nodes', 0)).length, 3);
  assert.ok((await column('nodes', 2)).includes('leader'), 'one node is the registry leader');
  assert.deepEqual((await column('tenants', 0)).sort(), ['demo-a', 'demo-b', 'demo-c']);
  assert.equal((await column('tenants', 2))[0], '1');
  // A move started elsewhere appears and runs to its end without a reload.
  const started = await fetch(`${api}/admin/v1/tenants/demo-c/move`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${adminToken}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ to: 'a' }),
  });
  assert.equal(started.status, 202);
  await page.waitForFunction(() => [...document.querySelectorAll('#operations tr')]
    .some((r) => r.children[2]?.textContent === 'demo-c' && r.children[4]?.textContent === 'done'), null, { timeout: 30_000 });
  await page.waitForFunction(() => [...document.querySelectorAll('#tenants tr')]
    .some((r) => r.children[0]?.textContent === 'demo-c' && r.children[1]?.textContent === 'a' && r.children[2]?.textContent === '2'), null, { timeout: 15_000 });
  if (SHOTS) await page.screenshot({ path: join(SHOTS, 'admin.png'), fullPage: true });
  assert.ok(urls.every((u) => !u.includes(adminToken)), 'the admin token never appears in a URL');
  await page.close();
});

/** POST to `up`'s control API (kill, start, isolate, heal). */
async function control(path) {
  const response = await fetch(`${cluster.control_url}${path}`, {
    method: 'POST', headers: { Authorization: `Bearer ${adminToken}` },
  });
  assert.ok(response.ok, `${path}: ${response.status}`);
}

test('the cluster page follows the isolation and failover of its own node\'s region through another node', async () => {
  const page = await browser.context.newPage();
  page.on('pageerror', (e) => { nodeLog += `\npage error: ${e}`; });
  await page.goto(`${api}/admin/`);
  await page.waitForSelector('body[data-ready="true"]');
  await page.fill('#token', adminToken);
  await page.click('#connect');
  await page.waitForSelector('#status[data-state="live"]', { timeout: 15_000 });
  const rowOf = (id, first) => page.$$eval(`#${id} tr`, (rows, f) => rows
    .map((r) => [...r.children].map((c) => c.textContent)).find((cells) => cells[0] === f), first);
  // Every node ready, each region's own leader and lease shown.
  await page.waitForFunction(() => [...document.querySelectorAll('#nodes tr')]
    .every((r) => r.children[4]?.textContent === 'ready'), null, { timeout: 15_000 });
  await page.waitForFunction(() => [...document.querySelectorAll('#regions tr')]
    .every((r) => /^node \d+/.test(r.children[5]?.textContent) && r.children[6]?.textContent.startsWith('held')), null, { timeout: 15_000 });

  // The page's own region is cut off from the others: its node still answers
  // the browser at the page's address, but is not ready, and its registry
  // replica goes stale.
  const a = cluster.nodes.filter((n) => n.region === 'a');
  await control('/v1/regions/a/isolate');
  await page.waitForFunction((origin) => {
    const status = document.querySelector('#status');
    return status.dataset.state === 'live' && status.dataset.via !== origin;
  }, api, { timeout: 30_000 });
  // Through the address the registry holds (up's proxy, cut with the region)
  // it is unreachable; through one the browser still reaches, not ready.
  await page.waitForFunction(() => [...document.querySelectorAll('#nodes tr')]
    .some((r) => r.children[1]?.textContent === 'a' && /^(up, not ready|unreachable)/.test(r.children[4]?.textContent)), null, { timeout: 15_000 });
  assert.match((await rowOf('regions', 'a'))[5], /no node answers/);

  // Failed over to its standby through region b, the page shows the result.
  const b = cluster.regions.find((r) => r.name === 'b').api_url;
  const deadline = Date.now() + 60_000;
  let started;
  for (;;) {
    started = await fetch(`${b}/admin/v1/regions/a/failover`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${adminToken}`, 'Content-Type': 'application/json' },
      body: '{}',
    });
    if (started.status === 202 || Date.now() > deadline) break;
    await sleep(250);
  }
  assert.equal(started.status, 202, await started.text());
  await page.waitForFunction(() => [...document.querySelectorAll('#operations tr')]
    .some((r) => r.children[1]?.textContent === 'failover' && r.children[4]?.textContent === 'done'
      && r.children[7]?.textContent.includes('tenants re-homed')
      && r.children[7]?.textContent.includes('estimated lost')), null, { timeout: 90_000 });

  // Back: the region reconciles and the page shows its orphans.
  await control('/v1/regions/a/heal');
  await page.waitForFunction(() => [...document.querySelectorAll('#regions tr')]
    .some((r) => r.children[0]?.textContent === 'a' && /^done: \d+ orphans$/.test(r.children[7]?.textContent)), null, { timeout: 90_000 });
  await page.waitForFunction(() => [...document.querySelectorAll('#nodes tr')]
    .every((r) => r.children[4]?.textContent === 'ready'), null, { timeout: 60_000 });
  if (SHOTS) await page.screenshot({ path: join(SHOTS, 'admin-failover.png'), fullPage: true });

  // The page's own node killed: the page stays live through another, and
  // shows that node unreachable.
  for (const n of a) await control(`/v1/nodes/${n.node_id}/kill`);
  await page.waitForFunction(() => [...document.querySelectorAll('#nodes tr')]
    .some((r) => r.children[1]?.textContent === 'a' && r.children[4]?.textContent === 'unreachable'), null, { timeout: 15_000 });
  await page.waitForFunction((origin) => {
    const status = document.querySelector('#status');
    return status.dataset.state === 'live' && status.dataset.via !== origin;
  }, api, { timeout: 15_000 });
  for (const n of a) await control(`/v1/nodes/${n.node_id}/start`);
  await page.close();
});
