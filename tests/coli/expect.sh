# Sourced by the shell suites here (cli_blackbox.sh, env_switches.sh): fail and expect, writing
# CMD's output to "$work/out" / "$work/err" (the caller sets `work`).
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
