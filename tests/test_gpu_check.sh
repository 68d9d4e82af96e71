#!/bin/sh
# test_gpu_check.sh - tools/gpu_check.sh as the suite runs it: on a machine
# without a GPU its build stage (with CUDA, where the headers are) must pass
# and every GPU stage must say SKIP with the reason, exit 0; on one with a
# GPU nothing may FAIL. The script is what the GPU machine runs, so this is
# the only run it gets before that. Skipped (77) where no cuda.h is found.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_h="${CUDA_HOME:-/usr/local/cuda}/include/cuda.h"
[ -f "$cuda_h" ] || { echo "SKIP: no $cuda_h: gpu_check.sh builds with CUDA"; exit 77; }
out=$(mktemp -d /tmp/weft-gpu-check-test.XXXXXX) || exit 1
trap 'rm -rf "$out"' EXIT
sh "$root/tools/gpu_check.sh" "$out"
rc=$?
summary="$out/summary.md"
[ -f "$summary" ] || { echo "FAIL: no summary.md"; exit 1; }
grep -q '^| build | PASS |' "$summary" || { echo "FAIL: the build stage did not pass"; exit 1; }
if grep -q '| FAIL |' "$summary"; then echo "FAIL: a stage failed"; exit 1; fi
# every stage has a row: the GPU machine's table must not lose one silently
for s in info "device 1" "device 4" tcp "in flight" order sanitizer bench resnet; do
  grep -q "^| $s" "$summary" || { echo "FAIL: no row for $s"; exit 1; }
done
grep -q '| SKIP | no GPU: .\{10,\}' "$summary" || grep -q '^| device 1 | PASS' "$summary" ||
  { echo "FAIL: the GPU stages neither ran nor said why not"; exit 1; }
[ "$rc" -eq 0 ] || { echo "FAIL: gpu_check.sh exited $rc"; exit 1; }
echo "gpu_check.sh: build PASS, GPU stages as the table says; exit 0"
