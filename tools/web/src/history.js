// The conversation lives in the browser (localStorage): a reload keeps it, "new chat" clears it.
const KEY = 'coli.chat.v1';

export function loadState() {
  try {
    const state = JSON.parse(localStorage.getItem(KEY) || 'null');
    if (state && Array.isArray(state.turns)) return state;
  } catch (_) { /* a corrupt entry starts a fresh chat */ }
  return { turns: [], system: '', thinking: true };
}

export function saveState(state) {
  localStorage.setItem(KEY, JSON.stringify(state));
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
