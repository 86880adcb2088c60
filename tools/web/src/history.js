// The conversation lives in the browser (localStorage): a reload keeps it, "new chat" clears it.
const KEY = 'coli.chat.v1';

export function loadState() {
  try {
    return normalizeState(JSON.parse(localStorage.getItem(KEY) || 'null'));
  } catch (_) {
    // A corrupt entry, or storage that cannot be read (disabled, private mode): a fresh chat.
    return normalizeState(null);
  }
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

// Returns false when the browser would not store it (quota full, storage disabled): the chat
// goes on, only without surviving a reload.
export function saveState(state) {
  try {
    localStorage.setItem(KEY, JSON.stringify(state));
    return true;
  } catch (_) {
    return false;
  }
}

export const STORAGE_KEY = KEY;

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
