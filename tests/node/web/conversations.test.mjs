// The chat page's conversations, in headless Chromium: "new chat" keeps the old one, the side
// list (newest first, titled by the first question) switches between them and survives a reload,
// one is deleted (with an undo) and the other stays, the one chat of the older page
// (`coli.chat.v1`) is moved into the list, two tabs reply at once in two conversations and both
// keep their whole exchange (the old page kept one chat: the second tab could not reply, and its
// "new chat" wiped the first tab's chat), and corrupt stored conversations leave a working page.
// Usage: node --test conversations.test.mjs
// (env COLI_BIN, COLI_SCRIPTED_MODEL, COLI_SCRIPTED_PLUGIN_DIR)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import {
  launchChromium, listed, openPage, reply, scriptedModel, sendAndWait, startWeb, stopWeb,
  storedChat, storedChats,
} from './support.mjs';

const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

// ~2300 tokens each (the scripted model's context is 4096): at 5 ms a token a reply streams for
// 11 s or more, so two overlap.
const slow = (name) => Array.from({ length: 20 }, (_, i) =>
  `${name} paragraph ${i}: ${'lorem ipsum dolor sit amet '.repeat(6)}`).join('\n\n');
const SLOW_ONE = slow('One');
const SLOW_TWO = slow('Two');
const APPLES = 'Tell me about apples, the fruit that keeps doctors away every single day';
const APPLES_TITLE = 'Tell me about apples, the fruit that keeps doct…';

let server, browser;

before(async () => {
  const dir = scriptedModel([
    { when: 'first slow one', reply: reply(SLOW_ONE) },
    { when: 'second slow one', reply: reply(SLOW_TWO) },
    { when: 'more apples', reply: reply('More apples.') },
    { when: 'apples', reply: reply('Apples are red.') },
    { when: 'pears', reply: reply('Pears are green.') },
    { when: '', reply: reply('Hello from the script.') },
  ]);
  server = await startWeb(dir, { env: { COLI_DECODE_DELAY_MS: '5' } });
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await stopWeb(server);
});

const shownTurns = (page) => page.evaluate(() => [...document.querySelectorAll('.turn')]
  .map((t) => `${t.dataset.testid}: ${t.querySelector('.body').textContent.trim()}`));

const itemOf = (page, title) =>
  page.locator('#conversation-list li').filter({ has: page.getByText(title, { exact: true }) });

// Deletes the (first) listed chat titled `title` and waits until it has left the list: the page
// first asks the browser's lock manager whether another tab is writing a reply there.
async function deleteChat(page, title) {
  const count = () => page.evaluate((t) => [...document.querySelectorAll('#conversation-list .conv-open')]
    .filter((b) => b.textContent === t).length, title);
  const before = await count();
  await itemOf(page, title).first().locator('.conv-delete').click();
  await page.waitForFunction(([t, n]) => [...document.querySelectorAll('#conversation-list .conv-open')]
    .filter((b) => b.textContent === t).length < n, [title, before]);
}

// One more tab of the page in `context` (tabs of one context share its storage); collects its
// uncaught errors in page.errors.
async function tabIn(context) {
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  await page.goto(server.base);
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
  return page;
}

async function reloaded(page) {
  await page.reload();
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
}

// Plants `items` ({key: value}) in localStorage once, before the page's own script first runs.
const plant = (items) => ({
  init: (v) => {
    if (!sessionStorage.getItem('planted')) {
      sessionStorage.setItem('planted', '1');
      for (const [k, text] of Object.entries(JSON.parse(v))) localStorage.setItem(k, text);
    }
  },
  arg: JSON.stringify(items),
});

test('new chat keeps the old one; the list switches, deletes with an undo, survives a reload', async () => {
  const page = await openPage(browser, server.base, { viewport: { width: 1000, height: 700 } });
  await sendAndWait(page, APPLES);
  await page.click('#new-chat');
  assert.deepEqual(await shownTurns(page), [], 'a new chat starts empty');
  await sendAndWait(page, 'And pears?');
  const both = { titles: ['And pears?', APPLES_TITLE], current: 'And pears?' };
  assert.deepEqual(await listed(page), both, 'newest first, the one shown marked');

  await reloaded(page);
  assert.deepEqual(await listed(page), both, 'both kept over a reload');
  assert.deepEqual(await shownTurns(page), ['turn-user: And pears?', 'turn-assistant: Pears are green.']);

  await itemOf(page, APPLES_TITLE).locator('.conv-open').click();
  assert.deepEqual(await shownTurns(page), [`turn-user: ${APPLES}`, 'turn-assistant: Apples are red.']);
  assert.equal((await listed(page)).current, APPLES_TITLE);
  await sendAndWait(page, 'more apples');
  assert.deepEqual((await listed(page)).titles, [APPLES_TITLE, 'And pears?'], 'written last, listed first');
  assert.deepEqual((await storedChat(page)).turns.map((t) => t.content),
    [APPLES, 'Apples are red.', 'more apples', 'More apples.'], 'the question went to its own chat');

  // Deleting the chat shown: the other one opens; undo brings it back, in its place.
  await deleteChat(page, APPLES_TITLE);
  assert.deepEqual(await listed(page), { titles: ['And pears?'], current: 'And pears?' });
  assert.match(await page.textContent('#notice'), /Deleted “Tell me about apples/);
  assert.equal(await page.evaluate(() => document.activeElement.id), 'undo', 'undo is at hand');
  await page.keyboard.press('Enter');
  assert.deepEqual(await listed(page), { titles: [APPLES_TITLE, 'And pears?'], current: APPLES_TITLE });
  assert.equal((await shownTurns(page)).length, 4);

  // Deleting one not shown; after a reload it is still gone, the other still whole.
  await deleteChat(page, 'And pears?');
  assert.deepEqual(await listed(page), { titles: [APPLES_TITLE], current: APPLES_TITLE });
  await reloaded(page);
  assert.deepEqual(await listed(page), { titles: [APPLES_TITLE], current: APPLES_TITLE });
  const stored = Object.values(await storedChats(page));
  assert.equal(stored.length, 1);
  assert.equal(stored[0].turns.length, 4);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('on a phone the list is a panel: opened, chosen from by keyboard, closed by Escape or a tap beside it', async () => {
  const page = await openPage(browser, server.base);  // 390 px wide
  await sendAndWait(page, 'apples on a phone');
  await page.click('#new-chat');
  await sendAndWait(page, 'pears on a phone');
  assert.ok(await page.isHidden('#sidebar'), 'the list is folded away');
  await page.click('#sidebar-toggle');
  assert.ok(await page.isVisible('#sidebar'));
  assert.equal(await page.getAttribute('#sidebar-toggle', 'aria-expanded'), 'true');
  assert.equal(await page.evaluate(() => document.activeElement.getAttribute('aria-current')), 'page',
    'the focus is on the chat shown');
  // A tap beside the panel (there, on "settings") closes it and does nothing else.
  const [panel, settings] = await page.evaluate(() => ['sidebar', 'settings-button']
    .map((id) => document.getElementById(id).getBoundingClientRect().toJSON()));
  assert.ok(settings.left > panel.right, 'the tap lands beside the panel');
  await page.mouse.click(settings.left + settings.width / 2, settings.top + settings.height / 2);
  assert.ok(await page.isHidden('#sidebar'));
  assert.equal(await page.getAttribute('#sidebar-toggle', 'aria-expanded'), 'false');
  assert.ok(await page.isHidden('#settings'), 'the tap opened nothing under the panel\'s shade');

  await page.click('#sidebar-toggle');
  await page.keyboard.press('Escape');
  assert.ok(await page.isHidden('#sidebar'));
  assert.equal(await page.evaluate(() => document.activeElement.id), 'sidebar-toggle');

  await page.keyboard.press('Enter');  // opens it again
  await itemOf(page, 'apples on a phone').locator('.conv-open').focus();
  await page.keyboard.press('Enter');
  assert.ok(await page.isHidden('#sidebar'), 'choosing a chat folds the list');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'input');
  assert.deepEqual(await shownTurns(page),
    ['turn-user: apples on a phone', 'turn-assistant: Apples are red.']);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the one chat of the older page (coli.chat.v1) is moved into the list, once', async () => {
  const old = { turns: [{ role: 'user', content: 'an old question' },
    { role: 'assistant', content: 'an old answer', reasoning: '', finish: 'stop' }],
  system: 'be brief', thinking: false };
  const context = await browser.newContext({ viewport: { width: 1000, height: 700 } });
  // Each tab plants it (sessionStorage is per tab): the second tab migrates it again.
  const { init, arg } = plant({ 'coli.chat.v1': JSON.stringify(old) });
  await context.addInitScript(init, arg);
  const page = await tabIn(context);
  assert.deepEqual(await listed(page), { titles: ['an old question'], current: 'an old question' });
  assert.deepEqual(await shownTurns(page),
    ['turn-user: an old question', 'turn-assistant: an old answer']);
  assert.equal(await page.inputValue('#system-prompt'), 'be brief');
  assert.equal(await page.isChecked('#thinking'), false);
  assert.equal(await page.evaluate(() => localStorage.getItem('coli.chat.v1')), null,
    'the old key goes once moved');
  // A second tab and a reload find the one conversation, not copies of it.
  const second = await tabIn(context);
  await reloaded(page);
  assert.deepEqual((await listed(second)).titles, ['an old question']);
  assert.deepEqual((await listed(page)).titles, ['an old question']);
  await sendAndWait(page, 'a new question');
  const stored = Object.values(await storedChats(page));
  assert.equal(stored.length, 1);
  assert.deepEqual(stored[0].turns.map((t) => t.role),
    ['user', 'assistant', 'user', 'assistant']);
  assert.deepEqual(stored[0].turns.slice(0, 3).map((t) => t.content),
    ['an old question', 'an old answer', 'a new question']);
  // Thinking was off in the old chat: the scripted reasoning comes as part of the answer.
  assert.match(stored[0].turns[3].content, /Hello from the script\.$/);
  assert.equal(stored[0].system, 'be brief');
  assert.deepEqual([...page.errors, ...second.errors], []);
  await context.close();
});

test('two tabs reply at once in two conversations and both keep their whole exchange', async () => {
  const context = await browser.newContext({ viewport: { width: 1000, height: 700 } });
  const first = await tabIn(context);
  const second = await tabIn(context);
  const streams = (page) => page.waitForFunction(() =>
    (document.querySelector('.turn.assistant:last-child .markdown')?.textContent.length ?? 0) > 0,
  null, { timeout: 30000 });
  await first.fill('#input', 'the first slow one');
  await first.press('#input', 'Enter');
  await streams(first);
  // The second tab shows the first's conversation (the newest); it starts one of its own.
  await second.waitForFunction(() => document.querySelectorAll('#conversation-list li').length === 1);
  await second.click('#new-chat');
  await second.fill('#input', 'the second slow one');
  await second.press('#input', 'Enter');
  await streams(second);
  assert.ok(await first.isVisible('#stop'), 'the first reply is still being written');
  assert.equal(await second.isHidden('#error'), true, 'the second tab was not turned away');
  const done = (page) => page.waitForSelector('#send', { state: 'visible', timeout: 60000 });
  await Promise.all([done(first), done(second)]);

  for (const page of [first, second]) await reloaded(page);
  const stored = Object.values(await storedChats(first))
    .map((c) => c.turns.map((t) => [t.role, t.content, t.finish ?? t.error ?? '']))
    .sort((a, b) => (a[0][1] < b[0][1] ? -1 : 1));
  assert.deepEqual(stored, [
    [['user', 'the first slow one', ''], ['assistant', SLOW_ONE, 'stop']],
    [['user', 'the second slow one', ''], ['assistant', SLOW_TWO, 'stop']],
  ]);
  assert.match((await shownTurns(first))[1], /^turn-assistant: One paragraph 0/);
  assert.match((await shownTurns(second))[1], /^turn-assistant: Two paragraph 0/);
  assert.deepEqual((await listed(first)).titles, (await listed(second)).titles);
  assert.deepEqual([...first.errors, ...second.errors], []);
  await context.close();
});

test('corrupt stored conversations leave a working page: listed, opened, written, deleted', async () => {
  const now = Date.now();
  const page = await openPage(browser, server.base, {
    viewport: { width: 1000, height: 700 },
    ...plant({
      'coli.chat.v2:broken': '{not json',
      'coli.chat.v2:array': '[1, 2]',
      'coli.chat.v2:odd': JSON.stringify({ turns: [null, 7, { role: 'user', content: 'kept question' },
        { role: 'assistant', content: { a: 1 }, toolCalls: 'x' }], updated: 'soon', system: 5 }),
      'coli.chat.v2:good': JSON.stringify({ turns: [{ role: 'user', content: 'good question' },
        { role: 'assistant', content: 'good answer', finish: 'stop' }], updated: now }),
    }),
  });
  const { titles, current } = await listed(page);
  assert.equal(current, 'good question', 'the newest readable one opens');
  assert.deepEqual([...titles].sort(), ['New chat', 'New chat', 'good question', 'kept question']);
  assert.deepEqual(await shownTurns(page), ['turn-user: good question', 'turn-assistant: good answer']);

  await itemOf(page, 'kept question').locator('.conv-open').click();
  assert.deepEqual(await shownTurns(page), ['turn-user: kept question', 'turn-assistant: ']);
  await sendAndWait(page, 'hello after a corrupt history');
  assert.match(await page.locator('.turn.assistant').last().textContent(), /Hello from the script\./);

  for (const item of await page.locator('#conversation-list li').all()) {
    if ((await item.locator('.conv-open').textContent()) === 'New chat') {
      await item.locator('.conv-open').click();
      break;
    }
  }
  assert.deepEqual(await shownTurns(page), []);
  while ((await listed(page)).titles.includes('New chat')) await deleteChat(page, 'New chat');
  await reloaded(page);
  assert.deepEqual([...(await listed(page)).titles].sort(), ['good question', 'kept question']);
  assert.deepEqual(Object.keys(await storedChats(page)).sort(), ['good', 'odd']);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the list passes axe-core\'s rules in light and dark mode, wide and as a phone panel', async () => {
  for (const colorScheme of ['light', 'dark']) {
    for (const width of [1000, 390]) {
      const chats = {};
      for (const [i, q] of ['first question', 'second question'].entries()) {
        chats[`coli.chat.v2:c${i}`] = JSON.stringify({ updated: i + 1, turns: [
          { role: 'user', content: q }, { role: 'assistant', content: 'an answer', finish: 'stop' }] });
      }
      const page = await openPage(browser, server.base,
        { colorScheme, viewport: { width, height: 700 }, ...plant(chats) });
      if (width < 600) await page.click('#sidebar-toggle');
      await deleteChat(page, 'first question');  // the undo notice shows
      assert.ok(await page.isVisible('#conversation-list'));
      await page.evaluate(AXE);
      const violations = await page.evaluate(async () =>
        (await window.axe.run(document, { resultTypes: ['violations'] })).violations.map((v) =>
          `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`));
      assert.deepEqual(violations, [], `${colorScheme} ${width}px`);
      await page.context().close();
    }
  }
});
