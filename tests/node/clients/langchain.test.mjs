// LangChain JS (@langchain/openai ChatOpenAI with a custom baseURL) against `coli serve`: chat
// completions and the Responses API (useResponsesApi). Structure, usage, finish reasons,
// structured output and the bindTools round trip (on the scripted K3 model, see vercel_ai.test.mjs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import {
  TINY, SCRIPTED, SCRIPTED_PLUGINS, startServer, stopServer, post,
} from '../openai/serve_helpers.mjs';

let tiny, scripted;
before(async () => {
  [tiny, scripted] = await Promise.all([
    startServer(TINY),
    startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS }),
  ]);
});
after(async () => {
  await Promise.all([stopServer(tiny), stopServer(scripted)]);
});

function chat(server, model, extra = {}) {
  return new ChatOpenAI({
    configuration: { baseURL: `${server.base}/v1` }, apiKey: 'unused', model, maxRetries: 0,
    ...extra,
  });
}

// Joins a LangChain stream into one message chunk.
async function joined(stream) {
  let all;
  for await (const c of stream) all = all ? all.concat(c) : c;
  return all;
}

test('invoke, stream and batch: usage_metadata, finish_reason, reasoning_content', async () => {
  const N = 10;
  const raw = await post(tiny.base, '/v1/chat/completions', {
    model: 'k3_tiny', messages: [{ role: 'user', content: 'Hello' }], max_tokens: N, temperature: 0,
  });
  assert.equal(raw.status, 200, raw.text);
  const { prompt_tokens: promptTokens } = raw.json.usage;
  const reasoning = raw.json.choices[0].message.reasoning_content;
  const llm = chat(tiny, 'k3_tiny', { temperature: 0, maxTokens: N });
  const m = await llm.invoke('Hello');
  assert.equal(m.response_metadata.finish_reason, 'length');
  assert.deepEqual([m.usage_metadata.input_tokens, m.usage_metadata.output_tokens],
    [promptTokens, N]);
  // All N tokens are the tiny model's reasoning (completion_tokens_details.reasoning_tokens).
  assert.equal(m.usage_metadata.output_token_details.reasoning, N);
  assert.equal(m.additional_kwargs.reasoning_content, reasoning);
  // streamUsage is on by default: the stream's usage chunk is counted once.
  const s = await joined(await llm.stream('Hello'));
  assert.equal(s.content, m.content);
  assert.equal(s.additional_kwargs.reasoning_content, reasoning);
  assert.deepEqual([s.usage_metadata.input_tokens, s.usage_metadata.output_tokens],
    [promptTokens, N]);
  assert.equal(s.usage_metadata.output_token_details.reasoning, N);
  assert.equal(s.response_metadata.finish_reason, 'length');
  const b = await llm.batch(['Hello', 'Hello']);
  assert.equal(b.length, 2);
  for (const r of b) assert.equal(r.usage_metadata.output_tokens, N);
  // modalities: ["text"] (OpenAI's default, sent when set) is accepted; anything else is a 400.
  const text = await chat(tiny, 'k3_tiny', { temperature: 0, maxTokens: N, modalities: ['text'] })
    .invoke('Hello');
  assert.equal(text.additional_kwargs.reasoning_content, reasoning);
  await assert.rejects(
    chat(tiny, 'k3_tiny', { maxTokens: N, modalities: ['text', 'audio'] }).invoke('Hello'),
    (e) => e.status === 400 && /modalities/.test(e.message));
});

test('the Responses API (useResponsesApi): usage and the reasoning item', async () => {
  // 8 greedy tokens of the tiny model end inside a character of its reasoning.
  const N = 8;
  const llm = chat(tiny, 'k3_tiny', { temperature: 0, maxTokens: N, useResponsesApi: true });
  const m = await llm.invoke('Hello');
  assert.deepEqual([m.usage_metadata.output_tokens, m.usage_metadata.output_token_details.reasoning],
    [N, N], 'every token of a reply cut inside its reasoning is a reasoning token');
  const item = m.additional_kwargs.reasoning;
  assert.equal(item.type, 'reasoning');
  assert.ok(item.content[0].text.length > 0, JSON.stringify(item));
  const s = await joined(await llm.stream('Hello'));
  assert.equal(s.usage_metadata.output_tokens, N);
  assert.equal(s.usage_metadata.input_tokens, m.usage_metadata.input_tokens);
});

test('withStructuredOutput: json_schema and function calling give valid objects', async () => {
  const schema = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120) });
  // Thinking off (K3's reasoning_effort "none"): the answer is the object from the first token.
  const llm = chat(tiny, 'k3_tiny', {
    temperature: 0, maxTokens: 300, modelKwargs: { reasoning_effort: 'none' },
  });
  for (const method of ['jsonSchema', 'functionCalling']) {
    const r = await llm.withStructuredOutput(schema, { method, includeRaw: true }).invoke('A person');
    assert.ok(r.parsed, `${method}: ${JSON.stringify(r.raw)}`);
    assert.deepEqual(schema.parse(r.parsed), r.parsed, method);
    if (method === 'functionCalling') {
      assert.equal(r.raw.tool_calls.length, 1, method);
      assert.equal(r.raw.tool_calls[0].name, 'extract', method);
    }
  }
});

test('bindTools: the tool call, a ToolMessage back, the answer (chat and Responses API)', async () => {
  const weather = tool(async () => JSON.stringify({ temperature: 21 }), {
    name: 'get_weather', description: 'The weather in a city',
    schema: z.object({ city: z.string(), days: z.number() }),
  });
  for (const useResponsesApi of [false, true]) {
    for (const streamed of [false, true]) {
      const label = `${useResponsesApi ? 'responses' : 'chat'}${streamed ? ' streamed' : ''}`;
      const llm = chat(scripted, 'k3_scripted', { maxTokens: 1000, useResponsesApi })
        .bindTools([weather]);
      const call = async (msgs) => (streamed ? joined(await llm.stream(msgs)) : llm.invoke(msgs));
      const messages = [new HumanMessage('What is the weather in Paris?')];
      const ai = await call(messages);
      assert.deepEqual(ai.tool_calls.map((c) => [c.name, c.args]),
        [['get_weather', { city: 'Paris', days: 3 }]], label);
      assert.deepEqual(ai.invalid_tool_calls ?? [], [], label);
      assert.ok(ai.usage_metadata.output_tokens > 0, label);
      messages.push(ai);
      for (const tc of ai.tool_calls) messages.push(await weather.invoke(tc));
      const answer = await call(messages);
      assert.equal(answer.text, 'It is 21 degrees in Paris.', label);
      assert.deepEqual(answer.tool_calls, [], label);
    }
  }
});
