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

# the trees' meson options, said once (the passes and the builds ahead take them);
# the sanitizers at -O1, as AddressSanitizer's own documents advise: the same
# checks, and the shm collective matrix took 34 s instead of 64 s at -O0
SANITIZE_ARGS="--buildtype=debug -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false"
TSAN_ARGS="--buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false"
sanitize_on() { [ "${WEFT_TEST_SANITIZE:-1}" != 0 ]; }
tsan_on() { [ "${WEFT_TEST_TSAN:-1}" != 0 ] && command -v clang >/dev/null; }
fuzz_on() { [ "${WEFT_TEST_FUZZ:-1}" != 0 ]; }

configure() { # DIR SETUP-ARGS...
  dir=$1
  shift
  [ -d "$dir" ] || meson setup "$dir" -Dwerror=true -Dtests=true "$@" >/dev/null
}

# The executables of DIR's tests in suite "threads", for the ThreadSanitizer
# pass, which runs only those (a third of the tree: 9 of 22 s of compiling);
# nothing (so everything is built) if a test there is not an executable of
# the tree.
threads_targets() { # DIR
  python3 - "$1" <<'PY' 2>/dev/null
import json, os, sys
root = os.path.abspath(sys.argv[1])
info = os.path.join(root, "meson-info")
files = {t["id"]: t["filename"] for t in json.load(open(os.path.join(info, "intro-targets.json")))}
out = []
for t in json.load(open(os.path.join(info, "intro-tests.json"))):
    if "threads" not in (s.split(":")[-1] for s in t["suite"]):
        continue
    # the test's program and what meson says it depends on (libraries, modules)
    for f in [t["cmd"][0]] + [f for d in t.get("depends", []) for f in files.get(d, [])]:
        rel = os.path.relpath(f, root)
        if rel.startswith(".."):
            sys.exit(0)  # a program from outside the tree: build it all
        out.append(rel)
print(" ".join(sorted(set(out))))
PY
}

# Building ahead. The later passes' trees (sanitizers, ThreadSanitizer, fuzz
# targets: about 90 s of compiling on 2 cores) build in the background, at
# nice 19, only while a "sleeps" suite runs: those tests mostly wait, so the
# cores are idle. Between those windows the build is stopped (SIGSTOP to its
# process group): compilers beside the collective tests, even at nice 19,
# made them 2x slower (ranks that yield hand the core over). Its output is
# not kept: a tree that fails here fails again, printed, when its pass
# builds it (ninja then finds the rest done). $AHEAD_MARK exists once the
# sanitizer tree is done, so that pass can start before the rest is built.
if [ "${1:-}" = --build-ahead ]; then
  if sanitize_on; then
    # shellcheck disable=SC2086
    configure build-sanitize $SANITIZE_ARGS && ninja -C build-sanitize
  fi
  : >"${AHEAD_MARK:-/dev/null}"
  if tsan_on; then
    # shellcheck disable=SC2046,SC2086
    CC=clang configure build-tsan $TSAN_ARGS && ninja -C build-tsan $(threads_targets build-tsan)
  fi
  if fuzz_on; then sh tools/fuzz.sh build; fi
  exit 0
fi
ahead="" ahead_dir=$(mktemp -d)
export AHEAD_MARK="$ahead_dir/sanitize-built"
trap '[ -z "$ahead" ] || kill -KILL "-$ahead" 2>/dev/null; rm -rf "$ahead_dir"' EXIT
trap 'exit 1' INT TERM
ahead_run() { # start the build ahead, or let it go on
  if [ -z "$ahead" ]; then
    # its own process group (setsid), so that one signal stops every compiler
    setsid nice -n 19 sh tools/test.sh --build-ahead </dev/null >/dev/null 2>&1 &
    ahead=$!
  else
    kill -CONT "-$ahead" 2>/dev/null
  fi
}
ahead_stop() { [ -z "$ahead" ] || kill -STOP "-$ahead" 2>/dev/null; }
ahead_wait_sanitize() { # until the sanitizer tree is built, then stopped again
  [ -n "$ahead" ] || return 0
  ahead_run
  while [ ! -e "$AHEAD_MARK" ] && kill -0 "$ahead" 2>/dev/null; do sleep 0.2; done
  ahead_stop
}
ahead_finish() {
  [ -n "$ahead" ] || return 0
  ahead_run
  wait "$ahead"
  ahead=""
}

sh tools/setup-debian.sh || exit 1
# The torch 2.x venv for tests/pip (weft's wheel goes into venvs over it; issue 38): kept
# between runs where the machine keeps it, made again (about 5 GiB from PyPI,
# a minute or two) where not. WEFT_TORCH_VENV names another folder;
# WEFT_TEST_PIP=0 makes none (that test then skips, saying so).
if [ -z "${WEFT_TORCH_VENV:-}" ]; then
  WEFT_TORCH_VENV=/var/cache/weft-ci/torch2-venv
  mkdir -p /var/cache/weft-ci 2>/dev/null && [ -w /var/cache/weft-ci ] ||
    WEFT_TORCH_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/weft-ci/torch2-venv
fi
export WEFT_TORCH_VENV
if [ "${WEFT_TEST_PIP:-1}" != 0 ]; then
  sh tools/setup-debian.sh --torch-venv "$WEFT_TORCH_VENV" ||
    echo "== no torch 2.x venv in $WEFT_TORCH_VENV (setup-debian.sh failed above): the pip test skips"
fi
passed=0 failed=0 skipped=0 rc=0
run_suite() { # DIR SETUP-ARGS...
  dir=$1
  shift
  configure "$dir" "$@" || return 1
  # ONLY_THREADS=1: the threads suite's executables only, and meson test
  # builds nothing more (--no-rebuild)
  targets="" norebuild=""
  if [ -n "${ONLY_THREADS:-}" ]; then
    targets=$(threads_targets "$dir")
    [ -z "$targets" ] || norebuild=--no-rebuild
  fi
  # shellcheck disable=SC2086
  if ! ninja -C "$dir" $targets; then
    failed=$((failed + 1)) # a build that fails is a failure in the count too
    return 1
  fi
  echo "== tests in $dir ($*)"
  rm -f "$dir/meson-logs/testlog.json" "$dir/meson-logs/sleeps.json"
  logs="$dir/meson-logs/testlog.json"
  if [ -n "${SLEEPS_APART:-}" ]; then
    # Suite "sleeps" (tests/meson.build): tests that mostly wait on
    # timeouts, three at a time (2 cores: about 100 s less per pass); then
    # the rest one at a time, as their ranks need the cores. (Not with
    # SUITE_ARGS: meson's --suite adds, it cannot narrow.)
    ahead_run
    meson test -C "$dir" --print-errorlogs --num-processes 3 --suite sleeps --logbase sleeps || rc=1
    ahead_stop
    logs="$logs $dir/meson-logs/sleeps.json"
    # shellcheck disable=SC2086
    meson test -C "$dir" --print-errorlogs --num-processes 1 --no-suite sleeps ${SUITE_ARGS:-} || rc=1
  else
    # shellcheck disable=SC2086
    meson test -C "$dir" --print-errorlogs --num-processes 1 $norebuild ${SUITE_ARGS:-} || rc=1
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
ahead_wait_sanitize
if sanitize_on; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export WEFT_TEST_QUICK=1 # sanitizers are slow: a lighter collective matrix
  # the heavy collective matrices ran above; their code paths run here too
  # shellcheck disable=SC2086
  SLEEPS_APART=1 SUITE_ARGS="--no-suite heavy" run_suite build-sanitize $SANITIZE_ARGS || rc=1
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi
ahead_finish
if tsan_on; then
  # ranks are forked children of the test's process (die_after_fork=0); a
  # report makes the rank exit 66, which its test counts as a failure;
  # tests/tsan.supp: the one report fork makes of a parent's thread (it says why)
  export TSAN_OPTIONS="die_after_fork=0:exitcode=66:suppressions=$PWD/tests/tsan.supp" WEFT_TEST_QUICK=1
  # shellcheck disable=SC2086
  CC=clang SLEEPS_APART="" ONLY_THREADS=1 SUITE_ARGS="--suite threads" run_suite build-tsan $TSAN_ARGS || rc=1
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
