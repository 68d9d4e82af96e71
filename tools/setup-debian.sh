#!/bin/sh
# setup-debian.sh - installs what a fresh Debian 12 machine lacks to build and
# test weft (compiler, meson, ninja, pkg-config, hwloc, CMocka, rdma-core
# headers, clang + libFuzzer for tools/fuzz.sh, llvm-symbolizer so sanitizer reports name
# functions and tests/tsan.supp can match them, valgrind). Installs only missing packages; needs root (or sudo).
# Recommends are not installed, so anything the tests need must be named here:
# libhwloc-plugins is hwloc's libxml2 XML loader (only a Recommends of libhwloc15);
# without it the hand-written tests/topo/*.xml fixtures do not load.
# tools/fresh-root.sh checks this list in a minimal Debian 12 root.
#
#   sh tools/setup-debian.sh [--torch-venv DIR]    (or WEFT_TORCH_VENV=DIR)
#   sh tools/setup-debian.sh --pip                  (what pip install . needs, alone)
#
# --pip: only what `pip install .` needs to build weft's wheel (issue 44): C and
# C++ compilers, libcrypto's and hwloc's headers (hwloc is optional: without it
# weft builds and has no topology), pkg-config, Python's headers, venv and pip.
# Torch comes from the user's venv, meson-python from pip; nvcc is optional
# and not installed (a wheel builds without CUDA kernels).
# --torch-venv DIR: also a venv at DIR with torch 2.x and numpy from PyPI, for
# the pip test (tests/pip, issue 38); kept when it works, else
# made anew. Downloads only when asked: the quickstart needs none of it.
set -eu
torch_venv=${WEFT_TORCH_VENV:-}
pip_only=""
case ${1:-} in
  --torch-venv) torch_venv=${2:?"setup-debian.sh: --torch-venv needs a folder"} ;;
  --pip) pip_only=1 torch_venv="" ;;
  "") ;;
  *) echo "usage: sh tools/setup-debian.sh [--torch-venv DIR | --pip]" >&2; exit 2 ;;
esac
packages="gcc libc6-dev meson ninja-build pkg-config libhwloc-dev libhwloc-plugins libcmocka-dev libibverbs-dev libssl-dev iproute2 clang libclang-rt-14-dev llvm valgrind"
# gdb: a test rank that hangs has its threads' stacks printed before it is killed (tests/harness.h)
packages="$packages gdb"
# Python (issue 16): the package python/weft (cffi loads libweft), the torch backend
# weft.torch (a C++ extension built against Debian's torch: g++, python3-dev,
# libtorch-dev, pybind11-dev) and their tests (numpy and pytest; torch and sklearn's
# digits for DDP; Open MPI for the mpirun launcher case)
packages="$packages python3 python3-dev python3-cffi python3-numpy python3-pytest g++"
packages="$packages python3-torch libtorch-dev pybind11-dev python3-sklearn openmpi-bin"
# the torch venv: python3 -m venv needs ensurepip; the pip test's offline
# install (--no-build-isolation) builds with Debian's meson-python
# ca-certificates: pip reaches PyPI over TLS; a minimal Debian 12 (debootstrap
# minbase, tools/fresh-root.sh) has no CA certificates, and every download
# then fails certificate verification (the pip test skipped there before)
[ -z "$torch_venv" ] || packages="$packages python3-venv python3-mesonpy ca-certificates"
[ -z "$pip_only" ] || packages="gcc g++ libc6-dev pkg-config libssl-dev libhwloc-dev python3-dev python3-venv python3-pip ca-certificates"
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing" >&2
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get update -qq
  # shellcheck disable=SC2086
  $as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
[ -n "$torch_venv" ] || exit 0

# The torch venv. Debian's python3 (its torch 1.13 stays out: no system site
# packages). A venv counts as made once .weft-made is written, last.
torch_venv_works() {
  [ -f "$torch_venv/.weft-made" ] && "$torch_venv/bin/python" -c \
    'import sys, numpy, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null
}
torch_venv_works && exit 0
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "setup: making a torch 2.x venv in $torch_venv" >&2
rm -rf "$torch_venv"
mkdir -p "$(dirname "$torch_venv")"
"$py" -m venv "$torch_venv"
# PyTorch's CPU-only wheel where its index answers (preferred: no CUDA
# libraries); else PyPI's wheel, built for CUDA, which runs without a GPU too but
# brings NVIDIA's libraries: torch 2.15's wheel is 514 MiB, the venv 5.4 GiB,
# made in 72 s here (download.pytorch.org did not resolve on our machines)
if "$py" -c 'import urllib.request; urllib.request.urlopen("https://download.pytorch.org/whl/cpu/", timeout=10)' 2>/dev/null; then
  index="--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple"
else
  echo "setup: download.pytorch.org does not answer; torch comes from PyPI (with CUDA's libraries)" >&2
  index=""
fi
# shellcheck disable=SC2086
"$torch_venv/bin/python" -m pip install -q --no-cache-dir $index "torch>=2,<3" numpy
"$torch_venv/bin/python" -c 'import torch; print("setup: torch", torch.__version__, "in '"$torch_venv"'")' >&2
: >"$torch_venv/.weft-made"
torch_venv_works
