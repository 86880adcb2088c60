// The coli chat page. State: the conversation (localStorage), one request in flight at most.
import './style.css';
import 'highlight.js/styles/github.css';
import './code-dark.css';
import { fetchModels, streamChat } from './api.js';
import { AuthError, apiKey, setApiKey } from './auth.js';
import { fetchMetrics } from './metrics.js';
import { STORAGE_KEY, loadState, saveState, toMessages } from './history.js';
import { renderMarkdown } from './render.js';

const $ = (id) => document.getElementById(id);
const els = {
  messages: $('messages'), input: $('input'), send: $('send'), stop: $('stop'),
  composer: $('composer'), thinking: $('thinking'), system: $('system-prompt'),
  settings: $('settings'), settingsButton: $('settings-button'), newChat: $('new-chat'),
  apiKey: $('api-key'),
  error: $('error'), model: $('model-name'), state: $('st-state'), prefill: $('st-prefill'),
  ttft: $('st-ttft'), tps: $('st-tps'), hit: $('st-hit'), bytes: $('st-bytes'),
};

let state = loadState();
let modelId = null;
let inflight = null;  // {controller, turn, metricsTimer}
let starting = false;  // a reply asked for, waiting for the tabs' reply lock

// The page's tabs share one stored chat: two replies written at once each saved a chat without
// the other's exchange, and the last to finish won. So one tab replies at a time (a Web Lock,
// freed when the reply ends or its tab closes); a tab asked meanwhile says why and keeps what was
// typed. A page without navigator.locks (plain http off loopback) replies as before.
const REPLY_LOCK = 'coli.chat.reply';
const BUSY_ELSEWHERE =
  'Another tab of this page is writing a reply: send again once it has finished, or stop it there.';
function startReply(change) {
  if (inflight || starting) return;
  if (!navigator.locks) {
    change();
    generate();
    return;
  }
  starting = true;
  navigator.locks.request(REPLY_LOCK, { ifAvailable: true }, async (lock) => {
    starting = false;
    if (!lock) {
      showError(BUSY_ELSEWHERE);
      return;
    }
    change();
    await generate();
  }).catch(() => { starting = false; });
}

// The chat goes on when the browser will not store it (quota full, storage disabled, some private
// modes); the banner says that it will not survive a reload.
let storageWarning = '';
function persist() {
  storageWarning = saveState(state) ? ''
    : 'The browser does not keep this chat (storage full or disabled): a reload will lose it.';
  showError(errorMessage);
}

let errorMessage = '';
function showError(message) {
  errorMessage = message;
  const text = [message, storageWarning].filter(Boolean).join(' ');
  els.error.textContent = text;
  els.error.hidden = !text;
}

// ---- rendering -------------------------------------------------------------------------

function turnElement(turn, index) {
  const div = document.createElement('div');
  div.className = `turn ${turn.role}`;
  div.dataset.index = String(index);
  div.dataset.testid = `turn-${turn.role}`;
  if (turn.role === 'user') {
    const body = document.createElement('div');
    body.className = 'body';
    body.textContent = turn.content;
    div.append(body);
  } else if (turn.role === 'tool') {
    div.dataset.testid = 'tool-result';
    const body = document.createElement('div');
    body.className = 'body tool-result';
    body.textContent = `result of ${turn.name || 'tool'}: ${turn.content}`;
    div.append(body);
  } else {
    if (turn.reasoning) {
      const details = document.createElement('details');
      details.className = 'reasoning';
      details.open = turn.reasoningOpen ?? (inflight && inflight.turn === turn);
      details.addEventListener('toggle', () => { turn.reasoningOpen = details.open; });
      const summary = document.createElement('summary');
      summary.textContent = inflight && inflight.turn === turn && !turn.content ? 'thinking…' : 'reasoning';
      const pre = document.createElement('div');
      pre.className = 'reasoning-text';
      pre.textContent = turn.reasoning;
      details.append(summary, pre);
      div.append(details);
    }
    const body = document.createElement('div');
    body.className = 'body markdown';
    body.innerHTML = renderMarkdown(turn.content || '');
    div.append(body);
    for (const call of turn.toolCalls || []) {
      const box = document.createElement('div');
      box.className = 'tool-call';
      box.dataset.testid = 'tool-call';
      const fn = call.function || {};
      const head = document.createElement('div');
      head.textContent = `tool call: ${fn.name || '?'}(${fn.arguments || ''})`;
      box.append(head);
      if (awaitsResult(turn, index, call)) box.append(toolResultForm(call));
      div.append(box);
    }
    if (turn.error) {
      const err = document.createElement('div');
      err.className = 'turn-error';
      err.textContent = turn.error;
      div.append(err);
    }
    if (turn.stopped) {
      const note = document.createElement('div');
      note.className = 'turn-note';
      note.textContent = 'stopped';
      div.append(note);
    }
  }
  return div;
}

// The page runs no tools: a person pastes a call's result, which goes back to the model as an
// OpenAI `tool` message. Only the calls of the last assistant turn that have no result yet ask.
function awaitsResult(turn, index, call) {
  if (inflight || !call.id) return false;
  const after = state.turns.slice(index + 1);
  if (after.some((t) => t.role !== 'tool')) return false;
  return !after.some((t) => t.toolCallId === call.id);
}

function toolResultForm(call) {
  const form = document.createElement('form');
  form.className = 'tool-result-form';
  const input = document.createElement('textarea');
  input.rows = 1;
  input.placeholder = 'paste the tool\'s result';
  input.dataset.testid = 'tool-result-input';
  const send = document.createElement('button');
  send.type = 'submit';
  send.textContent = 'send result';
  send.dataset.testid = 'tool-result-send';
  form.append(input, send);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (inflight || starting) return;
    const result = { role: 'tool', toolCallId: call.id, name: call.function?.name || '',
      content: input.value };
    // Answer once every call of that turn has its result.
    const owner = state.turns.findLast((t) => t.role === 'assistant');
    const answered = new Set(state.turns.filter((t) => t.role === 'tool').map((t) => t.toolCallId));
    answered.add(call.id);
    if ((owner?.toolCalls || []).every((c) => answered.has(c.id))) {
      startReply(() => { state.turns.push(result); persist(); });
    } else {
      state.turns.push(result);
      persist();
      render();
    }
  });
  return form;
}

function addTurnActions() {
  if (inflight) return;
  const turns = state.turns;
  const lastUser = turns.map((t) => t.role).lastIndexOf('user');
  if (lastUser < 0) return;
  const userEl = els.messages.querySelector(`[data-index="${lastUser}"]`);
  const actions = document.createElement('div');
  actions.className = 'actions';
  const edit = document.createElement('button');
  edit.type = 'button';
  edit.textContent = 'edit';
  edit.dataset.testid = 'edit';
  edit.addEventListener('click', () => {
    els.input.value = turns[lastUser].content;
    state.turns = turns.slice(0, lastUser);
    persist();
    render();
    els.input.focus();
  });
  const regen = document.createElement('button');
  regen.type = 'button';
  regen.textContent = 'regenerate';
  regen.dataset.testid = 'regenerate';
  regen.addEventListener('click', () => {
    startReply(() => {
      state.turns = turns.slice(0, lastUser + 1);
      persist();
    });
  });
  actions.append(edit, regen);
  userEl?.append(actions);
}

function atBottom() {
  return els.messages.scrollHeight - els.messages.scrollTop - els.messages.clientHeight < 40;
}

// `follow: false` keeps the place of a reader who scrolled up (the end of a reply re-renders all).
function render({ follow = true } = {}) {
  const stick = follow || atBottom();
  const top = els.messages.scrollTop;
  els.messages.replaceChildren(...state.turns.map(turnElement));
  addTurnActions();
  els.messages.scrollTop = stick ? els.messages.scrollHeight : top;
}

// Re-renders only the streaming turn, at most once a frame: a long reply re-parses all of its
// markdown each time, and tokens can come faster than the screen shows them.
let pendingTurn = null;
function renderTurn(turn) {
  if (pendingTurn === turn) return;
  pendingTurn = turn;
  requestAnimationFrame(() => {
    pendingTurn = null;
    if (state.turns.includes(turn)) renderTurnNow(turn);
  });
}

function renderTurnNow(turn) {
  const index = state.turns.indexOf(turn);
  const old = els.messages.querySelector(`[data-index="${index}"]`);
  const stick = atBottom();
  const fresh = turnElement(turn, index);
  if (old) old.replaceWith(fresh); else els.messages.append(fresh);
  if (stick) els.messages.scrollTop = els.messages.scrollHeight;
}

function setBusy(busy) {
  els.send.hidden = busy;
  els.stop.hidden = !busy;
  els.input.disabled = false;
  els.state.textContent = busy ? 'prefilling…' : 'idle';
  if (!busy) els.prefill.hidden = true;
}

// ---- status bar ------------------------------------------------------------------------

let lastMetrics = null;
async function refreshMetrics() {
  try {
    const m = await fetchMetrics();
    if (m.coli_expert_hit_rate !== undefined &&
        (m.coli_expert_hits_total || 0) + (m.coli_expert_misses_total || 0) > 0) {
      els.hit.textContent = `hit ${(100 * m.coli_expert_hit_rate).toFixed(1)}%`;
    }
    const bytes = m.coli_bytes_read_total;
    const tokens = (m.coli_prompt_tokens_total || 0) + (m.coli_completion_tokens_total || 0);
    if (lastMetrics && bytes !== undefined) {
      const dt = tokens - lastMetrics.tokens;
      if (dt > 0) els.bytes.textContent = `${formatBytes((bytes - lastMetrics.bytes) / dt)}/tok`;
    }
    if (bytes !== undefined) lastMetrics = { bytes, tokens };
  } catch (_) { /* the status bar is best-effort */ }
}

// Until the first token arrives the model is reading the prompt (prefill): show how far it got
// (the gateway's progress reports), or for how long until the first report.
function tickPrefill(started) {
  if (!inflight || inflight.firstTokenAt) return;
  els.prefill.hidden = false;
  const p = inflight.progress;
  if (p && p.total > 0) {
    const pct = Math.floor((100 * p.processed) / p.total);
    els.prefill.textContent = `prefill ${pct} %`;
    els.prefill.title = `${p.processed} of ${p.total} prompt tokens read` +
      (p.cache > 0 ? ` (${p.cache} kept from before)` : '') +
      ` in ${(p.time_ms / 1000).toFixed(1)} s`;
  } else {
    els.prefill.textContent = `prefill ${((performance.now() - started) / 1000).toFixed(1)} s`;
    els.prefill.title = 'reading the prompt';
  }
}

function formatBytes(n) {
  if (!Number.isFinite(n)) return '–';
  const units = ['B', 'KB', 'MB', 'GB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

// ---- generation ------------------------------------------------------------------------

async function generate() {
  showError('');
  const turn = { role: 'assistant', content: '', reasoning: '', toolCalls: [] };
  const messages = toMessages(state);
  state.turns.push(turn);
  persist();
  const controller = new AbortController();
  const started = performance.now();
  inflight = { controller, turn, firstTokenAt: 0, pieces: 0 };
  inflight.metricsTimer = setInterval(refreshMetrics, 1000);
  inflight.prefillTimer = setInterval(() => tickPrefill(started), 200);
  setBusy(true);
  render();
  const onPiece = () => {
    inflight.pieces++;
    if (!inflight.firstTokenAt) {
      inflight.firstTokenAt = performance.now();
      els.ttft.textContent = `ttft ${Math.round(inflight.firstTokenAt - started)} ms`;
      els.state.textContent = 'generating…';
      els.prefill.hidden = true;
    }
    const secs = (performance.now() - inflight.firstTokenAt) / 1000;
    if (secs > 0.2) els.tps.textContent = `${(inflight.pieces / secs).toFixed(1)} tok/s`;
  };
  try {
    await streamChat({
      model: modelId,
      messages,
      thinking: state.thinking,
      signal: controller.signal,
      on: {
        progress: (p) => { inflight.progress = p; tickPrefill(started); },
        reasoning: (t) => { turn.reasoning += t; onPiece(); renderTurn(turn); },
        content: (t) => { turn.content += t; onPiece(); renderTurn(turn); },
        toolCalls: (calls) => { mergeToolCalls(turn, calls); onPiece(); renderTurn(turn); },
        usage: (u) => {
          const secs = inflight.firstTokenAt ? (performance.now() - inflight.firstTokenAt) / 1000 : 0;
          if (secs > 0 && u.completion_tokens > 1) {
            els.tps.textContent = `${((u.completion_tokens - 1) / secs).toFixed(1)} tok/s`;
          }
        },
        finish: (reason) => { turn.finish = reason; },
      },
    });
  } catch (e) {
    if (controller.signal.aborted) {
      turn.stopped = true;
    } else {
      turn.error = String(e.message || e);
      showError(turn.error);
      if (e instanceof AuthError) askForKey();
    }
  } finally {
    clearInterval(inflight.metricsTimer);
    clearInterval(inflight.prefillTimer);
    inflight = null;
    turn.reasoningOpen = false;
    // A keyboard user on "stop" would otherwise be left on nothing once it hides.
    const refocus = document.activeElement === els.stop;
    persist();
    setBusy(false);
    render({ follow: false });
    if (refocus) els.input.focus();
    refreshMetrics();
  }
}

function mergeToolCalls(turn, deltas) {
  for (const d of deltas) {
    const i = d.index ?? turn.toolCalls.length;
    const call = turn.toolCalls[i] ||= { id: d.id, type: 'function', function: { name: '', arguments: '' } };
    if (d.id) call.id = d.id;
    if (d.function?.name) call.function.name += d.function.name;
    if (d.function?.arguments) call.function.arguments += d.function.arguments;
  }
}

// ---- wiring ----------------------------------------------------------------------------

els.composer.addEventListener('submit', (ev) => {
  ev.preventDefault();
  const raw = els.input.value;
  if (!raw.trim() || inflight || starting) return;
  // Pasted code keeps its indentation: only blank lines around it and trailing spaces go.
  const text = raw.replace(/^\s*\n/, '').trimEnd();
  startReply(() => {
    els.input.value = '';
    state.turns.push({ role: 'user', content: text });
    persist();
  });
});
// Enter that ends an IME composition (CJK input) picks the candidate, it does not send. Chromium
// marks it isComposing; Safari sends it after compositionend with keyCode 229 instead.
let composing = false;
els.input.addEventListener('compositionstart', () => { composing = true; });
els.input.addEventListener('compositionend', () => { composing = false; });
els.input.addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing && !composing && ev.keyCode !== 229) {
    ev.preventDefault();
    els.composer.requestSubmit();
  }
});
function stopReply() {
  if (!inflight) return;
  inflight.controller.abort();
  els.input.focus();
}
els.stop.addEventListener('click', (ev) => {
  // "stop" takes the place of "send": the second click of a double click on send lands here.
  if (ev.detail > 1) return;
  stopReply();
});
document.addEventListener('keydown', (ev) => {
  if (ev.key === 'Escape' && inflight && !ev.isComposing && !composing) {
    ev.preventDefault();
    stopReply();
  }
});
els.newChat.addEventListener('click', () => {
  inflight?.controller.abort();
  state.turns = [];
  persist();
  showError('');
  render();
});
// Another tab of the page wrote the chat: an idle tab shows it (else sending from a tab opened
// earlier would overwrite, with its stale copy, what was said in the other tab since).
window.addEventListener('storage', (ev) => {
  if ((ev.key !== STORAGE_KEY && ev.key !== null) || inflight) return;
  state = loadState();
  els.thinking.checked = state.thinking;
  els.system.value = state.system;
  render({ follow: false });
});
els.thinking.checked = state.thinking;
els.thinking.addEventListener('change', () => { state.thinking = els.thinking.checked; persist(); });
els.system.value = state.system;
els.system.addEventListener('input', () => { state.system = els.system.value; persist(); });
function showSettings(show) {
  els.settings.hidden = !show;
  els.settingsButton.setAttribute('aria-expanded', String(show));
}
els.settingsButton.addEventListener('click', () => showSettings(els.settings.hidden));
// A server started with --api-key answers 401 until the key is entered here.
function askForKey() {
  showSettings(true);
  els.apiKey.focus();
}
els.apiKey.value = apiKey();
els.apiKey.addEventListener('change', () => {
  setApiKey(els.apiKey.value.trim());
  showError('');
  loadModel();
});

// A turn left half-written by a reload or crash is kept, marked as interrupted.
for (const t of state.turns) {
  if (t.role === 'assistant' && !t.finish && !t.stopped && !t.error) t.stopped = true;
}
render();
function loadModel() {
  fetchModels().then((models) => {
    modelId = models[0]?.id ?? null;
    els.model.textContent = modelId ?? 'no model';
    refreshMetrics();
  }).catch((e) => {
    if (e instanceof AuthError) {
      showError(e.message);
      askForKey();
    } else {
      showError(`cannot reach the server: ${e.message}`);
    }
  });
}
loadModel();
refreshMetrics();
