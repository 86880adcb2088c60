#!/usr/bin/env bash
# Fuzzes the safetensors header and index parsers, the JSON-schema compiler / matcher of
# constrained decoding (schemas come from API clients) and Kimi K3's chat renderer and output
# parser with libFuzzer (Debian's clang-14).
#
#   scripts/fuzz.sh 60        # CI smoke run: 60 s split between the targets
#   scripts/fuzz.sh 3600      # a long run: one hour in all
#
# Builds into build-fuzz/ (separately from the gcc build; no CMake, no gRPC), starts from the
# committed seeds in tests/fuzz/corpus/<target>/ plus what earlier runs found (kept in
# build-fuzz/corpus/), and exits non-zero when a target crashes or a sanitizer reports; the
# failing input is left in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
cxx="${COLI_FUZZ_CXX:-clang++-14}"
out=build-fuzz
targets=(safetensors_header_fuzz safetensors_index_fuzz json_schema_fuzz k3_chat_fuzz)
# The library sources the targets need: the parsers, the Writer (round-trip check) and what
# they call. Abseil comes from Debian's shared libraries.
sources=(common/status/status.cc common/log/log.cc common/io/io.cc common/memory/huge_pages.cc
         common/json/json.cc common/safetensors/format.cc common/safetensors/writer.cc
         common/grammar/json_constraint.cc common/grammar/machine.cc common/grammar/regex.cc
         common/grammar/schema_compiler.cc common/grammar/token_filter.cc
         common/tokenizer/tokenizer.cc common/tokenizer/loaders.cc common/tokenizer/pretokenizer.cc
         common/tokenizer/utf8.cc plugins/kimi_k3/chat.cc plugins/kimi_k3/chat_json.cc
         plugins/kimi_k3/chat_parser.cc)

command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (apt-get install clang-14)" >&2; exit 1; }
mkdir -p "$out/obj" "$out/artifacts"
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -I. -fsanitize=address,undefined
       -fno-sanitize-recover=undefined)
read -r -a absl_libs <<<"$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format absl_flat_hash_map libpcre2-8)"

objects=()
for src in "${sources[@]}" "${targets[@]/#/tests/fuzz/}"; do
  src="${src%.cc}.cc"
  obj="$out/obj/$(echo "${src%.cc}" | tr / _).o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find common/status common/log common/memory common/io common/json common/safetensors common/grammar common/tokenizer plugins/kimi_k3 tests/fuzz -name '*.h' -newer "$obj" -print -quit)" ]; then
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  case "$src" in tests/fuzz/*) ;; *) objects+=("$obj") ;; esac
done
for t in "${targets[@]}"; do
  "$cxx" "${flags[@]}" -fsanitize=fuzzer "$out/obj/tests_fuzz_$t.o" "${objects[@]}" \
    "${absl_libs[@]}" -lpthread -o "$out/$t"
done

per=$(( seconds / ${#targets[@]} ))
[ "$per" -ge 1 ] || per=1
status=0
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t"
  echo "fuzz.sh: $t for ${per}s" >&2
  dict=tests/fuzz/safetensors.dict
  case "$t" in json_schema_fuzz | k3_chat_fuzz) dict=tests/fuzz/json_schema.dict ;; esac
  if ! "$out/$t" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -print_final_stats=1 -dict="$dict" \
      -artifact_prefix="$out/artifacts/$t-" "$out/corpus/$t" "tests/fuzz/corpus/$t"; then
    echo "fuzz.sh: $t FAILED; reproduce with: $out/$t $out/artifacts/$t-*" >&2
    status=1
  fi
done
exit "$status"
