"""elastic_torch.py - data-parallel training with PyTorch that loses a rank
and goes on (weft.torch.recover), in the style of torchft's Manager but
without a lighthouse: catch the error, recover, wrap the model again, redo
the step.

    weftrun --elastic -n 3 python3 examples/elastic_torch.py --kill-step 5

Every step takes the same global batch (48 samples of a fixed synthetic
problem), split evenly over the ranks alive, and DDP averages the
gradients: so the parameters do not depend on how many ranks computed
them. At the end each survivor compares its parameters with a 1-process
run of the same steps, computed here, and prints the largest difference.
"""
import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import weft.torch

BATCH = 48


def data(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    return x, y


def model_at_start():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))


def train_step(model, opt, step, rank, size):
    x, y = data(step)
    part = BATCH // size
    xs, ys = x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xs), ys).backward()  # DDP averages the gradients
    opt.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kill-step", type=int, default=-1, help="launch rank 1 dies in this step")
    a = ap.parse_args()
    dist.init_process_group("weft")
    launched_as = dist.get_rank()
    net = model_at_start()
    model = DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = 0
    while step < a.steps:
        rank, size = dist.get_rank(), dist.get_world_size()
        if step == a.kill_step and launched_as == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        before = [p.detach().clone() for p in net.parameters()]
        try:
            train_step(model, opt, step, rank, size)
        except RuntimeError as e:
            # a rank is gone: the survivors agree on who is left, meet again,
            # undo this step's update (none was made if the gradients never
            # came) and redo the step on the survivors
            with torch.no_grad():
                for p, b in zip(net.parameters(), before):
                    p.copy_(b)
            rank, size = weft.torch.recover()
            model = DDP(net)  # its group is gone: wrap again on the new one
            print("step %d: %s; going on as rank %d of %d" % (step, str(e).split("\n")[0][:80],
                                                           rank, size), flush=True)
            continue
        step += 1
    # the 1-process run of the same steps
    ref = model_at_start()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(a.steps):
        x, y = data(s)
        ropt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ropt.step()
    worst = max((p - r).abs().max().item() for p, r in zip(net.parameters(), ref.parameters()))
    print("rank %d of %d (launched as %d): %d steps, largest difference from 1 process %.2e"
          % (dist.get_rank(), dist.get_world_size(), launched_as, a.steps, worst), flush=True)
    dist.destroy_process_group()
    if worst < 1e-5:
        print("RANK %d OK" % launched_as, flush=True)
    return worst


if __name__ == "__main__":
    worst = main()
    raise SystemExit(0 if worst < 1e-5 else 1)
