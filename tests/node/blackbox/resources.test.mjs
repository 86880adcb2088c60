// `coli serve` holds its resources steady under clients that go away (docs/status/soak.md): after
// many clients that leave mid-stream, before the answer, mid-body, or in a background response's
// stream while it waits in the host's queue, the gateway's descriptors and threads, the host's
// descriptors, and the streams / requests / queue gauges return to what they were. Raw sockets
// only (no client-side connection pool keeps sockets open); counts, never timings: each wait is
// a poll bounded by a hang guard.
//
// Environment (set by CMakeLists.txt): COLI_BIN, COLI_TINY_MODEL.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';

import { TINY, startServer, stopServer } from '../openai/serve_helpers.mjs';

const GUARD_MS = 45000;
const servers = [];
after(() => Promise.all(servers.map(stopServer)));

async function start(env, args) {
  const server = await startServer(TINY, env, args);
  servers.push(server);
  const port = Number(new URL(server.base).port);
  const gateway = server.proc.pid;
  let host = null;
  for (const t of fs.readdirSync(`/proc/${gateway}/task`)) {
    const kids = fs.readFileSync(`/proc/${gateway}/task/${t}/children`, 'utf8').trim();
    if (kids) host = Number(kids.split(/\s+/)[0]);
  }
  assert.ok(host, 'the private coli-host child');
  return { ...server, port, gateway, host };
}

const fds = (pid) => fs.readdirSync(`/proc/${pid}/fd`).length;
const threads = (pid) => fs.readdirSync(`/proc/${pid}/task`).length;

async function gauges(base) {
  const text = await (await fetch(`${base}/metrics`, { headers: { connection: 'close' } })).text();
  const value = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1]);
  return { streams: value('coli_http_streams_active'), active: value('coli_requests_active'),
    queue: value('coli_queue_depth') };
}

// Polls `read` (async, an array of counts) until no count is above its `limit`, for at most
// GUARD_MS: a hang guard. (Below is fine: a socket of the warm-up may have closed since.)
async function settlesTo(read, limit, what) {
  const until = Date.now() + GUARD_MS;
  let got;
  while (Date.now() < until) {
    got = await read();
    if (got.every((v, i) => v <= limit[i])) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.deepEqual(got, limit, `${what}: above the baseline`);
}

// Writes a raw HTTP/1.1 request and closes the socket once `leaveWhen(text so far)` holds (at
// once for null), resolving with what came.
function leave(port, request, leaveWhen = null) {
  return new Promise((resolve) => {
    let text = '';
    const sock = net.connect(port, '127.0.0.1', () => {
      for (const piece of [].concat(request)) sock.write(piece);
      if (!leaveWhen) sock.destroy();
    });
    sock.on('data', (d) => {
      text += d.toString('latin1');
      if (leaveWhen?.(text)) sock.destroy();
    });
    sock.on('error', () => {});
    sock.on('close', () => resolve(text));
  });
}

const postText = (path, body) => {
  const json = JSON.stringify(body);
  return `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`;
};
const getText = (path) => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`;
// Leaves once the answer's head and at least `events` SSE data lines came (or a non-200 head).
const afterEvents = (events) => (t) =>
  /^HTTP\/1\.1 [^2]/.test(t) || (t.split('\ndata: ').length - 1) >= events;

async function json(base, method, path, body) {
  const r = await fetch(`${base}${path}`, { method, headers: { 'content-type': 'application/json',
    connection: 'close' }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

// Forced long (greedy, +100 on an ordinary token): it cannot end by itself within the test.
const forced = { temperature: 0, logit_bias: { 65: 100 } };

test('a client that leaves a background response waiting in the queue frees its connection',
  async () => {
    // One host worker, busy with a forced long response: the next one waits in the host's queue,
    // and sends no event after its first ones while it waits.
    const s = await start({ COLI_DECODE_DELAY_MS: '20' }, ['--workers', '1']);
    const baseFds = fds(s.gateway);
    const busy = await json(s.base, 'POST', '/v1/responses',
      { input: 'hog', max_output_tokens: 100000, background: true, ...forced });
    assert.equal(busy.status, 200, JSON.stringify(busy.json));
    const head = await leave(s.port, postText('/v1/responses',
      { input: 'waits', max_output_tokens: 4, background: true, stream: true }), afterEvents(1));
    const id = head.match(/"id":"(resp_[^"]+)"/)?.[1];
    assert.ok(id, `no response id in: ${head.slice(0, 400)}`);
    // Clients that resume its stream and leave (an SDK retrying with a short timeout).
    for (let i = 0; i < 8; i++) {
      await leave(s.port, getText(`/v1/responses/${id}?stream=true&starting_after=0`),
        afterEvents(1));
    }
    await settlesTo(async () => [(await gauges(s.base)).streams, fds(s.gateway)], [0, baseFds],
      'streams_active and the gateway\'s descriptors');
    // Freed while it still waits: not because the busy response ended.
    const waiting = await json(s.base, 'GET', `/v1/responses/${id}`);
    assert.ok(['queued', 'in_progress'].includes(waiting.json.status), JSON.stringify(waiting.json));
    assert.equal(waiting.json.usage ?? null, null, 'it has not run yet');
    const running = await json(s.base, 'GET', `/v1/responses/${busy.json.id}`);
    assert.equal(running.json.status, 'in_progress', JSON.stringify(running.json));
    for (const r of [busy.json.id, id]) {
      assert.equal((await json(s.base, 'POST', `/v1/responses/${r}/cancel`)).status, 200);
    }
  });

test('descriptors, threads and gauges return to their baseline after 100 clients that leave',
  async () => {
    const s = await start({ COLI_DECODE_DELAY_MS: '5' }, ['--workers', '2', '--queue', '64']);
    const long = { max_tokens: 300, ...forced };
    const kinds = [
      // Mid-stream: chat, completions (with logprobs), Responses.
      () => leave(s.port, postText('/v1/chat/completions',
        { messages: [{ role: 'user', content: 'hi' }], stream: true, ...long }), afterEvents(2)),
      () => leave(s.port, postText('/v1/completions',
        { prompt: 'Once', stream: true, logprobs: 1, ...long }), afterEvents(2)),
      () => leave(s.port, postText('/v1/responses',
        { input: 'hi', stream: true, store: false, max_output_tokens: 300, ...forced }),
      afterEvents(3)),
      // Before the answer: a non-streaming request, its client gone at once.
      () => leave(s.port, postText('/v1/chat/completions',
        { messages: [{ role: 'user', content: 'hi' }], ...long })),
      // Mid-body: the head promises more than comes.
      () => leave(s.port, ['POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n', '{"messages": [']),
      // Mid-head.
      () => leave(s.port, 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le'),
    ];
    const round = async (n) => {
      let next = 0;
      await Promise.all(Array.from({ length: 6 }, async () => {
        while (next < n) await kinds[next++ % kinds.length]();
      }));
    };
    const idle = async () => {
      const g = await gauges(s.base);
      return [g.streams, g.active, g.queue];
    };
    const state = async () => [...await idle(), fds(s.gateway), threads(s.gateway), fds(s.host)];
    // Warm-up: the host's pooled sessions and the gateway's lazily made state exist afterwards.
    await round(kinds.length * 2);
    await settlesTo(idle, [0, 0, 0], 'streams, requests and queue after the warm-up');
    const baseline = await state();
    await round(100);
    await settlesTo(state, baseline,
      '[streams, requests, queue, gateway fds, gateway threads, host fds]');
  });
