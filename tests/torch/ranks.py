"""One rank of the weft.torch tests, started by torchrun, weftrun, mpirun or
tests/torch/run.py. Every rank makes every rank's inputs from the same seeds,
so it computes each op's reference itself, independently of any backend, in
float64 / int64. Prints "RANK r OK" at the end; any failure raises.

  ops        every op through dist.*, random sizes, dtypes, ops and roots; a
             tensor and a DDP bucket reused for 20 steps (moved to shared memory)
  refusals   bad input refused with a sentence naming the call, on every rank
  ddp        a digits MLP trained one epoch with DDP on backend "weft": its
             parameters must equal a 1-process run within 1e-6

  --device cuda: the ops, send/recv included (the GPU machine)
             and DDP on CUDA tensors, every rank on cuda:0 (several ranks on
             one GPU, which NCCL refuses); the references are computed on the
             CPU as always. The GPU machine runs it (tools/gpu_check.sh).
  kill       (run.py --kill) one rank's tensor is refused: the others time
             out (3 s), naming it; ranks pass different counts to one allreduce
             (WEFT_CHECK=1): every rank must raise; then the last rank dies
             inside a loop of allreduces: the others must get an exception
             naming the call and the peer
"""
import argparse
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist

import weft.torch  # noqa: F401  registers the backend "weft"

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
# moved as bytes: weft cannot reduce them, but broadcast and gathers move them
BYTES_ONLY = [torch.bool, torch.int16, torch.complex64]
DEV = "cpu"  # --device: where the tensors the backend sees live

OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def gen(seed, case, rank, dtype, n, op="sum"):
    """Rank `rank`'s input of `case`, on DEV: the same on every rank that asks."""
    return gen_cpu(seed, case, rank, dtype, n, op).to(DEV)


def zeros(*shape, dtype):
    return torch.zeros(*shape, dtype=dtype, device=DEV)


def gen_cpu(seed, case, rank, dtype, n, op="sum"):
    g = torch.Generator().manual_seed(seed * 1_000_003 + case * 1009 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype == torch.complex64:
        return torch.randn(n, 2, generator=g).contiguous().view(torch.complex64).reshape(n)
    if dtype in FLOATS:
        # drawn in float32 for the 16-bit types (then rounded), else in dtype:
        # a float64 draw and a conversion took 3x as long, and run_reused
        # draws 2 MiB per rank per step on every rank
        draw = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        if op == "product":
            v = torch.randint(-2, 3, (n,), generator=g, dtype=draw)
        elif case % 2:
            v = torch.randn(n, generator=g, dtype=draw) * 4
        else:  # integer values: sums exact in every float type
            v = torch.randint(-8, 9, (n,), generator=g, dtype=draw)
        return v.to(dtype)
    lo, hi = {torch.int8: (-128, 128), torch.uint8: (0, 256), torch.int16: (-2**15, 2**15),
              torch.int32: (-2**31, 2**31), torch.int64: (-2**40, 2**40)}[dtype]
    if op == "product":
        lo, hi = (-3, 4) if dtype != torch.uint8 else (0, 4)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def reference(inputs, op, dtype):
    """op over ranks in float64 / int64, then rounded (floats) or wrapped (ints) to dtype."""
    wide = torch.float64 if dtype in FLOATS else torch.int64
    xs = torch.stack([x.cpu().to(wide) for x in inputs])
    if op in ("sum", "avg"):
        r = xs.sum(0)
        if op == "avg":
            r = r / len(inputs) if dtype in FLOATS else torch.div(r, len(inputs), rounding_mode="trunc")
    elif op == "product":
        r = xs.prod(0)
    elif op == "min":
        r = xs.min(0).values
    else:
        r = xs.max(0).values
    if dtype in INTS and dtype != torch.int64:  # wrap as two's complement, like weft does (int64 inputs cannot overflow)
        bits = torch.iinfo(dtype).bits
        r = r & ((1 << bits) - 1)
        if dtype != torch.uint8:
            r = torch.where(r >= (1 << (bits - 1)), r - (1 << bits), r)
    return r


def check(got, want, dtype, what, inputs=None):
    """Equal for ints; within a few roundings of dtype for floats."""
    got, want = got.cpu(), want.cpu()
    inputs = [x.cpu() for x in inputs] if inputs else inputs
    if dtype in FLOATS:
        scale = torch.stack([x.double().abs() for x in inputs]).sum(0) if inputs else want.double().abs()
        eps = {torch.float32: 2e-7, torch.float64: 1e-15, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
        tol = 4 * eps * (scale + want.double().abs() + 1)
        bad = (got.double() - want.double()).abs() > tol
    elif dtype == torch.complex64 or dtype == torch.bool:
        bad = got != want
    else:
        bad = got.to(torch.int64) != want.to(torch.int64)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError(f"{what}: element {i} of {got.numel()} is {got.reshape(-1)[i].item()}, "
                             f"expected {want.reshape(-1)[i].item()}")


def random_count(rng, mult=1):
    return mult * rng.choice([0, 1, 3, rng.randint(2, 300), rng.randint(300, 5000), rng.randint(5000, 70000)])


def run_ops(seed, cases):
    rank, size = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)  # same choices on every rank
    kinds = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
             "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all",
             "gather", "scatter", "send_recv", "barrier", "coalesced", "async_many"]
    done = {}
    for case in range(cases):
        kind = kinds[case % len(kinds)]
        reduces = kind in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "coalesced", "async_many")
        dtype = rng.choice(FLOATS + INTS if reduces else FLOATS + INTS + BYTES_ONLY)
        op = rng.choice(list(OPS))
        root = rng.randrange(size)
        what = f"case {case}: {kind} {str(dtype)[6:]} {op if reduces else ''} root {root} on {size} ranks"
        if kind == "all_reduce":
            n = random_count(rng)
            ins = [gen(seed, case, r, dtype, n, op) for r in range(size)]
            t = ins[rank].clone()
            dist.all_reduce(t, op=OPS[op])
            check(t, reference(ins, op, dtype), dtype, what, ins)
        elif kind == "broadcast":
            n = random_count(rng)
            t = gen(seed, case, rank, dtype, n)
            dist.broadcast(t, src=root)
            check(t, gen(seed, case, root, dtype, n), dtype, what)
        elif kind == "reduce":
            n = random_count(rng)
            ins = [gen(seed, case, r, dtype, n, op) for r in range(size)]
            t = ins[rank].clone()
            dist.reduce(t, dst=root, op=OPS[op])
            if rank == root:
                check(t, reference(ins, op, dtype), dtype, what, ins)
        elif kind in ("all_gather", "all_gather_into_tensor"):
            n = random_count(rng)
            ins = [gen(seed, case, r, dtype, n) for r in range(size)]
            if kind == "all_gather":
                outs = [zeros(n, dtype=dtype) for _ in range(size)]
                dist.all_gather(outs, ins[rank])
                out = torch.cat(outs)
            elif rng.random() < 0.5:
                out = zeros(size * n, dtype=dtype)
                dist.all_gather_into_tensor(out, ins[rank])
            else:  # in place, as FSDP does: the input is this rank's block of the output
                out = zeros(size * n, dtype=dtype)
                out[rank * n:(rank + 1) * n] = ins[rank]
                dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
                what += " in place"
            check(out, torch.cat(ins), dtype, what)
        elif kind in ("reduce_scatter", "reduce_scatter_tensor"):
            n = random_count(rng)
            ins = [gen(seed, case, r, dtype, size * n, op) for r in range(size)]
            out = zeros(n, dtype=dtype)
            if kind == "reduce_scatter":
                dist.reduce_scatter(out, list(ins[rank].clone().chunk(size)) if n else
                                    [zeros(0, dtype=dtype)] * size, op=OPS[op])
            elif rng.random() < 0.5:
                dist.reduce_scatter_tensor(out, ins[rank].clone(), op=OPS[op])
            else:  # in place: the output is this rank's block of the input
                buf = ins[rank].clone()
                out = buf[rank * n:(rank + 1) * n]
                dist.reduce_scatter_tensor(out, buf, op=OPS[op])
                what += " in place"
            mine = [x[rank * n:(rank + 1) * n] for x in ins]
            check(out, reference(mine, op, dtype), dtype, what, mine)
        elif kind in ("all_to_all_single", "all_to_all"):
            n = random_count(rng)
            ins = [gen(seed, case, r, dtype, size * n) for r in range(size)]
            want = torch.cat([x[rank * n:(rank + 1) * n] for x in ins])
            if kind == "all_to_all_single":
                out = zeros(size * n, dtype=dtype)
                splits = [n] * size if rng.random() < 0.5 else None
                dist.all_to_all_single(out, ins[rank], splits, splits)
            else:
                outs = [zeros(n, dtype=dtype) for _ in range(size)]
                dist.all_to_all(outs, list(ins[rank].chunk(size)) if n else [zeros(0, dtype=dtype)] * size)
                out = torch.cat(outs)
            check(out, want, dtype, what)
        elif kind == "gather":
            n = random_count(rng)
            ins = [gen(seed, case, r, dtype, n) for r in range(size)]
            outs = [zeros(n, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(ins[rank], outs, dst=root)
            if rank == root:
                check(torch.cat(outs), torch.cat(ins), dtype, what)
        elif kind == "scatter":
            n = random_count(rng)
            full = gen(seed, case, root, dtype, size * n)
            out = zeros(n, dtype=dtype)
            dist.scatter(out, list(full.chunk(size)) if rank == root and n else
                         ([zeros(0, dtype=dtype)] * size if rank == root else None), src=root)
            check(out, full[rank * n:(rank + 1) * n], dtype, what)
        elif kind == "send_recv":
            if size == 1:
                continue
            n = random_count(rng)
            tag = rng.randrange(1000)
            right, left = (rank + 1) % size, (rank - 1) % size
            out = zeros(n, dtype=dtype)
            mine = gen(seed, case, rank, dtype, n)
            if case % 2:  # the blocking forms: even ranks send first, odd ranks receive first
                if rank % 2 == 0:
                    dist.send(mine, dst=right, tag=tag)
                    dist.recv(out, src=left, tag=tag)
                else:
                    dist.recv(out, src=left, tag=tag)
                    dist.send(mine, dst=right, tag=tag)
            else:
                # receive posted first on every rank: the sends never wait for a receive
                reqs = [dist.irecv(out, src=left, tag=tag), dist.isend(mine, dst=right, tag=tag)]
                for q in reqs[::-1]:
                    q.wait()
            check(out, gen(seed, case, left, dtype, n), dtype, what)
        elif kind == "barrier":
            dist.barrier()
        elif kind == "coalesced":
            k = rng.randint(1, 5)
            if not hasattr(dist, "all_reduce_coalesced"):  # deprecated in torch 2.x
                continue
            ns = [random_count(rng) for _ in range(k)]
            ins = [[gen(seed, case * 10 + j, r, dtype, ns[j], op) for r in range(size)] for j in range(k)]
            ts = [x[rank].clone() for x in ins]
            dist.all_reduce_coalesced(ts, op=OPS[op])
            for j in range(k):
                check(ts[j], reference(ins[j], op, dtype), dtype, f"{what}, tensor {j}", ins[j])
        elif kind == "async_many":
            # several works in flight, waited for in reverse order
            k = rng.randint(2, 6)
            ns = [random_count(rng) for _ in range(k)]
            ins = [[gen(seed, case * 10 + j, r, dtype, ns[j], op) for r in range(size)] for j in range(k)]
            ts = [x[rank].clone() for x in ins]
            works = [dist.all_reduce(t, op=OPS[op], async_op=True) for t in ts]
            for w in works[::-1]:
                w.wait()
            for j in range(k):
                check(ts[j], reference(ins[j], op, dtype), dtype, f"{what}, tensor {j}", ins[j])
        done[kind] = done.get(kind, 0) + 1
    return done


def run_groups(seed):
    """A process group per parity of rank (dist.new_group): each is a weft
    communicator of its own, met through its own store prefix."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        return
    groups = [dist.new_group(list(range(p, size, 2))) for p in (0, 1)]
    mine = list(range(rank % 2, size, 2))
    ins = [gen(seed, 999, r, torch.float64, 1000) for r in mine]
    t = ins[mine.index(rank)].clone()
    dist.all_reduce(t, group=groups[rank % 2])
    check(t, reference(ins, "sum", torch.float64), torch.float64, f"allreduce in the group {mine}", ins)
    dist.barrier()


class _Scale(torch.nn.Module):
    """sum(p * x): the gradient of p is x."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return (self.p * x).sum()


def run_reused(seed):
    """A tensor allreduced again and again (as DDP's buckets are) moves into
    weft's shared memory at its second allreduce when every peer is on this
    host over shm: every result must stay right, before and after, through a
    view taken before the move and with two allreduces of it in flight at once
    (the second must not move memory the first still uses).

    The inputs are small integers (gen's even cases), so every sum and average
    here is exact in float32 in any order and the check is equality: a float
    draw and a float64 reference with tolerances took 3/4 of this part's time
    (it draws 2 MiB per rank per step on every rank); run_ops covers rounding."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 1 << 19  # 2 MiB of float32: weft's direct allreduce starts at 1 MiB

    def inputs(case):
        return [gen(seed, 2 * case, r, torch.float32, n) for r in range(size)]

    def total(ins):  # exact: |x| <= 8, at most a few ranks
        s = ins[0].clone()
        for x in ins[1:]:
            s += x
        return s

    def same(got, want, what):
        if not torch.equal(got, want):
            i = int((got != want).nonzero()[0])
            raise AssertionError(f"{what}: element {i} of {got.numel()} is {got[i].item()}, "
                                 f"expected {want[i].item()}")

    t = torch.empty(n)
    head = t[:1000]  # a view, like a gradient of gradient_as_bucket_view
    first = t.data_ptr()
    for i in range(20):  # weft asks for the direct path again every 16 calls
        ins = inputs(1000 + i)
        t.copy_(ins[rank])
        if i == 5:  # two in flight: sums twice
            works = [dist.all_reduce(t, async_op=True) for _ in range(2)]
            for w in works:
                w.wait()
            same(t, total(ins) * size, f"two allreduces in flight of a reused tensor, call {i}")
            continue
        dist.all_reduce(t)
        want = total(ins)
        same(t, want, f"allreduce of a reused tensor, call {i}")
        same(head, want[:1000], f"a view of a reused tensor, call {i}")
    # DDP's buckets, the tensors this is for: a 2 MiB parameter whose gradient
    # on rank r is rank r's input, averaged over 20 steps (the bucket moves at
    # its second, weft's direct path takes it from about the 17th)
    for view in (False, True):
        p = torch.nn.Parameter(torch.zeros(n))
        model = torch.nn.parallel.DistributedDataParallel(_Scale(p), gradient_as_bucket_view=view)
        for i in range(20):
            ins = inputs(1500 + i)
            model.zero_grad(set_to_none=True)
            model(ins[rank]).backward()
            what = f"DDP (gradient_as_bucket_view={view}) gradient of a 2 MiB parameter, step {i}"
            if size & (size - 1):  # DDP divides before it sums: x / 3 rounds
                check(p.grad, total(ins) / size, torch.float32, what, [x / size for x in ins])
            else:
                same(p.grad, total(ins) / size, what)
        del model
    all_shm = size > 1 and all(weft.torch.peer_transport(p) == "shm" for p in range(size) if p != rank)
    share = os.environ.get("WEFT_TORCH_SHARED_BUCKETS", "0") == "1"
    moved = t.data_ptr() != first
    assert moved == (all_shm and share), (
        f"rank {rank}: the reused tensor {'moved' if moved else 'did not move'} into shared "
        f"memory (every peer over shm: {all_shm}, WEFT_TORCH_SHARED_BUCKETS on: {share})")


TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def expect_refusal(fn, *words, torch2_may_refuse=False, torch2_may_pass=False):
    """fn must raise naming `words`; torch 2.x refuses some input itself,
    before the backend sees it, in its own words (torch2_may_refuse), or
    handles it without the backend (torch2_may_pass)."""
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        msg = str(e)
        if torch2_may_refuse and TORCH2 and "weft" not in msg:
            return msg
        missing = [w for w in words if w not in msg]
        if missing:
            raise AssertionError(f"refusal lacks {missing}: {msg}")
        return msg
    if torch2_may_pass and TORCH2:
        return None
    raise AssertionError(f"not refused: expected an error naming {words}")


def run_refusals():
    """Each is refused on every rank before anything is sent, so the group
    stays usable; an allreduce at the end proves it."""
    size = dist.get_world_size()
    expect_refusal(lambda: dist.all_reduce(torch.zeros(4, 4).t()), "allreduce", "not contiguous")
    expect_refusal(lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int16)), "allreduce",
                   "cannot reduce torch.int16 tensors")
    expect_refusal(lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32), op=dist.ReduceOp.BAND),
                   "allreduce", "BAND")
    # what docs/torch.md says of meta tensors: torch 1.13 hands them to weft,
    # which refuses them naming the call; torch 2.x (2.15) runs its own meta
    # kernel, which returns without calling any backend
    meta = torch.zeros(3, device="meta")
    if TORCH2:
        assert dist.all_reduce(meta) is None, "torch 2.x: all_reduce of a meta tensor did not just return"
    else:
        expect_refusal(lambda: dist.all_reduce(meta), "allreduce", "CPU")
    expect_refusal(lambda: dist.recv(torch.zeros(3)), "any source")
    if torch.cuda.is_available() and size > 1:  # the GPU machine
        if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 2):  # else they take CUDA tensors
            expect_refusal(lambda: dist.all_reduce(torch.zeros(3, device="cuda")), "allreduce",
                           "torch 2.2 or later")
    if size > 1:
        splits = [2] + [1] * (size - 1)
        expect_refusal(lambda: dist.all_to_all_single(torch.zeros(size + 1), torch.zeros(size + 1), splits, splits),
                       "alltoall_base", "unequal split sizes")
    expect_refusal(lambda: dist.all_gather_into_tensor(torch.zeros(size * 3 + 1), torch.zeros(3)),
                   "allgather_into_tensor", "elements", torch2_may_refuse=True)
    t = torch.ones(5)
    dist.all_reduce(t)
    check(t, torch.full((5,), float(size)), torch.float32, "allreduce after refusals")


# ---- DDP ---------------------------------------------------------------------------

def digits():
    """sklearn's digits (1797 8x8 images, 10 classes); where sklearn is
    missing, data of the same shape from a fixed seed, so the DDP check
    still runs (it compares two trainings on the same data, whatever they are)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        print("DDP: no sklearn here (python3-sklearn); training on generated 8x8 data instead", flush=True)
        g = torch.Generator().manual_seed(11)
        y = torch.randint(0, 10, (1797,), generator=g)
        centers = torch.rand(10, 64, generator=g)
        return (centers[y] + 0.3 * torch.rand(1797, 64, generator=g)).float(), y
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    return x, y


def mlp():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Tanh(), torch.nn.Linear(48, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 10))


def train(model, batches, step):
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for xb, yb in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        step(opt)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run_ddp():
    """One epoch, global batch 64 split evenly over the ranks: the mean of
    the ranks' mean losses is the 1-process loss, so the parameters must
    agree to float rounding (1e-6). The same epoch without the reduction
    (each rank on its own share) must land far off: that shows the bound
    can fail."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = digits()
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(7))
    gb, per = 64, 64 // size
    steps = len(x) // gb
    glob = [(x[perm[s * gb:(s + 1) * gb]], y[perm[s * gb:(s + 1) * gb]]) for s in range(steps)]
    mine = [(xb[rank * per:(rank + 1) * per], yb[rank * per:(rank + 1) * per]) for xb, yb in glob]

    glob = [(xb.to(DEV), yb.to(DEV)) for xb, yb in glob]
    mine = [(xb.to(DEV), yb.to(DEV)) for xb, yb in mine]

    ddp = torch.nn.parallel.DistributedDataParallel(mlp().to(DEV))
    got = train(ddp, mine, lambda opt: opt.step())
    want = train(mlp().to(DEV), glob, lambda opt: opt.step())
    diff = (got - want).abs().max().item()
    # a GPU's kernels may sum in another order than the 1-process run's
    bound = 1e-6 if DEV == "cpu" else 1e-5
    print(f"RANK {rank} DDP on {DEV} max |param - 1-process param| = {diff:.3g} on {size} ranks", flush=True)
    assert diff <= bound, f"DDP on weft: parameters differ from the 1-process run by {diff:.3g} > {bound}"
    if size > 1:
        alone = train(mlp().to(DEV), mine, lambda opt: opt.step())
        off = (alone - want).abs().max().item()
        print(f"RANK {rank} without the reduction the difference would be {off:.3g}", flush=True)
        assert off > 1e-3, f"control: training without reduction differs only by {off:.3g}"
    # every rank holds the same parameters, bit for bit
    gathered = [torch.zeros_like(got) for _ in range(size)]
    dist.all_gather(gathered, got)
    assert all(torch.equal(g, got) for g in gathered), "DDP ranks hold different parameters"


# ---- a killed rank ----------------------------------------------------------------

def run_stray():
    """The last rank passes a non-contiguous tensor: refused on that rank at
    once; the others, whose allreduce never gets its peer, must fail after
    the group's timeout (3 s, from new_group's timeout=), naming the peer."""
    import datetime
    rank, size = dist.get_rank(), dist.get_world_size()
    stray = size - 1
    g = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=3))
    start = time.monotonic()
    try:
        dist.all_reduce(torch.zeros(4, 4).t() if rank == stray else torch.zeros(16), group=g)
    except RuntimeError as e:
        msg, took = str(e), time.monotonic() - start
        print(f"RANK {rank} failed after {took:.1f} s: {msg}", flush=True)
        if rank == stray:
            assert "not contiguous" in msg and took < 1, msg
        else:
            # a rank waiting on another survivor names the stray rank as the culprit
            assert "allreduce" in msg and "WEFT_ERR_TIMEOUT" in msg, msg
            assert f"peer {stray}" in msg or f"culprit is rank {stray}" in msg, msg
            assert 2.5 < took < 15, f"failed after {took:.1f} s; the group's timeout is 3 s"
        return
    raise AssertionError("no error although a rank's tensor was refused")


def run_mismatch():
    """Ranks pass different counts to one allreduce (run.py sets WEFT_CHECK=1,
    which compares every call's arguments first): every rank must raise,
    naming the call and the counts, not hang. On a group of its own, left
    failed behind."""
    rank, size = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(list(range(size)))
    t = torch.ones(10 + rank)
    try:
        dist.all_reduce(t, group=g)
    except RuntimeError as e:
        msg = str(e)
        print(f"RANK {rank} mismatch refused: {msg}", flush=True)
        assert "allreduce" in msg and "WEFT_ERR_MISMATCH" in msg, f"the error does not name the call and the mismatch: {msg}"
        return
    raise AssertionError("allreduce with counts that differ between ranks succeeded")


def run_kill():
    """The last rank kills itself (SIGKILL) during a loop of allreduces; every
    other rank must raise, naming the call and the dead peer, well before the
    test's limit (the process group timeout is set to 20 s by run.py)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    victim = size - 1
    t = torch.ones(1 << 16)
    start = time.monotonic()
    for i in range(100000):
        if rank == victim and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
            t.fill_(1)
        except RuntimeError as e:
            msg = str(e)
            took = time.monotonic() - start
            print(f"RANK {rank} failed after {took:.1f} s in call {i}: {msg}", flush=True)
            assert "allreduce" in msg, f"the error does not name the call: {msg}"
            assert f"rank {victim}" in msg or f"peer {victim}" in msg, f"the error does not name the peer {victim}: {msg}"
            return
    raise AssertionError("no error although a rank died")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="ops,refusals,ddp")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("WEFT_TEST_SEED", "20261123")))
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--exit-without-destroy", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    global DEV
    DEV = a.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("SKIP: --device cuda, but torch sees no GPU here", flush=True)
        sys.exit(77)
    import datetime
    dist.init_process_group("weft", timeout=datetime.timedelta(seconds=a.timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    parts = a.parts.split(",")
    want = os.environ.get("WEFT_TRANSPORT", "auto")
    if size > 1 and want != "auto":  # the run meant to cover that transport really does
        got = weft.torch.peer_transport((rank + 1) % size)
        assert got == want, f"WEFT_TRANSPORT={want} but weft chose {got} for peer {(rank + 1) % size}"
    if "kill" in parts:
        run_stray()
        run_mismatch()
        run_kill()
        print(f"RANK {rank} OK", flush=True)
        # a failed group still tears down: weft_comm_destroy unlinks the shared
        # memory of the dead peer's pairs, which no process would do after us
        dist.destroy_process_group()
        os._exit(0)
    if "ops" in parts:
        done = run_ops(a.seed, a.cases)
        if DEV == "cpu":  # groups and shared buckets: CPU tensors
            run_groups(a.seed)
            run_reused(a.seed)
        if rank == 0:
            print(f"ops on {size} ranks, seed {a.seed}: " + ", ".join(f"{k} x{v}" for k, v in done.items()), flush=True)
    if "refusals" in parts:
        run_refusals()
    if "ddp" in parts:
        run_ddp()
    dist.barrier()
    if a.exit_without_destroy:
        # many scripts end so: the group lives on into the interpreter's exit,
        # and the last future's Python callback is finished by a completer
        # thread (which once aborted the process when exit came first)
        t = torch.ones(1000)
        got = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0].sum().item()).wait()
        assert got == 1000 * size, got
    else:
        dist.destroy_process_group()
    print(f"RANK {rank} OK", flush=True)


if __name__ == "__main__":
    main()
