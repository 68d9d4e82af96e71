#!/bin/sh
# test_weft_bench.sh WEFTRUN WEFT_BENCH - weft-bench from the outside: every
# collective in both formats (nccl-tests' and ../shared/peers') over shm and
# tcp at 2 and 3 ranks, results checked, sizes as nccl-tests and
# bench_common.h define them; an unknown collective refused (never run as
# another); an injected wrong element (--test-corrupt) fails the run.
# Every run is bounded by weftrun's --timeout.
set -u
WEFTRUN=${1:?usage: sh tests/test_weft_bench.sh WEFTRUN WEFT_BENCH}
BENCH=${2:?usage: sh tests/test_weft_bench.sh WEFTRUN WEFT_BENCH}
unset WEFT_RENDEZVOUS WEFT_TRANSPORT
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0
ALL="allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter sendrecv"

pass() { echo "ok - $1"; }
# fail NAME: with what the ranks said, which is what one needs to debug it
fail() {
  echo "not ok - $1 (exit $rc)"
  sed 's/^/#   stdout: /' "$TMP/out" | head -60
  sed 's/^/#   stderr: /' "$TMP/err" | head -20
  failures=$((failures + 1))
}
check() { # NAME CONDITION...: the condition is a command; its success is the check
  name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}
# bench NP ARGS...: weft-bench under weftrun; $rc, rank 0's lines (prefix
# taken off) in out, stderr in err
bench() {
  np=$1
  shift
  WEFT_TIMEOUT=30 "$WEFTRUN" -n "$np" --timeout 120 "$BENCH" "$@" >"$TMP/raw" 2>"$TMP/err"
  rc=$?
  sed -n 's/^\[0\] //p' "$TMP/raw" >"$TMP/out"
}

# ---- an unknown collective is refused, never run as another ----
refused() { # the run failed and said why, and no row of a table came out
  [ "$rc" != 0 ] && grep -q "unknown collective 'bogus'" "$TMP/err" &&
    ! grep -q '^ *[0-9]' "$TMP/out"
}
bench 2 --peers -c bogus -b 8 -e 64 -n 2 -m 1
check "--peers -c bogus is refused" refused
bench 2 -C bogus -b 8 -e 64 -n 2 -w 1
check "-C bogus is refused" refused
bench 2 -c bogus -b 8 -e 64 -n 2 -w 1
check "-c bogus is refused" refused
# a size with anything after its number (K, M, G aside) once ran as the number
bad_size() { [ "$rc" != 0 ] && grep -q '"8x" is not a size' "$TMP/err" && ! grep -q '^ *[0-9]' "$TMP/out"; }
bench 2 --peers -c bcast -b 8x -e 64 -n 2
check "--peers -b 8x is refused" bad_size
bench 2 -b 8 -e 8x -n 2 -w 1
check "-e 8x is refused" bad_size

# ---- the default format: nccl-tests' columns and size convention ----
# Sizes 8, 64, 512, 4096 B. A blocked collective's size is the whole buffer
# rounded down to np blocks (a size below one element per rank gives no row)
# and its count one block; #wrong is 0 everywhere, N/A in place only where
# weft.h has no in-place form (alltoall, sendrecv).
nccl_tables_right() { # NP TRANSPORT [CORRUPT]: CORRUPT=1 wants 1 wrong element per measured column
  [ "$rc" = 0 ] || [ "${3:-0}" = 1 ] || return 1
  grep -q "^# transports of .*: $2 " "$TMP/out" || return 1
  awk -v np="$1" -v all="$ALL" -v corrupt="${3:-0}" '
    BEGIN { n = split(all, names, " ")
            for (i = 1; i <= n; i++) { want[names[i]] = 0; got[names[i]] = 0 }
            blocked["allgather"] = blocked["reduce_scatter"] = blocked["alltoall"] = 1
            blocked["gather"] = blocked["scatter"] = 1
            rooted["broadcast"] = rooted["reduce"] = rooted["gather"] = rooted["scatter"] = 1
            noinplace["alltoall"] = noinplace["sendrecv"] = 1
            for (i = 1; i <= n; i++)
              for (b = 8; b <= 4096; b *= 8)
                if (!blocked[names[i]] || int(b / 4 / np) > 0) want[names[i]]++
            w = corrupt ? "1" : "0" }
    function bad(why) { print "row of " coll ": " why ": " $0; err = 1 }
    /^# weft-bench / { coll = $4; sub(/,$/, "", coll); next }
    /^# Out of bounds values/ { if (($8 == "FAILED") != (corrupt == 1)) bad("summary"); next }
    /^#/ { next }
    NF == 13 {
      got[coll]++
      elems = $1 / 4
      if (blocked[coll] && (elems % np || $2 != elems / np)) bad("size/count not np blocks")
      if (!blocked[coll] && $2 != elems) bad("count is not size/4")
      root = rooted[coll] ? 0 : -1
      if ($5 != root) bad("root column")
      if ($9 != w) bad("out-of-place #wrong")
      if (noinplace[coll] ? ($10 != "N/A" || $13 != "N/A") : $13 != w) bad("in-place #wrong")
      next }
    { bad("unexpected line") }
    END { for (c in want)
            if (got[c] != want[c]) { print c ": " got[c] " rows, want " want[c]; err = 1 }
          exit err }' "$TMP/out"
}

# ---- the --peers format: ../shared/peers' rows ----
# Same sizes; bytes as asked, count = bytes/4 (bench_row), check ok
# everywhere; allgather, reduce_scatter, alltoall (and gather, scatter)
# give no row for a size below one element per rank, as bench_common.h.
peers_tables_right() { # NP TRANSPORT [CORRUPT]: CORRUPT=1 wants every row FAIL with 1 element
  [ "$rc" = 0 ] || [ "${3:-0}" = 1 ] || return 1
  grep -q "^# transports of .*: $2 " "$TMP/out" || return 1
  awk -v np="$1" -v all="bcast ${ALL#allreduce broadcast }" -v corrupt="${3:-0}" '
    BEGIN { n = split("allreduce " all, names, " ")
            for (i = 1; i <= n; i++) { want[names[i]] = 0; got[names[i]] = 0 }
            blocked["allgather"] = blocked["reduce_scatter"] = blocked["alltoall"] = 1
            blocked["gather"] = blocked["scatter"] = 1
            for (i = 1; i <= n; i++)
              for (b = 8; b <= 4096; b *= 8)
                if (!blocked[names[i]] || int(b / 4 / np) > 0) want[names[i]]++ }
    function bad(why) { print "row of " coll ": " why ": " $0; err = 1 }
    /^# peer=weft/ { for (i = 1; i <= NF; i++) if ($i ~ /^coll=/) coll = substr($i, 6)
                     if ($0 !~ " np=" np " dtype=float32 ") bad("header"); next }
    /^# FAIL: 1 wrong elements/ { fails++; next }
    /^#/ { next }
    NF == 7 { got[coll]++
              if ($2 != $1 / 4) bad("count")
              if ($7 != (corrupt ? "FAIL" : "ok")) bad("check")
              next }
    { bad("unexpected line") }
    END { for (c in want) {
            rows += want[c]
            if (got[c] != want[c]) { print c ": " got[c] " rows, want " want[c]; err = 1 }
          }
          if (corrupt && fails != rows) { print fails " FAIL lines for " rows " rows"; err = 1 }
          exit err }' "$TMP/out"
}

for tp in shm tcp; do
  for np in 2 3; do
    export WEFT_TRANSPORT=$tp
    bench $np -c all -b 8 -e 4K -f 8 -n 2 -w 1
    check "every collective, nccl-tests format, $np ranks over $tp: sizes, counts, results" \
      nccl_tables_right $np $tp
    bench $np --peers -c all -b 8 -e 4K -f 8 -n 3 -m 2
    check "every collective, --peers format, $np ranks over $tp: sizes, counts, results" \
      peers_tables_right $np $tp
    unset WEFT_TRANSPORT
  done
done

# ---- a wrong result is caught: one element flipped after the call ----
export WEFT_TRANSPORT=shm
failed_loudly() { [ "$rc" != 0 ] && grep -q "FAILED: .* wrong elements" "$TMP/err"; }
bench 2 -c all -b 8 -e 4K -f 8 -n 1 -w 0 --test-corrupt
check "an injected wrong element shows in every #wrong column" nccl_tables_right 2 shm 1
check "an injected wrong element fails the run (nccl-tests format)" failed_loudly
bench 3 --peers -c all -b 8 -e 4K -f 8 -n 1 -m 1 --test-corrupt
check "an injected wrong element marks every --peers row FAIL" peers_tables_right 3 shm 1
check "an injected wrong element fails the run (--peers format)" failed_loudly
unset WEFT_TRANSPORT

# ---- --recover: a rank SIGKILLed, the survivors shrink, grow back, right ----
for tp in shm tcp; do
  WEFT_TRANSPORT=$tp WEFT_TIMEOUT=30 "$WEFTRUN" --elastic -n 3 --timeout 120 "$BENCH" --recover \
    >"$TMP/raw" 2>"$TMP/err"
  rc=$?
  sed -n 's/^\[0\] //p' "$TMP/raw" >"$TMP/out"
  recovered() {
    [ "$rc" = 0 ] && grep -q "rank 1 SIGKILLed" "$TMP/out" &&
      awk '!/^#/ && NF == 8 { ok = $8 == 0 } END { exit !ok }' "$TMP/out"
  }
  check "--recover over $tp: 2 of 3 ranks shrink, grow back, every phase printed, #wrong 0" recovered
done

[ "$failures" = 0 ] || { echo "$failures failed"; exit 1; }
