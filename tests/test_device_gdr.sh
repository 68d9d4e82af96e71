#!/bin/sh
# test_device_gdr.sh WEFTRUN DEVICE_CHECK - every collective x dtype x op on
# device buffers over verbs (tools/weft_device_check.c), on the verbs
# emulator and the CUDA stand-in together (WEFT_IB_LIBRARY and
# WEFT_CUDA_LIBRARY, set by meson): GPUDirect RDMA (issue 47).
#
# With WEFT_TRANSPORT=ibv every pair of ranks is linked by verbs, so calls
# on device buffers take the device channel: the host algorithms run on the
# buffers where they lie, chunks go from GPU memory to GPU memory through the
# emulated NIC (dma-buf registrations of the stand-in's memory), and the
# reductions are kernels. Each run says which way it went and every result
# must be right:
#   - registered (also with 3 queue pairs a peer served in random order:
#     a chunk's tag and data go on one, in order): dma-bufs exported and none left open at exit, "chunks land
#     in GPU memory" on every rank;
#   - a NIC without dma-buf (IBV_EMU_CONFIG=no_dmabuf): one warning per rank
#     naming the device and the reason, both ends staged, still right;
#   - WEFT_IB_GDR=off: the device channel is not taken (staged through host
#     memory as before), no dma-buf exported;
#   - sources from cuMemCreate (WEFT_DEVICE_CHECK_VMM=1), which the stand-in
#     does not export: those chunks are copied down first, still right;
#   - gradient sets and messages over verbs;
#   - WEFT_IB_GDR_FLUSH=0 leaves out the flush: the emulator keeps a NIC's
#     writes into GPU memory from the GPU until a read flushes them, so the
#     results must come out wrong (the check that the flush is what makes
#     them right);
#   - two hosts (network namespaces joined by a veth pair, this test's own,
#     removed at the end; where they cannot be made those runs are skipped
#     and said so): 1 and 2 ranks a host over verbs, and 2 a host over tcp
#     (staged); and 2 a host as a cluster has them, hwloc shown an RDMA NIC
#     (tests/topo/rdma_host.xml: verbs between the hosts, shm within): the
#     hierarchical allreduce and broadcast (CUDA IPC within a host, the
#     device channel between the leaders) on every rank, its IPC handles opened and none
#     left open, every result right, cuMemCreate buffers (bounced) and
#     gradient sets too; with every IPC open refused (WEFT_CUDA_EMU_IPC=0)
#     every rank fails, saying the buffers cannot be mapped.
set -u
weftrun=${1:?usage: test_device_gdr.sh WEFTRUN DEVICE_CHECK}
check=${2:?usage: test_device_gdr.sh WEFTRUN DEVICE_CHECK}
[ -n "${WEFT_IB_LIBRARY:-}" ] && [ -n "${WEFT_CUDA_LIBRARY:-}" ] || {
  echo "WEFT_IB_LIBRARY and WEFT_CUDA_LIBRARY must name the emulator and the stand-in"
  exit 1
}
tmp=$(mktemp -d)
a= b=
cleanup() {
  [ -n "$a" ] && ip netns del "$a" 2>/dev/null
  [ -n "$b" ] && ip netns del "$b" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
out=$tmp/out report=$tmp/report
rc=0
sum_of() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) s += $(i + 1)} END {print s + 0}' "$report"; }
# verdict BAD LINE: the run's line, with the output's first lines when BAD is set
verdict() {
  if [ -n "$1" ]; then
    echo "FAIL $2"
    grep -v ' INFO ' "$out" | head -20
    rc=1
  else
    echo "ok - $2"
  fi
}
passed() { grep -c 'device-check: rank [0-9]*: [0-9]* passed, 0 failed' "$out"; }

# run N WANT [--mode ARGS] [VAR=VALUE ...]
run() {
  n=$1 want=$2
  shift 2
  mode= envs=
  for x in "$@"; do
    case $x in
      *=*) envs="$envs $x" ;;
      *) mode="$mode $x" ;;
    esac
  done
  rm -f "$report"
  env WEFT_TRANSPORT=ibv WEFT_CUDA_EMU_REPORT="$report" WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=NET,INIT $envs \
    "$weftrun" -n "$n" --timeout 240 "$check" $mode > "$out" 2>&1
  status=$?
  landed=$(grep -c 'chunks land in GPU memory' "$out")
  staged=$(grep -c 'chunks land in host memory' "$out")
  channel=$(grep -c "calls on device buffers take ibv's device channel" "$out")
  warned=$(grep -c 'WARN .*GPUDirect RDMA refused for device 0' "$out")
  ok=$(passed)
  line="$n ranks${envs:+ ($envs )}${mode:+ [$mode ]}: $ok of $n ranks right, device channel on $channel,"
  line="$line GPU-ring connections $landed, staged $staged, refusals said $warned,"
  line="$line dma-bufs exported $(sum_of dmabuf_exported), left open $(sum_of dmabuf_open)"
  bad=
  case $want in
    gdr) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$channel" = "$n" ] && [ "$landed" -gt 0 ] &&
           [ "$staged" = 0 ] && [ "$(sum_of dmabuf_exported)" -gt 0 ] && [ "$(sum_of dmabuf_open)" = 0 ] || bad=1 ;;
    refused) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$channel" = "$n" ] && [ "$landed" = 0 ] &&
               [ "$staged" -gt 0 ] && [ "$warned" = "$n" ] || bad=1 ;;
    off) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$channel" = 0 ] && [ "$(sum_of dmabuf_exported)" = 0 ] || bad=1 ;;
    right) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$channel" = "$n" ] || bad=1 ;;
    exit0) # the modes that judge themselves (--in-flight, --order, --fault): their exit status
      line="$line; $(grep -m1 -o 'device-check: [a-z -]*: rank 0: .*' "$out" | cut -c1-120)"
      [ "$status" = 0 ] && [ "$channel" = "$n" ] || bad=1 ;;
    fault) failed=$(grep -c 'device-check: fault: rank .*: WEFT_ERR' "$out")
           named=$(grep 'device-check: fault: rank' "$out" | grep -c 'CUDA_ERROR_ILLEGAL_ADDRESS')
           line="$line; ranks failed: $failed, naming the kernel's fault: $named"
           [ "$status" = 0 ] && [ "$failed" = "$n" ] && [ "$named" -gt 0 ] || bad=1 ;;
    wrong) wrong=$(grep -c 'device-check: rank [0-9]*: [0-9]* passed, [1-9][0-9]* failed' "$out")
           line="$line; ranks with wrong results: $wrong"
           [ "$wrong" -gt 0 ] || bad=1 ;;
  esac
  verdict "$bad" "$line"
}

run 2 gdr
run 3 gdr --quick
run 3 gdr --quick IBV_EMU_CONFIG=reorder WEFT_IB_QPS_PER_PEER=3
run 4 gdr --quick
run 2 refused --quick IBV_EMU_CONFIG=no_dmabuf
run 2 off --quick WEFT_IB_GDR=off
run 2 right --quick WEFT_DEVICE_CHECK_VMM=1
run 3 right --grad 10
run 2 right --p2p 12
run 2 exit0 --in-flight 2000
run 2 exit0 --order 10
run 3 fault --fault WEFT_CUDA_EMU_KERNEL_FAULT=5 WEFT_CUDA_EMU_FAULT_RANK=1 WEFT_TIMEOUT=20
run 2 wrong --quick WEFT_IB_GDR_FLUSH=0

# ---- two hosts: network namespaces joined by a veth pair ----
ns_skip() {
  echo "ok - SKIP two hosts: $*"
  exit $rc
}
[ "$(id -u)" = 0 ] || ns_skip "needs root to create network namespaces"
command -v ip >/dev/null || ns_skip "needs the ip command (iproute2)"
tag=$$
net=10.$((150 + tag % 50)).$((tag % 250)).0
addr_a=${net%.0}.1 addr_b=${net%.0}.2
ip netns add "weft_g_a_$tag" 2>/dev/null || ns_skip "cannot create network namespaces here"
a=weft_g_a_$tag
ip netns add "weft_g_b_$tag" || exit 1
b=weft_g_b_$tag
ip link add "ga$tag" netns "$a" type veth peer name "gb$tag" netns "$b" || ns_skip "cannot create a veth pair"
ip -n "$a" addr add "$addr_a/24" dev "ga$tag" && ip -n "$b" addr add "$addr_b/24" dev "gb$tag" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$a" link set "ga$tag" up && ip -n "$b" link set "gb$tag" up || exit 1

# hosts PER_HOST TRANSPORT WANT [ARGS]: 2 hosts x PER_HOST ranks, started by hand
hosts() {
  per=$1 tp=$2 want=$3
  shift 3
  mode= envs=
  for x in "$@"; do
    case $x in
      *=*) envs="$envs $x" ;;
      *) mode="$mode $x" ;;
    esac
  done
  n=$((2 * per))
  port=$((20000 + (tag + per) % 20000))
  rm -f "$report"
  pids=
  r=0
  while [ "$r" -lt "$n" ]; do
    if [ "$r" -lt "$per" ]; then ns=$a host=hostA; else ns=$b host=hostB; fi
    # auto: hwloc is shown an RDMA NIC (tests/topo/rdma_host.xml), so verbs
    # links the hosts and shm a host's ranks, as on a cluster
    topo= debug=INFO
    [ "$tp" = auto ] && topo="HWLOC_XMLFILE=$(dirname "$0")/topo/rdma_host.xml" debug=TRACE
    ip netns exec "$ns" env $topo $envs WEFT_RANK=$r WEFT_SIZE=$n WEFT_RENDEZVOUS="$addr_a:$port" WEFT_HOST_ID=$host \
      WEFT_TRANSPORT=$tp WEFT_TIMEOUT=60 WEFT_CUDA_EMU_REPORT="$report" WEFT_DEBUG=$debug WEFT_DEBUG_SUBSYS=NET,INIT,COLL \
      timeout -k 5 200 "$check" $mode > "$tmp/out.$r" 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
  done
  status=0
  for p in $pids; do wait "$p" || status=1; done
  cat "$tmp"/out.* > "$out"
  [ -z "${WEFT_TEST_KEEP:-}" ] || cp "$out" "$WEFT_TEST_KEEP.$want.$per"
  ok=$(passed)
  landed=$(grep -c 'chunks land in GPU memory' "$out")
  channel=$(grep -c "calls on device buffers take ibv's device channel" "$out")
  hier=$(grep -c "allreduces and broadcasts on device buffers take CUDA IPC within a host and ibv's device channel" "$out")
  ran=$(grep -c 'hier, cuda ipc and the device channel' "$out")
  opened=$(sum_of ipc_opened) left=$(sum_of ipc_mappings)
  line="2 hosts x $per ranks over $tp${envs:+ ($envs )}${mode:+ [$mode ]}: $ok of $n ranks right, device channel on $channel, hierarchical on $hier"
  line="$line (calls traced $ran), GPU-ring connections $landed, IPC handles opened $opened, left open $left"
  bad=
  case $want in
    gdr) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$channel" = "$n" ] && [ "$landed" -gt 0 ] || bad=1 ;;
    staged) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$channel" = 0 ] || bad=1 ;;
    fails) failed=$(grep -c 'WEFT_ERR' "$out")
           line="$line; ranks that failed: $failed, saying: $(grep -m1 -o 'cannot be mapped over CUDA IPC[^;]*' "$out")"
           [ "$status" != 0 ] && [ "$failed" -gt 0 ] && grep -q 'cannot be mapped over CUDA IPC' "$out" || bad=1 ;;
    hier) [ "$status" = 0 ] && [ "$ok" = "$n" ] && [ "$hier" = "$n" ] && [ "$landed" -gt 0 ] &&
            [ "$opened" -gt 0 ] && [ "$left" = 0 ] && [ "$ran" -gt 0 ] || bad=1 ;;
  esac
  verdict "$bad" "$line"
}
hosts 1 ibv gdr
hosts 2 ibv gdr --quick
hosts 2 tcp staged --quick
hosts 2 auto hier
hosts 2 auto hier --quick WEFT_DEVICE_CHECK_VMM=1
hosts 2 auto hier --grad 10
hosts 2 auto fails --quick WEFT_CUDA_EMU_IPC=0
exit $rc
