#!/bin/sh
# test_elastic_train.sh WEFTRUN TRAIN - examples/elastic_train.c loses two
# ranks of four (rank 1 at step 10, then rank 0, the coordinator, at step
# 30), each killed at a random moment of an allreduce, shm and tcp; the run
# must finish with the parameters of a 1-rank run of the same steps (same
# global batch, averaged gradients), up to float rounding: no step lost, none
# applied twice. Then again with --restart: replacements join and the run
# ends at full size, with the same parameters.
set -eu
weftrun=$1
train=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
WEFT_DEBUG=NONE "$weftrun" -n 1 "$train" --steps 40 --out "$dir/ref.txt" > "$dir/ref.log"
for tp in shm tcp; do
  WEFT_DEBUG=NONE WEFT_TRANSPORT=$tp WEFT_TIMEOUT=30 "$weftrun" --elastic -n 4 "$train" \
    --steps 40 --kill 10:1,30:0 --out "$dir/got.txt" > "$dir/got.log" 2>&1 || {
    cat "$dir/got.log"; echo "FAIL: the elastic run over $tp failed"; exit 1; }
  # two recoveries, or one when both deaths fell in one step
  grep -Eq "[12] recoveries, 2 ranks at the end" "$dir/got.log" || {
    cat "$dir/got.log"; echo "FAIL: over $tp, not down to 2 ranks"; exit 1; }
  # the largest difference from the 1-rank run, relative to the values' size
  worst=$(paste "$dir/ref.txt" "$dir/got.txt" | awk '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1; if (m < 1) m = 1;
      if (d / m > w) w = d / m } END { printf "%.3g", w + 0 }')
  n=$(wc -l < "$dir/got.txt")
  echo "over $tp: $n parameters, worst relative difference from 1 rank: $worst"
  awk -v w="$worst" 'BEGIN { exit !(w < 1e-4) }' || { echo "FAIL: parameters differ"; exit 1; }
  [ "$n" -eq "$(wc -l < "$dir/ref.txt")" ] || { echo "FAIL: parameter count"; exit 1; }
done
# the same with --restart: a replacement joins for each rank lost (weft_comm_grow,
# weft_comm_join), gets the parameters and the step, and the run ends at 4 ranks
for tp in shm tcp; do
  WEFT_DEBUG=NONE WEFT_TRANSPORT=$tp WEFT_TIMEOUT=30 "$weftrun" --elastic -n 4 "$train" \
    --steps 40 --kill 10:1,30:0 --restart --out "$dir/got.txt" > "$dir/got.log" 2>&1 || {
    cat "$dir/got.log"; echo "FAIL: the elastic run with replacements over $tp failed"; exit 1; }
  grep -Eq "[12] recoveries, 4 ranks at the end" "$dir/got.log" &&
    grep -q "2 replacements joined" "$dir/got.log" || {
    cat "$dir/got.log"; echo "FAIL: over $tp, not back to 4 ranks with 2 replacements"; exit 1; }
  worst=$(paste "$dir/ref.txt" "$dir/got.txt" | awk '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1; if (m < 1) m = 1;
      if (d / m > w) w = d / m } END { printf "%.3g", w + 0 }')
  echo "over $tp with replacements: worst relative difference from 1 rank: $worst"
  awk -v w="$worst" 'BEGIN { exit !(w < 1e-4) }' || { echo "FAIL: parameters differ"; exit 1; }
done
echo "ok: a run that lost 2 of 4 ranks ends where 1 rank does, with replacements too"
