#!/usr/bin/env bash
# `coli chat` in a real terminal (tmux), the unusual ones: TERM=dumb and NO_COLOR get no escape
# codes (the output is recorded by `script`, escapes included), a multi-line paste between
# """ lines is one message, Ctrl-C at the continuation prompt drops the unfinished message, and
# closing the terminal (SIGHUP) saves the line history and removes the private host's folder.
# Usage: chat_terminal_modes.sh COLI_BIN MODEL_DIR
set -euo pipefail
coli=$1 model=$2
work=$(mktemp -d)
sock="$work/tmux.sock"
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
mkdir -p "$work/home" "$work/tmp"

# wait_file FILE REGEX SECONDS: until FILE matches (generous bounds; nothing depends on speed).
wait_file() {
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    if [[ -f $1 ]] && grep -Eq -- "$2" "$1"; then return 0; fi
    sleep 0.2
  done
  echo "FAIL: $1 never matched /$2/ within $3 s; it holds:" >&2
  cat -v "$1" >&2 || true
  return 1
}

# run_recorded NAME ENV...: coli chat under `script` in a tmux window, its output in
# $work/NAME.log; waits for the prompt.
run_recorded() {
  local name=$1
  shift
  tmux_ new-window -d -n "$name" \
    "script -qfc 'env $* HOME=$work/home TMPDIR=$work/tmp $coli chat --model $model --max-tokens 3 --seed 1; echo EXITED-\$?' $work/$name.log"
  wait_file "$work/$name.log" 'you> ' 120
}

tmux_ new-session -d -s main -x 120 -y 40 "sleep 600"

# one_reply NAME: a message, its reply, Ctrl-D; the program exits 0.
one_reply() {
  tmux_ send-keys -t "$1" 'hello' Enter
  wait_file "$work/$1.log" 'tok/s' 120
  tmux_ send-keys -t "$1" C-d
  wait_file "$work/$1.log" 'EXITED-0' 60
}
# refuse_escapes NAME REGEX WHAT: fails when the recorded output matches REGEX.
refuse_escapes() {
  if grep -qE "$2" "$work/$1.log"; then
    echo "FAIL: $3:" >&2
    cat -v "$work/$1.log" >&2
    exit 1
  fi
}

# TERM=dumb: no escape sequence at all (the prefill bar and styles used to be drawn anyway).
run_recorded dumb TERM=dumb
one_reply dumb
refuse_escapes dumb $'\x1b' "TERM=dumb output has escape sequences"

# NO_COLOR on a capable terminal: no dim / bold (line redraws stay).
run_recorded nocolor TERM=xterm NO_COLOR=1
one_reply nocolor
refuse_escapes nocolor $'\x1b\\[(1|2|0)m' "NO_COLOR output has dim/bold"

# A paste between """ lines is one message; Ctrl-C at the continuation prompt drops one.
run_recorded paste TERM=xterm
tmux_ send-keys -t paste '"""' Enter
wait_file "$work/paste.log" '\.\.\.> ' 30
printf 'first pasted line\nsecond pasted line\nthird pasted line' > "$work/paste.txt"
tmux_ load-buffer -b p "$work/paste.txt"
tmux_ paste-buffer -b p -t paste
tmux_ send-keys -t paste Enter '"""' Enter
wait_file "$work/paste.log" 'tok/s' 120
tmux_ send-keys -t paste 'unfinished \' Enter
sleep 0.5
tmux_ send-keys -t paste C-c
tmux_ send-keys -t paste "/save $work/paste.json" Enter
wait_file "$work/paste.log" 'saved 2 messages' 30
python3 - "$work/paste.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
users = [m["content"] for m in doc["messages"] if m["role"] == "user"]
assert users == ["first pasted line\nsecond pasted line\nthird pasted line"], users
PY
[[ $(grep -c 'tok/s' "$work/paste.log") == 1 ]] || {
  echo "FAIL: the paste was not one message:" >&2
  cat -v "$work/paste.log" >&2
  exit 1
}
tmux_ send-keys -t paste C-d
wait_file "$work/paste.log" 'EXITED-0' 60

# Closing the terminal: SIGHUP ends the chat with the history saved and the host's folder gone.
rm -f "$work/home/.coli_chat_history"
# The window's shell writes its pid and becomes coli chat (exec), so that pid is the chat's.
tmux_ new-window -d -n hup \
  "echo \$\$ > $work/hup.pid; exec env HOME=$work/home TMPDIR=$work/tmp $coli chat --model $model --max-tokens 3 > $work/hup.log 2>&1"
wait_file "$work/hup.log" 'coli chat' 120
pid=$(cat "$work/hup.pid")
tmux_ send-keys -t hup 'remember me' Enter
wait_file "$work/hup.log" 'tok/s' 120
[[ -n $pid ]] || { echo "FAIL: no coli chat process found" >&2; exit 1; }
kill -HUP "$pid"
# Alive = present and not a zombie: the chat ends as killed by SIGHUP, and its parent (the tmux
# server) may take its time to reap it.
alive() {
  local state
  state=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)
  [[ -n $state && $state != Z ]]
}
for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
if alive "$pid"; then
  echo "FAIL: coli chat still runs after SIGHUP" >&2
  exit 1
fi
grep -qE 'remember(\\040| )me' "$work/home/.coli_chat_history" || {
  echo "FAIL: SIGHUP lost the line history" >&2
  exit 1
}
left=$(find "$work/tmp" -maxdepth 1 -name 'coli-*' | wc -l)
((left == 0)) || { echo "FAIL: $left private host folder(s) left after SIGHUP" >&2; exit 1; }
echo "PASS"
