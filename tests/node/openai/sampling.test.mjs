// The OpenAI / vLLM sampling knobs through the official `openai` npm SDK against a real
// `coli serve` on the tiny Kimi K3 fixture (random weights, real kimi_k3 plugin):
// frequency_penalty, presence_penalty, logit_bias and (as extra body fields, vLLM's extensions)
// repetition_penalty and min_p are accepted and take effect; out-of-range values are refused
// with 400 naming the field. Token ids are checked without a tokenizer library: the server's
// own /tokenize and /detokenize give the id and the text of the biased token, and each
// completion token's text (legacy completions logprobs.tokens) must be that text.
// docs/status/sampling.md has the semantics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { TINY, startServer, stopServer, post } from './serve_helpers.mjs';

let tiny, client, modelId, forced, forcedText;
const prompt = 'The capital of France is';

before(async () => {
  tiny = await startServer(TINY);
  client = new OpenAI({ baseURL: `${tiny.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
  // A token id that is not in the prompt, and its text.
  const t = await post(tiny.base, '/tokenize', { prompt: ' hello' });
  assert.equal(t.status, 200);
  forced = t.json.tokens[t.json.tokens.length - 1];
  const d = await post(tiny.base, '/detokenize', { tokens: [forced] });
  forcedText = d.json.prompt;
  assert.ok(forcedText.length > 0);
});

after(async () => { await stopServer(tiny); });

// Legacy completion -> the texts of its tokens.
async function tokens(body) {
  const c = await client.completions.create({ model: modelId, prompt, logprobs: 1, ...body });
  assert.equal(c.choices.length, 1);
  return c.choices[0].logprobs.tokens;
}

test('logit_bias +100 forces its token at every step (greedy and sampled)', async () => {
  for (const temperature of [0, 1.0]) {
    const got = await tokens({
      max_tokens: 8, temperature, seed: 7, logit_bias: { [String(forced)]: 100 },
    });
    assert.equal(got.length, 8);
    for (const t of got) assert.equal(t, forcedText, `temperature ${temperature}: ${got}`);
  }
  // Chat completions take it too (content tokens, with logprobs).
  const r = await client.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, temperature: 0,
    enable_thinking: false, logprobs: true, logit_bias: { [String(forced)]: 100 },
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 5);
  for (const e of lp) assert.equal(e.token, forcedText);
});

test('frequency_penalty, presence_penalty and repetition_penalty take effect', async () => {
  const bias = { [String(forced)]: 20 };
  // +20 wins every step on its own...
  const plain = await tokens({ max_tokens: 24, temperature: 0, logit_bias: bias });
  assert.deepEqual(plain, Array(24).fill(forcedText));
  // ...frequency_penalty 2 takes 2 per earlier use off it, so it loses before the 24th token.
  const freq = await tokens({ max_tokens: 24, temperature: 0, logit_bias: bias, frequency_penalty: 2 });
  assert.equal(freq[0], forcedText);
  assert.ok(freq.some((t) => t !== forcedText), `frequency_penalty had no effect: ${freq}`);
  // repetition_penalty 100 (an extra body field, as vLLM's) divides its positive logit by 100
  // once generated: the second token is another.
  const rep = await tokens({ max_tokens: 2, temperature: 0, logit_bias: bias, repetition_penalty: 100 });
  assert.equal(rep[0], forcedText);
  assert.notEqual(rep[1], forcedText);
  // presence_penalty: accepted, and with +100 bias the token still wins (2 off is not enough).
  const pres = await tokens({
    max_tokens: 4, temperature: 0, logit_bias: { [String(forced)]: 100 }, presence_penalty: 2,
  });
  assert.deepEqual(pres, Array(4).fill(forcedText));
  // Seeded requests stay reproducible with every knob set.
  const all = {
    max_tokens: 12, temperature: 1.2, seed: 42, frequency_penalty: 0.5, presence_penalty: 0.3,
    repetition_penalty: 1.2, min_p: 0.05, logit_bias: { [String(forced)]: 1 },
  };
  assert.deepEqual(await tokens(all), await tokens(all));
});

test('min_p 1 keeps only the most likely token: sampling equals greedy', async () => {
  const greedy = await tokens({ max_tokens: 10, temperature: 0 });
  const sampled = await tokens({ max_tokens: 10, temperature: 1.5, seed: 3, min_p: 1 });
  assert.deepEqual(sampled, greedy);
  // Without min_p the same seeded request wanders off the greedy path (so the check means
  // something).
  assert.notDeepEqual(await tokens({ max_tokens: 10, temperature: 1.5, seed: 3 }), greedy);
});

test('top_k 1 keeps only the most likely token: sampling equals greedy', async () => {
  const greedy = await tokens({ max_tokens: 10, temperature: 0 });
  assert.deepEqual(await tokens({ max_tokens: 10, temperature: 1.5, seed: 3, top_k: 1 }), greedy);
  // vLLM's "off" values leave the seeded request as it is without top_k.
  const free = await tokens({ max_tokens: 10, temperature: 1.5, seed: 3 });
  assert.notDeepEqual(free, greedy);
  assert.deepEqual(await tokens({ max_tokens: 10, temperature: 1.5, seed: 3, top_k: -1 }), free);
  assert.deepEqual(await tokens({ max_tokens: 10, temperature: 1.5, seed: 3, top_k: 0 }), free);
});

test('out-of-range knobs are 400 naming the field', async () => {
  const user = [{ role: 'user', content: 'hi' }];
  const cases = [
    [{ frequency_penalty: 2.5 }, 'frequency_penalty'],
    [{ frequency_penalty: 'high' }, 'frequency_penalty'],
    [{ presence_penalty: -2.1 }, 'presence_penalty'],
    [{ repetition_penalty: 0 }, 'repetition_penalty'],
    [{ repetition_penalty: -1 }, 'repetition_penalty'],
    [{ min_p: 1.5 }, 'min_p'],
    [{ top_k: -2 }, 'top_k'],
    [{ top_k: 2.5 }, 'top_k'],
    [{ logit_bias: { 999999: 5 } }, 'logit_bias'],  // beyond the vocabulary (768)
    [{ logit_bias: { [String(forced)]: 101 } }, 'logit_bias'],
    [{ logit_bias: { '-1': 5 } }, 'logit_bias'],
    [{ logit_bias: { abc: 5 } }, 'logit_bias'],
    [{ logit_bias: [1, 2] }, 'logit_bias'],
    [{ logit_bias: Object.fromEntries([...Array(1025).keys()].map((i) => [String(i), 1])) }, 'logit_bias'],
  ];
  for (const [extra, param] of cases) {
    for (const path of ['/v1/chat/completions', '/v1/completions']) {
      const body = path === '/v1/completions'
        ? { model: modelId, prompt, max_tokens: 2, ...extra }
        : { model: modelId, messages: user, max_tokens: 2, ...extra };
      const r = await post(tiny.base, path, body);
      const label = `${path} ${JSON.stringify(extra).slice(0, 60)}`;
      assert.equal(r.status, 400, `${label} -> ${r.status} ${r.text}`);
      assert.equal(r.json.error.param, param, `${label}: ${r.text}`);
    }
  }
  // The id beyond the vocabulary is named in the message.
  const far = await post(tiny.base, '/v1/completions',
    { model: modelId, prompt, max_tokens: 2, logit_bias: { 999999: 5 } });
  assert.match(far.json.error.message, /999999/);
  // The SDK surfaces the refusal as an APIError.
  await assert.rejects(
    client.completions.create({ model: modelId, prompt, max_tokens: 2, presence_penalty: 9 }),
    (e) => e.status === 400 && e.param === 'presence_penalty');
  // Neutral values are accepted.
  const ok = await client.chat.completions.create({
    model: modelId, messages: user, max_tokens: 2, frequency_penalty: 0, presence_penalty: 0,
    repetition_penalty: 1, min_p: 0, logit_bias: {},
  });
  assert.equal(ok.choices.length, 1);
});
