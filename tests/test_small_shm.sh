#!/bin/sh
# test_small_shm.sh RANK_PROGRAM WEFTRUN - a /dev/shm too small for the
# shared-memory segments: the ranks must fall back to TCP with one clear
# warning, never crash with SIGBUS, and still compute right results. Runs in
# a private mount namespace with a 1 MiB tmpfs on /dev/shm (the real one is
# untouched). Exits 77 (skipped) where that cannot be arranged.
set -u
prog=${1:?usage: test_small_shm.sh RANK_PROGRAM WEFTRUN}
weftrun=${2:?usage: test_small_shm.sh RANK_PROGRAM WEFTRUN}
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root for a private mount namespace"; exit 77; }
command -v unshare >/dev/null || { echo "SKIP: needs unshare (util-linux)"; exit 77; }
unshare --mount true 2>/dev/null || { echo "SKIP: cannot create a mount namespace here"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
unshare --mount sh -c "mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm &&
  WEFT_TIMEOUT=30 timeout -k 5 60 '$weftrun' -n 3 '$prog' 3 tcp" >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" = 0 ] || { echo "not ok - ranks failed with a small /dev/shm (rc $rc)"; exit 1; }
grep -q "dev/shm has" "$out" || { echo "not ok - no warning about the small /dev/shm"; exit 1; }
warnings=$(grep -c "WARN.*dev/shm has" "$out")
[ "$warnings" -le 3 ] || { echo "not ok - $warnings warnings: one per rank expected"; exit 1; }
echo "ok - a 1 MiB /dev/shm: tcp for every peer, one warning per rank, results correct"
