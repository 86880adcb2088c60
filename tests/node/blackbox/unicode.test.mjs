// `coli serve` with text outside ASCII, as Kimi's users write it (Chinese, emoji with ZWJ
// sequences, accents), through the official `openai` SDK and raw SSE. The tiny fixture's
// byte-level vocabulary splits most such characters over several tokens; a json_schema enum
// makes the greedy model spell one exact string, so every test sees tokens that are parts of a
// character. docs/status/blackbox.md "Text outside ASCII".
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from '../openai/node_modules/openai/index.mjs';

import { TINY, startServer, stopServer, post } from '../openai/serve_helpers.mjs';

let server, client, modelId;

before(async () => {
  server = await startServer(TINY);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
});

after(() => stopServer(server));

const TEXT = '你好世界🙂👨‍👩‍👧é';
const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

// A greedy chat request whose answer is the JSON string TEXT, with logprobs.
const spelled = (extra = {}) => ({
  model: modelId,
  messages: [{ role: 'user', content: '你好' }],
  max_tokens: 80,
  temperature: 0,
  enable_thinking: false,
  logprobs: true,
  top_logprobs: 3,
  response_format: {
    type: 'json_schema',
    json_schema: { name: 'greeting', schema: { type: 'string', enum: [TEXT] } },
  },
  ...extra,
});

const isUtf8 = (bytes) => {
  try {
    strictUtf8.decode(Uint8Array.from(bytes));
    return true;
  } catch {
    return false;
  }
};

// OpenAI's `token` for a logprob entry: the text, or "bytes:\xNN..." for a part of a character.
const expectedToken = (bytes) => (isUtf8(bytes)
  ? strictUtf8.decode(Uint8Array.from(bytes))
  : `bytes:${bytes.map((b) => `\\x${b.toString(16).padStart(2, '0')}`).join('')}`);

function checkEntries(entries, content, label) {
  const joined = entries.flatMap((e) => e.bytes);
  assert.deepEqual(joined, [...utf8.encode(content)], `${label}: the bytes join to the content`);
  assert.ok(entries.some((e) => !isUtf8(e.bytes)), `${label}: some token is part of a character`);
  for (const e of entries) {
    assert.equal(e.token, expectedToken(e.bytes), `${label}: ${JSON.stringify(e)}`);
    for (const t of e.top_logprobs ?? []) assert.equal(t.token, expectedToken(t.bytes), label);
  }
}

test('chat logprobs: each token carries its own bytes, and they join to the content', async () => {
  const r = await client.chat.completions.create(spelled());
  const content = r.choices[0].message.content;
  assert.equal(content, JSON.stringify(TEXT));
  // The tag that closes the answer (<|close|>response<|sep|>...) is no content token.
  checkEntries(r.choices[0].logprobs.content, content, 'non-streamed');
});

test('chat stream: deltas and logprobs equal the non-streamed answer', async () => {
  const whole = await client.chat.completions.create(spelled());
  const stream = await client.chat.completions.create(spelled({ stream: true }));
  let content = '';
  const entries = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      content += c.delta.content ?? '';
      entries.push(...(c.logprobs?.content ?? []));
    }
  }
  assert.equal(content, whole.choices[0].message.content);
  assert.deepEqual(entries, whole.choices[0].logprobs.content);
  checkEntries(entries, content, 'streamed');
});

test('chat stream: every SSE event is strict UTF-8 JSON, cut where a stop string starts', async () => {
  for (const stop of ['世', '👩', '\u200d👧']) {
    const r = await fetch(`${server.base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(spelled({ stream: true, stop: [stop] })),
    });
    const raw = new Uint8Array(await r.arrayBuffer());
    const text = strictUtf8.decode(raw);  // throws on any ill-formed byte
    let content = '';
    for (const line of text.split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const chunk = JSON.parse(line.slice(6));
      for (const c of chunk.choices) content += c.delta.content ?? '';
    }
    const quoted = JSON.stringify(TEXT);
    assert.equal(content, quoted.slice(0, quoted.indexOf(stop)), `stop ${JSON.stringify(stop)}`);
  }
});

test('legacy completions logprobs: partial tokens named by their bytes, no two keys merged', async () => {
  // Token ids of 你 (two tokens in the tiny vocabulary); biasing the first repeats a half
  // character, so the answer is all parts of characters.
  const ids = (await post(server.base, '/tokenize', { model: modelId, prompt: '你' })).json.tokens;
  assert.ok(ids.length >= 2, `你 is ${JSON.stringify(ids)}`);
  const half = (await post(server.base, '/detokenize', { model: modelId, tokens: [ids[0]] }));
  assert.equal(half.status, 200);
  const r = await post(server.base, '/v1/completions', {
    model: modelId, prompt: '你好', max_tokens: 6, temperature: 0, logprobs: 5,
    logit_bias: { [ids[0]]: 100 },
  });
  assert.equal(r.status, 200, r.text);
  const lp = r.json.choices[0].logprobs;
  assert.deepEqual(lp.tokens, Array(6).fill('bytes:\\xe4\\xbd'));
  // Distinct tokens are distinct keys (several partial tokens all read "\ufffd" before).
  for (const top of lp.top_logprobs) assert.equal(Object.keys(top).length, 5, JSON.stringify(top));
});

// The raw bytes a legacy completions token name stands for ("bytes:\xNN..." or its text).
const tokenBytes = (name) => (name.startsWith('bytes:')
  ? name.slice(6).split('\\x').slice(1).map((h) => parseInt(h, 16))
  : [...utf8.encode(name)]);

test('legacy completions text_offset: where each token starts in the text, in characters', async () => {
  // The four tokens of 🙂 biased alike: the greedy model strings them in its own order, so some
  // runs complete characters across tokens and some bytes never do (U+FFFD).
  const ids = (await post(server.base, '/tokenize', { model: modelId, prompt: '🙂' })).json.tokens;
  assert.ok(ids.length >= 3, `🙂 is ${JSON.stringify(ids)}`);
  const body = {
    model: modelId, prompt: '你好', max_tokens: 16, temperature: 0, logprobs: 1,
    skip_special_tokens: false, logit_bias: Object.fromEntries(ids.map((id) => [id, 100])),
  };
  const r = await post(server.base, '/v1/completions', body);
  assert.equal(r.status, 200, r.text);
  const { text, logprobs } = r.json.choices[0];
  assert.equal(logprobs.text_offset.length, logprobs.tokens.length);
  // Reference: a streaming WHATWG decoder (U+FFFD per maximal subpart, as the server's) fed the
  // tokens' bytes; a token's offset is the characters before it in the prompt followed by the
  // text (OpenAI's offsets start after the prompt, echo or not: a reply to "Hello" starts at 5).
  const decoder = new TextDecoder();
  let chars = [...body.prompt].length;
  const want = logprobs.tokens.map((name) => {
    const at = chars;
    chars += [...decoder.decode(Uint8Array.from(tokenBytes(name)), { stream: true })].length;
    return at;
  });
  assert.deepEqual(logprobs.text_offset, want);
  const cps = [...text];
  assert.ok(logprobs.text_offset.some((o, i) => o === logprobs.text_offset[i + 1]),
    'some token completes no character');
  assert.ok(cps.some((c) => c.codePointAt(0) > 0xffff), `no character of 4 bytes in ${text}`);
  // Streamed: the same offsets, chunk by chunk.
  const raw = await fetch(`${server.base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const streamed = [];
  for (const line of (await raw.text()).split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    for (const c of JSON.parse(line.slice(6)).choices) streamed.push(...(c.logprobs?.text_offset ?? []));
  }
  assert.deepEqual(streamed, logprobs.text_offset);
});

// Python's requests reads a text/* body without a charset as Latin-1: `iter_lines(decode_unicode=
// True)` over a charset-less event stream turned 你好 into mojibake (and cut events at U+0085).
// With the charset, httplib would compress the stream for clients that accept gzip / br (and hold
// every event back until the end), so a stream must also go out uncompressed.
test('SSE answers say charset=utf-8 and are never compressed', async () => {
  const headers = { 'content-type': 'application/json', 'accept-encoding': 'gzip, deflate, br' };
  const ask = async (path, body, method = 'POST') => {
    const r = await fetch(`${server.base}${path}`, {
      method, headers, body: body && JSON.stringify(body),
    });
    const text = await r.text();
    assert.equal(r.status, 200, `${path}: ${text}`);
    return { r, text };
  };
  const chat = { model: modelId, messages: [{ role: 'user', content: '你好' }], max_tokens: 4 };
  const background = (await ask('/v1/responses', {
    model: modelId, input: '你好', max_output_tokens: 4, background: true, stream: true,
  })).text.match(/"id":"(resp_[^"]+)"/)[1];
  const streams = [
    ['/v1/chat/completions', { ...chat, stream: true }],
    ['/v1/completions', { model: modelId, prompt: '你好', max_tokens: 4, stream: true }],
    ['/v1/responses', { model: modelId, input: '你好', max_output_tokens: 4, stream: true }],
    [`/v1/responses/${background}?stream=true`, undefined, 'GET'],
  ];
  for (const [path, body, method] of streams) {
    const { r, text } = await ask(path, body, method);
    assert.equal(r.headers.get('content-type'), 'text/event-stream; charset=utf-8', path);
    assert.equal(r.headers.get('content-encoding'), null, path);
    assert.ok(text.includes('data: '), `${path}: ${text}`);
  }
  // JSON answers stay JSON (UTF-8 by definition) and may still be compressed.
  const { r } = await ask('/v1/chat/completions', chat);
  assert.equal(r.headers.get('content-type'), 'application/json');
  const metrics = await fetch(`${server.base}/metrics`);
  assert.match(metrics.headers.get('content-type'), /^text\/plain; version=0\.0\.4; charset=utf-8$/);
});

test('responses: output_text logprobs join to the text, streamed deltas to the same text', async () => {
  const body = {
    model: modelId,
    input: '你好',
    max_output_tokens: 80,
    reasoning: { effort: 'none' },
    temperature: 0,
    include: ['message.output_text.logprobs'],
    top_logprobs: 2,
    text: { format: { type: 'json_schema', name: 'greeting', schema: { type: 'string', enum: [TEXT] } } },
  };
  const r = await client.responses.create(body);
  const part = r.output.find((o) => o.type === 'message').content[0];
  assert.equal(part.text, JSON.stringify(TEXT));
  checkEntries(part.logprobs, part.text, 'responses');
  let streamed = '';
  for await (const ev of await client.responses.create({ ...body, stream: true })) {
    if (ev.type === 'response.output_text.delta') streamed += ev.delta;
  }
  assert.equal(streamed, part.text);
});

// A reply cut by max_tokens inside a character: every generated content token still has its
// entry (OpenAI and vLLM list each one); the parts of the unfinished character used to wait for
// a token that never came and were lost. The greedy model spells TEXT, whose characters span
// several tokens, so some of these cut points fall inside one.
test('chat logprobs list every content token when max_tokens cuts inside a character', async () => {
  let cutInside = 0;
  for (let max = 1; max <= 10; max++) {
    const r = await post(server.base, '/v1/chat/completions', spelled({ max_tokens: max }));
    assert.equal(r.status, 200, r.text);
    const { message, logprobs } = r.json.choices[0];
    const entries = logprobs.content;
    const lastBytes = entries.length ? entries[entries.length - 1].bytes : [];
    if (entries.length && !isUtf8(entries.flatMap((e) => e.bytes))) ++cutInside;
    // The constrained answer is content from its first token: one entry per generated token
    // (the tokens of the closing tag come only after the whole string).
    assert.equal(entries.length, r.json.usage.completion_tokens,
      `max_tokens ${max}: ${entries.length} entries for ${r.json.usage.completion_tokens} tokens ` +
      `(content ${JSON.stringify(message.content)}, last bytes ${lastBytes})`);
  }
  assert.ok(cutInside > 0, 'no cut point fell inside a character');
});

// A stop string: the entries of the tokens it cut (held by the stop filter, then dropped) are not
// listed, so the entries' bytes still join to the content (they ran on past it: "你好世\uFFFD"
// for the content "你好" with stop "世界"). Streamed entries equal the non-streamed ones.
test('chat logprobs end where a stop string cuts the content', async () => {
  for (const stop of ['世界', '🙂👨', 'é"', '\u200d👧']) {
    const r = await post(server.base, '/v1/chat/completions', spelled({ stop: [stop] }));
    assert.equal(r.status, 200, r.text);
    const { message, logprobs, finish_reason } = r.json.choices[0];
    assert.equal(finish_reason, 'stop', `stop ${JSON.stringify(stop)}`);
    assert.ok(!message.content.includes(stop), message.content);
    checkEntries(logprobs.content, message.content, `stop ${JSON.stringify(stop)}`);
    const streamed = [];
    for await (const chunk of await client.chat.completions.create(
      { ...spelled({ stop: [stop] }), stream: true })) {
      for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
    }
    assert.deepEqual(streamed, logprobs.content, `stop ${JSON.stringify(stop)}: streamed`);
  }
});
