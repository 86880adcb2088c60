// Continuous batching under load, through the official `openai` npm SDK against `coli serve` on
// the tiny Kimi K3 fixture: a request's answer must not depend on what else is running (the
// black-box pass of session 13, docs/status/host-batching.md "Continuous batching under load").
//
//  * A storm of mixed requests (chat / completions / Responses, streamed or not, greedy and
//    seeded sampling, logprobs, stop strings, logit_bias, penalties, json_schema, n > 1) run all
//    at once equals the same requests run one by one, with some clients leaving mid-stream.
//  * A stop string: the usage counts the tokens up to the one that completed it. It counted what
//    the host had generated when STOP reached it (62, 63 or 64 for the same request).
//  * SIGTERM while requests wait in the host (queued, in a long prefill): each gets a 503 at
//    once; they held the stop until their first token.
//  * SIGTERM while streams run: each stream ends with an error (chat / completions),
//    response.failed (Responses) or an `error` event (a background response's stream). They
//    used to end as if complete, with no finish_reason or terminal event.
//
// No timing asserts: waits are for events, bounded by the suite's timeout.
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { TINY, startServer, stopServer } from './serve_helpers.mjs';

let server, client, modelId;

before(async () => {
  server = await startServer(TINY);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
});

after(async () => {
  await stopServer(server);
});

// stopServer for a server the test may have stopped already (its exit event then came).
async function stopIfRunning(server) {
  if (server.proc.exitCode === null && server.proc.signalCode === null) await stopServer(server);
}

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  return (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1]);
}

// The answer of one request, without the fields that differ between runs (ids, created).
async function answer(c, spec) {
  const { api, stream, body } = spec;
  const strip = (r) => {
    const o = JSON.parse(JSON.stringify(r));
    for (const k of ['id', 'created', 'created_at', 'system_fingerprint']) delete o[k];
    if (api === 'responses') {
      for (const item of o.output ?? []) delete item.id;
      return { status: o.status, output: o.output, usage: o.usage, incomplete: o.incomplete_details };
    }
    return o;
  };
  if (api === 'responses') {
    if (!stream) return strip(await c.responses.create({ model: modelId, ...body }));
    let last = null;
    for await (const ev of await c.responses.create({ model: modelId, ...body, stream: true })) {
      if (['response.completed', 'response.incomplete', 'response.failed'].includes(ev.type)) {
        last = ev.response;
      }
    }
    return strip(last);
  }
  const create = api === 'chat' ? (b) => c.chat.completions.create(b) : (b) => c.completions.create(b);
  if (!stream) return strip(await create({ model: modelId, ...body }));
  // A stream, folded into text, logprobs, finish_reason per choice and the usage frame.
  const folded = { choices: {}, usage: null };
  const s = await create({ model: modelId, ...body, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of s) {
    if (chunk.usage) folded.usage = chunk.usage;
    for (const ch of chunk.choices ?? []) {
      const f = (folded.choices[ch.index] ??= { text: '', reasoning: '', logprobs: [], finish: null });
      f.text += ch.delta?.content ?? ch.text ?? '';
      f.reasoning += ch.delta?.reasoning_content ?? '';
      if (ch.logprobs) f.logprobs.push(ch.logprobs);
      if (ch.finish_reason) f.finish = ch.finish_reason;
    }
  }
  return folded;
}

function stormSpecs() {
  const specs = [];
  const system = Array.from({ length: 40 }, (_, i) => `rule${i}`).join(' ');
  const chat = [
    { max_tokens: 14, temperature: 0, logprobs: true, top_logprobs: 3 },
    { max_tokens: 16, temperature: 0.9, seed: 11, top_p: 0.9 },
    { max_tokens: 12, temperature: 0.5, seed: 5, frequency_penalty: 1.5, presence_penalty: 0.5,
      repetition_penalty: 1.3, min_p: 0.05, top_k: 20, system },
    { max_tokens: 10, temperature: 0, logit_bias: { 100: 50, 200: -100 } },
    { max_tokens: 24, temperature: 0.7, seed: 3, stop: ['e', 'a'], enable_thinking: false },
    { max_tokens: 24, temperature: 0, enable_thinking: false, response_format: {
      type: 'json_schema',
      json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } },
    } },
    { max_tokens: 8, temperature: 1, seed: 77, n: 2, logprobs: true, top_logprobs: 2 },
  ];
  chat.forEach(({ system: sys, ...knobs }, i) => {
    const messages = [
      ...(sys ? [{ role: 'system', content: sys }] : []),
      { role: 'user', content: `question ${i}` },
    ];
    specs.push({ api: 'chat', stream: i % 2 === 1, body: { messages, ...knobs } });
  });
  const completions = [
    { prompt: 'The number 7 is', max_tokens: 16, temperature: 0, logprobs: 3, frequency_penalty: 2 },
    { prompt: `${system} end`, max_tokens: 10, temperature: 1.2, seed: 9, logprobs: 1 },
    { prompt: 'count 23', max_tokens: 64, temperature: 0, stop: ['\n'], logprobs: 0 },
  ];
  completions.forEach((body, i) => specs.push({ api: 'completions', stream: i % 2 === 0, body }));
  for (let i = 0; i < 2; i++) {
    specs.push({
      api: 'responses', stream: i === 1,
      body: { input: `response ${i}`, max_output_tokens: 12, temperature: i === 1 ? 0.8 : 0,
        seed: i, store: false, include: ['message.output_text.logprobs'], top_logprobs: 2 },
    });
  }
  return specs;
}

// A streamed request its client leaves after a few chunks (the others must not notice). It
// leaves by `break` (the SDK then aborts the request and closes the connection): aborting the
// signal while the loop still awaits the next chunk once left the loop pending forever in CI
// (server idle, no connection open, every host request ended).
async function leaveMidStream(c, i) {
  const s = await c.chat.completions.create(
    { model: modelId, messages: [{ role: 'user', content: `leaving ${i}` }], max_tokens: 200, stream: true });
  let n = 0;
  for await (const _ of s) if (++n === 3 + i) break;
}

// Awaits `promises`, or fails naming the ones still pending after `ms` (a hang is then a clear
// failure that says which request, not the suite's timeout).
async function allOrName(promises, names, ms) {
  const pending = new Set(names);
  const tracked = promises.map((p, k) => p.finally(() => pending.delete(names[k])));
  let guard;
  const hung = new Promise((_, reject) => {
    guard = setTimeout(() => reject(new Error(`still pending after ${ms} ms: ${[...pending].join(', ')}`)), ms);
  });
  try {
    return await Promise.race([Promise.all(tracked), hung]);
  } finally {
    clearTimeout(guard);
  }
}

test('a storm of mixed concurrent requests equals each request run alone', async () => {
  const specs = stormSpecs();
  const alone = [];
  for (const spec of specs) alone.push(await answer(client, spec));
  const before = await metrics(server.base);
  const leaving = [0, 1, 2].map((i) => leaveMidStream(client, i));
  const together = await allOrName(specs.map((spec) => answer(client, spec)),
    specs.map((spec, i) => `request ${i} (${spec.api}${spec.stream ? ', streamed' : ''})`), 120000);
  await allOrName(leaving, ['leaving 0', 'leaving 1', 'leaving 2'], 120000);
  specs.forEach((spec, i) => assert.deepEqual(together[i], alone[i], `request ${i}: ${JSON.stringify(spec)}`));
  // Every request counted once, none left in flight (the clients that left included).
  let after;
  for (let k = 0; k < 200; k++) {
    after = await metrics(server.base);
    if (after('coli_requests_active') === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(after('coli_requests_active'), 0);
  assert.equal(after('coli_queue_depth'), 0);
  const delta = (name) => after(name) - before(name);
  // One host request per request (its n choices included: one prefill, n decode rows).
  const hostCalls = specs.length + 3;
  assert.equal(delta('coli_requests_total'), hostCalls);
  assert.equal(delta('coli_requests_ok_total') + delta('coli_requests_cancelled_total'), hostCalls);
  assert.equal(delta('coli_requests_failed_total'), 0);
});

test('after a stop string the usage counts the tokens up to it, whatever runs beside', async () => {
  // Completions: the logprobs list every generated token up to the one that completed the stop
  // string, so the usage must be their number.
  const body = { model: modelId, prompt: 'count 23', max_tokens: 64, temperature: 0, stop: ['\n'], logprobs: 0 };
  const runs = await Promise.all(Array.from({ length: 8 }, () => client.completions.create(body)));
  for (const r of runs) {
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(r.choices[0].logprobs.tokens.length < 64, 'the stop string was not reached');
    assert.equal(r.usage.completion_tokens, r.choices[0].logprobs.tokens.length);
  }
  // Chat (thinking off, so the stop string meets content): every run, streamed or not, alone or
  // among others, reports the same usage.
  const chat = { messages: [{ role: 'user', content: 'count 23' }], max_tokens: 64, temperature: 0,
    stop: ['e'], enable_thinking: false };
  const alone = await answer(client, { api: 'chat', stream: false, body: chat });
  assert.equal(alone.choices[0].finish_reason, 'stop');
  const together = await Promise.all(Array.from({ length: 8 }, (_, i) =>
    answer(client, { api: 'chat', stream: i % 2 === 1, body: chat })));
  for (const r of together) {
    assert.deepEqual(r.usage, alone.usage);
  }
});

test('SIGTERM while streams run: each stream ends with an error, never as if complete', async () => {
  // Paced decoding, so every stream is surely mid-generation when the signal arrives.
  const paced = await startServer(TINY, { COLI_DECODE_DELAY_MS: '20' });
  // Forced streams (logit_bias +100 on an ordinary token, greedy): none can end by itself. A
  // sampled end-of-text ended one before the signal now and then (a stream that ended normally),
  // or before its first delta, and then the test waited for it forever.
  const forced = { logit_bias: { 65: 100 }, temperature: 0 };
  try {
    const c = new OpenAI({ baseURL: `${paced.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    let begun = 0;
    let signalled;
    const allBegun = new Promise((resolve) => { signalled = resolve; });
    const onChunk = (state) => {
      if (!state.begun) {
        state.begun = true;
        if (++begun === 4) signalled();
      }
    };
    const outcome = async (iterate) => {
      const state = { begun: false, last: null };
      try {
        await iterate(state);
        return { ended: 'normally', last: state.last };
      } catch (e) {
        return { ended: 'error', message: String(e.message) };
      }
    };
    const chat = outcome(async (state) => {
      const s = await c.chat.completions.create({ model: modelId, stream: true, max_tokens: 5000,
        messages: [{ role: 'user', content: 'long' }], ...forced });
      for await (const chunk of s) { state.last = chunk.choices[0]?.finish_reason; onChunk(state); }
    });
    const completions = outcome(async (state) => {
      const s = await c.completions.create({ model: modelId, stream: true, max_tokens: 5000, prompt: 'long',
        ...forced });
      for await (const chunk of s) { state.last = chunk.choices[0]?.finish_reason; onChunk(state); }
    });
    const responses = outcome(async (state) => {
      const s = await c.responses.create({ model: modelId, stream: true, input: 'long', max_output_tokens: 5000,
        ...forced });
      for await (const ev of s) {
        state.last = ev.type === 'response.failed' ? `failed: ${ev.response.error?.message}` : ev.type;
        if (ev.type === 'response.output_text.delta' || ev.type === 'response.reasoning_text.delta') onChunk(state);
      }
    });
    // A background response's stream (its events come from the job's log).
    const background = outcome(async (state) => {
      const s = await c.responses.create({ model: modelId, stream: true, background: true,
        input: 'long', max_output_tokens: 5000, ...forced });
      for await (const ev of s) {
        state.last = ev.type === 'error' ? `error: ${ev.message}` : ev.type;
        if (ev.type === 'response.output_text.delta' || ev.type === 'response.reasoning_text.delta') onChunk(state);
      }
    });
    await allBegun;
    paced.proc.kill('SIGTERM');
    const [a, b, r, bg] = await Promise.all([chat, completions, responses, background]);
    assert.equal(a.ended, 'error', `chat stream: ${JSON.stringify(a)}`);
    assert.match(a.message, /shutting down/);
    assert.equal(b.ended, 'error', `completions stream: ${JSON.stringify(b)}`);
    assert.match(b.message, /shutting down/);
    assert.equal(r.ended, 'normally', `responses stream: ${JSON.stringify(r)}`);
    assert.match(r.last, /^failed: .*shutting down/);
    assert.equal(bg.ended, 'normally', `background stream: ${JSON.stringify(bg)}`);
    assert.match(bg.last ?? '', /^error: .*shutting down/, `background stream: ${JSON.stringify(bg)}`);
  } finally {
    await stopIfRunning(paced);
  }
});

test('SIGTERM while requests wait in the host\'s queue or read their prompt: each gets a 503 now', async () => {
  // Prefill paced at 60 s after each chunk of 8 tokens: without a cancel, every request would
  // hold the stop for a minute and more (4 workers: two rounds), so waiting for the answers is
  // the check (bounded by a hang guard, not timed).
  const slow = await startServer(TINY, { COLI_PREFILL_DELAY_MS: '60000', K3_CHUNK: '8' });
  try {
    const prompt = 'one two three four five six seven eight nine ten eleven twelve';
    const requests = Array.from({ length: 6 }, (_, i) => fetch(`${slow.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelId, prompt: `${i} ${prompt}`, max_tokens: 4, stream: i % 2 === 1 }),
    }).then(async (r) => ({ status: r.status, body: await r.text() }),
      (e) => ({ status: 'error', body: String(e) })));
    // Four prefilling, two queued.
    for (let k = 0; ; k++) {
      const value = await metrics(slow.base);
      if (value('coli_requests_active') === 4 && value('coli_queue_depth') === 2) break;
      assert.ok(k < 1500, 'the requests never all reached the host');
      await new Promise((r) => setTimeout(r, 20));
    }
    const exited = new Promise((resolve) => slow.proc.on('exit', resolve));
    slow.proc.kill('SIGTERM');
    let guard;
    const hung = new Promise((resolve) => { guard = setTimeout(() => resolve('hung'), 30000); });
    const answers = await Promise.race([Promise.all(requests), hung]);
    clearTimeout(guard);
    assert.notEqual(answers, 'hung', 'requests still unanswered 30 s after SIGTERM');
    for (const a of answers) {
      assert.equal(a.status, 503, JSON.stringify(a));
      assert.match(a.body, /shutting down/);
    }
    await exited;
  } finally {
    // A server still stopping (the old behaviour: a minute per round of prefills) is killed.
    if (slow.proc.exitCode === null && slow.proc.signalCode === null) slow.proc.kill('SIGKILL');
  }
});
