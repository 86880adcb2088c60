import { authHeaders } from './auth.js';

// Reads the gateway's Prometheus /metrics into {name: value} (labels dropped, summed).
export function parsePrometheus(text) {
  const values = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m) continue;
    const v = Number(m[3]);
    if (Number.isNaN(v)) continue;
    values[m[1]] = (values[m[1]] || 0) + v;
  }
  return values;
}

export async function fetchMetrics() {
  const res = await fetch('/metrics', { headers: authHeaders() });
  if (!res.ok) throw new Error(`GET /metrics: HTTP ${res.status}`);
  return parsePrometheus(await res.text());
}
