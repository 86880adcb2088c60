// The official `openai` npm SDK against `coli serve`.
//
// Two servers on free loopback ports:
//  * the tiny Kimi K3 fixture (random weights, real kimi_k3 plugin): everything but tool calls;
//  * the k3_scripted test family (tools/k3_scripted): K3's real tokenizer, XTML renderer and output
//    parser around a model whose reply is scripted, because random weights never emit a tool call.
//    It proves the round trip declare -> XTML call parsed into an OpenAI tool call -> tool result
//    rendered back into the next prompt.
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL, COLI_SCRIPTED_MODEL,
// COLI_SCRIPTED_PLUGIN_DIR.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';

import {
  COLI, TINY, SCRIPTED, SCRIPTED_PLUGINS, startServer, stopServer, post,
} from './serve_helpers.mjs';

let tiny, tiny8, scripted, client, client8, toolClient, modelId;

before(async () => {
  // tiny8: the tiny model prefilled in chunks of 8 tokens, so a few hundred prompt tokens give
  // many prefill-progress reports; decoding paced at 5 ms a token, so a client that hangs up
  // after a few chunks certainly does so mid-generation.
  [tiny, tiny8, scripted] = await Promise.all([
    startServer(TINY),
    startServer(TINY, { K3_CHUNK: '8', COLI_DECODE_DELAY_MS: '5' }),
    startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS }),
  ]);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  client8 = new OpenAI({ baseURL: `${tiny8.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  toolClient = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const models = await client.models.list();
  modelId = models.data[0].id;
});

after(async () => {
  await Promise.all([stopServer(tiny), stopServer(tiny8), stopServer(scripted)]);
});

const hello = [{ role: 'user', content: 'Hello, who are you?' }];

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, value };
}

test('models and health', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, 'model');
  const health = await (await fetch(`${tiny.base}/health`)).json();
  assert.equal(health.status, 'ok');
});

test('non-streaming chat: reasoning_content, usage, finish_reason', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 12, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  const m = r.choices[0].message;
  assert.equal(m.role, 'assistant');
  // Thinking is on by default: the think channel's text comes back as reasoning_content.
  assert.equal(typeof m.reasoning_content, 'string');
  assert.ok(m.reasoning_content.length > 0, 'reasoning_content is empty');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  // The prompt is exactly the rendered template.
  const tok = await post(tiny.base, '/tokenize', { model: modelId, messages: hello });
  assert.equal(tok.status, 200);
  assert.equal(tok.json.count, r.usage.prompt_tokens);
});

test('streaming chat equals the non-streaming answer; include_usage', async () => {
  const request = { model: modelId, messages: hello, max_tokens: 12, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  });
  let reasoning = '';
  let content = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      reasoning += c.delta.reasoning_content ?? '';
      content += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks > 2);
  assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
  assert.equal(content, whole.choices[0].message.content ?? '');
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
});

test('stop sequences are removed from the output', async () => {
  const base = {
    model: modelId, messages: hello, max_tokens: 24, temperature: 0, enable_thinking: false,
  };
  const free = await client.chat.completions.create(base);
  const text = free.choices[0].message.content;
  assert.ok(text.length >= 8, `content too short to cut: ${JSON.stringify(text)}`);
  const stop = text.slice(4, 7);
  const expected = text.slice(0, text.indexOf(stop));
  const cut = await client.chat.completions.create({ ...base, stop: [stop, 'never-there'] });
  assert.equal(cut.choices[0].message.content, expected);
  assert.equal(cut.choices[0].finish_reason, 'stop');
  // Streaming gives the same cut.
  const stream = await client.chat.completions.create({ ...base, stop, stream: true });
  let streamed = '';
  for await (const chunk of stream) {
    for (const c of chunk.choices) streamed += c.delta.content ?? '';
  }
  assert.equal(streamed, expected);
});

test('n=2 gives two choices', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 6, n: 2, temperature: 0, enable_thinking: false,
  });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  // Greedy: both choices are the same text.
  assert.equal(r.choices[0].message.content, r.choices[1].message.content);
  const sampled = await client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 6, n: 2, temperature: 1, seed: 7,
  });
  assert.equal(sampled.choices.length, 2);
});

// n choices are one prefill and n decode rows (the host copies the prompt's state into a session
// per choice); choice i samples as a lone request with seed + i, streamed or not, and a stream's
// chunks name their choice's index.
test('n=3 streamed and not: one prefill, rows of shared decode calls, choice i = seed + i', async () => {
  const base = {
    model: modelId, messages: hello, max_tokens: 12, temperature: 1, seed: 40,
    enable_thinking: false,
  };
  const lone = [];
  for (let i = 0; i < 3; i++) {
    const r = await client.chat.completions.create({ ...base, seed: 40 + i });
    lone.push(r.choices[0]);
  }
  const before = await metrics(tiny.base);
  const r = await client.chat.completions.create({ ...base, n: 3 });
  const after = await metrics(tiny.base);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (let i = 0; i < 3; i++) {
    assert.equal(r.choices[i].message.content, lone[i].message.content, `choice ${i}`);
    assert.equal(r.choices[i].finish_reason, lone[i].finish_reason, `choice ${i}`);
  }
  const delta = (name) => after.value(name) - before.value(name);
  // The prompt computed once, not once per choice; the two other choices copied its state.
  const computed = delta('coli_plugin_stat\\{name="tokens_computed"\\}');
  const copies = delta('coli_plugin_stat\\{name="session_copies"\\}');
  assert.ok(computed <= r.usage.prompt_tokens, `computed ${computed} > one prompt`);
  assert.equal(copies, 2);
  // Every decode call carried the rows of all choices still running.
  const calls = delta('coli_decode_calls_total');
  const rows = delta('coli_decode_rows_total');
  assert.equal(rows, r.usage.completion_tokens);
  assert.ok(calls <= base.max_tokens, `${calls} calls`);  // one a step, not one a row
  assert.ok(rows >= 2 * calls, `${rows} rows in ${calls} calls`);

  const stream = await client.chat.completions.create({
    ...base, n: 3, stream: true, stream_options: { include_usage: true },
  });
  const texts = ['', '', ''];
  const finish = [null, null, null];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      assert.ok(c.index >= 0 && c.index < 3, `index ${c.index}`);
      assert.equal(finish[c.index], null, `choice ${c.index} has a chunk after its finish`);
      texts[c.index] += c.delta.content ?? '';
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(texts, r.choices.map((c) => c.message.content));
  assert.deepEqual(finish, r.choices.map((c) => c.finish_reason));
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
});

test('logprobs and top_logprobs', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 10, temperature: 0, enable_thinking: false,
    logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.ok(Array.isArray(lp) && lp.length > 0, 'no content logprobs');
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(e.top_logprobs.length >= 1 && e.top_logprobs.length <= 3);
    // Greedy: the sampled token is the most likely one.
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4);
  }
  // Each entry has its token's own bytes (a part of a character too: token "bytes:\\xe4\\xbd"),
  // so the bytes, decoded as a whole, are the content.
  const bytes = Uint8Array.from(lp.flatMap((e) => e.bytes));
  assert.equal(new TextDecoder().decode(bytes), r.choices[0].message.content);
});

test('legacy completions, tokenize/detokenize, apply-template', async () => {
  const c = await client.completions.create({
    model: modelId, prompt: 'The capital of France is', max_tokens: 5, temperature: 0,
  });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.usage.completion_tokens, 5);
  assert.equal(c.choices[0].finish_reason, 'length');
  const t = await post(tiny.base, '/tokenize', { prompt: 'hello <|open|> 你好' });
  assert.equal(t.status, 200);
  const d = await post(tiny.base, '/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.prompt, 'hello <|open|> 你好');
  const a = await post(tiny.base, '/apply-template', { messages: hello, enable_thinking: false });
  assert.equal(a.status, 200);
  assert.equal(a.json.prompt,
    '<|open|>message role="user"<|sep|>Hello, who are you?<|close|>message<|sep|><|end_of_msg|>' +
    '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>');
  assert.ok(a.json.tokens.length > 0);
});

test('context overflow is context_length_exceeded', async () => {
  const huge = 'lorem ipsum dolor sit amet '.repeat(20000);
  const r = await post(tiny.base, '/v1/chat/completions', {
    model: modelId, messages: [{ role: 'user', content: huge }], max_tokens: 4,
  });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.code, 'context_length_exceeded');
});

test('at least 30 malformed requests are refused with 4xx, and the server still answers', async () => {
  const m = modelId;
  const user = [{ role: 'user', content: 'hi' }];
  const bad = [
    '{', '[]', '"text"', 'null', '{"messages": 5}',
    { model: m }, { model: m, messages: [] }, { model: m, messages: 'hi' },
    { model: m, messages: [5] }, { model: m, messages: [{ role: 'robot', content: 'hi' }] },
    { model: m, messages: [{ content: 'hi' }] },
    { model: m, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] },
    { model: m, messages: [{ role: 'user', content: 7 }] },
    { model: 'no-such-model', messages: user },
    { model: m, messages: user, max_tokens: 0 }, { model: m, messages: user, max_tokens: 'ten' },
    { model: m, messages: user, temperature: 3 }, { model: m, messages: user, temperature: -1 },
    { model: m, messages: user, top_p: 1.5 }, { model: m, messages: user, n: 0 },
    { model: m, messages: user, n: 100 }, { model: m, messages: user, stop: ['a', 'b', 'c', 'd', 'e'] },
    { model: m, messages: user, stop: [1] }, { model: m, messages: user, stop: '' },
    { model: m, messages: user, frequency_penalty: 2.5 }, { model: m, messages: user, presence_penalty: -3 },
    { model: m, messages: user, logit_bias: { x: 5 } }, { model: m, messages: user, top_logprobs: 3 },
    { model: m, messages: user, logprobs: true, top_logprobs: 50 },
    { model: m, messages: user, stream: 'yes' }, { model: m, messages: user, stream_options: { include_usage: true } },
    { model: m, messages: user, reasoning_effort: 'medium' }, { model: m, messages: user, reasoning_effort: 'ultra' },
    { model: m, messages: user, chat_template_kwargs: { foo: 1 } },
    { model: m, messages: user, chat_template_kwargs: { thinking_effort: 'medium' } },
    { model: m, messages: user, tools: [{ type: 'function' }] }, { model: m, messages: user, tools: {} },
    { model: m, messages: user, tool_choice: 'sometimes' },
    { model: m, messages: user, response_format: { type: 'xml' } },
    { model: m, messages: [{ role: 'assistant', content: '', tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: '[1, 2]' } }] }] },
    { model: m, messages: [{ role: 'assistant', content: '', reasoning_content: 5 }] },
    { model: m, messages: [{ role: 'tool', content: 'orphan result' }] },
    { model: m, messages: user, modalities: ['audio'] }, { model: m, messages: user, seed: 'x' },
  ];
  assert.ok(bad.length >= 30);
  for (const body of bad) {
    const r = await post(tiny.base, '/v1/chat/completions', body);
    const label = typeof body === 'string' ? body : JSON.stringify(body);
    assert.ok(r.status >= 400 && r.status < 500, `${label} -> ${r.status} ${r.text}`);
    assert.equal(typeof r.json?.error?.message, 'string', `${label}: ${r.text}`);
    assert.ok('param' in r.json.error && 'code' in r.json.error && 'type' in r.json.error);
  }
  // A whole number written as a float is an integer (pydantic's lax mode, so vLLM, takes it);
  // 2^64 parses as a float and is out of range — it was "seed must be an integer".
  const whole = await post(tiny.base, '/v1/chat/completions',
    `{"model": "${m}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3e0, "seed": 7.0}`);
  assert.equal(whole.status, 200, whole.text);
  assert.ok(whole.json.usage.completion_tokens <= 3, whole.text);
  for (const [field, value] of [['seed', '18446744073709551616'], ['max_tokens', '1e30']]) {
    const r = await post(tiny.base, '/v1/chat/completions',
      `{"model": "${m}", "messages": [{"role": "user", "content": "hi"}], "${field}": ${value}}`);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, field);
    assert.match(r.json.error.message, /is outside the 64-bit integer range/, r.text);
  }
  const half = await post(tiny.base, '/v1/chat/completions', { model: m, messages: user, seed: 1.5 });
  assert.match(half.json.error.message, /seed must be an integer/, half.text);
  // Named fields.
  const named = await post(tiny.base, '/v1/chat/completions',
    { model: m, messages: [{ role: 'user', content: 'a' }, { role: 'robot', content: 'b' }] });
  assert.equal(named.json.error.param, 'messages[1].role');
  const n = await post(tiny.base, '/v1/chat/completions', { model: m, messages: user, n: 0 });
  assert.equal(n.json.error.param, 'n');
  // The SDK surfaces these as APIError with the status.
  await assert.rejects(
    client.chat.completions.create({ model: m, messages: user, frequency_penalty: 3 }),
    (e) => e.status === 400 && e.param === 'frequency_penalty');
  // Unknown endpoint and method.
  assert.equal((await post(tiny.base, '/v1/nothing', {})).status, 404);
  // Still serving.
  const ok = await client.chat.completions.create({ model: m, messages: user, max_tokens: 3 });
  assert.equal(ok.choices.length, 1);
});

// Opens a stream with `open(signal)`, hangs up after 3 chunks, and checks through /metrics that
// the server noticed, cancelled the request at the host and generates nothing more.
async function hangUpAfterThreeChunks(base, open) {
  const before = await metrics(base);
  const cancelledBefore = before.value('coli_requests_cancelled_total');
  const disconnectsBefore = before.value('coli_http_client_disconnects_total');
  const controller = new AbortController();
  const stream = await open(controller.signal);
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      chunks += chunk.choices.length;
      if (chunks >= 3) controller.abort();  // the SDK ends the iteration (or throws AbortError)
    }
  } catch (e) {
    assert.equal(e.name, 'AbortError');
  }
  assert.ok(chunks >= 3);
  // The host sees the cancel within one token: poll the metrics for a while.
  let after;
  for (let i = 0; i < 100; i++) {
    after = await metrics(base);
    if (after.value('coli_requests_active') === 0 &&
        after.value('coli_http_client_disconnects_total') > disconnectsBefore) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(after.value('coli_requests_active'), 0, after.text);
  assert.equal(after.value('coli_http_streams_active'), 0, after.text);
  assert.ok(after.value('coli_http_client_disconnects_total') > disconnectsBefore, after.text);
  assert.ok(after.value('coli_requests_cancelled_total') > cancelledBefore, after.text);
  // Generation really ended: the token counter stands still.
  const tokens = after.value('coli_completion_tokens_total');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await metrics(base)).value('coli_completion_tokens_total'), tokens);
}

test('a client that disconnects mid-stream frees its session', async () => {
  // Greedy decoding on the tiny model runs to the end of its 8192-token context (minutes): the
  // generation is certainly still running when the client goes away.
  await hangUpAfterThreeChunks(tiny.base, (signal) => client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 100000, temperature: 0, stream: true,
  }, { signal }));
  // And the next request is served.
  const ok = await client.chat.completions.create({ model: modelId, messages: hello, max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

// Reads a raw SSE body into its `data:` payloads (JSON, or the string '[DONE]').
async function sse(base, path, body) {
  const r = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  const frames = text.split('\n\n').filter((f) => f.length > 0).map((f) => {
    assert.ok(f.startsWith('data: '), `not an SSE data frame: ${f}`);
    const data = f.slice(6);
    return data === '[DONE]' ? data : JSON.parse(data);
  });
  return { status: r.status, text, frames };
}

// Checks a run of prompt_progress objects: at least two, `processed` strictly growing, ending at
// processed == total == the prompt's token count.
function checkProgress(progress, promptTokens) {
  assert.ok(progress.length >= 2, `only ${progress.length} progress reports`);
  for (let i = 0; i < progress.length; i++) {
    const p = progress[i];
    assert.deepEqual(Object.keys(p).sort(), ['cache', 'processed', 'time_ms', 'total']);
    assert.equal(p.total, promptTokens);
    assert.equal(p.cache, 0);
    if (i > 0) {
      assert.ok(p.processed > progress[i - 1].processed, JSON.stringify(progress));
      assert.ok(p.time_ms >= progress[i - 1].time_ms);
    }
  }
  assert.equal(progress.at(-1).processed, promptTokens);
}

const longChat = [{
  role: 'user',
  content: 'The quick brown fox jumps over the lazy dog. '.repeat(12),
}];

test('return_progress: llama.cpp prompt_progress chunks through the openai SDK; none without it', async () => {
  const count = (await post(tiny8.base, '/tokenize', { messages: longChat })).json.count;
  assert.ok(count >= 200, `prompt of ${count} tokens`);
  const stream = await client8.chat.completions.create({
    model: modelId, messages: longChat, max_tokens: 3, temperature: 0, stream: true,
    stream_options: { include_usage: true }, return_progress: true,
  });
  const progress = [];
  let sawText = false, usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.prompt_progress) {
      assert.ok(!sawText, 'progress after the first token');
      // llama.cpp's shape: one choice with an empty assistant delta.
      assert.equal(chunk.choices.length, 1);
      assert.equal(chunk.choices[0].delta.role, 'assistant');
      assert.equal(chunk.choices[0].delta.content, null);
      assert.equal(chunk.choices[0].finish_reason, null);
      progress.push(chunk.prompt_progress);
    } else if (chunk.choices[0]?.delta?.content || chunk.choices[0]?.delta?.reasoning_content) {
      sawText = true;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  checkProgress(progress, count);
  assert.equal(usage.prompt_tokens, count);

  // Without the flag the stream carries no trace of it (plain OpenAI).
  const plain = await sse(tiny8.base, '/v1/chat/completions', {
    model: modelId, messages: longChat, max_tokens: 3, temperature: 0, stream: true,
  });
  assert.equal(plain.status, 200);
  assert.ok(!plain.text.includes('prompt_progress'));
  assert.equal(plain.frames.at(-1), '[DONE]');
  // A non-boolean flag is refused, naming it.
  const bad = await post(tiny8.base, '/v1/chat/completions',
    { model: modelId, messages: longChat, stream: true, return_progress: 'yes' });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'return_progress');

  // Legacy completions: the same reports on text_completion chunks with empty text.
  const prompt = longChat[0].content;
  const ids = (await post(tiny8.base, '/tokenize', { prompt })).json.count;
  const raw = await sse(tiny8.base, '/v1/completions', {
    model: modelId, prompt, max_tokens: 2, stream: true, return_progress: true,
  });
  const reports = raw.frames.filter((f) => f.prompt_progress);
  for (const f of reports) {
    assert.equal(f.object, 'text_completion');
    assert.equal(f.choices[0].text, '');
  }
  checkProgress(reports.map((f) => f.prompt_progress), ids);
});

test('legacy completions stream (openai SDK): text_completion chunks, include_usage, [DONE]', async () => {
  const body = { model: modelId, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 };
  const whole = await client.completions.create(body);
  const stream = await client.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null, pieces = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    assert.equal(chunk.model, modelId);
    if (chunk.choices.length === 0) {
      usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.usage, null);
    const c = chunk.choices[0];
    assert.equal(c.index, 0);
    text += c.text;
    if (c.text) pieces++;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(text, whole.choices[0].text);
  assert.ok(pieces >= 2, `text arrived in ${pieces} pieces`);
  assert.equal(finish, 'length');
  assert.deepEqual(usage, whole.usage);
  const raw = await sse(tiny.base, '/v1/completions', { ...body, stream: true, logprobs: 2 });
  assert.equal(raw.frames.at(-1), '[DONE]');
  const withText = raw.frames.filter((f) => f !== '[DONE]' && f.choices[0].logprobs);
  assert.equal(withText.length, 8);  // one chunk per token with its logprobs
  for (const f of withText) assert.equal(f.choices[0].logprobs.tokens.length, 1);
  // A refused request is a plain 400 before any stream starts.
  const empty = await post(tiny.base, '/v1/completions', { model: modelId, prompt: '', stream: true });
  assert.equal(empty.status, 400);
});

test('a completions stream whose client disconnects stops generating', async () => {
  // Seed 1 samples hundreds of tokens before any stop token; tiny8 paces them 5 ms apart.
  await hangUpAfterThreeChunks(tiny8.base, (signal) => client8.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 100000, temperature: 1, seed: 1,
    stream: true,
  }, { signal }));
});

test('an n=3 stream whose client disconnects stops every choice', async () => {
  // One host request carries the three choices: the disconnect cancels it, all rows stop.
  await hangUpAfterThreeChunks(tiny8.base, (signal) => client8.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 100000, temperature: 1, seed: 1,
    n: 3, stream: true,
  }, { signal }));
  await hangUpAfterThreeChunks(tiny8.base, (signal) => client8.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 100000, temperature: 1, seed: 1, n: 3,
    stream: true,
  }, { signal }));
});

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' } },
      required: ['city'],
    },
  },
}];

// Concurrent unnamed requests take free session slots of the host's pool, and their decode steps
// go to the model as shared passes (continuous batching): the answers are the ones each request
// gets alone, and the family's batched_steps statistic (on /metrics) grows.
test('concurrent requests share decode passes and answer as they would alone', async () => {
  const prompts = ['Tell me about foxes.', 'What is two plus two?', 'Name a colour.',
    'Write a short poem.'];
  const ask = (content) => client8.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content }], max_tokens: 24, temperature: 0,
  });
  const answer = (r) => JSON.stringify([r.choices[0].message.reasoning_content ?? null,
    r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens]);
  const stat = async (name) => {
    const text = await (await fetch(`${tiny8.base}/metrics`)).text();
    const m = text.match(new RegExp(`^coli_plugin_stat\\{name="${name}"\\} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : 0;
  };
  const alone = [];
  for (const p of prompts) alone.push(answer(await ask(p)));
  // Whether two requests' decode steps meet in one pass depends on the box's load (a loaded
  // 2-core CI box can run them one after another): up to three rounds, each answering as alone.
  const stepsBefore = await stat('batched_steps');
  let steps = stepsBefore;
  for (let round = 0; round < 3 && steps === stepsBefore; ++round) {
    const together = await Promise.all(prompts.map(ask));
    assert.deepEqual(together.map(answer), alone);
    steps = await stat('batched_steps');
  }
  assert.ok(steps > stepsBefore, `no decode pass was shared in 3 rounds (batched_steps ${stepsBefore} -> ${steps})`);
  assert.ok(await stat('batched_rows') >= 2 * steps, 'a shared pass has at least two rows');
  // The host's own count of decode calls and rows: more rows than calls when passes are shared.
  const { value } = await metrics(tiny8.base);
  assert.ok(value('coli_decode_rows_total') > value('coli_decode_calls_total'),
    `rows ${value('coli_decode_rows_total')} vs calls ${value('coli_decode_calls_total')}`);
  // The model's current values, labelled by model (ABI 1.2 model_stats), reported once.
  const text = (await metrics(tiny8.base)).text;
  const resident = [...text.matchAll(/^coli_model_stat\{model="([^"]+)",name="weights_resident_bytes"\} (\S+)$/gm)];
  assert.equal(resident.length, 1, text);
  assert.ok(Number(resident[0][2]) > 0);
});

// COLI_K3_SPEC: prompt-lookup speculative decoding must not change a single token or logprob.
// K3_LAYERS=0 (embedding -> head only) makes the tiny model a bigram model whose greedy walk
// soon cycles, so lookup drafts are right and really save forward passes.
// Sampled requests are speculated too: a COPY of the row's seeded sampler verifies each draft
// (accepting while it draws the draft token), so the real sampler later draws the same tokens
// and the seeded stream is exactly the plain server's. On the bigram model the logits depend on
// the last token only and the draws on the seed only, so a prompt that ends like `base` and
// already holds the seeded continuation of `base` makes that continuation come again: lookup
// drafts it and the copy accepts it.
test('speculative decoding (COLI_K3_SPEC) through the openai SDK: same text and logprobs, fewer passes; sampled requests too', async () => {
  const [plain, spec] = await Promise.all([
    startServer(TINY, { K3_LAYERS: '0' }),
    startServer(TINY, { K3_LAYERS: '0', COLI_K3_SPEC: '8' }),
  ]);
  try {
    const ask = async (server, request) => {
      const c = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
      const id = (await c.models.list()).data[0].id;
      return c.completions.create({ model: id, max_tokens: 96, logprobs: 2, ...request });
    };
    const stat = async (server, name) => {
      const text = (await metrics(server.base)).text;
      const m = text.match(new RegExp(`^coli_plugin_stat\\{name="${name}"\\} (\\S+)$`, 'm'));
      return m ? Number(m[1]) : NaN;
    };
    const same = (b, a) => {
      assert.ok(a.choices[0].text.length > 0);
      assert.equal(b.choices[0].text, a.choices[0].text);
      assert.deepEqual(b.choices[0].logprobs, a.choices[0].logprobs);
      assert.equal(b.choices[0].finish_reason, a.choices[0].finish_reason);
      assert.equal(b.usage.completion_tokens, a.usage.completion_tokens);
    };
    const greedy = { prompt: 'one two three one two three', temperature: 0 };
    same(await ask(spec, greedy), await ask(plain, greedy));
    assert.equal(await stat(plain, 'spec_drafts'), 0);
    const accepted = await stat(spec, 'spec_accepted_tokens');
    assert.ok(accepted > 0, 'no draft token was accepted');
    const [passesPlain, passesSpec] = [await stat(plain, 'decode_passes'), await stat(spec, 'decode_passes')];
    assert.ok(passesSpec < passesPlain, `passes with spec ${passesSpec} vs ${passesPlain}`);

    const hot = { temperature: 0.8, top_p: 0.95, seed: 4242 };
    const base = 'one two three';
    const first = await ask(plain, { ...hot, prompt: base });
    const sampled = { ...hot, prompt: `${base}${first.choices[0].text} ${base}` };
    const b = await ask(spec, sampled);
    same(b, await ask(plain, sampled));
    // The same seed on another prompt draws another stream (the seed is honoured).
    assert.notEqual((await ask(plain, { ...hot, prompt: `${base} four` })).choices[0].text,
      b.choices[0].text);
    assert.equal(await stat(plain, 'spec_drafts'), 0);
    assert.ok(await stat(spec, 'spec_accepted_tokens') > accepted,
      'no draft token of the sampled request was accepted');

    // Penalised requests are speculated too: the verify advances a copy of the token history.
    const drafts = await stat(spec, 'spec_drafts');
    for (const knobs of [{ temperature: 0, presence_penalty: 0.2 },
      { ...hot, repetition_penalty: 1.05, frequency_penalty: 0.1, logit_bias: { 7: -5 } }]) {
      const r = { ...knobs, prompt: sampled.prompt };
      same(await ask(spec, r), await ask(plain, r));
    }
    assert.ok(await stat(spec, 'spec_drafts') > drafts, 'the penalised requests did not draft');
  } finally {
    await Promise.all([stopServer(plain), stopServer(spec)]);
  }
});

test('tool call round trip (scripted K3 model): declare, parse, render the result', async () => {
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  // The declaration reaches the prompt (key-sorted compact JSON in a tool-declare message).
  const rendered = await post(scripted.base, '/apply-template', { messages: ask, tools });
  assert.ok(rendered.json.prompt.includes('type="tool-declare"'));
  assert.ok(rendered.json.prompt.includes('"name":"get_weather"'));

  const first = await toolClient.chat.completions.create({
    model: 'k3_scripted', messages: ask, tools, tool_choice: 'auto',
  });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.reasoning_content, 'I should call the weather tool.');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 3 });

  const followUp = [
    ...ask,
    { role: 'assistant', content: null, reasoning_content: choice.message.reasoning_content,
      tool_calls: choice.message.tool_calls },
    { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' },
  ];
  const prompt = await post(scripted.base, '/apply-template', { messages: followUp, tools });
  assert.ok(prompt.json.prompt.includes(
    '<|open|>call tool="get_weather" index="1"<|sep|>' +
    '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>' +
    '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>'),
  prompt.json.prompt);
  assert.ok(prompt.json.prompt.includes(
    '<|open|>message role="tool" tool="get_weather" index="1"<|sep|>{"temp_c": 21}' +
    '<|close|>message<|sep|><|end_of_msg|>'), prompt.json.prompt);

  const second = await toolClient.chat.completions.create({
    model: 'k3_scripted', messages: followUp, tools,
  });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.equal(second.choices[0].message.content, 'It is 21 degrees in Paris.');
  assert.equal(second.choices[0].message.tool_calls, undefined);
});

test('streamed tool call (scripted K3 model)', async () => {
  const stream = await toolClient.chat.completions.create({
    model: 'k3_scripted', messages: [{ role: 'user', content: 'weather in Paris?' }], tools,
    stream: true,
  });
  const calls = [];
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      for (const tc of c.delta.tool_calls ?? []) calls.push(tc);
      content += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  // The arguments stream in pieces (tool_stream.test.mjs checks them): the first delta names
  // the call, every delta is call 0's, the pieces join to the arguments.
  assert.ok(calls.length > 1);
  for (const tc of calls) assert.equal(tc.index, 0);
  assert.equal(calls[0].function.name, 'get_weather');
  const args = calls.map((tc) => tc.function.arguments ?? '').join('');
  assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 3 });
});

test('a non-loopback --host needs an API key; the key is enforced', async () => {
  const refused = spawn(COLI, ['serve', '--model', TINY, '--port', '0', '--host', '0.0.0.0']);
  const code = await new Promise((resolve) => refused.on('exit', resolve));
  assert.equal(code, 2);
  const keyed = await startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS },
    ['--api-key', 'sekret']);
  try {
    const no = await fetch(`${keyed.base}/v1/models`);
    assert.equal(no.status, 401);
    const yes = new OpenAI({ baseURL: `${keyed.base}/v1`, apiKey: 'sekret', maxRetries: 0 });
    assert.equal((await yes.models.list()).data.length, 1);
    // Shorter, same length, longer with the key as its prefix, empty (the comparison is
    // constant-time: each must still fail).
    for (const apiKey of ['nope', 'sekreT', 'sekret2', 'sekre', ' ']) {
      const wrong = new OpenAI({ baseURL: `${keyed.base}/v1`, apiKey, maxRetries: 0 });
      await assert.rejects(wrong.models.list(), (e) => e.status === 401, apiKey);
    }
    const bare = await fetch(`${keyed.base}/v1/models`, { headers: { authorization: 'sekret' } });
    assert.equal(bare.status, 401);
  } finally {
    await stopServer(keyed);
  }
});
