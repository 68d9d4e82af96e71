#!/bin/sh
# test.sh - the README's second command (and what .ci/run calls): install
# what is missing, then build and run the whole suite twice: optimized with
# warnings as errors, and under AddressSanitizer + UndefinedBehaviorSanitizer
# (WEFT_TEST_SANITIZE=0 skips that pass); then the tests that run threads
# (the progress engine, abort from another thread) under ThreadSanitizer,
# built with clang (WEFT_TEST_TSAN=0 skips it); then the fuzz targets
# briefly (tools/fuzz.sh; WEFT_TEST_FUZZ=0 skips). Ends with one line
# "weft: N passed, M failed, K skipped" over every pass.
set -u
cd "$(dirname "$0")/.." || exit 1
sh tools/setup-debian.sh || exit 1

passed=0 failed=0 skipped=0 rc=0
# the trees' meson options, said once (run_suite and build_ahead take them)
SANITIZE_ARGS="--buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false"
TSAN_ARGS="--buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false"
sanitize_on() { [ "${WEFT_TEST_SANITIZE:-1}" != 0 ]; }
tsan_on() { [ "${WEFT_TEST_TSAN:-1}" != 0 ] && command -v clang >/dev/null; }
fuzz_on() { [ "${WEFT_TEST_FUZZ:-1}" != 0 ]; }

configure() { # DIR SETUP-ARGS...
  dir=$1
  shift
  # shellcheck disable=SC2086
  [ -d "$dir" ] || ${NICE:-} meson setup "$dir" -Dwerror=true -Dtests=true "$@" >/dev/null
}

# The later passes' trees (sanitizers, ThreadSanitizer, fuzz targets: about
# 80 s of compiling on 2 cores) build in the background at the lowest
# priority while the first pass runs: its "sleeps" suite leaves the cores
# mostly idle, and nice 19 keeps the compilers from taking CPU its ranks want.
# Their output is not kept: a tree that fails here fails again, printed,
# when its pass builds it (ninja then finds the rest done).
build_ahead() {
  (
    NICE="nice -n 19"
    if sanitize_on; then
      # shellcheck disable=SC2086
      configure build-sanitize $SANITIZE_ARGS && $NICE ninja -C build-sanitize
    fi
    if tsan_on; then
      # shellcheck disable=SC2086
      CC=clang configure build-tsan $TSAN_ARGS && $NICE ninja -C build-tsan
    fi
    if fuzz_on; then $NICE sh tools/fuzz.sh build; fi
  ) >/dev/null 2>&1 </dev/null &
  ahead=$!
}
ahead=""
await_ahead() { [ -z "$ahead" ] || wait "$ahead"; ahead=""; }

run_suite() { # DIR SETUP-ARGS...
  dir=$1
  shift
  configure "$dir" "$@" || return 1
  if ! ninja -C "$dir"; then
    failed=$((failed + 1)) # a build that fails is a failure in the count too
    return 1
  fi
  [ "$dir" = build-test ] && build_ahead
  echo "== tests in $dir ($*)"
  rm -f "$dir/meson-logs/testlog.json" "$dir/meson-logs/sleeps.json"
  logs="$dir/meson-logs/testlog.json"
  if [ -n "${SLEEPS_APART:-}" ]; then
    # Suite "sleeps" (tests/meson.build): tests that mostly wait on
    # timeouts, three at a time (2 cores: about 100 s less per pass); then
    # the rest one at a time, as their ranks need the cores. (Not with
    # SUITE_ARGS: meson's --suite adds, it cannot narrow.)
    meson test -C "$dir" --print-errorlogs --num-processes 3 --suite sleeps --logbase sleeps || rc=1
    logs="$logs $dir/meson-logs/sleeps.json"
    # shellcheck disable=SC2086
    meson test -C "$dir" --print-errorlogs --num-processes 1 --no-suite sleeps ${SUITE_ARGS:-} || rc=1
  else
    # shellcheck disable=SC2086
    meson test -C "$dir" --print-errorlogs --num-processes 1 ${SUITE_ARGS:-} || rc=1
  fi
  for log in $logs; do
    [ -f "$log" ] || return 1
    passed=$((passed + $(grep -c '"result": "OK"' "$log")))
    failed=$((failed + $(grep -c '"result": "\(FAIL\|TIMEOUT\|ERROR\)"' "$log")))
    skipped=$((skipped + $(grep -c '"result": "SKIP"' "$log")))
  done
  return 0 # (grep -c exits 1 when it counts zero)
}

SLEEPS_APART=1 run_suite build-test --buildtype=debugoptimized || rc=1
await_ahead
if sanitize_on; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export WEFT_TEST_QUICK=1 # sanitizers are slow: a lighter collective matrix
  # the heavy collective matrices ran above; their code paths run here too
  # shellcheck disable=SC2086
  SLEEPS_APART=1 SUITE_ARGS="--no-suite heavy" run_suite build-sanitize $SANITIZE_ARGS || rc=1
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi
if tsan_on; then
  # ranks are forked children of the test's process (die_after_fork=0); a
  # report makes the rank exit 66, which its test counts as a failure;
  # tests/tsan.supp: the one report fork makes of a parent's thread (it says why)
  export TSAN_OPTIONS="die_after_fork=0:exitcode=66:suppressions=$PWD/tests/tsan.supp" WEFT_TEST_QUICK=1
  # shellcheck disable=SC2086
  CC=clang SLEEPS_APART="" SUITE_ARGS="--suite threads" run_suite build-tsan $TSAN_ARGS || rc=1
elif [ "${WEFT_TEST_TSAN:-1}" != 0 ]; then
  echo "== ThreadSanitizer pass skipped: clang is not installed"
fi
# Last pass: the fuzz targets for every parser of network input, a few
# seconds each (WEFT_TEST_FUZZ=0 skips; tools/fuzz.sh runs longer).
if fuzz_on; then
  echo "== fuzz targets (tools/fuzz.sh ${WEFT_FUZZ_SECONDS:-2})"
  sh tools/fuzz.sh "${WEFT_FUZZ_SECONDS:-2}"
  case $? in
    0) passed=$((passed + 1)) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) rc=1 ;;
  esac
fi
echo "weft: $passed passed, $failed failed, $skipped skipped"
exit $rc
