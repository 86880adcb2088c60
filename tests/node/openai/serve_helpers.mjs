// Server start-up and request helpers shared by the openai SDK tests (openai.test.mjs,
// sampling.test.mjs, responses*.test.mjs, ...).
import { spawn } from 'node:child_process';

export const COLI = process.env.COLI_BIN ?? 'build/bin/coli';
export const TINY = process.env.COLI_TINY_MODEL ?? 'build/fixtures/k3_tiny';
export const SCRIPTED = process.env.COLI_SCRIPTED_MODEL ?? 'build/fixtures/k3_scripted';
export const SCRIPTED_PLUGINS = process.env.COLI_SCRIPTED_PLUGIN_DIR ?? 'build/tools/k3_scripted/plugins';

// Starts `coli serve --port 0` (`command` 'web': `coli web`, the same gateway plus the page) and
// resolves with {proc, base, stderr} once it prints its address (stderr(): what the server wrote
// there so far).
export function startServer(model, extraEnv = {}, extraArgs = [], command = 'serve') {
  return new Promise((resolve, reject) => {
    const proc = spawn(COLI, [command, '--model', model, '--port', '0', ...extraArgs], {
      env: { ...process.env, ...extraEnv },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    const timer = setTimeout(() => reject(new Error(`coli ${command} did not start: ${err}`)), 120000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, base: m[1], stderr: () => err });
      }
    });
    proc.stderr.on('data', (d) => { err += d; });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`coli ${command} exited with ${code}: ${err}`));
    });
  });
}

export function stopServer(server) {
  if (!server) return Promise.resolve();
  return new Promise((resolve) => {
    server.proc.removeAllListeners('exit');
    server.proc.on('exit', () => resolve());
    server.proc.kill('SIGTERM');
  });
}

// POSTs `body` (an object, or a raw string) and returns {status, json, text}.
export async function post(base, path, body) {
  const r = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

// Retrieves response `id` through the SDK client `c` until it is neither queued nor in progress.
export async function poll(c, id) {
  for (let i = 0; i < 600; i++) {
    const r = await c.responses.retrieve(id);
    if (r.status !== 'queued' && r.status !== 'in_progress') return r;
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`response ${id} did not finish`);
}
