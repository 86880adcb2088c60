// Soak test of `coli serve` and its private coli-host: drives rounds of every kind of request a
// real client sends (good and bad) and, after each round once the server is idle, records for
// both processes the resident memory, open descriptors and threads, and the gauges of /metrics.
// A resource that grows with the request count is a leak (docs/status/soak.md).
//
//   node tools/soak/soak.mjs [--coli build/bin/coli] [--model build/fixtures/k3_tiny]
//        [--rounds 5] [--per-round 400] [--concurrency 8] [--port 0] [--delay-ms 2]
//        [--kinds a,b,...] [--json FILE]
//
// Node's own modules only. Exits 1 when a counted resource (fds, threads, sessions, streams,
// stored responses) is higher after the last round than after the first (warm-up) one.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
    return acc;
  }, []));
const COLI = args.coli ?? 'build/bin/coli';
const MODEL = args.model ?? 'build/fixtures/k3_tiny';
const ROUNDS = Number(args.rounds ?? 5);
const PER_ROUND = Number(args['per-round'] ?? 400);
const CONCURRENCY = Number(args.concurrency ?? 8);
const DELAY_MS = String(args['delay-ms'] ?? 2);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function startServer() {
  return new Promise((resolve, reject) => {
    const proc = spawn(COLI, ['serve', '--model', MODEL, '--port', String(args.port ?? 0),
      '--workers', '4', '--queue', String(args.queue ?? 8), '--max-background', '8', '--http-threads', '64'], {
      env: { ...process.env, COLI_DECODE_DELAY_MS: DELAY_MS },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '', err = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/([^\s:]+):(\d+)/);
      if (m) resolve({ proc, port: Number(m[2]), stderr: () => err });
    });
    proc.stderr.on('data', (d) => { err += d; if (err.length > 1e6) err = err.slice(-1e5); });
    proc.on('exit', (code) => reject(new Error(`coli serve exited ${code}: ${err}`)));
  });
}

// Resident KiB, open descriptors and threads of `pid`.
function procStats(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const rss = Number(status.match(/^VmRSS:\s+(\d+)/m)[1]);
  return { rss_kib: rss, fds: fs.readdirSync(`/proc/${pid}/fd`).length,
    threads: fs.readdirSync(`/proc/${pid}/task`).length };
}

function childPid(pid) {
  for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
    const kids = fs.readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').trim();
    if (kids) return Number(kids.split(/\s+/)[0]);
  }
  return null;
}

let PORT = 0;
const base = () => `http://127.0.0.1:${PORT}`;

async function metrics() {
  const text = await (await fetch(`${base()}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^(coli_[a-z_]+)(\{[^}]*name="([a-z_]+)"\})? (\S+)$/);
    if (m) out[m[3] ?? m[1]] = Number(m[4]);
  }
  return out;
}

async function post(path, body, extra = {}) {
  const r = await fetch(`${base()}${path}`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body), ...extra });
  const text = await r.text();
  return { status: r.status, text };
}

// Opens a streamed POST and reads `chunks` body chunks, then aborts (0: before any).
async function streamThenAbort(path, body, chunks, method = 'POST') {
  const ac = new AbortController();
  try {
    const r = await fetch(`${base()}${path}`, { method, signal: ac.signal,
      headers: { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body) });
    const reader = r.body.getReader();
    for (let i = 0; i < chunks; i++) if ((await reader.read()).done) break;
  } catch { /* aborted */ }
  ac.abort();
}

// Raw TCP: writes `data` pieces (with `gapMs` between), then closes without reading.
function rawThenClose(pieces, gapMs = 0, waitReply = false) {
  return new Promise((resolve) => {
    const sock = net.connect(PORT, '127.0.0.1', async () => {
      for (const p of pieces) {
        if (sock.destroyed) break;
        sock.write(p);
        if (gapMs) await sleep(gapMs);
      }
      if (!waitReply) sock.destroy();
    });
    let got = '';
    sock.on('data', (d) => { got += d; if (waitReply) sock.destroy(); });
    sock.on('error', () => {});
    sock.on('close', () => resolve(got));
  });
}

const user = (t) => [{ role: 'user', content: t }];
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const idleSockets = [];
const statuses = {};
const count = (kind, s) => { statuses[`${kind}:${s}`] = (statuses[`${kind}:${s}`] ?? 0) + 1; };

const KINDS = {
  async chat() {
    count('chat', (await post('/v1/chat/completions', { messages: user('Hi'), max_tokens: 8 })).status);
  },
  async chat_stream() {
    count('chat_stream', (await post('/v1/chat/completions',
      { messages: user('Hi there'), max_tokens: 8, stream: true,
        stream_options: { include_usage: true } })).status);
  },
  async completions_n_logprobs() {
    count('completions_n', (await post('/v1/completions',
      { prompt: 'Once upon', max_tokens: 6, n: 2, logprobs: 2, temperature: 0.8 })).status);
  },
  async completions_stream() {
    count('completions_stream', (await post('/v1/completions',
      { prompt: ['a b', 'c d'], max_tokens: 6, stream: true })).status);
  },
  async chat_tools() {
    count('chat_tools', (await post('/v1/chat/completions',
      { messages: user('weather?'), max_tokens: 12, tools, tool_choice: 'required' })).status);
  },
  async chat_json() {
    count('chat_json', (await post('/v1/chat/completions',
      { messages: user('json'), max_tokens: 12, response_format: { type: 'json_object' },
        logprobs: true, top_logprobs: 2 })).status);
  },
  async responses_store_delete() {
    const r = await post('/v1/responses', { input: 'Hello', max_output_tokens: 6, store: true });
    count('responses', r.status);
    const id = JSON.parse(r.text).id;
    if (!id) return;
    const f = await post('/v1/responses', { input: 'more', max_output_tokens: 6,
      previous_response_id: id, store: true });
    count('responses_follow', f.status);
    await fetch(`${base()}/v1/responses/${id}`);
    await fetch(`${base()}/v1/responses/${id}/input_items`);
    const fid = JSON.parse(f.text).id;
    count('responses_delete', (await fetch(`${base()}/v1/responses/${id}`, { method: 'DELETE' })).status);
    if (fid) await fetch(`${base()}/v1/responses/${fid}`, { method: 'DELETE' });
  },
  async responses_kept() {  // stored and never deleted: the store must stay bounded
    count('responses_kept', (await post('/v1/responses',
      { input: 'keep me', max_output_tokens: 4 })).status);
  },
  async responses_stream() {
    count('responses_stream', (await post('/v1/responses',
      { input: 'Hi', max_output_tokens: 6, stream: true, store: false })).status);
  },
  async responses_background_cancel() {
    const r = await post('/v1/responses', { input: 'long one', max_output_tokens: 200,
      background: true });
    count('background', r.status);
    const id = r.status === 200 ? JSON.parse(r.text).id : null;
    if (!id) return;
    await sleep(5);
    count('background_cancel', (await post(`/v1/responses/${id}/cancel`, '')).status);
    await fetch(`${base()}/v1/responses/${id}`, { method: 'DELETE' });
  },
  async responses_background_stream_abort() {
    const r = await post('/v1/responses', { input: 'long one', max_output_tokens: 60,
      background: true, stream: false });
    const id = r.status === 200 ? JSON.parse(r.text).id : null;
    count('background2', r.status);
    if (!id) return;
    const ac = new AbortController();
    try {
      const s = await fetch(`${base()}/v1/responses/${id}?stream=true&starting_after=0`,
        { signal: ac.signal });
      const reader = s.body.getReader();
      await reader.read();
    } catch { /* aborted */ }
    ac.abort();
    // Let it finish, then drop it.
    for (let i = 0; i < 400; i++) {
      const g = await fetch(`${base()}/v1/responses/${id}`);
      const j = await g.json();
      if (j.status !== 'queued' && j.status !== 'in_progress') break;
      await sleep(20);
    }
    await fetch(`${base()}/v1/responses/${id}`, { method: 'DELETE' });
  },
  async misc() {
    count('tokenize', (await post('/tokenize', { prompt: 'hello world' })).status);
    count('health', (await fetch(`${base()}/health`).then((r) => r.text().then(() => r))).status);
    count('models', (await fetch(`${base()}/v1/models`).then((r) => r.text().then(() => r))).status);
    await metrics();
  },
  async disconnect_mid_stream() {
    await streamThenAbort('/v1/chat/completions',
      { messages: user('tell a long story'), max_tokens: 300, stream: true }, 2);
  },
  async disconnect_mid_completions_stream() {
    await streamThenAbort('/v1/completions',
      { prompt: 'Once upon a time', max_tokens: 300, stream: true, logprobs: 1 }, 2);
  },
  async disconnect_mid_responses_stream() {
    await streamThenAbort('/v1/responses',
      { input: 'tell a long story', max_output_tokens: 300, stream: true, store: false }, 3);
  },
  async background_stream_follow_abort() {  // the POST's stream and a resumed one both cut
    const ac = new AbortController();
    let id = null;
    try {
      const r = await fetch(`${base()}/v1/responses`, { method: 'POST', signal: ac.signal,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ input: 'long', max_output_tokens: 120, background: true,
          stream: true }) });
      count('background_stream', r.status);
      const reader = r.body.getReader();
      let text = '';
      while (!id) {
        const { value, done } = await reader.read();
        if (done) break;
        text += Buffer.from(value).toString();
        id = text.match(/"id":\s*"(resp_[^"]+)"/)?.[1];
      }
    } catch { /* aborted */ }
    ac.abort();
    if (!id) return;
    await streamThenAbort(`/v1/responses/${id}?stream=true&starting_after=1`, undefined, 2, 'GET');
    count('background_stream_cancel', (await post(`/v1/responses/${id}/cancel`, '')).status);
    await fetch(`${base()}/v1/responses/${id}`, { method: 'DELETE' });
  },
  async disconnect_before_headers() {  // a long non-streaming request whose client leaves
    const body = JSON.stringify({ messages: user('long'), max_tokens: 300 });
    await rawThenClose([`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`], 0);
  },
  async disconnect_mid_body() {  // slow body, then close
    await rawThenClose([`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
      `Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n`, '{"messages": [', '{"ro'],
    20);
  },
  async disconnect_mid_headers() {
    await rawThenClose(['POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.'], 0);
  },
  async malformed() {
    count('malformed', (await post('/v1/chat/completions', '{"messages": [}')).status);
    count('wrong_type', (await post('/v1/completions', { prompt: 5, max_tokens: 'x' })).status);
  },
  async oversized() {
    count('oversized', (await post('/v1/chat/completions',
      JSON.stringify({ messages: user('x'.repeat(17 << 20)) })).catch(() => ({ status: 'reset' })))
      .status);
  },
  async burst_429() {  // more long requests at once than workers + queue
    const all = [];
    for (let i = 0; i < 28; i++) {
      all.push(post('/v1/completions', { prompt: 'burst', max_tokens: 40 })
        .then((r) => count('burst', r.status)));
    }
    await Promise.all(all);
  },
  async keepalive_idle() {  // one request on a keep-alive connection, then left open and idle
    const sock = net.connect(PORT, '127.0.0.1', () => sock.write(
      'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n'));
    sock.on('error', () => {});
    sock.on('data', () => {});
    idleSockets.push(sock);
  },
};

const chosen = args.kinds ? args.kinds.split(',') : Object.keys(KINDS);
for (const k of chosen) if (!KINDS[k]) throw new Error(`unknown kind ${k}`);

async function runRound(n) {
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const kind = chosen[next++ % chosen.length];
      try { await KINDS[kind](); } catch (e) { count(kind, `threw ${e.code ?? e.message}`); }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
}

// Waits until nothing runs, then samples.
async function settle() {
  for (let i = 0; i < 600; i++) {
    const m = await metrics();
    if (!m.coli_requests_active && !m.coli_queue_depth && !m.coli_http_streams_active) break;
    await sleep(100);
  }
  for (const s of idleSockets.splice(0)) s.destroy();
  await sleep(Number(args["settle-ms"] ?? 6000));  // httplib's 5 s read and keep-alive timeouts
}

const server = await startServer();
PORT = server.port;
const gw = server.proc.pid;
const host = childPid(gw);
const rows = [];
const sample = async (requests) => {
  const m = await metrics();
  rows.push({ requests, gateway: procStats(gw), host: procStats(host),
    streams_active: m.coli_http_streams_active, requests_active: m.coli_requests_active,
    queue_depth: m.coli_queue_depth, host_sessions: m.host_sessions,
    prefix_cache_bytes: m.prefix_cache_bytes, checkpoint_bytes: m.checkpoint_bytes,
    requests_total: m.coli_requests_total });
  const r = rows.at(-1);
  if (args['show-fds']) {
    for (const pid of [gw, host]) {
      const links = fs.readdirSync(`/proc/${pid}/fd`).map((f) => {
        try { return `${f}:${fs.readlinkSync(`/proc/${pid}/fd/${f}`)}`; } catch { return f; }
      });
      console.log(`fds of ${pid}: ${links.join(' ')}`);
    }
  }
  console.log(`${String(requests).padStart(6)} req | gateway rss ${r.gateway.rss_kib} KiB fds ` +
    `${r.gateway.fds} thr ${r.gateway.threads} | host rss ${r.host.rss_kib} KiB fds ` +
    `${r.host.fds} thr ${r.host.threads} | sessions ${r.host_sessions} streams ` +
    `${r.streams_active} active ${r.requests_active} queue ${r.queue_depth} ` +
    `host_requests ${r.requests_total}`);
};
let done = 0;
let failed = false;
try {
  await sample(0);
  for (let round = 0; round < ROUNDS; round++) {
    await runRound(PER_ROUND);
    done += PER_ROUND;
    await settle();
    await sample(done);
  }
  const first = rows[1] ?? rows[0], last = rows.at(-1);
  for (const p of ['gateway', 'host']) {
    for (const k of ['fds', 'threads']) {
      if (last[p][k] > first[p][k]) {
        console.log(`GROWS: ${p} ${k} ${first[p][k]} -> ${last[p][k]}`);
        failed = true;
      }
    }
  }
  for (const k of ['streams_active', 'requests_active', 'queue_depth', 'host_sessions']) {
    if (last[k] > first[k]) { console.log(`GROWS: ${k} ${first[k]} -> ${last[k]}`); failed = true; }
  }
  console.log('statuses', JSON.stringify(statuses));
  if (args.json) fs.writeFileSync(args.json, JSON.stringify({ rows, statuses }, null, 1));
} finally {
  server.proc.removeAllListeners('exit');
  const exited = new Promise((r) => server.proc.on('exit', (code, signal) => r(code ?? signal)));
  server.proc.kill('SIGTERM');
  const code = await exited;
  console.log(`coli serve exited: ${code}`);
  // Under LeakSanitizer (LD_PRELOAD=$(gcc -print-file-name=liblsan.so)) its report, if any.
  const at = server.stderr().indexOf('LeakSanitizer');
  if (at >= 0) {
    console.log(server.stderr().slice(at, at + 6000));
    failed = true;
  } else if (code !== 0) {
    failed = true;
  }
}
process.exitCode = failed ? 1 : 0;
