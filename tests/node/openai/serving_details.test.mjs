// Three serving details a vLLM / OpenAI user counts on, through the official `openai` npm SDK
// against `coli serve` on the tiny K3 fixture:
// - usage.prompt_tokens_details.cached_tokens (chat and completions, plain and the streamed usage
//   chunk): a request that extends an earlier one's prompt and output reuses that state (the
//   session's record is a prefix of the new prompt), a fresh one reports 0;
// - vLLM's `prompt_logprobs` (completions: per choice; chat: beside the choices, over the rendered
//   prompt): each position checked against an independent path, the logprob and top 20 the server
//   reports when it generates that token after the same prefix (forced by logit_bias; reported
//   logprobs are the raw model's), ranks as vLLM counts them;
// - a reply cut inside a UTF-8 character (byte tokens forced by logit_bias, max_tokens) ends with
//   U+FFFD instead of losing the bytes, streamed or not, while logprobs keep each token's bytes.
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

async function tokenize(body) {
  const r = await post(tiny.base, '/tokenize', body);
  assert.equal(r.status, 200, r.text);
  return r.json.tokens;
}

// Waits until the host runs no request. The host frees a session just after sending the reply's
// last event (host/engine.cc); on a loaded machine a request sent at once could still find it
// busy and go to another session, reusing nothing, so the reuse checks wait.
async function idle() {
  for (let i = 0; i < 600; i++) {
    const m = await (await fetch(`${tiny.base}/metrics`)).text();
    if (/^coli_requests_active 0$/m.test(m)) return;
    await new Promise((res) => setTimeout(res, 20));
  }
  throw new Error('the host stayed busy');
}

// The tiny tokenizer's byte tokens (tiktoken.model): 0xE4 alone, and 0xE4 0xB8 (the first two
// bytes of U+4E2D), and an ASCII token, 'lo'.
const E4 = 160;
const E4_B8 = 260;
const LO = 473;
const REPLACEMENT = '\uFFFD';

async function streamedCompletion(body) {
  const stream = await client.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.text;
  }
  return { text, usage };
}

async function streamedChat(body) {
  const stream = await client.chat.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  });
  let content = '';
  let reasoning = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta.content ?? '';
      reasoning += c.delta.reasoning_content ?? '';
    }
  }
  return { content, reasoning, usage };
}

test('the token check: the byte tokens are what the test assumes', async () => {
  // "中" is E4 B8 AD; "lolo" is two 'lo' tokens.
  assert.deepEqual((await tokenize({ prompt: '中' })).slice(0, 1), [E4_B8]);
  assert.deepEqual(await tokenize({ prompt: 'lolo' }), [LO, LO]);
});

test('usage.prompt_tokens_details.cached_tokens counts the prompt tokens reused', async () => {
  // Completions, token ids: a fresh prompt reuses nothing; the same prompt followed by the tokens
  // the first request generated (forced: 'lo' three times) and more reuses the first prompt at
  // least.
  const first = await tokenize({ prompt: 'A fresh prompt about caching in completions' });
  const fresh = await client.completions.create({
    model: modelId, prompt: first, max_tokens: 3, temperature: 0, logit_bias: { [LO]: 100 },
  });
  assert.equal(fresh.choices[0].text, 'lololo');
  assert.deepEqual(fresh.usage.prompt_tokens_details, { cached_tokens: 0 });
  const extended = [...first, LO, LO, LO, ...await tokenize({ prompt: ' and then more' })];
  await idle();
  const again = await client.completions.create({
    model: modelId, prompt: extended, max_tokens: 2, temperature: 0, logit_bias: { [LO]: 100 },
  });
  const cached = again.usage.prompt_tokens_details.cached_tokens;
  assert.equal(again.usage.prompt_tokens, extended.length);
  assert.ok(cached >= first.length && cached < extended.length, `cached ${cached}`);
  // Streamed, the usage chunk carries it too (the record now ends with `again`'s output).
  const streamedPrompt = [...extended, LO, LO, ...await tokenize({ prompt: ' the end' })];
  await idle();
  const streamed = await streamedCompletion({
    model: modelId, prompt: [...streamedPrompt], max_tokens: 2, temperature: 0,
  });
  assert.equal(streamed.usage.prompt_tokens, streamedPrompt.length);
  const streamedCached = streamed.usage.prompt_tokens_details.cached_tokens;
  assert.ok(streamedCached >= extended.length && streamedCached < streamedPrompt.length,
    `cached ${streamedCached}`);

  // Chat: the second turn carries the first reply as the assistant message, so its rendering
  // begins with the first prompt and the reply's tokens.
  const turn1 = [{ role: 'user', content: 'A fresh chat about caching' }];
  const chat = { model: modelId, reasoning_effort: 'none', temperature: 0 };
  const one = await client.chat.completions.create({
    ...chat, messages: turn1, max_tokens: 3, logit_bias: { [LO]: 100 },
  });
  assert.equal(one.choices[0].message.content, 'lololo');
  assert.deepEqual(one.usage.prompt_tokens_details, { cached_tokens: 0 });
  const turn2 = [...turn1, { role: 'assistant', content: 'lololo' },
    { role: 'user', content: 'and again' }];
  await idle();
  const two = await client.chat.completions.create({ ...chat, messages: turn2, max_tokens: 3,
    logit_bias: { [LO]: 100 } });
  const twoCached = two.usage.prompt_tokens_details.cached_tokens;
  assert.ok(twoCached >= one.usage.prompt_tokens && twoCached < two.usage.prompt_tokens,
    `cached ${twoCached} of ${two.usage.prompt_tokens}`);
  const turn3 = [...turn2, { role: 'assistant', content: 'lololo' },
    { role: 'user', content: 'once more' }];
  await idle();
  const three = await streamedChat({ ...chat, messages: turn3, max_tokens: 2 });
  const threeCached = three.usage.prompt_tokens_details.cached_tokens;
  assert.ok(threeCached >= two.usage.prompt_tokens && threeCached < three.usage.prompt_tokens,
    `cached ${threeCached} of ${three.usage.prompt_tokens}`);
});

// What the server reports when it generates ids[k] after ids[:k]: the token's logprob and the
// 20 most likely logprobs there (decode's path; logit_bias forces the token, reported logprobs
// are the raw model's).
async function decodeView(ids, k) {
  const gen = await client.completions.create({
    model: modelId, prompt: ids.slice(0, k), max_tokens: 1, temperature: 0, logprobs: 20,
    logit_bias: { [String(ids[k])]: 100 },
  });
  const lp = gen.choices[0].logprobs;
  return { logprob: lp.token_logprobs[0],
    top: Object.values(lp.top_logprobs[0]).sort((a, b) => b - a) };
}

// vLLM's rank from decode's view: how many tokens are at least as likely as the token (itself
// included), known when the top 20 hold one less likely; null otherwise (then it is 20 or more).
function expectedRank(view) {
  const atLeast = view.top.filter((v) => v >= view.logprob).length;
  return atLeast < view.top.length ? atLeast : null;
}

test('prompt_logprobs: every position as decode reports it, ranks as vLLM counts', async () => {
  // A prompt whose tokens sit at known ranks: each next token is the one ranked r in the
  // position's top 20 (as prompt_logprobs lists them), or a token outside them.
  const ids = await tokenize({ prompt: 'Rank' });
  const base = ids.length;
  // 0: a token outside the top 20.
  const wanted = [1, 2, 5, 19, 0, 1, 3, 20, 1];
  for (const r of wanted) {
    const probe = await client.completions.create({
      model: modelId, prompt: [...ids, 0], max_tokens: 1, prompt_logprobs: 20,
    });
    // The last position's 20 most likely (ranks 1..20; the placeholder 0 ranks beyond unless it
    // is one of them).
    const last = probe.choices[0].prompt_logprobs.at(-1);
    const top = new Map(Object.entries(last).filter(([, e]) => e.rank !== null && e.rank <= 20)
      .map(([id, e]) => [e.rank, Number(id)]));
    let next = top.get(r);
    if (r === 0) {
      next = 0;
      while ([...top.values()].includes(next)) next++;
    }
    assert.ok(next !== undefined, `rank ${r} at position ${ids.length}`);
    ids.push(next);
  }
  const k = 3;
  const out = await client.completions.create({
    model: modelId, prompt: ids, max_tokens: 2, temperature: 0, prompt_logprobs: k, n: 2,
  });
  assert.equal(out.usage.prompt_tokens, ids.length);
  for (const choice of out.choices) {
    const plp = choice.prompt_logprobs;
    assert.equal(plp.length, ids.length);
    assert.equal(plp[0], null);
    assert.deepEqual(plp, out.choices[0].prompt_logprobs);  // each choice carries the same
  }
  const plp = out.choices[0].prompt_logprobs;
  let ranked = 0, unranked = 0;
  for (let i = 1; i < ids.length; i++) {
    // The prompt token and the k most likely (the prompt token once if among them). (The JSON
    // text lists the prompt token first; a JavaScript object orders integer keys itself.)
    const entries = Object.entries(plp[i]);
    const own = plp[i][String(ids[i])];
    assert.ok(own, `position ${i} lists its token`);
    const listed = entries.length === k;  // the prompt token is among the k shown
    if (!listed) assert.equal(entries.length, k + 1, `position ${i}`);
    const view = await decodeView(ids, i);
    assert.equal(own.logprob, view.logprob, `logprob at ${i}`);
    const rank = expectedRank(view);
    if (listed) {
      assert.ok(own.rank >= 1 && own.rank <= k, `rank ${own.rank} at ${i}`);
      assert.equal(view.top[own.rank - 1], own.logprob, `listed rank at ${i}`);
    } else if (rank !== null) {
      assert.equal(own.rank, rank, `rank at ${i}`);
    } else {
      // Beyond what decode's top 20 tell: the plugin counted it over the whole vocabulary.
      assert.ok(Number.isInteger(own.rank) && own.rank >= 20, `rank ${own.rank} at ${i}`);
    }
    if (rank === null) unranked++; else ranked++;
    // The k most likely, ranks 1..k, values as decode's top list.
    const tops = entries.filter(([, e]) => e !== own || listed)
      .map(([, e]) => e).sort((a, b) => a.rank - b.rank);
    assert.deepEqual(tops.map((e) => e.rank), Array.from({ length: k }, (_, j) => j + 1));
    assert.deepEqual(tops.map((e) => e.logprob), view.top.slice(0, k), `top ${k} at ${i}`);
    for (const [, e] of entries) assert.equal(typeof e.decoded_token, 'string');
  }
  // The construction put tokens both inside and outside the top 20.
  assert.ok(ranked >= 7 && unranked >= 2, `ranked ${ranked}, unranked ${unranked}`);
  const ranks = wanted.map((_, j) => plp[base + j][String(ids[base + j])].rank);
  assert.deepEqual(ranks.map((r, j) => (wanted[j] === 0 ? r > 20 : r)),
    [1, 2, 5, 19, true, 1, 3, 20, 1]);

  // A text prompt: the same positions as its tokens.
  const text = await client.completions.create({
    model: modelId, prompt: 'Rank them all', max_tokens: 1, prompt_logprobs: 0,
  });
  const textIds = await tokenize({ prompt: 'Rank them all' });
  const textPlp = text.choices[0].prompt_logprobs;
  assert.equal(textPlp.length, textIds.length);
  for (let i = 1; i < textIds.length; i++) assert.ok(textPlp[i][String(textIds[i])], `token ${i}`);
  // Not asked: no field.
  const plain = await client.completions.create({ model: modelId, prompt: 'x', max_tokens: 1 });
  assert.equal('prompt_logprobs' in plain.choices[0], false);
});

test('prompt_logprobs on chat: the rendered prompt, beside the choices', async () => {
  const body = { model: modelId, messages: [{ role: 'user', content: 'Score my prompt' }],
    max_tokens: 2, temperature: 0 };
  const out = await client.chat.completions.create({ ...body, prompt_logprobs: 2 });
  const rendered = await tokenize({ messages: body.messages });
  const plp = out.prompt_logprobs;
  assert.equal(plp.length, rendered.length);
  assert.equal(out.usage.prompt_tokens, rendered.length);
  assert.equal(plp[0], null);
  for (let i = 1; i < rendered.length; i++) assert.ok(plp[i][String(rendered[i])], `token ${i}`);
  // The same ids as a completions prompt give the same entries; two positions against decode.
  const asIds = await client.completions.create({
    model: modelId, prompt: rendered, max_tokens: 1, prompt_logprobs: 2,
  });
  assert.deepEqual(asIds.choices[0].prompt_logprobs, plp);
  for (const i of [1, rendered.length - 1]) {
    const view = await decodeView(rendered, i);
    assert.equal(plp[i][String(rendered[i])].logprob, view.logprob, `position ${i}`);
  }
  assert.equal('prompt_logprobs' in await client.chat.completions.create(body), false);
});

test('prompt_logprobs refusals name the field', async () => {
  const cases = [
    [{ prompt: 'x', prompt_logprobs: -1 }, 'between 0 and 20'],
    [{ prompt: 'x', prompt_logprobs: 21 }, 'between 0 and 20'],
    [{ prompt: 'x', prompt_logprobs: 1.5 }, 'integer'],
    [{ prompt: 'x', prompt_logprobs: '2' }, 'integer'],
    [{ prompt: 'x', prompt_logprobs: true }, 'integer'],
    [{ prompt: 'x', prompt_logprobs: 2, stream: true }, 'stream'],
  ];
  for (const [body, why] of cases) {
    for (const [path, extra] of [['/v1/completions', {}],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }] }]]) {
      const r = await post(tiny.base, path, { ...body, ...extra, max_tokens: 1 });
      assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.json.error.param, 'prompt_logprobs');
      assert.ok(r.json.error.message.includes(why), r.json.error.message);
    }
  }
});

test('a reply cut inside a character ends with U+FFFD, streamed or not', async () => {
  const R = REPLACEMENT;
  // Completions: E4 alone is the start of a 3-byte character; E4 E4 is one invalid byte (the
  // decoder's U+FFFD) and the start of the next.
  for (const [bias, n, text] of [[E4, 1, R], [E4, 2, R + R], [E4_B8, 1, R], [E4_B8, 2, R + R],
    [LO, 2, 'lolo']]) {
    const body = { model: modelId, prompt: 'Cut', max_tokens: n, temperature: 0,
      logit_bias: { [bias]: 100 } };
    const whole = await client.completions.create(body);
    assert.equal(whole.choices[0].text, text, `${bias} x${n}`);
    assert.equal(whole.choices[0].finish_reason, 'length');
    assert.equal((await streamedCompletion(body)).text, text, `${bias} x${n} streamed`);
  }
  // Chat content (thinking off): the decoder shows U+FFFD for the first two E4s, the cut adds
  // the third; logprobs keep each token's own byte.
  const chat = { model: modelId, messages: [{ role: 'user', content: 'Cut' }], max_tokens: 3,
    temperature: 0, logit_bias: { [E4]: 100 } };
  const content = await client.chat.completions.create({
    ...chat, reasoning_effort: 'none', logprobs: true,
  });
  assert.equal(content.choices[0].message.content, R + R + R);
  assert.deepEqual(content.choices[0].logprobs.content.map((e) => e.bytes), [[0xE4], [0xE4], [0xE4]]);
  const streamed = await streamedChat({ ...chat, reasoning_effort: 'none' });
  assert.equal(streamed.content, R + R + R);
  // In the reasoning (thinking on, the default).
  const thinking = await client.chat.completions.create(chat);
  assert.equal(thinking.choices[0].message.reasoning_content, R + R + R);
  assert.equal((await streamedChat(chat)).reasoning, R + R + R);
  // The Responses API (the chat path: logit_bias passes through).
  const response = await client.responses.create({
    model: modelId, input: 'Cut', max_output_tokens: 3, temperature: 0,
    logit_bias: { [E4]: 100 }, reasoning: { effort: 'none' },
  });
  assert.equal(response.status, 'incomplete');
  assert.equal(response.output_text, R + R + R);
  // A reply that is one cut character and nothing else (the channel had shown no text): the
  // model's parser names the channel that holds the bytes.
  for (const [bias, effort] of [[E4, 'none'], [E4_B8, 'none'], [E4, undefined]]) {
    const one = { ...chat, max_tokens: 1, logit_bias: { [bias]: 100 },
      ...(effort ? { reasoning_effort: effort } : {}) };
    const whole = await client.chat.completions.create(one);
    const got = effort ? whole.choices[0].message.content : whole.choices[0].message.reasoning_content;
    assert.equal(got, R, `${bias} ${effort}`);
    const s = await streamedChat(one);
    assert.equal(effort ? s.content : s.reasoning, R, `${bias} ${effort} streamed`);
  }
  // Whole characters stay as they are.
  const ascii = await client.chat.completions.create({
    ...chat, reasoning_effort: 'none', logit_bias: { [LO]: 100 },
  });
  assert.equal(ascii.choices[0].message.content, 'lololo');
});
