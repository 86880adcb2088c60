#!/usr/bin/env bash
# The `coli` command-line tools driven from outside, as a user's shell drives them: exit codes,
# the message on stderr, stdout, signals, pipes, files. Every check here failed before the pass
# that added it; where it is not obvious, the comment above a check says what happened before.
# Usage: cli_blackbox.sh BIN_DIR MODEL_DIR
set -uo pipefail
bin=$1 model=$2
coli=$bin/coli
work=$(mktemp -d)
# A private TMPDIR: the private hosts' folders (coli-XXXXXX) must all be gone at the end.
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"
export HOME=$work/home
mkdir -p "$HOME"
unset COLI_MODEL COLI_TEMP K3_THINK K3_MAXT NO_COLOR
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/expect.sh"
no_private_hosts_left() {
  local left
  left=$(find "$TMPDIR" -maxdepth 1 -name 'coli-*' | wc -l)
  ((left == 0)) || fail "$1: $left private host folder(s) left in TMPDIR"
}

echo "== help and unknown commands"
expect 0 "" -- "$coli" chat --help
grep -q 'usage: coli chat' "$work/out" || fail "coli chat --help: usage not on stdout"
expect 0 "" -- "$coli" run --help
grep -q -- '-f FILE' "$work/out" || fail "coli run --help: usage not on stdout"
expect 0 "" -- "$coli" help run
grep -q 'usage: coli run' "$work/out" || fail "coli help run did not show run's usage"
expect 0 "" -- "$coli" bench --help
grep -q 'areas:' "$work/out" || fail "coli bench --help: areas not on stdout"
expect 0 "" -- "$coli" tokenize --help
grep -q 'usage: coli tokenize' "$work/out" || fail "coli tokenize --help: usage not on stdout"
expect 2 "unknown command 'nope'" -- "$coli" nope
expect 2 "unknown area 'nope'" -- "$coli" bench nope

echo "== coli run: flags"
expect 0 "" -- "$coli" run --model "$model" "hello" --ngen=3
[[ -s $work/out ]] || fail "coli run --ngen=3 printed nothing"
expect 2 "--ngen 0 would generate nothing" -- "$coli" run hello --ngen 0
expect 2 "--ngen: '1e9' is not a whole number" -- "$coli" run hello --ngen 1e9
expect 2 "--temperature: 'nan' is not a finite number" -- "$coli" run hello --temperature nan
expect 2 "--top-p: '2' is outside [0, 1]" -- "$coli" run hello --top-p 2
expect 2 "--ngen needs a value" -- "$coli" run hello --ngen
expect 2 "--model is empty" -- "$coli" run --model "" hello
echo '{}' > "$work/a_file"
expect 2 "is a file, not a folder" -- "$coli" run --model "$work/a_file" hello
expect 2 "no such folder" -- "$coli" run --model "$work/nope" hello
expect 2 "more than one prompt given" -- "$coli" run hello --ids 1,2
expect 2 "--system needs --chat" -- "$coli" run hello --system "be brief"
expect 2 "unknown flag '--bogus'" -- "$coli" run hello --bogus
# --ignore-eos / --min-tokens (the stop token <|end_of_msg|> forced by +100: one token without).
eom=$(printf '%s' '<|end_of_msg|>' | "$coli" tokenize --tokenizer "$model" --allow-special |
      python3 -c 'import json, sys; print(json.load(sys.stdin)[0])')
forced=(run --model "$model" --chat --no-think hello --ngen 6 --logit-bias "$eom=100")
expect 0 "), 1 generated" -- "$coli" "${forced[@]}"
expect 0 "), 6 generated" -- "$coli" "${forced[@]}" --ignore-eos
expect 0 "), 4 generated" -- "$coli" "${forced[@]}" --min-tokens 3
expect 2 "--ignore-eos takes no value" -- "$coli" run hello --ignore-eos=1

echo "== coli run: prompts"
# Was an abort (SIGABRT, exit 134) with --chat: the JSON encoder threw on the bytes.
expect 2 "the prompt is not valid UTF-8: byte 0xFF at offset 4" -- \
  "$coli" run --model "$model" --chat $'bad \xff bytes' --ngen 2
expect 2 "the prompt is not valid UTF-8" -- "$coli" run --model "$model" $'\xc3' --ngen 2
printf 'a prompt from stdin' > "$work/prompt.txt"
# `-` and -f FILE read the text itself (it was sent as the one-character prompt "-").
n=$("$coli" tokenize --tokenizer "$model" < "$work/prompt.txt" |
    python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')
STDIN=$work/prompt.txt expect 0 "coli run: $n prompt tokens" -- "$coli" run --model "$model" - --ngen 2
expect 0 "coli run: $n prompt tokens" -- "$coli" run --model "$model" -f "$work/prompt.txt" --ngen 2
expect 2 "--file '$work/none.txt'" -- "$coli" run -f "$work/none.txt"
: > "$work/empty.txt"
expect 2 "is empty" -- "$coli" run -f "$work/empty.txt"
expect 1 "tokens but the context holds 64" -- \
  env K3_MAXT=64 "$coli" run --model "$model" "$(printf 'word %.0s' {1..100})" --ngen 2

echo "== coli run: pipes and signals"
"$coli" run --model "$model" hello --ngen 400 2> "$work/err" | head -c 1 > /dev/null
rc=${PIPESTATUS[0]}
((rc == 141)) || fail "coli run | head -c1 -> exit $rc, wanted 141 (quiet, as cat)"
grep -q 'terminate\|Aborted\|core' "$work/err" && fail "coli run | head: noise on stderr"
no_private_hosts_left "coli run | head -c1"
for sig in INT TERM; do
  # A background job of a script starts with SIGINT ignored (and coli keeps an ignored signal
  # ignored, as for nohup): restore the default, as a terminal's foreground job has it.
  # Emptied first: the background job's own redirection may run after the wait below has read
  # an earlier command's output.
  : > "$work/out"
  COLI_DECODE_DELAY_MS=20 env --default-signal=INT "$coli" run --model "$model" hello \
    --ngen 2000 > "$work/out" 2> "$work/err" &
  pid=$!
  # Wait until tokens stream (no time bound is asserted; the loop only waits).
  for _ in $(seq 600); do [[ -s $work/out ]] && break; sleep 0.1; done
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  want=$((128 + $(kill -l "$sig")))
  ((rc == want)) || fail "SIG$sig during coli run -> exit $rc, wanted $want"
  grep -q 'interrupted' "$work/err" || fail "SIG$sig during coli run: no 'interrupted' on stderr"
  no_private_hosts_left "SIG$sig during coli run"
done

# `nohup coli run …`: an ignored SIGHUP stays ignored (the run is not ended by it).
nohup_out=$work/nohup.out
# 400 tokens 5 ms apart: still running for ~2 s after its first byte.
COLI_DECODE_DELAY_MS=5 nohup "$coli" run --model "$model" hello --ngen 400 > "$nohup_out" \
  2> "$work/err" &
pid=$!
for _ in $(seq 600); do [[ -s $nohup_out ]] && break; sleep 0.1; done
kill -HUP "$pid" || fail "nohup coli run ended before the SIGHUP could test it"
wait "$pid"
rc=$?
((rc == 0)) || fail "SIGHUP to 'nohup coli run' -> exit $rc, wanted 0 (nohup ignores SIGHUP)"
no_private_hosts_left "nohup coli run"

echo "== coli tokenize"
expect 2 "--tokenizer needs a value" -- "$coli" tokenize --tokenizer
expect 2 "is a file, not a folder" -- "$coli" tokenize --tokenizer "$work/a_file"
printf '[18446744073709551615]' > "$work/ids.json"
STDIN=$work/ids.json expect 1 "element 0 (18446744073709551615) is not a token id" -- \
  "$coli" tokenize --tokenizer "$model" --decode
# Text that is not UTF-8 was replaced with U+FFFD and its ids printed as if the user wrote it,
# without a word (the replacement itself is tiktoken_crosscheck's: as a text decoder reads it).
printf 'caf\xe9 au lait' > "$work/latin1.txt"
STDIN=$work/latin1.txt expect 0 "warning: stdin is not valid UTF-8: byte 0xE9 at offset 3" -- \
  "$coli" tokenize --tokenizer "$model"
grep -q '^\[' "$work/out" || fail "coli tokenize of non-UTF-8 stdin printed no ids"
STDIN=$work/prompt.txt expect 0 "" -- "$coli" tokenize --model "$model"
grep -q '^\[' "$work/out" || fail "coli tokenize --model: no ids"
"$coli" tokenize --tokenizer "$model" < "$work/prompt.txt" > /dev/full 2> "$work/err"
rc=$?
((rc == 1)) && grep -q 'cannot write to stdout' "$work/err" ||
  fail "coli tokenize > /dev/full -> exit $rc, stderr: $(cat "$work/err")"

echo "== a reply cut inside a UTF-8 character ends with U+FFFD"
# The tiny tokenizer's token 160 is the byte 0xE4 alone (the first of a 3-byte character),
# forced by --logit-bias; --ngen cuts the reply after it. The bytes used to be lost: an empty
# reply, one U+FFFD for two tokens (the second 0xE4 ended the first character), nothing in chat.
fffd=$'\xef\xbf\xbd'
for n in 1 2; do
  expect 0 "" -- "$coli" run --model "$model" hi --ngen $n --logit-bias 160=100
  want=$(printf "$fffd%.0s" $(seq $n))
  [[ $(cat "$work/out") == "$want" ]] || fail "coli run --ngen $n on 0xE4: $(od -c "$work/out")"
done
expect 0 "" -- "$coli" run --model "$model" hi --chat --no-think --ngen 1 --logit-bias 160=100
[[ $(cat "$work/out") == "$fffd" ]] || fail "coli run --chat on 0xE4: $(od -c "$work/out")"
# With thinking on the cut character is reasoning, which goes to stderr.
expect 0 "" -- env K3_THINK=1 "$coli" run --model "$model" hi --chat --ngen 1 --logit-bias 160=100
grep -qF "[thinking] $fffd" "$work/err" || fail "coli run --chat (thinking) on 0xE4: $(cat "$work/err")"
[[ $(cat "$work/out") == "" ]] || fail "coli run --chat (thinking): content $(od -c "$work/out")"
printf 'hi\n/save %s\n' "$work/cut.json" > "$work/cut_in.txt"
STDIN=$work/cut_in.txt expect 0 "" -- "$coli" chat --model "$model" --no-think --max-tokens 1 \
  --logit-bias 160=100
python3 - "$work/cut.json" <<'PY' || fail "coli chat: the cut reply was not kept as U+FFFD"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["messages"][-1] == {"role": "assistant", "content": "\ufffd"}, doc["messages"]
PY
grep -qF "$fffd" "$work/out" || fail "coli chat: U+FFFD not shown: $(od -c "$work/out" | tail -5)"

echo "== coli chat without a terminal"
expect 2 "--temperature: 'nan' is not a finite number" -- "$coli" chat --temperature=nan
expect 2 "unexpected argument 'hello'" -- "$coli" chat hello
expect 2 "is a file, not a folder" -- "$coli" chat --model "$work/a_file"
printf '{"a": 1}' > "$work/precious.json"
chmod 600 "$work/precious.json"
cat > "$work/chat_in.txt" <<EOF
bad $(printf '\xff') byte
$(printf 'word %.0s' {1..150})
"""
line one

line three
"""
/save $work/precious.json
EOF
STDIN=$work/chat_in.txt expect 0 "" -- env K3_MAXT=300 "$coli" chat --model "$model" --max-tokens 3
grep -q 'this line is not valid UTF-8: byte 0xFF' "$work/out" ||
  fail "chat: a line that is not UTF-8 was not refused: $(head -c 600 "$work/out")"
grep -q 'that message was not added to the conversation' "$work/out" ||
  fail "chat: the context error did not say the message was dropped"
# After the refused long message the next one is answered (it used to fail the same way).
(($(grep -c 'tok/s' "$work/out") == 1)) || fail "chat: no reply after a context error"
python3 - "$work/precious.json" <<'PY' || fail "chat: /save wrote the wrong conversation"
import json, sys
doc = json.load(open(sys.argv[1]))
users = [m["content"] for m in doc["messages"] if m["role"] == "user"]
assert users == ["line one\n\nline three"], users
PY
[[ $(stat -c %a "$work/precious.json") == 600 ]] || fail "chat: /save changed the file's mode"

# The private host dies (the kernel's OOM killer sends SIGKILL): the error says so instead of
# gRPC's "Socket closed"; coli serve stops (exit 1) instead of answering 5xx forever; coli chat
# keeps the conversation in a file a new chat can /load, and ends.
host_of() {  # the private coli-host of client pid $1, once it runs
  local h=""
  for _ in $(seq 600); do
    h=$(pgrep -P "$1" -f coli-host | head -1)
    [[ -n $h ]] && break
    sleep 0.1
  done
  echo "$h"
}
# Emptied first (as above): CI once killed the host before it was ready ("died by signal 9").
: > "$work/out"
COLI_DECODE_DELAY_MS=20 "$coli" run --model "$model" hello --ngen 2000 > "$work/out" 2> "$work/err" &
pid=$!
for _ in $(seq 600); do [[ -s $work/out ]] && break; sleep 0.1; done
kill -KILL "$(host_of $pid)"
wait "$pid"
rc=$?
((rc == 1)) || fail "coli run whose host was killed -> exit $rc, wanted 1"
grep -q 'host process (coli-host) was killed by signal 9 (SIGKILL): the kernel.s out-of-memory' \
  "$work/err" || fail "coli run whose host was killed: $(tail -c 300 "$work/err")"
no_private_hosts_left "coli run whose host was killed"

: > "$work/out"
"$coli" serve --model "$model" --port 0 > "$work/out" 2> "$work/err" &
pid=$!
for _ in $(seq 600); do grep -q 'listening on' "$work/out" && break; sleep 0.1; done
kill -SEGV "$(host_of $pid)"
for _ in $(seq 600); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
kill -0 "$pid" 2> /dev/null && { fail "coli serve still serving after its host died"; kill "$pid"; }
wait "$pid"
rc=$?
((rc == 1)) || fail "coli serve whose host died -> exit $rc, wanted 1"
grep -q 'was killed by signal 11 (SIGSEGV); stopping' "$work/err" ||
  fail "coli serve whose host died: $(tail -c 300 "$work/err")"
no_private_hosts_left "coli serve whose host died"

# A shard cut under a running coli serve: each request fails naming the shard (the server stays
# up), and /health says so — before, /health answered 200 "ok" while every request failed, so a
# load balancer or supervisor kept sending traffic to a server that could not answer.
echo "== a shard changed under coli serve: /health turns 503"
cp -r "$model" "$work/changing"
: > "$work/out"
K3_EXPERT_GB=0.0001 "$coli" serve --model "$work/changing" --port 0 > "$work/out" 2> "$work/err" &
pid=$!
for _ in $(seq 600); do grep -q 'listening on' "$work/out" && break; sleep 0.1; done
base=$(grep -o 'http://[0-9.:]*' "$work/out" | head -1)
got=$(http GET /health)
[[ $got == "200 "*'"ok"'* ]] || fail "/health before the change: $got"
for f in "$work/changing"/model-*.safetensors; do truncate -s 1000 "$f"; done
got=$(http POST /v1/completions '{"model": "changing", "prompt": "hello", "max_tokens": 4}')
[[ $got == "500 "*"model-"*"truncated"* ]] || fail "a request after the shards were cut: $got"
got=$(http GET /health)
[[ $got == "503 "*"requests fail: "*"truncated"* ]] || fail "/health after a request failed on a cut shard: $got"
kill "$pid"
wait "$pid"
no_private_hosts_left "coli serve on a changed shard"

# coli serve sizes its private host: --workers 1 --queue 1 runs one request and holds one, so
# a third at the same moment gets 429 (before, every coli serve had 4 workers and a queue of
# 16 whatever its load, and a burst of 21 got 429s with no flag to change it).
echo "== coli serve --workers / --queue size the private host"
burst() {  # burst N: N concurrent completions; prints the sorted HTTP statuses
  /usr/bin/python3 - "$base" "$1" << 'PY'
import sys, threading, urllib.request, urllib.error
base, n = sys.argv[1], int(sys.argv[2])
codes = []
def one():
    req = urllib.request.Request(base + "/v1/completions", method="POST",
        data=b'{"model": "k3_tiny", "prompt": "hello", "max_tokens": 60, "temperature": 0}',
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            codes.append(r.status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(" ".join(str(c) for c in sorted(codes)))
PY
}
for sizing in "--workers 1 --queue 1" ""; do
  : > "$work/out"
  # shellcheck disable=SC2086
  COLI_DECODE_DELAY_MS=40 "$coli" serve --model "$model" --port 0 $sizing > "$work/out" 2> "$work/err" &
  pid=$!
  for _ in $(seq 600); do grep -q 'listening on' "$work/out" && break; sleep 0.1; done
  base=$(grep -o 'http://[0-9.:]*' "$work/out" | head -1)
  got=$(burst 3)
  if [[ -n $sizing ]]; then
    [[ $got == "200 200 429" ]] || fail "coli serve $sizing, 3 at once: $got (wanted 200 200 429)"
  else
    [[ $got == "200 200 200" ]] || fail "coli serve (4 workers), 3 at once: $got"
  fi
  kill "$pid"
  wait "$pid"
done
expect 2 "--workers sizes the private coli-host; with --connect" -- \
  timeout 20 "$coli" serve --connect 127.0.0.1:1 --workers 2
expect 2 "--queue: '0' is outside [1, 1000000]" -- timeout 20 "$coli" serve --model "$model" --queue 0
no_private_hosts_left "coli serve --workers"

fifo=$work/chat_fifo
rm -f "$fifo"
mkfifo "$fifo"
COLI_DECODE_DELAY_MS=20 "$coli" chat --model "$model" --max-tokens 2000 < "$fifo" > "$work/out" \
  2> "$work/err" &
pid=$!
exec 7> "$fifo"
echo "remember this message" >&7
for _ in $(seq 600); do grep -q '\[reasoning\]\|assistant' "$work/out" 2> /dev/null && break; sleep 0.1; done
kill -KILL "$(host_of $pid)"
for _ in $(seq 600); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
kill -0 "$pid" 2> /dev/null && { fail "coli chat still running after its host died"; kill -KILL "$pid"; }
wait "$pid"
rc=$?
exec 7>&-
((rc == 1)) || fail "coli chat whose host died -> exit $rc, wanted 1"
saved=$(ls "$HOME"/coli-chat-recovered-*.json 2> /dev/null | head -1)
if [[ -z $saved ]]; then
  fail "coli chat whose host died saved no conversation: $(tail -c 400 "$work/out")"
else
  grep -qF "/load $saved" "$work/out" || fail "coli chat did not say where the conversation is"
  grep -q '"remember this message"' "$saved" || fail "the recovered conversation lacks the message"
  rm -f "$saved"
fi
no_private_hosts_left "coli chat whose host died"

# SIGTERM during a reply ends the chat (exit 143, host folder removed); it used to stop the reply
# and then wait for one more input line (a stdin that stays open: forever). Ctrl-C while the chat
# waits for piped input leaves as a Ctrl-C (130), not as a finished input (0).
fifo=$work/chat_fifo
for case in term-in-reply int-idle; do
  rm -f "$fifo"
  mkfifo "$fifo"
  COLI_DECODE_DELAY_MS=20 env --default-signal=INT "$coli" chat --model "$model" \
    --max-tokens 2000 < "$fifo" > "$work/out" 2> "$work/err" &
  pid=$!
  exec 7> "$fifo"  # held open: the chat never sees the end of its input
  if [[ $case == term-in-reply ]]; then
    echo "tell me a long story" >&7
    for _ in $(seq 600); do grep -q 'coli chat —' "$work/out" 2> /dev/null && break; sleep 0.1; done
    sleep 1  # into the reply (2,000 tokens 20 ms apart); any moment after the line was sent will do
    kill -TERM "$pid"
    want=143
  else
    for _ in $(seq 600); do grep -q 'coli chat —' "$work/out" 2> /dev/null && break; sleep 0.1; done
    sleep 0.5
    kill -INT "$pid"
    want=130
  fi
  # The chat must end by itself; the loop only waits (up to a minute) before failing.
  for _ in $(seq 600); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2> /dev/null; then
    fail "coli chat ($case) still running with its input open"
    kill -KILL "$pid"
  fi
  wait "$pid"
  rc=$?
  exec 7>&-
  ((rc == want)) || fail "coli chat ($case) -> exit $rc, wanted $want"
  no_private_hosts_left "coli chat ($case)"
done

echo "== bench argument handling"
# Every area: --help is help (stdout, exit 0; was exit 2 on stderr), an unknown flag is named.
areas=$("$coli" bench --help | awk '/^areas:/ {on = 1; next} on && NF {print $1}')
[[ -n $areas ]] || fail "coli bench --help lists no areas"
for area in $areas; do
  expect 0 "" -- "$coli" bench "$area" --help
  grep -q "usage: coli bench $area" "$work/out" || fail "coli bench $area --help: usage not on stdout"
  expect 2 "--bogus" -- "$coli" bench "$area" --bogus
done
expect 2 "--min-seconds: 'abc' is not a number" -- \
  "$coli" bench tokenizer --tokenizer "$model" --min-seconds abc
expect 2 "--model needs a value" -- "$coli" bench grpc --model

echo "== k3-run and k3-repack"
# A mistyped folder used to become the prompt while the tiny fixture ran (exit 0).
expect 2 "model folder '$work/nope': no such folder" -- "$bin/k3-run" "$work/nope" --ids 1,2 --ngen 2
expect 2 "--ngen -5" -- "$bin/k3-run" "$model" hi --ngen -5
expect 2 "--temp nan" -- "$bin/k3-run" "$model" hi --temp nan
expect 0 "" -- "$bin/k3-run" "$model" --ids 1,2 --ngen=2 --print-ids
expect 0 "" -- "$bin/k3-repack" --help
grep -q 'usage: k3-repack' "$work/out" || fail "k3-repack --help: usage not on stdout"
expect 1 "source '$work/nope' is not a folder" -- "$bin/k3-repack" "$work/nope" "$work/dst" --bits=8
expect 2 "unknown option -x" -- "$bin/k3-repack" "$model" "$work/dst" -x

echo "== coli serve, coli web and coli-host: flags"
# Each server command is wrapped in `timeout`: before this pass some of these started serving
# (coli web --model "" served the tiny fixture) instead of refusing.
expect 0 "" -- "$coli" serve --help
grep -q 'usage: coli serve' "$work/out" || fail "coli serve --help: usage not on stdout"
expect 0 "" -- "$coli" web --help
grep -q 'usage: coli web' "$work/out" || fail "coli web --help: usage not on stdout"
expect 2 "--model is empty" -- timeout 20 "$coli" web --model ""
expect 2 "--model '$work/a_file' is a file, not a folder" -- timeout 20 "$coli" web --model "$work/a_file"
expect 2 "--model '$work/nope': no such folder" -- timeout 20 "$coli" serve --model="$work/nope"
expect 2 "--model DIR is required" -- timeout 20 "$coli" serve
expect 2 "--port: '99999' is outside [0, 65535]" -- timeout 20 "$coli" serve --model "$model" --port=99999
expect 2 "--port: 'abc' is not a number" -- timeout 20 "$coli" web --port abc
expect 2 "--http-threads: '0' is outside [4, 4096]" -- timeout 20 "$coli" web --http-threads 0
expect 2 "--max-background: '-1' is outside [0, 1024]" -- timeout 20 "$coli" serve --model "$model" --max-background -1
expect 2 "--api-key needs a value" -- timeout 20 "$coli" web --api-key
expect 2 "--api-key needs a value, got the flag '--port'" -- timeout 20 "$coli" web --api-key --port 1
expect 2 "--host is empty" -- timeout 20 "$coli" web --host=
# coli run / chat --host names a coli-host to reach: a port outside 1-65535 or no port is a usage
# error, not "cannot reach coli-host".
expect 2 "--host '127.0.0.1:99999': the port: '99999' is outside [1, 65535]" -- timeout 20 "$coli" run --host 127.0.0.1:99999 hi
expect 2 "--host 'nohost' is not unix:/path or HOST:PORT" -- timeout 20 "$coli" chat --host nohost
expect 2 "--allow-origin 'http://x/' is not an origin" -- timeout 20 "$coli" web --allow-origin http://x/
expect 2 "unknown flag '--bogus'" -- timeout 20 "$coli" web --bogus
expect 2 "unexpected argument 'stray'" -- timeout 20 "$coli" serve --model "$model" stray
host=$bin/coli-host
expect 0 "" -- "$host" --help
grep -q 'usage: coli-host' "$work/out" || fail "coli-host --help: usage not on stdout"
expect 2 "--max-batch: '-1' is outside [1, 1024]" -- timeout 20 "$host" --max-batch -1
expect 2 "--workers: '0' is outside [1, 1024]" -- timeout 20 "$host" --workers=0
expect 2 "--workers: 'abc' is not a number" -- timeout 20 "$host" --workers abc
expect 2 "--listen needs a value" -- timeout 20 "$host" --listen
# gRPC took port 99999 as 34463 (99999 - 65536) and listened there.
expect 2 "--listen '127.0.0.1:99999': the port: '99999' is outside [0, 65535]" -- \
  timeout 20 "$host" --listen 127.0.0.1:99999
expect 2 "--connect '127.0.0.1:99999': the port" -- timeout 20 "$coli" serve --connect 127.0.0.1:99999
expect 2 "--model '$work/a_file' is a file, not a folder" -- timeout 20 "$host" --model "$work/a_file"
expect 2 "--ready-fd 99 is not an open file descriptor" -- timeout 20 "$host" --ready-fd 99
expect 2 "unknown flag '--bogus'" -- timeout 20 "$host" --bogus
# The pooled sessions (one per worker) are always kept: a smaller bound was raised silently.
expect 2 "--max-sessions 8 is below the pooled sessions + 1 = 17" -- \
  timeout 20 "$host" --workers 16 --max-sessions 8 --help
expect 2 "COLI_MAX_SESSIONS 4 is below the pooled sessions + 1 = 5" -- \
  env COLI_MAX_SESSIONS=4 timeout 20 "$host" --help
expect 0 "" -- timeout 20 "$host" --workers 32 --help
# A stale environment value a flag overrides is no error (it was checked before the flags);
# without the flag it still is, named.
expect 0 "" -- env COLI_POOL_SESSIONS=2000 COLI_DECODE_DELAY_MS=70000 "$host" --pool 4 \
  --decode-delay-ms 0 --help
expect 2 "COLI_POOL_SESSIONS: '2000' is outside [0, 1024]" -- \
  env COLI_POOL_SESSIONS=2000 timeout 20 "$host" --help
# A private host that refuses its environment: the client says it exited (it sometimes said
# "did not report READY within 60 s" when the pipe closed before the exit could be reaped).
for _ in 1 2 3; do
  expect 1 "private coli-host '$host' exited with status 2" -- \
    env COLI_DECODE_DELAY_MS=70000 timeout 60 "$coli" run --model "$model" hi --ngen 1
done
# Every flag in its --flag=value form (--workers=2 was "unknown argument"): a host with no
# plugin starts, says READY, and `coli serve --connect=…` reaches it (and finds no model).
mkdir -p "$work/no_plugins"
timeout 60 "$host" --listen="unix:$work/h.sock" --plugin-dir="$work/no_plugins" --workers=2 \
  --queue=4 --pool=0 --max-batch=1 --decode-delay-ms=0 --prefill-delay-ms=0 --ready-fd=3 \
  3> "$work/ready" 2> "$work/host_err" &
host_pid=$!
for _ in $(seq 200); do  # a hang guard, not a timing check
  grep -q READY "$work/ready" 2> /dev/null && break
  kill -0 "$host_pid" 2> /dev/null || break
  sleep 0.1
done
if grep -q READY "$work/ready"; then
  expect 1 "has no model loaded" -- timeout 20 "$coli" serve --connect="unix:$work/h.sock" --port=0
  kill -TERM "$host_pid"
  wait "$host_pid" || fail "coli-host with --flag=value flags: exit $? after SIGTERM, wanted 0"
else
  fail "coli-host with --flag=value flags did not start: $(head -c 400 "$work/host_err")"
  kill -TERM "$host_pid" 2> /dev/null
  wait "$host_pid"
fi

no_private_hosts_left "the whole run"
if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all checks passed"
