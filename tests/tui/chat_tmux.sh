#!/usr/bin/env bash
# `coli chat` in a real terminal (tmux): two turns, /think off, Ctrl-C mid-reply followed by
# another turn, /save producing valid JSON in the OpenAI message shape, a long prompt's prefill
# progress bar, Ctrl-D exits.
# Usage: chat_tmux.sh COLI_BIN MODEL_DIR ARTIFACT_DIR
set -euo pipefail
coli=$1 model=$2 artifacts=${3:-/tmp}
mkdir -p "$artifacts"
work=$(mktemp -d)
sock="$work/tmux.sock"
session=coli_chat_test
tmux_() { tmux -S "$sock" "$@"; }
# The chat a killed tmux server hangs up may still be writing its history into $work/home (and
# its host removing its socket) for a moment: a failed rm there failed a passed test (set -e
# holds in the trap). Retried for up to 5 s; never the test's result.
cleanup() {
  tmux_ kill-server 2>/dev/null || true
  for _ in $(seq 25); do rm -rf "$work" 2>/dev/null && return 0; sleep 0.2; done
  rm -rf "$work" || true
}
trap cleanup EXIT

screen() { tmux_ capture-pane -p -J -S -2000 -t "$session"; }
# wait_for REGEX SECONDS: until the screen matches (generous bounds; nothing depends on speed).
wait_for() {
  local deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    if screen | grep -Eq -- "$1"; then return 0; fi
    sleep 0.2
  done
  echo "FAIL: screen never matched /$1/ within $2 s; screen was:" >&2
  screen >&2
  return 1
}
count() { screen | grep -Ec -- "$1" || true; }
# wait_more REGEX N SECONDS: until at least N screen lines match.
wait_more() {
  local deadline=$((SECONDS + $3))
  while (( $(count "$1") < $2 )) && ((SECONDS < deadline)); do sleep 0.2; done
  (( $(count "$1") >= $2 )) && return 0
  echo "FAIL: fewer than $2 lines matched /$1/ within $3 s; screen was:" >&2
  screen >&2
  return 1
}

# A slow, long reply so Ctrl-C lands mid-reply: 40 ms per token, up to 400 tokens. Prefill in
# chunks of 8 tokens, 60 ms apart, so a long prompt's progress bar stays on screen a while.
tmux_ new-session -d -s "$session" -x 120 -y 40 \
  "HOME=$work COLI_DECODE_DELAY_MS=40 K3_CHUNK=8 COLI_PREFILL_DELAY_MS=60 $coli chat --model $model --max-tokens 400 --temperature 0.8 --seed 7; echo CHAT-EXITED-\$?; sleep 30"
wait_for 'coli chat —' 120

# A long prompt first (an empty conversation, so all of it is read): the bar shows tokens read
# of the prompt while it prefills. Ctrl-C then stops the reply; /clear starts afresh.
tmux_ send-keys -t "$session" "$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..12})" Enter
wait_for 'reading the prompt \[#*-+\] +[0-9]+% [0-9]+/[0-9]+ tokens' 60
bar=$(screen | grep -Eo 'reading the prompt \[[#-]+\] +[0-9]+% [0-9]+/[0-9]+ tokens' | tail -1)
echo "prefill bar seen: $bar"
read -r done_tokens total_tokens < <(echo "$bar" | sed -E 's|.* ([0-9]+)/([0-9]+) tokens|\1 \2|')
(( total_tokens >= 200 && done_tokens < total_tokens )) || { echo "FAIL: bar '$bar'" >&2; exit 1; }
tmux_ send-keys -t "$session" C-c
wait_for 'stopped\]' 60
tmux_ send-keys -t "$session" '/clear' Enter
wait_for '\(new conversation\)' 20

# Turn 1 (thinking on by default): reasoning streams, then the stats line closes the reply.
tmux_ send-keys -t "$session" 'hello there' Enter
wait_more '\[[0-9]+ tokens, .* tok/s' 2 120

# Turn 2 with /think off.
tmux_ send-keys -t "$session" '/think off' Enter
wait_for '\(thinking off\)' 20
before=$(count 'tok/s')
tmux_ send-keys -t "$session" 'second question' Enter
# Ctrl-C mid-reply: wait until tokens are streaming, then interrupt.
sleep 1.5
tmux_ send-keys -t "$session" C-c
wait_more 'stopped\]' 2 30
screen | grep -q 'CHAT-EXITED' && { echo "FAIL: Ctrl-C ended the program" >&2; exit 1; }

# Another turn after the interrupt works.
tmux_ send-keys -t "$session" 'third question' Enter
deadline=$((SECONDS + 120))
while (( $(count 'tok/s') < before + 2 )) && ((SECONDS < deadline)); do sleep 0.3; done
(( $(count 'tok/s') >= before + 2 )) || { echo "FAIL: no reply after Ctrl-C" >&2; screen >&2; exit 1; }

# /save writes valid JSON with the conversation.
tmux_ send-keys -t "$session" "/save $work/conv.json" Enter
wait_for 'saved [0-9]+ messages' 20
/usr/bin/python3 - "$work/conv.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
roles = [m["role"] for m in doc["messages"]]
assert roles.count("user") == 3, roles
assert roles.count("assistant") == 3, roles
assert all(isinstance(m["content"], str) for m in doc["messages"])
assert doc["messages"][0] == {"role": "user", "content": "hello there"} , doc["messages"][0]
assert doc["thinking"] is False
print("saved conversation OK:", roles)
PY

screen > "$artifacts/chat-tmux.txt"

# Ctrl-D exits cleanly.
tmux_ send-keys -t "$session" C-d
wait_for 'CHAT-EXITED-0' 20
echo "chat_tmux: 1 passed, 0 failed"
