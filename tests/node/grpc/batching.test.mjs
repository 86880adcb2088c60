// coli-host's metrics after a storm with cancellations, from grpc-js (the black-box pass of
// session 13 on continuous batching, docs/status/host-batching.md "Continuous batching under
// load"). Every request's tokens and its session's statistics must count once it ends, however
// it ends: a cancelled request's tokens were missing from completion_tokens, and the statistics
// of its session (the decode rows its prefill chunks carried: mixed_rows) came only with the
// session's next request, or never when that session was closed first.
//
// No timing asserts: waits are for events, bounded by a hang guard.
// Environment (set by CMakeLists.txt): COLI_HOST_BIN, COLI_TINY_MODEL.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { waitFor as waitForUpTo } from './support.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../../..');
const HOST_BIN = process.env.COLI_HOST_BIN ?? path.join(ROOT, 'build/bin/coli-host');
const TINY = process.env.COLI_TINY_MODEL ?? path.join(ROOT, 'build/fixtures/k3_tiny');
const GUARD_MS = 60000;  // a hang guard, never a timing assert

const coliPkg = grpc.loadPackageDefinition(protoLoader.loadSync('coli/v1/coli.proto',
  { longs: Number, enums: String, defaults: true, oneofs: true, includeDirs: [path.join(ROOT, 'proto')] }));

let host;
after(() => host?.proc.kill('SIGTERM'));

// Starts coli-host (prefill chunks of 4 tokens, so a long prompt's prefill carries the other
// requests' decode rows for many passes) and resolves with {proc, client}.
function startHost() {
  return new Promise((resolve, reject) => {
    const proc = spawn(HOST_BIN, ['--listen', '127.0.0.1:0', '--workers', '4', '--model', TINY,
      '--ready-fd', '3'], { env: { ...process.env, K3_CHUNK: '4' }, stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
    let log = '';
    let ready = '';
    proc.stderr.on('data', (d) => { log += d; });
    proc.stdio[3].on('data', (d) => {
      ready += d;
      const m = ready.match(/READY (\S+)/);
      if (m) resolve({ proc, client: new coliPkg.coli.v1.Coli(m[1], grpc.credentials.createInsecure()) });
    });
    proc.on('exit', (code, signal) => reject(new Error(`coli-host exited (${code ?? signal}): ${log}`)));
  });
}

const metrics = (client) => new Promise((resolve, reject) =>
  client.getMetrics({}, { deadline: Date.now() + GUARD_MS }, (e, m) => (e ? reject(e) : resolve(m))));

const waitFor = (pred, what) => waitForUpTo(pred, what, GUARD_MS);

// A Generate call whose client cancels it once `when(event, tokens so far)` holds; resolves
// with the tokens it saw and how it ended.
function generateUntil(client, request, when) {
  return new Promise((resolve) => {
    const call = client.generate(request, { deadline: Date.now() + GUARD_MS });
    let tokens = 0;
    call.on('data', (e) => {
      if (e.token) ++tokens;
      if (when(e, tokens)) call.cancel();
    });
    call.on('error', (e) => resolve({ tokens, code: grpc.status[e.code] }));
    call.on('end', () => resolve({ tokens, code: 'OK' }));
  });
}

test('cancelled requests: their tokens and their sessions\' statistics count at once', async () => {
  host = await startHost();
  const { client } = host;
  const before = await metrics(client);
  // Two long generations; once both decode, a long prompt whose prefill chunks carry their rows.
  let decoding = 0;
  let bothDecode;
  const bothDecoding = new Promise((resolve) => { bothDecode = resolve; });
  let prefillCancelled = false;
  const decoders = [0, 1].map((i) => generateUntil(client,
    { prompt: `decoder ${i}`, maxTokens: 100000 },
    (e, tokens) => {
      if (e.token && tokens === 1 && ++decoding === 2) bothDecode();
      return prefillCancelled && tokens > 40;  // then they are cancelled too
    }));
  await bothDecoding;
  // Cancelled a few dozen chunks into its prefill: the decoders rode those chunk passes.
  const reader = await generateUntil(client,
    { prompt: 'q r '.repeat(800), maxTokens: 10, reportProgress: true },
    (e) => e.progress && e.progress.done >= 120);
  prefillCancelled = true;
  assert.equal(reader.code, 'CANCELLED');
  assert.equal(reader.tokens, 0);
  const ends = await Promise.all(decoders);
  for (const d of ends) assert.equal(d.code, 'CANCELLED');
  await waitFor(async () => (await metrics(client)).requestsActive === 0, 'the host to be idle');
  const m = await metrics(client);
  const delta = (name) => m[name] - before[name];
  const plugin = (name) => (m.plugin[name] ?? 0) - (before.plugin[name] ?? 0);
  assert.equal(delta('requestsCancelled'), 3);
  // Every decode row the host made was a generated token, all of them for cancelled requests.
  assert.ok(delta('decodeRows') >= ends[0].tokens + ends[1].tokens);
  assert.equal(delta('completionTokens'), delta('decodeRows'));
  // The rows that rode the reader's chunk passes, counted by the riders and by the reader.
  assert.ok(plugin('decode_rides') > 0,
    `no decode row rode a prefill pass, or none was counted: ${JSON.stringify(m.plugin)}`);
  assert.equal(plugin('mixed_rows'), plugin('decode_rides'));
});
