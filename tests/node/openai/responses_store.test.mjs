// `coli serve --responses-dir DIR` (tools/coli/serve_responses_disk.h): stored /v1/responses
// survive a restart of the server, seen through the official openai npm SDK.
//
// Each test starts `coli serve` on the tiny Kimi K3 fixture (random weights; greedy output is a
// function of the prompt tokens), stops it with SIGTERM and starts a new one on the same folder.
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

import { COLI, TINY, startServer, stopServer, poll } from './serve_helpers.mjs';

// A fresh parent folder; the responses folder inside it does not exist yet (the server makes it).
function freshDirs() {
  const parent = fs.mkdtempSync(path.join(os.tmpdir(), 'coli-responses-'));
  return { parent, dir: path.join(parent, 'responses') };
}

const clientOf = (server) => new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
const storedFiles = (dir) => fs.readdirSync(dir).filter((n) => /^resp_[0-9a-f]{24}\.json$/.test(n)).sort();

test('stored responses survive a restart: retrieve, previous_response_id, input_items, DELETE', async (t) => {
  const { parent, dir } = freshDirs();
  t.after(() => fs.rmSync(parent, { recursive: true, force: true }));
  const victim = path.join(parent, 'victim.json');
  fs.writeFileSync(victim, 'keep me');
  const ask = { input: 'Hello, who are you?', max_output_tokens: 8, temperature: 0 };
  const next = { input: 'And after that?', max_output_tokens: 8, temperature: 0 };

  // First server: a stored response, an unstored one, a background one, and the follow-up the
  // restarted server must reproduce.
  let server = await startServer(TINY, {}, ['--responses-dir', dir]);
  let client = clientOf(server);
  const model = (await client.models.list()).data[0].id;
  const first = await client.responses.create({ model, ...ask, store: true });
  const unstored = await client.responses.create({ model, ...ask, store: false });
  const background = await poll(client, (await client.responses.create({ model, ...ask, background: true })).id);
  assert.ok(['completed', 'incomplete'].includes(background.status), background.status);
  const reference = await client.responses.create({ model, ...next, previous_response_id: first.id });
  assert.deepEqual(storedFiles(dir), [first.id, background.id, reference.id].map((id) => `${id}.json`).sort());
  await stopServer(server);

  // Second server, through the environment variable: the same objects come back.
  server = await startServer(TINY, { COLI_RESPONSES_DIR: dir });
  try {
    client = clientOf(server);
    assert.deepEqual(await client.responses.retrieve(first.id), first);
    assert.deepEqual(await client.responses.retrieve(background.id), background);
    await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);
    // The conversation came back too: a follow-up renders the same prompt and says the same.
    const follow = await client.responses.create({ model, ...next, previous_response_id: first.id });
    assert.equal(follow.previous_response_id, first.id);
    assert.equal(follow.usage.input_tokens, reference.usage.input_tokens);
    assert.equal(follow.output_text, reference.output_text);
    const items = [];
    for await (const item of client.responses.inputItems.list(follow.id, { order: 'asc' })) items.push(item);
    // The first turn (its input and its output items, ids kept), then the new input.
    assert.equal(items[0].role, 'user');
    assert.equal(items[0].content[0].text, ask.input);
    assert.deepEqual(items.slice(1, 1 + first.output.length).map((i) => i.id), first.output.map((o) => o.id));
    assert.equal(items.at(-1).content[0].text, next.input);
    // A client's id never reaches the folder (path traversal): 404, nothing touched.
    for (const method of ['GET', 'DELETE']) {
      for (const id of ['..%2Fvictim', '..%2F..%2Fetc%2Fpasswd', `..%2Fresponses%2F${first.id}`]) {
        const r = await fetch(`${server.base}/v1/responses/${id}`, { method });
        assert.equal(r.status, 404, `${method} ${id}`);
      }
    }
    assert.equal(fs.readFileSync(victim, 'utf8'), 'keep me');
    assert.ok(fs.existsSync(path.join(dir, `${first.id}.json`)));
    // DELETE removes the file.
    const deleted = await client.responses.delete(first.id);
    assert.equal(deleted.deleted, true);
    assert.ok(!fs.existsSync(path.join(dir, `${first.id}.json`)));
    assert.doesNotMatch(server.stderr(), /skipped/);
  } finally {
    await stopServer(server);
  }

  // Third server: the flag wins over an environment variable naming a folder it cannot use.
  server = await startServer(TINY, { COLI_RESPONSES_DIR: path.join(victim, 'sub') }, ['--responses-dir', dir]);
  try {
    client = clientOf(server);
    await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404);
    await assert.rejects(
      client.responses.create({ model, ...next, previous_response_id: first.id }),
      (e) => e.status === 400 && e.code === 'previous_response_not_found');
    assert.equal((await client.responses.retrieve(background.id)).output_text, background.output_text);
    assert.equal((await client.responses.retrieve(reference.id)).output_text, reference.output_text);
  } finally {
    await stopServer(server);
  }
});

test('a damaged file and a crash leftover are skipped at start; the good ones load; a running background response is kept cancelled', async (t) => {
  const { parent, dir } = freshDirs();
  t.after(() => fs.rmSync(parent, { recursive: true, force: true }));
  // 5 ms a token: the long background response is still running when the server stops.
  let server = await startServer(TINY, { COLI_DECODE_DELAY_MS: '5' }, ['--responses-dir', dir]);
  let client = clientOf(server);
  const model = (await client.models.list()).data[0].id;
  const good = await client.responses.create({ model, input: 'hi', max_output_tokens: 4, temperature: 0 });
  const events = await client.responses.create({
    model, input: 'Tell me a long story.', max_output_tokens: 4000, background: true, stream: true,
  });
  let running;
  for await (const e of events) {
    if (e.type === 'response.in_progress') { running = e.response.id; break; }  // leaves the stream
  }
  assert.ok(running);
  assert.ok(!fs.existsSync(path.join(dir, `${running}.json`)), 'written while running');
  await stopServer(server);  // cancels it; its final object is stored

  const text = fs.readFileSync(path.join(dir, `${good.id}.json`), 'utf8');
  const cutId = 'resp_00000000000000000000beef';
  const cut = path.join(dir, `${cutId}.json`);
  fs.writeFileSync(cut, text.replaceAll(good.id, cutId).slice(0, 40));  // a write cut short
  const leftover = path.join(dir, `.${cutId}.json.tmp.Ab12Cd`);
  fs.writeFileSync(leftover, '{"format"');
  server = await startServer(TINY, {}, ['--responses-dir', dir]);
  try {
    client = clientOf(server);
    assert.deepEqual(await client.responses.retrieve(good.id), good);
    await assert.rejects(client.responses.retrieve(cutId), (e) => e.status === 404);
    const cancelled = await client.responses.retrieve(running);
    assert.equal(cancelled.status, 'cancelled');
    assert.equal(cancelled.background, true);
    // Its event log was not kept: a resumed stream is refused, naming `stream`.
    const resumed = await fetch(`${server.base}/v1/responses/${running}?stream=true`);
    assert.equal(resumed.status, 400);
    assert.equal((await resumed.json()).error.param, 'stream');
    const lines = server.stderr().split('\n').filter((l) => l.includes(cut));
    assert.equal(lines.length, 1, server.stderr());
    assert.match(lines[0], /not valid JSON/);
    assert.ok(fs.existsSync(cut), 'a damaged file is left for the operator');
    assert.ok(!fs.existsSync(leftover), 'a temp file of a crashed write is removed');
  } finally {
    await stopServer(server);
  }
});

test('a --responses-dir that cannot be made is a startup error naming it', () => {
  const { parent } = freshDirs();
  try {
    const file = path.join(parent, 'a_file');
    fs.writeFileSync(file, 'x');
    const bad = path.join(file, 'responses');
    const r = spawnSync(COLI, ['serve', '--model', TINY, '--port', '0', '--responses-dir', bad],
      { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /--responses-dir/);
    assert.ok(r.stderr.includes(`'${bad}'`), r.stderr);
    const help = spawnSync(COLI, ['serve', '--help'], { encoding: 'utf8', timeout: 60000 });
    assert.equal(help.status, 0, help.stderr);  // --help: the usage on stdout, exit 0
    assert.match(help.stdout, /--responses-dir DIR/);
    assert.match(help.stdout, /COLI_RESPONSES_DIR/);
  } finally {
    fs.rmSync(parent, { recursive: true, force: true });
  }
});
