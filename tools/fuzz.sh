#!/bin/sh
# fuzz.sh [SECONDS] - builds the libFuzzer targets (tests/fuzz, clang needed)
# in build-fuzz and runs each for SECONDS (default 20) from the committed
# seed corpus (tests/fuzz/corpus/<target>); new inputs go to a scratch
# folder, not into the repository. A crash leaves its input in
# build-fuzz/fuzz-crashes/ and makes this script fail. Exits 77 when clang
# or libFuzzer is missing (saying so), so test.sh can skip it.
set -u
cd "$(dirname "$0")/.."
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
crashes=$dir/fuzz-crashes
mkdir -p "$crashes"
rc=0 ran=0
for corpus in tests/fuzz/corpus/*/; do
  t=$(basename "$corpus")
  bin=$dir/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target for corpus $t"; rc=1; continue; }
  scratch=$dir/fuzz-scratch/$t
  mkdir -p "$scratch"
  log=$dir/fuzz-$t.log
  # -timeout: one input taking over 10 s is a hang, reported like a crash
  WEFT_DEBUG=NONE ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/$t-" "$scratch" "$corpus" >"$log" 2>&1
  st=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  ran=$((ran + 1))
  if [ "$st" = 0 ]; then
    echo "fuzz: ok   $t (${runs:-?} inputs in ${secs} s)"
  else
    echo "fuzz: FAIL $t (exit $st; input saved under $crashes/, log $log):"
    grep -E "ERROR|SUMMARY|#[0-9]+ 0x" "$log" | head -15
    rc=1
  fi
done
echo "fuzz: $ran targets, ${secs} s each: $([ $rc = 0 ] && echo 'no crash' || echo 'FAILED')"
exit $rc
