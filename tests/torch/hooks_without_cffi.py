"""weft's DDP hooks on several ranks in a Python where "import cffi" fails (a torch
venv): argv[1] is the default group's backend ("weft": the hooks reduce through it;
"gloo": they make a "weft" group once). Each rank's gradients must be the mean of the
gradients of the whole batch, computed here without DDP. Run under weftrun; exit 77
without torch."""
import sys

sys.modules["cffi"] = None
try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)

import weft.torch  # noqa: E402,F401  registers the backend; reads weftrun's environment
from weft.torch import hooks  # noqa: E402

backend = sys.argv[1]
dist.init_process_group(backend)
rank, ranks = dist.get_rank(), dist.get_world_size()
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(20, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))
whole = torch.nn.Sequential(torch.nn.Linear(20, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))
whole.load_state_dict(model.state_dict())
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp.register_comm_hook(None, hooks.allreduce_hook)
torch.manual_seed(9)  # the same batch on every rank; each takes its eighth rows
x = torch.randn(8 * ranks, 20)
ddp(x[8 * rank:8 * rank + 8]).square().sum().backward()
whole(x).square().sum().backward()  # the sum over ranks of their losses
for got, want in zip(model.parameters(), whole.parameters()):
    assert torch.allclose(got.grad, want.grad / ranks, rtol=1e-5, atol=1e-6), \
        "rank %d (%s default group): a gradient is not the mean over ranks" % (rank, backend)
if backend != "weft":
    assert hooks._default_group is not None and dist.get_backend(hooks._default_group) == "weft", \
        "rank %d: the hook did not reduce through a weft group" % rank
dist.destroy_process_group()
print("rank %d: allreduce_hook without cffi, %s default group: gradients are the mean" % (rank, backend))
