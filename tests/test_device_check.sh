#!/bin/sh
# test_device_check.sh WEFTRUN DEVICE_CHECK - every collective x dtype x op on
# device buffers (tools/weft_device_check.c) on the CUDA stand-in, whose
# device memory the host cannot touch and whose work runs late: 1, 2 and 3
# ranks over shm, 2 over tcp. WEFT_CUDA_LIBRARY names the stand-in.
#
# Over shm every collective works on the device buffers in place (CUDA IPC,
# the direct rounds: the 3-rank run's trace must show each of the eight
# take them); each process of the stand-in appends its counters at
# exit (WEFT_CUDA_EMU_REPORT), so the runs also show which path ran and that
# every IPC mapping was closed by weft_comm_destroy:
#   - by default over shm: IPC handles opened, none left open;
#   - WEFT_CUDA_IPC=0: none opened (staged through host memory: pinned
#     shared memory, which the peers map, so an allreduce from
#     WEFT_DIRECT_MIN_BYTES, 4 KiB here, is the direct one of shared buffers);
#   - WEFT_CUDA_EMU_IPC=0 (every open refused, as between GPUs without
#     peer access): none opened, and every result still right (the ranks
#     stage their buffers after all, in the same call, into pinned shared
#     memory, and the collective's host algorithm runs: the allreduce's,
#     the direct one again, on the staged copies).
# And staged allreduces, broadcasts and reduces in slices (WEFT_DEVICE_SLICE_BYTES=4096 over tcp, the
# full counts: up to 64 slices a call), each slice copied off, reduced and
# copied back on its own: every result right, and the calls said they ran so.
# And 2 ranks as 2 pretend hosts with f32 carried as bf16 between them: the
# staged recursive doubling copies its input once it has arrived (it once
# copied at its start, before the staged copy landed: NaN on the first call).
# And --mixed: rank 0 passes host memory, the others device memory, over shm:
# every rank fails, and the words say to pass one kind on every rank.
# And --resnet: ResNet-50's 161 gradients as one non-blocking allreduce each,
# issued together, over CUDA IPC (sizes that grow call by call: the device
# scratch a call in flight uses must outlive a later call's growth); the
# buffers registered (weft_comm_register), so each peer buffer is opened
# once and each own buffer's handle exported once, not again every step,
# then deregistered and freed. And the same lent (not registered): each
# call's peer buffers opened and closed again within the call. Every run
# frees device buffers after its calls, and the stand-in aborts a cuMemFree
# of memory another process still has open (before issue 45's fix, peers
# kept every buffer mapped until the connection ended: every run aborted).
# And --in-flight: 10,000 non-blocking allreduces issued before any wait
# over shm (IPC) and over tcp (staged), every result right (issue 45: the
# 256-event ring of the communicator's stream once made the 256th a
# half-built call: a crash or a hang; and over tcp, with one stream for
# issue-time and run-time work and the staging pool unlocked, both ranks
# waited in call #1 until the timeout in 2 of 8 runs at 9,000).
# And --order: the stream order of non-blocking calls (issue 45), 20 rounds
# over shm (IPC), over tcp (staged) and 3 ranks staged in slices through
# shared pinned memory: a read queued on the user's stream after a
# weft_iallreduce and synchronized before weft_wait must see the sum, and
# weft_wait of a call must complete while the stream is held by a gate the
# program queued after it (before the fix: stale reads in every run, and a
# WEFT_ERR_TIMEOUT); and with every IPC open refused, so each call is staged
# after all as it runs: its copies then go on the run stream, as the stream
# of issue-time work holds later calls' waits for the user's stream, which
# wait for this call (there, weft_wait(A) timed out before the fix; and
# 2,000 such calls in flight). The stand-in aborts a synchronize stuck for
# WEFT_CUDA_EMU_HANG_S, naming the wait, instead of hanging.
# And WEFT_CUDA_EMU_LEGACY_IPC=0: no device memory has a legacy IPC handle,
# weft's own neither: every call staged after all, every result right, and
# the warning once per process, not per call.
# And --grad N (issue 46): N gradient sets of random shape on device memory
# (10-150 tensors, 4 float dtypes, owned storage or copies, prediv 0/2/4,
# the communicator's stream or the set's own, check_every_step, device
# parameters broadcast every step), each rank marking its tensors ready in
# its own order right after queuing their fill, not waited for; three steps,
# the second a no_sync one in half the sets, the third ended by
# weft_grad_wait_stream: every
# element equal to the reference and to the same set on host memory, 1 to 4
# ranks, shm (IPC), tcp (staged), cuMemCreate memory (bounced), and 4 ranks
# as 2 pretend hosts (WEFT_DEVICE_CHECK_HOSTS: shm within, tcp across, the
# sets' random wire dtype f32/bf16/f16 applied between them); a set run
# twice leaves the stand-in's allocation and event counts alone; mixed kinds
# refused. Taken out, each of these failed it: the stream form's link
# (455,171 of 2,259,174 wrong), the host form's wait for its unpacks (9,199),
# the unpack's scaling (98,840), the pack's stream order (80,822), the
# device parameters' broadcast (68,310).
# And --grad-overlap: the set's stream goes on while every bucket is in
# flight (with each bucket linked into it at issue, as an ordinary call is,
# it was held 2.5 s, until the peers woke), and bucket 0 is reduced while a
# 1.5 s kernel still holds back the last gradient.
# And --p2p N: messages between device buffers (weft_send/weft_recv, both
# forms), around the ring and to itself, random sizes (up to 6 MiB) and
# dtypes: within a host the large ones lent over CUDA IPC (the receiver
# copies out of the sender's buffer), the rest staged through pinned host
# memory; the send buffer's fill and a memset of the receive buffer queued
# right before and never waited for (with either ordering taken out,
# 150,000 to 2,532,467 elements were wrong); and a receive posted 0.3 s
# late, the sender overwriting its buffer once its send completed (with
# the sender not waiting for the receiver's release of the lent buffer:
# 1,572,864 elements wrong). Over shm, IPC handles opened, none left open.
# And --grad-fault: one rank's N-th kernel faults (a pack, unpack or
# reduction): every rank's step fails naming a bucket; --grad-skip: one rank
# skips a step's reduction: every rank fails naming both steps. Both: a rank
# whose own kernels did not fault has a usable GPU after the set's destroy
# (before the fix, the destroy freed a piece table that a pack queued for a
# bucket whose call failed to start still read: the context faulted).
# And --foreign-ctx: a NULL stream while a context the program made
# (cuCtxCreate) is current: refused on every rank, naming the rule (its NULL
# stream is not the primary context's, which weft orders after), the
# caller's context current again after; then in the primary context, right.
# And WEFT_DEVICE_CHECK_VMM=1: the program's buffers from cuMemCreate and
# cuMemMap, as PyTorch's expandable segments make them (no legacy IPC
# handle; freed addresses mapped again to new memory): each call copies its
# input into weft's device memory, which the peers map, runs over IPC
# there and copies the result back, device to device (issue 45, item 6:
# before, staged through host memory and unsliced); with the checks of
# --quick, --order (3 ranks), --churn and 2,000 calls in flight.
# And --churn: 1,000 rounds of allocate, allreduce over IPC, free at once
# (sizes that change, so addresses are handed out again): every result
# right, and no peer has a buffer open when its owner frees it.
# And two devices, rank r on device r % 2 (WEFT_DEVICE_CHECK_SPREAD): every
# collective over IPC between the GPUs.
# And --host-only: ranks that pass host memory only, with the stand-in
# loaded, over shm and tcp: every result right, and no process holds a
# primary context at exit (primary_refs 0: before, classifying a pointer
# retained device 0's context for good, about 500 MB of a real GPU).
# And --fault: one rank's 5th kernel faults (the stand-in's
# WEFT_CUDA_EMU_KERNEL_FAULT, CUDA_ERROR_ILLEGAL_ADDRESS): the call fails on
# every rank, within WEFT_TIMEOUT, naming the driver's error.
set -u
weftrun=$1 check=$2
[ -n "${WEFT_CUDA_LIBRARY:-}" ] || { echo "skipped: no stand-in"; exit 77; }
out=/tmp/weft-device-check.$$ report=/tmp/weft-device-report.$$
rc=0
# the report's sum of one counter over every process
sum_of() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) s += $(i + 1)} END {print s + 0}' "$report"; }
for run in "1 shm -" "2 shm ipc" "3 shm ipcall --quick WEFT_DEBUG=TRACE" "2 tcp - --quick" \
           "2 shm mixed --mixed WEFT_TIMEOUT=20" "3 shm mixed --mixed WEFT_TIMEOUT=20" \
           "2 shm resnet --resnet WEFT_TIMEOUT=60" "2 shm resnet-lent --resnet-lent WEFT_TIMEOUT=60" \
           "2 shm fault --fault WEFT_CUDA_EMU_KERNEL_FAULT=5 WEFT_CUDA_EMU_FAULT_RANK=1 WEFT_TIMEOUT=20" \
           "3 shm fault --fault WEFT_CUDA_EMU_KERNEL_FAULT=5 WEFT_CUDA_EMU_FAULT_RANK=2 WEFT_TIMEOUT=20" \
           "2 shm noipc --quick WEFT_CUDA_IPC=0 WEFT_DIRECT_MIN_BYTES=4096 WEFT_DEBUG=INFO" \
           "3 shm refused --quick WEFT_CUDA_EMU_IPC=0 WEFT_DIRECT_MIN_BYTES=4096 WEFT_DEBUG=INFO" \
           "2 tcp sliced WEFT_DEVICE_SLICE_BYTES=4096 WEFT_DEBUG=TRACE" \
           "2 shm inflight --in-flight=10000 WEFT_TIMEOUT=60" "2 tcp inflight --in-flight=10000 WEFT_TIMEOUT=60" \
           "2 shm order --order=20 WEFT_TIMEOUT=20 WEFT_CUDA_EMU_HANG_S=60" \
           "2 tcp order --order=20 WEFT_TIMEOUT=20 WEFT_CUDA_EMU_HANG_S=60" \
           "2 shm hostonly --host-only" "2 tcp hostonly --host-only" \
           "2 shm nolegacy --quick WEFT_CUDA_EMU_LEGACY_IPC=0 WEFT_DEBUG=WARN" "2 shm churn --churn=1000" \
           "2 shm spread --quick WEFT_CUDA_EMU_DEVICES=2 WEFT_DEVICE_CHECK_SPREAD=1" \
           "3 shm order --order=10,100000 WEFT_CUDA_IPC=0 WEFT_DEVICE_SLICE_BYTES=16384 WEFT_TIMEOUT=20" \
           "2 shm order --order=10 WEFT_CUDA_EMU_IPC=0 WEFT_TIMEOUT=20" \
           "2 shm inflight --in-flight=2000 WEFT_CUDA_EMU_IPC=0 WEFT_TIMEOUT=60" \
           "2 shm vmm --quick WEFT_DEVICE_CHECK_VMM=1 WEFT_DEBUG=TRACE" \
           "3 shm order --order=10,100000 WEFT_DEVICE_CHECK_VMM=1 WEFT_TIMEOUT=20" \
           "2 shm churn --churn=300 WEFT_DEVICE_CHECK_VMM=1" \
           "2 shm inflight --in-flight=2000 WEFT_DEVICE_CHECK_VMM=1 WEFT_TIMEOUT=60" \
           "2 shm foreignctx --foreign-ctx WEFT_TIMEOUT=20" \
           "1 shm grad --grad=10" "2 shm grad --grad=20" "3 tcp grad --grad=20" "4 shm grad --grad=10" \
           "2 shm grad --grad=10 WEFT_DEVICE_CHECK_VMM=1" "4 auto grad --grad=10 WEFT_DEVICE_CHECK_HOSTS=2" \
           "2 auto - --quick WEFT_DEVICE_CHECK_HOSTS=2 WEFT_WIRE_DTYPE=bf16" \
           "2 shm gradoverlap --grad-overlap" "2 tcp gradoverlap --grad-overlap" \
           "3 shm gradfault --grad-fault WEFT_CUDA_EMU_KERNEL_FAULT=6 WEFT_CUDA_EMU_FAULT_RANK=1 WEFT_TIMEOUT=20" \
           "3 tcp gradfault --grad-fault WEFT_CUDA_EMU_KERNEL_FAULT=8 WEFT_CUDA_EMU_FAULT_RANK=1 WEFT_TIMEOUT=20" \
           "2 shm gradskip --grad-skip WEFT_TIMEOUT=20" "3 tcp gradskip --grad-skip WEFT_TIMEOUT=20" \
           "1 shm p2p --p2p=12" "2 shm p2p --p2p=24" "3 shm p2p --p2p=12" "3 tcp p2p --p2p=24"; do
  set -- $run
  n=$1 tp=$2 want=$3
  shift 3
  quick= envs=
  for a in "$@"; do
    case $a in
      --quick|--mixed|--fault|--host-only|--foreign-ctx|--grad-overlap|--grad-fault|--grad-skip) quick=$a ;;
      --in-flight=*) quick="--in-flight ${a#--in-flight=}" ;;
      --order=*) quick="--order $(echo "${a#--order=}" | tr , ' ')" ;;
      --churn=*) quick="--churn ${a#--churn=}" ;;
      --grad=*) quick="--grad ${a#--grad=}" ;;
      --p2p=*) quick="--p2p ${a#--p2p=}" ;;
      --resnet) quick="--resnet $(dirname "$0")/../tools/data/resnet50_grads.tsv" ;;
      --resnet-lent) quick="--resnet $(dirname "$0")/../tools/data/resnet50_grads.tsv lent" ;;
      *=*) envs="$envs $a" ;;
    esac
  done
  rm -f "$report"
  if env WEFT_TRANSPORT=$tp WEFT_CUDA_EMU_REPORT="$report" $envs \
      "$weftrun" -n "$n" --timeout 240 "$check" $quick > "$out" 2>&1; then
    line="$n ranks over $tp${envs:+ ($envs )}: $(grep -m1 'device-check: rank 0:' "$out" | sed 's/.*rank 0: //')"
    [ "$want" != resnet-lent ] || line="$n ranks over $tp: $(grep -m1 'resnet:' "$out" | sed 's/.*resnet: //')"
    [ "$want" != resnet ] || line="$n ranks over $tp: $(grep -m1 'resnet:' "$out" | sed 's/.*resnet: //')"
    [ "$want" != fault ] || line="$n ranks over $tp, one rank's 5th kernel faults: $(grep -c 'device-check: fault: rank .*: WEFT_ERR' "$out") of $n ranks failed"
    [ "$want" != hostonly ] || line="$n ranks over $tp, host memory only: $(grep -m1 'device-check: rank 0: host-only:' "$out" | sed 's/.*host-only: //'); CUDA contexts held at exit: $(sum_of primary_refs)"
    [ "$want" != churn ] || line="$n ranks over $tp: $(grep -m1 'device-check: rank 0: churn:' "$out" | sed 's/.*churn: //')"
    [ "$want" != order ] || line="$n ranks over $tp${envs:+ ($envs )}: $(grep -m1 'device-check: rank 0: order:' "$out" | sed 's/.*rank 0: order: //')"
    [ "$want" != inflight ] || line="$n ranks over $tp: $(grep -m1 'device-check: rank 0: in flight:' "$out" | sed 's/.*rank 0: in flight: //')"
    [ "$want" != grad ] || line="$n ranks over $tp: $(grep -m1 'device-check: rank 0: grad:' "$out" | sed 's/.*rank 0: grad: //')"
    [ "$want" != p2p ] || line="$n ranks over $tp: $(grep -m1 'device-check: rank 0: p2p:' "$out" | sed 's/.*rank 0: p2p: //')"
    [ "$want" != gradoverlap ] || line="$n ranks over $tp: $(grep -m1 'device-check: rank 0: grad-overlap:' "$out" | sed 's/.*grad-overlap: //')"
    case $want in gradfault|gradskip)
      line="$n ranks over $tp${envs:+ ($envs )}: $(grep -c 'device-check: grad-fault: rank .*: WEFT_ERR' "$out") of $n ranks failed: $(grep -m1 'device-check: grad-fault: rank 0:' "$out" | cut -c1-160 | sed 's/.*grad-fault: //')..." ;;
    esac
    [ "$want" != foreignctx ] || line="$n ranks over $tp, a NULL stream under a context of the program's own: $(grep -c 'foreign ctx: rank .*WEFT_ERR_INVALID' "$out") of $n ranks refused, $(grep -c 'primary context again: right' "$out") right after"
    [ "$want" != mixed ] || line="$n ranks over $tp, rank 0 with host memory: $(grep -c 'device-check: mixed: rank .*: WEFT_ERR' "$out") of $n ranks failed"
    opened=$(sum_of ipc_opened) left=$(sum_of ipc_mappings)
    line="$line; IPC handles opened $opened, left open $left"
    case $want in
      ipc) [ "$opened" -gt 0 ] && [ "$left" -eq 0 ] || { line="$line: FAILED (want opened > 0, none left)"; rc=1; } ;;
      p2p) # within a host the large messages are lent over CUDA IPC, and closed again
        if [ "$tp" = shm ] && [ "$n" -gt 1 ]; then
          [ "$opened" -gt 0 ] && [ "$left" -eq 0 ] || { line="$line: FAILED (want messages lent over IPC, none left open)"; rc=1; }
        fi ;;
      ipcall) [ "$opened" -gt 0 ] && [ "$left" -eq 0 ] || { line="$line: FAILED (want opened > 0, none left)"; rc=1; }
        for c in allreduce broadcast reduce allgather reduce_scatter gather scatter alltoall; do
          grep -q "weft_$c #[0-9]*: .*direct, cuda ipc algorithm" "$out" ||
            { line="$line: FAILED (weft_$c never ran over CUDA IPC)"; rc=1; }
        done ;;
      resnet) # and each rank opened each peer buffer once (161 tensors, one flat buffer),
        # not again every step (the shm transport's cache of mappings), and
        # exported each of its own once (the memory table's cache of handles)
        exported=$(sum_of ipc_exported)
        line="$line, exported $exported"
        grep -q "resnet: 161 tensors" "$out" && [ "$opened" -le $((n * 162)) ] &&
          [ "$exported" -le $((n * 162)) ] ||
          { line="$line: FAILED (want a figure, at most $((n * 162)) IPC opens and exports)"; rc=1; } ;;
      resnet-lent) # not registered: each call's peer buffers opened and closed again
        # (at least one open per tensor and step), and none left open
        [ "$opened" -ge $((n * 161 * 20)) ] && [ "$left" -eq 0 ] ||
          { line="$line: FAILED (want at least $((n * 161 * 20)) IPC opens, none left open)"; rc=1; } ;;
      fault) # every rank failed, and the words name the driver's error
        [ "$(grep -c 'device-check: fault: rank .*: WEFT_ERR' "$out")" -eq "$n" ] &&
          grep -q "device-check: fault: rank .*CUDA_ERROR_ILLEGAL_ADDRESS" "$out" ||
          { line="$line: FAILED (want every rank to fail, naming CUDA_ERROR_ILLEGAL_ADDRESS)"; rc=1; } ;;
      mixed) # every rank failed, and the words say why
        [ "$(grep -c 'device-check: mixed: rank .*: WEFT_ERR' "$out")" -eq "$n" ] &&
          grep -q "pass device memory on every rank or host memory on every rank" "$out" ||
          { line="$line: FAILED (want every rank to fail, naming the memory kinds)"; rc=1; } ;;
      noipc) # none opened; the staged copies in shared pinned memory, which the
        # peers mapped (the direct allreduce of shared buffers)
        [ "$opened" -eq 0 ] && [ "$left" -eq 0 ] && grep -q "mapped .* bytes that peer .* shares" "$out" ||
          { line="$line: FAILED (want none opened, the staged copies mapped by peers)"; rc=1; } ;;
      nolegacy) # no IPC handle to open: every call staged, and said once per rank, not
        # once per call (1,112 warnings in this run before)
        said=$(grep -c 'no legacy IPC handle' "$out")
        line="$line; the warning said $said times"
        [ "$opened" -eq 0 ] && [ "$said" -ge 1 ] && [ "$said" -le "$n" ] ||
          { line="$line: FAILED (want none opened, the warning said, at most once per rank)"; rc=1; } ;;
      foreignctx) # a NULL stream under a context of the program's own: refused on every
        # rank naming the rule, the caller's context left current; then right
        [ "$(grep -c 'foreign ctx: rank .*: WEFT_ERR_INVALID: .*no device.s primary context.*context restored: yes' "$out")" -eq "$n" ] &&
          [ "$(grep -c 'foreign ctx: rank .*primary context again: right' "$out")" -eq "$n" ] ||
          { line="$line: FAILED (want every rank to refuse, naming the context, then a right sum)"; rc=1; } ;;
      vmm) # cuMemCreate memory: no handle of its own, so each call works on a copy
        # in memory the peers can map (opened, none left), said once; never
        # staged through the host, never the staging warning
        said=$(grep -c 'no legacy IPC handle' "$out")
        [ "$opened" -gt 0 ] && [ "$left" -eq 0 ] && [ "$said" -eq 0 ] &&
          grep -q "copied into device memory the peers can map" "$out" &&
          grep -q "weft_allreduce #[0-9]*: .*direct, cuda ipc algorithm" "$out" &&
          ! grep -q "staged after all" "$out" ||
          { line="$line: FAILED (want the calls over IPC on copies, none staged)"; rc=1; } ;;
      gradfault|gradskip) # every rank failed, each naming the bucket (the steps)
        [ "$(grep -c 'device-check: grad-fault: rank .*: WEFT_ERR' "$out")" -eq "$n" ] &&
          ! grep -q 'device-check: grad-fault: .*(want' "$out" ||
          { line="$line: FAILED (want every rank to fail, saying where)"; rc=1; } ;;
      gradoverlap) grep -q 'grad-overlap: A: .*still running); B: .*(not made yet)' "$out" ||
          { line="$line: FAILED (want the stream to go on and bucket 0 reduced before the last gradient)"; rc=1; } ;;
      hostonly) [ "$(sum_of primary_refs)" -eq 0 ] ||
          { line="$line: FAILED (want no context held by a rank that passed host memory only)"; rc=1; } ;;
      sliced)
        for c in allreduce broadcast reduce; do
          grep -q "weft_$c #[0-9]*: .*in slices algorithm" "$out" ||
            { line="$line: FAILED (no weft_$c ran in slices)"; rc=1; }
        done ;;
      refused) # none opened, and the ranks said they staged after all
        [ "$opened" -eq 0 ] && [ "$left" -eq 0 ] && grep -q "staged after all" "$out" &&
          grep -q "mapped .* bytes that peer .* shares" "$out" ||
          { line="$line: FAILED (want none opened and the fallback)"; rc=1; } ;;
    esac
    echo "$line"
  else
    echo "$n ranks over $tp${envs:+ ($envs )}: FAILED"
    head -20 "$out"
    rc=1
  fi
done
rm -f "$out" "$report"
exit $rc
