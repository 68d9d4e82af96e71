# grad.py - weft.torch.GradReducer: a module's gradients in weft's gradient
# buckets (weft_grad_*), reduced while backward runs, for a training loop on
# a "weft" process group without DDP:
#
#     dist.init_process_group("weft")
#     reducer = weft.torch.GradReducer(model)        # collective
#     for batch in data:
#         loss(model(batch)).backward()              # buckets leave as gradients are made
#         reducer.wait()                             # the means are in p.grad
#         optimizer.step()
#         optimizer.zero_grad()                      # set_to_none is fine too
#
# Each parameter's .grad is a view of its place in weft's bucket (DDP's
# gradient_as_bucket_view), so no copy is made; a hook on each parameter's
# gradient accumulation marks it ready. CUDA parameters: the buckets are
# device memory, each reduced in the stream order of the stream backward
# runs on without holding it, and wait() makes the current stream wait for
# the means on the GPU (weft_grad_wait_stream): the host does not block.
import contextlib

import torch
import torch.distributed as dist

from . import _backend

__all__ = ["GradReducer"]


def _weft_backend(group):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, _backend.ProcessGroupWeft):
        return pg
    get = getattr(pg, "_get_backend", None)
    if get is not None:  # torch 2.x wraps a backend in a ProcessGroup
        try:
            be = get(torch.device("cpu"))
        except RuntimeError:
            be = None
        if isinstance(be, _backend.ProcessGroupWeft):
            return be
    raise RuntimeError("weft.torch.GradReducer: the group's backend is %s, not weft: "
                       "dist.init_process_group(\"weft\") (or pass a group made with backend=\"weft\")"
                       % (dist.get_backend(pg) if dist.is_initialized() else "not initialised"))


class GradReducer:
    """A module's (or a list of parameters') gradients averaged (op="avg") or
    summed over the group's ranks in weft's buckets, reduced as backward
    produces them. Collective: every rank constructs it with the same
    parameters, in the same order. broadcast_parameters: rank 0's values are
    sent to every rank first, as DDP does."""

    def __init__(self, module, group=None, op="avg", bucket_cap_mb=25, first_bucket_cap_mb=1,
                 prediv=0.0, broadcast_parameters=True):
        params = module.parameters() if isinstance(module, torch.nn.Module) else module
        self._params = [p for p in params if p.requires_grad]
        if not self._params:
            raise ValueError("weft.torch.GradReducer: no parameter requires grad")
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        if broadcast_parameters:
            with torch.no_grad():
                for p in self._params:
                    dist.broadcast(p.data, src=0, group=group)
        self._set = _backend.GradSet(_weft_backend(group), self._params, op,
                                     int(bucket_cap_mb * (1 << 20)),
                                     int(first_bucket_cap_mb * (1 << 20)), float(prediv))
        self._views = self._set.views()
        self._group = pg
        with torch.no_grad():
            for p, v in zip(self._params, self._views):
                p.grad = v
        self._hooks = []
        self._nodes = []  # torch < 2.1: the AccumulateGrad nodes hooked, kept alive
        for i, p in enumerate(self._params):
            self._hook(i, p)

    def _arrived(self, i):
        """Gradient i is accumulated: into its view (else copied there, after
        zero_grad(set_to_none=True) left torch a fresh tensor), then ready."""
        p, v = self._params[i], self._views[i]
        g = p.grad
        if g is None or g.data_ptr() != v.data_ptr():
            with torch.no_grad():
                if g is None:
                    v.zero_()
                else:
                    v.copy_(g)
                p.grad = v
        self._set.ready(i)

    def _hook(self, i, p):
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch 2.1 on
            self._hooks.append(p.register_post_accumulate_grad_hook(lambda _p, i=i: self._arrived(i)))
            return
        # torch 1.13 .. 2.0: a hook on the parameter's AccumulateGrad node runs
        # once the gradient is accumulated (DDP's way before the hook above)
        node = p.expand_as(p).grad_fn.next_functions[0][0]
        self._nodes.append(node)
        self._hooks.append(node.register_hook(lambda *_unused, i=i: self._arrived(i)))

    def wait(self):
        """Ends the step: gradients never marked ready (unused parameters) go
        in as they are; the means (sums) are then in every p.grad (CUDA: for
        the work queued on the current stream from now on)."""
        self._set.wait()

    @contextlib.contextmanager
    def no_sync(self):
        """Steps inside only accumulate into p.grad (call wait() at each end
        as usual, which then returns at once); the next step outside reduces
        what accumulated, as DDP's no_sync."""
        self._set.set_sync(False)
        try:
            yield
        finally:
            self._set.set_sync(True)

    @property
    def bucket_count(self):
        return self._set.bucket_count()

    def remove(self):
        """Takes the hooks off; the set goes once the gradients' views do."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._nodes = []
