# ranks.py - starts N ranks as processes for the tests and collects what each
# returned or raised. Rank 0 makes a unique id (weft.get_unique_id) and hands
# it to the others over pipes, as a framework would; nothing waits without a
# deadline: a rank still running at the deadline fails the test (a hang).
import multiprocessing
import os
import signal
import traceback


class RankFailed(AssertionError):
    pass


def _child(rank, size, target, args, env, uid_pipes, results):
    try:
        os.environ.update(env)
        if uid_pipes is None:  # the target makes its own communicators
            results.put((rank, "ok", target(rank, size, *args)))
            return
        import weft  # after the environment: the library reads its settings at first use
        if rank == 0:
            uid = weft.get_unique_id()
            for p in uid_pipes[1:]:
                p.send(uid)
        else:
            uid = uid_pipes[rank].recv()
        comm = weft.init(rank, size, unique_id=uid)
        out = target(comm, *args)
        results.put((rank, "ok", out))
        comm.destroy()
    except BaseException as e:  # reported to the parent, which fails the test
        results.put((rank, "error", "%s: %s\n%s" % (type(e).__name__, e,
                                                  traceback.format_exc())))


def run(size, target, *args, timeout=120, env=None, start="fork", may_die=(), comm=True,
        preload=()):
    """Runs target(comm, *args) on `size` ranks; returns the list of what
    each returned. A rank that raised fails the call with its traceback,
    unless its rank is in may_die (then its entry is None, as for a rank
    that died without a word). comm=False: target(rank, size, *args), no
    communicator made (the target sets up torch.distributed, say).
    start="forkserver" with preload=("torch",): the ranks fork from one
    fresh process that imported torch once (1.8 s a rank with "spawn"), and
    not from this one, whose threads a fork would not carry."""
    ctx = multiprocessing.get_context(start)
    if start == "forkserver" and preload:
        ctx.set_forkserver_preload(list(preload))
    if start == "fork":  # the children inherit the parsed declarations (70 ms each otherwise)
        from weft import _lib
        _lib.declarations()
    env = dict(env or {})
    env.setdefault("WEFT_DEBUG", "NONE")
    # the unique id's way: rank 0 writes pipe r, rank r reads it
    pipes = [ctx.Pipe(duplex=False) for _ in range(size)]
    results = ctx.Queue()
    procs = []
    for rank in range(size):
        ends = [None] * size
        for r in range(1, size):
            ends[r] = pipes[r][1] if rank == 0 else (pipes[r][0] if r == rank else None)
        p = ctx.Process(target=_child,
                        args=(rank, size, target, args, env, ends if comm else None, results),
                        name="weft-rank-%d" % rank, daemon=True)
        p.start()
        procs.append(p)
    got = {}
    import queue as _queue
    import time
    deadline = time.monotonic() + timeout
    try:
        # done once every rank that must report has: a rank allowed to die
        # may also be stopped or stuck, and is killed below
        while not set(range(size)) - set(may_die) <= set(got):
            alive = [p for p in procs if p.is_alive()]
            try:
                rank, kind, value = results.get(timeout=0.2)
                got[rank] = (kind, value)
                continue
            except _queue.Empty:
                pass
            if not alive and results.empty():
                break
            if time.monotonic() > deadline:
                missing = sorted(set(range(size)) - set(got))
                raise RankFailed("ranks %s still running after %g s (a hang)" % (missing, timeout))
    finally:
        for rank in may_die:
            if rank not in got and procs[rank].is_alive():
                os.kill(procs[rank].pid, signal.SIGKILL)
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
    out = []
    for rank in range(size):
        kind, value = got.get(rank, ("dead", None))
        if kind == "ok":
            out.append(value)
        elif rank in may_die:
            out.append(None)
        elif kind == "dead":
            raise RankFailed("rank %d of %d died without reporting (exit code %s)"
                             % (rank, size, procs[rank].exitcode))
        else:
            raise RankFailed("rank %d of %d failed: %s" % (rank, size, value))
    return out
