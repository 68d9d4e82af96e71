# hooks.py - DDP communication hooks in pure Python, for users who keep
# another backend (gloo, say) for init_process_group and let weft carry the
# gradients:
#
#     ddp.register_comm_hook(None, weft.torch.hooks.allreduce_hook)
#
# The state is a weft.Communicator, a torch.distributed process group (one
# made with backend "weft" carries the gradients through weft's backend and
# needs no cffi), or None for a default one: the default process group when
# its backend is weft; else a weft.Communicator made once per process
# (through the initialised torch.distributed group when there is one, else
# weft.init() from the launcher's environment); else, where the plain weft
# API cannot load (no cffi: a torch venv), a "weft" group made once with
# dist.new_group.
#
# DDP waits on the returned torch.futures.Future; weft's request completes
# on weft's own progress thread, so one waiter thread per process waits for
# the requests in issue order and completes the futures. The hook itself
# never blocks on peers: backward goes on while buckets are reduced.
import atexit
import queue
import threading

import torch
import torch.distributed as dist

import weft

__all__ = ["allreduce_hook", "bf16_compress_hook", "default_communicator"]

_default = None
_default_lock = threading.Lock()


def default_communicator():
    """The communicator a hook uses when its state is None: made on the first
    call, collectively. With torch.distributed initialised, rank 0 makes a
    weft unique id and the group hands it out (the launcher's MASTER_PORT is
    that group's store already, so weft cannot rendezvous there); otherwise
    weft.init() reads the launcher's environment."""
    global _default
    with _default_lock:
        if _default is None:
            if dist.is_available() and dist.is_initialized():
                uid = [weft.get_unique_id() if dist.get_rank() == 0 else None]
                dist.broadcast_object_list(uid, src=0)
                _default = weft.init(dist.get_rank(), dist.get_world_size(), unique_id=uid[0])
            else:
                _default = weft.init()
        return _default


_default_group = None
_plain_api = None  # whether the plain weft API (cffi) loads in this Python: asked once


def _plain_api_loads():
    # once per process: where cffi is absent a failed import searches sys.path
    # again, and this runs for every bucket a hook with state None reduces
    global _plain_api
    if _plain_api is None:
        try:
            weft._lib.declarations()
        except ImportError:
            _plain_api = False
        else:
            _plain_api = True
    return _plain_api


def _default_state():
    """What a hook with state None reduces through: a process group or a
    weft.Communicator (see the top of this file)."""
    global _default_group
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "weft":
        return dist.group.WORLD
    if _plain_api_loads():
        return default_communicator()
    with _default_lock:
        if _default_group is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError("weft hook: state None needs torch.distributed initialised "
                                   "(init_process_group) or cffi for weft.init(); neither is here")
            _default_group = dist.new_group(backend="weft")
        return _default_group


def _communicator(state):
    if state is None:
        state = _default_state()
    if isinstance(state, (weft.Communicator, dist.ProcessGroup)):
        return state
    raise TypeError("weft hook: state is a %s; pass a weft.Communicator (from weft.init()), a "
                    "torch.distributed process group, or None for the default one"
                    % type(state).__name__)


def _ranks(comm):
    if isinstance(comm, dist.ProcessGroup):
        return dist.get_world_size(comm)
    return comm.size


def _sum_then(comm, tensor, finish):
    """Starts the sum of tensor over comm's ranks; the future DDP waits on
    completes with finish()'s result, or with the reduction's error."""
    if isinstance(comm, dist.ProcessGroup):
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=comm, async_op=True)

        def after(fut):
            fut.value()  # raises the reduction's error into the returned future
            return finish()

        return work.get_future().then(after)
    request = comm.iallreduce(tensor, op="sum")
    future = torch.futures.Future()
    _waiter.submit(request, future, finish)
    return future


def _bucket_buffer(bucket):
    # torch >= 1.12: buffer(); torch 1.8 .. 1.11: get_tensor()
    get = getattr(bucket, "buffer", None) or bucket.get_tensor
    return get()


class _Waiter:
    """One daemon thread that waits for hook requests in the order they were
    issued (the order weft completes them on a communicator) and completes
    each future with its result, or with the request's WeftError."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, request, future, finish):
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="weft-ddp-hook",
                                                daemon=True)
                self._thread.start()
        self._queue.put((request, future, finish))

    def stop(self, timeout=10.0):
        """At interpreter exit (atexit, before Python ends daemon threads): the
        thread finishes what it holds and returns. Python 3.11 ends a daemon
        thread that is still inside torch's C++ (completing a future: DDP's
        callbacks run there after its waiter woke) by a forced unwind, which
        aborts the process ("terminate called without an active exception");
        a hook's last bucket left it there in most runs. Bounded: a request
        whose peer is gone ends at weft's timeout, which is not waited for."""
        with self._lock:
            thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._queue.put(None)
        thread.join(timeout)

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, future, finish = item
            try:
                request.wait()
                result = finish()
            except BaseException as e:  # the future carries it to DDP's wait
                future.set_exception(e)
            else:
                future.set_result(result)


_waiter = _Waiter()
atexit.register(_waiter.stop)


def allreduce_hook(state, bucket):
    """Averages the bucket over ranks, like DDP's default hook: divides by
    the number of ranks first (no overflow in f16 buckets), then sums."""
    comm = _communicator(state)
    buf = _bucket_buffer(bucket)
    buf.div_(_ranks(comm))
    return _sum_then(comm, buf, lambda: buf)


def bf16_compress_hook(state, bucket):
    """Halves the bytes on the wire for f32 buckets: compresses to bfloat16,
    sums over ranks in bfloat16, decompresses into the bucket and divides by
    the number of ranks there (in the bucket's own precision)."""
    comm = _communicator(state)
    buf = _bucket_buffer(bucket)
    compressed = buf.to(torch.bfloat16)

    def decompress():
        buf.copy_(compressed)
        buf.div_(_ranks(comm))
        return buf

    return _sum_then(comm, compressed, decompress)


# DDP's register_comm_hook refuses any hook whose __name__ is
# "bf16_compress_hook" unless CUDA 11+ and NCCL 2.10+ are present (a check
# meant for its own NCCL hook, torch 1.13 .. 2.x): this one runs anywhere.
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "weft_bf16_compress_hook"
