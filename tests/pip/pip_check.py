"""pip wheel . as a user runs it (issue 38), on a copy of the source tree, the
wheel installed into two throwaway venvs that see the torch 2.x venv's packages
(a .pth file) and nothing of the build tree; then weft.torch's tests there, from
a folder outside the source tree.

  pip_check.py --source DIR --weftrun PATH
      pip wheel --no-deps COPY with build isolation (meson-python from PyPI), once;
      venv A: pip install WHEEL (cffi from PyPI); the torch tests: without_cffi.py,
      hooks_without_cffi.py (2 ranks, weft and gloo default groups), ranks.py
      under torchrun (2 ranks: ops, DDP), reinit.py, frameworks.py (FSDP2,
      DTensor, FSDP1, DCP, ZeRO, PREMUL_SUM, the coalesced calls),
      grad_reducer.py (weft.torch.GradReducer); Lightning
      and accelerate from PyPI, launchers.py
      venv B: pip install --no-deps --no-index WHEEL (no cffi): import weft.torch,
      a 2-rank all_reduce under weftrun, weft.init() saying it needs cffi
      venv A and B: weftrun, weft-bench, weft-info and python -m weft from the wheel
      venv C: Debian's python3 -m venv --system-site-packages, pip install COPY:
      the backend built against Debian's torch, a 2-rank all_reduce
      offline: Debian's meson-python reads pyproject.toml, runs meson's setup and
      writes the metadata (the offline install of docs/python.md, but its compile)

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
    # init_process_group / destroy_process_group 20 times in one process under
    # torchrun (its agent store outlives every group), a retry after a failed
    # init, inits that differ (issue 44)
    for n in ("2", "3"):
        run([py, os.path.join(tests, "run.py"), "--launcher", "torchrun", "-n", n, "--script", "reinit.py"],
            cwd=tmp, limit=200)
    # issue 50: the coalesced calls, PREMUL_SUM, DTensor, FSDP2, FSDP1, DCP and
    # ZeRO, each of which this torch has, against gloo and one process
    run([py, os.path.join(tests, "run.py"), "--launcher", "torchrun", "-n", "2", "--script", "frameworks.py",
         "--", "--require", "premul,batch_p2p,coalesced,dtensor,fsdp2,fsdp1,dcp,zero"], cwd=tmp, limit=200)
    # issue 46: weft.torch.GradReducer (the gradient sets, from the installed wheel)
    run([py, os.path.join(tests, "run.py"), "--launcher", "torchrun", "-n", "2", "--script", "grad_reducer.py"],
        cwd=tmp, limit=200)
    launchers(py, tests, tmp)
    check_tools(py, venv, tmp)


def launchers(py, tests, tmp):
    """Lightning (ddp, ddp_spawn) and accelerate from PyPI into this venv, as
    a user installs them, then each started as docs/torch.md says (issue 50)."""
    run([py, "-m", "pip", "install", "-q", "lightning", "accelerate"], cwd=tmp, limit=300)
    out = run([py, os.path.join(tests, "launchers.py"), "check"], cwd=tmp, limit=400)
    if "launchers: OK" not in out:
        sys.exit("FAIL: launchers.py check did not end OK")


def check_tools(py, venv, tmp):
    """weftrun, weft-bench and weft-info from the wheel: the console scripts in
    the venv's bin, and python -m weft run|bench|info (issue 44)."""
    bindir = os.path.join(venv, "bin")
    info = run([os.path.join(bindir, "weft-info")], cwd=tmp, limit=60)
    if "transports:" not in info:
        sys.exit("FAIL: weft-info from the wheel printed no transports line")
    # pyproject builds with -Dcuda=auto: where the toolkit is, the wheel has the
    # GPU path and its kernels (issue 45: it once had -Dcuda=disabled)
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if os.path.exists(os.path.join(cuda_home, "include", "cuda.h")) and \
            os.access(os.path.join(cuda_home, "bin", "nvcc"), os.X_OK):
        if "cuda: built" not in info or "with kernels" not in info:
            line = next((l for l in info.splitlines() if l.startswith("cuda")), "no cuda line")
            sys.exit(f"FAIL: the CUDA toolkit is in {cuda_home}, but the wheel's weft-info says: {line}")
    if "transports:" not in run([py, "-m", "weft", "info"], cwd=tmp, limit=60):
        sys.exit("FAIL: python -m weft info printed no transports line")
    bench = [os.path.join(bindir, "weftrun"), "-n", "2", "--timeout", "60", os.path.join(bindir, "weft-bench"),
             "-b", "1024", "-e", "65536", "-n", "5"]
    if "Out of bounds values : 0 OK" not in run(bench, cwd=tmp, limit=90):
        sys.exit("FAIL: weftrun -n 2 weft-bench from the wheel did not check out")
    out = run([py, "-m", "weft", "run", "-n", "2", "--timeout", "60", py, "-m", "weft", "bench",
               "-c", "broadcast", "-b", "1024", "-e", "4096", "-n", "3"], cwd=tmp, limit=90)
    if "Out of bounds values : 0 OK" not in out:
        sys.exit("FAIL: python -m weft run -n 2 python -m weft bench did not check out")


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
    # the tools need no cffi
    if "transports:" not in run([py, "-m", "weft", "info"], cwd=tmp, limit=60):
        sys.exit("FAIL: python -m weft info printed no transports line without cffi")


SYSTEM_PY = "/usr/bin/python3"


def system_torch_version():
    """Debian's torch as the system Python imports it, or None."""
    p = subprocess.run([SYSTEM_PY, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, env=clean_env())
    return p.stdout.strip() if p.returncode == 0 else None


def system_venv(a, tmp, name, pip_args):
    """A venv of Debian's python3 over its system site-packages (Debian's torch),
    weft installed into it from a copy of the source with pip_args; checks the
    backend was built against that torch. Returns the venv's python."""
    venv = os.path.join(tmp, name)
    run([SYSTEM_PY, "-m", "venv", "--system-site-packages", venv], cwd=tmp, limit=120)
    py = os.path.join(venv, "bin", "python")
    copy = os.path.join(tmp, "src-" + name)
    copy_source(a.source, copy)
    run([py, "-m", "pip", "install"] + pip_args + build_args() + [copy], cwd=tmp, limit=1200)
    shutil.rmtree(copy)
    out = run([py, "-c", """
import os, torch, weft.torch
print("torch", torch.__version__, "from", os.path.dirname(torch.__file__))
print("backend built against torch", weft.torch._backend.torch_version_built, "at", weft.torch._backend.__file__)
"""], cwd=tmp, limit=120)
    built = [l.split()[4] for l in out.splitlines() if l.startswith("backend built against torch")][0]
    imported = system_torch_version()
    if not imported.startswith(built):
        sys.exit("FAIL: the backend was built against torch %s, the venv imports %s" % (built, imported))
    if "transports:" not in run([py, "-m", "weft", "info"], cwd=tmp, limit=60):
        sys.exit("FAIL: python -m weft info printed no transports line")
    return py


def offline(a, tmp):
    """The offline install docs/python.md describes, --no-build-isolation with
    Debian's own meson-python (0.12), as far as it differs from the builds
    above: meson-python reading pyproject.toml (issue 44: 0.12 once refused it,
    "Unknown configuration key tool.meson-python.args.dist"), meson's setup,
    and the metadata with the three console scripts. Not the compile, which is
    the one above (a full offline install: docs/python.md)."""
    if subprocess.run([SYSTEM_PY, "-c", "import mesonpy"], env=clean_env(), stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        log("no Debian meson-python (apt-get install python3-mesonpy): the offline install is not tried")
        return
    copy = os.path.join(tmp, "src-offline")
    copy_source(a.source, copy)
    meta = os.path.join(tmp, "offline-metadata")
    os.makedirs(meta)
    scripts = run([SYSTEM_PY, "-c", """
import mesonpy, os, sys
os.chdir(sys.argv[1])
print("meson-python", mesonpy.__version__)
if hasattr(mesonpy, "prepare_metadata_for_build_wheel"):
    info = mesonpy.prepare_metadata_for_build_wheel(sys.argv[2])
    print(open(os.path.join(sys.argv[2], info, "entry_points.txt")).read())
else:  # 0.12 (Debian 12) has no such hook: the project as its build_wheel makes it
    with mesonpy._project({}) as p:
        print(p._wheel_builder.entrypoints_txt.decode())
""", copy, meta], cwd=tmp, limit=300)
    shutil.rmtree(copy)
    for tool in ("weftrun", "weft-bench", "weft-info"):
        if tool not in scripts:
            sys.exit("FAIL: the offline metadata has no console script %s: %s" % (tool, scripts))


def system_torch(a, tmp):
    """pip install . in a venv that sees Debian's torch through
    --system-site-packages (issue 44: such an install once left out the backend,
    saying nothing): the backend must be built against that torch, and work."""
    if not system_torch_version():
        log("no system torch (%s cannot import torch): the --system-site-packages venv is not tried" % SYSTEM_PY)
        return
    py = system_venv(a, tmp, "venv-system-torch", [])
    out = run([a.weftrun, "-n", "2", "--timeout", "60", py, "-c", """
import torch, torch.distributed as dist
import weft.torch
dist.init_process_group("weft")
rank, size = dist.get_rank(), dist.get_world_size()
x = torch.arange(1000, dtype=torch.float64) * (rank + 1)
dist.all_reduce(x)
assert torch.equal(x, torch.arange(1000, dtype=torch.float64) * 3), "rank %d: all_reduce gave another sum" % rank
dist.destroy_process_group()
print("rank %d: all_reduce over the system torch OK" % rank)
"""], cwd=tmp, limit=120)
    if out.count("over the system torch OK") != 2:
        sys.exit("FAIL: not both ranks said OK over the system torch")


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
        # venv C: Debian's python and torch, seen through --system-site-packages
        system_torch(a, tmp)
        # the offline install's own part: Debian's meson-python on this pyproject.toml
        offline(a, tmp)
    finally:
        if os.environ.get("WEFT_PIP_KEEP"):
            log("kept %s (WEFT_PIP_KEEP)" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log("OK in %.1f s" % (time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
