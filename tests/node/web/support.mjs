// Shared by the chat page's browser tests: `coli web` on a scripted K3 model whose replies the
// test writes (tools/k3_scripted: K3's real tokenizer, template and parser around fixed replies),
// and Debian's headless Chromium driven by playwright-core.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import net from 'node:net';
import { chromium } from 'playwright-core';

export const COLI = process.env.COLI_BIN;
export const SCRIPTED = process.env.COLI_SCRIPTED_MODEL;
export const SCRIPTED_PLUGINS = process.env.COLI_SCRIPTED_PLUGIN_DIR;
export const ARTIFACTS = process.env.COLI_ARTIFACTS || tmpdir();
const CHROMIUM = process.env.COLI_CHROMIUM || '/usr/bin/chromium';

// One scripted reply in K3's output syntax: reasoning, then `content` as the answer.
export function reply(content, reasoning = 'Let me think.') {
  return `${reasoning}<|close|>think<|sep|><|open|>response<|sep|>${content}<|close|>response` +
    '<|sep|><|close|>message<|sep|><|end_of_msg|>';
}

// A scripted model folder: the k3_scripted fixture's tokenizer and config with these rules
// ([{when, reply}], the first whose `when` occurs in the rendered prompt answers).
export function scriptedModel(rules) {
  assert.ok(SCRIPTED && SCRIPTED_PLUGINS, 'COLI_SCRIPTED_MODEL and COLI_SCRIPTED_PLUGIN_DIR are set');
  const dir = mkdtempSync(path.join(tmpdir(), 'coli-web-scripted-'));
  for (const f of ['config.json', 'tiktoken.model', 'tokenizer_config.json']) {
    copyFileSync(path.join(SCRIPTED, f), path.join(dir, f));
  }
  writeFileSync(path.join(dir, 'script.json'), JSON.stringify({ rules }));
  return dir;
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
    s.on('error', reject);
  });
}

export async function waitHealthy(url, ms) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    try { if ((await fetch(`${url}/health`)).ok) return; } catch (_) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`coli web did not become healthy at ${url}`);
}

// Starts `coli web` on the scripted model `dir` and resolves with {proc, base, port}.
// `args`: more flags (e.g. --api-key KEY).
export async function startWeb(dir, { port, env, args = [] } = {}) {
  assert.ok(COLI, 'COLI_BIN is set');
  port ??= await freePort();
  const base = `http://127.0.0.1:${port}`;
  const flags = ['web', '--port', String(port), '--model', dir, '--model-id', 'scripted', ...args];
  const proc = spawn(COLI, flags, {
    stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, COLI_PLUGIN_DIR: SCRIPTED_PLUGINS, ...env },
  });
  await waitHealthy(base, 60000);
  return { proc, base, port };
}

export async function stopWeb(s, signal = 'SIGTERM') {
  if (s && s.proc.exitCode === null && s.proc.signalCode === null) {
    const exited = new Promise((r) => s.proc.once('exit', r));
    s.proc.kill(signal);
    await exited;
  }
}

export function launchChromium() {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

// A page of `base` in a fresh context; `init` runs before the page's own script (e.g. to plant
// a stored chat). Collects uncaught page errors in page.errors.
export async function openPage(browser, base, { init, arg, ...contextOptions } = {}) {
  const context = await browser.newContext({ viewport: { width: 390, height: 780 }, ...contextOptions });
  if (init) await context.addInitScript(init, arg);
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  await page.goto(base);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
  return page;
}

// Sends `text` from the composer and waits until its reply has ended (send is back).
export async function sendAndWait(page, text) {
  const before = await page.locator('.turn.assistant').count();
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
  await page.waitForFunction((n) => document.querySelectorAll('.turn.assistant').length > n &&
    !document.getElementById('send').hidden, before, { timeout: 30000 });
}

// The stored conversation that `page` shows (each conversation is a key `coli.chat.v2:<id>`;
// the tab keeps the id of the one it shows in sessionStorage).
export const storedChat = (page) => page.evaluate(() => JSON.parse(
  localStorage.getItem(`coli.chat.v2:${sessionStorage.getItem('coli.chat.current')}`) || 'null'));

// Every stored conversation of `page`'s origin, by id.
export const storedChats = (page) => page.evaluate(() => Object.fromEntries(
  Object.keys(localStorage).filter((k) => k.startsWith('coli.chat.v2:'))
    .map((k) => [k.slice('coli.chat.v2:'.length), JSON.parse(localStorage.getItem(k))])));

// The side list's titles, top to bottom, and the one marked current.
export const listed = (page) => page.evaluate(() => ({
  titles: [...document.querySelectorAll('#conversation-list .conv-open')].map((b) => b.textContent),
  current: document.querySelector('#conversation-list [aria-current="page"]')?.textContent ?? null,
}));
