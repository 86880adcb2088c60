// Prompt logprobs without computing the prompt twice (docs/status/prompt-logprobs.md, session 17):
// - chat `prompt_logprobs` come from the prefill that answers (one host request, the rendered
//   prompt computed once);
// - with the prefix cache on (COLI_K3_PREFIX_CACHE_MB), a prompt-logprobs request continues from
//   a cached prefix when the plugin holds that prefix's logprobs: chat requests sharing a system
//   prompt, and lm-evaluation-harness's loglikelihood requests (several continuations of one
//   context, echo + logprobs, max_tokens 0) compute only their own tokens from the third on;
// - every value equal to the same request on a server without the cache (computed whole).
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { TINY, startServer, stopServer, post } from './serve_helpers.mjs';

let plain, cached;

before(async () => {
  [plain, cached] = await Promise.all([
    startServer(TINY),
    startServer(TINY, { COLI_K3_PREFIX_CACHE_MB: '64', COLI_K3_PREFIX_CACHE_MIN: '8' }),
  ]);
});

after(async () => {
  await stopServer(plain);
  await stopServer(cached);
});

async function metrics(server) {
  const text = await (await fetch(`${server.base}/metrics`)).text();
  const value = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
  return {
    active: value('coli_requests_active'),
    requests: value('coli_requests_total'),
    prompt: value('coli_prompt_tokens_total'),
    reused: value('coli_tokens_reused_total'),
  };
}

// The host counts a request once it has ended; the reply may come first.
async function settled(server) {
  for (let i = 0; i < 600; i++) {
    const m = await metrics(server);
    if (m.active === 0) return m;
    await new Promise((res) => setTimeout(res, 20));
  }
  throw new Error('the host stayed busy');
}

async function ok(server, path, body) {
  const r = await post(server.base, path, body);
  assert.equal(r.status, 200, r.text);
  return r.json;
}

const system = 'You judge answers. ' + Array.from({ length: 12 }, (_, i) => `Rule ${i}: be exact.`).join(' ');
const chat = (user, extra = {}) => ({
  messages: [{ role: 'system', content: system }, { role: 'user', content: user }],
  max_tokens: 2, temperature: 0, ...extra,
});

test('chat prompt_logprobs: the rendered prompt is computed once, by the answer', async () => {
  const body = chat('Score this', { prompt_logprobs: 3 });
  const rendered = (await ok(plain, '/tokenize', { messages: body.messages })).tokens;
  const before = await settled(plain);
  const out = await ok(plain, '/v1/chat/completions', body);
  const after = await settled(plain);
  assert.equal(after.requests - before.requests, 1, 'host requests for one chat completion');
  assert.equal(after.prompt - before.prompt, rendered.length, 'prompt tokens read');
  assert.equal(out.prompt_logprobs.length, rendered.length);
  // The same as the completions path over the rendered ids (a prompt-only request of its own).
  const asIds = await ok(plain, '/v1/completions',
    { prompt: rendered, max_tokens: 1, prompt_logprobs: 3 });
  assert.deepEqual(out.prompt_logprobs, asIds.choices[0].prompt_logprobs);
  // n = 2: still one host request, the same entries.
  const two = await ok(plain, '/v1/chat/completions', { ...body, n: 2 });
  const afterTwo = await settled(plain);
  assert.equal(afterTwo.requests - after.requests - 1, 1, 'host requests for n = 2');
  assert.deepEqual(two.prompt_logprobs, out.prompt_logprobs);
});

test('a shared system prompt in the prefix cache serves chat prompt_logprobs', async () => {
  // A plain chat puts the system prompt's state into the cache; the first scored request
  // computes its prompt whole (the cache holds no logprobs of that prefix yet), the next ones
  // continue from the cached state.
  await ok(cached, '/v1/chat/completions', chat('First question'));
  const rendered = (await ok(cached, '/tokenize', { messages: chat('Third one').messages })).tokens;
  for (const [i, user] of ['Second one', 'Third one', 'Fourth'].entries()) {
    const body = chat(user, { prompt_logprobs: 2 });
    const before = await settled(cached);
    const got = await ok(cached, '/v1/chat/completions', body);
    const after = await settled(cached);
    const want = await ok(plain, '/v1/chat/completions', body);
    assert.equal(after.requests - before.requests, 1);
    const reused = after.reused - before.reused;
    if (i === 0) {
      assert.equal(reused, 0, 'no logprobs of the cached prefix yet');
    } else {
      assert.ok(reused > system.length / 8, `reused ${reused} tokens`);
      assert.ok(reused < rendered.length - 2, `reused ${reused} of ${rendered.length}`);
      assert.equal(got.usage.prompt_tokens_details?.cached_tokens ?? reused, reused);
    }
    assert.deepEqual(got.prompt_logprobs, want.prompt_logprobs, `request ${i}`);
    assert.deepEqual(got.choices.map((c) => c.message.content),
      want.choices.map((c) => c.message.content));
  }
});

test("the harness's continuations of one context compute only their own tokens", async () => {
  // lm-evaluation-harness's loglikelihood: one request per choice, context + continuation as
  // ids, echo + logprobs, max_tokens 0, read as token_logprobs[ctxlen:].
  const context = (await ok(cached, '/tokenize', {
    prompt: 'Question: which of these is a colour of the sky on a clear day? Answer:',
  })).tokens;
  assert.ok(context.length >= 8);
  const endings = [[401, 402], [403, 404, 405], [406], [407, 408]];
  for (const [i, ending] of endings.entries()) {
    const body = { prompt: [...context, ...ending], max_tokens: 0, echo: true, logprobs: 2 };
    const before = await settled(cached);
    const got = await ok(cached, '/v1/completions', body);
    const after = await settled(cached);
    const want = await ok(plain, '/v1/completions', body);
    // The first two compute everything (the second leaves the context's state in the cache,
    // where it parts from the first); the others only their endings.
    assert.equal(after.reused - before.reused, i < 2 ? 0 : context.length, `request ${i}`);
    assert.deepEqual(got.choices[0].logprobs, want.choices[0].logprobs, `request ${i}`);
    assert.equal(got.choices[0].logprobs.token_logprobs.length, context.length + ending.length);
  }
});
