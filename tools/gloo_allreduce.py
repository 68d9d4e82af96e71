"""gloo_allreduce.py: torch.distributed's gloo allreduce timed as weft-bench
--peers times weft's (float32 sum, a barrier before each call, median over
the calls of rank 0's time), for tools/host_check.sh. Run as ranks
(weftrun -n N python3 gloo_allreduce.py SIZE...): prints one row per size,
"gloo SIZE_BYTES TIME_US BUSBW_GBS", and checks each result. Exit 77
without torch."""
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)


def main():
    sizes = [int(s) for s in sys.argv[1:]] or [1 << 20, 16 << 20, 64 << 20]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    for size in sizes:
        count = max(size // 4, 1)
        x = torch.ones(count, dtype=torch.float32)
        iters = max(5, min(50, (256 << 20) // max(size, 1)))
        times = []
        for i in range(iters + 2):
            x.fill_(float(rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            t1 = time.perf_counter()
            if i >= 2:
                times.append(t1 - t0)
        want = n * (n + 1) / 2
        if not torch.all(x == want):
            print("gloo: wrong result at %d bytes" % size, file=sys.stderr)
            sys.exit(1)
        times.sort()
        t = torch.tensor([times[len(times) // 2]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        us = t.item() * 1e6
        busbw = 2 * (n - 1) / n * count * 4 / (us * 1e3) if us > 0 else 0
        if rank == 0:
            print("gloo %d %.1f %.2f" % (count * 4, us, busbw), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
