// The openai SDK's higher-level helpers against `coli serve` (tests/node/openai covers the plain
// calls): chat.completions.stream() and its events, chat.completions.parse with
// zodResponseFormat, runTools, responses.stream(), responses.parse with zodTextFormat; and a
// client that counts tokens itself (tiktoken on the model's own tiktoken.model) gets the counts
// the usage reports.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import OpenAI from 'openai';
import { zodResponseFormat, zodTextFormat, zodFunction } from 'openai/helpers/zod';
import { z } from 'zod';
import {
  TINY, SCRIPTED, SCRIPTED_PLUGINS, startServer, stopServer, post,
} from '../openai/serve_helpers.mjs';

const require = createRequire(import.meta.url);

let tiny, scripted, client, scriptedClient;
before(async () => {
  [tiny, scripted] = await Promise.all([
    startServer(TINY),
    startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS }),
  ]);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  scriptedClient = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  await Promise.all([stopServer(tiny), stopServer(scripted)]);
});

const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120) });

test('chat.completions.stream(): events and finalChatCompletion equal the plain request', async () => {
  const body = {
    model: 'k3_tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 16, temperature: 0,
    reasoning_effort: 'none',  // content from the first token: content events to check
  };
  const plain = await client.chat.completions.create(body);
  const s = client.chat.completions.stream({ ...body, stream_options: { include_usage: true } });
  let deltas = '', done = null, chunks = 0;
  s.on('content.delta', (e) => { deltas += e.delta; });
  s.on('content.done', (e) => { done = e.content; });
  s.on('chunk', () => { chunks++; });
  const fin = await s.finalChatCompletion();
  assert.ok(chunks > 2);
  assert.equal(fin.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(deltas, plain.choices[0].message.content);
  assert.equal(done, plain.choices[0].message.content);
  assert.equal(fin.choices[0].finish_reason, plain.choices[0].finish_reason);
  assert.deepEqual(fin.usage, plain.usage);
  // totalUsage() sums the three counts only (as it does against OpenAI).
  const { prompt_tokens, completion_tokens, total_tokens } = plain.usage;
  assert.deepEqual(await s.totalUsage(), { prompt_tokens, completion_tokens, total_tokens });
});

test('chat.completions.parse and stream() with zodResponseFormat', async () => {
  const body = {
    model: 'k3_tiny', messages: [{ role: 'user', content: 'A person' }], max_tokens: 300,
    temperature: 0, reasoning_effort: 'none', response_format: zodResponseFormat(Person, 'person'),
  };
  const r = await client.chat.completions.parse(body);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const parsed = r.choices[0].message.parsed;
  assert.deepEqual(Person.parse(parsed), parsed);
  const s = client.chat.completions.stream(body);
  const snapshots = [];
  s.on('content.delta', (e) => { snapshots.push(e.parsed); });
  const fin = await s.finalChatCompletion();
  assert.deepEqual(fin.choices[0].message.parsed, parsed);
  assert.ok(snapshots.length > 1, 'partial objects while streaming');
});

test('runTools (plain and streamed): the function runs and the model answers', async () => {
  for (const stream of [false, true]) {
    const calls = [];
    const runner = scriptedClient.chat.completions.runTools({
      model: 'k3_scripted', max_tokens: 1000, stream,
      ...(stream ? { stream_options: { include_usage: true } } : {}),
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [zodFunction({
        name: 'get_weather', parameters: z.object({ city: z.string(), days: z.number() }),
        function: (args) => { calls.push(args); return { temperature: 21 }; },
      })],
    });
    assert.equal(await runner.finalContent(), 'It is 21 degrees in Paris.', `stream ${stream}`);
    assert.deepEqual(calls, [{ city: 'Paris', days: 3 }]);
    // user, assistant with the call, tool, assistant
    assert.deepEqual(runner.messages.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
    const usage = await runner.totalUsage();
    assert.ok(usage.prompt_tokens > 0 && usage.completion_tokens > 0, JSON.stringify(usage));
  }
});

test('responses.stream(): events in sequence, finalResponse equals the plain request', async () => {
  const body = { model: 'k3_tiny', input: 'Hi', max_output_tokens: 12, temperature: 0 };
  const plain = await client.responses.create(body);
  const s = client.responses.stream(body);
  let seq = -1;
  for await (const e of s) {
    assert.ok(e.sequence_number > seq, e.type);
    seq = e.sequence_number;
  }
  const fin = await s.finalResponse();
  assert.equal(fin.status, 'incomplete');
  assert.deepEqual(fin.output.map((o) => o.type), plain.output.map((o) => o.type));
  assert.deepEqual(fin.output[0].content, plain.output[0].content);
  assert.deepEqual(fin.usage, plain.usage);
});

test('responses.parse and responses.stream with zodTextFormat', async () => {
  const body = {
    model: 'k3_tiny', input: 'A person', max_output_tokens: 300, temperature: 0,
    reasoning: { effort: 'none' }, text: { format: zodTextFormat(Person, 'person') },
  };
  const r = await client.responses.parse(body);
  assert.equal(r.status, 'completed');
  assert.deepEqual(Person.parse(r.output_parsed), r.output_parsed);
  const s = client.responses.stream(body);
  const fin = await s.finalResponse();
  assert.deepEqual(fin.output_parsed, r.output_parsed);
});

test('a client counting tokens with tiktoken on the model\'s tiktoken.model gets the usage', async () => {
  const { Tiktoken } = require('tiktoken/lite');
  const { KIMI_PATTERN } = require('../tiktoken/vocabs.js');
  const config = JSON.parse(fs.readFileSync(path.join(TINY, 'tokenizer_config.json'), 'utf8'));
  const specials = {};
  for (const [id, t] of Object.entries(config.added_tokens_decoder)) specials[t.content] = Number(id);
  const enc = new Tiktoken(fs.readFileSync(path.join(TINY, 'tiktoken.model'), 'utf8'), specials,
    KIMI_PATTERN);
  try {
    const prompt = 'Count me: naïve café, 中文字符, emoji 😀, numbers 1234567, tabs\tand\nlines.';
    const c = await client.completions.create({ model: 'k3_tiny', prompt, max_tokens: 1 });
    assert.equal(c.usage.prompt_tokens, enc.encode_ordinary(prompt).length);
    // Chat: the rendered prompt (/apply-template), specials included, is what usage counts.
    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: prompt }];
    const t = await post(tiny.base, '/apply-template', { messages });
    assert.equal(t.status, 200, t.text);
    const counted = enc.encode(t.json.prompt, 'all').length;
    const chatReply = await client.chat.completions.create({ model: 'k3_tiny', messages, max_tokens: 1 });
    assert.equal(chatReply.usage.prompt_tokens, counted);
    const input = await post(tiny.base, '/v1/responses/input_tokens', {
      model: 'k3_tiny', instructions: 'Be brief.', input: prompt,
    });
    assert.equal(input.json.input_tokens, counted);
  } finally {
    enc.free();
  }
});
