"""Starts tests/torch/ranks.py under a launcher and checks every rank said OK.

  run.py --launcher torchrun|weftrun|mpirun -n N [--weftrun PATH] [-- ranks.py args]
  run.py --launcher direct -n N --kill     (ranks started here; the last one dies)
  run.py --script reinit.py ...            (another rank script of this folder)

Exits 77 (skipped, for meson) when torch, the built backend or the launcher
is missing, so the suite passes on machines without torch.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env, limit):
    """Runs cmd in its own session; on overrun the whole session is killed."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        print(out)
        sys.exit(f"FAIL: {' '.join(cmd)} still ran after {limit} s (a hang)")
    print(out, end="")
    print(f"[run.py] {os.path.basename(cmd[0])} finished in {time.monotonic() - start:.1f} s, status {p.returncode}")
    return p.returncode, out


def check_ok(out, n):
    missing = [r for r in range(n) if f"RANK {r} OK" not in out]
    if missing:
        sys.exit(f"FAIL: ranks {missing} did not finish OK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True, choices=["torchrun", "weftrun", "mpirun", "direct"])
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--weftrun")
    ap.add_argument("--built", type=int, default=1, help="0: meson built no backend (no torch)")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--elastic", action="store_true", help="weftrun --elastic: a killed rank stops nobody")
    ap.add_argument("--limit", type=float, default=110)
    ap.add_argument("--script", default="ranks.py", help="the rank script, in this folder")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()

    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"skipped: {sys.executable} has no torch")
        return SKIP
    if not a.built:
        print("skipped: the weft.torch backend was not built (meson says why: no Python with torch, "
              "no C++ compiler, or a sanitizer build)")
        return SKIP

    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # ranks share two cores; torch's threads would fight
    env["PYTHONUNBUFFERED"] = "1"
    ranks = [sys.executable, os.path.join(HERE, a.script)] + a.rest
    n = a.n

    if a.launcher == "torchrun":
        # --redirects/--tee 1: Debian 12's torchrun (torch 1.13 on Python 3.11)
        # fails on its default "0" (a Flag enum lookup), so stdout is teed instead
        # --monitor_interval: the agent looks at its workers every 5 s by default,
        # so each run outlasted its ranks by up to 5 s
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
               "--redirects", "1", "--tee", "1", "--monitor_interval", "0.1"] + ranks[1:]
        rc, out = run(cmd, env, a.limit)
    elif a.launcher == "weftrun":
        cmd = [a.weftrun, "-n", str(n), "--timeout", str(a.limit - 10)] + \
            (["--elastic"] if a.elastic else []) + ranks
        rc, out = run(cmd, env, a.limit)
    elif a.launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        if not mpirun:
            print("skipped: no mpirun (Debian: apt-get install openmpi-bin)")
            return SKIP
        env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(free_port())
        env["WEFT_TRANSPORT"] = "tcp"  # the other launchers' runs take shm: this one covers tcp
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # weft.torch fills them from Open MPI's
            env.pop(k, None)
        cmd = [mpirun, "-np", str(n), "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        for k in ("MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "WEFT_TORCH_EXT_DIR", "OMP_NUM_THREADS",
                  "PYTHONUNBUFFERED", "WEFT_TRANSPORT"):
            if k in env:
                cmd += ["-x", k]
        rc, out = run(cmd + ranks, env, a.limit)
    else:  # direct: ranks started here, so a dying rank stops nobody else
        port = free_port()
        procs, logs = [], []
        start = time.monotonic()
        for r in range(n):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), WEFT_CHECK="1")
            args = ranks + (["--parts", "kill", "--timeout", "20"] if a.kill else [])
            logs.append(tempfile.TemporaryFile("w+"))
            procs.append(subprocess.Popen(args, env=e, stdout=logs[-1], stderr=subprocess.STDOUT, text=True))
        # the output goes to files: a pipe nobody reads while waiting could fill
        rc, failed = 0, None
        while any(p.poll() is None for p in procs):
            if time.monotonic() - start > a.limit:
                failed = f"ranks {[r for r, p in enumerate(procs) if p.poll() is None]} still ran after {a.limit} s (a hang)"
                break
            bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0) and not (a.kill and r == n - 1)]
            if bad:  # one rank failed: the others would wait for it, so stop now
                failed = f"rank {bad[0]} exited {procs[bad[0]].returncode}"
                break
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        out = ""
        for r, f in enumerate(logs):
            f.seek(0)
            out += "".join(f"[{r}] {line}" for line in f)
            f.close()
        if failed:
            print(out, end="")
            sys.exit(f"FAIL: {failed}")
        for r, p in enumerate(procs):
            if a.kill and r == n - 1:
                if p.returncode != -signal.SIGKILL:
                    sys.exit(f"FAIL: the victim rank {r} exited {p.returncode}, not killed")
            elif p.returncode != 0:
                rc = p.returncode
        print(out, end="")
        print(f"[run.py] {n} ranks finished in {time.monotonic() - start:.1f} s")
        if a.kill:
            check_ok(out, n - 1)
            return 0 if rc == 0 else 1
    if rc != 0 and "SKIP: --device cuda" in out:  # ranks.py: torch sees no GPU here
        print("skipped: --device cuda, but torch sees no GPU here")
        return SKIP
    if rc != 0:
        sys.exit(f"FAIL: the launcher exited {rc}")
    if a.elastic:  # one rank kills itself; every other must end well
        ok = [r for r in range(n) if f"RANK {r} OK" in out]
        if len(ok) != n - 1 or "was killed by signal 9" not in out:
            sys.exit(f"FAIL: ranks {ok} finished OK, want all but the one killed")
        return 0
    check_ok(out, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
