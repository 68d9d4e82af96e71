# test_hooks.py - weft.torch.hooks in DistributedDataParallel with gloo for
# init_process_group, on 2 ranks: one epoch of a small MLP on sklearn's
# digits must leave the parameters equal to a 1-process run on the whole
# batch within 1e-6 (allreduce_hook), close within bf16's precision
# (bf16_compress_hook, which must put only bf16 on the wire), and a
# deliberately wrong reduction must miss by far more (the check can fail).
import multiprocessing
import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("sklearn")

import ranks  # noqa: E402

GLOBAL_BATCH = 64
LR = 0.1


def data():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    steps = len(x) // GLOBAL_BATCH  # one epoch of whole batches
    return x[:steps * GLOBAL_BATCH], y[:steps * GLOBAL_BATCH], steps


def model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))


def train(net, x, y, steps, part=None):
    """One epoch of SGD; part = (rank, size) trains on that share of each
    global batch (DDP averages the shares' gradients into the whole batch's)."""
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    for s in range(steps):
        lo, hi = s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH
        if part is not None:
            rank, size = part
            share = GLOBAL_BATCH // size
            lo, hi = lo + rank * share, lo + (rank + 1) * share
        opt.zero_grad()
        loss_fn(net(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    return net


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def ddp_rank(rank, size, port):
    from weft.torch import hooks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    x, y, steps = data()
    reference = train(model(), x, y, steps)  # the 1-process run, on every rank
    out = {}

    def ddp_run(state, hook):
        net = torch.nn.parallel.DistributedDataParallel(model())
        net.register_comm_hook(state, hook)
        train(net, x, y, steps, (rank, size))
        return max_diff(net.module, reference)

    # state None: the default communicator, met through gloo's group
    out["allreduce"] = ddp_run(None, hooks.allreduce_hook)
    comm = hooks.default_communicator()
    assert comm.size == size and comm.rank == rank, comm

    # bf16: only bf16 buffers of half the bucket's bytes reach weft
    seen = []
    real = comm.iallreduce

    def spy(send, recv=None, op="sum"):
        seen.append((str(send.dtype), send.numel() * send.element_size()))
        return real(send, recv, op)
    comm.iallreduce = spy
    out["bf16"] = ddp_run(comm, hooks.bf16_compress_hook)
    del comm.iallreduce
    out["bf16_dtypes"] = sorted(set(d for d, _ in seen))
    out["bf16_bytes"] = sum(b for _, b in seen)
    out["f32_bytes"] = 2 * out["bf16_bytes"]

    # a wrong reduction (the sum, not the mean) must be seen
    def summing_hook(state, bucket):
        bucket.buffer().mul_(size)
        return hooks.allreduce_hook(state, bucket)
    out["wrong"] = ddp_run(comm, summing_hook)

    # the hook's error reaches DDP's wait as an exception, not a hang
    def failing(state, bucket):
        return hooks.allreduce_hook(object(), bucket)
    try:
        ddp_run(None, failing)
        out["bad_state"] = "no error"
    except Exception as e:  # DDP wraps it in a RuntimeError
        out["bad_state"] = str(e)
    dist.destroy_process_group()
    return out


# the ranks fork from a process that imported torch once (ranks.run)
TORCH = ("torch", "pytest")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_hooks_on_two_ranks():
    got = ranks.run(2, ddp_rank, free_port(), comm=False, start="forkserver", preload=TORCH,
                    timeout=400, env={"OMP_NUM_THREADS": "1", "WEFT_TIMEOUT": "60"})
    for rank, r in enumerate(got):
        assert r["allreduce"] <= 1e-6, "rank %d: allreduce_hook is %g from 1 process" % (
            rank, r["allreduce"])
        # bf16 keeps 8 bits: the gradients round at 2^-9 relative, the steps follow
        assert r["bf16"] <= 1e-3, "rank %d: bf16_compress_hook is %g from 1 process" % (
            rank, r["bf16"])
        assert r["bf16_dtypes"] == ["torch.bfloat16"], r["bf16_dtypes"]
        assert r["wrong"] > 1e-3, "rank %d: a wrong reduction went unseen (%g)" % (
            rank, r["wrong"])
        assert "Communicator" in r["bad_state"], r["bad_state"]
    assert got[0]["allreduce"] == got[1]["allreduce"]  # the same parameters on both ranks


class FakeBucket:
    """What DDP hands a hook: torch 1.13 and 2.x have buffer(); older ones
    get_tensor() (hooks._bucket_buffer takes either)."""

    def __init__(self, tensor, old_api=False):
        self._t = tensor
        if old_api:
            self.get_tensor = lambda: self._t
        else:
            self.buffer = lambda: self._t


def bucket_rank(comm, seed):
    from weft.torch import hooks
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(3001, generator=g) for _ in range(comm.size)]
    mine = FakeBucket(grads[comm.rank].clone(), old_api=comm.rank % 2 == 1)
    avg = hooks.allreduce_hook(comm, mine).wait()
    want = sum(t.double() for t in grads) / comm.size
    d_avg = (avg.double() - want).abs().max().item()
    half = FakeBucket(grads[comm.rank].clone())
    out = hooks.bf16_compress_hook(comm, half).wait()
    # the reference of the bf16 hook: each rank's gradient rounded to bf16,
    # summed (weft rounds each partial sum to bf16), then divided
    d_bf16 = (out.double() - want).abs().max().item()
    return d_avg, d_bf16, out.dtype == torch.float32


@pytest.mark.parametrize("size", [1, 3])
def test_hooks_on_buckets(size):
    got = ranks.run(size, bucket_rank, 7, start="forkserver", preload=TORCH)
    for d_avg, d_bf16, keeps_dtype in got:
        assert d_avg < 1e-6, d_avg
        assert d_bf16 < 0.05 and keeps_dtype, d_bf16
        if size > 1:
            assert d_bf16 > d_avg  # bf16 really was on the wire


def failed_request_rank(comm, done):
    """Rank 0's hook request can never complete (rank 1 stays out) and its
    communicator is destroyed: the future must carry the error, not hang."""
    from weft.torch import hooks
    import time
    if comm.rank == 1:
        # alive (no PEER_LOST) until rank 0 destroyed its side and has its answer
        return "stayed out" if done.wait(60) else "rank 0 never finished"
    try:
        fut = hooks.allreduce_hook(comm, FakeBucket(torch.ones(10)))
        time.sleep(0.3)  # the hooks' waiter thread is in weft_wait by now
        assert not fut.done()
        comm.destroy()
        try:
            fut.wait()
        except Exception as e:
            assert "WEFT_ERR_ABORTED" in str(e), e
            return "error"
        return "completed without its peer"
    finally:
        done.set()


def test_hook_future_carries_the_error():
    done = multiprocessing.get_context("forkserver").Event()  # ranks.run's context
    got = ranks.run(2, failed_request_rank, done, start="forkserver", preload=TORCH)
    assert got == ["error", "stayed out"]
