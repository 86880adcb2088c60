// vLLM's stop and streaming-usage extensions through the official `openai` npm SDK (as extra
// body fields) against a real `coli serve` on the tiny Kimi K3 fixture: min_tokens,
// stop_token_ids, ignore_eos, include_stop_str_in_output and stream_options
// .continuous_usage_stats, in chat completions and legacy completions. Random weights never
// stop on cue, so each stop check forces the token it is about with logit_bias +100 (the
// server's own /tokenize gives the ids): without the field under test the reply would end (or
// run) otherwise, which each test shows first.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { TINY, startServer, stopServer, post } from './serve_helpers.mjs';

let tiny, client, modelId, eom, hello, helloText;
const messages = [{ role: 'user', content: 'Say something.' }];

before(async () => {
  tiny = await startServer(TINY);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
  const special = await post(tiny.base, '/tokenize', { prompt: '<|end_of_msg|>', allow_special: true });
  assert.equal(special.json.tokens.length, 1, special.text);
  [eom] = special.json.tokens;  // K3's chat stop token
  const t = await post(tiny.base, '/tokenize', { prompt: ' hello' });
  hello = t.json.tokens[t.json.tokens.length - 1];
  helloText = (await post(tiny.base, '/detokenize', { tokens: [hello] })).json.prompt;
  assert.ok(helloText.length > 1, helloText);
});

after(async () => { await stopServer(tiny); });

const chat = (body) => client.chat.completions.create({
  model: modelId, messages, enable_thinking: false, temperature: 0, max_tokens: 12, ...body,
});

test('min_tokens: the stop token is not drawn before that many tokens', async () => {
  const bias = { logit_bias: { [eom]: 100 } };
  const plain = await chat(bias);
  assert.equal(plain.usage.completion_tokens, 1, 'the biased stop token ends it at once');
  assert.equal(plain.choices[0].finish_reason, 'stop');
  for (const stream of [false, true]) {
    let usage, finish;
    if (stream) {
      const s = await chat({ ...bias, min_tokens: 5, stream: true, stream_options: { include_usage: true } });
      for await (const c of s) {
        if (c.usage) usage = c.usage;
        if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
      }
    } else {
      const r = await chat({ ...bias, min_tokens: 5 });
      usage = r.usage;
      finish = r.choices[0].finish_reason;
    }
    // Five tokens, then the stop token (the sixth) as soon as it may be drawn.
    assert.equal(usage.completion_tokens, 6, `stream ${stream}`);
    assert.equal(finish, 'stop', `stream ${stream}`);
  }
  // n > 1: every choice waits (they step together).
  const many = await chat({ ...bias, min_tokens: 3, n: 2, temperature: 1, seed: 5 });
  assert.equal(many.usage.completion_tokens, 2 * 4);
});

test('ignore_eos: the reply runs to max_tokens', async () => {
  const r = await chat({ logit_bias: { [eom]: 100 }, ignore_eos: true, max_tokens: 7 });
  assert.equal(r.usage.completion_tokens, 7);
  assert.equal(r.choices[0].finish_reason, 'length');
  const c = await client.completions.create({
    model: modelId, prompt: 'Once', max_tokens: 6, temperature: 0, ignore_eos: true,
    logit_bias: { [eom]: 100 },
  });
  assert.equal(c.usage.completion_tokens, 6);
  assert.equal(c.choices[0].finish_reason, 'length');
});

test('stop_token_ids end the reply at that token (shown), min_tokens holds them back too', async () => {
  const bias = { logit_bias: { [hello]: 100 } };
  const plain = await chat(bias);
  assert.equal(plain.usage.completion_tokens, 12, 'the forced token repeats to max_tokens');
  const r = await chat({ ...bias, stop_token_ids: [hello] });
  assert.equal(r.usage.completion_tokens, 1);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.content, helloText);
  const held = await chat({ ...bias, stop_token_ids: [hello], min_tokens: 3 });
  assert.equal(held.usage.completion_tokens, 4);
  assert.ok(held.choices[0].message.content.endsWith(helloText));
  // With ignore_eos too: after min_tokens only the model's stop tokens stay held back.
  const both = await chat({ ...bias, stop_token_ids: [hello], min_tokens: 2, ignore_eos: true });
  assert.equal(both.usage.completion_tokens, 3);
  assert.equal(both.choices[0].finish_reason, 'stop');
  const c = await client.completions.create({
    model: modelId, prompt: 'Once', max_tokens: 6, temperature: 0, stop_token_ids: [hello],
    ...bias,
  });
  assert.equal(c.usage.completion_tokens, 1);
  assert.equal(c.choices[0].text, helloText);
  assert.equal(c.choices[0].finish_reason, 'stop');
});

test('include_stop_str_in_output keeps the matched stop string', async () => {
  const bias = { logit_bias: { [hello]: 100 } };
  const stop = helloText.slice(-2);  // the token's last two characters
  const cut = await chat({ ...bias, stop: [stop] });
  assert.equal(cut.choices[0].message.content, helloText.slice(0, -2));
  const kept = await chat({ ...bias, stop: [stop], include_stop_str_in_output: true });
  assert.equal(kept.choices[0].message.content, helloText);
  assert.equal(kept.choices[0].finish_reason, 'stop');
  const c = await client.completions.create({
    model: modelId, prompt: 'Once', max_tokens: 6, temperature: 0, stop: [stop],
    include_stop_str_in_output: true, ...bias,
  });
  assert.equal(c.choices[0].text, helloText);
});

test('bad values are refused naming the field', async () => {
  const cases = [
    [{ min_tokens: 20, max_tokens: 10 }, 'min_tokens'],
    [{ min_tokens: -1 }, 'min_tokens'],
    [{ stop_token_ids: 5 }, 'stop_token_ids'],
    [{ stop_token_ids: [-3] }, 'stop_token_ids'],
    [{ stop_token_ids: [1 << 30] }, 'stop_token_ids'],
    [{ ignore_eos: 'yes' }, 'ignore_eos'],
    [{ include_stop_str_in_output: 1 }, 'include_stop_str_in_output'],
  ];
  for (const [extra, param] of cases) {
    const r = await post(tiny.base, '/v1/chat/completions', { messages, max_tokens: 4, ...extra });
    assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
  }
  // The legacy API's default max_tokens (16) bounds min_tokens too (the host checks it).
  const r = await post(tiny.base, '/v1/completions', { prompt: 'Once', min_tokens: 20 });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'min_tokens', r.text);
});

test('stream_options.continuous_usage_stats: every chunk carries the usage so far', async () => {
  const check = async (stream, label) => {
    const usages = [];
    let last;
    for await (const c of stream) {
      if (c.choices.length) usages.push(c.usage);
      else last = c.usage;  // the final usage-only chunk
    }
    assert.ok(usages.length >= 3, label);
    for (const u of usages) {
      assert.equal(u.prompt_tokens, last.prompt_tokens, label);
      assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens, label);
    }
    const counts = usages.map((u) => u.completion_tokens);
    assert.deepEqual(counts, [...counts].sort((a, b) => a - b), `${label}: never decreasing`);
    assert.equal(counts.at(-1), last.completion_tokens, label);
  };
  const stream_options = { include_usage: true, continuous_usage_stats: true };
  await check(await client.chat.completions.create({
    // ignore_eos: a sampled stop token after one or two tokens would leave too few chunks.
    model: modelId, messages, enable_thinking: false, max_tokens: 6, ignore_eos: true, stream: true,
    stream_options,
  }), 'chat');
  await check(await client.completions.create({
    model: modelId, prompt: 'Once', max_tokens: 6, ignore_eos: true, stream: true, stream_options,
  }), 'completions');
  // Without include_usage it changes nothing (as vLLM's).
  for await (const c of await client.chat.completions.create({
    model: modelId, messages, max_tokens: 3, stream: true,
    stream_options: { continuous_usage_stats: true },
  })) {
    assert.equal(c.usage, undefined);
  }
});

test('truncate_prompt_tokens reads only the prompt\'s last tokens', async () => {
  const ids = (await post(tiny.base, '/tokenize', {
    prompt: 'The quick brown fox jumps over the lazy dog and runs far away into the hills',
  })).json.tokens;
  assert.ok(ids.length > 8);
  const last = ids.slice(-5);
  const cut = await client.completions.create({
    model: modelId, prompt: ids, max_tokens: 6, temperature: 0, truncate_prompt_tokens: 5,
  });
  const direct = await client.completions.create({
    model: modelId, prompt: last, max_tokens: 6, temperature: 0,
  });
  assert.equal(cut.usage.prompt_tokens, 5);
  assert.equal(cut.choices[0].text, direct.choices[0].text, 'the same as the last 5 tokens alone');
  const r = await chat({ truncate_prompt_tokens: 7 });
  assert.equal(r.usage.prompt_tokens, 7);
  // A prompt longer than the context is read from its end instead of refused.
  const long = Array.from({ length: 9000 }, (_, i) => ids[i % ids.length]);
  const refused = await post(tiny.base, '/v1/completions', { prompt: long, max_tokens: 2 });
  assert.equal(refused.status, 400, refused.text);
  const fits = await client.completions.create({
    model: modelId, prompt: long, max_tokens: 2, truncate_prompt_tokens: -1,
  });
  assert.ok(fits.usage.prompt_tokens < 9000 && fits.usage.prompt_tokens > 100, JSON.stringify(fits.usage));
  for (const [extra, param] of [[{ truncate_prompt_tokens: -2 }, 'truncate_prompt_tokens'],
    [{ truncate_prompt_tokens: 3, echo: true }, 'truncate_prompt_tokens']]) {
    const bad = await post(tiny.base, '/v1/completions', { prompt: 'x', ...extra });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, param, bad.text);
  }
});
