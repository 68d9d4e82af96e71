#!/bin/sh
# paired_mpi.sh - weft against Open MPI in the same mpirun job, blocks of
# iterations interleaved (tools/paired_mpi.c says why). Needs mpicc and
# mpirun (../shared/peers/install.sh installs Open MPI) and a built weft.
#
#   sh tools/paired_mpi.sh [-n RANKS] [-t shm|tcp] [-r ROUNDS] [-k BLOCK] COLL [SIZES...]
#
# COLL: allreduce bcast allgather reduce_scatter alltoall. shm pairs weft's
# shm with Open MPI's vader (CMA single copy), tcp weft's tcp with Open MPI's
# tcp btl on loopback, as in ../shared/peers. Each row: both libraries'
# medians (µs, max over ranks) and mpi/weft (above 1: weft is faster).
# BUILD (default build) is the weft build to link. Each library's own
# barrier precedes each of its calls; WEFT_PAIRED_MPI_BARRIER=1: MPI's for both;
# WEFT_PAIRED_PER_RANK=1: each rank's medians too. WEFT_PAIRED_ENV="VAR=value ...":
# more variables for the ranks (a weft setting to compare, say WEFT_SHM_CMA=0).
set -eu
cd "$(dirname "$0")/.."
np=2 tp=shm rounds=10 block=10
while getopts n:t:r:k: o; do
  case $o in
    n) np=$OPTARG ;; t) tp=$OPTARG ;; r) rounds=$OPTARG ;; k) block=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 2; }
coll=$1
shift
build=${BUILD:-build}
bin=$build/paired_mpi
# built each time (a second): always against the library as it is now
mpicc -O2 -std=c11 -D_GNU_SOURCE -Iinclude tools/paired_mpi.c "$build/libweft.a" -o "$bin" \
  -lpthread -lm -ldl -lcrypto -lhwloc
case $tp in
  shm) mca="--mca pml ob1 --mca btl self,vader" ;;
  tcp) mca="--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo" ;;
  *) echo "paired_mpi.sh: -t shm or tcp" >&2; exit 2 ;;
esac
bind=""
[ "$np" -gt "$(nproc)" ] && bind="--oversubscribe --bind-to none"
extra=""
for v in ${WEFT_PAIRED_ENV:-}; do extra="$extra -x $v"; done
# weft's rendezvous port: one the kernel has just handed out and taken back
# (a port picked from the pid was, once in about 40 jobs, another
# connection's ephemeral port: "Address already in use")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null) ||
  port=$((20000 + $$ % 20000))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2086
exec mpirun -np "$np" $mca $bind $extra -x WEFT_TRANSPORT="$tp" -x WEFT_PAIRED_MPI_BARRIER="${WEFT_PAIRED_MPI_BARRIER:-0}" -x WEFT_PAIRED_PER_RANK="${WEFT_PAIRED_PER_RANK:-0}" -x MASTER_ADDR=127.0.0.1 \
  -x MASTER_PORT="$port" -x MALLOC_MMAP_THRESHOLD_=4294967296 \
  -x MALLOC_TRIM_THRESHOLD_=4294967296 "$bin" "$coll" "$rounds" "$block" "$@"
