#!/bin/sh
# host_check.sh - the many-core measurements a 2-vCPU machine cannot make,
# for the 16-core machine we never see (../shared/gpu-machine.md: Open MPI,
# torch's gloo in /opt/torch/.venv, no CMocka, no network). One command from
# the repository root, at most 3.5 minutes in all, build included:
#
#   sh tools/host_check.sh OUTDIR
#
# Stages, each under its own time limit; raw logs in OUTDIR, one table at
# the end (OUTDIR/summary.md) that src/coll/choose.c can be tuned from:
#   build    release, -Dtests=false, no CUDA, no Python package
#   matrix   weft against Open MPI in one job (tools/paired_matrix.sh) for the
#            five collectives at NPS ranks over shm and tcp, sizes 8 B, 32 KiB,
#            512 KiB, 8 MiB and 64 MiB: mpi/weft per cell (above 1: weft faster)
#   gloo     weft's tcp allreduce (weft-bench --peers) against torch's gloo
#            (tools/gloo_allreduce.py) at NPS_GLOO ranks, 1 / 16 / 64 MiB, busbw
#   switch   the switch points' forced algorithms, small sizes (switch_points.sh
#            phase C) in the time left; tools/switch_points.py lines them up
# NPS (default "8 16" with 16 CPUs or more, else "2 4"), NPS_GLOO ("4 8 16",
# else "2 4"), PY (the first Python with torch: /opt/torch/.venv/bin/python3,
# python3, /usr/bin/python3), SWITCH=0 (no switch-point phase), MATRIX_SMALL and
# MATRIX_LARGE (the matrix's sizes: "8 32768 524288", "8388608 67108864"). Runs anywhere:
# about 2 minutes on a 2-vCPU machine with 2 and 4 ranks; the suite runs it
# with NPS=2 NPS_GLOO=2 SWITCH=0 (tests/test_host_check.sh).
set -u
cd "$(dirname "$0")/.." || exit 1
out=${1:-/tmp/weft-host-check}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
start=$(date +%s)
budget=210
: > "$out/rows"
cpus=$(nproc)
if [ "$cpus" -ge 16 ]; then NPS=${NPS:-"8 16"} NPS_GLOO=${NPS_GLOO:-"4 8 16"}; fi
NPS=${NPS:-"2 4"}
NPS_GLOO=${NPS_GLOO:-"2 4"}
# the first Python with torch
if [ -z "${PY:-}" ]; then
  for p in /opt/torch/.venv/bin/python3 "$(command -v python3)" /usr/bin/python3; do
    [ -x "$p" ] && "$p" -c 'import torch.distributed' > /dev/null 2>&1 && PY=$p && break
  done
fi
PY=${PY:-python3}

row() { # STAGE RESULT WHAT
  printf '| %s | %s | %s |\n' "$1" "$2" "$3" >> "$out/rows"
  printf 'host_check: %-8s %-4s %s\n' "$1" "$2" "$3"
}
left() { echo $((budget - ($(date +%s) - start))); }
limit() { l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

finish() {
  {
    echo "# weft host_check, $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    echo "$cpus CPUs ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')), $(mpirun --version 2>/dev/null | head -1)"
    echo
    echo "| stage | result | what |"
    echo "|---|---|---|"
    cat "$out/rows"
    for t in matrix gloo switch; do
      [ -f "$out/$t.md" ] && { echo; cat "$out/$t.md"; }
    done
    echo
    echo "logs: $out ($(($(date +%s) - start)) s)"
  } > "$out/summary.md"
  echo
  cat "$out/summary.md"
  grep -q '| FAIL |' "$out/rows" && exit 1
  exit 0
}

# ---- build ----------------------------------------------------------------
# WEFT_CHECK_BUILD: a build tree to use (configured here if it is not yet);
# the suite shares one between this script's test and gpu_check.sh's, so the
# CUDA kernels are built where nvcc is (auto), as gpu_check.sh builds them
build=${WEFT_CHECK_BUILD:-$out/build}
if timeout "$(limit 90)" sh -c "{ [ -f '$build/build.ninja' ] || meson setup '$build' --buildtype=release \
      -Dtests=false -Dcuda=auto -Dpython_package=disabled; } > '$out/build.log' 2>&1 &&
      ninja -C '$build' >> '$out/build.log' 2>&1"; then
  row build PASS "release, $(($(date +%s) - start)) s"
else
  row build FAIL "see build.log: $(grep -m1 -i error "$out/build.log" | cut -c1-150)"
  finish
fi
bin="$build/tools"

# ---- weft against Open MPI in one job ----------------------------------------
# the paired job is built with mpicc: the command alone is not enough (Debian's
# openmpi-bin has it without mpi.h)
mpi_ok=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 &&
    printf '#include <mpi.h>\nint main(void) { return 0; }\n' > "$out/mpi_probe.c" &&
    mpicc "$out/mpi_probe.c" -o "$out/mpi_probe" > "$out/mpi_probe.log" 2>&1; then
  mpi_ok=1
fi
if [ "$mpi_ok" = 0 ]; then
  row matrix SKIP "mpicc cannot build an MPI program here (Open MPI's development files: libopenmpi-dev)"
else
  # one paired job per (transport, ranks, collective), the sizes trimmed; one
  # table per (transport, ranks), so what ran before the time ran out stays
  mstart=$(date +%s)
  done_cells=""
  for tp in shm tcp; do
    for n in $NPS; do
      if [ $((120 - ($(date +%s) - mstart))) -lt 15 ] || [ "$(left)" -lt 60 ]; then
        row matrix SKIP "$tp at $n ranks: out of time"
        continue
      fi
      if timeout "$(limit $((120 - ($(date +%s) - mstart))))" env BUILD="$build" \
          sh tools/paired_matrix.sh -R 1 -n "$n" -t "$tp" -s "${MATRIX_SMALL:-8 32768 524288}" \
          -S "${MATRIX_LARGE:-8388608 67108864}" \
          "$out/matrix-$tp-$n" >> "$out/matrix.log" 2>&1; then
        done_cells="$done_cells $tp-$n"
      else
        row matrix FAIL "$tp at $n ranks: timed out or failed (matrix.log)"
      fi
    done
  done
  if [ -n "$done_cells" ]; then
    {
      echo "weft against Open MPI in one job: mpi/weft (above 1: weft faster; bold: short)"
      echo
      first=1
      for c in $done_cells; do
        if [ "$first" = 1 ]; then grep '^|' "$out/matrix-$c/table.md"; first=0;
        else grep '^|' "$out/matrix-$c/table.md" | tail -n +3; fi
      done
    } > "$out/matrix.md"
    row matrix PASS "$(echo "$done_cells" | wc -w) of $(($(echo "$NPS" | wc -w) * 2)) (transport, ranks) tables, below"
  fi
fi

# ---- weft's tcp allreduce against torch's gloo -----------------------------------
if ! "$PY" -c 'import torch.distributed' > /dev/null 2>&1; then
  row gloo SKIP "no torch in $PY"
else
  {
    echo "weft (tcp) against gloo, allreduce f32 sum, busbw GB/s (weft / gloo: above 1, weft faster)"
    echo
    echo "| ranks | size | weft | gloo | weft / gloo |"
    echo "|---|---|---:|---:|---:|"
  } > "$out/gloo.md"
  ok=1
  for n in $NPS_GLOO; do
    [ "$(left)" -lt 20 ] && { row gloo SKIP "out of time before $n ranks"; ok=0; break; }
    WEFT_TRANSPORT=tcp timeout "$(limit 40)" "$bin/weftrun" -n "$n" "$bin/weft-bench" --peers \
      -c allreduce -b 1M -e 64M -f 4 > "$out/weft-tcp-$n.log" 2>&1
    OMP_NUM_THREADS=1 timeout "$(limit 60)" "$bin/weftrun" -n "$n" "$PY" tools/gloo_allreduce.py \
      1048576 16777216 67108864 > "$out/gloo-$n.log" 2>&1
    for size in 1048576 16777216 67108864; do
      w=$(awk -v s="$size" '$1 == "[0]" && $2 == s {print $7}' "$out/weft-tcp-$n.log")
      g=$(awk -v s="$size" '$2 == "gloo" && $3 == s {print $5}' "$out/gloo-$n.log")
      r=$(awk -v w="${w:-0}" -v g="${g:-0}" 'BEGIN { if (w > 0 && g > 0) printf "%.2f", w / g; else print "-" }')
      echo "| $n | $((size >> 20)) MiB | ${w:--} | ${g:--} | $r |" >> "$out/gloo.md"
      [ -z "$w" ] || [ -z "$g" ] && ok=0
    done
  done
  if [ "$ok" = 1 ]; then row gloo PASS "ranks $NPS_GLOO, table below"; else row gloo FAIL "a cell has no figure (weft-tcp-N.log, gloo-N.log)"; fi
fi

# ---- switch points, as far as the time goes ---------------------------------------
l=$(left)
if [ "${SWITCH:-1}" = 0 ]; then
  row switch SKIP "SWITCH=0"
elif [ "$l" -lt 25 ]; then
  row switch SKIP "out of time (${l} s left)"
elif ! command -v bash >/dev/null 2>&1; then
  row switch SKIP "no bash (tools/switch_points.sh needs it)"
else
  OUT="$out/switch" PHASES="C" DEADLINE=$((l - 15)) timeout "$l" bash tools/switch_points.sh "$build" \
    > "$out/switch.log" 2>&1
  if [ -f "$out/switch/runs.txt" ] && python3 tools/switch_points.py "$out/switch/runs.txt" > "$out/switch.md" 2>> "$out/switch.log"; then
    row switch PASS "phase C (small-message algorithms) in ${l} s; table below"
  else
    row switch FAIL "see switch.log"
  fi
fi
finish
