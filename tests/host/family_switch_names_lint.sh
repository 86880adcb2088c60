#!/usr/bin/env bash
# Lint: the host and the tools hold no model family's environment-switch names. Each family
# declares its own (plugin ABI 1.8; plugins/<family>/switches.cc) and host/model_options_env.h
# reads them generically, so a quoted name such as "K3_CHUNK" in host/ or tools/ sources means a
# family's table is growing back into the host. The names come from `coli-host --switches` on
# the build's plugins (every family's, not the host's own COLI_THREADS).
# Usage: family_switch_names_lint.sh COLI_HOST PLUGIN_DIR SOURCE_DIR
set -uo pipefail
host=$1 plugins=$2 src=$3
listing=$("$host" --switches --plugin-dir "$plugins" 2> /dev/null) || {
  echo "FAIL: coli-host --switches exited $?" >&2
  exit 1
}
names=$(sed 1d <<< "$listing" | grep -v '  coli-host: ' | awk '{print $1}')
count=$(wc -w <<< "$names")
if ((count < 10)); then
  echo "FAIL: coli-host --switches listed $count family switches (the kimi_k3 plugin declares 39)" >&2
  exit 1
fi
failures=0
for name in $names; do
  hits=$(grep -rn --include='*.cc' --include='*.h' --include='*.c' -F "\"$name\"" \
    "$src/host" "$src/tools" 2> /dev/null)
  if [[ -n $hits ]]; then
    echo "FAIL: family switch $name is named in host/ or tools/ (declare it in the family's table):" >&2
    echo "$hits" >&2
    failures=$((failures + 1))
  fi
done
((failures == 0)) || exit 1
echo "ok: none of $count family switch names appears quoted in host/ or tools/"
