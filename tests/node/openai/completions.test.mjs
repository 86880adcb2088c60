// /v1/completions in the forms real clients send, through the official `openai` npm SDK against
// `coli serve` on the tiny K3 fixture: `prompt` as token ids, as several strings or several id
// arrays (n choices each, index = prompt * n + choice), `echo` (streamed or not) and the
// scoring request lm-evaluation-harness's `local-completions` sends for loglikelihood tasks:
// token-id prompts in a batch, `echo: true, logprobs: 1, max_tokens: 1, temperature: 0`, reading
// `token_logprobs[ctxlen:-1]` and `top_logprobs`. The prompt tokens' logprobs are checked
// against an independent path: the logprob the server reports when it generates that same token
// after the same prefix (a one-token request whose logit_bias forces it; reported logprobs are
// the raw model's), and `echo` with `max_tokens: 0` generates nothing.
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { TINY, startServer, stopServer, post } from './serve_helpers.mjs';

let tiny, client, modelId;

before(async () => {
  tiny = await startServer(TINY);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
});

after(async () => { await stopServer(tiny); });

async function tokenize(text) {
  const r = await post(tiny.base, '/tokenize', { prompt: text });
  assert.equal(r.status, 200, r.text);
  return r.json.tokens;
}

const greedy = { temperature: 0, max_tokens: 4 };

test('a prompt of token ids answers as its text does', async () => {
  const text = 'The capital of France is';
  const byText = await client.completions.create({ model: modelId, prompt: text, ...greedy });
  const ids = await tokenize(text);
  const byIds = await client.completions.create({ model: modelId, prompt: ids, ...greedy });
  assert.equal(byIds.choices[0].text, byText.choices[0].text);
  assert.deepEqual(byIds.usage, byText.usage);
  assert.equal(byIds.usage.prompt_tokens, ids.length);
});

test('several prompts give n choices each, indexed prompt * n + choice', async () => {
  const prompts = ['Hello there', 'One two three', 'Zebra'];
  const alone = [];
  for (const p of prompts) {
    alone.push(await client.completions.create({ model: modelId, prompt: p, ...greedy }));
  }
  for (const form of ['strings', 'ids']) {
    const prompt = form === 'strings' ? prompts : await Promise.all(prompts.map(tokenize));
    const batch = await client.completions.create({ model: modelId, prompt, n: 2, ...greedy });
    assert.equal(batch.choices.length, 6, form);
    for (const c of batch.choices) {
      const p = Math.floor(c.index / 2);
      assert.equal(c.text, alone[p].choices[0].text, `${form} choice ${c.index}`);
    }
    assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2, 3, 4, 5]);
    assert.equal(batch.usage.prompt_tokens,
      alone.reduce((sum, a) => sum + a.usage.prompt_tokens, 0), form);
    assert.equal(batch.usage.completion_tokens, 24, form);
  }
  // Streamed: every choice's pieces joined are its text.
  const stream = await client.completions.create({
    model: modelId, prompt: prompts, n: 2, stream: true, ...greedy,
  });
  const texts = new Map();
  for await (const chunk of stream) {
    for (const c of chunk.choices) texts.set(c.index, (texts.get(c.index) ?? '') + c.text);
  }
  for (let i = 0; i < 6; i++) assert.equal(texts.get(i), alone[Math.floor(i / 2)].choices[0].text);
});

test('echo puts the prompt first, streamed or not', async () => {
  const prompt = 'Once upon a time';
  const plain = await client.completions.create({ model: modelId, prompt, ...greedy });
  const echoed = await client.completions.create({ model: modelId, prompt, echo: true, ...greedy });
  assert.equal(echoed.choices[0].text, prompt + plain.choices[0].text);
  assert.deepEqual(echoed.usage, plain.usage);
  const stream = await client.completions.create({
    model: modelId, prompt, echo: true, stream: true, ...greedy,
  });
  const pieces = [];
  for await (const chunk of stream) pieces.push(...chunk.choices.map((c) => c.text));
  assert.equal(pieces[0], prompt);
  assert.equal(pieces.join(''), echoed.choices[0].text);
  // Token ids echo as their text.
  const ids = await tokenize(prompt);
  const byIds = await client.completions.create({ model: modelId, prompt: ids, echo: true, ...greedy });
  assert.equal(byIds.choices[0].text, echoed.choices[0].text);
});

test('echo with logprobs scores the prompt as lm-evaluation-harness reads it', async () => {
  const contexts = ['The quick brown fox', 'Paris is the capital of'];
  const continuations = [' jumps over', ' France'];
  const prompt = [];
  const ctxlens = [];
  for (let i = 0; i < contexts.length; i++) {
    const ctx = await tokenize(contexts[i]);
    const whole = await tokenize(contexts[i] + continuations[i]);
    prompt.push(whole);
    ctxlens.push(ctx.length);
  }
  // local-completions' loglikelihood payload.
  const out = await client.completions.create({
    model: modelId, prompt, temperature: 0, max_tokens: 1, logprobs: 1, seed: 1234, echo: true,
  });
  assert.equal(out.choices.length, 2);
  for (const [i, choice] of out.choices.entries()) {
    const ids = prompt[choice.index];
    const lp = choice.logprobs;
    // The prompt's tokens then the one generated.
    assert.equal(lp.tokens.length, ids.length + 1);
    assert.equal(lp.token_logprobs.length, ids.length + 1);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    assert.equal(lp.tokens.slice(0, ids.length).join(''), contexts[i] + continuations[i]);
    assert.ok(choice.text.startsWith(contexts[i] + continuations[i]));
    assert.equal(lp.text_offset[0], 0);
    for (let k = 1; k < lp.text_offset.length; k++) {
      assert.equal(lp.text_offset[k], lp.tokens.slice(0, k).join('').length, `offset ${k}`);
    }
    // What the harness computes: a finite sum, and is_greedy from top_logprobs.
    const scored = lp.token_logprobs.slice(ctxlens[i], -1);
    assert.equal(scored.length, ids.length - ctxlens[i]);
    for (const [k, v] of scored.entries()) {
      assert.ok(Number.isFinite(v) && v <= 0, `logprob ${v}`);
      const top = lp.top_logprobs[ctxlens[i] + k];
      assert.equal(Object.keys(top).length, 1);
      assert.ok(Math.max(...Object.values(top)) >= v);
    }
    // Independent path: the logprob reported when the server generates prompt token k after
    // prompt[:k] (forced by logit_bias; reported logprobs are the raw model's).
    for (const k of [1, ctxlens[i], ids.length - 1]) {
      const gen = await client.completions.create({
        model: modelId, prompt: ids.slice(0, k), max_tokens: 1, temperature: 0, logprobs: 1,
        logit_bias: { [String(ids[k])]: 100 },
      });
      assert.equal(gen.choices[0].logprobs.tokens[0], lp.tokens[k], `token ${k}`);
      assert.equal(lp.token_logprobs[k], gen.choices[0].logprobs.token_logprobs[0], `position ${k}`);
    }
  }
});

test('echo with max_tokens 0 reads the prompt and generates nothing', async () => {
  const ids = await tokenize('Scoring a whole text without generating');
  const out = await client.completions.create({
    model: modelId, prompt: [ids], echo: true, logprobs: 0, max_tokens: 0,
  });
  const c = out.choices[0];
  assert.equal(c.text, 'Scoring a whole text without generating');
  assert.equal(c.finish_reason, 'length');
  assert.equal(out.usage.completion_tokens, 0);
  assert.equal(out.usage.prompt_tokens, ids.length);
  assert.equal(c.logprobs.token_logprobs.length, ids.length);
  assert.deepEqual(c.logprobs.top_logprobs.slice(1).map((t) => Object.keys(t).length),
    new Array(ids.length - 1).fill(0));
  // Streamed: the prompt in one piece, then the finish.
  const stream = await client.completions.create({
    model: modelId, prompt: [ids], echo: true, logprobs: 2, max_tokens: 0, stream: true,
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(...chunk.choices);
  assert.equal(chunks[0].text, 'Scoring a whole text without generating');
  assert.equal(chunks[0].logprobs.tokens.length, ids.length);
  assert.equal(chunks.at(-1).finish_reason, 'length');
  assert.equal(chunks.map((c) => c.text).join(''), 'Scoring a whole text without generating');
});

test('malformed prompts are refused naming the place', async () => {
  const cases = [
    [{ prompt: [] }, 'prompt'],
    [{ prompt: ['a', [1, 2]] }, 'prompt[1]'],
    [{ prompt: [[1, 2], 'a'] }, 'prompt[1]'],
    [{ prompt: [1, 2, 99999] }, 'prompt[2]'],
    [{ prompt: [1, -1] }, 'prompt[1]'],
    [{ prompt: [1, 2.5] }, 'prompt[1]'],
    [{ prompt: [[1], []] }, 'prompt[1]'],
    [{ prompt: ['a', ''] }, 'prompt[1]'],
    [{ prompt: [true] }, 'prompt[0]'],
    [{ prompt: 'hi', max_tokens: 0 }, 'max_tokens'],
    [{ prompt: 'hi', echo: 'yes' }, 'echo'],
  ];
  for (const [body, param] of cases) {
    const r = await post(tiny.base, '/v1/completions', { model: modelId, ...body });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(r.json.error.param, param, JSON.stringify(body));
  }
  // Chat completions do not echo: refused, not silently ignored.
  const chat = await post(tiny.base, '/v1/chat/completions', {
    model: modelId, messages: [{ role: 'user', content: 'hi' }], echo: true,
  });
  assert.equal(chat.status, 400);
  assert.equal(chat.json.error.param, 'echo');
  const ok = await client.completions.create({ model: modelId, prompt: 'still here', ...greedy });
  assert.equal(ok.choices.length, 1);
});
