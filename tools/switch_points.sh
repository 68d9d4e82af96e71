#!/bin/bash
# switch_points.sh - the measurements behind src/coll/choose.c's switch
# points, and weft against Open MPI, on a host with many cores (the 16-core
# machine of docs/performance.md). Every run is weft-bench --peers (medians,
# the ../shared/peers format), so tools/switch_points.py can line them up.
#   bash tools/switch_points.sh [build-dir]          # then
#   python3 tools/switch_points.py OUT/runs.txt [OUT2/runs.txt ...]
# Phases (PHASES, default "A C S T B"), each run twice, interleaved:
#   A  forced algorithms side by side: the exchange against recursive
#      doubling, recursive doubling against the ring, broadcast trees,
#      allgather ring against pairwise, shm single copy off against on
#   C  the small-message algorithms: Bruck's allgather against the ring,
#      reduce_scatter by recursive halving and doubling against the ring,
#      per transport; exchange against
#      recursive doubling at 3 and 4 ranks; rd against ring over tcp
#   S  whether the two ends of each 2-rank shm pair decide single copy alike
#      (12 starts, WEFT_DEBUG=INFO lines)
#   T  the one-way stream limit of shm single copy (WEFT_SHM_CMA_STREAM_BYTES
#      0 / 1M / 2M / 4M / 8M): 2-rank broadcast and gather, 4 and 8-rank
#      broadcast (0 against the default), Open MPI's 2-rank broadcast beside
#      them; and the 2-rank allgather, single copy off against on (3 rounds)
#   P  the pipeline chunk of the chain broadcast (WEFT_CHUNK_BYTES 32K / 64K
#      / 128K / 256K, which sizes the shm slots too) at 8 and 16 ranks over shm
#      and tcp, 128 KiB-8 MiB, Open MPI's broadcast beside it (not in the
#      default PHASES: PHASES="P B")
#   B  weft (auto) against Open MPI (ob1 with vader or tcp, with and without
#      glibc's mmap threshold raised) for five collectives at NPS_B ranks
# Environment: OUT (results folder, results/switch-points-<stamp>), PHASES,
# NPS_B ("4 8 16 2"), COLLS_B (the five), PEERS_SRC (the peers' sources,
# ../shared/peers/src; Open MPI's rows need mpicc there), DEADLINE (seconds
# after which no new run starts, 900). A run cut off still leaves what it had.
set -u
build=${1:-build}
W=$build/tools/weftrun WB=$build/tools/weft-bench
if [ ! -x "$WB" ] || [ ! -x "$W" ]; then
  echo "no $WB or $W: build first (ninja -C $build)" >&2
  exit 1
fi
OUT=${OUT:-results/switch-points-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
R=$OUT/runs.txt
PHASES=${PHASES:-A C S T B}
DEADLINE=${DEADLINE:-900}
PEERS_SRC=${PEERS_SRC:-../shared/peers/src}
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
exec > >(tee "$OUT/log.txt") 2>&1
echo "## $(nproc) cpus; $(lscpu | sed -n 's/^Model name: *//p'); $(uname -r); $(mpirun --version 2>/dev/null | head -1)"
"$build/tools/weft-info" >"$OUT/info.txt" 2>&1
grep -E '^transports:' "$OUT/info.txt"

HAVE_MPI=0
MPI_BENCH=$OUT/mpi_bench
if command -v mpicc >/dev/null && [ -f "$PEERS_SRC/mpi_allreduce_bench.c" ] &&
  mpicc -O2 -o "$MPI_BENCH" "$PEERS_SRC/mpi_allreduce_bench.c"; then HAVE_MPI=1; fi
echo "## Open MPI rows: $([ $HAVE_MPI = 1 ] && echo yes || echo "no (mpicc or $PEERS_SRC missing)")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
LO="--mca oob_tcp_if_include lo --mca btl_tcp_if_include lo"
NOMMAP="-x MALLOC_MMAP_THRESHOLD_=4294967296 -x MALLOC_TRIM_THRESHOLD_=4294967296"

has() { [[ " $PHASES " == *" $1 "* ]]; }
late() { [ "$(el)" -ge "$DEADLINE" ] && { echo "skipped $1 (DEADLINE)"; return 0; }; return 1; }
took() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }

# wrun TAG NP COLL "VAR=value ..." [weft-bench size args]: one weft run, rank 0's rows
wrun() {
  local tag=$1 np=$2 coll=$3 envs=$4 t
  shift 4
  late "$tag" && return
  t=$(date +%s.%N)
  {
    echo "### tag=$tag np=$np coll=$coll env=[$envs] args=[$*]"
    # shellcheck disable=SC2086
    env $envs timeout -k 3 120 "$W" -n "$np" "$WB" --bind --peers -c "$coll" "$@" 2>&1 |
      grep -vE '^\[ *0\] #  |transports of' | grep -E '^\[ *0\]|rror|FAIL'
    echo "### rc=${PIPESTATUS[0]}"
  } >>"$R"
  printf '%-18s np=%-2s %-14s %5ss @%ss\n' "$tag" "$np" "$coll" "$(took "$t")" "$(el)"
}

# mrun TAG NP COLL "mpirun args": one Open MPI run
mrun() {
  local tag=$1 np=$2 coll=$3 margs=$4 t over=
  [ $HAVE_MPI = 1 ] || return 0
  late "$tag" && return
  [ "$np" -gt "$(nproc)" ] && over=--oversubscribe
  t=$(date +%s.%N)
  {
    echo "### tag=$tag np=$np coll=$coll args=[]"
    # shellcheck disable=SC2086
    timeout -k 3 120 mpirun -np "$np" $over $margs "$MPI_BENCH" -c "$coll" -t "$tag" 2>&1 | grep -vE '^#  '
    echo "### rc=${PIPESTATUS[0]}"
  } >>"$R"
  printf '%-18s np=%-2s %-14s %5ss @%ss\n' "$tag" "$np" "$coll" "$(took "$t")" "$(el)"
}

for round in 1 2; do
  has A || break
  echo "## A, round $round"
  for np in 8 16; do
    wrun ex-exchange $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=exchange" -b 8 -e 16K -f 4
    wrun ex-rd $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=rd" -b 8 -e 16K -f 4
  done
  for np in 4 16; do
    wrun rr-rd $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=rd" -b 16K -e 256K -f 2
    wrun rr-ring $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=ring" -b 16K -e 256K -f 2
  done
  for np in 4 8 16; do
    wrun bc-flat $np bcast "WEFT_TRANSPORT=shm WEFT_BCAST_FANOUT=$((np - 1))" -b 16K -e 4M -f 4
    wrun bc-chain $np bcast "WEFT_TRANSPORT=shm WEFT_BCAST_FANOUT=1" -b 16K -e 4M -f 4
    wrun bc-auto $np bcast "WEFT_TRANSPORT=shm WEFT_BCAST_FLAT_MIN_BYTES=0" -b 16K -e 4M -f 4
  done
  for np in 4 8 16; do
    wrun ag-ring $np allgather "WEFT_TRANSPORT=shm WEFT_ALLGATHER_PAIRWISE_BYTES=0 WEFT_ALLGATHER_BRUCK_SHM_MAX_BYTES=0" -b 8K -e 64M -f 4
    wrun ag-pairwise $np allgather "WEFT_TRANSPORT=shm WEFT_ALLGATHER_PAIRWISE_BYTES=1 WEFT_ALLGATHER_BRUCK_SHM_MAX_BYTES=0" -b 8K -e 64M -f 4
  done
  for np in 2 4; do
    for c in bcast alltoall; do
      wrun cma-off $np $c "WEFT_TRANSPORT=shm WEFT_SHM_CMA=0" -b 32K -e 64M -f 4
      wrun cma-on $np $c "WEFT_TRANSPORT=shm WEFT_SHM_CMA=on" -b 32K -e 64M -f 4
    done
  done
done

for round in 1 2; do
  has C || break
  echo "## C, round $round"
  for np in 3 4; do
    wrun ex-exchange $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=exchange" -b 8 -e 16K -f 4
    wrun ex-rd $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=rd" -b 8 -e 16K -f 4
  done
  for np in 2 8; do
    wrun rr-rd $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=rd" -b 16K -e 256K -f 2
    wrun rr-ring $np allreduce "WEFT_TRANSPORT=shm WEFT_ALGO=ring" -b 16K -e 256K -f 2
  done
  for np in 4 16; do
    wrun rrt-rd $np allreduce "WEFT_TRANSPORT=tcp WEFT_ALGO=rd" -b 16K -e 256K -f 2
    wrun rrt-ring $np allreduce "WEFT_TRANSPORT=tcp WEFT_ALGO=ring" -b 16K -e 256K -f 2
  done
  for tr in shm tcp; do
    for np in 8 16; do
      off="WEFT_ALLGATHER_BRUCK_MAX_BYTES=0 WEFT_ALLGATHER_BRUCK_SHM_MAX_BYTES=0"
      on="WEFT_ALLGATHER_BRUCK_MAX_BYTES=256K WEFT_ALLGATHER_BRUCK_SHM_MAX_BYTES=256K"
      wrun ag-old-$tr $np allgather "WEFT_TRANSPORT=$tr $off" -b 8 -e 256K -f 4
      wrun ag-bruck-$tr $np allgather "WEFT_TRANSPORT=$tr $on" -b 8 -e 256K -f 4
      off="WEFT_REDUCE_SCATTER_HALVING_MAX_BYTES=0 WEFT_REDUCE_SCATTER_HALVING_SHM_MAX_BYTES=0"
      rd="WEFT_REDUCE_SCATTER_RD_MAX_BYTES=256K WEFT_REDUCE_SCATTER_RD_SHM_MAX_BYTES=256K"
      ring="WEFT_REDUCE_SCATTER_RD_MAX_BYTES=0 WEFT_REDUCE_SCATTER_RD_SHM_MAX_BYTES=0"
      hv="WEFT_REDUCE_SCATTER_HALVING_MAX_BYTES=1G WEFT_REDUCE_SCATTER_HALVING_SHM_MAX_BYTES=1G"
      wrun rs-old-$tr $np reduce_scatter "WEFT_TRANSPORT=$tr $off $ring" -b 8 -e 512K -f 4
      wrun rs-rd-$tr $np reduce_scatter "WEFT_TRANSPORT=$tr $off $rd" -b 8 -e 256K -f 4
      wrun rs-halving-$tr $np reduce_scatter "WEFT_TRANSPORT=$tr $hv" -b 8 -e 512K -f 4
    done
  done
done

if has S; then
  echo "## S: each 2-rank pair's single-copy decision, 12 starts"
  for _ in $(seq 1 12); do
    late split-check && break
    WEFT_TRANSPORT=shm WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=NET "$W" -n 2 "$WB" --bind --peers \
      -c alltoall -b 2M -e 8M >"$OUT/split.tmp" 2>&1
    t=$(grep -E '^\[0\] +[0-9]' "$OUT/split.tmp" | awk '{printf "%s ", $5}')
    d=$(grep -oE 'rank [0-9] (takes peer [0-9].s chunks through the slots|reads peer [0-9])' \
      "$OUT/split.tmp" | sort | tr '\n' ';')
    echo "split-check alltoall 2M 8M us: $t| $d" | tee -a "$R"
  done
  rm -f "$OUT/split.tmp"
fi

for round in 1 2 3; do
  has T || break
  echo "## T, round $round"
  for k in 0 1M 2M 4M 8M; do
    for c in bcast gather; do
      wrun "st-$k" 2 $c "WEFT_TRANSPORT=shm WEFT_SHM_CMA_STREAM_BYTES=$k" -b 512K -e 64M -f 2
    done
  done
  for np in 4 8; do
    for k in 0 2M; do
      wrun "st-$k" $np bcast "WEFT_TRANSPORT=shm WEFT_SHM_CMA_STREAM_BYTES=$k" -b 512K -e 64M -f 4
    done
  done
  mrun ompi-vader 2 bcast "$LO --mca pml ob1 --mca btl self,vader"
  mrun ompi-vader-nommap 2 bcast "$LO --mca pml ob1 --mca btl self,vader $NOMMAP"
  wrun cma-off 2 allgather "WEFT_TRANSPORT=shm WEFT_SHM_CMA=0" -b 2M -e 64M -f 2
  wrun cma-on 2 allgather "WEFT_TRANSPORT=shm WEFT_SHM_CMA=on" -b 2M -e 64M -f 2
  mrun ompi-vader-nommap 2 allgather "$LO --mca pml ob1 --mca btl self,vader $NOMMAP"
done

for round in 1 2 3; do
  has P || break
  echo "## P, round $round"
  for np in 8 16; do
    for tp in shm tcp; do
      for k in 32K 64K 128K 256K; do
        wrun "pc-$tp-$k" $np bcast "WEFT_TRANSPORT=$tp WEFT_CHUNK_BYTES=$k" -b 128K -e 8M -f 4
      done
    done
    if [ "$round" = 1 ]; then
      mrun ompi-vader $np bcast "$LO --mca pml ob1 --mca btl self,vader"
      mrun ompi-tcp-nommap $np bcast "$LO --mca pml ob1 --mca btl self,tcp $NOMMAP"
    fi
  done
done

if has B; then
  echo "## B: weft against Open MPI"
  for np in ${NPS_B:-4 8 16 2}; do
    for c in ${COLLS_B:-allreduce bcast allgather reduce_scatter alltoall}; do
      wrun weft-shm "$np" "$c" "WEFT_TRANSPORT=shm"
      mrun ompi-vader "$np" "$c" "$LO --mca pml ob1 --mca btl self,vader"
      mrun ompi-vader-nommap "$np" "$c" "$LO --mca pml ob1 --mca btl self,vader $NOMMAP"
      wrun weft-tcp "$np" "$c" "WEFT_TRANSPORT=tcp"
      mrun ompi-tcp-nommap "$np" "$c" "$LO --mca pml ob1 --mca btl self,tcp $NOMMAP"
    done
  done
fi
echo "## done in $(el) s: $R"
