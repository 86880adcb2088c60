#!/usr/bin/env bash
# The environment switches (README.md "Environment", the seed's K3_* table) driven from outside
# through `coli run`, `coli chat` and `coli-host`, on the tiny fixture: a value the engine cannot
# use is refused naming the variable and the value (exit 2, before anything loads), the
# switches that must not change the answer do not, and coli-host's --model loads honour them.
# Every refusal here was accepted without a word before docs/status/env-switches.md.
# Usage: env_switches.sh BIN_DIR MODEL_DIR
set -uo pipefail
bin=$1 model=$2
coli=$bin/coli host=$bin/coli-host
work=$(mktemp -d)
export TMPDIR=$work/tmp HOME=$work/home
mkdir -p "$TMPDIR" "$HOME"
# Only the switch under test may be set.
for v in $(env | grep -oE '^(K3|COLI)_[A-Z0-9_]+'); do unset "$v"; done
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/expect.sh"
run() { timeout 60 "$coli" run --model "$model" "Hello from coli" --ngen 6 --print-ids; }

echo "== coli run: unusable values are refused by name"
# Each was taken as "unset" (the default) or passed on without a word: K3_CHUNK=0 ran with 32,
# K3_BITS=0 with 4, K3_LOAD_THREADS=-3 with 4, K3_TOPP=nan with no cut, K3_MLA_NORM_EPS=0 with
# 1e-6, COLI_THREADS=100000 as asked; K3_LOAD_THREADS=32 loaded every tensor, then failed.
while IFS='|' read -r assignment needle; do
  expect 2 "$needle" -- env "$assignment" timeout 60 "$coli" run --model "$model" hi --ngen 1
done << 'EOF'
K3_BITS=0|environment variable K3_BITS='0': expected 4, 8 or 32
K3_MLA_BITS=5|environment variable K3_MLA_BITS='5': expected 4, 8 or 32
K3_HEAD_BITS=8GB|K3_HEAD_BITS: '8GB' is not a number
K3_CHUNK=0|environment variable K3_CHUNK: '0' is outside [1, 512]
K3_CHUNK=-1|K3_CHUNK: '-1' is outside [1, 512]
K3_LOAD_THREADS=0|K3_LOAD_THREADS: '0' is outside [1, 16]
K3_LOAD_THREADS=32|K3_LOAD_THREADS: '32' is outside [1, 16]
K3_LAYERS=-2|K3_LAYERS: '-2' is outside [0,
K3_TOPP=nan|K3_TOPP: 'nan' is not a finite number
K3_TOPP=1.5|K3_TOPP: '1.5' is outside [0, 1]
K3_EXPERT_GB=-1|K3_EXPERT_GB: '-1' is outside [0,
K3_EXPERT_GB=nan|K3_EXPERT_GB: 'nan' is not a finite number
K3_EXPERT_GB=8GB|K3_EXPERT_GB: '8GB' is not a number
K3_MLA_NORM_EPS=0|K3_MLA_NORM_EPS='0': expected a positive epsilon
K3_MLA_NORM_EPS=inf|K3_MLA_NORM_EPS: 'inf' is not a finite number
K3_MAXT=0|K3_MAXT: '0' is outside [1,
COLI_THREADS=-1|COLI_THREADS: '-1' is outside [0, 1024]
COLI_THREADS=100000|COLI_THREADS: '100000' is outside [0, 1024]
K3_PIPE=yes|K3_PIPE='yes': expected 0 or 1
EOF
# coli serve started its private host first, then exited 1.
expect 2 "environment variable K3_CHUNK: '0' is outside [1, 512]" -- \
  env K3_CHUNK=0 timeout 60 "$coli" serve --model "$model" --port 0
# K3_THINK=false opened the think channel (anything but "0" did).
expect 2 "K3_THINK='false'" -- env K3_THINK=false timeout 60 "$coli" run --model "$model" --chat hi --ngen 1
expect 2 "K3_THINK='no'" -- env K3_THINK=no timeout 60 "$coli" chat --model "$model"

echo "== coli run: switches that must not change the tokens"
base=$(run 2> /dev/null | grep -E '^[0-9,]+$')
[[ -n $base ]] || fail "coli run --print-ids printed no ids"
for assignment in K3_PIPE=0 K3_DIRECT=0 K3_LOAD_THREADS=1 K3_LOAD_THREADS=16 K3_CHUNK=1 \
  K3_CHUNK=5 K3_EXPERT_GB=0 COLI_ISA=scalar COLI_THREADS=1 K3_THINK=0 COLI_HUGEPAGES=0 \
  COLI_ROW_STREAMS=1 COLI_ROW_STREAMS=2 COLI_ROW_STREAMS=4; do
  ids=$(env "$assignment" timeout 60 "$coli" run --model "$model" "Hello from coli" --ngen 6 \
    --print-ids 2> "$work/err" | grep -E '^[0-9,]+$')
  [[ $ids == "$base" ]] || fail "$assignment: ids '$ids', wanted '$base': $(tail -c 300 "$work/err")"
done

echo "== coli-host: process-wide switches are checked at start"
# They were ignored (COLI_LOG_LEVEL, COLI_HUGEPAGES: any value but "0" meant on) or only warned
# about in a log line (COLI_ISA).
expect 2 "environment variable COLI_LOG_LEVEL='bogus': expected debug" -- \
  env COLI_LOG_LEVEL=bogus timeout 20 "$host" --help
expect 2 "environment variable COLI_HUGEPAGES='no': expected 0, 1" -- \
  env COLI_HUGEPAGES=no timeout 20 "$host" --help
expect 2 "environment variable COLI_ISA='AVX2': expected scalar" -- \
  env COLI_ISA=AVX2 timeout 20 "$host" --help
expect 2 "environment variable COLI_ROW_STREAMS='3': expected 1, 2, 4" -- \
  env COLI_ROW_STREAMS=3 timeout 20 "$host" --help
expect 0 "" -- env COLI_LOG_LEVEL=warning COLI_HUGEPAGES=1 COLI_ISA=avx2 COLI_ROW_STREAMS=2 \
  "$host" --help
# Through a private host: the client says it exited, the host said why.
expect 1 "COLI_LOG_LEVEL='bogus'" -- env COLI_LOG_LEVEL=bogus timeout 60 "$coli" run --model "$model" hi --ngen 1

echo "== coli-host --model: the model switches of the environment apply"
# coli-host loaded --model folders with the plugin's defaults whatever the environment said:
# K3_BITS=5 served (now: exit 2 naming it), K3_EXPERT_GB=0 gave 16 slots per layer.
expect 2 "environment variable K3_BITS='5': expected 4, 8 or 32" -- \
  env K3_BITS=5 timeout 20 "$host" --listen "unix:$work/bad.sock" --model "$model"
COLI_LOG_LEVEL=info K3_EXPERT_GB=0 timeout 60 "$host" --listen "unix:$work/h.sock" \
  --model "$model" --ready-fd 3 3> "$work/ready" 2> "$work/host_err" &
host_pid=$!
for _ in $(seq 300); do  # a hang guard, not a timing check
  grep -q READY "$work/ready" 2> /dev/null && break
  kill -0 "$host_pid" 2> /dev/null || break
  sleep 0.1
done
grep -q READY "$work/ready" || fail "coli-host --model did not start: $(tail -c 400 "$work/host_err")"
kill -TERM "$host_pid" 2> /dev/null
wait "$host_pid"
grep -q " 1 slots/layer" "$work/host_err" ||
  fail "K3_EXPERT_GB=0 coli-host --model: not 1 expert slot per layer: $(grep 'expert store' "$work/host_err")"

echo "== the switch tables come from the plugins (ABI 1.8): coli-host --switches, coli switches"
# The host held kimi_k3's table itself; now the plugin declares it and both list it.
expect 0 "" -- timeout 20 "$host" --switches
grep -q "^K3_CHUNK  *1…512  *kimi_k3: chunk" "$work/out" ||
  fail "coli-host --switches does not list K3_CHUNK: $(head -c 400 "$work/out")"
grep -q "^COLI_THREADS .*coli-host: threads" "$work/out" ||
  fail "coli-host --switches does not list COLI_THREADS: $(head -c 400 "$work/out")"
expect 0 "" -- env K3_CHUNK=5 timeout 60 "$coli" switches
grep -q "^K3_VK  *0 or 1  *kimi_k3: extra\[vk\]" "$work/out" ||
  fail "coli switches does not list K3_VK: $(head -c 400 "$work/out")"
grep -q "^  K3_CHUNK=5$" "$work/out" || fail "coli switches does not show K3_CHUNK=5 as set"
expect 2 "environment variable K3_CHUNK: '0' is outside [1, 512]" -- \
  env K3_CHUNK=0 timeout 60 "$coli" switches

echo "== COLI_PLUGIN_DIR and k3-run's K3_X0: the variable is named"
# The private host said "--plugin-dir '/…': no such folder", a flag the user never typed.
expect 1 "COLI_PLUGIN_DIR '$work/nowhere': no such folder" -- \
  env COLI_PLUGIN_DIR="$work/nowhere" timeout 60 "$coli" run --model "$model" hi --ngen 1
# k3-run read the file after the whole load; a folder read as "prefill needs at least one
# token", a short file as "x6: size is not a multiple of 4".
printf 'abcdef' > "$work/x6"
printf 'abcdefghijkl' > "$work/x12"
: > "$work/x_empty"
expect 1 "K3_X0 '$work': is a folder" -- env K3_X0="$work" "$bin/k3-run" "$model" --ngen 1
expect 1 "K3_X0 '$work/x_empty': empty" -- env K3_X0="$work/x_empty" "$bin/k3-run" "$model" --ngen 1
expect 1 "K3_X0 '$work/x6': 6 bytes is not a whole number of f32 values" -- \
  env K3_X0="$work/x6" "$bin/k3-run" "$model" --ngen 1
expect 1 "K3_X0 '$work/x12': 3 floats is not a whole number of rows of the hidden size" -- \
  env K3_X0="$work/x12" "$bin/k3-run" "$model" --ngen 1

# k3-run read its 0/1 switches as numbers: K3_IDOT=2 and K3_MMAP=5 meant on, K3_IDOT=yes failed
# as "expected an integer".
expect 1 "K3_IDOT='2': expected 0 or 1" -- env K3_IDOT=2 "$bin/k3-run" "$model" --ngen 1
expect 1 "K3_MMAP='5': expected 0 or 1" -- env K3_MMAP=5 "$bin/k3-run" "$model" --ngen 1
expect 1 "K3_MAXT='-5': expected a context" -- env K3_MAXT=-5 "$bin/k3-run" "$model" --ngen 1

echo "== K3_THINK: kimi_k3's chat-request default (plugin ABI 1.10), not a name the client knows"
# The client read K3_THINK by name; now the family declares it (request[enable_thinking]) and
# coli run --chat, coli chat and coli serve put it into chat requests that do not set the field.
prompt_tokens() {  # ASSIGNMENT [FLAG...]
  local assignment=$1
  shift
  env "$assignment" timeout 60 "$coli" run --model "$model" --chat hi --ngen 1 --temperature 0 \
    "$@" 2>&1 > /dev/null | grep -oE '[0-9]+ prompt tokens' | grep -oE '^[0-9]+'
}
think=$(prompt_tokens K3_THINK=1)
answer=$(prompt_tokens K3_THINK=0)
unset_think=$(prompt_tokens COLI_UNUSED=1)
no_think=$(prompt_tokens K3_THINK=1 --no-think)
[[ -n $think && -n $answer && $think != "$answer" ]] ||
  fail "K3_THINK=1 / 0 rendered $think / $answer prompt tokens, wanted two different counts"
[[ $unset_think == "$think" ]] || fail "K3_THINK unset: $unset_think prompt tokens, wanted $think"
[[ $no_think == "$answer" ]] || fail "--no-think beside K3_THINK=1: $no_think, wanted $answer"
env K3_THINK=0 "$coli" serve --model "$model" --port 0 > "$work/serve.out" 2> "$work/serve.err" &
serve_pid=$!
for _ in $(seq 600); do grep -q 'listening on' "$work/serve.out" && break; sleep 0.1; done
base=$(grep -oE 'http://[^ ]+' "$work/serve.out" | head -1)
template_tokens() {
  http POST /apply-template "$1" | /usr/bin/python3 -c \
    'import sys, json; s, b = sys.stdin.read().split(" ", 1); print(s, len(json.loads(b)["tokens"]))'
}
hi='"messages": [{"role": "user", "content": "hi"}]'
served=$(template_tokens "{$hi}")
[[ $served == "200 $answer" ]] || fail "coli serve with K3_THINK=0: '$served', wanted '200 $answer'"
served=$(template_tokens "{$hi, \"enable_thinking\": true}")
[[ $served == "200 $think" ]] || fail "a request's own enable_thinking: '$served', wanted '200 $think'"
kill "$serve_pid" 2> /dev/null
wait "$serve_pid" 2> /dev/null

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all checks passed"
