#!/usr/bin/env bash
# `coli chat` in a real terminal (tmux): two turns, /think off, Ctrl-C mid-reply followed by
# another turn, /save producing valid JSON in the OpenAI message shape, Ctrl-D exits.
# Usage: chat_tmux.sh COLI_BIN MODEL_DIR ARTIFACT_DIR
set -euo pipefail
coli=$1 model=$2 artifacts=${3:-/tmp}
mkdir -p "$artifacts"
work=$(mktemp -d)
sock="$work/tmux.sock"
session=coli_chat_test
tmux_() { tmux -S "$sock" "$@"; }
cleanup() { tmux_ kill-server 2>/dev/null || true; rm -rf "$work"; }
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

# A slow, long reply so Ctrl-C lands mid-reply: 40 ms per token, up to 400 tokens.
tmux_ new-session -d -s "$session" -x 120 -y 40 \
  "HOME=$work COLI_DECODE_DELAY_MS=40 $coli chat --model $model --max-tokens 400 --temperature 0.8 --seed 7; echo CHAT-EXITED-\$?; sleep 30"
wait_for 'coli chat —' 120

# Turn 1 (thinking on by default): reasoning streams, then the stats line closes the reply.
tmux_ send-keys -t "$session" 'hello there' Enter
wait_for '\[[0-9]+ tokens, .* tok/s' 120

# Turn 2 with /think off.
tmux_ send-keys -t "$session" '/think off' Enter
wait_for '\(thinking off\)' 20
before=$(count 'tok/s')
tmux_ send-keys -t "$session" 'second question' Enter
# Ctrl-C mid-reply: wait until tokens are streaming, then interrupt.
sleep 1.5
tmux_ send-keys -t "$session" C-c
wait_for 'stopped\]' 30
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
