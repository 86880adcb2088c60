// The conversations live in the browser (localStorage), one key per conversation
// (`coli.chat.v2:<id>`): the list is derived from the keys, never from an index another tab could
// overwrite, and each tab writes only the conversation it works on, so two tabs that write at
// once cannot lose each other's conversation. A reload keeps them all; "new chat" starts another.
const PREFIX = 'coli.chat.v2:';
// The one chat of the pages before conversations: moved into PREFIX on first load.
const LEGACY_KEY = 'coli.chat.v1';
// What a new conversation starts with (the last system prompt and thinking switch set).
const DEFAULTS_KEY = 'coli.chat.defaults';

export const isConversationKey = (key) => typeof key === 'string' && key.startsWith(PREFIX);
export const conversationKey = (id) => PREFIX + id;

export function newConversationId() {
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
}

// A conversation not yet stored: it is written with its first message.
export function newConversation(defaults = loadDefaults()) {
  return { id: newConversationId(), created: Date.now(), updated: 0, turns: [],
    system: defaults.system, thinking: defaults.thinking };
}

// What was stored may be from an older page, edited by hand, or cut short: keep what has the
// shape of a turn and fill in the rest, so a bad entry never leaves a dead page.
export function normalizeState(raw) {
  const obj = raw && typeof raw === 'object' && !Array.isArray(raw) ? raw : {};
  const str = (v) => (typeof v === 'string' ? v : '');
  const turns = [];
  for (const t of Array.isArray(obj.turns) ? obj.turns : []) {
    if (!t || typeof t !== 'object' || !['user', 'assistant', 'tool'].includes(t.role)) continue;
    const turn = { ...t, content: str(t.content) };
    if (t.role === 'assistant') {
      turn.reasoning = str(t.reasoning);
      turn.toolCalls = (Array.isArray(t.toolCalls) ? t.toolCalls : [])
        .filter((c) => c && typeof c === 'object')
        .map((c) => ({ id: str(c.id), type: 'function', function: {
          name: str(c.function?.name), arguments: str(c.function?.arguments) } }));
      if (t.error) turn.error = str(t.error) || 'error'; else delete turn.error;
    }
    if (t.role === 'tool') {
      turn.toolCallId = str(t.toolCallId);
      turn.name = str(t.name);
    }
    turns.push(turn);
  }
  return { turns, system: str(obj.system), thinking: obj.thinking !== false };
}

const time = (v) => (Number.isFinite(v) ? v : 0);

// The stored conversation `id` (a corrupt entry reads as an empty one that keeps its place in
// the list, so it can be opened or deleted), or null when there is none.
export function loadConversation(id) {
  let text;
  try {
    text = localStorage.getItem(PREFIX + id);
  } catch (_) {
    return null;  // storage that cannot be read (disabled, private mode)
  }
  if (text === null) return null;
  return parseConversation(id, text);
}

function parseConversation(id, text) {
  let raw = null;
  try { raw = JSON.parse(text); } catch (_) { /* corrupt: read as empty */ }
  const obj = raw && typeof raw === 'object' ? raw : {};
  return { id, created: time(obj.created), updated: time(obj.updated), ...normalizeState(raw),
    saved: true };
}

// Every stored conversation as {id, title, updated}, the most recently written first.
export function listConversations() {
  const list = [];
  try {
    for (let i = 0; i < localStorage.length; i++) {
      const key = localStorage.key(i);
      if (!isConversationKey(key)) continue;
      const conv = parseConversation(key.slice(PREFIX.length), localStorage.getItem(key) ?? '');
      list.push({ id: conv.id, title: titleOf(conv), updated: conv.updated, created: conv.created });
    }
  } catch (_) { /* storage that cannot be read: no stored conversations */ }
  return list.sort((a, b) => b.updated - a.updated || b.created - a.created ||
    (a.id < b.id ? 1 : -1));
}

// The first user message, on one line and cut to fit the side list.
export function titleOf(conv, max = 48) {
  const first = conv.turns.find((t) => t.role === 'user');
  const text = (first?.content || '').replace(/\s+/g, ' ').trim();
  if (!text) return 'New chat';
  const chars = [...text];  // whole characters: never half of a surrogate pair
  return chars.length > max ? `${chars.slice(0, max - 1).join('').trimEnd()}…` : text;
}

// Writes conversation `conv` (only its own key). Returns false when the browser would not store
// it (quota full, storage disabled): the chat goes on, only without surviving a reload.
export function saveConversation(conv) {
  const { id, created, updated, turns, system, thinking } = conv;
  try {
    localStorage.setItem(PREFIX + id,
      JSON.stringify({ id, created, updated, turns, system, thinking }));
    conv.saved = true;
    return true;
  } catch (_) {
    return false;
  }
}

export function deleteConversation(id) {
  try {
    localStorage.removeItem(PREFIX + id);
    return true;
  } catch (_) {
    return false;
  }
}

export function loadDefaults() {
  try {
    const d = JSON.parse(localStorage.getItem(DEFAULTS_KEY) || 'null');
    return { system: typeof d?.system === 'string' ? d.system : '', thinking: d?.thinking !== false };
  } catch (_) {
    return { system: '', thinking: true };
  }
}

export function saveDefaults(conv) {
  try {
    localStorage.setItem(DEFAULTS_KEY, JSON.stringify({ system: conv.system, thinking: conv.thinking }));
  } catch (_) { /* only a default: the conversation itself says whether it was kept */ }
}

// The one chat of an older page (`coli.chat.v1`) becomes a conversation. Its id comes from its
// text, so two tabs migrating at once write the same conversation, not two copies; the old key
// goes only once the new one is written (a full storage keeps it for the next load).
export function migrateLegacyChat() {
  let text;
  try {
    text = localStorage.getItem(LEGACY_KEY);
  } catch (_) {
    return;
  }
  if (text === null) return;
  const conv = parseConversation(`v1-${hashText(text)}`, text);
  const remove = () => { try { localStorage.removeItem(LEGACY_KEY); } catch (_) { /* kept */ } };
  if (!conv.turns.length && !conv.system) {
    remove();  // nothing said in it (or unreadable): nothing to keep
    return;
  }
  if (loadConversation(conv.id) === null) {
    conv.created = conv.created || Date.now();
    conv.updated = conv.updated || Date.now();
    if (!saveConversation(conv)) return;
  }
  remove();
}

// FNV-1a from two starting values, for an id that only has to be the same for the same text: an
// origin has one old chat at most, and its id (`v1-…`) cannot meet a new conversation's.
function hashText(text) {
  let a = 2166136261;
  let b = 0x811c9dc5 ^ 0x5bd1e995;
  for (let i = 0; i < text.length; i++) {
    a = Math.imul(a ^ text.charCodeAt(i), 16777619);
    b = Math.imul(b ^ text.charCodeAt(i), 16777619);
  }
  return (a >>> 0).toString(36) + (b >>> 0).toString(36);
}

// Turns in the OpenAI message shape (assistant turns keep their reasoning_content so the
// model sees its own earlier thinking, as K3 was trained).
export function toMessages(state) {
  const messages = [];
  if (state.system.trim()) messages.push({ role: 'system', content: state.system });
  for (const turn of state.turns) {
    if (turn.role === 'user') {
      messages.push({ role: 'user', content: turn.content });
    } else if (turn.role === 'tool') {
      messages.push({ role: 'tool', tool_call_id: turn.toolCallId, content: turn.content });
    } else if (turn.role === 'assistant' && !turn.error) {
      const m = { role: 'assistant', content: turn.content || '' };
      if (turn.reasoning) m.reasoning_content = turn.reasoning;
      if (turn.toolCalls && turn.toolCalls.length) {
        m.tool_calls = turn.toolCalls;
        if (!turn.content) m.content = null;  // OpenAI's shape for a reply that only calls
      }
      messages.push(m);
    }
  }
  return messages;
}
