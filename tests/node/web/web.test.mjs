// The chat page in Debian's headless Chromium (playwright-core) against `coli web` on the tiny
// Kimi K3 fixture: streamed text arrives in several steps, the reasoning block shows, stop really
// ends generation on the server (checked through /metrics), reload keeps the history, a long
// prompt shows its prefill progress in the status bar. Against the k3_scripted test family (a
// scripted reply through K3's real template and parser): a tool call shows as a box, and the
// result pasted into it goes back to the model as an OpenAI `tool` message.
// Usage: node --test web.test.mjs
//   (env COLI_BIN, COLI_MODEL, COLI_ARTIFACTS, COLI_SCRIPTED_MODEL, COLI_SCRIPTED_PLUGIN_DIR)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { freePort, waitHealthy } from './support.mjs';

const COLI = process.env.COLI_BIN;
const MODEL = process.env.COLI_MODEL;
const ARTIFACTS = process.env.COLI_ARTIFACTS || tmpdir();
const CHROMIUM = process.env.COLI_CHROMIUM || '/usr/bin/chromium';
const SCRIPTED = process.env.COLI_SCRIPTED_MODEL;
const SCRIPTED_PLUGINS = process.env.COLI_SCRIPTED_PLUGIN_DIR;

let server, base, browser, scripted;

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

// Starts `coli web` on a free port and resolves with {proc, base} once it answers /health.
async function startWeb(model, env) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const args = ['web', '--port', String(port)];
  if (model) args.push('--model', model);
  const proc = spawn(COLI, args, { stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, ...env } });
  await waitHealthy(url, 120000);
  return { proc, base: url };
}

async function stopWeb(s) {
  if (s && s.proc.exitCode === null) {
    s.proc.kill('SIGTERM');
    await new Promise((r) => s.proc.once('exit', r));
  }
}

before(async () => {
  assert.ok(COLI, 'COLI_BIN is set');
  // 40 ms per token keeps a reply streaming long enough to stop it mid-way; prefill in chunks of
  // 8 tokens, 60 ms apart, keeps a long prompt's progress on screen long enough to read.
  server = await startWeb(MODEL, {
    COLI_DECODE_DELAY_MS: '40', K3_CHUNK: '8', COLI_PREFILL_DELAY_MS: '60',
  });
  base = server.base;
  if (SCRIPTED) scripted = await startWeb(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
  await stopWeb(server);
  await stopWeb(scripted);
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

  // New chat starts an empty one (the old one stays in the list).
  await page.click('#new-chat');
  assert.equal(await page.locator('.turn').count(), 0);
  assert.deepEqual(offsite, [], 'the page made no request outside its own origin');
});

test('a long prompt shows its prefill progress in the status bar', async () => {
  const page = await browser.newPage({ viewport: { width: 390, height: 780 } });
  await page.goto(base);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
  const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(12);
  const count = (await (await fetch(`${base}/tokenize`, {
    method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: prompt }] }),
  })).json()).count;
  assert.ok(count >= 200, `the prompt has ${count} tokens`);
  await page.fill('#input', prompt);
  await page.press('#input', 'Enter');
  // Sample the status bar until the first token arrives (the reasoning block appears).
  const seen = [];
  for (let i = 0; i < 600; i++) {
    const { text, visible, answering } = await page.evaluate(() => {
      const el = document.getElementById('st-prefill');
      return { text: el.textContent, visible: !el.hidden,
        answering: !!document.querySelector('.turn.assistant details.reasoning') };
    });
    if (visible) {
      const m = text.match(/^prefill (\d+) %$/);
      if (m && seen.at(-1) !== Number(m[1])) {
        seen.push(Number(m[1]));
        if (seen.length === 2) {
          mkdirSync(ARTIFACTS, { recursive: true });
          await page.screenshot({ path: path.join(ARTIFACTS, 'web-prefill.png') });
        }
      }
    }
    if (answering) break;
    await page.waitForTimeout(50);
  }
  assert.ok(seen.length >= 2, `the status bar showed prefill percentages ${JSON.stringify(seen)}`);
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i] > seen[i - 1], JSON.stringify(seen));
  assert.ok(seen[0] < 100, JSON.stringify(seen));
  assert.ok(seen.every((p) => p >= 0 && p <= 100), JSON.stringify(seen));
  await page.waitForSelector('.turn.assistant details.reasoning', { timeout: 60000 });
  assert.ok(await page.isHidden('#st-prefill'), 'the progress goes once the answer streams');
  await page.click('#stop');
  await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  await page.click('#new-chat');
  await page.close();
});

test('a tool call shows as a box, and its result goes back as an OpenAI tool message', {
  skip: SCRIPTED ? false : 'COLI_SCRIPTED_MODEL is not set',
}, async () => {
  const page = await browser.newPage({ viewport: { width: 390, height: 780 } });
  const bodies = [];
  page.on('request', (r) => {
    if (r.url().endsWith('/v1/chat/completions')) bodies.push(JSON.parse(r.postData()));
  });
  await page.goto(scripted.base);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
  await page.fill('#input', 'What is the weather in Paris?');
  await page.press('#input', 'Enter');
  const box = page.locator('[data-testid="tool-call"]');
  await box.waitFor({ timeout: 60000 });
  await page.waitForSelector('#send', { state: 'visible', timeout: 30000 });
  const text = await box.textContent();
  assert.match(text, /get_weather/);
  assert.match(text, /"city":\s*"Paris"/);
  assert.match(text, /"days":\s*3/);

  // Paste the result; the page sends it back and the scripted model answers from it.
  await page.fill('[data-testid="tool-result-input"]', '{"temp_c": 21}');
  await page.click('[data-testid="tool-result-send"]');
  await page.waitForFunction(
    () => [...document.querySelectorAll('.turn.assistant')].some(
      (t) => t.textContent.includes('It is 21 degrees in Paris.')), null, { timeout: 60000 });
  await page.waitForSelector('#send', { state: 'visible', timeout: 30000 });
  assert.equal(bodies.length, 2);
  const sent = bodies[1].messages;
  assert.equal(sent.length, 3, JSON.stringify(sent));
  assert.equal(sent[0].role, 'user');
  assert.equal(sent[1].role, 'assistant');
  assert.equal(sent[1].content, null);
  assert.equal(sent[1].tool_calls.length, 1);
  const call = sent[1].tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 3 });
  assert.deepEqual(sent[2], { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' });
  assert.ok(await page.isVisible('[data-testid="tool-result"]'));
  assert.equal(await page.locator('[data-testid="tool-result-input"]').count(), 0,
    'an answered call asks for nothing more');
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'web-tool-call.png'), fullPage: true });
  await page.close();
});
