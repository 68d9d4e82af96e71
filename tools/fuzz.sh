#!/bin/sh
# fuzz.sh [SECONDS | build] - builds the libFuzzer targets (tests/fuzz, clang
# needed) in build-fuzz and runs each for SECONDS (default 20) from the
# committed seed corpus (tests/fuzz/corpus/<target>), as many at once as
# there are CPUs (WEFT_FUZZ_JOBS); new inputs go to a scratch folder, not
# into the repository. A crash leaves its input in build-fuzz/fuzz-crashes/
# and makes this script fail. "build" only builds (test.sh builds ahead).
# Exits 77 when clang or libFuzzer is missing (saying so), so test.sh can
# skip it.
set -u
cd "$(dirname "$0")/.." || exit 1
secs=${1:-20}
dir=${WEFT_FUZZ_BUILD:-build-fuzz}
cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
  echo "fuzz: SKIP - clang is not installed (apt-get install clang)"
  exit 77
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
  "$cc" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "fuzz: SKIP - $cc cannot link libFuzzer (-fsanitize=fuzzer)"
  exit 77
fi
if [ ! -d "$dir" ]; then
  CC=$cc meson setup "$dir" -Dfuzz=true -Dtests=false --buildtype=debugoptimized >/dev/null || exit 1
fi
# the fuzz targets only (tests/fuzz/meson.build says why)
ninja -C "$dir" fuzz-targets >/dev/null || { ninja -C "$dir" fuzz-targets; exit 1; }
[ "$secs" = build ] && exit 0
crashes=$dir/fuzz-crashes
mkdir -p "$crashes"

run_target() { # NAME CORPUS: one target for $secs; prints one line; fails on a crash
  t=$1 bin=$dir/tests/fuzz/fuzz_$1
  scratch=$dir/fuzz-scratch/$t
  mkdir -p "$scratch"
  log=$dir/fuzz-$t.log
  # -timeout: one input taking over 10 s is a hang, reported like a crash
  WEFT_DEBUG=NONE ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/$t-" "$scratch" "$2" >"$log" 2>&1
  st=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  if [ "$st" = 0 ]; then
    echo "fuzz: ok   $t (${runs:-?} inputs in ${secs} s)"
  else
    # one printf, so that lines of targets running beside it do not interleave
    printf '%s\n%s\n' "fuzz: FAIL $t (exit $st; input saved under $crashes/, log $log):" \
      "$(grep -E "ERROR|SUMMARY|#[0-9]+ 0x" "$log" | head -15)"
  fi
  return "$st"
}

# Each target is one process on one CPU, so they run side by side: on two
# cores the pass takes half as long.
jobs=${WEFT_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
rc=0 ran=0 batch=""
for corpus in tests/fuzz/corpus/*/; do
  t=$(basename "$corpus")
  [ -x "$dir/tests/fuzz/fuzz_$t" ] || { echo "fuzz: no target for corpus $t"; rc=1; continue; }
  run_target "$t" "$corpus" &
  batch="$batch $!"
  ran=$((ran + 1))
  if [ $((ran % jobs)) = 0 ]; then
    for pid in $batch; do wait "$pid" || rc=1; done
    batch=""
  fi
done
for pid in $batch; do wait "$pid" || rc=1; done
echo "fuzz: $ran targets, ${secs} s each, $jobs at a time: $([ $rc = 0 ] && echo 'no crash' || echo 'FAILED')"
exit $rc
