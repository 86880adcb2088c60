// `coli web` (the `coli serve` gateway plus the page) attacked as an outside client would: raw
// HTTP where a browser, curl or a proxy is the natural client, the official `openai` SDK where the
// SDK is. Each test pins one behaviour found wrong by the black-box pass (docs/status/blackbox.md)
// or one that must stay right. One server on the tiny model, decoding paced at 5 ms a token so a
// long generation is certainly still running when a client goes away.
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import OpenAI from '../openai/node_modules/openai/index.mjs';

import { TINY, startServer, stopServer } from '../openai/serve_helpers.mjs';

const ALLOWED_ORIGIN = 'http://allowed.example:3000';

// The host's workers (the default, made explicit): the queue test occupies every one of them.
const WORKERS = 4;

let server, base, port, client, modelId;

before(async () => {
  // `coli web`: the same Gateway as `coli serve`, plus the page at /.
  server = await startServer(TINY, { COLI_DECODE_DELAY_MS: '5' },
    ['--allow-origin', ALLOWED_ORIGIN, '--workers', String(WORKERS)], 'web');
  base = server.base;
  port = Number(new URL(base).port);
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  modelId = (await client.models.list()).data[0].id;
});

after(() => stopServer(server));

const hello = [{ role: 'user', content: 'Hello, who are you?' }];

// Sends `request` (a string or Buffer of raw HTTP/1.1) on a fresh connection and reads until one
// whole response has come (or the server closes).
const raw = (request) => conversation([request]);

// Sends each request of `requests` on one connection once the previous answer is complete.
function conversation(requests) {
  return new Promise((resolve, reject) => {
    let text = '';
    let next = 0;
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      sock.destroy();
      resolve({ text, responses: parseResponses(text) });
    };
    const sock = net.connect(port, '127.0.0.1', () => sock.write(requests[next++]));
    sock.on('data', (d) => {
      text += d.toString('latin1');
      const answered = parseResponses(text).length;
      if (answered === requests.length) return finish();
      if (next < requests.length && answered === next) sock.write(requests[next++]);
    });
    sock.on('error', (e) => (done ? undefined : reject(e)));
    sock.on('close', finish);
  });
}

// Splits a byte stream of HTTP/1.1 responses (Content-Length bodies) into {status, headers, body,
// json}.
function parseResponses(text) {
  const out = [];
  let rest = text;
  while (rest.startsWith('HTTP/1.1 ')) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const head = rest.slice(0, end).split('\r\n');
    const status = Number(head[0].split(' ')[1]);
    const headers = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(':');
      headers[line.slice(0, i).toLowerCase()] = line.slice(i + 1).trim();
    }
    const length = Number(headers['content-length'] ?? 0);
    if (rest.length < end + 4 + length) break;  // not all of it yet
    const body = rest.slice(end + 4, end + 4 + length);
    let json = null;
    try { json = JSON.parse(body); } catch { /* not JSON */ }
    out.push({ status, headers, body, json });
    rest = rest.slice(end + 4 + length);
  }
  return out;
}

// An OpenAI error object: {error: {message, type, param, code}}.
function assertApiError(r, status, label) {
  assert.equal(r.status, status, `${label}: ${r.status} ${r.body ?? r.text}`);
  const e = r.json?.error;
  assert.ok(e, `${label}: not an error object: ${r.body ?? r.text}`);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  assert.ok('param' in e && 'code' in e, `${label}: ${JSON.stringify(e)}`);
  return e;
}

async function request(method, path, { body, headers } = {}) {
  const r = await fetch(`${base}${path}`, {
    method,
    headers: { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, value };
}

// Polls `cond` (async, true when done) up to ~30 s; returns its last value.
async function until(cond) {
  let ok = false;
  for (let i = 0; i < 300 && !ok; i++) {
    ok = await cond();
    if (!ok) await new Promise((r) => setTimeout(r, 100));
  }
  return ok;
}

// Every route with the methods it takes.
const ROUTES = [
  ['/v1/models', ['GET']],
  ['/v1/models/x', ['GET']],
  ['/v1/chat/completions', ['POST']],
  ['/v1/completions', ['POST']],
  ['/v1/responses', ['POST']],
  // GET / DELETE of /v1/responses/input_tokens are those of a response with that id.
  ['/v1/responses/input_tokens', ['POST', 'GET', 'DELETE']],
  ['/v1/responses/resp_x', ['GET', 'DELETE']],
  ['/v1/responses/resp_x/input_items', ['GET']],
  ['/v1/responses/resp_x/cancel', ['POST']],
  ['/tokenize', ['POST']],
  ['/detokenize', ['POST']],
  ['/apply-template', ['POST']],
  ['/health', ['GET']],
  ['/metrics', ['GET']],
  ['/', ['GET']],
];

test('a wrong method on a known route is 405 with Allow; an unknown path is 404 (OpenAI error shape)', async () => {
  for (const [path, methods] of ROUTES) {
    for (const method of ['GET', 'POST', 'PUT', 'PATCH', 'DELETE']) {
      if (methods.includes(method)) continue;
      const r = await request(method, path, method === 'GET' ? {} : { body: {} });
      const e = assertApiError(r, 405, `${method} ${path}`);
      assert.equal(e.type, 'invalid_request_error');
      assert.match(e.message, new RegExp(`${method}.*${path.replace(/[/.]/g, '\\$&')}`));
      const allow = r.headers.get('allow').split(/,\s*/);
      for (const m of methods) assert.ok(allow.includes(m), `${path}: Allow ${allow}`);
      if (methods.includes('GET')) assert.ok(allow.includes('HEAD'), `${path}: Allow ${allow}`);
      assert.ok(allow.includes('OPTIONS'), `${path}: Allow ${allow}`);
    }
  }
  for (const [method, path] of [['GET', '/v1/nothing'], ['POST', '/v1/chat'], ['GET', '/v2/models'],
    ['DELETE', '/v1/responses/a/b/c']]) {
    const r = await request(method, path, method === 'GET' ? {} : { body: {} });
    const e = assertApiError(r, 404, `${method} ${path}`);
    assert.equal(e.type, 'invalid_request_error');
    assert.ok(e.message.includes(`${method} ${path}`), e.message);
  }
  // HEAD answers like GET without a body.
  const head = await fetch(`${base}/v1/models`, { method: 'HEAD' });
  assert.equal(head.status, 200);
  assert.equal(await head.text(), '');
  // The SDK sees a 404 as NotFoundError.
  await assert.rejects(client.get('/nothing'), (e) => e.status === 404);
});

test('an unknown method is 405 on a known route; a 405 with a body keeps the connection usable', async () => {
  // Two requests, one after the other, on one keep-alive connection: the first one's body must
  // have been read past for the second to parse.
  const body = '{"a": 1}';
  const { responses } = await conversation([
    `PUT /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${body.length}\r\n\r\n${body}`,
    'GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n']);
  assert.equal(responses.length, 2, JSON.stringify(responses));
  assertApiError(responses[0], 405, 'PUT');
  assert.equal(responses[1].status, 200);
  assert.equal(responses[1].json.object, 'list');
  const { responses: [brew] } = await raw('BREW /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
  assert.ok(brew.status === 405 || brew.status === 400, brew.body);
  assertApiError(brew, brew.status, 'BREW /health');
});

test('CORS: preflight answered; only an --allow-origin origin gets Access-Control-Allow-Origin', async () => {
  const preflight = (origin) => request('OPTIONS', '/v1/chat/completions', {
    headers: {
      origin,
      'access-control-request-method': 'POST',
      'access-control-request-headers': 'authorization, content-type, x-stainless-os',
    },
  });
  const ok = await preflight(ALLOWED_ORIGIN);
  assert.equal(ok.status, 204, ok.text);
  assert.equal(ok.headers.get('access-control-allow-origin'), ALLOWED_ORIGIN);
  assert.match(ok.headers.get('access-control-allow-methods'), /POST/);
  const allowedHeaders = ok.headers.get('access-control-allow-headers').toLowerCase();
  for (const h of ['authorization', 'content-type', 'x-stainless-os']) {
    assert.ok(allowedHeaders.includes(h), allowedHeaders);
  }
  assert.match(ok.headers.get('vary') ?? '', /Origin/);
  // Another origin: answered (204, Allow) but without the header a browser needs.
  const other = await preflight('http://evil.example');
  assert.equal(other.status, 204);
  assert.equal(other.headers.get('access-control-allow-origin'), null);
  assert.match(other.headers.get('allow'), /POST/);
  // The real request from the allowed origin carries the header too (errors included).
  const real = await request('POST', '/v1/chat/completions', {
    headers: { origin: ALLOWED_ORIGIN }, body: { model: modelId, messages: hello, max_tokens: 2 },
  });
  assert.equal(real.status, 200);
  assert.equal(real.headers.get('access-control-allow-origin'), ALLOWED_ORIGIN);
  const bad = await request('POST', '/v1/chat/completions', {
    headers: { origin: ALLOWED_ORIGIN }, body: { model: modelId, messages: [] },
  });
  assert.equal(bad.status, 400);
  assert.equal(bad.headers.get('access-control-allow-origin'), ALLOWED_ORIGIN);
  const foreign = await request('GET', '/v1/models', { headers: { origin: 'http://evil.example' } });
  assert.equal(foreign.status, 200);
  assert.equal(foreign.headers.get('access-control-allow-origin'), null);
  // OPTIONS on an unknown path is a 404.
  assertApiError(await request('OPTIONS', '/v1/nothing'), 404, 'OPTIONS /v1/nothing');
});

test('a web page that is not allowed cannot start work: foreign Origin POSTs and rebinding Hosts are 403', async () => {
  // A "simple" no-cors POST (text/plain, no preflight) from another site: refused before any
  // work starts, a background response included.
  for (const [path, body] of [
    ['/v1/chat/completions', { model: modelId, messages: hello, max_tokens: 2 }],
    ['/v1/responses', { model: modelId, input: 'hi', background: true, max_output_tokens: 2 }],
  ]) {
    const r = await request('POST', path, {
      headers: { origin: 'http://evil.example', 'content-type': 'text/plain' }, body,
    });
    const e = assertApiError(r, 403, `foreign POST ${path}`);
    assert.equal(e.type, 'permission_error');
    assert.match(e.message, /--allow-origin/);
  }
  // The page's own origin (what `coli web`'s page sends) and no Origin at all (SDKs, curl) pass.
  const host = new URL(base).host;
  const same = await request('POST', '/v1/chat/completions', {
    headers: { origin: `http://${host}` }, body: { model: modelId, messages: hello, max_tokens: 2 },
  });
  assert.equal(same.status, 200, same.text);
  // DNS rebinding: a name that is not loopback in Host, on a server without a key.
  const rebound = await new Promise((resolve, reject) => {
    const u = new URL(base);
    const sock = net.connect(Number(u.port), u.hostname, () => {
      sock.write(`GET /v1/models HTTP/1.1\r\nHost: evil.example:${u.port}\r\nConnection: close\r\n\r\n`);
    });
    let data = '';
    sock.on('data', (d) => { data += d; });
    sock.on('end', () => resolve(data));
    sock.on('error', reject);
  });
  assert.match(rebound, /^HTTP\/1\.1 403/);
  assert.match(rebound, /DNS rebinding/);
});

test('a POST without a body (no Content-Length, as `curl -X POST` sends it) is answered at once', async () => {
  const post = (path) => raw(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
  // OpenAI documents cancel exactly so: `curl -X POST .../v1/responses/ID/cancel`.
  const { responses: [cancel] } = await post('/v1/responses/resp_unknown/cancel');
  const e = assertApiError(cancel, 404, 'cancel');
  assert.match(e.message, /resp_unknown/);
  const { responses: [chat] } = await post('/v1/chat/completions');
  assert.match(assertApiError(chat, 400, 'chat').message, /body/);
  const { responses: [models] } = await post('/v1/models');
  assertApiError(models, 405, 'POST /v1/models');
});

test('HTTP-level refusals say what was wrong: 413 body, 414 URI, oversized header', async () => {
  const big = 'x'.repeat((16 << 20) + 1);
  const r413 = await request('POST', '/v1/chat/completions', { body: big });
  assert.match(assertApiError(r413, 413, 'body').message, /16 MiB/);
  const r414 = await request('GET', `/v1/models/${'a'.repeat(9000)}`);
  assert.match(assertApiError(r414, 414, 'uri').message, /URI/);
  const { responses: [hdr] } = await raw(
    `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(9000)}\r\nConnection: close\r\n\r\n`);
  assert.match(assertApiError(hdr, 400, 'header').message, /header/);
  // Still serving.
  assert.equal((await request('GET', '/health')).status, 200);
});

test('a body that is not JSON says why: invalid UTF-8, lone surrogate, trailing garbage, not an object', async () => {
  const send = (bytes) => raw(Buffer.concat([
    Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${bytes.length}\r\nConnection: close\r\n\r\n`), bytes]));
  const invalidUtf8 = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"a'),
    Buffer.from([0xff, 0xfe]), Buffer.from('b"}]}')]);
  const { responses: [u] } = await send(invalidUtf8);
  assert.match(assertApiError(u, 400, 'utf8').message, /not valid JSON.*UTF-8/s);
  const { responses: [s] } = await send(Buffer.from('{"messages":[{"role":"user","content":"a\\ud800b"}]}'));
  assert.match(assertApiError(s, 400, 'surrogate').message, /not valid JSON.*surrogate/s);
  const { responses: [g] } = await send(Buffer.from('{"messages": []} trailing'));
  assert.match(assertApiError(g, 400, 'garbage').message, /not valid JSON/);
  // A number beyond double range was a 500 "internal error" for a moment (nlohmann throws a
  // different exception for it).
  const { responses: [o] } = await send(Buffer.from(
    '{"messages":[{"role":"user","content":"hi"}],"temperature":1e400}'));
  assert.match(assertApiError(o, 400, 'overflow').message, /not valid JSON.*1e400/s);
  const { responses: [a] } = await send(Buffer.from('[1, 2]'));
  assert.match(assertApiError(a, 400, 'array').message, /JSON object.*array/);
});

test('NUL and other control characters in content are text, not a crash', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content: 'a\u0000b\u0001c\u001f' }], max_tokens: 2,
  });
  assert.equal(r.choices.length, 1);
  const t = await request('POST', '/tokenize', { body: { prompt: 'a\u0000b' } });
  assert.equal(t.status, 200);
  const d = await request('POST', '/detokenize', { body: { tokens: t.json.tokens } });
  assert.equal(d.json.prompt, 'a\u0000b');
});

test('a user, system, developer or tool message without content is a 400 naming it; assistant may omit it', async () => {
  for (const role of ['user', 'system', 'developer', 'tool']) {
    for (const message of [{ role, content: null }, { role }]) {
      const r = await request('POST', '/v1/chat/completions',
        { body: { model: modelId, messages: [message], max_tokens: 2 } });
      const e = assertApiError(r, 400, JSON.stringify(message));
      assert.equal(e.param, 'messages[0].content');
    }
  }
  const ok = await client.chat.completions.create({
    model: modelId, max_tokens: 2,
    messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null }, ...hello],
  });
  assert.equal(ok.choices.length, 1);
});

test('a tool whose parameters are not an object is a 400 naming it', async () => {
  for (const parameters of ['notanobject', 5, [1], true]) {
    const r = await request('POST', '/v1/chat/completions', {
      body: {
        model: modelId, messages: hello, max_tokens: 2,
        tools: [{ type: 'function', function: { name: 'f', parameters } }],
      },
    });
    const e = assertApiError(r, 400, JSON.stringify(parameters));
    assert.equal(e.param, 'tools[0].function.parameters');
  }
  const d = await request('POST', '/v1/chat/completions', {
    body: {
      model: modelId, messages: hello, max_tokens: 2,
      tools: [{ type: 'function', function: { name: 'f', description: 7 } }],
    },
  });
  assert.equal(assertApiError(d, 400, 'description').param, 'tools[0].function.description');
});

test('a range error quotes the value sent, not a rounded one', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: modelId, messages: hello, temperature: 2.0000001 }),
    (e) => e.status === 400 && e.param === 'temperature' && /2\.0000001/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: modelId, messages: hello, top_p: 1.0000000001 }),
    (e) => e.status === 400 && e.param === 'top_p' && /1\.0000000001/.test(e.message));
});

test('max_completion_tokens wins over max_tokens (vLLM); seed makes sampling repeatable', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 1, max_completion_tokens: 5, temperature: 0,
  });
  assert.equal(r.usage.completion_tokens, 5);
  const ask = () => client.chat.completions.create({
    model: modelId, messages: hello, max_tokens: 12, temperature: 1, seed: 1234, logprobs: true,
    top_logprobs: 2,
  });
  const [a, b] = [await ask(), await ask()];
  assert.deepEqual(a.choices[0].message, b.choices[0].message);
  assert.deepEqual(a.choices[0].logprobs, b.choices[0].logprobs);
});

test('legacy completions: an empty prompt is a 400 naming prompt; special tokens are not text (vLLM skip_special_tokens)', async () => {
  // A prompt over the context names prompt (there are no messages here), streamed or not.
  for (const stream of [false, true]) {
    const over = await request('POST', '/v1/completions', {
      body: { model: modelId, prompt: 'lorem ipsum '.repeat(20000), max_tokens: 2, stream },
    });
    const e = assertApiError(over, 400, `over the context, stream ${stream}`);
    assert.equal(e.code, 'context_length_exceeded');
    assert.equal(e.param, 'prompt');
  }
  const empty = await request('POST', '/v1/completions', { body: { model: modelId, prompt: '' } });
  const e = assertApiError(empty, 400, 'empty prompt');
  assert.equal(e.param, 'prompt');
  assert.match(e.message, /prompt/);
  // A reserved (added) token forced at every step: its name is not something the model wrote.
  const [reserved] = (await request('POST', '/tokenize',
    { body: { prompt: '<|reserved_token_708|>', allow_special: true } })).json.tokens;
  assert.equal(reserved, 708);
  const ask = (extra) => client.completions.create({
    model: modelId, prompt: 'hi', max_tokens: 3, temperature: 0, logit_bias: { [reserved]: 100 },
    logprobs: 1, ...extra,
  });
  const plain = await ask({});
  assert.equal(plain.choices[0].text, '');
  assert.equal(plain.usage.completion_tokens, 3);
  // logprobs still list the tokens the model produced.
  assert.deepEqual(plain.choices[0].logprobs.tokens, Array(3).fill('<|reserved_token_708|>'));
  const kept = await ask({ skip_special_tokens: false });
  assert.equal(kept.choices[0].text, '<|reserved_token_708|>'.repeat(3));
  let streamed = '';
  for await (const chunk of await ask({ stream: true })) streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, '');
  await assert.rejects(ask({ skip_special_tokens: 'no' }),
    (err) => err.status === 400 && err.param === 'skip_special_tokens');
});

// The host's view of the non-streaming request that a client abandoned.
async function abandon(path, body) {
  const before = await metrics();
  const cancelled = before.value('coli_requests_cancelled_total');
  const controller = new AbortController();
  const pending = fetch(`${base}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    signal: controller.signal,
  }).catch((e) => e);
  assert.ok(await until(async () => (await metrics()).value('coli_requests_active') >= 1),
    `the request never started:\n${(await metrics()).text}`);
  controller.abort();
  const outcome = await pending;
  assert.equal(outcome.name, 'AbortError',
    outcome instanceof Response ? `answered: ${outcome.status} ${await outcome.text()}` : `${outcome}`);
  let after;
  const done = await until(async () => {
    after = await metrics();
    return after.value('coli_requests_active') === 0 &&
      after.value('coli_requests_cancelled_total') > cancelled;
  });
  assert.ok(done, `the abandoned request still runs:\n${after.text}`);
  // Generation really ended: the token counter stands still.
  const tokens = after.value('coli_completion_tokens_total');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await metrics()).value('coli_completion_tokens_total'), tokens);
}

test('a non-streaming request whose client goes away is cancelled at the host', async () => {
  // logit_bias +100 forces one ordinary token at every step: the generation cannot end by itself
  // before the context does (minutes at 5 ms a token).
  const forced = { logit_bias: { 65: 100 }, temperature: 0 };
  await abandon('/v1/chat/completions',
    { model: modelId, messages: hello, max_tokens: 100000, ...forced });
  await abandon('/v1/completions',
    { model: modelId, prompt: 'Once upon a time', max_tokens: 100000, ...forced });
  await abandon('/v1/responses',
    { model: modelId, input: 'Hello', max_output_tokens: 100000, ...forced });
  // And the server still answers.
  const ok = await client.chat.completions.create({ model: modelId, messages: hello, max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('a request waiting in the host queue whose client leaves is cancelled at once (the gateway lets go of it)', async () => {
  // Forced streams (logit_bias: they never end by themselves), one for each of the host's
  // workers, then one more, which waits in its queue. coli_queue_depth also counts a request that
  // an idle worker has not woken up to take yet (on a loaded machine that took up to 1.6 s), so
  // "queued" is only read once every worker runs a held stream: the extra one cannot be taken.
  const controllers = [];
  const held = [];
  const open = () => {
    const c = new AbortController();
    controllers.push(c);
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: c.signal,
      body: JSON.stringify({
        model: modelId, messages: hello, max_tokens: 100000, temperature: 0,
        logit_bias: { 65: 100 }, stream: true,
      }),
    }).then((r) => held.push(r), () => {});  // never read, only held (kept from the GC)
  };
  const state = (m) => ['coli_requests_active', 'coli_queue_depth']
    .map((name) => `${name} ${m.value(name)}`).join(', ') +
    `; answered to the client: ${JSON.stringify(held.map((r) => r.status))}`;
  try {
    let m;
    for (let i = 0; i < WORKERS; i++) open();
    assert.ok(await until(async () => {
      m = await metrics();
      return m.value('coli_requests_active') === WORKERS && m.value('coli_queue_depth') === 0;
    }), `the ${WORKERS} held streams do not all run: ${state(m)}\n${m.text}`);
    open();
    assert.ok(await until(async () => {
      m = await metrics();
      return m.value('coli_requests_active') === WORKERS && m.value('coli_queue_depth') === 1;
    }), `the extra request is not waiting in the queue: ${state(m)}\n${m.text}`);
    // The gateway's thread for the queued request waits for the host's first event; the client
    // leaving cancels its gRPC call at once (ConnectionMonitor), not when a worker frees: a 499
    // to nobody, and the host takes it out of its queue (Engine::Cancel).
    const before = await metrics();
    const gone = (m) => m.value('coli_http_client_disconnects_total');
    const answered499 = (m) => Number(m.text.match(/^coli_http_responses_total\{code="499"\} (\S+)$/m)?.[1] ?? 0);
    controllers.at(-1).abort();
    let after;
    const cancelled = await until(async () => {
      after = await metrics();
      return gone(after) > gone(before) && answered499(after) > answered499(before) &&
        after.value('coli_queue_depth') === 0;
    });
    assert.ok(cancelled, `the abandoned request is still waited for:\n${after.text}`);
    assert.equal(after.value('coli_requests_active'), WORKERS, 'the others still run');
  } finally {
    for (const c of controllers) c.abort();
    assert.ok(await until(async () => {
      const m = await metrics();
      return m.value('coli_requests_active') === 0 && m.value('coli_queue_depth') === 0;
    }), 'the held streams did not end');
  }
});

// Whether this machine has an IPv6 loopback to listen on.
function ipv6Loopback() {
  return new Promise((resolve) => {
    const probe = net.createServer();
    probe.once('error', () => resolve(false));
    probe.listen(0, '::1', () => probe.close(() => resolve(true)));
  });
}

test('on an IPv6 loopback: the printed URL is usable and a client that leaves is still seen', async (t) => {
  if (!(await ipv6Loopback())) {
    t.skip('no IPv6 loopback here');
    return;
  }
  const v6 = await startServer(TINY, { COLI_DECODE_DELAY_MS: '5' }, ['--host', '::1']);
  try {
    // It printed "http://::1:PORT" before, which no URL parser takes.
    const url = new URL(v6.base);
    assert.equal(url.hostname, '[::1]');
    assert.equal((await fetch(`${v6.base}/v1/models`)).status, 200);
    const m = async () => (await (await fetch(`${v6.base}/metrics`)).text());
    const value = (text, name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
    const controller = new AbortController();
    const pending = fetch(`${v6.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: controller.signal,
      body: JSON.stringify({ messages: hello, max_tokens: 100000, temperature: 0, logit_bias: { 65: 100 } }),
    }).catch((e) => e);
    assert.ok(await until(async () => value(await m(), 'coli_requests_active') === 1));
    controller.abort();
    await pending;
    assert.ok(await until(async () => {
      const text = await m();
      return value(text, 'coli_requests_active') === 0 &&
        value(text, 'coli_requests_cancelled_total') === 1;
    }), await m());
  } finally {
    await stopServer(v6);
  }
});

test('a burst of streams beyond the host capacity: the excess gets 429, /health still answers', async () => {
  const { value } = await metrics();
  const capacity = value('coli_queue_capacity');
  const rejectedBefore = value('coli_requests_rejected_total');
  const n = 24;
  const controllers = [];
  const outcomes = [];
  let streaming = 0;
  for (let i = 0; i < n; i++) {
    const controller = new AbortController();
    controllers.push(controller);
    // Each stream is read until the test hangs up (logit_bias keeps it generating till then).
    let streamed = false;  // (counted in `streaming` at the first chunk)
    outcomes.push(client.chat.completions.create({
      model: modelId, messages: [{ role: 'user', content: `stream ${i}` }], max_tokens: 100000,
      temperature: 0, logit_bias: { 65: 100 }, stream: true,
    }, { signal: controller.signal }).then(async (stream) => {
      try {
        for await (const chunk of stream) {
          if (chunk.choices.length && !streamed) {
            streamed = true;
            ++streaming;
          }
        }
      } catch (e) {
        if (!/abort/i.test(`${e.name} ${e.message}`)) return `error ${e.name} ${e.message}`;
      }
      return streamed ? 'streamed' : 'aborted';
    }, (e) => (e.status === 429 ? `429 ${e.type} retry-after ${e.headers?.get('retry-after')}`
      : /abort/i.test(`${e.name} ${e.message}`) ? 'aborted' : `error ${e.name} ${e.message}`)));
  }
  // Every request is either generating, queued at the host, or refused.
  const settled = await until(async () => {
    const m = await metrics();
    const refused = m.value('coli_requests_rejected_total') - rejectedBefore;
    return m.value('coli_requests_active') + m.value('coli_queue_depth') + refused >= n;
  });
  assert.ok(settled, (await metrics()).text);
  // The gateway still has a thread for the health check while all of them wait or run.
  const health = await fetch(`${base}/health`, { signal: AbortSignal.timeout(30000) });
  assert.equal(health.status, 200);
  const m = await metrics();
  assert.ok(m.value('coli_queue_depth') <= capacity);
  if (m.value('coli_requests_active') + capacity < n) {
    assert.ok(m.value('coli_requests_rejected_total') > rejectedBefore, m.text);
  }
  // The ones the host runs do stream before their clients hang up.
  assert.ok(await until(async () => streaming >= 1), 'no stream delivered a chunk');
  for (const c of controllers) c.abort();
  const results = await Promise.all(outcomes);
  for (const r of results) {
    assert.ok(['streamed', 'aborted', '429 rate_limit_error retry-after 1'].includes(r), r);
  }
  assert.ok(results.includes('streamed'), JSON.stringify(results));
  assert.ok(results.some((r) => r.startsWith('429')) ||
    m.value('coli_requests_active') + capacity >= n, JSON.stringify(results));
  // All of them end: nothing generates or waits once their clients are gone.
  let after;
  const drained = await until(async () => {
    after = await metrics();
    return after.value('coli_requests_active') === 0 && after.value('coli_queue_depth') === 0 &&
      after.value('coli_http_streams_active') === 0;
  });
  assert.ok(drained, after.text);
});
