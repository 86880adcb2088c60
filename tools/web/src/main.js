// The coli chat page. State: the conversations (localStorage, one key each), the one this tab
// shows (`state`), and at most one reply in flight per conversation.
import './style.css';
import 'highlight.js/styles/github.css';
import './code-dark.css';
import { fetchModels, streamChat } from './api.js';
import { AuthError, apiKey, setApiKey } from './auth.js';
import { fetchMetrics } from './metrics.js';
import {
  conversationKey, deleteConversation, isConversationKey, listConversations, loadConversation,
  migrateLegacyChat, newConversation, saveConversation, saveDefaults, titleOf, toMessages,
} from './history.js';
import { renderMarkdown } from './render.js';

const $ = (id) => document.getElementById(id);
const els = {
  messages: $('messages'), input: $('input'), send: $('send'), stop: $('stop'),
  composer: $('composer'), thinking: $('thinking'), system: $('system-prompt'),
  settings: $('settings'), settingsButton: $('settings-button'), newChat: $('new-chat'),
  apiKey: $('api-key'), app: $('app'), sidebarToggle: $('sidebar-toggle'),
  list: $('conversation-list'), notice: $('notice'), noticeText: $('notice-text'), undo: $('undo'),
  error: $('error'), model: $('model-name'), state: $('st-state'), prefill: $('st-prefill'),
  ttft: $('st-ttft'), tps: $('st-tps'), hit: $('st-hit'), bytes: $('st-bytes'),
};

// The conversation this tab shows: a reload keeps it (sessionStorage is per tab); a new tab opens
// the most recently written one.
const CURRENT_KEY = 'coli.chat.current';
function rememberCurrent(id) {
  try { sessionStorage.setItem(CURRENT_KEY, id); } catch (_) { /* a reload opens the newest */ }
}
function firstConversation() {
  let id = null;
  try { id = sessionStorage.getItem(CURRENT_KEY); } catch (_) { /* storage disabled */ }
  const newest = listConversations()[0];
  return (id && loadConversation(id)) || (newest && loadConversation(newest.id)) ||
    newConversation();
}

migrateLegacyChat();
let state = firstConversation();
let modelId = null;
// The replies this tab writes, by conversation id: {controller, turn, conv, firstTokenAt, ...}.
// A reply goes on in its conversation while the tab shows another one.
const replies = new Map();
const starting = new Set();  // conversations whose reply waits for the tabs' reply lock
const replyHere = () => replies.get(state.id);
const busyHere = () => replies.has(state.id) || starting.has(state.id);
const streaming = (turn) => [...replies.values()].some((r) => r.turn === turn);

// Tabs on the same conversation: two replies written at once each saved it without the other's
// exchange, and the last to finish won. So one tab replies in a conversation at a time (a Web
// Lock per conversation, freed when the reply ends or its tab closes); a tab asked meanwhile says
// why and keeps what was typed. Tabs on different conversations write different keys and reply
// at once. A page without navigator.locks (plain http off loopback) replies as before.
const replyLock = (id) => `coli.chat.reply:${id}`;
const BUSY_ELSEWHERE = 'Another tab of this page is writing a reply in this chat: send again ' +
  'once it has finished, or stop it there.';
function startReply(change) {
  const conv = state;
  if (busyHere()) return;
  if (!navigator.locks) {
    change(conv);
    generate(conv);
    return;
  }
  starting.add(conv.id);
  navigator.locks.request(replyLock(conv.id), { ifAvailable: true }, async (lock) => {
    starting.delete(conv.id);
    if (!lock) {
      if (state === conv) showError(BUSY_ELSEWHERE);
      return;
    }
    change(conv);
    await generate(conv);
  }).catch(() => { starting.delete(conv.id); });
}

// Whether another tab holds conversation `id`'s reply lock (it is writing a reply there).
async function replyingElsewhere(id) {
  if (replies.has(id) || !navigator.locks?.query) return false;
  try {
    const { held = [] } = await navigator.locks.query();
    return held.some((lock) => lock.name === replyLock(id));
  } catch (_) {
    return false;
  }
}

// The chat goes on when the browser will not store it (quota full, storage disabled, some private
// modes); the banner says that it will not survive a reload. A conversation is written from its
// first message on (an empty "new chat" is not listed), and never again once deleted.
let storageWarning = '';
function persist(conv = state) {
  if (conv.deleted || (!conv.turns.length && !conv.saved)) return;
  conv.updated = Date.now();
  const kept = saveConversation(conv);
  if (conv === state || !kept) {
    storageWarning = kept ? ''
      : 'The browser does not keep this chat (storage full or disabled): a reload will lose it.';
    showError(errorMessage);
  }
  renderList();
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
      details.open = turn.reasoningOpen ?? streaming(turn);
      details.addEventListener('toggle', () => { turn.reasoningOpen = details.open; });
      const summary = document.createElement('summary');
      summary.textContent = streaming(turn) && !turn.content ? 'thinking…' : 'reasoning';
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
  if (busyHere() || !call.id) return false;
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
    if (busyHere()) return;
    const result = { role: 'tool', toolCallId: call.id, name: call.function?.name || '',
      content: input.value };
    // Answer once every call of that turn has its result.
    const owner = state.turns.findLast((t) => t.role === 'assistant');
    const answered = new Set(state.turns.filter((t) => t.role === 'tool').map((t) => t.toolCallId));
    answered.add(call.id);
    if ((owner?.toolCalls || []).every((c) => answered.has(c.id))) {
      startReply((conv) => { conv.turns.push(result); persist(conv); });
    } else {
      state.turns.push(result);
      persist();
      render();
    }
  });
  return form;
}

function addTurnActions() {
  if (replyHere()) return;
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
    startReply((conv) => {
      conv.turns = turns.slice(0, lastUser + 1);
      persist(conv);
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

// The composer and status bar say whether the conversation shown has a reply being written.
function showBusy() {
  const reply = replyHere();
  els.send.hidden = !!reply;
  els.stop.hidden = !reply;
  els.input.disabled = false;
  els.state.textContent = !reply ? 'idle' : reply.firstTokenAt ? 'generating…' : 'prefilling…';
  if (!reply || reply.firstTokenAt) els.prefill.hidden = true;
}

// ---- conversations ---------------------------------------------------------------------

// The side list: every stored conversation, the most recently written first, and the ones this
// tab holds that the browser would not store.
function renderList() {
  const stored = listConversations();
  const listed = new Set(stored.map((c) => c.id));
  const unsaved = [];
  for (const conv of [state, ...[...replies.values()].map((r) => r.conv)]) {
    if (conv.turns.length && !conv.deleted && !listed.has(conv.id)) {
      listed.add(conv.id);
      unsaved.push({ id: conv.id, title: titleOf(conv) });
    }
  }
  // The list is drawn anew: a keyboard user keeps the focus on the same conversation's button.
  const focused = document.activeElement;
  const focusedItem = els.list.contains(focused) ? focused.closest('li')?.dataset.id : null;
  const focusedKind = focused?.className;
  els.list.replaceChildren(...[...unsaved, ...stored].map(({ id, title }) => {
    const li = document.createElement('li');
    li.dataset.id = id;
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'conv-open';
    open.textContent = title;
    open.title = title;
    if (id === state.id) open.setAttribute('aria-current', 'page');
    if (replies.has(id)) li.classList.add('replying');
    open.addEventListener('click', () => openConversation(id, { focusInput: true }));
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.className = 'conv-delete';
    remove.textContent = '×';
    remove.setAttribute('aria-label', `delete chat “${title}”`);
    remove.title = 'delete this chat';
    remove.addEventListener('click', () => removeConversation(id));
    li.append(open, remove);
    return li;
  }));
  if (focusedItem) {
    const li = [...els.list.children].find((e) => e.dataset.id === focusedItem);
    li?.querySelector(`.${focusedKind}`)?.focus();
  }
}

// A turn left half-written by a reload or crash is kept, marked as interrupted.
function markInterrupted(conv) {
  for (const t of conv.turns) {
    if (t.role === 'assistant' && !t.finish && !t.stopped && !t.error && !streaming(t)) {
      t.stopped = true;
    }
  }
}

function show(conv, { focusInput = false } = {}) {
  state = conv;
  rememberCurrent(conv.id);
  els.thinking.checked = conv.thinking;
  els.system.value = conv.system;
  showError('');
  showBusy();
  render();
  renderList();
  if (focusInput) {
    showSidebar(false);
    els.input.focus();
  }
}

function openConversation(id, options) {
  if (id === state.id) {
    if (options?.focusInput) { showSidebar(false); els.input.focus(); }
    return;
  }
  // A conversation this tab is replying in is the reply's own object, not a copy from storage.
  const conv = replies.get(id)?.conv ?? loadConversation(id);
  if (!conv) {
    renderList();  // it was deleted meanwhile in another tab
    return;
  }
  if (!replies.has(id)) markInterrupted(conv);
  show(conv, options);
}

function newChat() {
  if (!state.turns.length && !state.saved) {
    els.input.focus();  // already an empty new chat
    return;
  }
  show(newConversation({ system: state.system, thinking: state.thinking }), { focusInput: true });
}

// Deleting asks nothing, but "undo" brings the conversation back for a while (a stray click
// loses nothing). A conversation another tab is writing a reply in is not deleted.
let undoTimer = null;
let lastDeleted = null;
async function removeConversation(id) {
  if (await replyingElsewhere(id)) {
    showError('Another tab of this page is writing a reply in that chat: stop it there first.');
    return;
  }
  const conv = id === state.id ? state : (replies.get(id)?.conv ?? loadConversation(id));
  if (!conv) {
    renderList();
    return;
  }
  replies.get(id)?.controller.abort();
  conv.deleted = true;
  deleteConversation(id);
  lastDeleted = { conv, wasShown: conv === state };
  els.noticeText.textContent = `Deleted “${titleOf(conv)}”.`;
  els.notice.hidden = false;
  clearTimeout(undoTimer);
  undoTimer = setTimeout(() => { els.notice.hidden = true; lastDeleted = null; }, 20000);
  if (conv === state) {
    const next = listConversations()[0];
    const nextConv = next && loadConversation(next.id);
    if (nextConv) markInterrupted(nextConv);
    show(nextConv || newConversation({ system: conv.system, thinking: conv.thinking }));
  } else {
    renderList();
  }
  els.undo.focus();
}

function undoDelete() {
  if (!lastDeleted) return;
  const { conv, wasShown } = lastDeleted;
  lastDeleted = null;
  clearTimeout(undoTimer);
  els.notice.hidden = true;
  conv.deleted = false;
  // Back in its place in the list: written with the time it had.
  if (!saveConversation(conv)) {
    storageWarning = 'The browser does not keep this chat (storage full or disabled): a reload will lose it.';
  }
  if (wasShown) show(conv, { focusInput: true }); else renderList();
}

// Below 600 px the list is a panel over the chat, opened by "chats".
function showSidebar(open) {
  els.app.classList.toggle('sidebar-open', open);
  els.sidebarToggle.setAttribute('aria-expanded', String(open));
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
function tickPrefill(reply) {
  if (replyHere() !== reply || reply.firstTokenAt) return;
  els.prefill.hidden = false;
  const p = reply.progress;
  if (p && p.total > 0) {
    const pct = Math.floor((100 * p.processed) / p.total);
    els.prefill.textContent = `prefill ${pct} %`;
    els.prefill.title = `${p.processed} of ${p.total} prompt tokens read` +
      (p.cache > 0 ? ` (${p.cache} kept from before)` : '') +
      ` in ${(p.time_ms / 1000).toFixed(1)} s`;
  } else {
    els.prefill.textContent = `prefill ${((performance.now() - reply.started) / 1000).toFixed(1)} s`;
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

// Writes the reply to conversation `conv`'s messages into `conv` (shown or not).
async function generate(conv) {
  const shown = () => state === conv;
  if (shown()) showError('');
  const turn = { role: 'assistant', content: '', reasoning: '', toolCalls: [] };
  const messages = toMessages(conv);
  conv.turns.push(turn);
  persist(conv);
  const controller = new AbortController();
  const started = performance.now();
  const reply = { controller, turn, conv, started, firstTokenAt: 0, pieces: 0 };
  replies.set(conv.id, reply);
  reply.metricsTimer = setInterval(refreshMetrics, 1000);
  reply.prefillTimer = setInterval(() => tickPrefill(reply), 200);
  if (shown()) {
    showBusy();
    render();
  }
  renderList();
  const onPiece = () => {
    reply.pieces++;
    if (!reply.firstTokenAt) {
      reply.firstTokenAt = performance.now();
      if (shown()) {
        els.ttft.textContent = `ttft ${Math.round(reply.firstTokenAt - started)} ms`;
        els.state.textContent = 'generating…';
        els.prefill.hidden = true;
      }
    }
    const secs = (performance.now() - reply.firstTokenAt) / 1000;
    if (secs > 0.2 && shown()) els.tps.textContent = `${(reply.pieces / secs).toFixed(1)} tok/s`;
  };
  try {
    await streamChat({
      model: modelId,
      messages,
      thinking: conv.thinking,
      signal: controller.signal,
      on: {
        progress: (p) => { reply.progress = p; tickPrefill(reply); },
        reasoning: (t) => { turn.reasoning += t; onPiece(); renderTurn(turn); },
        content: (t) => { turn.content += t; onPiece(); renderTurn(turn); },
        toolCalls: (calls) => { mergeToolCalls(turn, calls); onPiece(); renderTurn(turn); },
        usage: (u) => {
          const secs = reply.firstTokenAt ? (performance.now() - reply.firstTokenAt) / 1000 : 0;
          if (secs > 0 && u.completion_tokens > 1 && shown()) {
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
      if (shown()) showError(turn.error);
      if (e instanceof AuthError) askForKey();
    }
  } finally {
    clearInterval(reply.metricsTimer);
    clearInterval(reply.prefillTimer);
    replies.delete(conv.id);
    turn.reasoningOpen = false;
    // A keyboard user on "stop" would otherwise be left on nothing once it hides.
    const refocus = shown() && document.activeElement === els.stop;
    persist(conv);
    if (shown()) {
      showBusy();
      render({ follow: false });
    }
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
  if (!raw.trim() || busyHere()) return;
  // Pasted code keeps its indentation: only blank lines around it and trailing spaces go.
  const text = raw.replace(/^\s*\n/, '').trimEnd();
  startReply((conv) => {
    els.input.value = '';
    conv.turns.push({ role: 'user', content: text });
    persist(conv);
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
  const reply = replyHere();
  if (!reply) return;
  reply.controller.abort();
  els.input.focus();
}
els.stop.addEventListener('click', (ev) => {
  // "stop" takes the place of "send": the second click of a double click on send lands here.
  if (ev.detail > 1) return;
  stopReply();
});
document.addEventListener('keydown', (ev) => {
  if (ev.key !== 'Escape' || ev.isComposing || composing) return;
  if (els.app.classList.contains('sidebar-open')) {
    ev.preventDefault();
    showSidebar(false);
    els.sidebarToggle.focus();
  } else if (replyHere()) {
    ev.preventDefault();
    stopReply();
  }
});
// "new chat" keeps the conversation it leaves (a reply being written there goes on).
els.newChat.addEventListener('click', newChat);
els.undo.addEventListener('click', undoDelete);
els.sidebarToggle.addEventListener('click', () => {
  const open = !els.app.classList.contains('sidebar-open');
  showSidebar(open);
  if (open) (els.list.querySelector('[aria-current]') || els.list.querySelector('button'))?.focus();
});
// A tap on the shade beside the open panel closes it (a phone has no Escape key); the shade
// (#app's ::after) keeps the tap from reaching the button under it.
els.app.addEventListener('click', (ev) => {
  if (ev.target === els.app && els.app.classList.contains('sidebar-open')) showSidebar(false);
});
// Another tab wrote a conversation: the list follows, and an idle tab that shows that
// conversation shows the new version (else sending from a tab opened earlier would overwrite,
// with its stale copy, what was said in the other tab since). One deleted there is left here.
window.addEventListener('storage', (ev) => {
  if (ev.key !== null && !isConversationKey(ev.key)) return;
  if (busyHere() || (ev.key !== null && ev.key !== conversationKey(state.id))) {
    renderList();
    return;
  }
  const fresh = loadConversation(state.id);
  if (fresh) {
    state = fresh;
    els.thinking.checked = state.thinking;
    els.system.value = state.system;
    render({ follow: false });
    renderList();
  } else if (state.saved) {
    const next = listConversations()[0];
    show((next && loadConversation(next.id)) ||
      newConversation({ system: state.system, thinking: state.thinking }));
  } else {
    renderList();
  }
});
els.thinking.checked = state.thinking;
els.thinking.addEventListener('change', () => {
  state.thinking = els.thinking.checked;
  saveDefaults(state);
  persist();
});
els.system.value = state.system;
els.system.addEventListener('input', () => {
  state.system = els.system.value;
  saveDefaults(state);
  persist();
});
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

markInterrupted(state);
rememberCurrent(state.id);
render();
renderList();
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
