#!/usr/bin/env bash
# The whole test suite: every GoogleTest suite, the numpy-reference model checks, and the
# real-client tests (tiktoken, openai SDK, Chromium, tmux) that ctest runs as labelled tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d build ] || { echo "test.sh: no build/ — run scripts/setup.sh first" >&2; exit 1; }
cmake --build build -j "${COLI_JOBS:-$(nproc)}"
ctest --test-dir build --output-on-failure -j "${COLI_TEST_JOBS:-2}" --timeout 900 "$@"
