// The chat page used as people use it, in headless Chromium: pasted code keeps its indentation,
// Enter while an IME composes (CJK) does not send, a double click on "send" does not stop the
// reply it started, Escape stops one and the focus goes back to the message box, a reader who
// scrolled up keeps the place when the reply ends, a second tab on the same chat neither hides
// nor overwrites it (nor replies in it while the first one does), and a server that goes away
// mid-reply leaves a clear message, the history, and a retry.
// Usage: node --test use.test.mjs (env COLI_BIN, COLI_SCRIPTED_MODEL, COLI_SCRIPTED_PLUGIN_DIR)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  launchChromium, openPage, reply, scriptedModel, sendAndWait, startWeb, stopWeb, storedChat,
} from './support.mjs';

// Long enough (~16k tokens) never to end by itself during a test: replies here end by stop.
const LONG = Array.from({ length: 400 }, (_, i) =>
  `Paragraph ${i}: ${'lorem ipsum dolor sit amet '.repeat(6)}`).join('\n\n');

let dir, server, browser;

before(async () => {
  dir = scriptedModel([
    { when: 'long', reply: reply(LONG) },
    { when: '', reply: reply('Hello from the script.') },
  ]);
  // 5 ms a token keeps the long reply streaming for seconds, long enough to act on it.
  server = await startWeb(dir, { env: { COLI_DECODE_DELAY_MS: '5' } });
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await stopWeb(server);
});

// One more tab of the page in `context` (tabs of one context share its storage).
async function tabIn(context) {
  const page = await context.newPage();
  await page.goto(server.base);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
  return page;
}

const lastNote = (page) => page.locator('.turn.assistant').last().locator('.turn-note').count();

test('Enter during an IME composition does not send; pasted code keeps its indentation', async () => {
  const page = await openPage(browser, server.base);
  const sent = [];
  page.on('request', (r) => {
    if (r.url().endsWith('/v1/chat/completions')) sent.push(JSON.parse(r.postData()));
  });
  // A composition (Chromium: isComposing) and Safari's order (compositionend first, then the
  // Enter as keyCode 229): neither sends.
  await page.fill('#input', '你好');
  await page.evaluate(() => {
    const input = document.getElementById('input');
    const enter = (init) => input.dispatchEvent(new KeyboardEvent('keydown',
      { key: 'Enter', bubbles: true, cancelable: true, ...init }));
    input.dispatchEvent(new CompositionEvent('compositionstart', { data: '' }));
    enter({ isComposing: true });
    enter({ keyCode: 229 });
    input.dispatchEvent(new CompositionEvent('compositionend', { data: '你好' }));
    enter({ keyCode: 229 });
  });
  assert.equal(await page.inputValue('#input'), '你好', 'the text is still being written');
  assert.equal(await page.locator('.turn.user').count(), 0, 'nothing was sent');
  await sendAndWait(page, '你好');
  assert.equal(sent[0].messages.at(-1).content, '你好');

  await sendAndWait(page, '\n    def f():\n        return 1\n\n');
  assert.equal(sent[1].messages.at(-1).content, '    def f():\n        return 1');

  assert.equal(sent.length, 2);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a double click on send does not stop the reply; Escape and stop do, focus stays', async () => {
  const page = await openPage(browser, server.base);
  await page.fill('#input', 'a long answer please');
  await page.dblclick('#send');
  // The second click landed on "stop" (it took send's place): the reply must go on anyway.
  await page.waitForFunction(() => {
    const turn = document.querySelector('.turn.assistant:last-child');
    if (!turn) return false;  // the reply starts once the tabs' reply lock is granted
    return turn.querySelector('.markdown').textContent.length > 0 || turn.querySelector('.turn-note');
  });
  assert.equal(await lastNote(page), 0, 'the reply was not stopped');
  assert.ok(await page.isVisible('#stop'), 'the reply goes on');

  await page.keyboard.press('Escape');
  await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  assert.equal(await page.locator('.turn.assistant').last().locator('.turn-note').textContent(),
    'stopped', 'Escape stopped the reply');

  await page.fill('#input', 'one more long answer');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() =>
    (document.querySelector('.turn.assistant:last-child .markdown')?.textContent.length ?? 0) > 0);
  await page.focus('#stop');
  await page.keyboard.press('Enter');  // a keyboard user on "stop"
  await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  assert.equal(await lastNote(page), 1);
  assert.equal(await page.evaluate(() => document.activeElement.id), 'input',
    'the focus is back on the message box, not lost with the hidden stop button');
  await page.context().close();
});

test('a reader who scrolled up keeps the place when the reply ends', async () => {
  const page = await openPage(browser, server.base, { viewport: { width: 390, height: 500 } });
  await page.fill('#input', 'a long answer please');
  await page.press('#input', 'Enter');
  // While it streams the view follows the reply; the reader then scrolls back to the top.
  await page.waitForFunction(() => {
    const m = document.getElementById('messages');
    return m.scrollHeight > m.clientHeight + 300;
  }, null, { timeout: 30000 });
  await page.evaluate(() => { document.getElementById('messages').scrollTop = 0; });
  await page.evaluate(() => document.getElementById('stop').click());  // the reply ends
  await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  const { top, max } = await page.evaluate(() => {
    const m = document.getElementById('messages');
    return { top: m.scrollTop, max: m.scrollHeight - m.clientHeight };
  });
  assert.ok(max > 300, `the chat overflows (${max})`);
  assert.equal(top, 0, 'the end of the reply did not jump to the bottom');
  await page.context().close();
});

// (Each tab shows one conversation; a new tab opens the one written last.)
test('two tabs on one chat: the second shows what the first said and does not overwrite it', async () => {
  const context = await browser.newContext({ viewport: { width: 390, height: 780 } });
  const pageIn = () => tabIn(context);
  const first = await pageIn();
  await sendAndWait(first, 'said in the first tab');
  const second = await pageIn();  // shows the first tab's chat
  await sendAndWait(first, 'said again in the first tab');  // the second tab's copy is old now
  await second.waitForFunction(() => [...document.querySelectorAll('.turn.user')]
    .some((t) => t.textContent.includes('said again in the first tab')), null, { timeout: 10000 });
  await sendAndWait(second, 'said in the second tab');
  const said = (await storedChat(first)).turns.filter((t) => t.role === 'user').map((t) => t.content);
  assert.deepEqual(said, ['said in the first tab', 'said again in the first tab', 'said in the second tab']);
  assert.equal(await storedChat(second).then((c) => c.id), await storedChat(first).then((c) => c.id));
  await first.waitForFunction(() => document.querySelectorAll('.turn.user').length === 3);
  await context.close();
});

// Both tabs replying at once each saved a chat without the other's exchange: the last to finish
// won, and the first tab's question and answer were gone after a reload.
test('two tabs on one chat: while one writes a reply the other says so, keeps its text, and sends later', async () => {
  const context = await browser.newContext({ viewport: { width: 390, height: 780 } });
  const pageIn = () => tabIn(context);
  const first = await pageIn();
  await sendAndWait(first, 'hello');
  const second = await pageIn();  // shows the first tab's chat
  let sentFromSecond = 0;
  second.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) sentFromSecond++; });
  await first.fill('#input', 'a long answer please');
  await first.press('#input', 'Enter');
  await first.waitForFunction(() =>
    (document.querySelector('.turn.assistant:last-child .markdown')?.textContent.length ?? 0) > 0,
  null, { timeout: 30000 });
  await second.fill('#input', 'asked in the second tab meanwhile');
  await second.press('#input', 'Enter');
  await second.waitForFunction(() => document.getElementById('error').textContent
    .includes('Another tab of this page is writing a reply'), null, { timeout: 10000 });
  assert.equal(await second.inputValue('#input'), 'asked in the second tab meanwhile');
  assert.equal(sentFromSecond, 0, 'the second tab sent nothing');

  await first.evaluate(() => document.getElementById('stop').click());
  await first.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  await second.waitForFunction(() => document.querySelectorAll('.turn.assistant').length === 2);
  await second.press('#input', 'Enter');
  await second.waitForFunction(() => document.querySelectorAll('.turn.assistant').length === 3 &&
    !document.getElementById('send').hidden, null, { timeout: 30000 });
  const stored = await storedChat(first);
  assert.deepEqual(stored.turns.filter((t) => t.role === 'user').map((t) => t.content),
    ['hello', 'a long answer please', 'asked in the second tab meanwhile']);
  assert.equal(stored.turns.filter((t) => t.role === 'assistant').length, 3);
  assert.equal(sentFromSecond, 1);
  await context.close();
});

test('the server going away: a clear message, the chat kept, and a retry once it is back', async () => {
  const own = await startWeb(dir, { env: { COLI_DECODE_DELAY_MS: '20' } });
  const page = await openPage(browser, own.base);
  await page.fill('#input', 'a long answer please');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() =>
    (document.querySelector('.turn.assistant:last-child .markdown')?.textContent.length ?? 0) > 0);
  await stopWeb(own, 'SIGKILL');
  await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  assert.match(await page.textContent('#error'), /connection to the server broke off mid-reply/);

  await sendAndWait(page, 'is anyone there?');
  assert.match(await page.textContent('#error'), /Cannot reach the server/);
  assert.match(await page.locator('.turn.assistant').last().textContent(), /Cannot reach/);
  const kept = (await storedChat(page)).turns.filter((t) => t.role === 'user').map((t) => t.content);
  assert.deepEqual(kept, ['a long answer please', 'is anyone there?'], 'the chat is kept');

  const back = await startWeb(dir, { port: own.port, env: { COLI_DECODE_DELAY_MS: '20' } });
  try {
    // The retry answers the whole chat again (the first message asked for the long reply).
    await page.click('[data-testid="regenerate"]');
    await page.waitForFunction(() => document.querySelector('.turn.assistant:last-child')
      .textContent.includes('Paragraph 0'), null, { timeout: 30000 });
    assert.equal(await page.isHidden('#error'), true, 'the error is gone after the retry');
    await page.evaluate(() => document.getElementById('stop').click());
    await page.waitForSelector('#send', { state: 'visible', timeout: 10000 });
  } finally {
    await stopWeb(back);
  }
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
