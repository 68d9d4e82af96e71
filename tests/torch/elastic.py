# elastic.py - weft.torch.recover (issue 48), under weftrun --elastic: 3 ranks
# all_reduce; rank 1 SIGKILLs itself in the third; the survivors' call
# raises, they recover (shrink over weft's control plane, a new store at
# the new rank 0, a new default group) and go on: the all_reduce of the 2
# survivors is checked, and a DDP model made on the new group trains a step.
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import weft.torch  # noqa: F401  (registers the backend)

dist.init_process_group("weft")
rank, size = dist.get_rank(), dist.get_world_size()
assert size == 3, size
x = torch.ones(1 << 16)
failed = None
for step in range(20):
    if step == 2 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(x)
    except RuntimeError as e:
        failed = step
        break
assert failed is not None, "the survivors never saw the death"
t0 = time.monotonic()
new_rank, new_size = weft.torch.recover()
took = time.monotonic() - t0
want_rank = 0 if rank == 0 else 1
assert (new_rank, new_size) == (want_rank, 2), (rank, new_rank, new_size)
assert dist.get_rank() == want_rank and dist.get_world_size() == 2
y = torch.full((1000,), float(rank + 1), dtype=torch.float64)
dist.all_reduce(y)
assert torch.all(y == 4.0), y[:4]  # ranks 0 and 2: 1 + 3
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(8, 4)).sum().backward()
print("rank %d: lost rank 1 in step %d, recovered as rank %d of %d in %.3f s; all_reduce and a "
      "DDP step right" % (rank, failed, new_rank, new_size, took))
dist.destroy_process_group()
print("RANK %d OK" % rank)
sys.exit(0)
