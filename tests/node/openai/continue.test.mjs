// continue_final_message (vLLM's field; seed §8.3's `C` record): the last assistant message is
// left open and the reply continues it. On the tiny fixture (the real kimi_k3 plugin) a greedy
// continuation is exactly the greedy completion of the prompt /apply-template renders for it, as
// /v1/completions reads those ids (streamed or not); on a scripted K3 model the continued
// message's channel is kept (text continues as content, reasoning as reasoning_content), and the
// refusals name their field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import {
  SCRIPTED, SCRIPTED_PLUGINS, TINY, post, startServer, stopServer,
} from './serve_helpers.mjs';

const END = '<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>';
let tiny, scripted;

function scriptedModel(rules) {
  const dir = mkdtempSync(path.join(tmpdir(), 'coli-continue-scripted-'));
  for (const f of ['config.json', 'tiktoken.model', 'tokenizer_config.json']) {
    copyFileSync(path.join(SCRIPTED, f), path.join(dir, f));
  }
  writeFileSync(path.join(dir, 'script.json'), JSON.stringify({ rules }));
  return dir;
}

before(async () => {
  tiny = await startServer(TINY);
  scripted = await startServer(scriptedModel([
    // The same text in a closed message (no continue_final_message): a new reply.
    { when: 'Hello from<|close|>', reply: `A new reply.${END}` },
    // The open response: the text goes on.
    { when: '<|open|>response<|sep|>Hello from', reply: ` the script.${END}` },
    // The open think block: the reasoning goes on, then the answer.
    {
      when: '<|open|>think<|sep|>Let me',
      reply: ` count.<|close|>think<|sep|><|open|>response<|sep|>Three.${END}`,
    },
    { when: '', reply: `A new reply.${END}` },
  ]), { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS }, ['--model-id', 'scripted']);
});
after(async () => { await stopServer(tiny); await stopServer(scripted); });

const ask = [{ role: 'user', content: 'Name three colours.' }];

test('a greedy continuation is the completion of the rendered open prompt (tiny fixture)', async () => {
  const client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const model = (await client.models.list()).data[0].id;
  for (const [prefill, thinking] of [['The first is', false], ['Red', true], ['', true]]) {
    const label = `${JSON.stringify(prefill)} thinking ${thinking}`;
    const body = {
      model, enable_thinking: thinking, continue_final_message: true,
      messages: [...ask, { role: 'assistant', content: prefill }],
    };
    const rendered = await post(tiny.base, '/apply-template', body);
    assert.equal(rendered.status, 200, rendered.text);
    const open = thinking && !prefill ? '<|open|>think<|sep|>' : `<|open|>response<|sep|>${prefill}`;
    assert.ok(rendered.json.prompt.endsWith(`<|open|>message role="assistant"<|sep|>${
      thinking && prefill ? '<|open|>think<|sep|><|close|>think<|sep|>' : ''}${open}`),
    `${label}: ${rendered.json.prompt.slice(-160)}`);
    const plain = await client.completions.create({
      model, prompt: rendered.json.tokens, max_tokens: 10, temperature: 0,
    });
    for (const stream of [false, true]) {
      const params = { ...body, max_tokens: 10, temperature: 0 };
      let content = '';
      let reasoning = '';
      let usage;
      if (stream) {
        const s = await client.chat.completions.create({
          ...params, stream: true, stream_options: { include_usage: true },
        });
        for await (const c of s) {
          content += c.choices[0]?.delta?.content ?? '';
          reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
          if (c.usage) usage = c.usage;
        }
      } else {
        const r = await client.chat.completions.create(params);
        content = r.choices[0].message.content ?? '';
        reasoning = r.choices[0].message.reasoning_content ?? '';
        usage = r.usage;
      }
      assert.equal(usage.prompt_tokens, rendered.json.tokens.length, label);
      assert.equal(usage.completion_tokens, plain.usage.completion_tokens, label);
      // The same text as the completion's (random weights: reserved tokens are skipped in both;
      // outside ASCII the two may differ, as a reserved token between a character's bytes splits
      // it in the completion's text and not in the chat's parser).
      const ascii = (t) => t.replace(/[^\x00-\x7f]/g, '');
      assert.equal(ascii(reasoning + content), ascii(plain.choices[0].text),
        `${label}${stream ? ' streamed' : ''}`);
      assert.equal(thinking && !prefill ? content : reasoning, '',
        `${label}: the open channel only (${JSON.stringify({ content, reasoning })})`);
    }
  }
});

test('the continued channel is kept: response text, then reasoning (scripted K3)', async () => {
  const client = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const text = await client.chat.completions.create({
    model: 'scripted', enable_thinking: false, continue_final_message: true,
    messages: [{ role: 'user', content: 'Say hello.' }, { role: 'assistant', content: 'Hello from' }],
  });
  assert.equal(text.choices[0].message.content, ' the script.');
  assert.equal(text.choices[0].finish_reason, 'stop');
  const thought = await client.chat.completions.create({
    model: 'scripted', continue_final_message: true,
    messages: [{ role: 'user', content: 'How many?' },
      { role: 'assistant', content: '', reasoning_content: 'Let me' }],
  });
  assert.equal(thought.choices[0].message.reasoning_content, ' count.');
  assert.equal(thought.choices[0].message.content, 'Three.');
  // Without the field the assistant message is closed and a new reply begins.
  const closed = await client.chat.completions.create({
    model: 'scripted', enable_thinking: false,
    messages: [{ role: 'user', content: 'Say hello.' }, { role: 'assistant', content: 'Hello from' }],
  });
  assert.equal(closed.choices[0].message.content, 'A new reply.');
});

test('continue_final_message refusals name the field', async () => {
  const cases = [
    [{ messages: ask }, 'continue_final_message'],
    [{ messages: [...ask, { role: 'assistant', content: 'x' }], response_format: { type: 'json_object' } },
      'response_format'],
    [{ messages: [...ask, { role: 'assistant', content: 'x' }], tool_choice: 'required',
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] },
    'tool_choice'],
    [{ messages: [...ask, { role: 'assistant', content: 'x' }],
      chat_template_kwargs: { add_generation_prompt: true } }, 'continue_final_message'],
  ];
  for (const [body, param] of cases) {
    const r = await post(tiny.base, '/v1/chat/completions', { ...body, continue_final_message: true });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, param, r.text);
  }
});
