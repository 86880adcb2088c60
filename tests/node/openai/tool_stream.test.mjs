// Tool-call arguments streamed as the model generates them (ABI 1.5 tool-call deltas,
// docs/status/tool-streaming.md), checked with the official openai npm SDK against `coli serve`
// on the k3_scripted test family (K3's real tokenizer, renderer and output parser around a
// scripted reply; tools/k3_scripted/script.json):
//  * "save a note" -> write_file {path, content, overwrite}: strings with quotes, a backslash,
//    a newline, a tab, non-ASCII and an emoji, and a boolean;
//  * "weather" -> get_weather {city, days}: a string and a number.
// Chat completions: the call arrives in MORE THAN ONE arguments delta (the first with id, type
// and name, later ones index + arguments only), and what the SDK's stream helper accumulates
// equals the non-streamed call's arguments. Responses: output_item.added (empty arguments),
// one function_call_arguments.delta per piece (more than one), .done / the final item equal to
// the non-streamed call's arguments; background + stream and a resumed stream give the same.
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_SCRIPTED_MODEL, COLI_SCRIPTED_PLUGIN_DIR.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { SCRIPTED, SCRIPTED_PLUGINS, startServer, stopServer } from './serve_helpers.mjs';

let scripted, client;

before(async () => {
  scripted = await startServer(SCRIPTED, { COLI_PLUGIN_DIR: SCRIPTED_PLUGINS });
  client = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await stopServer(scripted);
});

const fn = (name, properties) => ({
  type: 'function',
  function: { name, parameters: { type: 'object', properties } },
});
const chatTools = [
  fn('write_file', { path: { type: 'string' }, content: { type: 'string' }, overwrite: { type: 'boolean' } }),
  fn('get_weather', { city: { type: 'string' }, days: { type: 'number' } }),
];
const responsesTools = chatTools.map((t) => ({ type: 'function', ...t.function }));

const cases = [
  {
    ask: 'Please save a note about the menu.',
    name: 'write_file',
    args: {
      path: 'notes/caf\u00e9.md',
      content: '# Caf\u00e9 "menu"\nC:\\temp \u2014 \u4e2d\u6587 \u{1F600} tab\there\n',
      overwrite: true,
    },
  },
  { ask: 'What is the weather in Paris?', name: 'get_weather', args: { city: 'Paris', days: 3 } },
];

for (const c of cases) {
  const messages = [{ role: 'user', content: c.ask }];

  test(`chat completions: ${c.name}'s arguments stream in pieces that join to the whole`, async () => {
    const whole = await client.chat.completions.create({ model: 'k3_scripted', messages, tools: chatTools });
    assert.equal(whole.choices[0].finish_reason, 'tool_calls');
    const call = whole.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, c.name);
    assert.deepEqual(JSON.parse(call.function.arguments), c.args);

    // The raw chunks: OpenAI's shape of a streamed call.
    const stream = await client.chat.completions.create({
      model: 'k3_scripted', messages, tools: chatTools, stream: true,
    });
    const deltas = [];
    let finish = null;
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        for (const tc of ch.delta.tool_calls ?? []) deltas.push(tc);
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assert.equal(finish, 'tool_calls');
    assert.ok(deltas.length > 0);
    const [first, ...rest] = deltas;
    assert.equal(first.index, 0);
    assert.match(first.id, /^call_/);
    assert.equal(first.type, 'function');
    assert.equal(first.function.name, c.name);
    for (const d of rest) {
      assert.equal(d.index, 0);
      assert.equal(d.id, undefined, JSON.stringify(d));
      assert.equal(d.function.name, undefined, JSON.stringify(d));
    }
    const pieces = deltas.map((d) => d.function.arguments).filter((a) => a !== '');
    assert.ok(pieces.length > 1, `arguments arrived in ${pieces.length} piece(s): ${JSON.stringify(pieces)}`);
    assert.equal(pieces.join(''), call.function.arguments);

    // The SDK's stream helper accumulates the same call.
    const runner = client.chat.completions.stream({ model: 'k3_scripted', messages, tools: chatTools });
    const final = await runner.finalChatCompletion();
    const got = final.choices[0].message.tool_calls;
    assert.equal(got.length, 1);
    assert.equal(got[0].function.name, c.name);
    assert.equal(got[0].function.arguments, call.function.arguments);
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
  });

  test(`responses: ${c.name}'s arguments stream as function_call_arguments.delta events`, async () => {
    const whole = await client.responses.create({ model: 'k3_scripted', input: c.ask, tools: responsesTools });
    const item = whole.output.find((o) => o.type === 'function_call');
    assert.equal(item.name, c.name);
    assert.deepEqual(JSON.parse(item.arguments), c.args);

    const stream = client.responses.stream({ model: 'k3_scripted', input: c.ask, tools: responsesTools });
    const events = [];
    for await (const e of stream) events.push(e);
    const final = await stream.finalResponse();
    checkCallEvents(events, item.arguments, c.name);
    const finalItem = final.output.find((o) => o.type === 'function_call');
    assert.equal(finalItem.arguments, item.arguments);
    assert.equal(finalItem.status, 'completed');
  });
}

// The function_call item's events: added with empty arguments, MORE THAN ONE delta, each inside
// the item, joining to `args`; .done and output_item.done carry `args`.
function checkCallEvents(events, args, name) {
  const added = events.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
  assert.ok(added, 'no function_call item added');
  assert.equal(added.item.arguments, '');
  assert.equal(added.item.status, 'in_progress');
  assert.equal(added.item.name, name);
  const at = events.indexOf(added);
  const deltas = events.filter((e) => e.type === 'response.function_call_arguments.delta');
  assert.ok(deltas.length > 1, `arguments arrived in ${deltas.length} delta event(s)`);
  for (const d of deltas) {
    assert.equal(d.output_index, added.output_index);
    assert.equal(d.item_id, added.item.id);
    assert.ok(events.indexOf(d) > at);
  }
  assert.equal(deltas.map((d) => d.delta).join(''), args);
  const done = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.ok(events.indexOf(done) > events.indexOf(deltas.at(-1)));
  assert.equal(done.arguments, args);
  assert.equal(done.name, name);
  const itemDone = events.find((e) => e.type === 'response.output_item.done' && e.item.type === 'function_call');
  assert.equal(itemDone.item.arguments, args);
  assert.equal(itemDone.item.status, 'completed');
}

test('background + stream: the same argument events, and a resumed stream continues them', async () => {
  const c = cases[0];
  const whole = await client.responses.create({ model: 'k3_scripted', input: c.ask, tools: responsesTools });
  const args = whole.output.find((o) => o.type === 'function_call').arguments;

  const events = [];
  for await (const e of await client.responses.create({
    model: 'k3_scripted', input: c.ask, tools: responsesTools, background: true, stream: true,
  })) {
    events.push(e);
  }
  checkCallEvents(events, args, c.name);

  // Resuming after the function_call item opened replays the rest of the log: its deltas
  // complete the arguments.
  const id = events[0].response.id;
  const added = events.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
  const tail = [];
  for await (const e of await client.responses.retrieve(id, { stream: true, starting_after: added.sequence_number })) {
    tail.push(e);
  }
  assert.equal(tail[0].sequence_number, added.sequence_number + 1);
  const joined = tail.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.equal(joined, args);
});
