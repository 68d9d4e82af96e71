"""weft.torch.GradReducer: a model trained with its gradients in weft's gradient
buckets (the C API's weft_grad_* through the backend's GradSet), against one
process over every rank's batches. One rank, started through run.py --script;
prints "RANK r OK" at the end. Any failure raises.

Ten steps of SGD on a small MLP with a parameter that gets no gradient in some
steps (an unused branch), each rank on batches of its own:
  - steps 0-3: zero_grad(set_to_none=True) (torch 2's default): the hook copies
    torch's fresh gradient into weft's view;
  - steps 4-5: three micro-batches accumulated under no_sync, a fourth
    reduces them all;
  - the rest: zero_grad(set_to_none=False), gradients written in place.
The final weights must be within 1e-5 of one process stepping on the mean
over every rank's batches, and, so that the comparison can fail, at least
1e-3 from one process on this rank's batches alone. --device cuda: the same
on CUDA parameters (device buckets, the stream form; the GPU machine).
"""
import argparse
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn

import weft.torch

TIMEOUT = datetime.timedelta(seconds=60)
STEPS, BATCH = 10, 16


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 24)
        self.b = nn.Linear(24, 4)
        self.unused = nn.Linear(24, 4)  # used in odd steps only

    def forward(self, x, step):
        h = torch.tanh(self.a(x))
        out = self.b(h)
        return out + self.unused(h) if step % 2 else out


def batch(rank, step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    x = torch.randn(BATCH, 12, generator=g)
    y = torch.randn(BATCH, 4, generator=g)
    return x, y


def model(device):
    torch.manual_seed(7)
    return Net().to(device)


def reference(ranks, device):
    """One process: each step's gradient is the mean over `ranks` ranks' losses."""
    net = model(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        micros = 2 if step == 5 else 1
        for r in ranks:
            for m in range(micros):
                for s in ([4, 5] if step == 5 else [step]):
                    x, y = batch(r, s, m)
                    loss = ((net(x.to(device), s) - y.to(device)) ** 2).mean()
                    (loss / len(ranks)).backward()
        if step == 4:
            continue  # accumulated into step 5
        opt.step()
    return net


def train(rank, size, device):
    net = model(device)
    if rank:  # other ranks start elsewhere: the reducer's broadcast must fix it
        with torch.no_grad():
            for p in net.parameters():
                p.add_(rank)
    reducer = weft.torch.GradReducer(net, bucket_cap_mb=0.001, first_bucket_cap_mb=0.0002)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(STEPS):
        if step <= 4 or step >= 6:
            opt.zero_grad(set_to_none=step < 4)
        if step == 4:  # accumulates under no_sync; step 5 reduces it
            with reducer.no_sync():
                for m in range(2):
                    x, y = batch(rank, 4, m)
                    ((net(x.to(device), 4) - y.to(device)) ** 2).mean().backward()
                    reducer.wait()
            continue
        if step == 5:  # its first micro-batch accumulates too; the second reduces all
            with reducer.no_sync():
                x, y = batch(rank, 5, 0)
                ((net(x.to(device), 5) - y.to(device)) ** 2).mean().backward()
                reducer.wait()
        x, y = batch(rank, step, 1 if step == 5 else 0)
        ((net(x.to(device), step) - y.to(device)) ** 2).mean().backward()
        reducer.wait()
        opt.step()
    return net, reducer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    dist.init_process_group("weft", timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    net, reducer = train(rank, size, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ref = reference(list(range(size)), device)
    alone = reference([rank], device)
    worst = max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))
    apart = max((p - q).abs().max().item() for p, q in zip(net.parameters(), alone.parameters()))
    print(f"RANK {rank}: GradReducer, {size} ranks, {reducer.bucket_count} buckets, {STEPS} steps on "
          f"{device}: {worst:.3g} from one process over every rank's batches, {apart:.3g} from one "
          f"process on this rank's alone", flush=True)
    assert worst <= 1e-5, f"rank {rank}: {worst} from the reference"
    assert size == 1 or apart >= 1e-3, f"rank {rank}: only {apart} from this rank's own run"
    reducer.remove()
    dist.destroy_process_group()
    print(f"RANK {rank} OK", flush=True)


if __name__ == "__main__":
    main()
