#!/bin/sh
# gpu_check.sh - what weft's GPU path needs a GPU to show, for a machine we
# never see (../shared/gpu-machine.md: one H100/H200, 16 cores, nvcc 13, no
# CMocka, no network). One command from the repository root:
#
#   sh tools/gpu_check.sh OUTDIR
#
# Builds with CUDA (at most 2 minutes), then runs each stage under its own
# timeout, 5 minutes in all; every log lands in OUTDIR, and the last thing
# printed is one table: each stage PASS / FAIL / SKIP with its reason, and
# each figure beside its target. Without a GPU (CI, a developer's machine)
# every GPU stage is SKIP with the reason and the script exits 0 once the
# build passed; any FAIL, or a failed build, exits 1. Stages:
#   build       meson -Dcuda=enabled -Dtests=false, release
#   info        weft-info: what CUDA support was built and whether it runs here
#   gdr         GPUDirect RDMA's part this machine can show (it has no RDMA NIC):
#               whether GPU 0's memory exports as a dma-buf (weft-device-check
#               --gdr-probe), whether nvidia-peermem is loaded, and what weft-info
#               says verbs would choose (dma-buf, peermem or staged) and why
#   device N    every collective x dtype x op on device buffers, N = 1..4 ranks
#               sharing the GPU (tools/weft_device_check.c), in and out of place;
#               from 2 ranks every collective goes through CUDA IPC (the direct
#               rounds) but an integer avg's, which is staged through pinned host
#               memory
#   tcp         the same over tcp, 2 ranks (--quick)
#   in flight   10,000 non-blocking allreduces issued before any wait, 2 ranks,
#               over CUDA IPC and staged over tcp, every result checked
#   order       the stream order of non-blocking calls (weft-device-check
#               --order): a read queued on the user's stream after the call and
#               synchronized before weft_wait sees the result; weft_wait(A)
#               completes while the stream is held after A; IPC and staged
#   churn       1,000 rounds of allocate, allreduce over CUDA IPC, free at once, 2 ranks
#   two GPUs    every collective with rank r on GPU r % 2 (CUDA IPC between GPUs, or
#               staged where they cannot reach each other); SKIP on a one-GPU machine
#   host only   2 ranks passing host memory only: no rank may hold a CUDA context
#               (nvidia-smi's compute apps, asked while the ranks are alive)
#   sanitizer   compute-sanitizer memcheck on 2 ranks (--quick), after a probe
#               of the tool on a trivial run (SKIP with its words if that fails)
#   bench       weft-bench on device buffers (-G), 8 B / 64 MiB / 256 MiB, 2 and 4
#               ranks, plain (CUDA IPC), staged (WEFT_CUDA_IPC=0: through pinned host
#               memory) and under MPS (the daemon is started and stopped here);
#               a 64 MiB broadcast over IPC and staged; the plain rows register
#               their buffers (weft_comm_register), the "lent" rows do not
#   resnet      the ResNet-50 gradient set as device tensors, 2 ranks: one
#               non-blocking allreduce per tensor, and one flat buffer, the
#               buffers registered (weft_comm_register); then not registered
#               ("resnet lent": each call opens and closes the peers' IPC maps;
#               "resnet vmm": in cuMemCreate memory, bounced through weft's own)
#   grad resnet ResNet-50's set as one device gradient set (weft_grad_*), 2
#               ranks, every gradient ready at once: the host's wait per step
#               (<= 3 ms); "grad backward": a simulated backward (each
#               gradient's memset queued, then marked ready): from the last
#               ready to the end of the wait (<= 1 ms), host and stream forms;
#               "grad mps": at once under MPS; "grad tcp": over tcp (staged)
#               against the same set on host memory (within 10%); "grad
#               example": examples/grad_device.c, 2 ranks, against the host run
#   p2p         weft_send/weft_recv of device buffers, both forms, 2 ranks
#   torch cuda  weft.torch with CUDA tensors (tests/torch/ranks.py --device cuda):
#               every op against a float64 reference, refusals, DDP on CUDA against
#               one process; 2 ranks on one GPU
#   torch premul  tests/torch/frameworks.py --device cuda: PREMUL_SUM (a factor
#               tensor on the GPU read in stream order) and the coalesced calls
#               on CUDA tensors against float64, the same bits on every rank
#   torch grad  tests/torch/grad_reducer.py --device cuda: weft.torch.GradReducer
#               (device gradient buckets, the stream form) against one process
#   torch host  tools/torch_bench.py on CPU tensors, DDP's exposed communication
#               against gloo, 2 and 4 ranks over shm and tcp, as time allows
# The torch stages use /opt/torch/.venv/bin/python3 where it exists (else the
# python3 on PATH); the build finds its torch and builds weft.torch against it.
set -u
cd "$(dirname "$0")/.." || exit 1
out=${1:-/tmp/weft-gpu-check}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
summary="$out/summary.md"
start=$(date +%s)
: > "$out/rows"

row() { # STAGE RESULT WHAT [FIGURE] [TARGET]
  printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "${4:-}" "${5:-}" >> "$out/rows"
  printf 'gpu_check: %-12s %-4s %s %s\n' "$1" "$2" "$3" "${4:-}"
}

# A stage's time left: its own limit, never past the 5 minutes in all.
limit() { # SECONDS
  left=$((300 - ($(date +%s) - start)))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# Whether a stage may start: false, with its SKIP row, once fewer than 10 s
# of the 5 minutes are left (a "timeout 0" would run it without a limit).
time_for() { # STAGE
  left=$((300 - ($(date +%s) - start)))
  [ "$left" -ge 10 ] && return 0
  row "$1" SKIP "no time left in the 5 minutes"
  return 1
}

# grad_resnet STAGE MODE WHAT: ResNet-50's gradient set as one device set
# (weft-device-check --grad-resnet TSV MODE), 2 ranks: the host's wait per
# step with every gradient ready at once (target <= 3 ms), or, with a
# simulated backward, from the last ready to the end of the wait (<= 1 ms)
grad_resnet() {
  log="$out/$(echo "$1" | tr ' ' -).log"
  time_for "$1" || return 0
  timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --grad-resnet \
    tools/data/resnet50_grads.tsv $2 > "$log" 2>&1
  if [ "$2" = backward ]; then
    fig=$(sed -n 's/.* \([0-9.]*\) ms from the last ready to the end of weft_grad_wait.*/\1/p' "$log" | head -1)
    sfig=$(sed -n 's/.* \([0-9.]*\) ms from the last ready to the end of the stream.s work.*/\1/p' "$log" | head -1)
    [ -n "$fig" ] && row "$1" PASS "$3" "$fig ms (stream form: ${sfig:-?} ms)" "<= 1 ms" && return 0
  else
    fig=$(sed -n 's/.* \([0-9.]*\) ms per weft_grad_wait.*/\1/p' "$log" | head -1)
    per=$(sed -n 's/.* \([0-9.]*\) us per weft_grad_ready.*/\1/p' "$log" | head -1)
    [ -n "$fig" ] && row "$1" PASS "$3" "$fig ms per wait, $per us per ready" "<= 3 ms" && return 0
  fi
  row "$1" FAIL "no figure; see $(basename "$log"): $(grep -m1 -i 'fail\|error\|rank' "$log" | cut -c1-150)"
}

finish() {
  {
    echo "# weft gpu_check, $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'
    echo
    echo "| stage | result | what | figure | target |"
    echo "|---|---|---|---|---|"
    cat "$out/rows"
    echo
    echo "logs: $out ($(($(date +%s) - start)) s)"
  } > "$summary"
  echo
  cat "$summary"
  grep -q '| FAIL |' "$out/rows" && exit 1
  exit 0
}

# ---- build ----------------------------------------------------------------
# WEFT_CHECK_BUILD: a build tree to use (configured here if it is not yet);
# the suite shares one between this script's test and host_check.sh's. Not
# under OUTDIR: that folder comes back from the GPU machine, logs only. One
# per source tree (its path's checksum), so two checkouts never share one.
build=${WEFT_CHECK_BUILD:-${TMPDIR:-/tmp}/weft-gpu-check-build-$(pwd | cksum | cut -d' ' -f1)}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH="$PATH:/usr/local/cuda/bin"
  export PATH
fi
# the torch the GPU machine has lives in a venv: first on PATH, meson builds
# weft.torch against it (python/csrc tries /usr/bin/python3, then python3)
tpy=python3
if [ -x /opt/torch/.venv/bin/python3 ]; then
  PATH="/opt/torch/.venv/bin:$PATH"
  export PATH
  tpy=/opt/torch/.venv/bin/python3
fi
if timeout "$(limit 120)" sh -c "{ [ -f '$build/build.ninja' ] || meson setup '$build' --buildtype=release \
      -Dcuda=enabled -Dtests=false -Dpython_package=disabled; } > '$out/build.log' 2>&1 &&
      ninja -C '$build' >> '$out/build.log' 2>&1"; then
  row build PASS "meson -Dcuda=enabled, $(grep -c 'Compiling\|Linking' "$out/build.log") steps, $(($(date +%s) - start)) s"
else
  row build FAIL "see build.log: $(grep -m1 -i 'error' "$out/build.log" | cut -c1-150)"
  finish
fi
bin="$build/tools"

# ---- is there a GPU ----------------------------------------------------------
"$bin/weft-info" > "$out/info.log" 2>&1
cuda_line=$(grep -m1 -i '^cuda' "$out/info.log" || echo "weft-info printed no cuda line")
"$bin/weft-device-check" --probe > "$out/probe.log" 2>&1
probe=$?
if [ "$probe" -eq 77 ]; then
  why=$(sed -n 's/^device-check: SKIP: //p' "$out/probe.log" | head -1)
  row info SKIP "no GPU: $why"
  for s in gdr "device 1" "device 2" "device 3" "device 4" tcp "in flight" order sanitizer bench resnet \
      churn "two GPUs" "host only" "resnet lent" "resnet vmm" "grad resnet" "grad backward" "grad tcp" p2p \
      "grad example" "torch cuda" "torch premul" "torch grad" "torch expandable" "torch host"; do
    row "$s" SKIP "no GPU: $why"
  done
  finish
fi
row info PASS "$cuda_line"

# ---- GPUDirect RDMA: what this GPU and driver allow (no NIC to register with) --
if time_for gdr; then
  log="$out/gdr.log"
  timeout "$(limit 30)" "$bin/weft-device-check" --gdr-probe > "$log" 2>&1
  rc=$?
  gdr_line=$(grep -m1 '^gdr:' "$out/info.log" | sed 's/^gdr: //' | cut -c1-200)
  peermem=no
  if [ -e /sys/module/nvidia_peermem ] || [ -e /sys/kernel/mm/memory_peers/nv_mem/version ]; then peermem=yes; fi
  nics=$(ls /sys/class/infiniband 2>/dev/null | wc -l)
  export_line=$(sed -n 's/^gdr-probe: export: //p' "$log" | cut -c1-200)
  what="dma-buf export: ${export_line:-?}; nvidia-peermem loaded: $peermem; weft-info: ${gdr_line:-no gdr line}; RDMA NICs: $nics (registration with a NIC not tried end to end here)"
  if [ "$rc" -eq 0 ]; then row gdr PASS "$what"; else row gdr FAIL "exit $rc: $what"; fi
fi

# ---- correctness on device buffers -------------------------------------------
for n in 1 2 3 4; do
  time_for "device $n" || continue
  args=""
  [ "$n" -gt 2 ] && args="--quick"
  log="$out/device-$n.log"
  timeout "$(limit 60)" "$bin/weftrun" -n "$n" "$bin/weft-device-check" $args > "$log" 2>&1
  rc=$?
  line=$(grep -m1 'device-check: rank 0' "$log" | sed 's/.*rank 0: //')
  case $rc in
    0) row "device $n" PASS "$n ranks on one GPU, ${line:-?}" ;;
    124) row "device $n" FAIL "timed out; see device-$n.log" ;;
    *) row "device $n" FAIL "exit $rc: $(grep -m1 'FAIL' "$log" | cut -c1-160)" ;;
  esac
done
log="$out/tcp.log"
if time_for tcp; then
  WEFT_TRANSPORT=tcp timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --quick > "$log" 2>&1
  case $? in
    0) row tcp PASS "2 ranks over tcp, $(grep -m1 'device-check: rank 0' "$log" | sed 's/.*rank 0: //')" ;;
    *) row tcp FAIL "see tcp.log: $(grep -m1 'FAIL\|error' "$log" | cut -c1-160)" ;;
  esac
fi

# ---- the promises of calls in flight (issue 45) --------------------------------
for tp in shm tcp; do
  time_for "in flight" || break
  log="$out/in-flight-$tp.log"
  WEFT_TRANSPORT=$tp WEFT_TIMEOUT=60 timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" \
    --in-flight 10000 > "$log" 2>&1
  rc=$?
  line=$(grep -m1 'device-check: rank 0: in flight:' "$log" | sed 's/.*in flight: //')
  if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
    row "in flight" PASS "2 ranks over $tp: $line"
  else
    row "in flight" FAIL "2 ranks over $tp, exit $rc: $(grep -m1 'failed\|refused\|wrong' "$log" | cut -c1-150)"
  fi
done
for tp in shm tcp; do
  time_for order || break
  log="$out/order-$tp.log"
  WEFT_TRANSPORT=$tp WEFT_TIMEOUT=20 timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" \
    --order 20 1048576 > "$log" 2>&1
  rc=$?
  line=$(grep -m1 'device-check: rank 0: order:' "$log" | sed 's/.*order: //')
  if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
    row order PASS "2 ranks over $tp: $line"
  else
    row order FAIL "2 ranks over $tp, exit $rc: $(grep -m1 'order: rank\|STALE\|WRONG' "$log" | cut -c1-150)"
  fi
done

if time_for churn; then
  log="$out/churn.log"
  timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --churn 1000 > "$log" 2>&1
  rc=$?
  line=$(grep -m1 'device-check: rank 0: churn:' "$log" | sed 's/.*churn: //')
  if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
    row churn PASS "2 ranks: $line"
  else
    row churn FAIL "exit $rc: ${line:-see churn.log}"
  fi
fi
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then
  row "two GPUs" SKIP "this machine has $gpus GPU(s)"
elif time_for "two GPUs"; then
  log="$out/two-gpus.log"
  WEFT_DEVICE_CHECK_SPREAD=1 timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --quick \
    > "$log" 2>&1
  rc=$?
  line=$(grep -m1 'device-check: rank 0' "$log" | sed 's/.*rank 0: //')
  [ "$rc" -eq 0 ] && row "two GPUs" PASS "2 ranks on GPUs 0 and 1: $line" ||
    row "two GPUs" FAIL "exit $rc: $(grep -m1 'FAIL' "$log" | cut -c1-150)"
fi
if time_for "host only"; then
  log="$out/host-only.log"
  timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --host-only > "$log" 2>&1
  rc=$?
  line=$(grep -m1 'device-check: rank 0: host-only:' "$log" | sed 's/.*host-only: //')
  if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
    row "host only" PASS "2 ranks: $line"
  else
    row "host only" FAIL "exit $rc: ${line:-see host-only.log}"
  fi
fi

# ---- compute-sanitizer ----------------------------------------------------------
san=""
for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  command -v "$c" >/dev/null 2>&1 && san=$c && break
done
if [ -z "$san" ]; then
  row sanitizer SKIP "compute-sanitizer not installed"
elif ! time_for sanitizer; then
  :
elif ! timeout "$(limit 30)" "$san" --tool memcheck "$bin/weft-device-check" --probe > "$out/sanitizer-probe.log" 2>&1; then
  # the tool itself cannot run here (a driver it does not support, no
  # permission for the profiling interfaces): not weft's failure
  row sanitizer SKIP "compute-sanitizer cannot run a trivial program here: $(grep -v '^ *$' "$out/sanitizer-probe.log" | head -1 | cut -c1-140)"
else
  log="$out/sanitizer.log"
  timeout "$(limit 90)" "$san" --tool memcheck --target-processes all --error-exitcode 9 \
    "$bin/weftrun" -n 2 "$bin/weft-device-check" --quick > "$log" 2>&1
  case $? in
    0) row sanitizer PASS "memcheck, 2 ranks: $(grep -m1 'ERROR SUMMARY' "$log")" ;;
    124) row sanitizer FAIL "timed out; see sanitizer.log" ;;
    *) row sanitizer FAIL "$(grep -m1 'ERROR SUMMARY\|Invalid\|FAIL' "$log" | cut -c1-160)" ;;
  esac
fi

# ---- figures ----------------------------------------------------------------------
# weft-bench -G: device buffers; one size per run so each row has its time
bench() { # LABEL RANKS SIZE TARGET_US (bench_coll: another collective than allreduce)
  time_for "bench $1" || return 0
  log="$out/bench-$1-$2-$3.log"
  env ${bench_env:-} timeout "$(limit 40)" "$bin/weftrun" -n "$2" "$bin/weft-bench" -G -b "$3" -e "$3" \
    -C "${bench_coll:-allreduce}" -n 20 -w 5 ${bench_extra:-} > "$log" 2>&1
  # rank 0's row: [0] size count type redop root time(us) algbw busbw #wrong ...
  us=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print $7; exit}' "$log")
  if [ -z "$us" ]; then
    row "bench $1" FAIL "$2 ranks, $3: no figure; see $(basename "$log")"
  else
    row "bench $1" PASS "$2 ranks, $3 B, ${bench_coll:-allreduce} out of place" "$us us" "$4"
  fi
}
bench plain 2 8 "(MPS: <= 100 us)"
bench plain 2 67108864 "<= 500 us"
bench plain 2 268435456 "<= 1000 us"
bench plain 4 67108864 ""
# the buffers not registered (-R 0): each call opens and closes the peer's IPC
# mapping (what an unregistered buffer costs; the plain rows register)
bench_extra="-R 0" bench lent 2 8 "(plain: registered)"
bench_extra="-R 0" bench lent 2 67108864 "(plain: registered)"
bench_extra=
# the same through pinned host memory instead of CUDA IPC: what IPC buys
bench_env=WEFT_CUDA_IPC=0 bench staged 2 67108864 "(plain: IPC)"
# and staged in one piece: what the slices' overlap buys
bench_env="WEFT_CUDA_IPC=0 WEFT_DEVICE_SLICE_BYTES=0" bench whole 2 67108864 "(staged: in slices)"
# a broadcast (parameters from rank 0) over CUDA IPC, and staged
bench_coll=broadcast bench bcast 2 67108864 "(bcast staged: IPC)"
bench_env=WEFT_CUDA_IPC=0 bench_coll=broadcast bench bcast-staged 2 67108864 ""
bench_env= bench_coll= # (dash keeps assignments made before a function call)
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  CUDA_MPS_PIPE_DIRECTORY="$out/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps-log"
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d > "$out/mps.log" 2>&1; then
    bench mps 2 8 "<= 100 us"
    bench mps 2 67108864 "<= 250 us"
    bench mps 4 67108864 ""
    grad_resnet "grad mps" "" "ResNet-50 as one device gradient set, 2 ranks under MPS, all ready at once"
    echo quit | nvidia-cuda-mps-control >> "$out/mps.log" 2>&1
  else
    row "bench mps" FAIL "nvidia-cuda-mps-control -d: $(head -c 150 "$out/mps.log")"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  row "bench mps" SKIP "nvidia-cuda-mps-control not found"
fi

# The ResNet-50 gradient set as device tensors (tools/data/resnet50_grads.tsv)
log="$out/resnet.log"
: > "$log"
time_for resnet && timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --resnet \
  tools/data/resnet50_grads.tsv > "$log" 2>&1
per=$(sed -n 's/.*per tensor: \([0-9.]*\) ms.*/\1/p' "$log" | head -1)
flat=$(sed -n 's/.*flat buffer: \([0-9.]*\) ms.*/\1/p' "$log" | head -1)
if ! [ -s "$log" ]; then
  : # no time: its SKIP row is written
elif [ -n "$per" ] && [ -n "$flat" ]; then
  row "resnet" PASS "161 tensors, 2 ranks, one allreduce per tensor, registered" "$per ms/step" "<= 6 ms (gloo 124)"
  row "resnet" PASS "the same as one flat buffer" "$flat ms/step" "<= 3 ms (gloo 53)"
else
  row resnet FAIL "no figure; see resnet.log: $(grep -m1 -i 'fail\|error' "$log" | cut -c1-150)"
fi
# the same buffers not registered: lent per call, each peer's IPC opened and
# closed in every call (what weft.torch's CUDA tensors get): the cost of that
log="$out/resnet-lent.log"
if time_for "resnet lent"; then
  timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --resnet \
    tools/data/resnet50_grads.tsv lent > "$log" 2>&1
  per=$(sed -n 's/.*per tensor: \([0-9.]*\) ms.*/\1/p' "$log" | head -1)
  if [ -n "$per" ]; then
    row "resnet lent" PASS "161 tensors, 2 ranks, one allreduce per tensor, not registered" "$per ms/step" "(registered: above)"
  else
    row "resnet lent" FAIL "no figure; see resnet-lent.log: $(grep -m1 -i 'fail\|error\|stand-in' "$log" | cut -c1-150)"
  fi
fi
# the same tensors in cuMemCreate memory (PyTorch's expandable segments): no
# legacy IPC handle, so each call is bounced through weft's device memory,
# over IPC, with a copy in and out at the GPU's speed (issue 45, item 6;
# before, staged through host memory)
log="$out/resnet-vmm.log"
if time_for "resnet vmm"; then
  WEFT_DEVICE_CHECK_VMM=1 timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --resnet \
    tools/data/resnet50_grads.tsv lent > "$log" 2>&1
  per=$(sed -n 's/.*per tensor: \([0-9.]*\) ms.*/\1/p' "$log" | head -1)
  if [ -n "$per" ] && ! grep -q 'no legacy IPC handle' "$log"; then
    row "resnet vmm" PASS "the same in cuMemCreate memory: bounced through weft's device memory" "$per ms/step" "near resnet lent"
  else
    row "resnet vmm" FAIL "no figure, or staged; see resnet-vmm.log: $(grep -m1 -i 'fail\|error\|legacy' "$log" | cut -c1-150)"
  fi
fi

# ResNet-50's gradient set as one device gradient set (issue 46)
grad_resnet "grad resnet" "" "ResNet-50 as one device gradient set, 2 ranks, all ready at once"
grad_resnet "grad backward" backward "the same with a simulated backward (each gradient's memset queued, then marked ready)"
# over tcp, staged through pinned host memory: against the same set on host memory
log="$out/grad-tcp.log"
if time_for "grad tcp"; then
  WEFT_TRANSPORT=tcp timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --grad-resnet \
    tools/data/resnet50_grads.tsv > "$log" 2>&1
  WEFT_TRANSPORT=tcp timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --grad-resnet \
    tools/data/resnet50_grads.tsv host >> "$log" 2>&1
  dev=$(sed -n 's/.*on device memory.* \([0-9.]*\) ms per weft_grad_wait.*/\1/p' "$log" | head -1)
  host=$(sed -n 's/.*on host memory.* \([0-9.]*\) ms per weft_grad_wait.*/\1/p' "$log" | head -1)
  if [ -n "$dev" ] && [ -n "$host" ]; then
    row "grad tcp" PASS "the set over tcp, 2 ranks: device (staged) against host memory" "$dev / $host ms per wait" "device within 10% of host"
  else
    row "grad tcp" FAIL "no figure; see grad-tcp.log: $(grep -m1 -i 'fail\|error\|rank' "$log" | cut -c1-150)"
  fi
fi
# messages between device buffers (staged through pinned memory), 2 ranks
log="$out/p2p.log"
if time_for "p2p"; then
  timeout "$(limit 60)" "$bin/weftrun" -n 2 "$bin/weft-device-check" --p2p 30 > "$log" 2>&1
  if grep -q 'rank 0: 0 failed\|rank 0: [0-9]* passed, 0 failed' "$log" && grep -q 'p2p: .* received right' "$log"; then
    row "p2p" PASS "weft_send/weft_recv of device buffers, both forms, 2 ranks, 30 rounds" "$(grep -m1 'rank 0: [0-9]* passed' "$log" | sed 's/.*rank 0: //')" "all right"
  else
    row "p2p" FAIL "see p2p.log: $(grep -m1 -i 'wrong\|fail\|error' "$log" | cut -c1-150)"
  fi
fi

# examples/grad_device.c: the model trained with its gradients in a device
# set (the stream form), 2 ranks, against the host run of every batch
log="$out/grad-example.log"
if time_for "grad example"; then
  timeout "$(limit 60)" "$bin/weftrun" -n 2 "$build/examples/weft-grad-device" --steps 40 --check > "$log" 2>&1
  if [ "$(grep -c 'parameters against the host run.*(right)' "$log")" -eq 2 ]; then
    row "grad example" PASS "examples/grad_device.c, 2 ranks, 40 steps: parameters against the host run" \
      "$(sed -n 's/.*largest difference \([^ ]*\) .*/\1/p' "$log" | head -1)" "<= 1e-5"
  else
    row "grad example" FAIL "see grad-example.log: $(grep -m1 -i 'fail\|error\|skipped' "$log" | cut -c1-150)"
  fi
fi

# ---- weft.torch ------------------------------------------------------------------
ext=$(ls "$build"/python/csrc/_backend*.so 2>/dev/null | head -1)
# the Python meson built weft.torch for ("building against torch X (PATH)")
built_for=$(sed -n 's/^.*weft\.torch: building against torch .* (\(.*\))$/\1/p' "$out/build.log" | head -1)
[ -n "$built_for" ] && tpy=$built_for
torch_env="PYTHONPATH=$PWD/python WEFT_TORCH_EXT_DIR=$build/python/csrc OMP_NUM_THREADS=1"
if [ -z "$ext" ]; then
  why="weft.torch was not built: $(grep -m1 'weft.torch' "$out/build.log" | cut -c1-150)"
  row "torch cuda" SKIP "$why"
  row "torch premul" SKIP "$why"
  row "torch grad" SKIP "$why"
  row "torch expandable" SKIP "$why"
  row "torch host" SKIP "$why"
  finish
fi
log="$out/torch-cuda.log"
rc=125
time_for "torch cuda" && { env $torch_env timeout "$(limit 90)" "$tpy" tests/torch/run.py --built=1 \
  --launcher weftrun -n 2 --weftrun "$bin/weftrun" -- --parts ops,refusals,ddp --device cuda --cases 30 \
  > "$log" 2>&1; rc=$?; }
case $rc in
  125) ;; # no time: its SKIP row is written
  0) row "torch cuda" PASS "2 ranks on one GPU: every op, refusals, $(grep -m1 'DDP on cuda' "$log" | sed 's/^.*DDP on cuda //' | cut -c1-80)" ;;
  77) row "torch cuda" SKIP "$(tail -1 "$log" | cut -c1-150)" ;;
  124) row "torch cuda" FAIL "timed out; see torch-cuda.log" ;;
  *) row "torch cuda" FAIL "$(grep -m1 'Error\|FAIL' "$log" | cut -c1-160)" ;;
esac
# PREMUL_SUM and the coalesced calls on CUDA tensors (issue 50): the multiply
# is queued on torch's stream before weft's call, the packing copies too
log="$out/torch-premul.log"
rc=125
time_for "torch premul" && { env $torch_env timeout "$(limit 60)" "$tpy" tests/torch/run.py --built=1 \
  --launcher weftrun -n 2 --weftrun "$bin/weftrun" --script frameworks.py -- --parts premul,coalesced \
  --device cuda > "$log" 2>&1; rc=$?; }
case $rc in
  125) ;;
  0) row "torch premul" PASS "2 ranks on one GPU: $(grep -m1 'RANK 0: premul' "$log" | sed 's/^.*premul: //' | cut -c1-90)" ;;
  77) row "torch premul" SKIP "$(tail -1 "$log" | cut -c1-150)" ;;
  124) row "torch premul" FAIL "timed out; see torch-premul.log" ;;
  *) row "torch premul" FAIL "$(grep -m1 'Error\|FAIL' "$log" | cut -c1-160)" ;;
esac
# weft.torch.GradReducer on CUDA parameters (issue 46): device buckets, each
# reduced without holding backward's stream, wait() a stream wait
log="$out/torch-grad.log"
rc=125
time_for "torch grad" && { env $torch_env timeout "$(limit 60)" "$tpy" tests/torch/run.py --built=1 \
  --launcher weftrun -n 2 --weftrun "$bin/weftrun" --script grad_reducer.py -- --device cuda > "$log" 2>&1; rc=$?; }
case $rc in
  125) ;;
  0) row "torch grad" PASS "2 ranks on one GPU: $(grep -m1 'RANK 0: GradReducer' "$log" | sed 's/^.*GradReducer, //' | cut -c1-110)" ;;
  77) row "torch grad" SKIP "$(tail -1 "$log" | cut -c1-150)" ;;
  124) row "torch grad" FAIL "timed out; see torch-grad.log" ;;
  *) row "torch grad" FAIL "$(grep -m1 'Error\|FAIL' "$log" | cut -c1-160)" ;;
esac
# the same with PyTorch's expandable segments: cuMemCreate memory, which has
# no legacy IPC handle (staged, said once: docs/gpu.md)
log="$out/torch-expandable.log"
rc=125
time_for "torch expandable" && { env $torch_env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  timeout "$(limit 90)" "$tpy" tests/torch/run.py --built=1 --launcher weftrun -n 2 \
  --weftrun "$bin/weftrun" -- --parts ops,ddp --device cuda --cases 15 > "$log" 2>&1; rc=$?; }
case $rc in
  125) ;;
  # memory without a legacy IPC handle is bounced through weft's own device
  # memory, over IPC: the staging warning must not appear (issue 45, item 6)
  0) if [ "$(grep -c 'no legacy IPC handle' "$log")" -eq 0 ]; then
       row "torch expandable" PASS "2 ranks, expandable_segments:True: every op, $(grep -m1 'DDP on cuda' "$log" | sed 's/^.*DDP on cuda //' | cut -c1-60); no call staged"
     else
       row "torch expandable" FAIL "every op right, but staged: $(grep -m1 'no legacy IPC handle' "$log" | cut -c1-120)"
     fi ;;
  77) row "torch expandable" SKIP "$(tail -1 "$log" | cut -c1-150)" ;;
  124) row "torch expandable" FAIL "timed out; see torch-expandable.log" ;;
  *) row "torch expandable" FAIL "$(grep -m1 'Error\|FAIL' "$log" | cut -c1-160)" ;;
esac
# DDP's exposed communication on CPU tensors, weft against gloo: the targets
# of issue 16 (>= 5x over shm, >= 2x over tcp), judged where ranks have cores
for case in "2 shm 5" "2 tcp 2" "4 shm 5" "4 tcp 2"; do
  set -- $case
  left=$((300 - ($(date +%s) - start)))
  if [ "$left" -lt 45 ]; then
    row "torch host" SKIP "$1 ranks over $2: no time left in the 5 minutes"
    continue
  fi
  log="$out/torch-host-$1-$2.log"
  env $torch_env WEFT_TRANSPORT=$2 timeout "$(limit 60)" "$bin/weftrun" -n "$1" "$tpy" tools/torch_bench.py \
    --what ddp --steps 10 > "$log" 2>&1
  rc=$?
  if [ "$rc" -eq 77 ] || grep -q '^\[0\] skipped:' "$log"; then
    row "torch host" SKIP "$1 ranks over $2: $(grep -m1 'skipped:' "$log" | sed 's/^.*skipped: //' | cut -c1-140)"
    continue
  fi
  # the DDP table's row: "gloo / weft backend" is "exposed ratio / communication ratio"
  ratio=$(grep -A2 '| case | ranks | weft over | local ms' "$log" | tail -1 | awk -F'|' '{print $10}' | sed 's/^ *//; s/ *$//')
  if [ -n "$ratio" ]; then
    row "torch host" PASS "$1 ranks over $2, DDP, gloo / weft: exposed / communication" "$ratio" ">= $3x exposed"
  else
    row "torch host" FAIL "$1 ranks over $2: no figure; see $(basename "$log"): $(grep -m1 -i 'fail\|error' "$log" | cut -c1-120)"
  fi
done
finish
