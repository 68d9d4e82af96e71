"""pip wheel . as a user runs it (issue 38), on a copy of the source tree, the
wheel installed into two throwaway venvs that see the torch 2.x venv's packages
(a .pth file) and nothing of the build tree; then weft.torch's tests there, from
a folder outside the source tree.

  pip_check.py --source DIR --weftrun PATH
      pip wheel --no-deps COPY with build isolation (meson-python from PyPI), once;
      venv A: pip install WHEEL (cffi from PyPI); the torch tests: without_cffi.py,
      hooks_without_cffi.py (2 ranks, weft and gloo default groups), ranks.py
      under torchrun (2 ranks: ops, DDP)
      venv B: pip install --no-deps --no-index WHEEL (no cffi): import weft.torch,
      a 2-rank all_reduce under weftrun, weft.init() saying it needs cffi

weft is built once, and not with --no-build-isolation (docs/python.md describes
it; no test runs it): a build costs about a minute on 2 cores, and pip install .
runs the same PEP 517 build_wheel that pip wheel runs.

WEFT_PIP_KEEP=1 keeps the temporary folder (venvs, wheel) for a look.
The torch venv: $WEFT_TORCH_VENV, else /var/cache/weft-ci/torch2-venv (tools/
setup-debian.sh --torch-venv DIR makes it). Where it is absent or has no torch
2.x this exits 77 (skipped) saying so; it never passes without running.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
DEFAULT_VENV = "/var/cache/weft-ci/torch2-venv"
# the build tree's ways to find weft: none may reach the installed package's tests
BUILD_TREE_VARS = ("PYTHONPATH", "WEFT_TORCH_EXT_DIR", "WEFT_LIBRARY", "LD_LIBRARY_PATH",
                   "PYTHONHOME", "VIRTUAL_ENV")


def log(msg):
    print("[pip_check] " + msg, flush=True)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in BUILD_TREE_VARS}
    env.update(PYTHONDONTWRITEBYTECODE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               OMP_NUM_THREADS="1", WEFT_DEBUG="NONE", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(cmd, cwd, limit, env=None):
    """Runs cmd, prints its output, fails the test on a non-zero status."""
    start = time.monotonic()
    log("$ " + " ".join("'<script>'" if "\n" in c else c for c in cmd))
    p = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=limit)
    print(p.stdout, end="", flush=True)
    log("status %d after %.1f s" % (p.returncode, time.monotonic() - start))
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d" % (os.path.basename(cmd[0]) + " " + " ".join(cmd[1:3]),
                                         p.returncode))
    return p.stdout


def torch_venv():
    """The torch 2.x venv's python, or exits 77 saying why there is none."""
    venv = os.environ.get("WEFT_TORCH_VENV") or DEFAULT_VENV
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print("skipped: no torch 2.x venv at %s (make it: sh tools/setup-debian.sh --torch-venv %s; "
              "WEFT_TORCH_VENV names another)" % (venv, venv))
        sys.exit(SKIP)
    p = subprocess.run([py, "-c", "import numpy, torch; print(torch.__version__)"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    version = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 2:
        print("skipped: %s has no torch 2.x with numpy (%s); make it again: "
              "sh tools/setup-debian.sh --torch-venv %s" % (venv, version or "no output", venv))
        sys.exit(SKIP)
    log("torch venv %s: torch %s" % (venv, version))
    return py


def copy_source(src, dst):
    """The tree as git has it (tracked and untracked, not ignored: no build
    folders), else everything but build*/ and .git."""
    p = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    files = [f for f in p.stdout.decode().split("\0") if f] if p.returncode == 0 else []
    if files:
        for f in files:
            if os.path.isfile(os.path.join(src, f)):
                os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
                shutil.copy2(os.path.join(src, f), os.path.join(dst, f))
    else:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build*", ".git", "__pycache__", ".mesonpy-*"))
    log("source copied to %s (%d files)" % (dst, len(files) or sum(len(f) for _, _, f in os.walk(dst))))


def make_venv(torch_py, path):
    """A venv of the torch venv's Python whose site-packages also holds the torch
    venv's (a .pth file): the same torch, and nothing installed there changes it."""
    run([torch_py, "-m", "venv", path], cwd=os.path.dirname(path), limit=120)
    torch_site = subprocess.check_output(
        [torch_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    py = os.path.join(path, "bin", "python")
    site = subprocess.check_output(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    with open(os.path.join(site, "weft_test_torch_venv.pth"), "w") as f:
        f.write(torch_site + "\n")
    return py


def check_installed(py, venv, cwd, want_cffi):
    """weft and weft.torch import from the venv's site-packages, not a checkout."""
    out = run([py, "-c", """
import os, sys, torch, weft.torch
import weft
print("torch", torch.__version__, "weft.torch from", os.path.dirname(weft.torch.__file__))
if weft.torch._backend is None:
    sys.exit("weft.torch has no backend: %s" % weft.torch._backend_missing)
print("extension", weft.torch._backend.__file__)
try:
    import cffi
except ImportError:
    print("cffi: absent")
else:
    print("cffi: present; libweft:", weft.library_path())
"""], cwd=cwd, limit=120)
    site = os.path.realpath(venv)
    for line in out.splitlines():
        if line.startswith(("torch ", "extension", "cffi: present")):
            path = line.split()[-1]
            if not os.path.realpath(path).startswith(site + os.sep):
                sys.exit("FAIL: %s is not inside the venv %s" % (path, venv))
    ext = [l.split()[-1] for l in out.splitlines() if l.startswith("extension")][0]
    dyn = subprocess.run(["readelf", "-d", ext], stdout=subprocess.PIPE, text=True).stdout
    runpath = [l for l in dyn.splitlines() if "RUNPATH" in l or "RPATH" in l]
    log("extension's " + (runpath[0].split(None, 1)[1] if runpath else "RUNPATH: none"))
    entries = runpath[0].split("[", 1)[1].rstrip("]").split(":") if runpath else []
    if "$ORIGIN/.." not in entries or any("XXX" in e for e in entries):
        sys.exit("FAIL: the extension's RUNPATH is not the package's ($ORIGIN/..): %s" % runpath)
    if ("cffi: present" in out) != want_cffi:
        sys.exit("FAIL: cffi is %s in the venv" % ("absent" if want_cffi else "present"))


def build_args():
    """WEFT_PIP_JOBS=N: ninja -jN inside pip's build (a machine shared with others)."""
    jobs = os.environ.get("WEFT_PIP_JOBS")
    return ["--config-settings=compile-args=-j" + jobs] if jobs else []


def build_wheel(py, source, tmp):
    """One wheel, built as a user builds it: build isolation, meson-python from
    PyPI, against the torch of the Python that runs pip. Both venvs install it."""
    copy = os.path.join(tmp, "src")
    copy_source(source, copy)
    wheels = os.path.join(tmp, "wheels")
    run([py, "-m", "pip", "wheel", "--no-deps", "-w", wheels] + build_args() + [copy], cwd=tmp, limit=1200)
    shutil.rmtree(copy)  # nothing of the source tree is left to import from
    made = glob.glob(os.path.join(wheels, "weft-*.whl"))
    if len(made) != 1:
        sys.exit("FAIL: pip wheel left %s, not one weft wheel" % made)
    log("wheel %s, %d KiB" % (os.path.basename(made[0]), os.path.getsize(made[0]) // 1024))
    return made[0]


def with_deps(a, py, venv, whl, tmp):
    """The wheel with its dependencies (cffi from PyPI), then the torch tests."""
    run([py, "-m", "pip", "install", whl], cwd=tmp, limit=300)
    check_installed(py, venv, tmp, want_cffi=True)
    tests = os.path.join(a.source, "tests", "torch")
    run([py, os.path.join(tests, "without_cffi.py")], cwd=tmp, limit=120)
    for backend in ("weft", "gloo"):
        run([a.weftrun, "-n", "2", "--timeout", "90", py, os.path.join(tests, "hooks_without_cffi.py"),
             backend], cwd=tmp, limit=120)
    run([py, os.path.join(tests, "run.py"), "--launcher", "torchrun", "-n", "2",
         "--", "--parts", "ops,refusals,ddp", "--cases", "15"], cwd=tmp, limit=200)


def without_deps(a, py, venv, whl, tmp):
    """The wheel alone, as where no registry is reachable: no cffi."""
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", whl], cwd=tmp, limit=300)
    check_installed(py, venv, tmp, want_cffi=False)
    out = run([a.weftrun, "-n", "2", "--timeout", "60", py, "-c", """
import torch, torch.distributed as dist
import weft.torch
dist.init_process_group("weft")
rank, size = dist.get_rank(), dist.get_world_size()
x = torch.arange(100000, dtype=torch.float32) * (rank + 1)
dist.all_reduce(x)
want = torch.arange(100000, dtype=torch.float64) * (size * (size + 1) / 2)
assert torch.equal(x.double(), want), "rank %d: all_reduce gave another sum" % rank
transport = weft.torch.peer_transport(1 - rank)
dist.destroy_process_group()
try:
    import weft
    weft.init()
except ImportError as e:
    assert "needs cffi" in str(e), e
else:
    raise AssertionError("weft.init() worked without cffi")
print("rank %d: all_reduce of 2 ranks from the wheel OK (peer over %s)" % (rank, transport))
"""], cwd=tmp, limit=120)
    if out.count("from the wheel OK") != 2:
        sys.exit("FAIL: not both ranks said OK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--weftrun", required=True)
    ap.add_argument("--skip", default="", help="a reason to skip (a sanitizer build)")
    a = ap.parse_args()
    if a.skip:
        print("skipped: " + a.skip)
        return SKIP
    torch_py = torch_venv()
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="weft-pip-")
    try:
        # One build for both venvs, and no --no-build-isolation build: a build
        # costs about a minute on 2 cores, and pip install . runs the same PEP 517
        # build_wheel that pip wheel runs. Venv A stands for the user's torch
        # venv: its pip builds the wheel, against the torch it sees.
        venv_a = os.path.join(tmp, "venv-deps")
        py_a = make_venv(torch_py, venv_a)
        whl = build_wheel(py_a, a.source, tmp)
        with_deps(a, py_a, venv_a, whl, tmp)
        # venv B: the same Python and torch, the wheel alone, no cffi
        venv_b = os.path.join(tmp, "venv-nodeps")
        py_b = make_venv(torch_py, venv_b)
        without_deps(a, py_b, venv_b, whl, tmp)
    finally:
        if os.environ.get("WEFT_PIP_KEEP"):
            log("kept %s (WEFT_PIP_KEEP)" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log("OK in %.1f s" % (time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
