"""What the coalesced calls of weft.torch buy (issue 50): N tensors of B bytes
gathered (all_gather_into_tensor) or reduce-scattered (reduce_scatter_tensor)
one call each, then as one _coalescing_manager call, on weft and on gloo in the
same run. Prints the median over --steps of the slowest rank's time, in us.

  weftrun -n 2 python3 tools/torch_coalesced_bench.py [--tensors 64] [--sizes 256,4096,65536,1048576]
  (PYTHONPATH=python WEFT_TORCH_EXT_DIR=build/python/csrc from a build tree; torch 2.1 or later)
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

import weft.torch  # noqa: F401


def timed(fn, steps, group):
    out = []
    for _ in range(steps):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out.append(t.item())
    return statistics.median(out) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--sizes", default="256,4096,65536,1048576")
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    dist.init_process_group("weft")
    torch.set_num_threads(1)
    size, rank = dist.get_world_size(), dist.get_rank()
    groups = {"weft": dist.new_group(backend="weft"), "gloo": dist.new_group(backend="gloo")}
    if rank == 0:
        print(f"{size} ranks, {a.tensors} float32 tensors per call; median of {a.steps} steps, slowest rank, us")
        print(f"| call | bytes per tensor | weft one each | weft coalesced | gloo one each | gloo coalesced |")
        print("|---|---:|---:|---:|---:|---:|")
    for nbytes in (int(s) for s in a.sizes.split(",")):
        n = max(1, nbytes // 4)
        for call in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            row = []
            for name, g in groups.items():
                if call == "all_gather_into_tensor":
                    ins = [torch.rand(n) for _ in range(a.tensors)]
                    outs = [torch.empty(n * size) for _ in range(a.tensors)]
                    one = lambda o, i, g=g: dist.all_gather_into_tensor(o, i, group=g)
                else:
                    ins = [torch.rand(n * size) for _ in range(a.tensors)]
                    outs = [torch.empty(n) for _ in range(a.tensors)]
                    one = lambda o, i, g=g: dist.reduce_scatter_tensor(o, i, group=g)

                def each():
                    works = [one(o, i) for o, i in zip(outs, ins)]
                    return works

                def coalesced(g=g):
                    with _coalescing_manager(group=g):
                        for o, i in zip(outs, ins):
                            one(o, i)

                try:
                    timed(each, 3, g)
                    row.append(timed(each, a.steps, g))
                except RuntimeError as e:
                    row.append(None)
                    if rank == 0:
                        print(f"  ({name} {call} one each: {str(e).splitlines()[0][:100]})")
                try:
                    timed(coalesced, 3, g)
                    row.append(timed(coalesced, a.steps, g))
                except RuntimeError as e:
                    row.append(None)
                    if rank == 0:
                        print(f"  ({name} {call} coalesced: {str(e).splitlines()[0][:100]})")
            if rank == 0:
                cells = " | ".join("refused" if v is None else f"{v:.0f}" for v in row)
                print(f"| {call} | {nbytes} | {cells} |", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
