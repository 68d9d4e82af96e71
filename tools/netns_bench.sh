#!/bin/sh
# netns_bench.sh - allreduce between two pretend hosts on this machine: two
# network namespaces joined by one or two veth pairs (optionally each capped
# with tbf), R ranks in each, weft-bench --peers once per WEFT_ALGO. Shows
# what the hierarchical allreduce saves on the link, what a second rail
# adds (RAILS=2: WEFT_SOCKET_IFNAME lists both pairs), and what bf16 on the
# wire saves (WIRE=bf16). Needs root; removes its namespaces on exit.
#   sudo R=2 RATE=2gbit sh tools/netns_bench.sh [build-dir]
#   sudo R=1 RATE=2500mbit RAILS=2 ALGOS=ring sh tools/netns_bench.sh
# Environment: R (ranks per host, 2), RATE (tbf rate of each link, empty =
# unlimited), RAILS (1 or 2 veth pairs, 1), WIRE (WEFT_WIRE_DTYPE, unset),
# ALGOS ("hier ring rd"), BEG/END/F (weft-bench sizes, 8 / 64M / 8388608),
# EXTRA (more VAR=value words for every rank, e.g. "WEFT_TCP_STREAMS=2"),
# QSTATS (set: print each link's queue counters at the end: bytes, drops).
set -u
build=${1:-build}
bench=$build/tools/weft-bench
[ -x "$bench" ] || { echo "no $bench: build first" >&2; exit 1; }
R=${R:-2} RATE=${RATE:-} RAILS=${RAILS:-1} WIRE=${WIRE:-} EXTRA=${EXTRA:-}
tag=$$ a=wnb_a_$$ b=wnb_b_$$
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -f /tmp/wnb.$tag.*; }
trap cleanup EXIT INT TERM
ip netns add "$a" && ip netns add "$b" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ifnames=""
i=1
while [ "$i" -le "$RAILS" ]; do
  ip link add "wn$i" netns "$a" type veth peer name "wn$i" netns "$b" || exit 1
  ip -n "$a" addr add "10.77.$i.1/24" dev "wn$i" && ip -n "$b" addr add "10.77.$i.2/24" dev "wn$i" || exit 1
  ip -n "$a" link set "wn$i" up && ip -n "$b" link set "wn$i" up || exit 1
  if [ -n "$RATE" ]; then
    for ns in "$a" "$b"; do
      ip netns exec "$ns" tc qdisc add dev "wn$i" root tbf rate "$RATE" burst 128kb latency 50ms || exit 1
    done
  fi
  ifnames="$ifnames${ifnames:+,}=wn$i"
  i=$((i + 1))
done
n=$((2 * R)) port=$((30000 + tag % 20000))
for algo in ${ALGOS:-hier ring rd}; do
  echo "== WEFT_ALGO=$algo: $n ranks (2 hosts x $R), $RAILS link(s) ${RATE:-unlimited} each${WIRE:+, wire $WIRE}${EXTRA:+, $EXTRA}"
  pids=""
  r=0
  while [ "$r" -lt "$n" ]; do
    if [ "$r" -lt "$R" ]; then ns=$a host=hostA lr=$r; else ns=$b host=hostB lr=$((r - R)); fi
    # shellcheck disable=SC2086 # EXTRA is a list of words
    ip netns exec "$ns" env WEFT_RANK=$r WEFT_SIZE=$n WEFT_LOCAL_RANK=$lr \
      WEFT_RENDEZVOUS=10.77.1.1:$port WEFT_HOST_ID=$host WEFT_ALGO="$algo" WEFT_DEBUG=NONE \
      WEFT_SOCKET_IFNAME="$ifnames" ${WIRE:+WEFT_WIRE_DTYPE=$WIRE} $EXTRA \
      timeout 300 "$bench" --peers -c allreduce -b "${BEG:-8}" -e "${END:-64M}" -f "${F:-8388608}" \
      >"/tmp/wnb.$tag.$r" 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
  done
  for p in $pids; do wait "$p"; done
  grep -v "^#" "/tmp/wnb.$tag.0"
  port=$((port + 1))
done
if [ -n "${QSTATS:-}" ]; then # what each link's queue saw: bytes, drops, overlimits
  i=1
  while [ "$i" -le "$RAILS" ]; do
    for ns in "$a" "$b"; do
      printf 'wn%s in %s: ' "$i" "$ns"
      ip netns exec "$ns" tc -s qdisc show dev "wn$i" | sed -n 's/^ *Sent/Sent/p'
    done
    i=$((i + 1))
  done
fi
