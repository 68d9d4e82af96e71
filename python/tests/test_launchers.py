# test_launchers.py - weft.init() with no arguments under each launcher a
# user starts ranks with: weftrun (from the build tree), torchrun and Open
# MPI's mpirun. Each rank (launched_rank.py) checks an allreduce and an
# allgather and prints one line; every rank's line must come back.
import glob
import os
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "launched_rank.py")
SOURCE_ROOT = os.path.dirname(os.path.dirname(HERE))


def env():
    import weft
    e = dict(os.environ)
    for k in list(e):  # an outer launcher's variables would be read first
        if k.startswith(("WEFT_RANK", "WEFT_SIZE", "WEFT_RENDEZVOUS", "OMPI_", "PMIX_",
                         "SLURM_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                              "MASTER_PORT"):
            del e[k]
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(weft.__file__)))
    e["WEFT_LIBRARY"] = weft.library_path()
    e["WEFT_DEBUG"] = "NONE"
    return e


def check(cmd, size, timeout=120):
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, "%s exited %d:\n%s" % (cmd[0], p.returncode, out[-3000:])
    for r in range(size):
        assert "weft rank %d of %d ok" % (r, size) in out, out[-3000:]


def weftrun_path():
    path = os.environ.get("WEFTRUN")
    if path and os.access(path, os.X_OK):
        return path
    found = glob.glob(os.path.join(SOURCE_ROOT, "build*", "tools", "weftrun"))
    return found[0] if found else shutil.which("weftrun")


@pytest.mark.parametrize("size", [1, 3])
def test_weftrun(size):
    weftrun = weftrun_path()
    if not weftrun:
        pytest.skip("no weftrun (set WEFTRUN, or build the tree)")
    check([weftrun, "-n", str(size), sys.executable, RANK_SCRIPT, str(size)], size)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun():
    pytest.importorskip("torch")
    # --redirects/--tee 2: torch 1.13's parser of their default ("0") breaks on
    # Python 3.11 (enum changes); 2 is valid in every release.
    # c10d rendezvous on a port of our own (--standalone's 29400 may be taken
    # by another job); the workers' MASTER_PORT is then a free port weft uses.
    # --monitor_interval: the agent looks at its workers every 5 s by default,
    # so the run outlasted its workers by up to 5 s
    check([sys.executable, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "2",
           "--nnodes", "1", "--nproc_per_node", "2", "--monitor_interval", "0.1", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "127.0.0.1:%d" % free_port(), "--rdzv_id", "weft-test",
           RANK_SCRIPT, "2"], 2)


def test_mpirun():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" not in version:
        pytest.skip("mpirun is not Open MPI's: %s" % version.splitlines()[:1])
    cmd = [mpirun, "--oversubscribe", "-np", "3"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for k in ("PYTHONPATH", "WEFT_LIBRARY", "WEFT_DEBUG"):
        cmd += ["-x", k]
    check(cmd + [sys.executable, RANK_SCRIPT, "3"], 3)
