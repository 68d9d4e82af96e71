#!/bin/sh
# test_dp_train.sh WEFTRUN PROGRAM - the data-parallel example trains to the
# same parameters on 1, 2 and 4 ranks (each on 1/N of every global batch, also
# with 2 micro-batches accumulated), and it learns (the loss falls). The
# 1-rank run on the whole batch is the reference.
set -u
weftrun=$1
prog=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
run() { # NAME RANKS ARGS...
  name=$1 n=$2
  shift 2
  if ! WEFT_TIMEOUT=30 "$weftrun" -n "$n" --timeout 120 "$prog" --steps 60 --out "$dir/$name" "$@" \
    >"$dir/$name.log" 2>&1; then
    echo "FAIL: $name ($n ranks) exited non-zero:"
    cat "$dir/$name.log"
    fail=1
  fi
}
run ref 1
run n2 2
run n4 4
run n2accum 2 --accum 2
run n4accum 4 --accum 4
# learns: the last loss well below the first
awk '/loss first/ { if (!($NF < 0.7 * $(NF - 2))) { print "FAIL: the loss did not fall: " $0; exit 1 } }' \
  "$dir/ref.log" || fail=1
grep -q "loss first" "$dir/ref.log" || { echo "FAIL: no loss line"; fail=1; }
for name in n2 n4 n2accum n4accum; do
  # float rounding differs with the summation order; a wrong mean (sum, or a
  # missing bucket) is off by far more than this
  if ! awk 'NR == FNR { ref[FNR] = $1; n = FNR; next }
            { d = $1 - ref[FNR]; if (d < 0) d = -d; a = ref[FNR]; if (a < 0) a = -a;
              if (d > 1e-4 * (1 + a)) { bad++; if (bad < 4) print "param " FNR ": " $1 " vs " ref[FNR] } }
            END { if (FNR != n || n < 600) { print "param count " FNR " vs " n; exit 1 }
                  exit bad > 0 }' "$dir/ref" "$dir/$name"; then
    echo "FAIL: $name differs from the 1-rank run"
    fail=1
  fi
done
[ $fail = 0 ] && echo "dp_train: 1, 2 and 4 ranks agree"
exit $fail
