# test_collectives.py - every collective, send/recv and split through the
# package on 1 to 4 ranks, blocking and non-blocking, against the references
# of reference.py: random counts, dtypes, ops, roots, numpy and torch
# buffers, in place and not. WEFT_TEST_SEED picks another random draw;
# WEFT_TEST_CASES the number of cases per collective and rank count.
import os
import tempfile

import numpy as np
import pytest

import ranks
import reference as R

SEED = int(os.environ.get("WEFT_TEST_SEED", "20261123"))
CASES = int(os.environ.get("WEFT_TEST_CASES", "12"))
SIZES = [1, 2, 3, 4]
COLLECTIVES = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "gather",
               "scatter", "alltoall", "sendrecv"]


def draw(coll, i, size):
    """The case every rank agrees on (same seed, no rank in it)."""
    g = R.stable_rng(SEED, COLLECTIVES.index(coll), i, size)
    dtypes = [d for d in R.DTYPES if R.kinds_for(d)]
    dtype = dtypes[g.integers(len(dtypes))]
    kinds = R.kinds_for(dtype)
    n = int(R.COUNTS[g.integers(len(R.COUNTS))]) if g.random() < 0.6 else int(g.integers(0, 5000))
    return {"dtype": dtype, "op": R.OPS[g.integers(len(R.OPS))], "n": n,
            "kind": kinds[g.integers(len(kinds))], "root": int(g.integers(size)),
            "inplace": bool(g.integers(2)), "i": i, "coll": coll}


def inputs(c, size, per_rank=1):
    """Every rank's input (as the dtype holds it), n*per_rank elements each."""
    return [R.rounded(R.values(c["dtype"], c["op"], c["n"] * per_rank,
                               R.stable_rng(SEED, COLLECTIVES.index(c["coll"]), c["i"], 1000 + r)),
                      c["dtype"]) for r in range(size)]


def label(c, comm):
    return ("%s case %d (%s %s, %d elements, %s%s, root %d) on rank %d of %d"
            % (c["coll"], c["i"], c["dtype"], c["op"], c["n"], c["kind"],
               ", in place" if c["inplace"] else "", c["root"], comm.rank, comm.size))


def block(v, j, n):
    return v[j * n:(j + 1) * n]


# Each returns (request or None, check): the check runs once the call completed.

def case_allreduce(comm, c, nb):
    xs = inputs(c, comm.size)
    ref, tol = R.reduce(xs, c["op"], c["dtype"]), R.tolerance(xs, c["op"], c["dtype"])
    send = R.make(xs[comm.rank], c["dtype"], c["kind"])
    recv = None if c["inplace"] else R.empty(c["n"], c["dtype"], c["kind"], 7)
    call = comm.iallreduce if nb else comm.allreduce
    req = call(send, recv, op=c["op"])

    def check():
        out = send if recv is None else recv
        R.check(R.read(out, c["dtype"]), ref, tol, label(c, comm))
        if recv is not None:
            R.check(R.read(send, c["dtype"]), xs[comm.rank], 0.0, label(c, comm) + ", send")
    return (req if nb else None), check


def case_broadcast(comm, c, nb):
    xs = inputs(c, comm.size)
    root = c["root"]
    buf = R.make(xs[root], c["dtype"], c["kind"]) if comm.rank == root else \
        R.empty(c["n"], c["dtype"], c["kind"], 3)
    req = (comm.ibroadcast if nb else comm.broadcast)(buf, root)

    def check():
        R.check(R.read(buf, c["dtype"]), xs[root], 0.0, label(c, comm))
    return (req if nb else None), check


def case_reduce(comm, c, nb):
    xs = inputs(c, comm.size)
    ref, tol = R.reduce(xs, c["op"], c["dtype"]), R.tolerance(xs, c["op"], c["dtype"])
    root = c["root"]
    send = R.make(xs[comm.rank], c["dtype"], c["kind"])
    # off the root a recv buffer, if given, must stay untouched
    recv = None if c["inplace"] else R.empty(c["n"], c["dtype"], c["kind"], 5)
    req = (comm.ireduce if nb else comm.reduce)(send, recv, c["op"], root)

    def check():
        if comm.rank == root:
            out = send if recv is None else recv
            R.check(R.read(out, c["dtype"]), ref, tol, label(c, comm))
        elif recv is not None:
            untouched = R.read(R.empty(c["n"], c["dtype"], c["kind"], 5), c["dtype"])
            R.check(R.read(recv, c["dtype"]), untouched, 0.0, label(c, comm) + ", recv off the root")
    return (req if nb else None), check


def case_allgather(comm, c, nb):
    xs = inputs(c, comm.size)
    n, size = c["n"], comm.size
    recv = R.empty(n * size, c["dtype"], c["kind"], 9)
    if c["inplace"]:  # the own block already in place: send is a view of recv
        recv[comm.rank * n:(comm.rank + 1) * n] = R.make(xs[comm.rank], c["dtype"], c["kind"])
        send = recv[comm.rank * n:(comm.rank + 1) * n]
    else:
        send = R.make(xs[comm.rank], c["dtype"], c["kind"])
    req = (comm.iallgather if nb else comm.allgather)(send, recv)

    def check():
        R.check(R.read(recv, c["dtype"]), np.concatenate(xs), 0.0, label(c, comm))
    return (req if nb else None), check


def case_reduce_scatter(comm, c, nb):
    n, size = c["n"], comm.size
    xs = inputs(c, size, per_rank=size)
    ref, tol = R.reduce(xs, c["op"], c["dtype"]), R.tolerance(xs, c["op"], c["dtype"])
    send = R.make(xs[comm.rank], c["dtype"], c["kind"])
    recv = R.empty(n, c["dtype"], c["kind"], 4)
    req = (comm.ireduce_scatter if nb else comm.reduce_scatter)(send, recv, c["op"])

    def check():
        t = tol if np.isscalar(tol) else block(tol, comm.rank, n)
        R.check(R.read(recv, c["dtype"]), block(ref, comm.rank, n), t, label(c, comm))
    return (req if nb else None), check


def case_gather(comm, c, nb):
    xs = inputs(c, comm.size)
    n, size, root = c["n"], comm.size, c["root"]
    send = R.make(xs[comm.rank], c["dtype"], c["kind"])
    recv = R.empty(n * size, c["dtype"], c["kind"], 2) if comm.rank == root else None
    req = (comm.igather if nb else comm.gather)(send, recv, root)

    def check():
        if comm.rank == root:
            R.check(R.read(recv, c["dtype"]), np.concatenate(xs), 0.0, label(c, comm))
    return (req if nb else None), check


def case_scatter(comm, c, nb):
    n, size, root = c["n"], comm.size, c["root"]
    xs = inputs(c, size, per_rank=size)
    send = R.make(xs[root], c["dtype"], c["kind"]) if comm.rank == root else None
    recv = R.empty(n, c["dtype"], c["kind"], 6)
    req = (comm.iscatter if nb else comm.scatter)(send, recv, root)

    def check():
        R.check(R.read(recv, c["dtype"]), block(xs[root], comm.rank, n), 0.0, label(c, comm))
    return (req if nb else None), check


def case_alltoall(comm, c, nb):
    n, size = c["n"], comm.size
    xs = inputs(c, size, per_rank=size)
    send = R.make(xs[comm.rank], c["dtype"], c["kind"])
    recv = R.empty(n * size, c["dtype"], c["kind"], 8)
    req = (comm.ialltoall if nb else comm.alltoall)(send, recv)

    def check():
        # block i of my recv is block (my rank) of rank i's send
        want = np.concatenate([block(xs[i], comm.rank, n) for i in range(size)])
        R.check(R.read(recv, c["dtype"]), want, 0.0, label(c, comm))
    return (req if nb else None), check


def case_sendrecv(comm, c, nb):
    """A ring: each rank sends to rank+1 and receives from rank-1, with the
    case number as the tag (a rank alone sends to itself)."""
    xs = inputs(c, comm.size)
    size, rank = comm.size, comm.rank
    send = R.make(xs[rank], c["dtype"], c["kind"])
    recv = R.empty(c["n"], c["dtype"], c["kind"], 1)
    sreq = comm.isend(send, (rank + 1) % size, tag=c["i"])
    if nb:
        rreq = comm.irecv(recv, (rank - 1) % size, tag=c["i"])
    else:
        comm.recv(recv, (rank - 1) % size, tag=c["i"])
        sreq.wait()

    class Both:  # one handle for the runner, waiting for both
        def wait(self, timeout=None):
            rreq.wait(timeout)
            sreq.wait(timeout)

        def test(self):
            return rreq.test() and sreq.test()

    def check():
        R.check(R.read(recv, c["dtype"]), xs[(rank - 1) % size], 0.0, label(c, comm))
    return (Both() if nb else None), check


CASE_FUNCS = {name: globals()["case_" + name] for name in COLLECTIVES}


def run_cases(comm, coll, nb):
    """Runs CASES cases of coll; non-blocking: all issued before any is
    waited for, then completed in a shuffled order, by wait(), by a test()
    loop or by wait(timeout)."""
    cases = [draw(coll, i, comm.size) for i in range(CASES)]
    if not nb:
        for c in cases:
            _, check = CASE_FUNCS[coll](comm, c, False)
            check()
        return len(cases)
    issued = [CASE_FUNCS[coll](comm, c, True) for c in cases]
    order = R.stable_rng(SEED, comm.rank, 77).permutation(len(issued))
    for k, j in enumerate(order):
        req, check = issued[j]
        how = k % 3
        if how == 0:
            req.wait()
        elif how == 1:
            while not req.test():
                pass
        else:
            req.wait(timeout=60)
        check()
    return len(cases)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("coll", COLLECTIVES)
def test_blocking(coll, size):
    assert ranks.run(size, run_cases, coll, False) == [CASES] * size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("coll", COLLECTIVES)
def test_nonblocking(coll, size):
    assert ranks.run(size, run_cases, coll, True) == [CASES] * size


def every_dtype_and_op(comm):
    """allreduce of every dtype x op x container at a multi-chunk count."""
    n = 0
    for dtype in R.DTYPES:
        for op in R.OPS:
            for kind in R.kinds_for(dtype):
                # past one 256 KiB chunk where the reference is cheap (floats)
                big = kind == "numpy" and dtype in R.FLOATS
                c = {"dtype": dtype, "op": op, "n": 70001 if big else 3001,
                     "kind": kind, "root": 0, "inplace": n % 2 == 0, "i": n,
                     "coll": "allreduce"}
                case_allreduce(comm, c, False)[1]()
                n += 1
    return n


@pytest.mark.parametrize("size", [1, 3, 4])
def test_every_dtype_and_op(size):
    got = ranks.run(size, every_dtype_and_op)
    assert got[0] > 0 and len(set(got)) == 1


def split_and_reduce(comm):
    """Split by parity with keys reversing the order; the sub-communicator
    must rank its members by key and reduce among them only."""
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == sorted(members, reverse=True).index(comm.rank), (sub.rank, comm.rank)
    x = np.array([comm.rank + 1, 10 * (comm.rank + 1)], dtype=np.int64)
    sub.allreduce(x)
    want = [sum(r + 1 for r in members), sum(10 * (r + 1) for r in members)]
    assert x.tolist() == want, (x.tolist(), want)
    # a rank that joins none gets None; the rest still form a communicator
    none = comm.split(None if comm.rank == 0 else 1)
    assert (none is None) == (comm.rank == 0)
    if none is not None:
        y = np.ones(3, np.float32)
        none.allreduce(y)
        assert y.tolist() == [comm.size - 1.0] * 3
        none.destroy()
    with sub:  # context manager: destroyed on exit
        pass
    assert "destroyed" in repr(sub)
    return sub.size


@pytest.mark.parametrize("size", SIZES)
def test_split(size):
    ranks.run(size, split_and_reduce)


def barrier_orders(comm, folder):
    """Every rank leaves a file before the barrier (the later ranks late);
    after it, every rank must see every file."""
    import time
    time.sleep(0.05 * comm.rank)
    open(os.path.join(folder, "rank%d" % comm.rank), "w").close()
    comm.barrier()
    seen = sorted(os.listdir(folder))
    assert len(seen) == comm.size, "after the barrier rank %d sees %s" % (comm.rank, seen)
    comm.ibarrier().wait()
    return True


@pytest.mark.parametrize("size", [2, 4])
def test_barrier(size):
    with tempfile.TemporaryDirectory() as folder:
        ranks.run(size, barrier_orders, folder)


def test_checker_can_fail():
    """The comparison used by every test above refuses a wrong value, a
    wrong integer and a wrong length."""
    ref = np.array([1.0, 2.0, 3.0])
    R.check(ref.copy(), ref, 0.0, "same")
    with pytest.raises(AssertionError, match="element 1"):
        R.check(np.array([1.0, 2.25, 3.0]), ref, 0.0, "wrong")
    with pytest.raises(AssertionError):
        R.check(np.array([1, 2], dtype=object), np.array([1, 3], dtype=object), 0.0, "int")
    with pytest.raises(AssertionError):
        R.check(ref[:2], ref, 0.0, "short")
    # the wrapping reference: int8 127 + 1 is -128
    assert R.reduce([np.array([127], dtype=object), np.array([1], dtype=object)], "sum",
                    "i8").tolist() == [-128]
    # i32 avg sums in 64 bits: no wrap, truncation toward zero
    assert R.reduce([np.array([2 ** 31 - 1], dtype=object)] * 2 + [np.array([-7], dtype=object)],
                    "avg", "i32").tolist() == [(2 * (2 ** 31 - 1) - 7) // 3]
