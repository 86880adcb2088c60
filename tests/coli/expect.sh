# Sourced by the shell suites (cli_blackbox.sh, env_switches.sh, tests/kimi_k3/checksum_cli.sh):
# fail and expect, writing CMD's output to "$work/out" / "$work/err" (the caller sets `work`),
# and http for a coli serve at "$base" (the caller sets `base`).
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect RC NEEDLE -- CMD...: runs CMD (stdin from /dev/null, or the file STDIN names), checks its
# exit code and that stderr contains NEEDLE (a fixed string; "" = any).
expect() {
  local want_rc=$1 needle=$2
  shift 3
  "$@" > "$work/out" 2> "$work/err" < "${STDIN:-/dev/null}"
  local rc=$?
  if [[ $rc != "$want_rc" ]]; then
    fail "$* -> exit $rc, wanted $want_rc; stderr: $(tail -c 400 "$work/err")"
  elif [[ -n $needle ]] && ! grep -qF -- "$needle" "$work/err"; then
    fail "$* -> stderr lacks '$needle': $(tail -c 400 "$work/err")"
  fi
}

# http METHOD PATH [JSON]: prints "STATUS BODY" of a request to the server at "$base".
http() {
  /usr/bin/python3 - "$base" "$@" << 'PY'
import sys, urllib.request, urllib.error
base, method, path = sys.argv[1:4]
body = sys.argv[4].encode() if len(sys.argv) > 4 else None
req = urllib.request.Request(base + path, data=body, method=method,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}
