// Soak test of coli-host alone over gRPC (@grpc/grpc-js from tests/node/grpc/node_modules): rounds
// of Generate / Chat run to the end, cancelled by the client, stopped and cancelled through the
// Cancel RPC, dropped with their channel mid-stream, cut by a deadline, on pooled and on named
// sessions, plus Tokenize and GetMetrics on fresh channels; after each round, once the host is
// idle, its resident memory, descriptors, threads and session gauges (docs/status/soak.md).
//
//   node tools/soak/soak_grpc.mjs [--host-bin build/bin/coli-host] [--model build/fixtures/k3_tiny]
//        [--rounds 5] [--per-round 400] [--concurrency 8] [--delay-ms 2] [--kinds a,b]
//
// Exits 1 when descriptors, threads or sessions are higher after the last round than after the
// first (warm-up) one.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const require = createRequire(path.join(ROOT, 'tests/node/grpc/package.json'));
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const HOST_BIN = args['host-bin'] ?? path.join(ROOT, 'build/bin/coli-host');
const MODEL = path.resolve(args.model ?? path.join(ROOT, 'build/fixtures/k3_tiny'));
const ROUNDS = Number(args.rounds ?? 5);
const PER_ROUND = Number(args['per-round'] ?? 400);
const CONCURRENCY = Number(args.concurrency ?? 8);

const LOAD = { longs: Number, enums: String, defaults: true, oneofs: true };
const coliPkg = grpc.loadPackageDefinition(
  protoLoader.loadSync('coli/v1/coli.proto', { ...LOAD, includeDirs: [path.join(ROOT, 'proto')] }));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function startHost() {
  return new Promise((resolve, reject) => {
    const sock = path.join(fs.mkdtempSync('/tmp/coli-soak-'), 'host.sock');
    const proc = spawn(HOST_BIN, ['--listen', `unix:${sock}`, '--workers', '4', '--queue', '16',
      '--model', MODEL, '--ready-fd', '3'], {
      env: { ...process.env, COLI_DECODE_DELAY_MS: String(args['delay-ms'] ?? 2) },
      stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
    let ready = '', log = '';
    proc.stderr.on('data', (d) => { log += d; if (log.length > 1e6) log = log.slice(-1e5); });
    proc.stdio[3].on('data', (d) => {
      ready += d;
      const m = ready.match(/READY (\S+)/);
      if (m) resolve({ proc, address: m[1] });
    });
    proc.on('exit', (code) => reject(new Error(`coli-host exited ${code}: ${log}`)));
  });
}

function procStats(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return { rss_kib: Number(status.match(/^VmRSS:\s+(\d+)/m)[1]),
    fds: fs.readdirSync(`/proc/${pid}/fd`).length,
    threads: fs.readdirSync(`/proc/${pid}/task`).length };
}

const host = await startHost();
const shared = new coliPkg.coli.v1.Coli(host.address, grpc.credentials.createInsecure());
const fresh = () => new coliPkg.coli.v1.Coli(host.address, grpc.credentials.createInsecure());
const deadline = (ms = 60000) => ({ deadline: Date.now() + ms });
const unary = (client, method, req, opts = deadline()) => new Promise((resolve) =>
  client[method](req, new grpc.Metadata(), opts, (err, r) => resolve(err ? { err } : { ok: r })));
const statuses = {};
const count = (k, s) => { statuses[`${k}:${s}`] = (statuses[`${k}:${s}`] ?? 0) + 1; };

// Streams `call` and ends as {code, events}; `onEvent(e, n)` may cancel it.
const drain = (kind, call, onEvent = () => {}) => new Promise((resolve) => {
  let n = 0, ended = false;
  const end = (s) => { if (!ended) { ended = true; count(kind, s); resolve(); } };
  call.on('data', (e) => onEvent(e, ++n));
  call.on('error', (e) => end(grpc.status[e.code]));
  call.on('end', () => end('OK'));
});

let seq = 0;
const KINDS = {
  generate: () => drain('generate',
    shared.generate({ prompt: 'Hello', maxTokens: 8 }, new grpc.Metadata(), deadline())),
  chat: () => drain('chat', shared.chat({ requestJson: JSON.stringify(
    { messages: [{ role: 'user', content: 'Hi' }] }), maxTokens: 8 },
  new grpc.Metadata(), deadline())),
  client_cancel: () => {
    const call = shared.generate({ prompt: 'long', maxTokens: 300 }, new grpc.Metadata(),
      deadline());
    return drain('client_cancel', call, (e, n) => { if (n === 3) call.cancel(); });
  },
  cancel_rpc: () => {
    const id = `soak-${process.pid}-${seq++}`;
    const stop = seq % 2 === 0;
    const call = shared.generate({ prompt: 'long', maxTokens: 300, requestId: id },
      new grpc.Metadata(), deadline());
    return drain('cancel_rpc', call, (e, n) => {
      if (n === 3) unary(shared, 'cancel', { requestId: id, stop });
    });
  },
  deadline: () => drain('deadline', shared.generate({ prompt: 'long', maxTokens: 300 },
    new grpc.Metadata(), deadline(30))),
  process_gone: () => new Promise((resolve) => {  // a client process that dies mid-stream
    const child = spawn(process.execPath, ['--input-type=module', '-e', `
      import { createRequire } from 'node:module';
      const require = createRequire(${JSON.stringify(path.join(ROOT, 'tests/node/grpc/package.json'))});
      const grpc = require('@grpc/grpc-js');
      const loader = require('@grpc/proto-loader');
      const pkg = grpc.loadPackageDefinition(loader.loadSync('coli/v1/coli.proto',
        { includeDirs: [${JSON.stringify(path.join(ROOT, 'proto'))}] }));
      const c = new pkg.coli.v1.Coli(${JSON.stringify(host.address)}, grpc.credentials.createInsecure());
      let n = 0;
      c.generate({ prompt: 'long', maxTokens: 300 }).on('data', () => { if (++n === 3) process.exit(0); });
    `], { stdio: 'ignore' });
    child.on('exit', (code) => { count('process_gone', code); resolve(); });
  }),
  named_session: () => drain('named_session', shared.generate(
    { prompt: 'Hello there', maxTokens: 4, session: `conv-${seq++}` }, new grpc.Metadata(),
    deadline())),
  misc: async () => {
    const c = fresh();
    count('tokenize', (await unary(c, 'tokenize', { text: 'hello' })).err ? 'ERR' : 'OK');
    count('metrics', (await unary(c, 'getMetrics', {})).err ? 'ERR' : 'OK');
    c.close();
  },
};
const chosen = args.kinds ? args.kinds.split(',') : Object.keys(KINDS);

async function runRound(n) {
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < n) await KINDS[chosen[next++ % chosen.length]]();
  }));
}

async function gauges() {
  const m = (await unary(shared, 'getMetrics', {})).ok;
  const stat = (name) => m.modelStats.find((x) => x.name === name)?.value;
  return { active: m.requestsActive, queue: m.queueDepth, total: m.requestsTotal,
    sessions: stat('host_sessions'), sessions_closed: stat('host_sessions_closed') };
}

const rows = [];
async function sample(requests) {
  for (let i = 0; i < 600; i++) {
    const g = await gauges();
    if (!g.active && !g.queue) break;
    await sleep(100);
  }
  await sleep(2000);
  const g = await gauges();
  const s = procStats(host.proc.pid);
  rows.push({ requests, ...s, ...g });
  console.log(`${String(requests).padStart(6)} req | host rss ${s.rss_kib} KiB fds ${s.fds} thr ` +
    `${s.threads} | sessions ${g.sessions} closed ${g.sessions_closed} active ${g.active} ` +
    `queue ${g.queue} requests ${g.total}`);
}

let failed = false;
try {
  await sample(0);
  for (let r = 1; r <= ROUNDS; r++) {
    await runRound(PER_ROUND);
    await sample(r * PER_ROUND);
  }
  const first = rows[1] ?? rows[0], last = rows.at(-1);
  for (const k of ['fds', 'threads', 'sessions']) {
    if (last[k] > first[k]) { console.log(`GROWS: ${k} ${first[k]} -> ${last[k]}`); failed = true; }
  }
  console.log('statuses', JSON.stringify(statuses));
} finally {
  shared.close();
  host.proc.removeAllListeners('exit');
  host.proc.kill('SIGTERM');
}
process.exitCode = failed ? 1 : 0;
