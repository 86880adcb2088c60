// The Vercel AI SDK's tool loops and multi-turn conversations against `coli serve` on the
// scripted K3 model (tools/k3_scripted: it calls get_weather when asked about the weather and
// answers "It is 21 degrees in Paris." once the tool's result is rendered; "Hello from the
// script." otherwise), through the three providers of support.mjs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, tool, stepCountIs } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { z } from 'zod';
import {
  SCRIPTED, SCRIPTED_PLUGINS, startServer, stopServer, post,
} from '../openai/serve_helpers.mjs';
import { providers } from './support.mjs';

let scripted;
before(async () => { scripted = await startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS }); });
after(() => stopServer(scripted));

const weatherSchema = z.object({ city: z.string(), days: z.number() });

test('tool loop (stopWhen): the call runs, its result goes back, the model answers', async () => {
  for (const [name, model] of Object.entries(providers(scripted, 'k3_scripted'))) {
    for (const streamed of [false, true]) {
      const label = `${name}${streamed ? ' streamed' : ''}`;
      const calls = [];
      const tools = {
        get_weather: tool({
          description: 'The weather in a city',
          inputSchema: weatherSchema,
          execute: async (input) => { calls.push(input); return { temperature: 21, unit: 'C' }; },
        }),
      };
      const opts = {
        model, tools, prompt: 'What is the weather in Paris?', stopWhen: stepCountIs(4),
        maxOutputTokens: 1000,
      };
      let steps, text;
      if (streamed) {
        const s = streamText(opts);
        const types = new Set();
        for await (const part of s.fullStream) {
          assert.notEqual(part.type, 'error', `${label}: ${JSON.stringify(part)}`);
          types.add(part.type);
        }
        for (const t of ['tool-input-start', 'tool-input-delta', 'tool-call', 'tool-result']) {
          assert.ok(types.has(t), `${label}: no ${t} part`);
        }
        steps = await s.steps;
        text = await s.text;
      } else {
        const g = await generateText(opts);
        steps = g.steps;
        text = g.text;
      }
      assert.deepEqual(calls, [{ city: 'Paris', days: 3 }], label);
      assert.equal(steps.length, 2, label);
      assert.equal(steps[0].finishReason, 'tool-calls', label);
      assert.equal(steps[0].toolCalls[0].toolName, 'get_weather', label);
      assert.equal(steps[1].finishReason, 'stop', label);
      assert.equal(text, 'It is 21 degrees in Paris.', label);
      for (const st of steps) assert.ok(st.usage.outputTokens > 0, label);
    }
  }
});

test('a multi-turn conversation with the Responses model refers to stored items', async () => {
  // @ai-sdk/openai's Responses model (store on by default) sends earlier outputs back as
  // {"type": "item_reference", "id": ...}: the server must resolve them, not refuse them.
  const sent = [];
  const openai = createOpenAI({
    baseURL: `${scripted.base}/v1`, apiKey: 'unused',
    fetch: async (url, init) => { sent.push(JSON.parse(init.body)); return fetch(url, init); },
  });
  const model = openai.responses('k3_scripted');
  const first = await generateText({ model, prompt: 'Say hello.', maxOutputTokens: 400 });
  assert.equal(first.text, 'Hello from the script.');
  const messages = [
    { role: 'user', content: 'Say hello.' },
    ...first.response.messages,
    { role: 'user', content: 'And again.' },
  ];
  const second = await generateText({ model, messages, maxOutputTokens: 400 });
  assert.equal(second.text, 'Hello from the script.');
  const refs = sent[1].input.filter((item) => item.type === 'item_reference');
  assert.ok(refs.length >= 1, `the SDK sent references: ${JSON.stringify(sent[1].input)}`);
  // The referenced items are the conversation's: the second prompt is longer by them.
  assert.ok(second.usage.inputTokens > first.usage.inputTokens + 5);

  // A reference to an item the server never stored is a clear 400 naming it.
  const r = await post(scripted.base, '/v1/responses', {
    model: 'k3_scripted', input: [{ type: 'item_reference', id: 'msg_never_stored' }],
  });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'input[0].id');
  assert.match(r.json.error.message, /msg_never_stored/);
});
