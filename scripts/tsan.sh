#!/usr/bin/env bash
# The concurrent parts under ThreadSanitizer (build-tsan/, -O1 -g1): the host's workers and
# batching, gRPC streams, cancellation and client disconnects, the gateway's Responses
# background jobs, the expert store's loader threads, the prefix cache and checkpoints, mixed
# prefill, speculative decoding and the Vulkan tier's uploader (lavapipe). Not part of CI (a
# second full build does not fit its time on 2 cores); run it after touching threads or locks.
# Suppressions: scripts/tsan.supp (libraries Debian does not build for TSan: gRPC, Abseil,
# cpp-httplib; each entry says why). OpenMP runs one thread (OMP_NUM_THREADS=1, COLI_THREADS=1):
# libgomp's own synchronisation is invisible to TSan. Any report fails the test that made it
# (halt_on_error=0 + exitcode=66: every report of a run is printed). n > 1 choices and spare
# sessions (choices*_host_test), kimi_k3's session copy / reset and prompt-logprob memos are in the
# default set; ops_test's OpenMP-team tests are not (libgomp's barrier is invisible: every kernel
# write a team thread made is reported against the caller's later read, and they run ~10 min).
# Hang guards of a few tests (60 s for a long prefill) can run out under TSan on a loaded machine:
# that is no report.
#
#   scripts/tsan.sh                 # build the suites' binaries, run the default set
#   scripts/tsan.sh -R HostBatched  # extra arguments go to ctest (a -R replaces the default set)
#   COLI_TSAN_DIR=build-ts scripts/tsan.sh   # another build folder
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${COLI_TSAN_DIR:-build-tsan}"
flags="-fsanitize=thread -g1"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=thread \
  >/dev/null
# The binaries of the default set (plus coli-host / coli and the plugin, which they start).
targets=(coli coli-host kimi_k3 k3_tiny_fixture batched_host_test host_test client_test
  write_starter_test serve_connection_test serve_responses_test expert_store_test
  expert_store_model_test k3_host_test k3_prefix_cache_test k3_prefix_cache_host_test
  k3_checkpoints_test k3_mixed_prefill_test k3_mixed_prefill_session_test
  k3_batched_decode_test k3_batched_decode_session_test k3_spec_plugin_test k3_vk_tier_test
  k3_vk_tier_plugin_test k3_vk_dense_test choices_host_test choices_stress_host_test
  k3_prompt_logprob_memo_test k3_prompt_logprobs_plugin_test k3_plugin_stats_test
  openmp_policy_test ops_test)
cmake --build "$dir" -j "${COLI_JOBS:-$(nproc)}" --target "${targets[@]}"
default_set='^(HostBatchedTest|HostTest|HostServer|Client|WriteStarter|ConnectionMonitor|'
default_set+='ConnectionWatch|BackgroundJobs|ResponseStore|ResponseEventLog|ExpertStoreTest|'
default_set+='ExpertStoreModelTest|K3HostTest|PrefixCache.*|K3PrefixCacheHostTest|Checkpoint.*|'
default_set+='K3MixedPrefill|MixedPrefillTest|K3BatchedStep|BatchedDecodeTest|K3SpecPluginTest|'
default_set+='K3VkTier.*|K3VkDenseTest|HostChoicesTest|HostChoicesStressTest|PromptLogprobMemos|'
default_set+='K3PluginStatsTest|K3PromptLogprobsTest|OpenMpPolicy)\.|^Ops\.ParallelTeam'
args=("$@")
if [[ " ${args[*]-} " != *" -R "* ]]; then args=(-R "$default_set" "${args[@]}"); fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" COLI_THREADS="${COLI_THREADS:-1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0:exitcode=66:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}"
ctest --test-dir "$dir" --output-on-failure -j "${COLI_TEST_JOBS:-2}" --timeout 900 "${args[@]}"
