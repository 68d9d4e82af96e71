#!/bin/sh
# quickstart.sh - the README's first command: install what is missing, build,
# and run the main job, a 4-rank allreduce sweep over TCP on this machine.
# Extra arguments go to weft-bench (e.g. -e 8M for a shorter sweep).
set -eu
cd "$(dirname "$0")/.."
sh tools/setup-debian.sh
[ -d build ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
exec build/tools/weftrun -n "${WEFT_NP:-4}" build/tools/weft-bench -b 8 -e 64M -f 4 -n 20 -w 5 "$@"
