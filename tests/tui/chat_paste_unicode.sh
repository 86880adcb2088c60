#!/usr/bin/env bash
# `coli chat` in a real terminal (tmux), what users type and paste: non-ASCII text typed under
# the C locale arrives whole (libedit used to drop every non-ASCII character there), and
# bracketed pastes (tmux paste-buffer -p, as a terminal emulator's paste) with line breaks are
# one message that the next Enter sends, with a typed line before or after; a one-line paste is
# typed into the line; a paste that is not UTF-8 is refused; pasted code starting with "//" is
# the message exactly; /retry, /undo and /load; Tab completion; Ctrl-Z / fg and resizes while a
# line is edited.
# The saved conversations (/save) must hold exactly those messages.
# Usage: chat_paste_unicode.sh COLI_BIN MODEL_DIR
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

# wait_count FILE REGEX N SECONDS: until FILE has at least N lines matching REGEX.
wait_count() {
  local deadline=$((SECONDS + $4)) n
  while ((SECONDS < deadline)); do
    n=$(grep -Eac -- "$2" "$1" 2>/dev/null || true)
    ((${n:-0} >= $3)) && return 0
    sleep 0.2
  done
  echo "FAIL: $1 never had $3 lines matching /$2/ within $4 s; it holds:" >&2
  cat -v "$1" >&2 || true
  return 1
}
# paste TEXT: a bracketed paste into the chat (the pane has asked for mode 2004).
paste() {
  printf '%s' "$1" > "$work/paste.txt"
  tmux_ load-buffer -b p "$work/paste.txt"
  tmux_ paste-buffer -p -b p -t chat
}
log=$work/chat.log

tmux_ new-session -d -s main -x 120 -y 40 "sleep 600"
# LC_ALL=C: the locale that used to lose every non-ASCII character.
tmux_ new-window -d -n chat \
  "script -qfc 'env LC_ALL=C LANG=C TERM=xterm HOME=$work/home TMPDIR=$work/tmp $coli chat --model $model --max-tokens 2 --seed 1; echo EXITED-\$?' $log"
wait_count "$log" 'you> ' 1 120
grep -aq $'\x1b\\[?2004h' "$log" || { echo "FAIL: bracketed paste was not turned on" >&2; exit 1; }

# 1. Typed UTF-8 (Latin, CJK, an emoji) under LC_ALL=C.
tmux_ send-keys -t chat -l 'héllo 你好 😀'
tmux_ send-keys -t chat Enter
wait_count "$log" 'tok/s' 1 120

# 2. Typed text, then a paste with line breaks, a tab and a trailing line break: the chat
#    shows the continuation prompt; a typed line ends the message.
tmux_ send-keys -t chat -l 'Explain:'
paste $'def f():\n\treturn 1\n\n# done\n'
wait_count "$log" '\.\.\.> ' 1 30
tmux_ send-keys -t chat -l 'briefly'
tmux_ send-keys -t chat Enter
wait_count "$log" 'tok/s' 2 120

# 3. A one-line paste is typed into the line: more typing follows it, Enter sends it.
paste 'one line pasted'
tmux_ send-keys -t chat -l ', then typed'
tmux_ send-keys -t chat Enter
wait_count "$log" 'tok/s' 3 120

# 4. A multi-line paste sent as it is with Enter alone.
paste $'p1\np2'
wait_count "$log" '\.\.\.> ' 2 30
tmux_ send-keys -t chat Enter
wait_count "$log" 'tok/s' 4 120

# 5. A paste that is not UTF-8 is refused and nothing is sent.
printf 'bad\n\xff byte' > "$work/bad.txt"
tmux_ load-buffer -b b "$work/bad.txt"
tmux_ paste-buffer -p -b b -t chat
wait_count "$log" 'pasted text is not valid UTF-8' 1 30

# 6. Pasted code that starts with "//" is the message exactly (a typed "//x" sends "/x").
paste $'// comment\nint x;'
wait_count "$log" '\.\.\.> ' 3 30
tmux_ send-keys -t chat Enter
wait_count "$log" 'tok/s' 5 120

# 7. /retry answers the last message again (its reply replaced); /undo takes back an exchange.
tmux_ send-keys -t chat '/retry' Enter
wait_count "$log" 'tok/s' 6 120
tmux_ send-keys -t chat 'to be taken back' Enter
wait_count "$log" 'tok/s' 7 120
tmux_ send-keys -t chat '/undo' Enter
wait_count "$log" 'took back the last exchange: 2 messages' 1 30

tmux_ send-keys -t chat "/save $work/chat.json" Enter
wait_count "$log" 'saved 10 messages' 1 30
python3 - "$work/chat.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
roles = [m["role"] for m in doc["messages"]]
assert roles == ["user", "assistant"] * 5, roles
users = [m["content"] for m in doc["messages"] if m["role"] == "user"]
want = ["héllo 你好 😀", "Explain:\ndef f():\n\treturn 1\n\n# done\nbriefly",
        "one line pasted, then typed", "p1\np2", "// comment\nint x;"]
assert users == want, users
PY

# 8. /load continues a saved conversation (here a bare OpenAI messages array); a file that is
#    not one is refused and changes nothing.
cat > "$work/load.json" <<'JSON'
[{"role": "system", "content": "Réponds en français."},
 {"role": "user", "content": "Bonjour"},
 {"role": "assistant", "content": "Salut !"}]
JSON
printf '{"messages": [' > "$work/bad.json"
tmux_ send-keys -t chat "/load $work/bad.json" Enter
wait_count "$log" 'load failed: .*is not JSON.*\(the conversation is unchanged\)' 1 30
tmux_ send-keys -t chat "/load $work/load.json" Enter
wait_count "$log" 'loaded 3 messages' 1 30
tmux_ send-keys -t chat 'Et ensuite ?' Enter
wait_count "$log" 'tok/s' 8 120
tmux_ send-keys -t chat "/save $work/loaded.json" Enter
wait_count "$log" 'saved 5 messages' 1 30
python3 - "$work/loaded.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
assert [x["role"] for x in m] == ["system", "user", "assistant", "user", "assistant"], m
assert [x["content"] for x in m[:4]] == ["Réponds en français.", "Bonjour", "Salut !",
                                          "Et ensuite ?"], m
PY

# Tab completes commands and, after /save, file names; inside a message it adds nothing (it
# used to complete "/tm" to "/tmp/" anywhere).
tmux_ send-keys -t chat -l 'see /tm'
tmux_ send-keys -t chat Tab
tmux_ send-keys -t chat -l 'X'
tmux_ send-keys -t chat Enter
wait_count "$log" 'tok/s' 9 120
: > "$work/completion-target.json"
tmux_ send-keys -t chat -l '/sa'
tmux_ send-keys -t chat Tab
tmux_ send-keys -t chat -l "$work/completion-ta"
tmux_ send-keys -t chat Tab
tmux_ send-keys -t chat Enter
wait_count "$log" 'saved 7 messages to .*completion-target.json' 1 30
python3 - "$work/completion-target.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
assert m[5] == {"role": "user", "content": "see /tmX"}, m[5]
PY
tmux_ send-keys -t chat C-d
wait_count "$log" 'EXITED-0' 1 60
# Mode 2004 is turned off again before the chat exits.
tail -c 400 "$log" | grep -aq $'\x1b\\[?2004l' || { echo "FAIL: bracketed paste left on" >&2; exit 1; }

# 9. Ctrl-Z and `fg` in an interactive bash (which turns bracketed paste off while it reads
#    `fg`), twice, and two resizes: the line typed before is redrawn and kept, and a paste after
#    the resume is still one message (it came out as one message per line).
tmux_ new-window -d -n job "env HOME=$work/home TMPDIR=$work/tmp PS1='sh$ ' bash --norc -i"
sleep 0.5
tmux_ send-keys -t job "$coli chat --model $model --max-tokens 2 --seed 1 2>/dev/null" Enter
screen_has() { tmux_ capture-pane -p -J -t job | grep -Eq -- "$1"; }
wait_screen() {
  local deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do screen_has "$1" && return 0; sleep 0.2; done
  echo "FAIL: the job window never showed /$1/:" >&2
  tmux_ capture-pane -p -J -t job >&2
  return 1
}
wait_screen '^you> ' 120
tmux_ send-keys -t job -l 'kept across'
for round in 1 2; do
  tmux_ send-keys -t job C-z
  wait_screen "Stopped" 30
  tmux_ send-keys -t job "clear; fg" Enter
  wait_screen '^you> kept across' 30  # redrawn after the resume
done
tmux_ resize-window -t job -x 70
sleep 0.3
tmux_ resize-window -t job -x 110
sleep 0.3
tmux_ send-keys -t job -l ' the stop'
tmux_ send-keys -t job Enter
wait_screen 'tok/s' 120
printf 'after\nthe resume' > "$work/resume.txt"
tmux_ load-buffer -b r "$work/resume.txt"
tmux_ paste-buffer -p -b r -t job
wait_screen '^\.\.\.> ' 30
tmux_ send-keys -t job Enter
sleep 0.5
tmux_ send-keys -t job "/save $work/job.json" Enter
wait_screen 'saved 4 messages' 60
python3 - "$work/job.json" <<'PY'
import json, sys
users = [m["content"] for m in json.load(open(sys.argv[1]))["messages"] if m["role"] == "user"]
assert users == ["kept across the stop", "after\nthe resume"], users
PY
tmux_ send-keys -t job C-d
echo "PASS"
