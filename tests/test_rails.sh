#!/bin/sh
# test_rails.sh RANK_PROGRAM - several interfaces (multi-rail): two "hosts"
# (network namespaces) joined by two veth pairs, wr0 and wr1, each in a
# subnet of its own, two ranks per host (host ids differing: shm within a
# host, tcp across), WEFT_SOCKET_IFNAME listing both. The ranks must report
# streams over both rails, get every collective right, and both links must
# carry a fair share of the bytes (tx_bytes inside a namespace). The
# namespaces are removed however the test ends. Exits 77 (skipped) where
# namespaces cannot be made, saying why.
# RAILS_CUT=1: the second rail goes down under running allreduces; every
# rank must then fail (a timeout or a lost peer, its sentence naming a peer
# or a rank) within WEFT_TIMEOUT plus a margin: never hang.
# RAILS_IFNAME and RAILS_WORDS override the list and the words the reasons
# must hold (RAILS_IFNAME==wr0 RAILS_WORDS="tcp to" shows the byte check
# fail: one rail carries nothing).
set -u
prog=${1:?usage: test_rails.sh RANK_PROGRAM}
ifnames=${RAILS_IFNAME:-=wr0,=wr1}
words=${RAILS_WORDS:-over wr0,wr1}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs the ip command (iproute2)"

tag=$$
a=weft_r_a_$tag b=weft_r_b_$tag
net0=10.$((200 + tag % 50)).$((tag % 250)) net1=10.$((150 + tag % 50)).$((tag % 250))
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$tmp"
}
tmp=$(mktemp -d)
trap cleanup EXIT
trap 'exit 1' INT TERM
ip netns add "$a" 2>/dev/null || skip "cannot create network namespaces here"
ip netns add "$b" || exit 1
for i in 0 1; do
  ip link add "wr$i" netns "$a" type veth peer name "wr$i" netns "$b" || skip "cannot create a veth pair"
done
ip -n "$a" addr add "$net0.1/24" dev wr0 && ip -n "$b" addr add "$net0.2/24" dev wr0 &&
  ip -n "$a" addr add "$net1.1/24" dev wr1 && ip -n "$b" addr add "$net1.2/24" dev wr1 || exit 1
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up && ip -n "$ns" link set wr0 up && ip -n "$ns" link set wr1 up || exit 1
done
tx() { ip netns exec "$a" cat "/sys/class/net/$1/statistics/tx_bytes"; }
tx0=$(tx wr0) tx1=$(tx wr1)

port=$((20000 + tag % 20000))
if [ "${RAILS_CUT:-0}" = 1 ]; then
  timeout_s=5 margin=10
  for r in 0 1 2 3; do
    if [ "$r" -lt 2 ]; then ns=$a host=hostA; else ns=$b host=hostB; fi
    ip netns exec "$ns" env WEFT_RANK=$r WEFT_SIZE=4 WEFT_RENDEZVOUS="$net0.1:$port" \
      WEFT_HOST_ID=$host WEFT_SOCKET_IFNAME="$ifnames" WEFT_TIMEOUT=$timeout_s WEFT_DEBUG=NONE \
      "$prog" "$words" loop >"$tmp/out.$r" 2>"$tmp/err.$r" &
    pids="$pids $!"
  done
  t=0
  until [ "$(grep -l '^iter 1 ok' "$tmp"/out.* 2>/dev/null | wc -l)" = 4 ]; do
    sleep 0.2
    t=$((t + 1))
    if [ $t -gt 600 ] || grep -q FAILED "$tmp"/out.*; then
      echo "not ok - the job did not get going before the rail was cut"
      cat "$tmp"/out.* "$tmp"/err.*
      exit 1
    fi
  done
  ip -n "$a" link set wr1 down || { echo "not ok - could not cut wr1"; exit 1; }
  cut_at=$(date +%s)
  echo "rail wr1 cut after iteration 1; waiting at most $((timeout_s + margin)) s"
  rc=0
  r=0
  for p in $pids; do
    while kill -0 "$p" 2>/dev/null && [ $(($(date +%s) - cut_at)) -le $((timeout_s + margin)) ]; do
      sleep 0.1
    done
    if kill -0 "$p" 2>/dev/null; then
      echo "not ok - rank $r still running $((timeout_s + margin)) s after the cut: a hang"
      kill -9 "$p"
      rc=1
    fi
    wait "$p" || { echo "not ok - rank $r exited $?"; rc=1; }
    line=$(grep FAILED "$tmp/out.$r" | head -n 1)
    case $line in
      *WEFT_ERR_TIMEOUT* | *WEFT_ERR_PEER_LOST*)
        echo "$line" | grep -Eq "peer [0-9]|rank [0-9]" ||
          { echo "not ok - rank $r names no peer"; rc=1; } ;;
      *) echo "not ok - rank $r did not fail as it should: ${line:-nothing}"; rc=1 ;;
    esac
    echo "[$r] ${line:-(no failure line)} (ended within $(($(date +%s) - cut_at)) s of the cut)"
    r=$((r + 1))
  done
  pids=""
  [ "$rc" = 0 ] || for r in 0 1 2 3; do tail -n 3 "$tmp/out.$r" "$tmp/err.$r"; done
  [ "$rc" = 0 ] && echo "ok - a rail cut under running allreduces: every rank failed, naming a peer, within ${timeout_s}+${margin} s"
  exit $rc
fi
for r in 0 1 2 3; do
  if [ "$r" -lt 2 ]; then ns=$a host=hostA; else ns=$b host=hostB; fi
  ip netns exec "$ns" env WEFT_RANK=$r WEFT_SIZE=4 WEFT_RENDEZVOUS="$net0.1:$port" \
    WEFT_HOST_ID=$host WEFT_SOCKET_IFNAME="$ifnames" WEFT_TIMEOUT=30 WEFT_DEBUG=NONE \
    timeout -k 5 150 "$prog" "$words" >"$tmp/out.$r" 2>"$tmp/err.$r" &
  pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
pids=""
for r in 0 1 2 3; do
  sed "s/^/[$r] /" "$tmp/out.$r"
  sed "s/^/[$r] err: /" "$tmp/err.$r"
done
d0=$(($(tx wr0) - tx0)) d1=$(($(tx wr1) - tx1))
echo "host A sent $d0 bytes on wr0, $d1 on wr1"
[ "$rc" = 0 ] || echo "not ok - a rank failed"
# Each rail carries the pieces of its streams: about half each. A third of
# the total is the floor (the rendezvous and small chunks ride rail 0).
total=$((d0 + d1))
if [ "$total" -lt 50000000 ] || [ $((d0 * 3)) -lt "$total" ] || [ $((d1 * 3)) -lt "$total" ]; then
  echo "not ok - the rails do not share the bytes (wr0 $d0, wr1 $d1)"
  rc=1
fi
[ "$rc" = 0 ] && echo "ok - 4 ranks on 2 hosts over 2 rails: results correct, both links carried bytes"
exit $rc
