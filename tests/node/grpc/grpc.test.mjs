// coli-host's gRPC contract (proto/coli/v1/coli.proto, grpc.health.v1, server reflection) from
// an outside, non-C++ client: @grpc/grpc-js with the .proto files loaded at run time, as a
// Node, Python or Go user would. Each test pins one behaviour found wrong by the black-box pass
// of session 12 (docs/status/issue-7.md) or one a demanding user relies on. No timing asserts:
// waits poll GetMetrics until a state holds (bounded by a hang guard) and calls carry deadlines.
//
// Environment (set by CMakeLists.txt): COLI_HOST_BIN, COLI_BIN, COLI_TINY_MODEL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

import grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { waitFor as waitForUpTo } from './support.mjs';

const require = createRequire(import.meta.url);
const descriptor = require('protobufjs/ext/descriptor');
const protobuf = require('protobufjs');

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../../..');
const HOST_BIN = process.env.COLI_HOST_BIN ?? path.join(ROOT, 'build/bin/coli-host');
const COLI_BIN = process.env.COLI_BIN ?? path.join(ROOT, 'build/bin/coli');
const TINY = process.env.COLI_TINY_MODEL ?? path.join(ROOT, 'build/fixtures/k3_tiny');
const HEALTH_PROTO = path.join(HERE, 'node_modules/grpc-health-check/proto/health/v1/health.proto');
const REFLECTION_PROTO = path.join(HERE,
  'node_modules/@grpc/reflection/build/proto/grpc/reflection/v1alpha/reflection.proto');

const LOAD = { longs: Number, enums: String, defaults: true, oneofs: true };
const coliPkg = grpc.loadPackageDefinition(
  protoLoader.loadSync('coli/v1/coli.proto', { ...LOAD, includeDirs: [path.join(ROOT, 'proto')] }));
const healthPkg = grpc.loadPackageDefinition(protoLoader.loadSync(HEALTH_PROTO, LOAD));
const reflectionPkg = grpc.loadPackageDefinition(
  protoLoader.loadSync(REFLECTION_PROTO, { keepCase: true }));

const insecure = () => grpc.credentials.createInsecure();
const GUARD_MS = 30000;  // a hang guard on every call, never a timing assert
const guard = () => ({ deadline: Date.now() + GUARD_MS });
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'coli-grpc-js-'));

// Starts coli-host and resolves with {proc, address, log()} once it reports READY on fd 3.
function startHost(args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(HOST_BIN, [...args, '--ready-fd', '3'],
      { stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
    let log = '';
    let ready = '';
    proc.stderr.on('data', (d) => { log += d; });
    proc.stdio[3].on('data', (d) => {
      ready += d;
      const m = ready.match(/READY (\S+)/);
      if (m) resolve({ proc, address: m[1], log: () => log });
    });
    proc.on('exit', (code, signal) =>
      reject(new Error(`coli-host exited (${code ?? signal}) before READY: ${log}`)));
  });
}

// Runs coli-host expecting it to fail to start: resolves with {code, log}.
function hostFails(args) {
  return new Promise((resolve) => {
    execFile(HOST_BIN, args, { timeout: GUARD_MS }, (err, stdout, stderr) =>
      resolve({ code: err ? err.code : 0, log: stderr }));
  });
}

function stopHost(host) {
  if (!host || host.proc.exitCode !== null) return Promise.resolve(host?.proc.exitCode);
  return new Promise((resolve) => {
    host.proc.removeAllListeners('exit');
    host.proc.on('exit', (code) => resolve(code));
    host.proc.kill('SIGTERM');
  });
}

const coli = (address) => new coliPkg.coli.v1.Coli(address, insecure());
const healthClient = (address) => new healthPkg.grpc.health.v1.Health(address, insecure());

// A unary call as {ok} or {code, details} (code: the status name).
function unary(client, method, request, options = guard()) {
  return new Promise((resolve) => {
    client[method](request, new grpc.Metadata(), options, (err, response) =>
      resolve(err ? { code: grpc.status[err.code], details: err.details } : { ok: response }));
  });
}

// A whole server stream: {code, details, events}.
function collect(call) {
  return new Promise((resolve) => {
    const events = [];
    call.on('data', (e) => events.push(e));
    call.on('error', (err) => resolve({ code: grpc.status[err.code], details: err.details, events }));
    call.on('end', () => resolve({ code: 'OK', events }));
  });
}
const stream = (client, method, request, options = guard()) =>
  collect(client[method](request, new grpc.Metadata(), options));

const tokenText = (events) =>
  Buffer.concat(events.filter((e) => e.token).map((e) => e.token.token?.text ?? e.token.text))
    .toString();
const tokenIds = (events) => events.filter((e) => e.token).map((e) => e.token.token?.id ?? e.token.id);

async function metrics(client) {
  const r = await unary(client, 'getMetrics', {});
  assert.ok(r.ok, JSON.stringify(r));
  return r.ok;
}

const waitFor = (pred, what) => waitForUpTo(pred, what, GUARD_MS);
const idle = (client) => waitFor(async () => {
  const m = await metrics(client);
  return m.requestsActive === 0 && m.queueDepth === 0;
}, 'the host to be idle');

// A stream's first token event has come.
function firstToken(call) {
  return new Promise((resolve) => {
    const onData = (e) => {
      if (e.token) {
        call.off('data', onData);
        resolve();
      }
    };
    call.on('data', onData);
  });
}

let fast, paced, fastClient, pacedClient;

before(async () => {
  // fast: the tiny model at full speed. paced: 20 ms a token, 2 workers, a queue of 2, so a long
  // generation is certainly still running while a client goes away or the queue fills.
  [fast, paced] = await Promise.all([
    startHost(['--model', TINY, '--listen', '127.0.0.1:0', '--workers', '2', '--queue', '2']),
    startHost(['--model', TINY, '--listen', '127.0.0.1:0', '--workers', '2', '--queue', '2',
      '--decode-delay-ms', '20']),
  ]);
  fastClient = coli(fast.address);
  pacedClient = coli(paced.address);
});

after(async () => {
  fastClient?.close();
  pacedClient?.close();
  const codes = await Promise.all([stopHost(fast), stopHost(paced)]);
  fs.rmSync(scratch, { recursive: true, force: true });
  // A clean exit (0) after everything below: no crash on the way.
  assert.deepEqual(codes, [0, 0], `${fast.log()}\n${paced.log()}`);
});

test('every RPC answers its happy path', async () => {
  const health = await unary(fastClient, 'health', {});
  assert.equal(health.ok.serving, true);
  assert.equal(health.ok.modelsLoaded, 1);
  const models = (await unary(fastClient, 'listModels', {})).ok.models;
  assert.equal(models.length, 1);
  const model = models[0];
  assert.equal(model.id, 'k3_tiny');
  assert.ok(model.vocabSize > 0 && model.contextCapacity > 0);

  const ids = (await unary(fastClient, 'tokenize', { text: 'Hello world' })).ok.ids;
  assert.ok(ids.length > 0);
  const back = (await unary(fastClient, 'detokenize', { ids })).ok.text;
  assert.equal(Buffer.from(back).toString(), 'Hello world');
  const tmpl = await unary(fastClient, 'applyTemplate',
    { requestJson: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
      addGenerationPrompt: true });
  assert.ok(tmpl.ok.ids.length > 0 && tmpl.ok.text.includes('hi'));

  const gen = await stream(fastClient, 'generate', { prompt: 'Hello world', maxTokens: 6 });
  assert.equal(gen.code, 'OK', gen.details);
  assert.deepEqual(gen.events.map((e) => e.event),
    ['started', 'token', 'token', 'token', 'token', 'token', 'token', 'finished']);
  const started = gen.events[0].started;
  assert.equal(started.promptTokens, ids.length);
  assert.equal(started.maxTokens, 6);
  const finished = gen.events.at(-1).finished;
  assert.equal(finished.reason, 'FINISH_REASON_LENGTH');
  assert.equal(finished.usage.completionTokens, 6);

  const chat = await stream(fastClient, 'chat', {
    requestJson: JSON.stringify({ messages: [{ role: 'user', content: 'Hello' }] }), maxTokens: 5 });
  assert.equal(chat.code, 'OK', chat.details);
  assert.equal(chat.events.filter((e) => e.token).length, 5);
  assert.equal(chat.events.at(-1).finished.usage.completionTokens, 5);

  const m = await metrics(fastClient);
  assert.ok(m.requestsOk >= 2);
  assert.equal(m.queueCapacity, 2);
});

test('greedy text is the same through gRPC as through `coli run` and `coli serve`', async () => {
  const prompt = 'The capital of France';
  const gen = await stream(fastClient, 'generate', { prompt, maxTokens: 12 });
  assert.equal(gen.code, 'OK', gen.details);
  // coli run prints the text, then the ids (--print-ids) on the last line.
  const run = await new Promise((resolve, reject) => execFile(COLI_BIN,
    ['run', '--model', TINY, prompt, '--ngen', '12', '--print-ids'],
    { timeout: 60000, encoding: 'buffer', maxBuffer: 1 << 20 },
    (err, stdout) => (err ? reject(err) : resolve(stdout))));
  const out = run.toString();
  const lines = out.replace(/\n$/, '').split('\n');
  const runIds = lines.at(-1).split(',').map(Number);
  assert.deepEqual(tokenIds(gen.events), runIds);
  assert.equal(tokenText(gen.events), lines.slice(0, -1).join('\n'));

  // The chat gateway over its own private host: the same reasoning and content.
  const messages = [{ role: 'user', content: prompt }];
  const chat = await stream(fastClient, 'chat',
    { requestJson: JSON.stringify({ messages }), maxTokens: 12 });
  assert.equal(chat.code, 'OK', chat.details);
  const channels = {};
  for (const e of chat.events.filter((x) => x.token)) {
    for (const d of e.token.deltas) channels[d.channel] = (channels[d.channel] ?? '') + d.text;
  }
  const serve = spawn(COLI_BIN, ['serve', '--model', TINY, '--port', '0'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    const base = await new Promise((resolve, reject) => {
      let text = '';
      serve.stdout.on('data', (d) => {
        text += d;
        const m = text.match(/listening on (http:\/\/\S+)/);
        if (m) resolve(m[1]);
      });
      serve.on('exit', (code) => reject(new Error(`coli serve exited ${code}`)));
    });
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'k3_tiny', messages, max_tokens: 12, temperature: 0 }),
    });
    const body = await r.json();
    assert.equal(r.status, 200, JSON.stringify(body));
    const message = body.choices[0].message;
    assert.equal(message.reasoning_content ?? '', channels.CHANNEL_REASONING ?? '');
    assert.equal(message.content ?? '', channels.CHANNEL_CONTENT ?? '');
  } finally {
    serve.kill('SIGTERM');
  }
});

// Each user error: a clear status naming the field, before any work (no Started event), never
// INTERNAL / UNKNOWN, never a hang.
test('bad requests end with a clear status that names the field', async () => {
  const long = 'word '.repeat(9000);  // past the tiny model's 8192-token context
  const msg = (m) => JSON.stringify({ messages: m });
  const cases = [
    ['generate', { model: 'nope', prompt: 'x' }, 'NOT_FOUND', /model 'nope'/],
    ['generate', { prompt: '' }, 'INVALID_ARGUMENT', /EMPTY_PROMPT/],
    ['generate', { prompt: long }, 'RESOURCE_EXHAUSTED', /CONTEXT_EXCEEDED prompt_tokens=\d+ capacity=8192/],
    ['generate', { prompt: 'hi', maxTokens: -1 }, 'INVALID_ARGUMENT', /max_tokens -1/],
    ['generate', { prompt: 'hi', sampling: { temperature: NaN } }, 'INVALID_ARGUMENT', /temperature nan/],
    ['generate', { prompt: 'hi', sampling: { temperature: -0.5 } }, 'INVALID_ARGUMENT', /temperature -0.5/],
    ['generate', { prompt: 'hi', sampling: { temperature: Infinity } }, 'INVALID_ARGUMENT', /temperature inf/],
    ['generate', { prompt: 'hi', sampling: { topP: 1.5 } }, 'INVALID_ARGUMENT', /top_p 1.5/],
    ['generate', { prompt: 'hi', sampling: { topK: -2 } }, 'INVALID_ARGUMENT', /top_k -2/],
    ['generate', { prompt: 'hi', sampling: { logprobs: 21 } }, 'INVALID_ARGUMENT', /logprobs 21/],
    ['generate', { prompt: 'hi', sampling: { minP: 2 } }, 'INVALID_ARGUMENT', /min_p 2/],
    ['generate', { prompt: 'hi', sampling: { repetitionPenalty: -1 } }, 'INVALID_ARGUMENT', /repetition_penalty -1/],
    ['generate', { prompt: 'hi', sampling: { frequencyPenalty: NaN } }, 'INVALID_ARGUMENT', /frequency_penalty nan/],
    ['generate', { prompt: 'hi', sampling: { presencePenalty: 3 } }, 'INVALID_ARGUMENT', /presence_penalty 3/],
    ['generate', { prompt: 'hi', sampling: { logitBias: [{ id: 768, bias: 1 }] } }, 'INVALID_ARGUMENT', /logit_bias: token id 768 is outside \[0, 768\)/],
    // Was "token id -1 is outside [0, 0)": checked before the model's vocabulary is known.
    ['generate', { prompt: 'hi', sampling: { logitBias: [{ id: -1, bias: 1 }] } }, 'INVALID_ARGUMENT', /^logit_bias: token id -1 is negative$/],
    ['generate', { prompt: 'hi', sampling: { logitBias: [{ id: 1, bias: NaN }] } }, 'INVALID_ARGUMENT', /logit_bias: the bias of token id 1, nan/],
    ['generate', { promptIds: [100000] }, 'INVALID_ARGUMENT', /prompt token 0 id 100000/],
    ['generate', { promptIds: [5, -3] }, 'INVALID_ARGUMENT', /prompt token 1 id -3/],
    ['generate', { prompt: 'hi', responseFormat: '{oops' }, 'INVALID_ARGUMENT', /response_format/],
    ['generate', { prompt: 'hi', responseFormat: '{"type":"xml"}' }, 'INVALID_ARGUMENT', /response_format\.type/],
    ['chat', { requestJson: '{not json' }, 'INVALID_ARGUMENT', /not valid JSON/],
    ['chat', { requestJson: '' }, 'INVALID_ARGUMENT', /request body/],
    ['chat', { requestJson: '[]' }, 'INVALID_ARGUMENT', /must be a JSON object/],
    ['chat', { requestJson: '{}' }, 'INVALID_ARGUMENT', /^messages: /],
    ['chat', { requestJson: msg([]) }, 'INVALID_ARGUMENT', /^messages: /],
    ['chat', { requestJson: msg([{ role: 'wizard', content: 'x' }]) }, 'INVALID_ARGUMENT', /messages\[0\]\.role: unknown role 'wizard'/],
    ['chat', { requestJson: msg([{ content: 'x' }]) }, 'INVALID_ARGUMENT', /messages\[0\]\.role/],
    ['chat', { requestJson: msg([{ role: 'user', content: 5 }]) }, 'INVALID_ARGUMENT', /messages\[0\]\.content/],
    ['chat', { requestJson: msg([{ role: 'user', content: 'x' }, { role: 'tool', content: 'r' }]) }, 'INVALID_ARGUMENT', /messages\[1\]: a tool message/],
    ['chat', { requestJson: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], tools: 5 }) }, 'INVALID_ARGUMENT', /^tools: /],
    ['chat', { requestJson: msg([{ role: 'user', content: 'x' }]), sampling: { topP: -1 } }, 'INVALID_ARGUMENT', /top_p -1/],
    ['chat', { model: 'nope', requestJson: msg([{ role: 'user', content: 'x' }]) }, 'NOT_FOUND', /model 'nope'/],
  ];
  for (const [method, request, code, message] of cases) {
    const r = await stream(fastClient, method, { maxTokens: 2, ...request });
    const what = `${method} ${JSON.stringify(request).slice(0, 120)}`;
    assert.equal(r.code, code, `${what}: ${r.code} ${r.details}`);
    assert.match(r.details, message, what);
    assert.equal(r.events.length, 0, `${what}: no Started before the error`);
  }
  // Unary RPCs the same.
  const unaryCases = [
    ['tokenize', { model: 'nope', text: 'x' }, 'NOT_FOUND', /model 'nope'/],
    ['detokenize', { ids: [100000] }, 'INVALID_ARGUMENT', /token id 100000/],
    ['applyTemplate', { requestJson: '{bad' }, 'INVALID_ARGUMENT', /not valid JSON/],
    ['unloadModel', { model: 'nope' }, 'NOT_FOUND', /model 'nope'/],
  ];
  for (const [method, request, code, message] of unaryCases) {
    const r = await unary(fastClient, method, request);
    assert.equal(r.code, code, `${method}: ${JSON.stringify(r)}`);
    assert.match(r.details, message, method);
  }
  const load = await stream(fastClient, 'loadModel', { modelDir: path.join(scratch, 'none') });
  assert.equal(load.code, 'NOT_FOUND');
  assert.match(load.details, /does not exist/);
  // A live id used again is ALREADY_EXISTS; Cancel of an unknown or finished id answers
  // found=false (not an error: a client racing its request's end must not see one).
  const live = pacedClient.generate({ prompt: 'hi', maxTokens: 500, requestId: 'twice' },
    new grpc.Metadata(), guard());
  const liveDone = collect(live);
  await firstToken(live);
  const dup = await stream(pacedClient, 'generate', { prompt: 'hi', requestId: 'twice' });
  assert.equal(dup.code, 'ALREADY_EXISTS');
  assert.match(dup.details, /request id 'twice'/);
  assert.equal((await unary(pacedClient, 'cancel', { requestId: 'twice' })).ok.found, true);
  assert.equal((await liveDone).code, 'CANCELLED');
  assert.equal((await unary(pacedClient, 'cancel', { requestId: 'twice' })).ok.found, false);
  assert.equal((await unary(pacedClient, 'cancel', { requestId: 'never-was' })).ok.found, false);
  // max_tokens 0 or beyond the context is clamped (Started tells); an unknown session name is
  // a new named session, not an error.
  for (const maxTokens of [0, 2147483647]) {
    const call = fastClient.generate({ prompt: 'hi', maxTokens, session: `fresh-${maxTokens}` },
      new grpc.Metadata(), guard());
    const done = collect(call);
    const started = await new Promise((resolve) => call.on('data', (e) => resolve(e.started)));
    call.cancel();
    assert.equal((await done).code, 'CANCELLED');
    assert.equal(started.maxTokens, 8192 - started.promptTokens);
  }
  await idle(fastClient);
});

test('a burst of workers + queue requests is admitted; one more is RESOURCE_EXHAUSTED', async () => {
  // The host counted a burst against the queue before its idle workers had taken any: 3 of 4
  // parallel requests (2 workers + 2 queued) were refused at random.
  for (let round = 0; round < 3; round++) {
    const results = await Promise.all([0, 1, 2, 3].map((i) =>
      stream(fastClient, 'generate', { prompt: `burst ${round} ${i}`, maxTokens: 2 })));
    assert.deepEqual(results.map((r) => r.code), ['OK', 'OK', 'OK', 'OK'],
      results.map((r) => r.details).join('; '));
  }
  // Full for real: 2 running and 2 queued on the paced host, then the fifth is refused.
  const calls = [0, 1, 2, 3].map((i) => pacedClient.generate(
    { prompt: `long ${i}`, maxTokens: 1000, requestId: `full-${i}` }, new grpc.Metadata(), guard()));
  const done = calls.map(collect);
  await waitFor(async () => {
    const m = await metrics(pacedClient);
    return m.requestsActive === 2 && m.queueDepth === 2;
  }, '2 running + 2 queued');
  const refused = await stream(pacedClient, 'generate', { prompt: 'one more', maxTokens: 2 });
  assert.equal(refused.code, 'RESOURCE_EXHAUSTED');
  assert.match(refused.details, /request queue is full \(2 waiting, capacity 2\)/);
  // Cancel ends the queued ones at once, without waiting for a worker.
  for (let i = 0; i < 4; i++) {
    assert.equal((await unary(pacedClient, 'cancel', { requestId: `full-${i}` })).ok.found, true);
  }
  for (const r of await Promise.all(done)) assert.equal(r.code, 'CANCELLED', r.details);
  await idle(pacedClient);
});

test('a deadline mid-stream, a cancelled call, a killed client: the worker is freed', async () => {
  const before_ = await metrics(pacedClient);
  // Deadline: expires while tokens stream (20 ms each, 1000 asked for).
  const late = pacedClient.generate({ prompt: 'deadline', maxTokens: 1000 }, new grpc.Metadata(),
    { deadline: Date.now() + 1500 });
  const lateDone = collect(late);
  const lateResult = await lateDone;
  assert.equal(lateResult.code, 'DEADLINE_EXCEEDED');
  await idle(pacedClient);

  // The client cancels its call after the first token.
  const cancelled = pacedClient.generate({ prompt: 'cancel', maxTokens: 1000 },
    new grpc.Metadata(), guard());
  const cancelledDone = collect(cancelled);
  await firstToken(cancelled);
  cancelled.cancel();
  assert.equal((await cancelledDone).code, 'CANCELLED');
  await idle(pacedClient);

  // A client process killed mid-stream (no RST_STREAM, the socket just closes), on a pooled
  // and on a named session.
  for (const session of ['', 'killed-client']) {
    const child = spawn(process.execPath, ['--input-type=module', '-e', `
      import grpc from '@grpc/grpc-js';
      import * as protoLoader from '@grpc/proto-loader';
      const pkg = grpc.loadPackageDefinition(protoLoader.loadSync('coli/v1/coli.proto',
        { includeDirs: [${JSON.stringify(path.join(ROOT, 'proto'))}] }));
      const c = new pkg.coli.v1.Coli(${JSON.stringify(paced.address)}, grpc.credentials.createInsecure());
      const call = c.Generate({ prompt: 'killed', maxTokens: 100000, session: ${JSON.stringify(session)} });
      call.on('data', (e) => { if (e.token) console.log('TOKEN'); });
      call.on('error', () => {});
    `], { cwd: HERE, stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise((resolve) => child.stdout.on('data', resolve));
    assert.equal((await metrics(pacedClient)).requestsActive, 1);
    child.kill('SIGKILL');
    await idle(pacedClient);
    const next = await stream(pacedClient, 'generate', { prompt: 'next', maxTokens: 2, session });
    assert.equal(next.code, 'OK', next.details);
  }
  const after_ = await metrics(pacedClient);
  assert.equal(after_.requestsCancelled - before_.requestsCancelled, 4);
  assert.equal(after_.requestsActive, 0);
  assert.equal(after_.queueDepth, 0);
});

test('a slow reader stalls nobody: others finish, its own request finishes host-side', async () => {
  const before_ = await metrics(fastClient);
  // 600 tokens with 20 top logprobs each: far more than HTTP/2's 64 KiB window, so the host's
  // writes wait on this reader while it reads nothing.
  const slow = fastClient.generate({ prompt: 'slow', maxTokens: 600, sampling: { logprobs: 20 } },
    new grpc.Metadata(), guard());
  const slowDone = collect(slow);
  await firstToken(slow);
  slow.pause();
  const others = await Promise.all([0, 1, 2].map((i) =>
    stream(fastClient, 'generate', { prompt: `other ${i}`, maxTokens: 5 })));
  for (const r of others) assert.equal(r.code, 'OK', r.details);
  // All four generations end on the host while the slow reader still reads nothing.
  await waitFor(async () => (await metrics(fastClient)).requestsOk - before_.requestsOk === 4,
    'the slow reader\'s generation to end host-side');
  slow.resume();
  const r = await slowDone;
  assert.equal(r.code, 'OK', r.details);
  assert.equal(r.events.length, 602);  // Started, 600 tokens, Finished: nothing lost while paused
  const bytes = r.events.filter((e) => e.token)
    .reduce((n, e) => n + 40 * (1 + e.token.logprobs.top.length), 0);
  assert.ok(bytes > 128 * 1024, `only ~${bytes} bytes streamed`);
});

test('grpc.health.v1 Check and Watch answer for the server and for coli.v1.Coli', async () => {
  const health = healthClient(fast.address);
  for (const service of ['', 'coli.v1.Coli']) {
    const r = await unary(health, 'check', { service });
    assert.equal(r.ok?.status, 'SERVING', `Check("${service}"): ${JSON.stringify(r)}`);
  }
  const unknown = await unary(health, 'check', { service: 'no.such.Service' });
  assert.equal(unknown.code, 'NOT_FOUND');
  const watch = health.watch({ service: 'coli.v1.Coli' }, new grpc.Metadata(), guard());
  const first = await new Promise((resolve, reject) => {
    watch.on('data', resolve);
    watch.on('error', reject);
  });
  assert.equal(first.status, 'SERVING');
  watch.cancel();
  health.close();
});

// A generic client (grpcurl, Postman, a dynamic language) has only reflection to go on: every
// listed service must resolve to complete file descriptors, and a client built from them alone
// must be able to call each method.
test('server reflection resolves every service; a client built from it calls every method', async () => {
  const reflection = new reflectionPkg.grpc.reflection.v1alpha.ServerReflection(
    fast.address, insecure());
  const call = reflection.ServerReflectionInfo(new grpc.Metadata(), guard());
  const waiting = [];
  call.on('data', (m) => waiting.shift()?.resolve(m));
  call.on('error', (e) => { while (waiting.length) waiting.shift().reject(e); });
  const ask = (request) => new Promise((resolve, reject) => {
    waiting.push({ resolve, reject });
    call.write(request);
  });
  const listed = await ask({ list_services: '' });
  const services = listed.list_services_response.service.map((s) => s.name).sort();
  assert.deepEqual(services,
    ['coli.v1.Coli', 'grpc.health.v1.Health', 'grpc.reflection.v1alpha.ServerReflection']);
  const files = new Map();
  const addFiles = (response) => {
    assert.ok(response.file_descriptor_response,
      `reflection error: ${JSON.stringify(response.error_response)}`);
    for (const bytes of response.file_descriptor_response.file_descriptor_proto) {
      files.set(descriptor.FileDescriptorProto.decode(bytes).name, bytes);
    }
  };
  for (const name of services) addFiles(await ask({ file_containing_symbol: name }));
  // Every import resolved too.
  for (let added = true; added;) {
    added = false;
    for (const bytes of [...files.values()]) {
      for (const dep of descriptor.FileDescriptorProto.decode(bytes).dependency) {
        if (!files.has(dep)) {
          addFiles(await ask({ file_by_filename: dep }));
          added = true;
        }
      }
    }
  }
  call.end();
  reflection.close();
  const root = protobuf.Root.fromDescriptor({
    file: [...files.values()].map((b) => descriptor.FileDescriptorProto.decode(b)) });
  root.resolveAll();
  assert.deepEqual(Object.keys(root.lookupService('coli.v1.Coli').methods).sort(),
    ['ApplyTemplate', 'Cancel', 'Chat', 'Detokenize', 'Generate', 'GetMetrics', 'Health',
      'ListModels', 'LoadModel', 'Tokenize', 'UnloadModel']);
  assert.deepEqual(Object.keys(root.lookupService('grpc.health.v1.Health').methods).sort(),
    ['Check', 'Watch']);

  // A client from the reflected descriptors alone (as a FileDescriptorSet: field 1 repeated).
  const set = Buffer.concat([...files.values()].map((b) => {
    const header = protobuf.Writer.create().uint32(10).uint32(b.length).finish();
    return Buffer.concat([header, b]);
  }));
  const pkg = grpc.loadPackageDefinition(
    protoLoader.loadFileDescriptorSetFromBuffer(set, { keepCase: true, longs: Number, enums: String, defaults: true }));
  const c = new pkg.coli.v1.Coli(fast.address, insecure());
  const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] });
  assert.equal((await unary(c, 'Health', {})).ok.serving, true);
  const model = (await unary(c, 'ListModels', {})).ok.models[0];
  assert.equal(model.id, 'k3_tiny');
  assert.ok((await unary(c, 'GetMetrics', {})).ok.queue_capacity > 0);
  const ids = (await unary(c, 'Tokenize', { text: 'hi' })).ok.ids;
  assert.equal(Buffer.from((await unary(c, 'Detokenize', { ids })).ok.text).toString(), 'hi');
  assert.ok((await unary(c, 'ApplyTemplate', { request_json: body })).ok.ids.length > 0);
  assert.equal((await unary(c, 'Cancel', { request_id: 'none' })).ok.found, false);
  const gen = await stream(c, 'Generate', { prompt: 'hi', max_tokens: 2 });
  assert.equal(gen.code, 'OK', gen.details);
  assert.equal(gen.events.at(-1).finished.usage.completion_tokens, 2);
  const chat = await stream(c, 'Chat', { request_json: body, max_tokens: 2 });
  assert.equal(chat.code, 'OK', chat.details);
  // LoadModel of the loaded model returns it; UnloadModel of an unknown id is NOT_FOUND.
  const load = await stream(c, 'LoadModel', { model_dir: model.model_dir });
  assert.equal(load.code, 'OK', load.details);
  assert.equal(load.events.at(-1).loaded.id, 'k3_tiny');
  assert.equal((await unary(c, 'UnloadModel', { model: 'nope' })).code, 'NOT_FOUND');
  c.close();
  const h = new pkg.grpc.health.v1.Health(fast.address, insecure());
  assert.equal((await unary(h, 'Check', { service: 'coli.v1.Coli' })).ok.status, 'SERVING');
  h.close();
});

// Hosts without a model below: listening and health need none, and they start at once.
test('a unix socket: served; a live host\'s socket is never taken; a stale one is replaced', async () => {
  const socket = path.join(scratch, 'host.sock');
  const first = await startHost(['--listen', `unix:${socket}`]);
  try {
    const c = coli(`unix:${socket}`);
    assert.equal((await unary(c, 'health', {})).ok.serving, true);
    // A second host on the same path used to unlink the live socket (the first unreachable) and
    // start; it must refuse instead.
    const second = await hostFails(['--listen', `unix:${socket}`]);
    assert.notEqual(second.code, 0);
    assert.match(second.log, /another process is listening/);
    assert.equal((await unary(c, 'health', {})).ok.serving, true);
    c.close();
  } finally {
    assert.equal(await stopHost(first), 0);
  }
  assert.equal(fs.existsSync(socket), false, 'the host removes its socket at exit');

  // A stale socket: its listener killed, the file left behind.
  const holder = spawn(process.execPath, ['-e',
    `require('net').createServer().listen(${JSON.stringify(socket)}, () => console.log('up'))`],
  { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((resolve) => holder.stdout.on('data', resolve));
  holder.kill('SIGKILL');
  await new Promise((resolve) => holder.on('exit', resolve));
  assert.ok(fs.statSync(socket).isSocket());
  const third = await startHost(['--listen', `unix:${socket}`]);
  const c = coli(`unix:${socket}`);
  assert.equal((await unary(c, 'health', {})).ok.serving, true);
  c.close();
  assert.equal(await stopHost(third), 0);

  // A path that is not a socket is refused and kept.
  const file = path.join(scratch, 'precious.txt');
  fs.writeFileSync(file, 'keep me');
  const refused = await hostFails(['--listen', `unix:${file}`]);
  assert.notEqual(refused.code, 0);
  assert.match(refused.log, /not a socket/);
  assert.equal(fs.readFileSync(file, 'utf8'), 'keep me');
});

test('a second host on a busy TCP port refuses to start', async () => {
  // gRPC's default SO_REUSEPORT let it start and take part of the first host's connections.
  const second = await hostFails(['--listen', fast.address]);
  assert.notEqual(second.code, 0);
  assert.match(second.log, /cannot listen on/);
  assert.equal((await unary(fastClient, 'health', {})).ok.serving, true);
});

test('on SIGTERM a health Watch sees NOT_SERVING and streams end with a status', async () => {
  const host = await startHost(['--model', TINY, '--listen', '127.0.0.1:0',
    '--decode-delay-ms', '20']);
  const health = healthClient(host.address);
  const c = coli(host.address);
  const watch = health.watch({ service: 'coli.v1.Coli' }, new grpc.Metadata(), guard());
  const statuses = [];
  const watchEnd = new Promise((resolve) => {
    watch.on('data', (m) => statuses.push(m.status));
    watch.on('error', resolve);
    watch.on('end', resolve);
  });
  await waitFor(() => statuses.length > 0, 'the first Watch message');
  const running = c.generate({ prompt: 'shutdown', maxTokens: 1000 }, new grpc.Metadata(), guard());
  const runningDone = collect(running);
  await firstToken(running);
  assert.equal(await stopHost(host), 0);
  await watchEnd;
  assert.deepEqual(statuses, ['SERVING', 'NOT_SERVING']);
  const r = await runningDone;
  assert.ok(['UNAVAILABLE', 'CANCELLED'].includes(r.code), `${r.code} ${r.details}`);
  c.close();
  health.close();
});
