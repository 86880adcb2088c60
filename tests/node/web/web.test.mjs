// The chat page in Debian's headless Chromium (playwright-core) against `coli web` on the tiny
// Kimi K3 fixture: streamed text arrives in several steps, the reasoning block shows, stop really
// ends generation on the server (checked through /metrics), reload keeps the history.
// Usage: node --test web.test.mjs   (env COLI_BIN, COLI_MODEL, COLI_ARTIFACTS)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import net from 'node:net';
import { chromium } from 'playwright-core';

const COLI = process.env.COLI_BIN;
const MODEL = process.env.COLI_MODEL;
const ARTIFACTS = process.env.COLI_ARTIFACTS || tmpdir();
const CHROMIUM = process.env.COLI_CHROMIUM || '/usr/bin/chromium';

let server, base, browser;

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
    s.on('error', reject);
  });
}

async function waitHealthy(url, ms) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    try { if ((await fetch(`${url}/health`)).ok) return; } catch (_) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`coli web did not become healthy at ${url}`);
}

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  let sum = 0, found = false;
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (m && m[1] === name) { sum += Number(m[3]); found = true; }
  }
  assert.ok(found, `/metrics has ${name}`);
  return sum;
}

before(async () => {
  assert.ok(COLI, 'COLI_BIN is set');
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const args = ['web', '--port', String(port)];
  if (MODEL) args.push('--model', MODEL);
  // 40 ms per token keeps a reply streaming long enough to stop it mid-way.
  server = spawn(COLI, args, { stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, COLI_DECODE_DELAY_MS: '40' } });
  await waitHealthy(base, 120000);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
  if (server && server.exitCode === null) {
    server.kill('SIGTERM');
    await new Promise((r) => server.once('exit', r));
  }
});

test('chat page streams, stops, and keeps its history', async () => {
  const page = await browser.newPage({ viewport: { width: 390, height: 780 } });  // a phone
  const offsite = [];
  page.on('request', (r) => { if (!r.url().startsWith(base)) offsite.push(r.url()); });
  await page.goto(base);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');

  // Send a message; the model is in thinking mode, so its output streams into the reasoning block.
  await page.fill('#input', 'Hello there, tell me a long story.');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.turn.assistant details.reasoning', { timeout: 60000 });

  // Streamed text arrives in several steps: sample the visible length while it grows.
  const lengths = new Set();
  for (let i = 0; i < 60 && lengths.size < 4; i++) {
    const n = await page.evaluate(() => {
      const t = document.querySelector('.turn.assistant');
      return t ? t.textContent.length : 0;
    });
    if (n > 0) lengths.add(n);
    await page.waitForTimeout(100);
  }
  assert.ok(lengths.size >= 3, `text arrived in several steps (saw lengths ${[...lengths]})`);

  // Stop mid-reply: the button cancels the request and the server stops generating.
  assert.ok(await page.isVisible('#stop'), 'stop button is shown while generating');
  await page.click('#stop');
  await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  let inflight = 1;
  for (let i = 0; i < 50 && inflight > 0; i++) {
    inflight = await metric('coli_requests_active');
    if (inflight > 0) await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(inflight, 0, 'no request is in flight after stop');
  const tokensAfterStop = await metric('coli_completion_tokens_total');
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal(await metric('coli_completion_tokens_total'), tokensAfterStop,
    'the server generated nothing more after stop');
  assert.ok(await page.isVisible('.turn.assistant .turn-note'), 'the reply is marked stopped');

  // Reload: the conversation is still there.
  const before = await page.locator('.turn').count();
  await page.reload();
  await page.waitForSelector('.turn.user');
  assert.equal(await page.locator('.turn').count(), before, 'history survives a reload');
  assert.match(await page.locator('.turn.user').first().textContent(), /long story/);

  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'web-chat.png'), fullPage: true });

  // New chat clears it.
  await page.click('#new-chat');
  assert.equal(await page.locator('.turn').count(), 0);
  assert.deepEqual(offsite, [], 'the page made no request outside its own origin');
});
