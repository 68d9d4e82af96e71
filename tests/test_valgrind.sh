#!/bin/sh
# test_valgrind.sh RANK_PROGRAM TRANSPORT [MODE] - two ranks of a small job
# (allreduce, broadcast, reduce, allgather, reduce-scatter, alltoall,
# barrier), each a process under valgrind's memcheck: any invalid access,
# use of uninitialised memory or definite leak fails it (exit 99), as does
# a wrong result. MODE peer-exits: rank 1 leaves after init, rank 0 must
# fail its call cleanly (the error paths, leak-free). Exits 77 (skipped) when valgrind is not installed.
set -u
prog=${1:?usage: test_valgrind.sh RANK_PROGRAM TRANSPORT}
tp=${2:-tcp}
mode=${3:-}
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed (tools/setup-debian.sh installs it)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((30000 + $$ % 20000))
pids=""
for r in 0 1; do
  WEFT_RANK=$r WEFT_SIZE=2 WEFT_RENDEZVOUS=127.0.0.1:$port WEFT_TRANSPORT=$tp WEFT_TIMEOUT=60 \
    WEFT_DEBUG=NONE timeout -k 5 150 valgrind -q --error-exitcode=99 --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-origins=yes \
    --log-file="${VALGRIND_LOG_DIR:-$tmp}/vg.$r" "$prog" $mode >"$tmp/out.$r" 2>&1 &
  pids="$pids $!"
done
rc=0 r=0
for p in $pids; do
  wait "$p"
  st=$?
  if [ "$st" != 0 ]; then
    echo "not ok - rank $r exited $st ($([ "$st" = 99 ] && echo 'valgrind found errors' || echo 'see below'))"
    sed "s/^/[$r] /" "$tmp/out.$r" "$tmp/vg.$r"
    rc=1
  fi
  r=$((r + 1))
done
[ "$rc" = 0 ] && echo "ok - 2 ranks over $tp${mode:+ ($mode)} under valgrind: no memory errors, no definite leaks, results right"
exit $rc
