#!/usr/bin/env bash
# K3_VERIFY from outside (docs/status/repack.md "Checksums checked at load"): the tiny fixture
# repacked, one byte flipped in a dense tensor, then in every expert of one layer. `coli run`,
# `k3-run`, `coli-host --model` and `coli serve` must name the damage (never answer), K3_VERIFY=0
# must reach the model through each of them (it loads), and a bad value is refused by name.
# Usage: checksum_cli.sh BIN_DIR SOURCE_MODEL_DIR
set -uo pipefail
bin=$1 source_model=$2
coli=$bin/coli host=$bin/coli-host
work=$(mktemp -d)
export TMPDIR=$work/tmp HOME=$work/home
mkdir -p "$TMPDIR" "$HOME"
for v in $(env | grep -oE '^(K3|COLI)_[A-Z0-9_]+'); do unset "$v"; done
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../coli/expect.sh"

# flip DIR TENSOR...: flips one bit in the middle of each tensor, in place.
flip() {
  /usr/bin/python3 - "$@" << 'PY'
import json, struct, sys
folder, names = sys.argv[1], sys.argv[2:]
index = json.load(open(folder + "/model.safetensors.index.json"))["weight_map"]
for name in names:
    path = folder + "/" + index[name]
    data = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", data[:8])[0]
    begin, end = json.loads(data[8:8 + n])[name]["data_offsets"]
    data[8 + n + (begin + end) // 2] ^= 0x10
    open(path, "wb").write(data)
PY
}

"$bin/k3-repack" "$source_model" "$work/good" --bits 8 > /dev/null 2>&1 || fail "k3-repack failed"
good_ids=$(timeout 60 "$coli" run --model "$work/good" "Hello from coli" --ngen 6 --print-ids 2> /dev/null |
  grep -E '^[0-9,]+$')
source_ids=$(K3_BITS=8 timeout 60 "$coli" run --model "$source_model" "Hello from coli" --ngen 6 \
  --print-ids 2> /dev/null | grep -E '^[0-9,]+$')
[[ -n $good_ids && $good_ids == "$source_ids" ]] ||
  fail "the int8 container's ids '$good_ids' differ from the source's at K3_BITS=8 '$source_ids'"

echo "== a flipped byte in a dense tensor fails the load, naming it"
cp -r "$work/good" "$work/dense"
flip "$work/dense" language_model.model.layers.1.self_attn.q_proj.weight
needle="tensor 'language_model.model.layers.1.self_attn.q_proj.weight' (8192 bytes at offset"
expect 1 "$needle" -- timeout 60 "$coli" run --model "$work/dense" hi --ngen 1
expect 1 "its bytes changed after they were written" -- \
  env K3_MMAP=1 K3_VERIFY=1 timeout 60 "$coli" run --model "$work/dense" hi --ngen 1
# K3_MMAP with K3_VERIFY unset keeps its fast start: the mapped matrices are not read at load
# (the damage stays unseen until k3-repack --check or K3_VERIFY=1; routed experts are still
# checked on their first read).
expect 0 "" -- env K3_MMAP=1 timeout 60 "$coli" run --model "$work/dense" hi --ngen 1
expect 0 "" -- env K3_MMAP=1 timeout 60 "$bin/k3-run" "$work/dense" hi --ngen 1
expect 1 "its bytes changed after they were written" -- \
  env K3_MMAP=1 K3_VERIFY=1 timeout 60 "$bin/k3-run" "$work/dense" hi --ngen 1
expect 1 "$needle" -- timeout 60 "$bin/k3-run" "$work/dense" hi --ngen 1
expect 1 "$needle" -- timeout 60 "$host" --listen "unix:$work/h.sock" --model "$work/dense"
expect 1 "$needle" -- timeout 60 "$coli" serve --model "$work/dense" --port 0
expect 1 "has CRC-32" -- "$bin/k3-repack" --check "$work/dense"

echo "== K3_VERIFY=0 reaches the model through each front end (the damaged folder loads)"
expect 0 "" -- env K3_VERIFY=0 timeout 60 "$coli" run --model "$work/dense" hi --ngen 1
expect 0 "" -- env K3_VERIFY=0 timeout 60 "$bin/k3-run" "$work/dense" hi --ngen 1
# coli-host loads its --model before it listens: a ready line means the load passed.
K3_VERIFY=0 "$host" --listen "unix:$work/h.sock" --model "$work/dense" > "$work/host.out" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "listening" "$work/host.out" && break; sleep 0.1; done
grep -q "listening" "$work/host.out" ||
  fail "K3_VERIFY=0 coli-host --model did not load: $(tail -c 300 "$work/host.out")"
kill "$pid" 2> /dev/null
wait "$pid" 2> /dev/null
expect 1 "option verify (K3_VERIFY) = '2' is not 0 or 1" -- \
  env K3_VERIFY=2 timeout 60 "$coli" run --model "$work/good" hi --ngen 1
expect 1 "K3_VERIFY='yes': expected 0 or 1" -- \
  env K3_VERIFY=yes timeout 60 "$bin/k3-run" "$work/good" hi --ngen 1

echo "== flipped expert bytes fail each request that needs them; /health turns 503"
cp -r "$work/good" "$work/experts"
names=()
for e in $(seq 0 15); do
  names+=("language_model.model.layers.2.block_sparse_moe.experts.$e.w1.weight_scale")
done
flip "$work/experts" "${names[@]}"
expect 1 "w1.weight_scale' (192 bytes at offset" -- \
  timeout 60 "$coli" run --model "$work/experts" "Hello from coli" --ngen 2
"$coli" serve --model "$work/experts" --port 0 > "$work/out" 2> "$work/err" &
pid=$!
for _ in $(seq 600); do grep -q 'listening on' "$work/out" && break; sleep 0.1; done
base=$(grep -o 'http://[0-9.:]*' "$work/out" | head -1)
got=$(http GET /health)
[[ $got == "200 "*'"ok"'* ]] || fail "/health before any request: $got"
got=$(http POST /v1/completions '{"model": "experts", "prompt": "Hello from coli", "max_tokens": 4}')
[[ $got == "500 "*"w1.weight_scale"*"has CRC-32"* ]] || fail "a request meeting a damaged expert: $got"
got=$(http GET /health)
[[ $got == "503 "*"requests fail: "*"has CRC-32"* ]] || fail "/health after it: $got"
kill "$pid"
wait "$pid"

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
