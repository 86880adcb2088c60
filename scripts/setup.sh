#!/usr/bin/env bash
# One idempotent set-up: installs the Debian packages coli needs, the npm packages the tests and
# the web page use, configures and builds. With --run it then runs the main job (`coli run` on
# the model in COLI_MODEL, or on the embedded tiny Kimi K3 fixture when none is given).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
run_main=0
for arg in "$@"; do
  case "$arg" in
    --run) run_main=1 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

# 1. Debian packages (only what is missing; apt-get needs root).
mapfile -t wanted < <(grep -v '^\s*#' scripts/debian-packages.txt | grep -v '^\s*$')
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"; then
    echo "setup: apt-get could not install: ${missing[*]}" >&2
    exit 1
  fi
fi

# 2. npm packages (lock files committed; `npm ci` installs exactly those versions).
for dir in $(find . -name package-lock.json -not -path '*/node_modules/*' -exec dirname {} \; | sort); do
  if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

# 3. Configure and build.
jobs=${COLI_JOBS:-$(nproc)}
werror=OFF; [ -n "${CI:-}" ] && werror=ON
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOLI_WERROR=$werror >/dev/null
cmake --build build -j "$jobs"

# 4. The main job.
if ((run_main)); then
  "$root/build/bin/coli" run ${COLI_MODEL:+--model "$COLI_MODEL"} "${COLI_PROMPT:-Hello from coli}" --ngen "${COLI_NGEN:-16}"
fi
