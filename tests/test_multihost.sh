#!/bin/sh
# test_multihost.sh RANK_PROGRAM - two "hosts" on one machine: network
# namespaces joined by a veth pair, two ranks in each, host ids differing.
# Ranks of one host must use shared memory, across hosts TCP; allreduce and
# broadcast must be right; and the TCP connections between the hosts keep
# the system's congestion control (WEFT_TCP_CONGESTION=auto changes only
# those to this host's own addresses), at both ends. The namespaces and addresses are this test's own
# and are removed at the end. Exits 77 (skipped) where namespaces cannot be
# made (not root, no ip, no netns support), saying why.
set -u
prog=${1:?usage: test_multihost.sh RANK_PROGRAM}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs the ip command (iproute2)"

tag=$$
a=weft_t_a_$tag b=weft_t_b_$tag
net=10.$((200 + tag % 50)).$((tag % 250)).0
addr_a=${net%.0}.1 addr_b=${net%.0}.2
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$tmp"
}
tmp=$(mktemp -d)
trap cleanup EXIT INT TERM
ip netns add "$a" 2>/dev/null || skip "cannot create network namespaces here"
ip netns add "$b" || exit 1
ip link add "wa$tag" netns "$a" type veth peer name "wb$tag" netns "$b" || skip "cannot create a veth pair"
ip -n "$a" addr add "$addr_a/24" dev "wa$tag" && ip -n "$b" addr add "$addr_b/24" dev "wb$tag" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$a" link set "wa$tag" up && ip -n "$b" link set "wb$tag" up || exit 1

port=$((20000 + tag % 20000))
pids=""
for r in 0 1 2 3; do
  if [ "$r" -lt 2 ]; then ns=$a host=hostA; else ns=$b host=hostB; fi
  ip netns exec "$ns" env WEFT_RANK=$r WEFT_SIZE=4 WEFT_RENDEZVOUS="$addr_a:$port" \
    WEFT_HOST_ID=$host WEFT_TIMEOUT=30 WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=NET timeout -k 5 60 "$prog" 2 >"$tmp/out.$r" 2>"$tmp/err.$r" &
  pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
for r in 0 1 2 3; do
  sed "s/^/[$r] /" "$tmp/out.$r"
  grep -v " INFO " "$tmp/err.$r" | sed "s/^/[$r] err: /"
done
# each rank connects by tcp to the other host's two ranks
cc=$(ip netns exec "$a" cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null)
lines=$(cat "$tmp"/err.* | grep -c "connected to peer")
other=$(cat "$tmp"/err.* | grep "connected to peer" | grep -vc "congestion control $cc (")
echo "tcp connections up: $lines, with the system's congestion control ($cc): $((lines - other))"
if [ "$lines" -lt 8 ] || [ "$other" != 0 ]; then
  cat "$tmp"/err.* | grep "connected to peer"
  echo "expected 8 connections with congestion control $cc"
  rc=1
fi
[ "$rc" = 0 ] && echo "ok - 4 ranks on 2 hosts: shm within a host, tcp across, results correct"
exit $rc
