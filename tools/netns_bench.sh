#!/bin/sh
# netns_bench.sh - allreduce between two pretend hosts on this machine: two
# network namespaces joined by a veth pair (optionally capped with tbf),
# R ranks in each, weft-bench --peers once per WEFT_ALGO. Shows what the
# hierarchical allreduce saves on the link. Needs root; removes its
# namespaces on exit.
#   sudo R=2 RATE=2gbit sh tools/netns_bench.sh [build-dir]
# Environment: R (ranks per host, 2), RATE (tbf rate, empty = unlimited),
# ALGOS ("hier ring rd"), BEG/END/F (weft-bench sizes, 8 / 64M / 8388608).
set -u
build=${1:-build}
bench=$build/tools/weft-bench
[ -x "$bench" ] || { echo "no $bench: build first" >&2; exit 1; }
R=${R:-2} RATE=${RATE:-}
tag=$$ a=wnb_a_$$ b=wnb_b_$$
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -f /tmp/wnb.$tag.*; }
trap cleanup EXIT INT TERM
ip netns add "$a" && ip netns add "$b" || exit 1
ip link add "wa$tag" netns "$a" type veth peer name "wb$tag" netns "$b" || exit 1
ip -n "$a" addr add 10.77.1.1/24 dev "wa$tag" && ip -n "$b" addr add 10.77.1.2/24 dev "wb$tag" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "wa$tag" up && ip -n "$b" link set "wb$tag" up || exit 1
if [ -n "$RATE" ]; then
  ip netns exec "$a" tc qdisc add dev "wa$tag" root tbf rate "$RATE" burst 128kb latency 50ms
  ip netns exec "$b" tc qdisc add dev "wb$tag" root tbf rate "$RATE" burst 128kb latency 50ms
fi
n=$((2 * R)) port=$((30000 + tag % 20000))
for algo in ${ALGOS:-hier ring rd}; do
  echo "== WEFT_ALGO=$algo: $n ranks (2 hosts x $R), link ${RATE:-unlimited}"
  pids=""
  r=0
  while [ "$r" -lt "$n" ]; do
    if [ "$r" -lt "$R" ]; then ns=$a host=hostA lr=$r; else ns=$b host=hostB lr=$((r - R)); fi
    ip netns exec "$ns" env WEFT_RANK=$r WEFT_SIZE=$n WEFT_LOCAL_RANK=$lr \
      WEFT_RENDEZVOUS=10.77.1.1:$port WEFT_HOST_ID=$host WEFT_ALGO="$algo" WEFT_DEBUG=NONE \
      timeout 300 "$bench" --peers -c allreduce -b "${BEG:-8}" -e "${END:-64M}" -f "${F:-8388608}" \
      >"/tmp/wnb.$tag.$r" 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
  done
  for p in $pids; do wait "$p"; done
  grep -v "^#" "/tmp/wnb.$tag.0"
  port=$((port + 1))
done
