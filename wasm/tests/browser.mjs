// Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven
// by playwright-core (no browser download), with a throwaway profile.

import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const CHROMIUM = process.env.KEYHOLD_CHROMIUM ?? '/usr/bin/chromium';

/** Launches Chromium; `close()` also removes the profile folder. */
export async function launch() {
  const profile = mkdtempSync(join(tmpdir(), 'keyhold-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.jsonl': 'application/x-ndjson', '.json': 'application/json' };

/** Serves `root` (a folder) at `prefix` (origin + path) inside the context, without a server. */
export async function serveFolder(context, prefix, root, { readFile, extname }) {
  const base = new URL(prefix).pathname.replace(/\/$/, '');
  await context.route(`${prefix}/**`, async (route) => {
    const path = decodeURIComponent(new URL(route.request().url()).pathname).slice(base.length);
    if (path.includes('..')) return route.fulfill({ status: 404, body: 'no' });
    try {
      const body = await readFile(join(root, path));
      await route.fulfill({ status: 200, body, contentType: TYPES[extname(path)] ?? 'application/octet-stream' });
    } catch {
      await route.fulfill({ status: 404, body: 'not found' });
    }
  });
}
