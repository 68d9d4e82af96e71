"""weft.torch in a Python with torch and nothing else (a torch venv has no
cffi): the import, init_process_group("weft") and an allreduce against its
reference, with cffi made unimportable. Exit 77 without torch."""
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
dist.destroy_process_group()
print("weft.torch without cffi: import, init_process_group, all_reduce OK; weft.init says it needs cffi")
