#!/bin/sh
# suite_repeat.sh - runs a built tree's suite N times in a row, as tools/test.sh
# runs each pass (suite "sleeps" three at a time, then the rest one at a time),
# to find tests that fail by chance (issue 49). One line per run in SUMMARY
# (default /tmp/weft-repeat/summary.txt): its seconds, the counts and every
# test that failed; each run's meson output beside it. The pip test is left
# out (a build of its own each time, 2-3 minutes, nothing timed in it).
#
#   sh tools/suite_repeat.sh DIR N [--sanitize] [MESON-TEST-ARGS...]
#
# --sanitize: the environment tools/test.sh gives its sanitizer pass
# (ASAN_OPTIONS, UBSAN_OPTIONS, WEFT_TEST_QUICK=1) and --no-suite heavy.
# Run it on a quiet machine: a build beside it makes timing tests fail that
# CI never sees. The tree must be built (meson test runs with --no-rebuild).
set -u
[ $# -ge 2 ] || { sed -n '9,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$1 n=$2
shift 2
if [ "${1:-}" = --sanitize ]; then
  shift
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export WEFT_TEST_QUICK=1
  set -- --no-suite heavy "$@"
fi
out=${WEFT_REPEAT_OUT:-/tmp/weft-repeat}
summary=$out/summary.txt
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
for i in $(seq "$n"); do
  t0=$(date +%s)
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 3 --suite sleeps \
    --logbase "sleeps$i" "$@" >"$out/sleeps$i.txt" 2>&1
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 1 --no-suite sleeps \
    --no-suite pip --logbase "rest$i" "$@" >"$out/rest$i.txt" 2>&1
  t1=$(date +%s)
  fails=$(grep -h -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)' "$out/sleeps$i.txt" "$out/rest$i.txt" |
    sed 's/  */ /g')
  oks=$(grep -h '^Ok:' "$out/sleeps$i.txt" "$out/rest$i.txt" | tr -s ' ' | tr '\n' ' ')
  echo "$dir run $i: $((t1 - t0)) s; $oks fails: ${fails:-none}" | tee -a "$summary"
done
