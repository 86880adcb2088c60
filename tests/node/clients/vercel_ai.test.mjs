// The Vercel AI SDK (`ai`) against `coli serve` on the tiny K3 model, through its three
// OpenAI-style providers (support.mjs): @ai-sdk/openai-compatible (chat completions, reads
// reasoning_content), @ai-sdk/openai's chat model and its Responses model (the default of
// `openai(...)`). The tiny model's text is noise: the checks are on structure, usage, finish
// reasons, streaming, schemas and aborts. Tool loops: vercel_ai_tools.test.mjs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, generateObject, streamObject } from 'ai';
import { z } from 'zod';
import { TINY, startServer, stopServer, post } from '../openai/serve_helpers.mjs';
import { providers, metric } from './support.mjs';

let tiny;
before(async () => { tiny = await startServer(TINY); });
after(() => stopServer(tiny));

test('generateText and streamText: the same greedy output, usage and finish reason', async () => {
  const N = 12;
  // What the server itself says for this prompt.
  const raw = await post(tiny.base, '/v1/chat/completions', {
    model: 'k3_tiny', messages: [{ role: 'user', content: 'Hello' }], max_tokens: N, temperature: 0,
  });
  assert.equal(raw.status, 200, raw.text);
  const promptTokens = raw.json.usage.prompt_tokens;
  for (const [name, model] of Object.entries(providers(tiny, 'k3_tiny'))) {
    const opts = { model, prompt: 'Hello', maxOutputTokens: N, temperature: 0 };
    const g = await generateText(opts);
    assert.equal(g.finishReason, 'length', name);
    assert.equal(g.usage.inputTokens, promptTokens, name);
    assert.equal(g.usage.outputTokens, N, name);
    assert.equal(g.usage.totalTokens, promptTokens + N, name);
    // Every token is the tiny model's reasoning: the usage's reasoning split says so
    // (completion_tokens_details / output_tokens_details.reasoning_tokens).
    assert.equal(g.usage.outputTokenDetails.reasoningTokens, N, name);

    const s = streamText(opts);
    const types = [];
    for await (const part of s.fullStream) {
      assert.notEqual(part.type, 'error', `${name}: ${JSON.stringify(part)}`);
      types.push(part.type);
    }
    assert.equal(types.at(-1), 'finish', name);
    assert.equal(await s.finishReason, 'length', name);
    assert.equal(await s.text, g.text, name);
    assert.equal(await s.reasoningText, g.reasoningText, name);
    // Usage from the stream (include_usage / response.completed) equals the plain request's.
    const su = await s.usage;
    assert.equal(su.inputTokens, promptTokens, name);
    assert.equal(su.outputTokens, N, name);
    assert.equal(su.outputTokenDetails.reasoningTokens, N, name);
  }
});

test('openai-compatible shows K3\'s reasoning_content as reasoning, streamed and not', async () => {
  const N = 10;
  const raw = await post(tiny.base, '/v1/chat/completions', {
    model: 'k3_tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: N, temperature: 0,
  });
  const reasoning = raw.json.choices[0].message.reasoning_content;
  assert.ok(reasoning && reasoning.length > 0, 'the tiny model reasons first');
  const model = providers(tiny, 'k3_tiny')['openai-compatible'];
  const g = await generateText({ model, prompt: 'Hi', maxOutputTokens: N, temperature: 0 });
  assert.equal(g.reasoningText, reasoning);
  const s = streamText({ model, prompt: 'Hi', maxOutputTokens: N, temperature: 0 });
  let deltas = '';
  for await (const part of s.fullStream) if (part.type === 'reasoning-delta') deltas += part.text;
  assert.equal(deltas, reasoning);
});

test('generateObject / streamObject with a zod schema (json_schema, enforced)', async () => {
  const schema = z.object({
    name: z.string().max(10),
    age: z.number().int().min(0).max(150),
    tags: z.array(z.enum(['a', 'b'])).max(3),
  });
  for (const [name, model] of Object.entries(providers(tiny, 'k3_tiny'))) {
    const opts = { model, schema, prompt: 'Make a person', maxOutputTokens: 400, temperature: 0 };
    const g = await generateObject(opts);
    assert.equal(g.finishReason, 'stop', name);
    assert.deepEqual(schema.parse(g.object), g.object, name);
    const s = streamObject(opts);
    let partials = 0;
    for await (const _ of s.partialObjectStream) partials++;
    assert.ok(partials > 1, `${name}: the object streams in pieces`);
    assert.deepEqual(await s.object, g.object, name);
    assert.equal((await s.usage).outputTokens, g.usage.outputTokens, name);
  }
});

test('an abort signal mid-stream ends the stream and cancels the generation', async () => {
  for (const [name, model] of Object.entries(providers(tiny, 'k3_tiny'))) {
    const cancelledBefore = await metric(tiny, 'coli_requests_cancelled_total');
    const rowsBefore = await metric(tiny, 'coli_decode_rows_total');
    const ac = new AbortController();
    let aborted = false;
    const s = streamText({
      model, prompt: 'Hello', maxOutputTokens: 7000, temperature: 0, abortSignal: ac.signal,
      onAbort: () => { aborted = true; },
    });
    const types = [];
    const reading = (async () => { for await (const part of s.fullStream) types.push(part.type); })();
    // Abort once the server generates (its decode counter moves), long before 7000 greedy
    // tokens end. Not at a part: the openai chat model shows no reasoning_content and the
    // Responses model no reasoning_text, so the AI SDK shows nothing while the tiny model reasons.
    while (await metric(tiny, 'coli_decode_rows_total') === rowsBefore) {
      await new Promise((r) => setTimeout(r, 20));
    }
    ac.abort();
    await reading;
    assert.ok(aborted, `${name}: ${types}`);
    assert.equal(types.at(-1), 'abort', `${name}: ${types}`);
    assert.ok(!types.includes('finish'), `${name}: ${types}`);
    // The server notices the closed connection and stops: one more cancelled request.
    for (let i = 0; i < 300; i++) {
      if (await metric(tiny, 'coli_requests_cancelled_total') > cancelledBefore) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(await metric(tiny, 'coli_requests_cancelled_total'), cancelledBefore + 1, name);
    assert.equal(await metric(tiny, 'coli_requests_active'), 0, name);
  }
});
