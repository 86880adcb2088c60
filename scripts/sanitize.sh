#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, -O1).
# Not part of CI (a second full build does not fit its time on 2 cores); run it before a release
# or after touching kernels, parsers or buffers. Leaks are checked too (LeakSanitizer at each
# process's exit, coli-host and coli children included): a leak report makes the process exit
# non-zero, so the test that ran it fails. scripts/lsan.supp may name only third-party libraries
# that keep allocations until exit (none needed so far: not the Vulkan loader nor lavapipe);
# COLI_LSAN=0 turns leak checking off (docs/status/sanitizers.md). Extra arguments go to ctest
# (e.g. -R Kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
# COLI_ASAN_TARGETS="coli coli-host kimi_k3 k3_tiny_fixture host_test" builds only those (the
# whole build takes hours on a shared 2-core machine); then run the matching tests with -R.
# shellcheck disable=SC2086
cmake --build build-asan -j "${COLI_JOBS:-$(nproc)}" \
  ${COLI_ASAN_TARGETS:+--target $COLI_ASAN_TARGETS}
if [[ "${COLI_LSAN:-1}" == 0 ]]; then leaks=detect_leaks=0; else leaks=detect_leaks=1; fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-$leaks}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir build-asan --output-on-failure -j "${COLI_TEST_JOBS:-2}" --timeout 900 "$@"
