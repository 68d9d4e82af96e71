#!/bin/sh
# quickstart.sh - the README's first command: install what is missing, build,
# and run the main job: a 4-rank allreduce sweep on this machine, over the
# transport selection picks (shared memory, as all ranks share one host);
# weft-bench prints the transport of each pair of ranks before its table.
# WEFT_TRANSPORT=tcp sh tools/quickstart.sh sweeps over TCP instead.
# Extra arguments go to weft-bench (e.g. -e 8M for a shorter sweep).
set -eu
cd "$(dirname "$0")/.."
sh tools/setup-debian.sh
[ -d build ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
exec build/tools/weftrun -n "${WEFT_NP:-4}" build/tools/weft-bench -b 8 -e 64M -f 4 -n 20 -w 5 "$@"
