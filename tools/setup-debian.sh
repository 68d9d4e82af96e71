#!/bin/sh
# setup-debian.sh - installs what a fresh Debian 12 machine lacks to build and
# test weft (compiler, meson, ninja, pkg-config, hwloc, CMocka, rdma-core
# headers, clang + libFuzzer for tools/fuzz.sh, llvm-symbolizer so sanitizer reports name
# functions and tests/tsan.supp can match them, valgrind). Installs only missing packages; needs root (or sudo).
# Recommends are not installed, so anything the tests need must be named here:
# libhwloc-plugins is hwloc's libxml2 XML loader (only a Recommends of libhwloc15);
# without it the hand-written tests/topo/*.xml fixtures do not load.
# tools/fresh-root.sh checks this list in a minimal Debian 12 root.
set -eu
packages="gcc libc6-dev meson ninja-build pkg-config libhwloc-dev libhwloc-plugins libcmocka-dev libibverbs-dev libssl-dev iproute2 clang libclang-rt-14-dev llvm valgrind"
# Python (issue 16): the package python/weft (cffi loads libweft), the torch backend
# weft.torch (a C++ extension built against Debian's torch: g++, python3-dev,
# libtorch-dev, pybind11-dev) and their tests (numpy and pytest; torch and sklearn's
# digits for DDP; Open MPI for the mpirun launcher case)
packages="$packages python3 python3-dev python3-cffi python3-numpy python3-pytest g++"
packages="$packages python3-torch libtorch-dev pybind11-dev python3-sklearn openmpi-bin"
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "setup: installing$missing" >&2
as_root=""
[ "$(id -u)" -eq 0 ] || as_root="sudo"
export DEBIAN_FRONTEND=noninteractive
$as_root apt-get update -qq
# shellcheck disable=SC2086
$as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null
