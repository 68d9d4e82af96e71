"""The calls and training stacks of issue 50, on the "weft" default group beside a
gloo group made in the same process: every result against a reference each rank
computes itself (float64, from seeds every rank knows), every framework's final
weights against gloo's (equal, bit for bit) and against one process (within a
tolerance). One rank, started through run.py --script; prints "RANK r OK" at
the end, and a line per part with what it compared. Any failure raises.

  premul      ReduceOp.PREMUL_SUM (a float, a 0-d tensor) through all_reduce,
              reduce_scatter_tensor, reduce_scatter, reduce and a coalesced
              reduce_scatter, float32/64, bfloat16, float16, against float64;
              the result the same bits on every rank; refusals (an integer
              tensor), after which the group still works
  batch_p2p   batch_isend_irecv around a ring, both ways at once
  coalesced   _coalescing_manager around all_gather_into_tensor and around
              reduce_scatter_tensor (small and large tensors, mixed dtypes,
              SUM/AVG/MAX), the functional all_gather_tensor and
              reduce_scatter_tensor; a coalesced call refused (sizes), after
              which the group still works                    (torch 2.1 on)
  dtensor     DTensor.full_tensor(), redistribute Shard(0) -> Replicate and
              -> Shard(1)                                      (torch 2.4 on)
  fsdp2       fully_shard on a small transformer, 10 steps, then
              get_model_state_dict(full_state_dict=True): equal to gloo's,
              and to one process within 1e-5                   (torch 2.6 on)
  fsdp1       FullyShardedDataParallel(device_id=cpu), 10 steps: equal to gloo's
  dcp         torch.distributed.checkpoint: FSDP2's sharded state saved on weft,
              loaded into a fresh model, equal
  zero        ZeroRedundancyOptimizer under DDP, 10 steps: equal to gloo's

Parts that the torch in use lacks are named as skipped; --require lists parts
that must run (the pip test's torch 2.15 runs all).
"""
import argparse
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import weft.torch  # noqa: F401  registers the backend "weft"

TIMEOUT = datetime.timedelta(seconds=60)
DEVICE = torch.device("cpu")  # --device cuda: premul and coalesced on CUDA tensors (the GPU machine)
VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# relative error a dtype's rounding allows, against a float64 reference
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def log(rank, msg):
    print(f"RANK {rank}: {msg}", flush=True)


def rand(seed, n, dtype):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)


def close(got, want, dtype, what, magnitude=None):
    """got within a dtype's rounding of want; magnitude: the sum of the
    addends' sizes, which rounding at each step of a sum scales with (the
    result's own size where the addends cancel would be too strict)."""
    err = (got.double() - want).abs()
    scale = (want.abs() if magnitude is None else magnitude).clamp(min=1.0)
    bad = (err > TOLERANCE[dtype] * scale).nonzero()
    assert bad.numel() == 0, (f"{what}: element {bad[0].item()} is {got.view(-1)[bad[0]].item()}, "
                              f"float64 says {want.view(-1)[bad[0]].item()}")


def same_bits_everywhere(t, what, group=None):
    """Every rank holds these exact bytes."""
    b = t.contiguous().view(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8, device=t.device)
    size = dist.get_world_size(group)
    out = torch.empty(size * b.numel(), dtype=torch.uint8, device=b.device)
    dist.all_gather_into_tensor(out, b, group=group)
    for r in range(size):
        assert torch.equal(out[r * b.numel():(r + 1) * b.numel()], b), f"{what}: rank {r} holds other bits"


def refused(fn, *words):
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        for w in words:
            assert w in str(e), f"the refusal does not say {w!r}: {e}"
        return str(e)
    raise AssertionError(f"not refused (wanted {words})")


def premul_op(factor):
    """PREMUL_SUM as the torch in use makes it: torch 1.13 takes a tensor
    factor as a list (one per device); torch 2.x's ReduceOp.PREMUL_SUM(f)."""
    if VERSION < (2, 0):
        return dist._make_nccl_premul_sum([factor] if isinstance(factor, torch.Tensor) else factor)
    if isinstance(factor, torch.Tensor):
        return dist._make_nccl_premul_sum(factor)
    return dist.ReduceOp.PREMUL_SUM(factor)


# ---- premul ----------------------------------------------------------------------------

def part_premul(rank, size):
    n = 1000 * size + 7 * size  # not a multiple of anything packing might assume
    checked = 0
    for salt, dtype in enumerate(FLOATS):
        # a float, a 0-d tensor on the data's device (read there, in stream order), one on the CPU
        for factor in (0.125 / size, 1.0 / 3.0, torch.tensor(0.7, dtype=torch.float64, device=DEVICE),
                       torch.tensor(-1.5)):
            f = float(factor)
            seed = 5000 + 100 * salt + (0 if isinstance(factor, float) else 50) + int(abs(f) * 8)
            data = [rand(seed + r, n, dtype) for r in range(size)]
            # the reference: each rank's tensor as it holds it, times the factor, summed in float64
            want = sum(d.double() * f for d in data)
            mag = sum((d.double() * f).abs() for d in data)

            x = data[rank].to(DEVICE, copy=True)
            dist.all_reduce(x, op=premul_op(factor))
            x = x.cpu()
            close(x, want, dtype, f"all_reduce PREMUL_SUM({f}) {dtype}", mag)
            same_bits_everywhere(x, f"all_reduce PREMUL_SUM {dtype}")

            block = n // size
            inp = data[rank].to(DEVICE, copy=True)
            out = torch.empty(block, dtype=dtype, device=DEVICE)
            dist.reduce_scatter_tensor(out, inp, op=premul_op(factor))
            assert torch.equal(inp.cpu(), data[rank]), "reduce_scatter_tensor PREMUL_SUM changed its input"
            out = out.cpu()
            close(out, want[rank * block:(rank + 1) * block], dtype, f"reduce_scatter_tensor PREMUL_SUM {dtype}",
                  mag[rank * block:(rank + 1) * block])

            outl = torch.empty(block, dtype=dtype, device=DEVICE)
            dist.reduce_scatter(outl, list(data[rank].to(DEVICE, copy=True).chunk(size)), op=premul_op(factor))
            assert torch.equal(outl.cpu(), out), f"reduce_scatter (list) PREMUL_SUM {dtype} differs from the tensor form"

            y = data[rank].to(DEVICE, copy=True)
            dist.reduce(y, dst=size - 1, op=premul_op(factor))
            y = y.cpu()
            if rank == size - 1:
                close(y, want, dtype, f"reduce PREMUL_SUM {dtype}", mag)
            else:
                assert torch.equal(y, data[rank]), "reduce PREMUL_SUM changed a non-root rank's tensor"
            checked += 4
            if VERSION >= (2, 1):
                from torch.distributed.distributed_c10d import _coalescing_manager
                small, large = n // 4 // size * size, 40000 * size  # packed, and a call of its own
                ins = [rand(seed + 10 * r + 1, small, dtype) for r in range(size)]
                inl = [rand(seed + 10 * r + 2, large, dtype) for r in range(size)]
                outs = [torch.empty(small // size, dtype=dtype, device=DEVICE),
                        torch.empty(large // size, dtype=dtype, device=DEVICE)]
                with _coalescing_manager():
                    dist.reduce_scatter_tensor(outs[0], ins[rank].to(DEVICE, copy=True), op=premul_op(factor))
                    dist.reduce_scatter_tensor(outs[1], inl[rank].to(DEVICE, copy=True), op=premul_op(factor))
                outs = [o.cpu() for o in outs]
                for o, src, what in ((outs[0], ins, "small"), (outs[1], inl, "large")):
                    b = o.numel()
                    mine = slice(rank * b, (rank + 1) * b)
                    close(o, sum(d.double() * f for d in src)[mine], dtype,
                          f"coalesced reduce_scatter_tensor PREMUL_SUM ({what}) {dtype}",
                          sum((d.double() * f).abs() for d in src)[mine])
                checked += 1
    # refusals: an integer tensor, a factor of two elements; the group goes on
    t = torch.ones(8, dtype=torch.int32, device=DEVICE)
    refused(lambda: dist.all_reduce(t, op=premul_op(2.0)), "allreduce", "PREMUL_SUM takes floating tensors",
            "torch.int32")
    # torch 2.x refuses a factor of two elements itself, as it makes the op
    refused(lambda: dist.all_reduce(torch.ones(4, device=DEVICE), op=premul_op(torch.ones(2))),
            "one element" if VERSION < (2, 0) else "numel")
    x = torch.full((10,), float(rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((10,), size * (size + 1) / 2.0)), "all_reduce after the refusals"
    log(rank, f"premul: {checked} PREMUL_SUM calls against float64, same bits on every rank; refusals")


# ---- batch_p2p --------------------------------------------------------------------------

def part_batch_p2p(rank, size):
    """batch_isend_irecv around a ring, both ways at once, three dtypes."""
    right, left = (rank + 1) % size, (rank - 1) % size
    for dtype in (torch.float32, torch.int64, torch.bool):
        mine = [rand(300 + 10 * rank + k, 1000 + k, torch.float64) for k in range(2)]
        conv = (lambda t: t > 0) if dtype == torch.bool else (lambda t: (t * 1000).to(dtype))
        got = [torch.empty(1000, dtype=dtype), torch.empty(1001, dtype=dtype)]
        ops = [dist.P2POp(dist.isend, conv(mine[0]), right), dist.P2POp(dist.isend, conv(mine[1]), left),
               dist.P2POp(dist.irecv, got[0], left), dist.P2POp(dist.irecv, got[1], right)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert torch.equal(got[0], conv(rand(300 + 10 * left, 1000, torch.float64))), f"from the left, {dtype}"
        assert torch.equal(got[1], conv(rand(300 + 10 * right + 1, 1001, torch.float64))), f"from the right, {dtype}"
    log(rank, "batch_p2p: batch_isend_irecv both ways around the ring, float32, int64, bool")


# ---- coalesced -------------------------------------------------------------------------

def part_coalesced(rank, size):
    from torch.distributed.distributed_c10d import _coalescing_manager
    import torch.distributed._functional_collectives as funcol
    # all_gather_into_tensor: small ones packed (mixed dtypes), large ones alone
    shapes = [(3, torch.float32), (0, torch.float32), (1000, torch.int64), (70000, torch.float32),
              (17, torch.bfloat16), (5, torch.bool), (40000, torch.float64)]
    for rnd in range(2):
        ins, wants = [], []
        for i, (n, dtype) in enumerate(shapes):
            parts = [rand(100 * rnd + 10 * i + r, n, torch.float64) for r in range(size)]
            conv = (lambda p: (p > 0)) if dtype == torch.bool else (lambda p: (p * 1000).to(dtype))
            ins.append(conv(parts[rank]))
            wants.append(torch.cat([conv(p) for p in parts]))
        outs = [torch.empty(size * t.numel(), dtype=t.dtype, device=DEVICE) for t in ins]
        with _coalescing_manager(async_ops=(rnd == 1)) as cm:
            for o, t in zip(outs, ins):
                dist.all_gather_into_tensor(o, t.to(DEVICE, copy=True))
        if rnd == 1:
            cm.wait()
        outs = [o.cpu() for o in outs]
        for i, (o, w) in enumerate(zip(outs, wants)):
            assert torch.equal(o, w), f"coalesced all_gather_into_tensor: tensor {i} {shapes[i]} differs"
    # reduce_scatter_tensor: mixed sizes and dtypes, each op
    for op, ref in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max")):
        specs = [(4 * size, torch.float32), (40000 * size, torch.float64), (6 * size, torch.int64),
                 (2 * size, torch.float32), (0, torch.float32), (50 * size, torch.bfloat16)]
        ins, wants = [], []
        for i, (n, dtype) in enumerate(specs):
            parts = [rand(700 + 10 * i + r, n, torch.float64) for r in range(size)]
            if dtype == torch.int64:
                parts = [(p * 1000).round() for p in parts]
            parts = [p.to(dtype).double() for p in parts]  # what each rank holds, exactly
            ins.append(parts[rank].to(dtype))
            stacked = torch.stack(parts) if n else torch.zeros(size, 0, dtype=torch.float64)
            full = {"sum": stacked.sum(0), "max": stacked.max(0).values if n else stacked.sum(0),
                    "avg": stacked.sum(0) / size}[ref]
            if ref == "avg" and dtype == torch.int64:
                full = torch.div(stacked.sum(0), size, rounding_mode="trunc")
            b = n // size
            mag = stacked.abs().sum(0) / (size if ref == "avg" else 1)
            wants.append((full[rank * b:(rank + 1) * b], mag[rank * b:(rank + 1) * b]))
        outs = [torch.empty(t.numel() // size, dtype=t.dtype, device=DEVICE) for t in ins]
        with _coalescing_manager():
            for o, t in zip(outs, ins):
                dist.reduce_scatter_tensor(o, t.to(DEVICE, copy=True), op=op)
        outs = [o.cpu() for o in outs]
        for i, (o, (w, mag)) in enumerate(zip(outs, wants)):
            if specs[i][1] in (torch.int64,) or ref == "max":
                assert torch.equal(o.double(), w), f"coalesced reduce_scatter_tensor {ref}: tensor {i} differs"
            else:
                close(o, w, specs[i][1], f"coalesced reduce_scatter_tensor {ref}: tensor {i}", mag)
    # the functional collectives (DTensor's path) send one tensor to the coalesced calls
    x = rand(900 + rank, 12, torch.float32)
    g = funcol.all_gather_tensor(x, 0, list(range(size)))
    g = g.wait() if hasattr(g, "wait") else g
    assert torch.equal(g, torch.cat([rand(900 + r, 12, torch.float32) for r in range(size)])), "funcol all_gather"
    y = rand(950 + rank, 8 * size, torch.float64)
    rs = funcol.reduce_scatter_tensor(y, "sum", 0, list(range(size)))
    rs = rs.wait() if hasattr(rs, "wait") else rs
    want = sum(rand(950 + r, 8 * size, torch.float64) for r in range(size))[rank * 8:(rank + 1) * 8]
    close(rs, want, torch.float64, "funcol reduce_scatter_tensor")
    # refusals of the coalesced calls: sizes that do not fit; then the group works
    bad_out = [torch.empty(size * 4 + 1)]
    def gather_bad():
        with _coalescing_manager():
            dist.all_gather_into_tensor(bad_out[0], torch.ones(4))
    refused(gather_bad, "allgather_into_tensor_coalesced", "output 0")
    def scatter_bad():
        with _coalescing_manager():
            dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * size + 1))
    refused(scatter_bad, "reduce_scatter_tensor_coalesced", "input 0")
    x = torch.full((10,), float(rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((10,), size * (size + 1) / 2.0)), "all_reduce after the refusals"
    log(rank, "coalesced: all_gather_into_tensor and reduce_scatter_tensor under _coalescing_manager "
        "(7 and 6 tensors, sync and async, SUM/AVG/MAX), funcol's all_gather_tensor and "
        "reduce_scatter_tensor; refusals")


# ---- dtensor ---------------------------------------------------------------------------

def part_dtensor(rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (size,))
    full = rand(31, 6 * size * 5 * size, torch.float32).view(6 * size, 5 * size)
    d = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(d.to_local(), full.chunk(size, 0)[rank]), "distribute_tensor's shard"
    assert torch.equal(d.full_tensor(), full), "full_tensor()"
    r = d.redistribute(mesh, [Replicate()])
    assert torch.equal(r.to_local(), full), "redistribute Shard(0) -> Replicate"
    s1 = d.redistribute(mesh, [Shard(1)])
    assert torch.equal(s1.to_local(), full.chunk(size, 1)[rank]), "redistribute Shard(0) -> Shard(1)"
    assert torch.equal(s1.full_tensor(), full), "full_tensor() of Shard(1)"
    log(rank, "dtensor: full_tensor, redistribute Shard(0) -> Replicate and -> Shard(1)")


# ---- training stacks ---------------------------------------------------------------------

class Tiny(nn.Module):
    """A small transformer: embedding, two encoder layers, a head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True) for _ in range(2))
        self.head = nn.Linear(32, 50)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def batch(step, r):
    g = torch.Generator().manual_seed(10000 + 97 * step + r)
    x = torch.randint(0, 50, (4, 12), generator=g)
    return x, torch.roll(x, 1, dims=1)


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x).reshape(-1, 50), y.reshape(-1))


def fresh_model():
    torch.manual_seed(1234)
    return Tiny()


def one_process(steps, ranks, lr=0.05):
    """The same training without distribution: the batches of these ranks, the
    mean of their losses (what averaging their gradients gives)."""
    model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        loss = sum(loss_of(model, *batch(step, r)) for r in ranks) / len(ranks)
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def equal_dicts(a, b, what, tol=0.0):
    assert a.keys() == b.keys(), f"{what}: other keys"
    worst = 0.0
    for k in a:
        if tol == 0.0:
            assert torch.equal(a[k], b[k]), f"{what}: {k} differs ({(a[k] - b[k]).abs().max().item():.3g} at most)"
        else:
            worst = max(worst, (a[k].double() - b[k].double()).abs().max().item())
    assert worst <= tol, f"{what}: parameters differ by {worst:.3g} (> {tol})"
    return worst


def against_gloo(got, gloo_got, size, what):
    """Equal to gloo's, bit for bit, on 2 ranks (a sum of two is the same in
    any order); within 1e-5 on more, where the two sum in other orders. The
    same bits on every rank either way."""
    worst = equal_dicts(got, gloo_got, what + " weft vs gloo", tol=0.0 if size <= 2 else 1e-5)
    same_bits_everywhere(torch.cat([v.reshape(-1) for v in got.values()]), what + "'s weights")
    return "equal to gloo's" if worst == 0.0 else f"{worst:.2g} from gloo's"


def against_one_process(got, rank, size, steps, what):
    """Within 1e-5 of one process over every rank's batches, and (so the
    comparison can fail) far from one process over this rank's batches alone."""
    worst = equal_dicts(got, one_process(steps, range(size)), what + " vs one process", tol=1e-5)
    alone = one_process(steps, [rank])
    apart = max((got[k].double() - alone[k].double()).abs().max().item() for k in got)
    assert size == 1 or apart > 1e-3, f"{what}: as far from one process over this rank's batches alone ({apart:.3g})"
    return worst, apart


def fsdp2_train(group, rank, steps, lr=0.05):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    model = fresh_model()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, *batch(step, rank)).backward()
        opt.step()
    return model


def full_state(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in sd.items()}


def part_fsdp2(rank, size, gloo, steps=10):
    t0 = time.monotonic()
    w = full_state(fsdp2_train(dist.group.WORLD, rank, steps))
    t1 = time.monotonic()
    g = full_state(fsdp2_train(gloo, rank, steps))
    t2 = time.monotonic()
    vs_gloo = against_gloo(w, g, size, "FSDP2")
    worst, apart = against_one_process(w, rank, size, steps, "FSDP2")
    log(rank, f"fsdp2: {steps} steps, full state dict {vs_gloo}, {worst:.2g} from one process "
        f"({apart:.2g} from this rank's batches alone); "
        f"weft {t1 - t0:.2f} s, gloo {t2 - t1:.2f} s")


def part_fsdp1(rank, size, gloo, steps=10):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    res, times = [], []
    for group in (dist.group.WORLD, gloo):
        t0 = time.monotonic()
        model = FSDP(fresh_model(), process_group=group, device_id=torch.device("cpu"), use_orig_params=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(steps):
            opt.zero_grad()
            loss_of(model, *batch(step, rank)).backward()
            opt.step()
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=False, rank0_only=False)):
            res.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        times.append(time.monotonic() - t0)
    vs_gloo = against_gloo(res[0], res[1], size, "FSDP1")
    worst, apart = against_one_process(res[0], rank, size, steps, "FSDP1")
    log(rank, f"fsdp1: {steps} steps, {vs_gloo}, {worst:.2g} from one process "
        f"({apart:.2g} from this rank's batches alone); "
        f"weft {times[0]:.2f} s, gloo {times[1]:.2f} s")


def part_dcp(rank, size, gloo):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    model = fsdp2_train(dist.group.WORLD, rank, 3)
    want = full_state(model)
    # one folder for every rank: rank 0 names it, weft carries the name
    name = [tempfile.mkdtemp(prefix="weft-dcp-") if rank == 0 else None]
    dist.broadcast_object_list(name, src=0)
    dcp.save(get_model_state_dict(model), checkpoint_id=name[0])
    fresh = fsdp2_train(dist.group.WORLD, rank, 0)
    sd = get_model_state_dict(fresh)
    dcp.load(sd, checkpoint_id=name[0])
    set_model_state_dict(fresh, sd)
    equal_dicts(full_state(fresh), want, "DCP: loaded vs saved")
    dist.barrier()
    if rank == 0:
        import shutil
        shutil.rmtree(name[0], ignore_errors=True)
    log(rank, "dcp: FSDP2's sharded state saved and loaded on weft, equal")


def part_zero(rank, size, gloo, steps=10):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    res = []
    for group in (dist.group.WORLD, gloo):
        model = DDP(fresh_model(), process_group=group)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9,
                                      process_group=group)
        for step in range(steps):
            opt.zero_grad()
            loss_of(model, *batch(step, rank)).backward()
            opt.step()
        res.append({k: v.detach().clone() for k, v in model.module.state_dict().items()})
    vs_gloo = against_gloo(res[0], res[1], size, "ZeRO")
    log(rank, f"zero: ZeroRedundancyOptimizer (SGD with momentum) under DDP, {steps} steps, {vs_gloo}")


PARTS = {  # name: (oldest torch, needs the gloo group)
    "premul": ((1, 13), False), "batch_p2p": ((1, 13), False), "coalesced": ((2, 1), False), "dtensor": ((2, 4), False),
    "fsdp2": ((2, 6), True), "fsdp1": ((2, 0), True), "dcp": ((2, 6), True), "zero": ((1, 13), True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--require", default="", help="parts that must run (no skip for the torch version)")
    ap.add_argument("--device", default="cpu", help="cuda: premul and coalesced on CUDA tensors (the other parts stay on the CPU)")
    a = ap.parse_args()
    global DEVICE
    if a.device != "cpu":
        if not torch.cuda.is_available():
            print(f"SKIP: --device cuda, but torch {torch.__version__} sees no GPU here")
            return 77
        DEVICE = torch.device(a.device, int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    parts = [p for p in a.parts.split(",") if p]
    required = [p for p in a.require.split(",") if p]
    dist.init_process_group("weft", timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    gloo = dist.new_group(backend="gloo") if any(PARTS[p][1] for p in parts) else None
    for p in parts:
        oldest, _ = PARTS[p]
        if VERSION < oldest:
            assert p not in required, f"part {p} is required but torch {torch.__version__} is older than {oldest}"
            log(rank, f"{p}: skipped (torch {torch.__version__}; it needs {oldest[0]}.{oldest[1]})")
            continue
        fn = globals()["part_" + p]
        if PARTS[p][1]:
            fn(rank, size, gloo)
        else:
            fn(rank, size)
    dist.destroy_process_group()
    print(f"RANK {rank} OK", flush=True)


if __name__ == "__main__":
    sys.exit(main())
