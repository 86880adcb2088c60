// A minimal OpenAI chat-completions client over fetch: streams SSE deltas to callbacks.
// The page talks only to the same origin's /v1 API (plus /metrics for the status bar), with the
// server's API key when one was entered (auth.js).
import { authError, authHeaders } from './auth.js';

export async function fetchModels() {
  const res = await fetch('/v1/models', { headers: authHeaders() });
  if (res.status === 401) throw await authError(res);
  if (!res.ok) throw new Error(`GET /v1/models: HTTP ${res.status}`);
  const body = await res.json();
  return body.data || [];
}

// Splits an SSE byte stream into `data:` payloads.
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, '');
      const data = block.split(/\r?\n/)
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data) yield data;
    }
  }
}

// Streams one chat completion. `on` receives {progress, reasoning, content, toolCalls, usage,
// finish}. `progress` gets the gateway's prefill reports ({total, cache, processed, time_ms},
// llama.cpp's `prompt_progress`, asked for with `return_progress`).
// Errors say what happened in words a person can act on: the server could not be reached, the
// connection broke off mid-reply, or the server's own message (context exceeded, ...).
export async function streamChat({ model, messages, thinking, signal, on }) {
  let res;
  try {
    res = await sendChat({ model, messages, thinking, signal });
  } catch (e) {
    if (signal?.aborted) throw e;
    throw new Error(`Cannot reach the server (${e.message}): is \`coli web\` still running?`);
  }
  if (res.status === 401) throw await authError(res);
  if (!res.ok) {
    let message = `HTTP ${res.status}`;
    try {
      const err = await res.json();
      if (err.error && err.error.message) message = err.error.message;
    } catch (_) { /* keep the status line */ }
    throw new Error(message);
  }
  let done = false;
  try {
    for await (const data of sseEvents(res.body)) {
      if (data === '[DONE]') {
        done = true;
        break;
      }
      handleChunk(JSON.parse(data), on);
    }
  } catch (e) {
    if (signal?.aborted || e instanceof ServerError) throw e;
    throw new Error(`The connection to the server broke off mid-reply (${e.message}).`);
  }
  if (!done) throw new Error('The server ended the reply before it was finished.');
}

class ServerError extends Error {}

function handleChunk(chunk, on) {
  if (chunk.error) throw new ServerError(chunk.error.message || 'server error');
  if (chunk.prompt_progress) {
    on.progress?.(chunk.prompt_progress);
    return;  // a progress chunk carries an empty assistant delta
  }
  if (chunk.usage) on.usage?.(chunk.usage);
  for (const choice of chunk.choices || []) {
    const delta = choice.delta || {};
    if (delta.reasoning_content) on.reasoning?.(delta.reasoning_content);
    if (delta.content) on.content?.(delta.content);
    if (delta.tool_calls) on.toolCalls?.(delta.tool_calls);
    if (choice.finish_reason) on.finish?.(choice.finish_reason);
  }
}

function sendChat({ model, messages, thinking, signal }) {
  return fetch('/v1/chat/completions', {
    method: 'POST',
    headers: authHeaders({ 'Content-Type': 'application/json' }),
    body: JSON.stringify({
      model,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      return_progress: true,
      chat_template_kwargs: { thinking },
    }),
    signal,
  });
}
