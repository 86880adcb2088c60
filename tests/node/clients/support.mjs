// Shared by the Vercel AI SDK tests (vercel_ai*.test.mjs).
import assert from 'node:assert/strict';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOpenAI } from '@ai-sdk/openai';

globalThis.AI_SDK_LOG_WARNINGS = false;

// The three providers' language models for `model` on `server`.
export function providers(server, model) {
  const baseURL = `${server.base}/v1`;
  const compat = createOpenAICompatible({
    name: 'coli', baseURL, includeUsage: true, supportsStructuredOutputs: true,
  });
  const openai = createOpenAI({ baseURL, apiKey: 'unused' });
  return {
    'openai-compatible': compat.chatModel(model),
    'openai chat': openai.chat(model),
    'openai responses': openai.responses(model),
  };
}

export async function metric(server, name) {
  const text = await (await fetch(`${server.base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\S+)`, 'm'));
  assert.ok(m, `metric ${name} missing`);
  return Number(m[1]);
}
