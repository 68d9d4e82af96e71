"""PyTorch Lightning (ddp and ddp_spawn) and accelerate on the "weft" backend, as
docs/torch.md says to start them (issue 50): each trains the same small model
for 8 steps on 2 CPU ranks, and its final weights must be within 1e-5 of one
process trained on every rank's batches (computed here), and 1e-3 or more from
one process trained on rank 0's batches alone (so the comparison can fail).
The group each ran on must have been weft's.

  launchers.py check [--only lightning-ddp,lightning-spawn,accelerate]
      runs each (Lightning launches its own ranks; accelerate under torchrun)
      and compares; prints "launchers: OK" at the end. Exits 77, skipped,
      where lightning or accelerate is not installed (saying which).
  launchers.py lightning --strategy ddp|ddp_spawn --out FILE
  launchers.py accelerate --out FILE       (one rank, under torchrun)
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

# At module level, not inside main(): Lightning's ddp_spawn starts its ranks
# with multiprocessing's spawn, which imports this module anew in each; only
# what runs at import registers the backend there (else torch says "Unknown
# backend type weft")
import weft.torch  # noqa: F401

SKIP = 77
SAMPLES, BATCH, EPOCHS, RANKS, LR = 64, 8, 2, 2, 0.1


def dataset():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, 20, generator=g)
    y = torch.randint(0, 3, (SAMPLES,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def fresh_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))


def batches(how, epoch):
    """The samples of each step of an epoch, rank 0's first, then rank 1's.
    Lightning deals them out with a DistributedSampler that shuffles for
    training (rank r: every other sample of a permutation seeded by the
    epoch), though the loader itself does not; accelerate hands whole batches
    to the ranks in turn."""
    if how == "accelerate":
        per = [[i for b in range(r, SAMPLES // BATCH, RANKS) for i in range(b * BATCH, (b + 1) * BATCH)]
               for r in range(RANKS)]
    else:
        per = []
        for r in range(RANKS):
            s = torch.utils.data.DistributedSampler(dataset(), num_replicas=RANKS, rank=r, shuffle=True)
            s.set_epoch(epoch)
            per.append(list(s))
    steps = SAMPLES // (BATCH * RANKS)
    return [[per[r][s * BATCH:(s + 1) * BATCH] for r in range(RANKS)] for s in range(steps)]


def one_process(how, ranks):
    """Each step on the batches of these ranks, the mean of their mean losses
    (the mean over their samples: what DDP's averaged gradients give).
    ranks=[0]: rank 0's batches alone, the control."""
    x, y = dataset().tensors
    model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        for step in batches(how, epoch):
            idx = torch.tensor([i for r in ranks for i in step[r]])
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def save(out, state, how):
    torch.save({"state": {k: v.detach().clone() for k, v in state.items()}, "backend": dist.get_backend(),
                "how": how}, out)


# ---- Lightning -------------------------------------------------------------------------

try:  # at module level too: ddp_spawn pickles the module for its ranks by name
    import lightning as L
except ImportError:
    L = None

if L is not None:
    class Module(L.LightningModule):
        def __init__(self, out, how):
            super().__init__()
            self.net = fresh_model()
            self.out, self.how = out, how

        def training_step(self, b, _):
            return nn.functional.cross_entropy(self.net(b[0]), b[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

        def on_train_end(self):
            if self.global_rank == 0:
                save(self.out, self.net.state_dict(), self.how)


def lightning(strategy_name, out):
    from lightning.pytorch.strategies import DDPStrategy
    strategy = DDPStrategy(process_group_backend="weft",
                           **({"start_method": "spawn"} if strategy_name == "ddp_spawn" else {}))
    trainer = L.Trainer(accelerator="cpu", devices=RANKS, strategy=strategy, max_epochs=EPOCHS,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH, shuffle=False)
    trainer.fit(Module(out, f"Lightning {strategy_name}"), loader)


# ---- accelerate ------------------------------------------------------------------------

def accelerate(out):
    # accelerate takes only gloo or mpi as a CPU backend; a group made before
    # the Accelerator is the one it uses
    dist.init_process_group("weft")
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    for _ in range(EPOCHS):
        for x, y in loader:
            opt.zero_grad()
            acc.backward(nn.functional.cross_entropy(model(x), y))
            opt.step()
    if acc.is_main_process:
        save(out, acc.unwrap_model(model).state_dict(), "accelerate")
    acc.wait_for_everyone()
    dist.destroy_process_group()


# ---- the check -------------------------------------------------------------------------

def check(only):
    missing = [m for m in ("lightning", "accelerate") if not importlib.util.find_spec(m)]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed here ({sys.executable}); "
              "pip install lightning accelerate")
        return SKIP
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    here = os.path.abspath(__file__)
    runs = {
        "lightning-ddp": [sys.executable, here, "lightning", "--strategy", "ddp"],
        "lightning-spawn": [sys.executable, here, "lightning", "--strategy", "ddp_spawn"],
        "accelerate": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS),
                       "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0", here, "accelerate"],
    }
    with tempfile.TemporaryDirectory(prefix="weft-launchers-") as tmp:
        for name, cmd in runs.items():
            if only and name not in only:
                continue
            out = os.path.join(tmp, name + ".pt")
            start = time.monotonic()
            p = subprocess.run(cmd + ["--out", out], env=env, cwd=tmp, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=240)
            took = time.monotonic() - start
            if p.returncode != 0 or not os.path.exists(out):
                print(p.stdout)
                sys.exit(f"FAIL: {name} exited {p.returncode} after {took:.1f} s"
                         + ("" if os.path.exists(out) else ", writing no weights"))
            got = torch.load(out)
            how = "accelerate" if name == "accelerate" else "lightning"
            want, alone = one_process(how, list(range(RANKS))), one_process(how, [0])
            assert got["backend"] == "weft", f"{name} ran on a {got['backend']} group, not weft"
            worst = max((got["state"][k] - want[k]).abs().max().item() for k in want)
            apart = max((got["state"][k] - alone[k]).abs().max().item() for k in want)
            assert worst <= 1e-5, (f"{name}: weights {worst:.3g} from one process over every rank's batches "
                                   f"({apart:.3g} from rank 0's batches alone)")
            assert apart >= 1e-3, f"{name}: weights as near one process over rank 0's batches alone ({apart:.3g})"
            print(f"launchers: {got['how']}: on weft, {worst:.2g} from one process "
                  f"({apart:.2g} from rank 0's batches alone), {took:.1f} s", flush=True)
    print("launchers: OK")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["check", "lightning", "accelerate"])
    ap.add_argument("--strategy", choices=["ddp", "ddp_spawn"], default="ddp")
    ap.add_argument("--out")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.what == "check":
        return check([o for o in a.only.split(",") if o])
    if a.what == "lightning":
        lightning(a.strategy, a.out)
    else:
        accelerate(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
