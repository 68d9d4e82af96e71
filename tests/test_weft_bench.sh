#!/bin/sh
# test_weft_bench.sh WEFTRUN WEFT_BENCH - weft-bench from the outside: an
# unknown collective is refused (never run as another).
# Every run is bounded by weftrun's --timeout.
set -u
WEFTRUN=${1:?usage: sh tests/test_weft_bench.sh WEFTRUN WEFT_BENCH}
BENCH=${2:?usage: sh tests/test_weft_bench.sh WEFTRUN WEFT_BENCH}
unset WEFT_RENDEZVOUS
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0

pass() { echo "ok - $1"; }
# fail NAME: with what the ranks said, which is what one needs to debug it
fail() {
  echo "not ok - $1 (exit $rc)"
  sed 's/^/#   stdout: /' "$TMP/out" | head -40
  sed 's/^/#   stderr: /' "$TMP/err" | head -20
  failures=$((failures + 1))
}
check() { # NAME CONDITION...: the condition is a command; its success is the check
  name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}
# bench NP ARGS...: weft-bench under weftrun; $rc, output in out/err
bench() {
  np=$1
  shift
  WEFT_TIMEOUT=30 "$WEFTRUN" -n "$np" --timeout 120 "$BENCH" "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
}

# ---- an unknown collective is refused, never run as another ----
refused() { # the run failed and said why, and no row of a table came out
  [ "$rc" != 0 ] && grep -q "unknown collective 'bogus'" "$TMP/err" &&
    ! grep -q '^\[[ 0-9]*\]  *[0-9]' "$TMP/out"
}
bench 2 --peers -c bogus -b 8 -e 64 -n 2 -m 1
check "--peers -c bogus is refused" refused
bench 2 -C bogus -b 8 -e 64 -n 2 -w 1
check "-C bogus is refused" refused

[ "$failures" = 0 ] || { echo "$failures failed"; exit 1; }
