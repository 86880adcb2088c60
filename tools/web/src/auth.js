// The API key of a server started with `--api-key`: entered once under "settings", kept in this
// browser (localStorage), sent as a bearer token with every API call. A server without a key
// ignores the header.
const KEY = 'coli.apiKey';

export function apiKey() {
  try {
    return localStorage.getItem(KEY) || '';
  } catch (_) {
    return '';  // storage disabled: the key lives as long as the page (memoryKey)
  }
}

let memoryKey = '';
export function setApiKey(key) {
  memoryKey = key;
  try {
    if (key) localStorage.setItem(KEY, key);
    else localStorage.removeItem(KEY);
  } catch (_) { /* kept in memory only */ }
}

export function authHeaders(headers = {}) {
  const key = apiKey() || memoryKey;
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

// The server answered 401: no key, or the wrong one.
export class AuthError extends Error {}

export async function authError(res) {
  let message = 'the server wants an API key';
  try {
    const body = await res.json();
    if (body.error && body.error.message) message = body.error.message;
  } catch (_) { /* keep the default */ }
  return new AuthError(`${message}: this server was started with --api-key; ` +
    'enter the key under "settings".');
}
