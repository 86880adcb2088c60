// response_format / text.format enforced end to end: the official `openai` npm SDK against a real
// `coli serve` on the tiny Kimi K3 fixture (random weights: left to itself the model never writes
// JSON, so each check fails when enforcement is off). The validator is ajv (JSON Schema draft
// 2020-12 / 07 semantics), independent of common/grammar. docs/status/constrained.md.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';

import { TINY, startServer, stopServer, post } from './serve_helpers.mjs';

let tiny, client, modelId;
const messages = [{ role: 'user', content: 'Describe a thing.' }];

// Bounded everywhere: enums, strings with maxLength, arrays with maxItems, a nested object.
const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 8 },
    color: { enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 3 },
    size: {
      type: 'object',
      properties: { n: { enum: [1, 2, 3] }, ok: { type: 'boolean' } },
      required: ['n', 'ok'],
      additionalProperties: false,
    },
  },
  required: ['name', 'color', 'tags', 'size'],
  additionalProperties: false,
};
const validate = new Ajv({ strict: true }).compile(schema);
const jsonSchemaFormat = { type: 'json_schema', json_schema: { name: 'thing', strict: true, schema } };

// Parses and validates `text`; returns the list of problems ([] when valid).
function problems(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return [`not JSON: ${e.message}: ${JSON.stringify(text)}`];
  }
  return validate(value) ? [] : validate.errors.map((e) => `${e.instancePath} ${e.message}`);
}

before(async () => {
  tiny = await startServer(TINY);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
});

after(async () => { await stopServer(tiny); });

test('chat.completions json_schema: greedy and seeded answers validate, and end with stop', async () => {
  for (const knobs of [{ temperature: 0 }, { temperature: 1, seed: 3 }, { temperature: 1, seed: 4 }]) {
    const r = await client.chat.completions.create({
      model: modelId, messages, max_tokens: 400, enable_thinking: false,
      response_format: jsonSchemaFormat, ...knobs,
    });
    const content = r.choices[0].message.content;
    assert.deepEqual(problems(content), [], `${JSON.stringify(knobs)}: ${content}`);
    assert.equal(r.choices[0].finish_reason, 'stop');
  }
});

test('without response_format the same requests are not valid JSON (the check can fail)', async () => {
  for (const knobs of [{ temperature: 0 }, { temperature: 1, seed: 3 }]) {
    const r = await client.chat.completions.create({
      model: modelId, messages, max_tokens: 120, enable_thinking: false, ...knobs,
    });
    assert.notDeepEqual(problems(r.choices[0].message.content), []);
  }
});

test('chat.completions json_schema streamed: the deltas join into a valid answer', async () => {
  const stream = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 400, enable_thinking: false, temperature: 1, seed: 5,
    response_format: jsonSchemaFormat, stream: true,
  });
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      content += c.delta?.content ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  assert.deepEqual(problems(content), [], content);
  assert.equal(finish, 'stop');
});

test('thinking on: free reasoning, then a valid answer', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 800, enable_thinking: true, temperature: 1, seed: 11,
    response_format: jsonSchemaFormat,
  });
  const m = r.choices[0].message;
  assert.ok((m.reasoning_content ?? '').length > 0, 'no reasoning');
  assert.notDeepEqual(problems(m.reasoning_content), []);  // the reasoning was not constrained
  assert.deepEqual(problems(m.content), [], m.content);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('chat.completions json_object gives an object', async () => {
  // Any object may be unbounded (strings, nesting): a mild bias on the tokens that close things
  // lets the random model finish.
  const bias = {};
  for (const t of ['"', '}', ',']) {
    const ids = await post(tiny.base, '/tokenize', { prompt: t });
    assert.equal(ids.json.tokens.length, 1, t);
    bias[String(ids.json.tokens[0])] = 2;
  }
  for (const knobs of [{ temperature: 0 }, { temperature: 1, seed: 5 }]) {
    const r = await client.chat.completions.create({
      model: modelId, messages, max_tokens: 1500, enable_thinking: false, logit_bias: bias,
      response_format: { type: 'json_object' }, ...knobs,
    });
    const content = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, 'stop', content);
    const value = JSON.parse(content);
    assert.equal(typeof value, 'object');
    assert.ok(value !== null && !Array.isArray(value), content);
  }
});

test('responses.create text.format json_schema validates', async () => {
  for (const knobs of [{ temperature: 0 }, { temperature: 1 }]) {
    const r = await client.responses.create({
      // Thinking off (the chat tests cover it): an unseeded temperature-1 reasoning could outrun
      // any budget; the bounded answer itself fits 2000 tokens whatever its whitespace.
      model: modelId, input: 'Describe a thing.', max_output_tokens: 2000, ...knobs,
      reasoning: { effort: 'none' },
      text: { format: { type: 'json_schema', name: 'thing', strict: true, schema } },
    });
    assert.equal(r.status, 'completed');
    assert.deepEqual(problems(r.output_text), [], r.output_text);
  }
});

test('an unsupported schema is a 400 naming response_format (chat) / text.format (responses)', async () => {
  const bad = { type: 'object', properties: { a: { type: 'integer', not: { const: 3 } } } };
  await assert.rejects(
    client.chat.completions.create({
      model: modelId, messages, max_tokens: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bad } },
    }),
    (e) => e.status === 400 && e.param === 'response_format' && /properties\.a\.not/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({
      model: modelId, messages, max_tokens: 5, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bad } },
    }),
    (e) => e.status === 400 && e.param === 'response_format',
  );
  await assert.rejects(
    client.responses.create({
      model: modelId, input: 'x', max_output_tokens: 5,
      text: { format: { type: 'json_schema', name: 'x', schema: bad } },
    }),
    (e) => e.status === 400 && e.param === 'text.format' && /properties\.a\.not/.test(e.message),
  );
});

// vLLM's ways of asking, and /v1/completions (which ignored response_format before: the raw
// text of random weights came back).
test('guided_json, structured_outputs.json and completions response_format are enforced', async () => {
  const chats = [
    { guided_json: schema },
    { guided_json: JSON.stringify(schema) },
    { structured_outputs: { json: schema } },
  ];
  for (const extra of chats) {
    const r = await client.chat.completions.create({
      model: modelId, messages, max_tokens: 400, enable_thinking: false, temperature: 0, ...extra,
    });
    assert.deepEqual(problems(r.choices[0].message.content), [], JSON.stringify(Object.keys(extra)));
    assert.equal(r.choices[0].finish_reason, 'stop');
  }
  for (const extra of [{ response_format: jsonSchemaFormat }, { guided_json: schema },
    { structured_outputs: { json: schema } }]) {
    for (const stream of [false, true]) {
      const params = {
        model: modelId, prompt: 'A thing:', max_tokens: 400, temperature: 0, ...extra,
      };
      let text = '';
      if (stream) {
        for await (const c of await client.completions.create({ ...params, stream: true })) {
          text += c.choices[0]?.text ?? '';
        }
      } else {
        text = (await client.completions.create(params)).choices[0].text;
      }
      assert.deepEqual(problems(text), [], `completions ${Object.keys(extra)} stream ${stream}`);
    }
  }
  // json_object on completions: an object (unbounded, so it may be cut by max_tokens).
  const obj = await client.completions.create({
    model: modelId, prompt: 'An object:', max_tokens: 200, temperature: 0,
    response_format: { type: 'json_object' },
  });
  const text = obj.choices[0].text;
  assert.ok(text.trimStart().startsWith('{'), JSON.stringify(text));
  if (obj.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
});

test('guided forms this engine cannot enforce, and two ways at once, are refused', async () => {
  const cases = [
    [{ guided_choice: ['a', 'b'] }, 'guided_choice'],
    [{ guided_regex: '[0-9]+' }, 'guided_regex'],
    [{ guided_grammar: 'root ::= "a"' }, 'guided_grammar'],
    [{ structured_outputs: { choice: ['a'] } }, 'structured_outputs.choice'],
    [{ guided_json: 'not a schema' }, 'guided_json'],
    [{ guided_json: schema, response_format: jsonSchemaFormat }, 'response_format'],
  ];
  for (const path of ['/v1/chat/completions', '/v1/completions']) {
    for (const [extra, param] of cases) {
      const body = path === '/v1/completions' ? { prompt: 'x', ...extra } : { messages, ...extra };
      const r = await post(tiny.base, path, body);
      assert.equal(r.status, 400, `${path} ${JSON.stringify(extra)}: ${r.text}`);
      assert.equal(r.json.error.param, param, r.text);
    }
  }
});
