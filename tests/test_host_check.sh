#!/bin/sh
# test_host_check.sh - tools/host_check.sh, small: 2 ranks, no switch-point
# phase, two matrix sizes. Its build must pass, and every stage that can run here must give
# its table (Open MPI's matrix where mpicc builds, gloo where torch is); the
# 16-core machine runs the full script, so this is its run before that.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d /tmp/weft-host-check-test.XXXXXX) || exit 1
trap 'rm -rf "$out"' EXIT
# the matrix at two sizes here (its parsing is what this proves; the 16-core
# machine runs every size)
NPS=2 NPS_GLOO=2 SWITCH=0 MATRIX_SMALL=8 MATRIX_LARGE=1048576 sh "$root/tools/host_check.sh" "$out"
rc=$?
s="$out/summary.md"
[ -f "$s" ] || { echo "FAIL: no summary.md"; exit 1; }
grep -q '^| build | PASS |' "$s" || { echo "FAIL: the build did not pass"; exit 1; }
if grep -q '| FAIL |' "$s"; then echo "FAIL: a stage failed"; exit 1; fi
if grep -q '^| matrix | PASS' "$s"; then
  if ! grep -q '^| shm allreduce 2 |' "$s" || ! grep -q '^| tcp alltoall 2 |' "$s"; then
    echo "FAIL: the matrix has no shm or tcp rows"
    exit 1
  fi
fi
if grep -q '^| gloo | PASS' "$s"; then
  grep -q '^| 2 | 64 MiB | [0-9]' "$s" || { echo "FAIL: the gloo table has no 64 MiB row"; exit 1; }
fi
[ "$rc" -eq 0 ] || { echo "FAIL: host_check.sh exited $rc"; exit 1; }
echo "host_check.sh: build and every stage that can run here passed"
