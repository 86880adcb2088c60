// `coli web --api-key KEY` from its own page: the page asks for the key when the server answers
// 401 (it had nowhere to enter one: every call failed), says when a key is wrong, sends the key
// with every API call once it is entered, and remembers it across a reload.
// Usage: node --test api_key.test.mjs (env COLI_BIN, COLI_SCRIPTED_MODEL, COLI_SCRIPTED_PLUGIN_DIR)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { launchChromium, reply, scriptedModel, sendAndWait, startWeb, stopWeb } from './support.mjs';

const KEY = 'k3-key-only-this-test-knows';
let dir, server, browser;

before(async () => {
  dir = scriptedModel([{ when: '', reply: reply('Hello with a key.') }]);
  server = await startWeb(dir, { args: ['--api-key', KEY] });
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await stopWeb(server);
});

test('the page asks for the API key, refuses a wrong one, then chats and keeps it', async () => {
  const context = await browser.newContext({ viewport: { width: 390, height: 780 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const auth = [];
  page.on('request', (r) => {
    if (new URL(r.url()).pathname.startsWith('/v1/')) auth.push(r.headers().authorization ?? '');
  });
  await page.goto(server.base);

  // Without a key: the settings open on the key field and the banner says what to do.
  await page.waitForFunction(() => !document.getElementById('error').hidden);
  assert.match(await page.textContent('#error'), /--api-key.*settings/);
  assert.equal(await page.isVisible('#settings'), true);
  assert.equal(await page.evaluate(() => document.activeElement.id), 'api-key');

  // A wrong key: the server's word for it.
  await page.fill('#api-key', 'not-the-key');
  await page.press('#api-key', 'Tab');
  await page.waitForFunction(() => /invalid API key/.test(document.getElementById('error').textContent));
  assert.equal(await page.textContent('#model-name'), '…');

  // The right key: the model shows, the banner goes, and a message is answered.
  await page.fill('#api-key', KEY);
  await page.press('#api-key', 'Tab');
  await page.waitForFunction(() => document.getElementById('model-name').textContent === 'scripted');
  assert.equal(await page.isVisible('#error'), false);
  await sendAndWait(page, 'hello');
  assert.match(await page.locator('.turn.assistant').last().textContent(), /Hello with a key\./);
  assert.ok(auth.includes(`Bearer ${KEY}`), 'the key went as a bearer token');

  // A reload keeps the key: no question asked again.
  auth.length = 0;
  await page.reload();
  await page.waitForFunction(() => document.getElementById('model-name').textContent === 'scripted');
  assert.equal(await page.isVisible('#error'), false);
  assert.ok(auth.length > 0 && auth.every((a) => a === `Bearer ${KEY}`), JSON.stringify(auth));
  assert.deepEqual(errors, []);
  await context.close();
});
