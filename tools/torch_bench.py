#!/usr/bin/python3
"""torch_bench.py: weft against gloo under torch.distributed, side by side in one run.

Start it with a launcher, one process per rank (docs/torch.md, "Measuring"):

    weftrun -n 2 /usr/bin/python3 tools/torch_bench.py [--what resnet|cnn|all] [--steps N]
    WEFT_TRANSPORT=tcp weftrun -n 4 /usr/bin/python3 tools/torch_bench.py
    torchrun --nproc_per_node 2 --redirects 1 --tee 1 tools/torch_bench.py

Every rank joins one gloo group (the default one, over TCP on loopback: gloo has no
shared-memory transport) and one weft group (dist.new_group(backend="weft"), over
what weft picks, or WEFT_TRANSPORT), plus a weft communicator of the Python package
for the DDP hook path (weft.torch.hooks). Cases, each timed as the median over
--steps steps, after --warmup, of the slowest rank's step time:

  grads   the ResNet-50 gradient set (tools/data/resnet50_grads.tsv, float32 CPU):
          every tensor allreduced (all started, then all waited for); the same bytes
          as one flat buffer.
  ddp     a DDP step (forward+backward) of a model holding those parameters.
  cnn     a DDP training step (forward+backward+SGD) of a small CNN on sklearn's
          8x8 digits, 64 images per rank, from the same seed on every backend: the
          final test accuracy must be the same and the parameters must agree.
  resnet  grads and ddp; all: every case.

A DDP step is timed beside the same step without DDP ("local": no communication,
both ranks busy the same way), in rounds: each round runs local, gloo, weft and the
hook once each, in an order rotated every round, so a load that comes and goes on
the machine falls on all of them alike. What DDP adds, the exposed communication,
is the median over the rounds of (step - local step of the same round); gloo / weft
is the ratio of those. Every DDP model gets the same options (--bucket-view,
--bucket-mb), printed in the output.

Rank 0 prints Markdown tables, one row per case. Exits 1 when a backend's result
disagrees with the reference or with gloo's, 77 when torch or weft.torch is missing.
"""
import argparse
import gc
import os
import statistics
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=["grads", "ddp", "resnet", "cnn", "all"], default="all")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per case (default 30)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps first (default 3; DDP steps 20: weft asks whether a "
                    "bucket moved to shared memory every 16 calls, so the first steps run the ring)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: the first 12 gradient tensors at 1/64 size, 3 steps")
    ap.add_argument("--grads", default=os.path.join(HERE, "data", "resnet50_grads.tsv"),
                    help="the gradient set: a TSV of index, name, shape (AxBx..), numel")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads per rank (default 1: the ranks share the cores)")
    ap.add_argument("--bucket-view", type=int, choices=[0, 1], default=0,
                    help="DDP's gradient_as_bucket_view for every DDP model (default 0, "
                    "DDP's own default; 1 saves the copy from the buckets to the gradients)")
    ap.add_argument("--bucket-mb", type=float, default=25,
                    help="DDP's bucket_cap_mb for every DDP model (default 25, DDP's own)")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest parameter difference between the CNN's backends (default 1e-4)")
    a = ap.parse_args()
    a.ddp_warmup = 20 if a.warmup is None else a.warmup
    if a.warmup is None:
        a.warmup = 3
    if a.quick:
        a.steps, a.warmup, a.ddp_warmup = min(a.steps, 3), min(a.warmup, 1), min(a.ddp_warmup, 1)
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps wants at least 1, --warmup at least 0")
    return a


def load_grads(path, quick):
    """[(name, shape)] from the TSV; --quick keeps 12 tensors, each at most 1/64."""
    shapes = []
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"torch_bench: cannot read the gradient set --grads {path}: {e.strerror}")
    with f:
        header = f.readline().rstrip("\n").split("\t")
        col = {k: i for i, k in enumerate(header)}
        for line in f:
            cells = line.rstrip("\n").split("\t")
            if len(cells) < len(header):
                continue
            shape = tuple(int(d) for d in cells[col["shape"]].split("x"))
            numel = 1
            for d in shape:
                numel *= d
            if numel != int(cells[col["numel"]]):
                sys.exit(f"torch_bench: {path}: {cells[col['name']]}: shape {shape} is not "
                         f"{cells[col['numel']]} elements")
            shapes.append((cells[col["name"]], shape))
    if quick:
        shapes = [(n, (max(1, s[0] // 64),) + s[1:]) for n, s in shapes[:12]]
    return shapes


def no_comm_hook(state, bucket):
    """A DDP comm hook that leaves the bucket as it is: the DDP step without
    communication, to show DDP's own share of a step (bucket copies, hooks)."""
    import torch
    future = torch.futures.Future()
    future.set_result(bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor())
    return future


class Bench:
    def __init__(self, a):
        import torch
        import torch.distributed as dist
        import weft.torch  # registers "weft"
        import weft.torch.hooks as hooks

        self.a, self.torch, self.dist, self.hooks = a, torch, dist, hooks
        torch.set_num_threads(a.threads)
        dist.init_process_group("gloo")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.gloo = dist.group.WORLD
        self.weft_pg = dist.new_group(backend="weft")
        self.comm = hooks.default_communicator()  # the package's, for the hook path
        self.rows, self.ddp_rows, self.failures = [], [], []
        self.weft_over = "self"
        if self.size > 1:
            self.weft_over = weft.torch.peer_transport((self.rank + 1) % self.size, self.weft_pg)

    # --- timing: every rank times a step, the slowest rank's time counts ---
    def timed(self, step, prepare=None):
        torch, dist = self.torch, self.dist
        times = []
        for i in range(self.a.warmup + self.a.steps):
            if prepare:
                prepare()
            dist.barrier(group=self.gloo)
            t0 = time.perf_counter()
            step()
            t = time.perf_counter() - t0
            if i >= self.a.warmup:
                times.append(t)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.gloo)
        return statistics.median(slowest.tolist()) * 1e3

    def timed_rounds(self, steps):
        """Times every step of `steps` ({key: step}) once per round, after a barrier
        each, in an order rotated every round; returns {key: [the slowest rank's ms,
        one per timed round]}. Round i of every key ran within the same second or
        so, under the same load."""
        torch, dist = self.torch, self.dist
        keys = list(steps)
        times = {k: [] for k in keys}
        for i in range(self.a.ddp_warmup + self.a.steps):
            r = i % len(keys)
            for k in keys[r:] + keys[:r]:
                dist.barrier(group=self.gloo)
                t0 = time.perf_counter()
                steps[k]()
                t = time.perf_counter() - t0
                if i >= self.a.ddp_warmup:
                    times[k].append(t)
        slowest = torch.tensor([times[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.gloo)
        return {k: [t * 1e3 for t in slowest[j].tolist()] for j, k in enumerate(keys)}

    def row(self, case, gloo_ms, weft_ms, hook_ms, note=""):
        speed = f"{gloo_ms / weft_ms:.1f}x" if weft_ms > 0 else "-"
        hook = f"{hook_ms:.2f}" if hook_ms is not None else "-"
        self.rows.append(f"| {case} | {self.size} | {self.weft_over} | {gloo_ms:.2f} | "
                         f"{weft_ms:.2f} | {hook} | {speed} | {note} |")

    def ddp_options(self):
        return dict(gradient_as_bucket_view=bool(self.a.bucket_view),
                    bucket_cap_mb=self.a.bucket_mb)

    def ddp_row(self, case, times, note=""):
        """One row of the DDP table from timed_rounds' times (keys local, nocomm,
        gloo, weft, hook): each DDP step's median, and the median over rounds of
        what it took beyond the local step of its round (the exposed time; for
        nocomm, DDP's own share of it: hooks, bucket copies), and beyond the DDP
        step without communication of its round (the communication alone)."""
        med = {k: statistics.median(v) for k, v in times.items()}

        def excess(k, base):
            return statistics.median(t - b for t, b in zip(times[k], times[base]))

        exposed = {k: excess(k, "local") for k in times if k != "local"}
        comm = {k: excess(k, "nocomm") for k in ("gloo", "weft", "hook")}

        def ratio(of, k):
            # a DDP step that exposes nothing (or less than the noise) has no ratio
            return f"{of['gloo'] / of[k]:.1f}x" if of[k] > 0 else "-"

        self.ddp_rows.append(
            f"| {case} | {self.size} | {self.weft_over} | {med['local']:.1f} | "
            f"{med['nocomm']:.1f} / {exposed['nocomm']:.1f} | "
            + " | ".join(f"{med[k]:.1f} / {exposed[k]:.1f} / {comm[k]:.1f}"
                         for k in ("gloo", "weft", "hook"))
            + f" | {ratio(exposed, 'weft')} / {ratio(comm, 'weft')}"
            + f" | {ratio(exposed, 'hook')} / {ratio(comm, 'hook')} | {note} |")

    # --- the ResNet-50 gradient set ---
    def allreduce_list(self, tensors, pg):
        works = [self.dist.all_reduce(t, group=pg, async_op=True) for t in tensors]
        for w in works:
            w.wait()

    def allreduce_list_package(self, tensors):
        requests = [self.comm.iallreduce(t, op="sum") for t in tensors]
        for r in requests:
            r.wait()

    def check_sums(self, label, tensors, run):
        """Each rank holds base * (rank + 1); the sum is base * n(n+1)/2."""
        torch = self.torch
        gen = torch.Generator().manual_seed(1)
        bases = [torch.randn(t.shape, generator=gen) for t in tensors]
        for t, b in zip(tensors, bases):
            t.copy_(b).mul_(self.rank + 1)
        run()
        factor = self.size * (self.size + 1) / 2
        worst = max(((t - b * factor).abs().max().item() for t, b in zip(tensors, bases)),
                    default=0.0)
        if worst > 1e-4 * factor:
            self.fail(f"{label}: the sum differs from the reference by {worst:g}")
        return [t.clone() for t in tensors]

    def bench_grad_set(self, shapes):
        torch = self.torch
        tensors = [torch.empty(s) for _, s in shapes]
        numel = sum(t.numel() for t in tensors)
        mb = numel * 4 / 1e6

        def fill(ts):
            # fresh gradients every step, as backward would give (and no overflow
            # from summing the same tensors step after step)
            return lambda: [t.fill_(self.rank + 1) for t in ts]

        paths = {
            "gloo": lambda ts: (lambda: self.allreduce_list(ts, self.gloo)),
            "weft": lambda ts: (lambda: self.allreduce_list(ts, self.weft_pg)),
            "hook": lambda ts: (lambda: self.allreduce_list_package(ts)),
        }
        for label, ts in ((f"ResNet-50 grads, {len(tensors)} tensors ({mb:.3g} MB), "
                           "one allreduce each", tensors),
                          (f"ResNet-50 grads as one flat buffer ({mb:.3g} MB)",
                           [torch.empty(numel)])):
            ms = {k: self.timed(p(ts), prepare=fill(ts)) for k, p in paths.items()}
            results = {k: self.check_sums(f"{label}, {k}", ts, p(ts)) for k, p in paths.items()}
            diff = max((a - b).abs().max().item() for k in ("weft", "hook")
                       for a, b in zip(results[k], results["gloo"]))
            del results
            self.row(label, ms["gloo"], ms["weft"], ms["hook"], f"max diff to gloo {diff:.1e}")

    def bench_grad_ddp(self, shapes):
        """DDP's backward on a model holding the gradient set: the forward is one
        multiply per parameter, so the step is mostly DDP's allreduces; the same
        model without DDP is the local step."""
        torch, nn = self.torch, self.torch.nn
        DDP = nn.parallel.DistributedDataParallel

        class Holder(nn.Module):
            def __init__(self):
                super().__init__()
                self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s)) for _, s in shapes])

            def forward(self, x):
                return sum((p * x).sum() for p in self.ps)

        x = torch.ones(())
        models, steps = {}, {}
        for key in ("local", "nocomm", "gloo", "weft", "hook"):
            model = Holder()
            if key != "local":
                model = DDP(model, process_group=self.weft_pg if key == "weft" else self.gloo,
                            **self.ddp_options())
            if key == "hook":
                model.register_comm_hook(self.comm, self.hooks.allreduce_hook)
            elif key == "nocomm":
                model.register_comm_hook(None, no_comm_hook)

            def step(model=model):
                model.zero_grad(set_to_none=True)
                model(x * (self.rank + 1)).backward()

            models[key], steps[key] = model, step
        times = self.timed_rounds(steps)
        want = (self.size + 1) / 2  # every gradient: the mean of rank + 1
        for key in ("gloo", "weft", "hook"):
            worst = max((p.grad - want).abs().max().item() for p in models[key].parameters())
            if worst > 1e-5 * want:
                self.fail(f"ResNet-50 DDP step, {key}: a gradient is off by {worst:g}")
        del models, steps
        gc.collect()  # each DDP reducer holds buckets of the 102 MB: free them
        self.ddp_row("ResNet-50 grads, DDP step (forward+backward)", times,
                     "weft hook: DDP on gloo + weft allreduce_hook")

    # --- a small CNN on digits ---
    def digits(self):
        torch = self.torch
        try:
            from sklearn.datasets import load_digits
            d = load_digits()
            x, y, source = d.images / 16.0, d.target, "sklearn digits"
        except ImportError:  # digits' shape, generated: same code path, no real accuracy
            gen = torch.Generator().manual_seed(3)
            y = torch.randint(0, 10, (1797,), generator=gen).numpy()
            x = (torch.rand(1797, 8, 8, generator=gen) + torch.tensor(y).view(-1, 1, 1) / 10).numpy()
            source = "generated 8x8 data (no sklearn)"
        x = torch.tensor(x, dtype=torch.float32).unsqueeze(1)
        y = torch.tensor(y, dtype=torch.int64)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        x, y = x[perm], y[perm]
        return x[:1500], y[:1500], x[1500:], y[1500:], source

    def bench_cnn(self):
        torch, nn = self.torch, self.torch.nn
        DDP = nn.parallel.DistributedDataParallel
        xtr, ytr, xte, yte, source = self.digits()
        batch = 64
        channels = (4, 8) if self.a.quick else (16, 32)

        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(1, channels[0], 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(channels[0], channels[1], 3, padding=1), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(channels[1] * 64, 10))

        models, steps = {}, {}
        for key in ("local", "nocomm", "gloo", "weft", "hook"):
            model = make()
            if key != "local":  # local: the same model and data on each rank, no DDP
                model = DDP(model, process_group=self.weft_pg if key == "weft" else self.gloo,
                            **self.ddp_options())
            if key == "hook":
                model.register_comm_hook(self.comm, self.hooks.allreduce_hook)
            elif key == "nocomm":
                model.register_comm_hook(None, no_comm_hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            loss_fn = nn.CrossEntropyLoss()
            it = [0]

            def step(model=model, opt=opt, loss_fn=loss_fn, it=it):
                # rank r takes the r-th 64 of each step's size*64 images
                start = ((it[0] * self.size + self.rank) * batch) % (len(ytr) - batch)
                it[0] += 1
                opt.zero_grad(set_to_none=True)
                loss_fn(model(xtr[start:start + batch]), ytr[start:start + batch]).backward()
                opt.step()

            models[key], steps[key] = model, step
        times = self.timed_rounds(steps)
        results = {}
        for key in ("gloo", "weft", "hook"):
            with torch.no_grad():
                acc = (models[key](xte).argmax(1) == yte).float().mean().item()
            params = torch.cat([p.detach().flatten() for p in models[key].parameters()])
            results[key] = (acc, params)

        accs = {k: v[0] for k, v in results.items()}
        diff = max((results[k][1] - results["gloo"][1]).abs().max().item() for k in ("weft", "hook"))
        # the ranks must also hold the same parameters (DDP keeps them equal)
        spread = results["weft"][1].clone()
        low = spread.clone()
        self.dist.all_reduce(spread, op=self.dist.ReduceOp.MAX, group=self.gloo)
        self.dist.all_reduce(low, op=self.dist.ReduceOp.MIN, group=self.gloo)
        ranks_diff = (spread - low).abs().max().item()
        if len(set(accs.values())) != 1:
            self.fail(f"CNN: accuracies differ: {accs}")
        if diff > self.a.tolerance:
            self.fail(f"CNN: parameters differ from gloo's by {diff:g} (> {self.a.tolerance:g})")
        if ranks_diff > 0:
            self.fail(f"CNN on weft: the ranks' parameters differ by {ranks_diff:g}")
        nsteps = self.a.ddp_warmup + self.a.steps
        self.ddp_row(f"CNN on {source}, DDP step ({batch}/rank, {nsteps} steps)", times,
                     f"test accuracy gloo {accs['gloo']:.4f} weft {accs['weft']:.4f} "
                     f"hook {accs['hook']:.4f}; max param diff to gloo {diff:.1e}")

    def report(self):
        if self.rank != 0:
            return
        a = self.a
        print(f"# torch_bench: torch {self.torch.__version__}, {self.size} ranks, "
              f"{a.steps} steps after {a.warmup} warm-up, {a.threads} torch thread(s) per rank, "
              f"{os.cpu_count()} cores{', --quick' if a.quick else ''}")
        print(f"# weft over {self.weft_over} (WEFT_TRANSPORT={os.environ.get('WEFT_TRANSPORT', 'unset')}); "
              "gloo always over TCP (loopback here: gloo has no shared-memory transport)")
        print("# weft hook: weft's Python package (weft.torch.hooks' path)")
        if self.rows:
            print("\n# ms: median over the steps of the slowest rank's step")
            print("| case | ranks | weft over | gloo (TCP) ms | weft backend ms | weft hook ms | "
                  "gloo / weft | note |")
            print("|---|---|---|---|---|---|---|---|")
            for r in self.rows:
                print(r)
        if self.ddp_rows:
            o = self.ddp_options()
            print(f"\n# DDP steps: {a.steps} rounds after {a.ddp_warmup} warm-up; "
                  f"WEFT_TORCH_SHARED_BUCKETS={os.environ.get('WEFT_TORCH_SHARED_BUCKETS', 'unset')}; "
                  f"DDP(gradient_as_bucket_view={o['gradient_as_bucket_view']}, "
                  f"bucket_cap_mb={o['bucket_cap_mb']:g}) on every backend, "
                  "zero_grad(set_to_none=True); step / exposed / communication ms: the median of "
                  "the slowest rank's step, of its excess over the local step (no DDP) of the "
                  "same round, and of its excess over the DDP step without communication of the "
                  "same round (a comm hook that returns the bucket as it is: DDP's own share, "
                  "bucket copies and hooks); gloo / weft: the ratios of the exposed and of the "
                  "communication times")
            print("| case | ranks | weft over | local ms | DDP without communication step / exposed | "
                  "gloo (TCP) step / exposed / communication | "
                  "weft backend step / exposed / communication | "
                  "weft hook step / exposed / communication | gloo / weft backend | "
                  "gloo / weft hook | note |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in self.ddp_rows:
                print(r)
        sys.stdout.flush()


def main():
    a = parse_args()
    try:
        import torch  # noqa: F401
        import weft.torch
    except ImportError as e:
        print(f"skipped: {sys.executable}: {e}")
        return SKIP
    b = Bench(a)
    if a.what in ("grads", "ddp", "resnet", "all"):
        shapes = load_grads(a.grads, a.quick)
        if a.what in ("grads", "resnet", "all"):
            b.bench_grad_set(shapes)
        if a.what in ("ddp", "resnet", "all"):
            b.bench_grad_ddp(shapes)
    if a.what in ("cnn", "all"):
        b.bench_cnn()
    b.report()
    # every rank's failures, on rank 0's output and in every rank's status
    import torch
    failed = torch.tensor([len(b.failures)], dtype=torch.int64)
    b.dist.all_reduce(failed, group=b.gloo)
    for f in b.failures:
        print(f"torch_bench: rank {b.rank}: FAIL: {f}", file=sys.stderr)
    b.dist.destroy_process_group()
    if failed.item():
        return 1
    if b.rank == 0:
        print("torch_bench: OK: weft's results agree with gloo's and with the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
