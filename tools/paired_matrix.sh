#!/bin/sh
# paired_matrix.sh - issue 17's matrix (allreduce bcast allgather
# reduce_scatter alltoall; 2 and 4 ranks; shm and tcp; 8 B .. 64 MiB), each
# row weft against Open MPI in the same job (tools/paired_mpi.sh, blocks of
# calls interleaved), as a markdown table of mpi/weft (above 1: weft is
# faster). ../shared/peers runs every peer as a job of its own, and on a
# small VM a job's vCPU placement moves whole rows by 10-40%; within one job
# both libraries share it. Open MPI is the best other peer in every cell the
# peers' tables showed but the 4-rank tcp 64 MiB broadcast (Gloo there).
#
#   sh tools/paired_matrix.sh [-R RUNS] [-n "2 4"] [-t "shm tcp"] [-c "COLLS"]
#                             [-s "SMALL SIZES"] [-S "LARGE SIZES"] [OUT]
#
# RUNS (default 3) runs of the whole matrix, one after another; each cell
# is the median of the runs' ratios. About 2.5 minutes a run on 2 vCPUs.
# OUT (default /tmp/weft-paired-matrix): each job's output (run1/ ...) and table.md.
# BUILD, WEFT_PAIRED_ENV and WEFT_PAIRED_MPI_BARRIER pass to paired_mpi.sh.
set -eu
cd "$(dirname "$0")/.."
runs=3 nps="2 4" tps="shm tcp" colls="allreduce bcast allgather reduce_scatter alltoall"
# small sizes get more calls per block than large ones (each is microseconds)
small="8 32768 131072 524288"
large="2097152 8388608 33554432 67108864"
while getopts R:n:t:c:s:S: o; do
  case $o in
    R) runs=$OPTARG ;; n) nps=$OPTARG ;; t) tps=$OPTARG ;; c) colls=$OPTARG ;;
    s) small=$OPTARG ;; S) large=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
out=${1:-/tmp/weft-paired-matrix}
mkdir -p "$out"
# A job again where it could not start (its rendezvous port, picked from the
# pid, may be taken by another connection's ephemeral port); 3 tries.
job() {
  job_np=$1 job_tp=$2 job_k=$3
  shift 3
  for try in 1 2 3; do
    if sh tools/paired_mpi.sh -n "$job_np" -t "$job_tp" -r 6 -k "$job_k" "$@" > "$out/job.txt" 2> "$out/job.err"; then
      cat "$out/job.txt"
      return 0
    fi
    echo "paired_matrix.sh: $job_np ranks $job_tp $1 failed (try $try): $(grep -m1 -i 'fail\|error' "$out/job.err")" >&2
  done
  return 1
}
run=1
while [ "$run" -le "$runs" ]; do
  mkdir -p "$out/run$run"
  for tp in $tps; do
    for np in $nps; do
      for coll in $colls; do
        f="$out/run$run/$tp-$np-$coll.txt"
        # small sizes: more calls (each is microseconds); large: fewer
        # shellcheck disable=SC2086 # the sizes are words
        {
          if [ -n "$small" ]; then job "$np" "$tp" 20 "$coll" $small; fi
          if [ -n "$large" ]; then job "$np" "$tp" 4 "$coll" $large; fi
        } > "$f"
      done
    done
  done
  run=$((run + 1))
done
python3 - "$out" "$runs" "$tps" "$nps" "$colls" "$small $large" <<'EOF' | tee "$out/table.md"
import statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
tps, nps, colls, sizes = [a.split() for a in sys.argv[3:]]
print(f"weft against Open MPI in one job: mpi/weft, median of {runs} run(s)\n")
def words(b):
    b = int(b)
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"
print("| transport, collective, ranks | " + " | ".join(words(s) for s in sizes) + " |")
print("|---|" + "---:|" * len(sizes))
big = ahead = small_cells = small_ok = 0
for tp in tps:
    for coll in colls:
        for np in nps:
            seen = {}
            for run in range(1, runs + 1):
                for line in open(f"{out}/run{run}/{tp}-{np}-{coll}.txt"):
                    f = line.split()
                    if len(f) == 5 and not line.startswith("#") and f[0].isdigit():
                        seen.setdefault(f[0], []).append(float(f[3]))
                        if f[4] != "0":
                            sys.exit(f"{tp} {np} {coll} {f[0]}: {f[4]} wrong elements")
            ratio = {s: statistics.median(v) for s, v in seen.items()}
            cells = []
            for s in sizes:
                if s not in ratio:
                    cells.append("-")
                    continue
                r = ratio[s]
                if int(s) >= 32768:
                    big += 1
                    ahead += r >= 1
                    cells.append(f"**{r:.2f}**" if r < 1 else f"{r:.2f}")
                else:
                    small_cells += 1
                    small_ok += r >= 0.9
                    cells.append(f"**{r:.2f}**" if r < 0.9 else f"{r:.2f}")
            print(f"| {tp} {coll} {np} | " + " | ".join(cells) + " |")
print(f"\nfrom 32 KiB: {ahead} of {big} cells at or above Open MPI; "
      f"8 B: {small_ok} of {small_cells} within 10% (bold: short)")
EOF
