"""weft.torch in a Python with torch and nothing else (a torch venv has no
cffi): the import, init_process_group("weft"), an allreduce against its
reference and the DDP hooks, with cffi made unimportable. Exit 77 without torch."""
import os
import sys

sys.modules["cffi"] = None  # "import cffi" now raises ImportError, as in a venv without it
try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)

import weft.torch  # noqa: E402,F401  registers the backend

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
dist.init_process_group("weft", rank=0, world_size=1)
x = torch.arange(1000, dtype=torch.float32)
want = x.clone()
dist.all_reduce(x)
assert torch.equal(x, want), "allreduce of one rank changed the data"
try:
    import weft
    weft.init()
except ImportError as e:
    assert "needs cffi" in str(e), e
else:
    raise AssertionError("weft.init() worked without cffi")


def grads_through(hook, state):
    """One backward of a small model under DDP with hook; returns the
    gradients DDP left, and the same model's gradients without DDP."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.Tanh(), torch.nn.Linear(17, 5))
    plain = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.Tanh(), torch.nn.Linear(17, 5))
    plain.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(state, hook)
    x = torch.randn(64, 33)
    ddp(x).square().sum().backward()
    plain(x).square().sum().backward()
    return [p.grad for p in model.parameters()], [p.grad for p in plain.parameters()]


def check_hooks(what):
    got, want = grads_through(hooks.allreduce_hook, None)
    for g, w in zip(got, want):
        assert torch.equal(g, w), "%s: allreduce_hook changed a gradient of one rank" % what
    got, want = grads_through(hooks.bf16_compress_hook, None)
    for g, w in zip(got, want):  # one rank: the hook only rounds to bfloat16 and back
        assert torch.equal(g, w.to(torch.bfloat16).to(w.dtype)), \
            "%s: bf16_compress_hook gave another value than the rounded gradient" % what


from weft.torch import hooks  # noqa: E402
# the default group is weft's: the hooks reduce through it
check_hooks("weft default group")
dist.destroy_process_group()
# a gloo default group and no cffi: the hooks make a "weft" group once
dist.init_process_group("gloo", rank=0, world_size=1)
check_hooks("gloo default group")
assert hooks._default_group is not None and dist.get_backend(hooks._default_group) == "weft", \
    "the hooks did not reduce through a weft group"
dist.destroy_process_group()
print("weft.torch without cffi: import, init_process_group, all_reduce, DDP hooks (weft group, "
      "gloo group + weft group) OK; weft.init says it needs cffi")
