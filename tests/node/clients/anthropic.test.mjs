// Anthropic's own SDK (@anthropic-ai/sdk) against `coli serve`'s /v1/messages: plain and streamed
// messages (the SDK's MessageStream rebuilds the message from the events, so a wrong event order
// or shape fails it), thinking blocks, a tool loop with tool_use / tool_result, a prefilled
// reply continued, stop sequences, max_tokens, count_tokens, x-api-key, models.list / retrieve,
// and errors as the SDK's typed exceptions. On the tiny fixture (the real K3 plugin) a greedy
// message is the chat completions' greedy reply, and tool_choice reaches its enforcement.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { zodOutputFormat } from '@anthropic-ai/sdk/helpers/zod';
import { z } from 'zod';
import OpenAI from 'openai';
import {
  SCRIPTED, SCRIPTED_PLUGINS, TINY, startServer, stopServer,
} from '../openai/serve_helpers.mjs';

const KEY = 'sk-messages-test';
// A name an agent written for Claude sends, served with --served-model-name.
const ALIAS = 'claude-sonnet-4-5';
let scripted, tiny, client;

// The scripted K3 family with replies for both modes: a prompt that opens the think channel is
// answered with thinking, one that opens the response directly (thinking off, Anthropic's
// default) without. The first rule whose text occurs in the rendered prompt answers.
const END = '<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>';
const RULES = [
  { when: '<|open|>message role="tool"', reply: `It is 21 degrees in Paris.${END}` },
  // A plain-text document reaches the prompt as text.
  { when: 'Secret notes say', reply: `The notes say hi.${END}` },
  // A prefilled reply, left open by the template: the model goes on from it.
  { when: '<|open|>response<|sep|>Greetings from', reply: ` the script.${END}` },
  {
    when: 'weather',
    reply: '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>' +
      '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>' +
      '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>' +
      '<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>',
  },
  {
    when: '<|open|>think<|sep|>',
    reply: `Thinking.<|close|>think<|sep|><|open|>response<|sep|>Hello from the script.${END}`,
  },
  { when: '', reply: `Hello from the script.${END}` },
];

function scriptedModel() {
  const dir = mkdtempSync(path.join(tmpdir(), 'coli-anthropic-scripted-'));
  for (const f of ['config.json', 'tiktoken.model', 'tokenizer_config.json']) {
    copyFileSync(path.join(SCRIPTED, f), path.join(dir, f));
  }
  writeFileSync(path.join(dir, 'script.json'), JSON.stringify({ rules: RULES }));
  return dir;
}

before(async () => {
  scripted = await startServer(scriptedModel(), { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS },
    ['--api-key', KEY, '--model-id', 'k3_scripted', '--served-model-name', ALIAS]);
  client = new Anthropic({ baseURL: scripted.base, apiKey: KEY, maxRetries: 0 });
});
after(async () => { await stopServer(scripted); await stopServer(tiny); });

const MODEL = 'k3_scripted';
const hello = { model: MODEL, max_tokens: 200, messages: [{ role: 'user', content: 'Say hello.' }] };
const weatherTool = {
  name: 'get_weather', description: 'The weather in a city',
  input_schema: {
    type: 'object', properties: { city: { type: 'string' }, days: { type: 'number' } },
    required: ['city'],
  },
};
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// The message the SDK's stream helper builds from the events, and the events' own text.
async function streamed(params) {
  const s = client.messages.stream(params);
  let text = '';
  let thinking = '';
  const json = [];
  s.on('text', (t) => { text += t; });
  s.on('thinking', (t) => { thinking += t; });
  s.on('inputJson', (partial) => { json.push(partial); });
  const message = await s.finalMessage();
  return { message, text, thinking, json };
}

test('models.list and models.retrieve read the served model and its alias', async () => {
  const ids = [];
  for await (const m of client.models.list()) {
    assert.equal(m.type, 'model');
    assert.equal(m.display_name, m.id);
    assert.ok(!Number.isNaN(Date.parse(m.created_at)), m.created_at);
    ids.push(m.id);
  }
  assert.deepEqual(ids, [MODEL, ALIAS]);
  assert.equal((await client.models.retrieve(MODEL)).id, MODEL);
  assert.equal((await client.models.retrieve(ALIAS)).id, ALIAS);
  // A request naming the alias is served (the reply names the model's id).
  const m = await client.messages.create({ ...hello, model: ALIAS });
  assert.equal(textOf(m), 'Hello from the script.');
  assert.equal(m.model, MODEL);
  await assert.rejects(client.models.retrieve('claude-opus-4'), Anthropic.NotFoundError);
});

test('a message, plain and streamed: text, end_turn, usage', async () => {
  const m = await client.messages.create(hello);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, MODEL);
  assert.deepEqual(m.content, [{ type: 'text', text: 'Hello from the script.' }]);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 5, JSON.stringify(m.usage));
  assert.ok(m.usage.output_tokens > 3, JSON.stringify(m.usage));

  const s = await streamed(hello);
  assert.equal(s.text, 'Hello from the script.');
  assert.deepEqual(s.message.content, m.content);
  assert.equal(s.message.stop_reason, 'end_turn');
  assert.equal(s.message.usage.output_tokens, m.usage.output_tokens);
  assert.equal(s.message.usage.input_tokens + s.message.usage.cache_read_input_tokens,
    m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

test('thinking enabled: a thinking block before the text, plain and streamed', async () => {
  const params = { ...hello, max_tokens: 2000, thinking: { type: 'enabled', budget_tokens: 1024 } };
  const m = await client.messages.create(params);
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(m.content[0].thinking, 'Thinking.');
  assert.equal(m.content[1].text, 'Hello from the script.');
  const s = await streamed(params);
  assert.equal(s.thinking, 'Thinking.');
  assert.equal(s.text, 'Hello from the script.');
  assert.deepEqual(s.message.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(s.message.content[0].thinking, 'Thinking.');
  // The thinking block goes back in the next turn (as Claude's clients send it).
  const next = await client.messages.create({
    ...params,
    messages: [...params.messages, { role: 'assistant', content: m.content },
      { role: 'user', content: 'Again.' }],
  });
  assert.equal(textOf(next), 'Hello from the script.');
});

test('a tool loop: tool_use with its input, the tool_result answered (plain and streamed)', async () => {
  for (const stream of [false, true]) {
    const label = stream ? 'streamed' : 'plain';
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const params = { model: MODEL, max_tokens: 500, tools: [weatherTool], messages };
    let first;
    if (stream) {
      const s = await streamed(params);
      first = s.message;
      assert.ok(s.json.length > 0, `${label}: no inputJson events`);
    } else {
      first = await client.messages.create(params);
    }
    assert.equal(first.stop_reason, 'tool_use', label);
    const uses = first.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, `${label}: ${JSON.stringify(first.content)}`);
    assert.equal(uses[0].name, 'get_weather', label);
    assert.deepEqual(uses[0].input, { city: 'Paris', days: 3 }, label);
    assert.match(uses[0].id, /^toolu_/, label);
    messages.push({ role: 'assistant', content: first.content });
    messages.push({
      role: 'user',
      content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: '21 C' }],
    });
    const second = stream ? (await streamed(params)).message : await client.messages.create(params);
    assert.equal(second.stop_reason, 'end_turn', label);
    assert.equal(textOf(second), 'It is 21 degrees in Paris.', label);
  }
});

test('stop sequences: the text ends before the first match, which is named', async () => {
  const params = { ...hello, stop_sequences: ['zzz', 'yyy', 'xxx', 'www', 'script'] };
  const m = await client.messages.create(params);
  assert.equal(textOf(m), 'Hello from the ');
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, 'script');
  const s = await streamed(params);
  assert.equal(s.text, 'Hello from the ');
  assert.equal(s.message.stop_reason, 'stop_sequence');
  assert.equal(s.message.stop_sequence, 'script');
});

test('a prefilled reply (a last assistant message) is continued, plain and streamed', async () => {
  const params = {
    ...hello, messages: [...hello.messages, { role: 'assistant', content: 'Greetings from' }],
  };
  const m = await client.messages.create(params);
  assert.deepEqual(m.content, [{ type: 'text', text: ' the script.' }]);
  assert.equal(m.stop_reason, 'end_turn');
  const s = await streamed(params);
  assert.equal(s.text, ' the script.');
  await assert.rejects(client.messages.create({
    ...hello, messages: [...hello.messages, { role: 'assistant', content: 'Hello ' }],
  }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.match(e.error.error.message, /trailing whitespace/);
    return true;
  });
});

test('a plain-text document block is read as text; a PDF one is refused', async () => {
  const doc = {
    type: 'document', title: 'Notes',
    source: { type: 'text', media_type: 'text/plain', data: 'Secret notes say hi' },
  };
  const m = await client.messages.create({
    ...hello, messages: [{ role: 'user', content: [doc, { type: 'text', text: 'What do they say?' }] }],
  });
  assert.equal(textOf(m), 'The notes say hi.');
  await assert.rejects(client.messages.create({
    ...hello,
    messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVBE' } }] }],
  }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.match(e.error.error.message, /messages\[0\]\.content\[0\]\.source/);
    return true;
  });
});

test('max_tokens cuts the reply: stop_reason max_tokens', async () => {
  const m = await client.messages.create({ ...hello, max_tokens: 2 });
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 2);
  const s = await streamed({ ...hello, max_tokens: 2 });
  assert.equal(s.message.stop_reason, 'max_tokens');
});

test('count_tokens counts the prompt the message reads', async () => {
  const params = { ...hello, system: 'You are terse.', messages: [{ role: 'user', content: 'Count me.' }] };
  const counted = await client.messages.countTokens({
    model: MODEL, system: params.system, messages: params.messages,
  });
  const m = await client.messages.create(params);
  assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  const withTools = await client.messages.countTokens({
    model: MODEL, system: params.system, messages: params.messages, tools: [weatherTool],
  });
  assert.ok(withTools.input_tokens > counted.input_tokens, 'the tool declaration is counted');
});

test('errors are the SDK\'s typed errors with Anthropic\'s error object', async () => {
  await assert.rejects(client.messages.create({ ...hello, model: 'claude-opus-4' }), (e) => {
    assert.ok(e instanceof Anthropic.NotFoundError, String(e));
    assert.equal(e.error?.type, 'error');
    assert.equal(e.error?.error?.type, 'not_found_error');
    return true;
  });
  await assert.rejects(client.messages.create({
    ...hello,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }],
  }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.equal(e.error?.error?.type, 'invalid_request_error');
    assert.match(e.error.error.message, /messages\[0\]\.content\[0\].*image/);
    return true;
  });
  const { max_tokens: _, ...noMax } = hello;
  await assert.rejects(client.messages.create(noMax), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.match(e.error.error.message, /max_tokens/);
    return true;
  });
  const wrongKey = new Anthropic({ baseURL: scripted.base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create(hello), (e) => {
    assert.ok(e instanceof Anthropic.AuthenticationError, String(e));
    assert.equal(e.error?.error?.type, 'authentication_error');
    return true;
  });
  // The same key as a bearer token (OpenAI's clients) still works on the other routes.
  const openai = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: KEY, maxRetries: 0 });
  assert.equal((await openai.models.list()).data[0].id, MODEL);
});

test('on the real K3 plugin (tiny fixture) a greedy message is the chat completion\'s reply', async () => {
  tiny = await startServer(TINY);
  const anthropic = new Anthropic({ baseURL: tiny.base, apiKey: 'unused', maxRetries: 0 });
  const openai = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const model = (await openai.models.list()).data[0].id;
  const system = 'You are a helpful assistant.';
  const question = 'Name three colours.';
  const chat = await openai.chat.completions.create({
    model, max_tokens: 12, temperature: 0, enable_thinking: false,
    messages: [{ role: 'system', content: system }, { role: 'user', content: question }],
  });
  const m = await anthropic.messages.create({
    model, max_tokens: 12, temperature: 0, system,
    messages: [{ role: 'user', content: question }],
  });
  assert.equal(textOf(m), chat.choices[0].message.content);
  assert.equal(m.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, chat.usage.prompt_tokens);
  assert.equal(m.stop_reason, chat.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  const s = await anthropic.messages.stream({
    model, max_tokens: 12, temperature: 0, system,
    messages: [{ role: 'user', content: question }],
  }).finalMessage();
  assert.equal(textOf(s), textOf(m));
});

test('tool_choice tool / any reach the real plugin\'s enforcement: one valid call (tiny fixture)', async () => {
  // Random weights never write a call by themselves: each call here is the mapping's doing.
  const anthropic = new Anthropic({ baseURL: tiny.base, apiKey: 'unused', maxRetries: 0 });
  const model = (await (await fetch(`${tiny.base}/v1/models`)).json()).data[0].id;
  const pick = {
    name: 'pick', description: 'Pick a number',
    input_schema: {
      type: 'object', properties: { n: { enum: [1, 2, 3] }, ok: { type: 'boolean' } },
      required: ['n', 'ok'], additionalProperties: false,
    },
  };
  const other = {
    ...weatherTool,
    input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] },
  };
  const choices = [
    { type: 'tool', name: 'pick' },
    { type: 'any', disable_parallel_tool_use: true },
  ];
  for (const tool_choice of choices) {
    for (const stream of [false, true]) {
      const label = `${JSON.stringify(tool_choice)}${stream ? ' streamed' : ''}`;
      const params = {
        model, max_tokens: 300, temperature: 0, tools: [pick, other], tool_choice,
        messages: [{ role: 'user', content: 'Pick one.' }],
      };
      const m = stream ? await anthropic.messages.stream(params).finalMessage()
        : await anthropic.messages.create(params);
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.equal(uses.length, 1, `${label}: ${JSON.stringify(m.content)}`);
      assert.equal(m.stop_reason, 'tool_use', label);
      if (tool_choice.type === 'tool') assert.equal(uses[0].name, 'pick', label);
      if (uses[0].name === 'pick') {
        assert.ok([1, 2, 3].includes(uses[0].input.n), `${label}: ${JSON.stringify(uses[0].input)}`);
        assert.equal(typeof uses[0].input.ok, 'boolean', label);
      } else {
        assert.equal(typeof uses[0].input.city, 'string', `${label}: ${JSON.stringify(uses[0].input)}`);
      }
    }
  }
});

test('output_config.format is enforced: messages.parse reads a valid object (tiny fixture)', async () => {
  // Random weights never write this JSON by themselves: each valid object is the enforcement's.
  const anthropic = new Anthropic({ baseURL: tiny.base, apiKey: 'unused', maxRetries: 0 });
  const model = (await (await fetch(`${tiny.base}/v1/models`)).json()).data[0].id;
  const Answer = z.object({ answer: z.enum(['yes', 'no']), sure: z.boolean() });
  const params = {
    model, max_tokens: 200, temperature: 0,
    messages: [{ role: 'user', content: 'Is the sky blue?' }],
    output_config: { format: zodOutputFormat(Answer), effort: 'low' },
  };
  const m = await anthropic.messages.parse(params);
  assert.equal(m.stop_reason, 'end_turn', JSON.stringify(m.content));
  assert.deepEqual(Answer.parse(m.parsed_output), m.parsed_output);
  const s = await anthropic.messages.stream(params).finalMessage();
  assert.deepEqual(s.parsed_output, m.parsed_output, 'streamed: the same greedy object');
});

test('a streamed message whose client hangs up stops generating (tiny fixture)', async () => {
  const anthropic = new Anthropic({ baseURL: tiny.base, apiKey: 'unused', maxRetries: 0 });
  const model = (await (await fetch(`${tiny.base}/v1/models`)).json()).data[0].id;
  const value = async (name) => {
    const text = await (await fetch(`${tiny.base}/metrics`)).text();
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  const disconnects = await value('coli_http_client_disconnects_total');
  const controller = new AbortController();
  // Greedy on the tiny model runs to the end of its context: still running when the client goes.
  const stream = await anthropic.messages.create({
    model, max_tokens: 100000, temperature: 0, stream: true,
    messages: [{ role: 'user', content: 'Go on forever.' }],
  }, { signal: controller.signal });
  let deltas = 0;
  try {
    for await (const event of stream) {
      if (event.type === 'content_block_delta' && ++deltas >= 3) controller.abort();
    }
  } catch (e) {
    assert.ok(e.name === 'AbortError' || e instanceof Anthropic.APIUserAbortError, String(e));
  }
  for (let i = 0; i < 100 && (await value('coli_requests_active')) !== 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(await value('coli_requests_active'), 0);
  assert.equal(await value('coli_http_streams_active'), 0);
  assert.ok(await value('coli_http_client_disconnects_total') > disconnects);
  const tokens = await value('coli_completion_tokens_total');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await value('coli_completion_tokens_total'), tokens, 'generation ended');
});

test('a reply that fills the context ends with model_context_window_exceeded (tiny fixture)', async () => {
  const anthropic = new Anthropic({ baseURL: tiny.base, apiKey: 'unused', maxRetries: 0 });
  const models = await (await fetch(`${tiny.base}/v1/models`)).json();
  const { id: model, max_model_len: capacity } = models.data[0];
  // A prompt a few tokens short of the context: its size from count_tokens.
  const count = async (k) => (await anthropic.messages.countTokens({
    model, messages: [{ role: 'user', content: 'word '.repeat(k) }],
  })).input_tokens;
  const base = await count(0);
  const per = (await count(1000)) - base;
  const k = Math.floor((capacity - 6 - base) / (per / 1000));
  const messages = [{ role: 'user', content: 'word '.repeat(k) }];
  const prompt = await anthropic.messages.countTokens({ model, messages });
  assert.ok(prompt.input_tokens < capacity && prompt.input_tokens > capacity - 50,
    `${prompt.input_tokens} of ${capacity}`);
  const params = { model, max_tokens: 1000, temperature: 0, messages };
  const m = await anthropic.messages.create(params);
  assert.equal(m.stop_reason, 'model_context_window_exceeded');
  assert.equal(m.usage.output_tokens, capacity - prompt.input_tokens);
  const s = await anthropic.messages.stream(params).finalMessage();
  assert.equal(s.stop_reason, 'model_context_window_exceeded');
  // max_tokens reached first is still max_tokens.
  const short = await anthropic.messages.create({ ...params, max_tokens: 2 });
  assert.equal(short.stop_reason, 'max_tokens');
});
