// OpenAI's Responses API (`client.responses.*` of the official openai npm SDK) against
// `coli serve` (tools/coli/serve_responses.h).
//
// Servers on free loopback ports:
//  * tiny: the tiny Kimi K3 fixture (random weights). Greedy decoding is a function of the exact
//    prompt tokens, so "same output as /v1/chat/completions for the equivalent messages" checks
//    that the request mapping renders the same prompt;
//  * tiny8: the same model decoding at 5 ms a token, for the mid-stream disconnect and the
//    background responses (--max-background 2); the last test stops it with background work
//    running;
//  * scripted: the k3_scripted test family (tools/k3_scripted): K3's real renderer and output
//    parser around a scripted reply, so a function_call really comes out and its output is really
//    rendered back (the reply changes once a tool message is in the prompt).
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL, COLI_SCRIPTED_MODEL,
// COLI_SCRIPTED_PLUGIN_DIR.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { TINY, SCRIPTED, SCRIPTED_PLUGINS, startServer, stopServer, post, poll } from './serve_helpers.mjs';

let tiny, tiny8, scripted, client, client8, toolClient, modelId;

before(async () => {
  [tiny, tiny8, scripted] = await Promise.all([
    startServer(TINY),
    startServer(TINY, { COLI_DECODE_DELAY_MS: '5' }, ['--max-background', '2']),
    startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS }),
  ]);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  client8 = new OpenAI({ baseURL: `${tiny8.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  toolClient = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
});

after(async () => {
  await Promise.all([stopServer(tiny), stopServer(tiny8), stopServer(scripted)]);
});

const question = 'Hello, who are you?';

// The text of a response's items of one type.
const reasoningOf = (r) => r.output.filter((o) => o.type === 'reasoning')
  .map((o) => o.content.map((c) => c.text).join('')).join('');
const messageOf = (r) => r.output.filter((o) => o.type === 'message')
  .map((o) => o.content.map((c) => c.text).join('')).join('');

// The finish a chat choice had, as the Responses status says it.
function checkStatus(response, finishReason) {
  if (finishReason === 'length') {
    assert.equal(response.status, 'incomplete');
    assert.deepEqual(response.incomplete_details, { reason: 'max_output_tokens' });
  } else {
    assert.equal(response.status, 'completed');
    assert.equal(response.incomplete_details, null);
  }
}

test('non-streaming: the same greedy output as the chat endpoint, with and without thinking', async () => {
  for (const effort of [undefined, 'none']) {
    const chat = await client.chat.completions.create({
      model: modelId, max_tokens: 12, temperature: 0,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: question }],
      ...(effort ? { reasoning_effort: effort } : {}),
    });
    const r = await client.responses.create({
      model: modelId, instructions: 'Be brief.', input: question, max_output_tokens: 12,
      temperature: 0, ...(effort ? { reasoning: { effort } } : {}),
    });
    const c = chat.choices[0];
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.model, modelId);
    assert.equal(r.instructions, 'Be brief.');
    assert.equal(r.max_output_tokens, 12);
    assert.equal(reasoningOf(r), c.message.reasoning_content ?? '');
    assert.equal(messageOf(r), c.message.content ?? '');
    assert.equal(r.output_text, c.message.content ?? '');  // computed by the SDK from the items
    if (effort === 'none') assert.ok(r.output_text.length > 0, 'no answer text to compare');
    else assert.ok(reasoningOf(r).length > 0, 'no reasoning text to compare');
    checkStatus(r, c.finish_reason);
    assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
    assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    assert.equal(r.usage.input_tokens_details.cached_tokens >= 0, true);
    const reasoningTokens = r.usage.output_tokens_details.reasoning_tokens;
    if (effort === 'none') assert.equal(reasoningTokens, 0);
    else assert.ok(reasoningTokens > 0 && reasoningTokens <= r.usage.output_tokens);
    for (const item of r.output) {
      if (item.type === 'message') {
        assert.match(item.id, /^msg_/);
        assert.equal(item.role, 'assistant');
        assert.deepEqual(item.content.map((p) => p.type), ['output_text']);
        assert.deepEqual(item.content[0].annotations, []);
      }
    }
  }
  // output_text is the SDK's convenience: the server does not send it.
  const raw = await post(tiny.base, '/v1/responses', {
    model: modelId, input: question, max_output_tokens: 2, temperature: 0,
  });
  assert.equal(raw.status, 200);
  assert.equal('output_text' in raw.json, false);
});

// Streams through responses.stream() and checks what the SDK's accumulator does not: sequence
// numbers 0, 1, 2, ...; lifecycle order; every delta inside its item's added/done pair.
async function streamed(c, params) {
  const stream = c.responses.stream(params);
  const events = [];
  for await (const e of stream) events.push(e);
  const final = await stream.finalResponse();
  events.forEach((e, i) => assert.equal(e.sequence_number, i, JSON.stringify(e)));
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1).type));
  assert.equal(events.at(-1).response.id, events[0].response.id);
  const open = new Set();
  for (const e of events.slice(2, -1)) {
    if (e.type === 'response.output_item.added') open.add(e.output_index);
    else if (e.type === 'response.output_item.done') open.delete(e.output_index);
    else assert.ok(open.has(e.output_index), `${e.type} outside its item`);
  }
  assert.equal(open.size, 0);
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  const thought = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
  return { events, final, text, thought };
}

test('streaming: responses.stream() deltas add up to the final response, in sequence', async () => {
  for (const effort of [undefined, 'none']) {
    const params = {
      model: modelId, input: question, max_output_tokens: 16, temperature: 0,
      ...(effort ? { reasoning: { effort } } : {}),
    };
    const whole = await client.responses.create(params);
    const { events, final, text, thought } = await streamed(client, params);
    assert.equal(text, final.output_text);
    assert.equal(thought, reasoningOf(final));
    assert.equal(final.output_text, whole.output_text);
    assert.equal(reasoningOf(final), reasoningOf(whole));
    assert.equal(final.status, whole.status);
    // (cached_tokens may differ: the host may reuse the earlier request's prompt state.)
    for (const k of ['input_tokens', 'output_tokens', 'total_tokens']) assert.equal(final.usage[k], whole.usage[k]);
    assert.deepEqual(final.usage.output_tokens_details, whole.usage.output_tokens_details);
    assert.ok((effort ? text : thought).length > 0);
    // The done events carry the whole texts.
    const done = events.filter((e) => e.type === 'response.output_text.done').map((e) => e.text);
    assert.equal(done.join(''), text);
  }
  // create({stream: true}) yields the same events to a plain iterator.
  const stream = await client.responses.create({
    model: modelId, input: question, max_output_tokens: 4, temperature: 0, stream: true,
  });
  const types = [];
  for await (const e of stream) types.push(e.type);
  assert.equal(types[0], 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.join());
});

test('max_output_tokens: status incomplete with reason max_output_tokens (plain and streamed)', async () => {
  const params = { model: modelId, input: question, max_output_tokens: 3, temperature: 0 };
  const r = await client.responses.create(params);
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.usage.output_tokens, 3);
  assert.equal(r.output.at(-1).status, 'incomplete');
  const { events, final } = await streamed(client, params);
  assert.equal(events.at(-1).type, 'response.incomplete');
  assert.equal(final.status, 'incomplete');
  assert.deepEqual(final.incomplete_details, { reason: 'max_output_tokens' });
});

const weatherTool = {
  type: 'function', name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const chatWeatherTool = {
  type: 'function',
  function: { name: weatherTool.name, description: weatherTool.description, parameters: weatherTool.parameters },
};

test('function_call + function_call_output items render as the chat endpoint\'s tool messages', async () => {
  const ask = 'What is the weather in Paris?';
  const items = [
    { role: 'user', content: [{ type: 'input_text', text: ask }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c": 21}' },
  ];
  const messages = [
    { role: 'user', content: ask },
    { role: 'assistant', content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
  ];
  const tokens = await post(tiny.base, '/tokenize', { messages, tools: [chatWeatherTool] });
  assert.equal(tokens.status, 200);
  const counted = await client.responses.inputTokens.count({ model: modelId, input: items, tools: [weatherTool] });
  assert.equal(counted.object, 'response.input_tokens');
  assert.equal(counted.input_tokens, tokens.json.count);
  // Same prompt tokens: the same greedy continuation (random weights react to any difference).
  const chat = await client.chat.completions.create({
    model: modelId, messages, tools: [chatWeatherTool], max_tokens: 8, temperature: 0,
  });
  const r = await client.responses.create({
    model: modelId, input: items, tools: [weatherTool], max_output_tokens: 8, temperature: 0,
  });
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(reasoningOf(r), chat.choices[0].message.reasoning_content ?? '');
  assert.equal(r.output_text, chat.choices[0].message.content ?? '');
  assert.deepEqual(r.tools, [weatherTool]);
  // Without the tool output the prompt is shorter: the count follows the items.
  const fewer = await client.responses.inputTokens.count({ model: modelId, input: items.slice(0, 2), tools: [weatherTool] });
  assert.ok(fewer.input_tokens < counted.input_tokens);
});

test('tool round trip on the scripted model: function_call out, output back, previous_response_id', async () => {
  const tools = [{ ...weatherTool, parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'number' } } } }];
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await toolClient.responses.create({ model: 'k3_scripted', input: ask, tools });
  assert.equal(first.status, 'completed');
  assert.deepEqual(first.output.map((o) => o.type), ['reasoning', 'function_call']);
  assert.equal(reasoningOf(first), 'I should call the weather tool.');
  const call = first.output[1];
  assert.match(call.call_id, /^call_/);
  assert.match(call.id, /^fc_/);
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris', days: 3 });
  assert.equal(first.output_text, '');

  // The client sends the whole conversation back (the SDK's documented pattern) ...
  const result = { type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": 21}' };
  const second = await toolClient.responses.create({
    model: 'k3_scripted', input: [...ask, ...first.output, result], tools,
  });
  assert.equal(second.output_text, 'It is 21 degrees in Paris.');
  assert.equal(reasoningOf(second), 'The tool answered.');
  // ... or only the new item after previous_response_id: the same prompt either way.
  const chained = await toolClient.responses.create({
    model: 'k3_scripted', previous_response_id: first.id, input: [result], tools,
  });
  assert.equal(chained.previous_response_id, first.id);
  assert.equal(chained.output_text, 'It is 21 degrees in Paris.');
  assert.equal(chained.usage.input_tokens, second.usage.input_tokens);
  // And both equal the chat endpoint's rendering of the same turn.
  const chatTokens = await post(scripted.base, '/tokenize', {
    tools: tools.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.parameters } })),
    messages: [...ask,
      { role: 'assistant', content: null, reasoning_content: 'I should call the weather tool.',
        tool_calls: [{ id: call.call_id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
      { role: 'tool', tool_call_id: call.call_id, content: '{"temp_c": 21}' }],
  });
  assert.equal(chatTokens.json.count, second.usage.input_tokens);

  // Stored responses: GET returns the same object; DELETE removes it.
  const got = await toolClient.responses.retrieve(first.id);
  assert.deepEqual(got, first);
  await toolClient.responses.delete(first.id);
  await assert.rejects(toolClient.responses.retrieve(first.id), (e) => e.status === 404);
  await assert.rejects(
    toolClient.responses.create({ model: 'k3_scripted', previous_response_id: first.id, input: [result] }),
    (e) => e.status === 400 && e.param === 'previous_response_id' && e.code === 'previous_response_not_found');
  // store: false keeps nothing.
  const unstored = await toolClient.responses.create({ model: 'k3_scripted', input: 'hi', store: false });
  assert.equal(unstored.store, false);
  assert.equal(unstored.output_text, 'Hello from the script.');
  await assert.rejects(toolClient.responses.retrieve(unstored.id), (e) => e.status === 404);
});

test('streamed function call (scripted model): argument events and the final item', async () => {
  const { events, final } = await streamed(toolClient, {
    model: 'k3_scripted', input: 'weather in Paris?', tools: [weatherTool],
  });
  const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  const done = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 3 });
  assert.equal(done.arguments, args);
  assert.equal(done.name, 'get_weather');
  assert.equal(final.status, 'completed');
  assert.deepEqual(final.output.map((o) => o.type), ['reasoning', 'function_call']);
  assert.equal(final.output[1].arguments, args);
  assert.equal(final.output[1].status, 'completed');
});

test('bad requests: 400 naming the field, 404 for another model', async () => {
  const m = modelId;
  const cases = [
    [{ model: m, input: 'x', frobnicate: true }, 'frobnicate'],
    [{ model: m, input: 'x', background: true, store: false }, 'background'],
    [{ model: m, input: 'x', top_logprobs: 21 }, 'top_logprobs'],
    [{ model: m, input: 'x', top_logprobs: -1 }, 'top_logprobs'],
    [{ model: m, input: 'x', top_logprobs: 2.5 }, 'top_logprobs'],
    [{ model: m, input: 'x', conversation: 'conv_1' }, 'conversation'],
    [{ model: m }, 'input'],
    [{ model: m, input: [{ type: 'web_search_call', id: 'ws_1' }] }, 'input[0].type'],
    [{ model: m, input: [{ role: 'robot', content: 'x' }] }, 'input[0].role'],
    [{ model: m, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x' }] }] }, 'input[0].content[0].type'],
    [{ model: m, input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0].type'],
    [{ model: m, input: 'x', tool_choice: 'sometimes' }, 'tool_choice'],
    [{ model: m, input: 'x', text: { format: { type: 'xml' } } }, 'text.format.type'],
    [{ model: m, input: 'x', temperature: 5 }, 'temperature'],
    [{ model: m, input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    [{ model: m, input: 'x', include: ['reasoning.encrypted_content'] }, 'include'],
    // Refused by the model family's renderer at the host, restated in this API's names.
    [{ model: m, input: 'x', reasoning: { effort: 'medium' } }, 'reasoning.effort'],
    [{ model: m, input: [{ role: 'user', content: 'a' },
      { type: 'function_call_output', call_id: 'nobody', output: 'o' }] }, 'input[1]'],
  ];
  for (const [body, param] of cases) {
    const r = await post(tiny.base, '/v1/responses', body);
    assert.equal(r.status, 400, `${JSON.stringify(body)} -> ${r.text}`);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, param, `${JSON.stringify(body)} -> ${r.text}`);
    assert.ok(r.json.error.message.length > 0);
  }
  // Through the SDK: an APIError carrying the param; streaming requests are refused before
  // any event.
  await assert.rejects(client.responses.create({ model: m, input: 'x', temperature: 9 }),
    (e) => e.status === 400 && e.param === 'temperature');
  await assert.rejects(client.responses.create({ model: m, input: 'x', temperature: 9, stream: true }),
    (e) => e.status === 400 && e.param === 'temperature');
  await assert.rejects(client.responses.create({ model: 'no-such-model', input: 'x' }),
    (e) => e.status === 404 && e.code === 'model_not_found' && e.param === 'model');
  // The server still answers.
  const ok = await client.responses.create({ model: m, input: 'x', max_output_tokens: 1 });
  assert.equal(ok.usage.output_tokens, 1);
});

// ---- logprobs ----------------------------------------------------------------------------------

const logprobParams = {
  model: undefined, input: question, max_output_tokens: 10, temperature: 0,
  reasoning: { effort: 'none' }, include: ['message.output_text.logprobs'], top_logprobs: 3,
};

// Same greedy tokens on both endpoints; the logprobs agree to 1e-4 (the chat request may be
// computed from a cold prompt and this one from kept state: the same math, maybe other sums).
function checkLogprobs(got, want) {
  assert.equal(got.length, want.length);
  assert.ok(got.length > 0, 'no tokens to compare');
  got.forEach((g, i) => {
    const w = want[i];
    assert.equal(g.token, w.token, `token ${i}`);
    assert.deepEqual(g.bytes, w.bytes, `bytes ${i}`);
    assert.ok(Math.abs(g.logprob - w.logprob) <= 1e-4, `logprob ${i}: ${g.logprob} vs ${w.logprob}`);
    assert.ok(g.logprob <= 0);
    assert.equal(g.top_logprobs.length, w.top_logprobs.length, `top ${i}`);
    g.top_logprobs.forEach((t, k) => {
      assert.equal(t.token, w.top_logprobs[k].token, `top ${i}.${k}`);
      assert.deepEqual(t.bytes, w.top_logprobs[k].bytes);
      assert.ok(Math.abs(t.logprob - w.top_logprobs[k].logprob) <= 1e-4);
    });
  });
}

test('logprobs: include + top_logprobs give the chat endpoint\'s entries, plain and streamed', async () => {
  const params = { ...logprobParams, model: modelId };
  const chat = await client.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content: question }], max_tokens: 10,
    temperature: 0, reasoning_effort: 'none', logprobs: true, top_logprobs: 3,
  });
  const want = chat.choices[0].logprobs.content;
  assert.ok(want.every((e) => e.top_logprobs.length === 3));
  const r = await client.responses.create(params);
  assert.equal(r.top_logprobs, 3);
  assert.equal(r.output_text, chat.choices[0].message.content);
  const part = r.output.find((o) => o.type === 'message').content[0];
  checkLogprobs(part.logprobs, want);
  const bytes = Uint8Array.from(part.logprobs.flatMap((e) => e.bytes));
  assert.equal(new TextDecoder().decode(bytes), r.output_text);

  // Streamed: each output_text.delta carries its tokens' entries (token, logprob, top_logprobs);
  // together they are the final part's, and the done event repeats them.
  const { events, final, text } = await streamed(client, params);
  assert.equal(text, r.output_text);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  const fromDeltas = deltas.flatMap((e) => e.logprobs);
  assert.ok(deltas.every((e) => Array.isArray(e.logprobs)));
  const finalPart = events.at(-1).response.output.find((o) => o.type === 'message').content[0];
  checkLogprobs(finalPart.logprobs, want);
  assert.deepEqual(fromDeltas, finalPart.logprobs.map((e) => ({
    token: e.token, logprob: e.logprob,
    top_logprobs: e.top_logprobs.map((t) => ({ token: t.token, logprob: t.logprob })),
  })));
  const done = events.find((e) => e.type === 'response.output_text.done');
  assert.deepEqual(done.logprobs, fromDeltas);
  assert.equal(final.output_text, r.output_text);

  // include alone: the sampled token's logprob without alternatives; neither: no entries.
  const only = await client.responses.create({ ...params, top_logprobs: undefined });
  const onlyPart = only.output.find((o) => o.type === 'message').content[0];
  checkLogprobs(onlyPart.logprobs, want.map((e) => ({ ...e, top_logprobs: [] })));
  const none = await client.responses.create({ ...params, include: undefined, top_logprobs: undefined });
  assert.deepEqual(none.output.find((o) => o.type === 'message').content[0].logprobs, []);
  for (const bad of [21, -1, 1.5, '3']) {
    await assert.rejects(client.responses.create({ ...params, top_logprobs: bad }),
      (e) => e.status === 400 && e.param === 'top_logprobs', `top_logprobs ${bad}`);
  }
});

// ---- input items -------------------------------------------------------------------------------

test('input_items: the stored input as items, paged by the SDK in both orders; 404 unknown', async () => {
  const items = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: [{ type: 'input_text', text: 'What is the weather in Paris?' }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}', id: 'fc_given' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c": 21}' },
    { role: 'user', content: 'And tomorrow?' },
  ];
  const r = await client.responses.create({
    model: modelId, input: items, tools: [weatherTool], max_output_tokens: 2, temperature: 0,
  });
  // The SDK follows `after` = the last id of each page until has_more is false.
  const asc = [];
  for await (const item of client.responses.inputItems.list(r.id, { limit: 2, order: 'asc' })) asc.push(item);
  assert.equal(asc.length, items.length);
  assert.deepEqual(asc.map((i) => i.type), ['message', 'message', 'function_call', 'function_call_output', 'message']);
  assert.deepEqual(asc.map((i) => i.role ?? null), ['system', 'user', null, null, 'user']);
  assert.deepEqual(asc[0].content, [{ type: 'input_text', text: 'Be brief.' }]);
  assert.deepEqual(asc[1].content, items[1].content);
  assert.equal(asc[2].id, 'fc_given');
  assert.equal(asc[2].arguments, '{"city":"Paris"}');
  assert.equal(asc[3].output, '{"temp_c": 21}');
  assert.ok(asc.every((i) => typeof i.id === 'string' && i.status === 'completed'));
  assert.equal(new Set(asc.map((i) => i.id)).size, items.length);
  // The default order is desc: newest first.
  const page = await client.responses.inputItems.list(r.id);
  assert.deepEqual(page.data.map((i) => i.id), asc.map((i) => i.id).reverse());
  assert.equal(page.has_more, false);
  const raw = await (await fetch(`${tiny.base}/v1/responses/${r.id}/input_items?limit=2`)).json();
  assert.equal(raw.object, 'list');
  assert.equal(raw.first_id, asc[4].id);
  assert.equal(raw.last_id, asc[3].id);
  assert.equal(raw.has_more, true);
  const bad = await fetch(`${tiny.base}/v1/responses/${r.id}/input_items?limit=0`);
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'limit');
  await assert.rejects(client.responses.inputItems.list('resp_nope'), (e) => e.status === 404);
  // store: false keeps nothing to list.
  const unstored = await client.responses.create({ model: modelId, input: 'x', max_output_tokens: 1, store: false });
  await assert.rejects(client.responses.inputItems.list(unstored.id), (e) => e.status === 404);
});

// ---- background --------------------------------------------------------------------------------

test('background: returns at once, polls to the foreground output; input_items while running', async () => {
  const params = { model: modelId, input: question, max_output_tokens: 16, temperature: 0 };
  const foreground = await client.responses.create(params);
  const queued = await client.responses.create({ ...params, background: true });
  assert.equal(queued.background, true);
  assert.ok(['queued', 'in_progress'].includes(queued.status), queued.status);
  assert.deepEqual(queued.output, []);
  assert.equal(queued.usage, null);
  const items = await client.responses.inputItems.list(queued.id);
  assert.equal(items.data.length, 1);
  const done = await poll(client, queued.id);
  assert.equal(done.id, queued.id);
  assert.equal(done.background, true);
  assert.equal(done.status, foreground.status);
  assert.equal(done.output_text, foreground.output_text);
  assert.equal(reasoningOf(done), reasoningOf(foreground));
  for (const k of ['input_tokens', 'output_tokens', 'total_tokens']) assert.equal(done.usage[k], foreground.usage[k]);
  // A finished background response continues like any other, and cannot be cancelled.
  const next = await client.responses.create({ model: modelId, previous_response_id: done.id, input: 'More?', max_output_tokens: 1 });
  assert.equal(next.previous_response_id, done.id);
  await assert.rejects(client.responses.cancel(done.id), (e) => e.status === 400 && /completed|incomplete/.test(e.message));
  // Only background responses can be cancelled; unknown ids are 404.
  await assert.rejects(client.responses.cancel(foreground.id), (e) => e.status === 400 && /background/.test(e.message));
  await assert.rejects(client.responses.cancel('resp_nope'), (e) => e.status === 404);
  // Refused: background without store.
  await assert.rejects(client.responses.create({ ...params, background: true, store: false }),
    (e) => e.status === 400 && e.param === 'background');
});

test('background: cancel stops the generation at the host; the bound gives 429', async () => {
  const long = { model: modelId, input: question, max_output_tokens: 100000, temperature: 0, background: true };
  const before = await metrics(tiny8.base);
  const a = await client8.responses.create(long);
  const b = await client8.responses.create(long);
  // --max-background 2: a third is refused while both run.
  await assert.rejects(client8.responses.create(long),
    (e) => e.status === 429 && e.param === 'background' && /max-background/.test(e.message));
  // Continuing a response that has not finished is refused.
  await assert.rejects(client8.responses.create({ model: modelId, previous_response_id: a.id, input: 'x' }),
    (e) => e.status === 400 && e.param === 'previous_response_id');
  for (let i = 0; i < 200 && (await client8.responses.retrieve(a.id)).status !== 'in_progress'; i++) {
    await new Promise((res) => setTimeout(res, 20));
  }
  const cancelled = await client8.responses.cancel(a.id);
  assert.equal(cancelled.status, 'cancelled');
  assert.equal(cancelled.id, a.id);
  // (retrieve adds the SDK's output_text; cancel returns the plain object.)
  const { output_text: _, ...retrieved } = await client8.responses.retrieve(a.id);
  assert.deepEqual(retrieved, cancelled);
  assert.deepEqual(await client8.responses.cancel(a.id), cancelled);  // idempotent
  // A slot is free again.
  const c = await client8.responses.create(long);
  for (const id of [b.id, c.id]) assert.equal((await client8.responses.cancel(id)).status, 'cancelled');
  // DELETE of a cancelled one removes it.
  await client8.responses.delete(b.id);
  await assert.rejects(client8.responses.retrieve(b.id), (e) => e.status === 404);
  let value;
  for (let i = 0; i < 100; i++) {
    value = await metrics(tiny8.base);
    if (value('coli_requests_active') === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(value('coli_requests_active'), 0);
  assert.ok(value('coli_requests_cancelled_total') >= before('coli_requests_cancelled_total') + 3);
  const tokens = value('coli_completion_tokens_total');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await metrics(tiny8.base))('coli_completion_tokens_total'), tokens);
});

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  return (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
}

// ---- background + stream, resumable streams, partial output --------------------------------------

// Reads an SDK stream to its end (or until `stop(events)` says so, which closes it).
async function collect(stream, stop = () => false) {
  const events = [];
  for await (const e of stream) {
    events.push(e);
    if (stop(events)) break;
  }
  return events;
}

// The text of each output item as the delta events built it, by output_index.
function deltaTexts(events) {
  const texts = [];
  for (const e of events) {
    if (e.type === 'response.output_text.delta' || e.type === 'response.reasoning_text.delta') {
      texts[e.output_index] = (texts[e.output_index] ?? '') + e.delta;
    }
  }
  return texts;
}

test('background + stream: the POST streams from 0; cut, resumed and replayed streams are the same events; the job outlives its client', async () => {
  const params = { model: modelId, input: question, max_output_tokens: 40, temperature: 0 };
  const foreground = await client8.responses.create(params);
  // Cut the POST's stream after 8 events (breaking out of the loop closes the connection).
  const head = await collect(await client8.responses.create({ ...params, background: true, stream: true }),
    (ev) => ev.length >= 8);
  assert.equal(head.length, 8);
  assert.deepEqual(head.slice(0, 3).map((e) => e.type), ['response.created', 'response.queued', 'response.in_progress']);
  assert.equal(head[0].response.status, 'queued');
  assert.equal(head[0].response.background, true);
  assert.equal(head[2].response.status, 'in_progress');
  const id = head[0].response.id;
  const last = head.at(-1).sequence_number;
  // Resumed after the last event seen: live events (or replayed ones, if it finished) to the end.
  const tail = await collect(await client8.responses.retrieve(id, { stream: true, starting_after: last }));
  assert.equal(tail[0].sequence_number, last + 1);
  assert.equal(tail.at(-1).type, `response.${foreground.status}`);  // completed / incomplete
  // The whole stream again (the SDK's retrieve without starting_after) = head + tail, event by event.
  const whole = await collect(await client8.responses.retrieve(id, { stream: true }));
  assert.deepEqual([...head, ...tail], whole);
  whole.forEach((e, i) => assert.equal(e.sequence_number, i));
  // It completed with the foreground response's greedy output, and is stored as such.
  const done = whole.at(-1).response;
  assert.equal(done.status, foreground.status);
  assert.equal(messageOf(done), messageOf(foreground));
  assert.equal(reasoningOf(done), reasoningOf(foreground));
  assert.equal(done.usage.output_tokens, foreground.usage.output_tokens);
  const texts = deltaTexts(whole);
  done.output.forEach((item, i) => {
    if (item.type !== 'function_call') assert.equal(texts[i] ?? '', item.content.map((c) => c.text).join(''));
  });
  const { output_text: _, ...stored } = await client8.responses.retrieve(id);
  assert.deepEqual(stored, done);
  // The SDK's stream helper resumes from a cursor (it replays from 0 and filters).
  const helper = client8.responses.stream({ response_id: id, starting_after: last });
  const seen = [];
  helper.on('event', (e) => seen.push(e.sequence_number));
  const final = await helper.finalResponse();
  assert.deepEqual(seen, tail.map((e) => e.sequence_number));
  assert.equal(final.output_text, foreground.output_text);
  // A follow-up continues it like any other.
  const next = await client8.responses.create({ model: modelId, previous_response_id: id, input: 'More?', max_output_tokens: 1 });
  assert.equal(next.previous_response_id, id);
});

test('partial output: GET of a running background response; cancel ends its resumed streams', async () => {
  const long = { model: modelId, input: question, max_output_tokens: 100000, temperature: 0, background: true, stream: true };
  const post = await client8.responses.create(long);
  const it = post[Symbol.asyncIterator]();
  const events = [];
  while (events.filter((e) => e.type.endsWith('.delta')).length < 6) events.push((await it.next()).value);
  const id = events[0].response.id;
  // The output so far: each item's text starts with what the deltas read so far gave.
  const partial = await client8.responses.retrieve(id);
  assert.equal(partial.status, 'in_progress');
  assert.equal(partial.usage, null);
  const texts = deltaTexts(events);
  assert.ok(texts.length > 0 && partial.output.length >= texts.length);
  texts.forEach((t, i) => {
    const item = partial.output[i];
    assert.ok(item.content[0].text.startsWith(t), `${item.content[0].text} / ${t}`);
  });
  assert.equal(partial.output.at(-1).status, 'in_progress');
  // A resumed stream, open while it runs: cancel ends it (and the POST's) cleanly.
  const resumed = await client8.responses.retrieve(id, { stream: true, starting_after: 2 });
  const resumedIt = resumed[Symbol.asyncIterator]();
  const firstResumed = (await resumedIt.next()).value;
  assert.equal(firstResumed.sequence_number, 3);
  const cancelled = await client8.responses.cancel(id);
  assert.equal(cancelled.status, 'cancelled');
  const rest = [];
  for (let r = await resumedIt.next(); !r.done; r = await resumedIt.next()) rest.push(r.value);
  for (let r = await it.next(); !r.done; r = await it.next()) events.push(r.value);
  // Both end with the same last event; its text is what the cancelled object holds.
  assert.equal(rest.at(-1).sequence_number, events.at(-1).sequence_number);
  const cut = deltaTexts(events);
  cancelled.output.forEach((item, i) => {
    if (item.type !== 'function_call') assert.equal(item.content[0].text, cut[i] ?? '');
  });
  assert.equal(cancelled.output.at(-1).status, 'incomplete');
  // A stream of the cancelled response replays its events and ends.
  const replay = await collect(await client8.responses.retrieve(id, { stream: true }));
  assert.deepEqual(replay.slice(3), [firstResumed, ...rest]);
});

test('streamed GET: only background + stream responses; starting_after checked; 404 unknown', async () => {
  const plain = await client.responses.create({ model: modelId, input: 'x', max_output_tokens: 2 });
  await assert.rejects(client.responses.retrieve(plain.id, { stream: true }),
    (e) => e.status === 400 && e.param === 'stream');
  const bg = await client.responses.create({ model: modelId, input: 'x', max_output_tokens: 2, background: true });
  await poll(client, bg.id);
  await assert.rejects(client.responses.retrieve(bg.id, { stream: true }),
    (e) => e.status === 400 && e.param === 'stream');
  await assert.rejects(client.responses.retrieve('resp_nope', { stream: true }), (e) => e.status === 404);
  const streamed = await collect(await client.responses.create({
    model: modelId, input: 'x', max_output_tokens: 2, background: true, stream: true,
  }));
  const id = streamed[0].response.id;
  for (const bad of ['-1', 'x', '1.5']) {
    const r = await fetch(`${tiny.base}/v1/responses/${id}?stream=true&starting_after=${bad}`);
    assert.equal(r.status, 400);
    assert.equal((await r.json()).error.param, 'starting_after');
  }
  const r = await fetch(`${tiny.base}/v1/responses/${id}?stream=maybe`);
  assert.equal(r.status, 400);
  // Past the last event of a finished response: an empty stream.
  const none = await collect(await client.responses.retrieve(id, { stream: true, starting_after: 10000 }));
  assert.deepEqual(none, []);
  // stream=false is the plain object.
  assert.equal((await client.responses.retrieve(id, { stream: false })).id, id);
});

test('input_items of a follow-up: the previous response\'s items and output, then its own', async () => {
  const first = await client.responses.create({ model: modelId, input: 'a', max_output_tokens: 3 });
  const second = await client.responses.create({
    model: modelId, previous_response_id: first.id, max_output_tokens: 3,
    input: [{ role: 'user', content: 'c', id: 'msg_c' }],
  });
  const firstItems = [];
  for await (const item of client.responses.inputItems.list(first.id, { order: 'asc' })) firstItems.push(item);
  const items = [];
  for await (const item of client.responses.inputItems.list(second.id, { order: 'asc' })) items.push(item);
  assert.deepEqual(items.map((i) => i.id), [...firstItems.map((i) => i.id), ...first.output.map((o) => o.id), 'msg_c']);
  assert.deepEqual(items.slice(firstItems.length, -1), first.output);
});

test('a client that disconnects mid-stream cancels its generation', async () => {
  const before = await metrics(tiny8.base);
  const controller = new AbortController();
  const stream = await client8.responses.create({
    model: modelId, input: question, max_output_tokens: 100000, temperature: 0, stream: true,
  }, { signal: controller.signal });
  let deltas = 0;
  try {
    for await (const e of stream) {
      if (e.type.endsWith('.delta')) deltas++;
      if (deltas >= 3) controller.abort();
    }
  } catch (e) {
    assert.equal(e.name, 'AbortError');
  }
  assert.ok(deltas >= 3);
  let value;
  for (let i = 0; i < 100; i++) {
    value = await metrics(tiny8.base);
    if (value('coli_requests_active') === 0 &&
        value('coli_http_client_disconnects_total') > before('coli_http_client_disconnects_total')) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(value('coli_requests_active'), 0);
  assert.equal(value('coli_http_streams_active'), 0);
  assert.ok(value('coli_requests_cancelled_total') > before('coli_requests_cancelled_total'));
  const tokens = value('coli_completion_tokens_total');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await metrics(tiny8.base))('coli_completion_tokens_total'), tokens);
});

test('shutdown with background responses and streams open: the server stops at once', async () => {
  const long = { model: modelId, input: question, max_output_tokens: 100000, temperature: 0 };
  await client8.responses.create({ ...long, background: true });
  // A background response streamed by its POST and by a resumed GET, and a foreground stream:
  // each read up to its first delta, then left reading.
  const reading = async (stream) => {
    const it = stream[Symbol.asyncIterator]();
    const head = [];
    do head.push((await it.next()).value); while (!head.at(-1).type.endsWith('.delta'));
    const rest = (async () => {
      try {
        while (!(await it.next()).done);
        return 'ended';
      } catch {
        return 'closed';
      }
    })();
    return { head, rest };
  };
  const post = await reading(await client8.responses.create({ ...long, background: true, stream: true }));
  const id = post.head[0].response.id;
  const resumed = await reading(await client8.responses.retrieve(id, { stream: true, starting_after: 0 }));
  assert.equal(resumed.head[0].sequence_number, 1);
  const fg = await reading(await client8.responses.create({ ...long, stream: true }));
  const t0 = Date.now();
  const server = tiny8;
  tiny8 = null;  // after() has nothing left to stop
  await stopServer(server);  // resolves on exit; a hang would time the test out
  assert.ok(Date.now() - t0 < 10000, `took ${Date.now() - t0} ms`);
  assert.equal(server.proc.exitCode, 0);
  for (const s of [post, resumed, fg]) assert.ok(['ended', 'closed'].includes(await s.rest));
});
