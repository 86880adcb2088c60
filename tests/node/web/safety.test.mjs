// The chat page against hostile or broken input, in headless Chromium: a reply full of HTML and
// markdown tricks (it must not restyle, cover or leave the page, nor load anything off-site), a
// stored chat that is corrupt, storage that is full or disabled (never a dead page, never a lost
// message), and an automated accessibility check (axe-core) in light and dark mode.
// Usage: node --test safety.test.mjs (env COLI_BIN, COLI_SCRIPTED_MODEL, COLI_SCRIPTED_PLUGIN_DIR)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import {
  ARTIFACTS, launchChromium, openPage, reply, scriptedModel, sendAndWait, startWeb, stopWeb,
  storedChat,
} from './support.mjs';

const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

const TRICKS = [
  '# Tricks',
  '<style>body { display: none !important }</style>',
  '<div style="position: fixed; inset: 0; background: red" class="turn user">overlay</div>',
  '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">',
  '<form action="https://example.com/steal"><textarea name="q"></textarea><button>go</button></form>',
  '![remote](https://example.com/track.png "tracker")',
  '[js link](javascript:window.__pwned=3) and [a page](https://example.com/page)',
  '<a href="https://example.com/raw" target="_self">raw anchor</a>',
  '| a | b |\n|---|---|\n| 1 | 2 |',
  '```python\ndef f(x):\n    return x < 3\n```',
].join('\n\n');

let server, browser;

before(async () => {
  const dir = scriptedModel([
    { when: 'tricks', reply: reply(TRICKS) },
    { when: '', reply: reply('Hello from the script.') },
  ]);
  server = await startWeb(dir);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await stopWeb(server);
});

// What a person sees of the page: every part of the layout laid out and not covered.
async function pageIsUsable(page) {
  return page.evaluate(() => {
    const shown = (id) => {
      const r = document.getElementById(id).getBoundingClientRect();
      if (r.width === 0 || r.height === 0) return false;
      const top = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
      return top !== null && (top.id === id || document.getElementById(id).contains(top));
    };
    return { input: shown('input'), newChat: shown('new-chat'), messages: shown('messages') };
  });
}

test('a reply full of HTML tricks cannot restyle, cover or leave the page', async () => {
  const page = await openPage(browser, server.base);
  const offsite = [];
  page.on('request', (r) => { if (!r.url().startsWith(server.base)) offsite.push(r.url()); });
  await sendAndWait(page, 'show me tricks');
  const usable = { input: true, newChat: true, messages: true };
  assert.deepEqual(await pageIsUsable(page), usable, 'the page is still there');
  const body = page.locator('.turn.assistant .markdown').last();
  assert.match(await body.textContent(), /Tricks/);
  const found = await body.evaluate((el) => ({
    styled: el.querySelectorAll('style, [style], form, textarea, button').length,
    classes: [...el.querySelectorAll('[class]')].map((e) => e.className)
      .filter((c) => !c.split(' ').every((k) => /^(hljs|language-)|_$/.test(k))),
    links: [...el.querySelectorAll('a')].map((a) => ({
      text: a.textContent, href: a.getAttribute('href'), target: a.target, rel: a.rel })),
    images: [...el.querySelectorAll('img')].map((i) => i.getAttribute('src')),
    table: el.querySelectorAll('table td').length,
    code: el.querySelectorAll('pre code.hljs.language-python .hljs-keyword').length,
  }));
  assert.equal(found.styled, 0, 'no style, form or button from the reply');
  assert.deepEqual(found.classes, [], 'no page classes borrowed by the reply');
  assert.deepEqual(found.images, ['x'], 'only the same-origin image stays an image');
  for (const link of found.links) {
    assert.ok(!/^javascript:/i.test(link.href || ''), JSON.stringify(link));
    if (link.href) {
      assert.equal(link.target, '_blank', JSON.stringify(link));
      assert.equal(link.rel, 'noopener noreferrer', JSON.stringify(link));
    }
  }
  assert.ok(found.links.some((l) => l.href === 'https://example.com/track.png' &&
    /image: tracker|image: remote/.test(l.text)), 'the off-site image is a link');
  assert.ok(found.links.some((l) => l.href === 'https://example.com/raw'), 'raw anchor kept');
  assert.equal(found.table, 2, 'the table renders');
  assert.ok(found.code >= 1, 'the python block is highlighted');
  assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no script ran');
  assert.deepEqual(offsite, [], 'no request left the origin');
  // The reply is in the history: a reload must show the page again, not a blank one.
  await page.reload();
  await page.waitForSelector('.turn.assistant');
  assert.deepEqual(await pageIsUsable(page), usable, 'the page is still there after a reload');
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'web-tricks.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a corrupt stored chat starts the page anyway, and keeps what has a turn\'s shape', async () => {
  // (Unparsable JSON, or JSON that is not an object, always started a fresh chat.)
  const corrupt = [
    JSON.stringify({ turns: [null, 5, 'x', { role: 'user', content: 'kept question' }] }),
    JSON.stringify({ turns: [{ role: 'assistant', content: { a: 1 }, reasoning: 7, toolCalls: 'x' }],
      system: 5, thinking: 'yes' }),
  ];
  for (const value of corrupt) {
    const page = await openPage(browser, server.base, {
      init: (v) => {
        if (!sessionStorage.getItem('planted')) {
          sessionStorage.setItem('planted', '1');
          localStorage.setItem('coli.chat.v1', v);
        }
      },
      arg: value,
    });
    assert.equal(await page.textContent('#model-name'), 'scripted', value);
    await sendAndWait(page, 'hello after a corrupt history');
    assert.match(await page.locator('.turn.assistant').last().textContent(),
      /Hello from the script\./, value);
    const stored = await storedChat(page);
    assert.equal(stored.turns.at(-2).content, 'hello after a corrupt history', value);
    assert.equal(typeof stored.system, 'string', value);
    if (value.includes('kept question')) assert.equal(stored.turns[0].content, 'kept question');
    assert.deepEqual(page.errors, [], value);
    await page.context().close();
  }
});

test('storage full or disabled: the chat goes on and says it will not survive a reload', async () => {
  const blockers = {
    full: () => {
      Storage.prototype.setItem = () => { throw new DOMException('full', 'QuotaExceededError'); };
    },
    disabled: () => {
      Object.defineProperty(window, 'localStorage', {
        get() { throw new DOMException('denied', 'SecurityError'); },
      });
    },
  };
  for (const [name, init] of Object.entries(blockers)) {
    const page = await openPage(browser, server.base, { init });
    await sendAndWait(page, `hello with storage ${name}`);
    assert.match(await page.locator('.turn.user').last().textContent(), new RegExp(name));
    assert.match(await page.locator('.turn.assistant').last().textContent(),
      /Hello from the script\./, name);
    assert.match(await page.textContent('#error'), /does not keep this chat/, name);
    assert.deepEqual(page.errors, [], name);
    await page.context().close();
  }
});

test('the page passes axe-core\'s accessibility rules in light and dark mode', async () => {
  const chat = {
    turns: [
      { role: 'user', content: 'a question' },
      { role: 'assistant', reasoning: 'some thought', finish: 'stop',
        content: 'A table:\n\n| a | b |\n|---|--:|\n| x | 1 |\n\n```python\nif x:\n    return 1\n```\n\n' +
          '> a quote with a [link](https://example.com) and `code`' },
      { role: 'user', content: 'again' },
      { role: 'assistant', content: '', error: 'Cannot reach the server' },
    ],
    system: '', thinking: true,
  };
  for (const colorScheme of ['light', 'dark']) {
    const page = await openPage(browser, server.base, {
      colorScheme,
      init: (c) => {
        if (!sessionStorage.getItem('planted')) {
          sessionStorage.setItem('planted', '1');
          localStorage.setItem('coli.chat.v1', c);
        }
      },
      arg: JSON.stringify(chat),
    });
    await page.click('#settings-button');
    await page.evaluate(AXE);
    const violations = await page.evaluate(async () =>
      (await window.axe.run(document, { resultTypes: ['violations'] })).violations.map((v) =>
        `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`));
    assert.deepEqual(violations, [], colorScheme);
    await page.context().close();
  }
});
