"""weft from Python: collectives on numpy arrays and torch CPU tensors.

    import numpy as np, weft
    comm = weft.init()                 # from weftrun, torchrun, mpirun or srun
    x = np.ones(1000, np.float32)
    comm.allreduce(x)                  # in place: the sum over ranks
    req = comm.iallreduce(x, op="avg") # non-blocking
    req.wait()

Every call checks its buffers (dtype, contiguity, sizes, read-only outputs)
before anything is sent, so a refused call leaves no peer waiting. Failures
of the library raise WeftError with the status name and weft_last_error's
sentence (rank, call, peer). docs/python.md has the details.
"""
import operator
import threading
import time
import weakref

from . import _lib
from ._buffers import DTYPE_NAMES, DTYPES, as_buf
from ._errors import (Aborted, InvalidArgument, InvalidDtype, Mismatch, PeerLost, Revoked,
                      Timeout, WeftError, from_status)

__all__ = [
    "init", "get_unique_id", "join", "Communicator", "Request", "WeftError", "InvalidArgument",
    "InvalidDtype", "PeerLost", "Timeout", "Aborted", "Revoked", "Mismatch", "OPS", "DTYPES",
    "library_path", "library_version", "UNDEFINED",
]
__version__ = "0.1.0"

OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
UNDEFINED = -1  # split: the rank joins no new communicator


def _text(ffi, cstr):
    return ffi.string(cstr).decode("utf-8", "replace") if cstr != ffi.NULL else ""


def _raise_init(ffi, lib, st):
    # weft_last_error(NULL): this thread's last failed init call
    raise from_status(_text(ffi, lib.weft_status_name(st)),
                      _text(ffi, lib.weft_last_error(ffi.NULL)) or
                      _text(ffi, lib.weft_strerror(st)), st)


def library_path():
    """The libweft.so this process loaded (see docs/python.md for the search order)."""
    return _lib.path()


def library_version():
    ffi, lib = _lib.load()
    return _text(ffi, lib.weft_version_string())


def get_unique_id():
    """128 bytes naming a rendezvous this process hosts (in a background
    thread) until the ranks met. Send them to every rank, then each calls
    weft.init(rank, size, unique_id=...)."""
    ffi, lib = _lib.load()
    uid = ffi.new("weft_unique_id *")
    st = lib.weft_get_unique_id(uid)
    if st:
        _raise_init(ffi, lib, st)
    return bytes(ffi.buffer(uid.bytes))


_CONFIG_KEYS = ("rendezvous", "timeout", "local_rank")


def init(rank=None, size=None, unique_id=None, **config):
    """Creates a communicator. Collective over all ranks.

    - no arguments: from the launcher's environment (weftrun, torchrun,
      mpirun, srun), as weft_comm_init_env;
    - rank, size, unique_id: from get_unique_id's bytes, as weft_comm_init_rank;
    - rank, size and config (rendezvous="host:port", timeout=seconds,
      local_rank=n): as weft_comm_init_config.
    """
    ffi, lib = _lib.load()
    unknown = sorted(set(config) - set(_CONFIG_KEYS))
    if unknown:
        raise TypeError("weft.init: unknown argument(s) %s; it takes rank, size, unique_id, %s"
                        % (", ".join(unknown), ", ".join(_CONFIG_KEYS)))
    out = ffi.new("weft_comm **")
    if rank is None and size is None and unique_id is None:
        if config:
            raise TypeError("weft.init: %s needs rank and size; from the environment, set "
                            "WEFT_TIMEOUT / WEFT_RENDEZVOUS / WEFT_LOCAL_RANK instead"
                            % ", ".join(sorted(config)))
        st = lib.weft_comm_init_env(out)
    else:
        if rank is None or size is None:
            raise TypeError("weft.init: give both rank and size (or neither, to read the "
                            "launcher's environment)")
        try:
            rank, size = operator.index(rank), operator.index(size)
        except TypeError:
            raise TypeError("weft.init: rank %r and size %r must be integers"
                            % (rank, size)) from None
        if unique_id is not None:
            st = _init_from_id(ffi, lib, out, rank, size, unique_id, config)
        else:
            st = _init_from_config(ffi, lib, out, rank, size, config)
    if st:
        _raise_init(ffi, lib, st)
    return Communicator._wrap(out[0])


def join(grow_id):
    """A process that starts later (a replacement) joins a running
    communicator with the 128 bytes a member's Communicator.grow_id()
    returned; blocks until the members admit it (Communicator.grow)."""
    ffi, lib = _lib.load()
    cid = _id_struct(ffi, grow_id, "weft.join: grow_id", "Communicator.grow_id()")
    out = ffi.new("weft_comm **")
    st = lib.weft_comm_join(cid, out)
    if st:
        _raise_init(ffi, lib, st)
    return Communicator._wrap(out[0])


def _init_from_id(ffi, lib, out, rank, size, unique_id, config):
    if config:
        raise TypeError("weft.init: %s cannot be combined with unique_id (the id names "
                        "the rendezvous; set WEFT_TIMEOUT in the environment)"
                        % ", ".join(sorted(config)))
    cuid = _id_struct(ffi, unique_id, "weft.init: unique_id", "weft.get_unique_id()")
    return lib.weft_comm_init_rank(out, cuid, rank, size)


def _id_struct(ffi, raw, what, maker):
    """128 bytes from `maker` as a weft_unique_id, or InvalidArgument."""
    b = bytes(raw)
    if len(b) != 128:
        raise InvalidArgument("%s has %d bytes, expected the 128 of %s" % (what, len(b), maker))
    cid = ffi.new("weft_unique_id *")
    ffi.memmove(cid.bytes, b, 128)
    return cid


def _init_from_config(ffi, lib, out, rank, size, config):
    cfg = ffi.new("weft_config *")
    lib.weft_config_init(cfg)
    cfg.rank, cfg.size = rank, size
    keep = None  # the C string must live through the call
    if config.get("rendezvous"):
        keep = ffi.new("char[]", str(config["rendezvous"]).encode())
        cfg.rendezvous = keep
    if config.get("timeout") is not None:
        cfg.timeout_s = float(config["timeout"])
    if config.get("local_rank") is not None:
        cfg.local_rank = int(config["local_rank"])
    st = lib.weft_comm_init_config(cfg, out)
    del keep
    return st


def _op_code(where, op):
    if isinstance(op, str) and op.lower() in OPS:
        return OPS[op.lower()]
    raise InvalidArgument("%s: op %r is not one of %s" % (where, op, ", ".join(OPS)))


class _State:
    """What outlives a Communicator object only as long as requests need it:
    the C handle, the lock that serialises issuing calls (weft's rule: one
    thread at a time per communicator) and the requests still outstanding,
    which keep their buffers alive."""

    def __init__(self, ffi, lib, handle):
        self.ffi, self.lib, self.handle = ffi, lib, handle
        self.lock = threading.RLock()
        self.pending = set()
        self.rank = lib.weft_comm_rank(handle)
        self.size = lib.weft_comm_size(handle)

    def last_error(self, st):
        with self.lock:
            msg = _text(self.ffi, self.lib.weft_last_error(self.handle)) if self.handle else ""
        if not msg:
            msg = _text(self.ffi, self.lib.weft_strerror(st))
            if self.handle is None:
                msg += " (the communicator was destroyed while this request was outstanding)"
        return msg

    def error(self, st):
        return from_status(_text(self.ffi, self.lib.weft_status_name(st)), self.last_error(st), st)

    def destroy(self):
        with self.lock:
            handle, self.handle = self.handle, None
            pending = list(self.pending)
        if handle is None:
            return
        if pending:
            # Another thread (the DDP hooks' waiter, say) may be blocked in
            # weft_wait on one of them, and weft_comm_destroy is not safe
            # beside it; weft_comm_abort is (any thread, any time) and fails
            # every request promptly. Each is then waited for, which frees
            # it and lets its buffers go, before the communicator is freed.
            self.lib.weft_comm_abort(handle)
            for req in pending:
                req._settle()
        self.lib.weft_comm_destroy(handle)


class Request:
    """A non-blocking operation. Its buffers are kept alive and belong to
    weft until wait() returns or test() reports True."""

    def __init__(self, state, creq, keep, result, call):
        self._state = state
        self._creq = creq          # weft_request **, set to NULL by weft_wait/weft_test
        self._keep = keep
        self._result = result
        self._call = call
        self._lock = threading.Lock()
        self._error = None
        self._done = False

    def _finish(self, st):
        # called with self._lock held, once the C request is complete and freed
        self._done = True
        self._keep = None
        self._state.pending.discard(self)
        if st:
            self._error = self._state.error(st)

    def _settle(self):
        with self._lock:
            if not self._done:
                self._finish(self._state.lib.weft_wait(self._creq))

    def test(self):
        """True once the operation completed (raises its error if it failed);
        False while it runs. Never blocks on peers."""
        with self._lock:
            if not self._done:
                done = self._state.ffi.new("int *")
                st = self._state.lib.weft_test(self._creq, done)
                if not done[0]:
                    if st:  # test itself failed: the request is still weft's
                        raise self._state.error(st)
                    return False
                self._finish(st)
        if self._error is not None:
            raise self._error
        return True

    def wait(self, timeout=None):
        """Blocks until the operation completed and returns its result buffer
        (the recv buffer, or the in-place one). timeout=None waits as long as
        the communicator's timeout allows (a stuck peer fails the request);
        timeout=S raises the built-in TimeoutError after S seconds with the
        request still running (wait again later)."""
        if timeout is None:
            self._settle()
        else:
            deadline = time.monotonic() + timeout
            pause = 1e-5
            while not self.test():
                if time.monotonic() >= deadline:
                    raise TimeoutError("weft %s on rank %d: still running after %g s (the "
                                       "request stays outstanding; wait again)"
                                       % (self._call, self._state.rank, timeout))
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def done(self):
        return self._done

    def __repr__(self):
        return "<weft.Request %s %s>" % (self._call, "done" if self._done else "running")


class Communicator:
    """A group of ranks. Collectives must be called by every rank in the same
    order with matching arguments; calls from several threads are serialised."""

    def __init__(self):
        raise TypeError("use weft.init() or Communicator.split()")

    @classmethod
    def _wrap(cls, handle):
        ffi, lib = _lib.load()
        self = object.__new__(cls)
        self._s = _State(ffi, lib, handle)
        self._finalizer = weakref.finalize(self, _State.destroy, self._s)
        return self

    # ---- queries, life ----------------------------------------------------

    @property
    def rank(self):
        return self._s.rank

    @property
    def size(self):
        return self._s.size

    @property
    def local_rank(self):
        return self._s.lib.weft_comm_local_rank(self._handle("local_rank"))

    @property
    def local_size(self):
        return self._s.lib.weft_comm_local_size(self._handle("local_size"))

    def peer_transport(self, peer):
        """(transport, reason) carrying data to `peer`, e.g. ("shm", "same host ...")."""
        s = self._s
        t, r = s.ffi.new("const char **"), s.ffi.new("const char **")
        with s.lock:
            st = s.lib.weft_comm_peer_transport(self._handle("peer_transport"), int(peer), t, r)
            if st:
                raise s.error(st)
            return _text(s.ffi, t[0]), _text(s.ffi, r[0])

    def set_wire_dtype(self, wire):
        """What f32 sum/avg data crossing hosts travels as from the next call on:
        "f32" (exact), "bf16" or "f16" (half the bytes, sums still formed in f32,
        rounded once per hop; docs/tuning.md gives the error). Every rank must
        set the same."""
        s = self._s
        names = {"f32": s.lib.WEFT_F32, "bf16": s.lib.WEFT_BF16, "f16": s.lib.WEFT_F16}
        if wire not in names:
            raise InvalidArgument("rank %d: set_wire_dtype: %r is none of f32, bf16, f16"
                                  % (self.rank, wire))
        with s.lock:
            st = s.lib.weft_comm_set_wire_dtype(self._handle("set_wire_dtype"), names[wire])
            if st:
                raise s.error(st)

    def destroy(self):
        """Releases the communicator (not collective). Requests still
        outstanding complete with Aborted. Calling it twice does nothing."""
        self._finalizer()

    def abort(self):
        """Fails every call blocked in this communicator, here and (promptly)
        on the peers. Any thread; destroy() still follows."""
        handle = self._s.handle
        if handle is not None:
            self._s.lib.weft_comm_abort(handle)

    def revoke(self):
        """Every rank's pending and later calls on this communicator fail
        with weft.Revoked, promptly. Any thread; recover with shrink()."""
        handle = self._s.handle
        if handle is not None:
            self._s.lib.weft_comm_revoke(handle)

    def agree(self, flags=0):
        """Fault-tolerant agreement among the live ranks: returns (the
        bitwise or of every survivor's flags, the sorted list of lost
        ranks), the same on every survivor even when ranks die during it."""
        s = self._s
        cflags = s.ffi.new("uint32_t *", int(flags) & 0xFFFFFFFF)
        failed = s.ffi.new("int[]", max(self.size, 1))
        nfailed = s.ffi.new("int *")
        with s.lock:
            st = s.lib.weft_comm_agree(self._handle("agree"), cflags, failed, nfailed)
            if st:
                raise s.error(st)
        return int(cflags[0]), [int(failed[i]) for i in range(nfailed[0])]

    def grow_id(self):
        """128 bytes a new process passes to weft.join() to ask in (local:
        nothing is sent). They carry the job key unless WEFT_AUTH_TOKEN
        holds it: hand them over as privately as a unique id."""
        s = self._s
        gid = s.ffi.new("weft_unique_id *")
        st = s.lib.weft_comm_grow_id(self._handle("grow_id"), gid)
        if st:
            raise s.error(st)
        return bytes(s.ffi.buffer(gid.bytes))

    def grow(self, nnew=1):
        """Collective over the members: waits until `nnew` processes asked in
        with weft.join(), admits them together, and returns the new
        communicator (members keep their ranks; the newcomers follow)."""
        s = self._s
        out = s.ffi.new("weft_comm **")
        with s.lock:
            st = s.lib.weft_comm_grow(self._handle("grow"), int(nnew), out)
            if st:
                raise s.error(st)
        return Communicator._wrap(out[0])

    def shrink(self):
        """Collective over the live ranks: a new communicator of them,
        numbered densely in the old order. This one is revoked first (if it
        has not failed already) and stays to be destroyed."""
        s = self._s
        out = s.ffi.new("weft_comm **")
        with s.lock:
            st = s.lib.weft_comm_shrink(self._handle("shrink"), out)
            if st:
                raise s.error(st)
        return Communicator._wrap(out[0])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __repr__(self):
        return "<weft.Communicator rank %d of %d%s>" % (
            self.rank, self.size, "" if self._s.handle else ", destroyed")

    def _handle(self, call):
        if self._s.handle is None:
            raise Aborted("WEFT_ERR_ABORTED", "weft %s on rank %d: the communicator was "
                          "destroyed" % (call, self.rank), -8)
        return self._s.handle

    # ---- argument checks ----------------------------------------------------

    def _where(self, call):
        return "weft %s on rank %d of %d" % (call, self.rank, self.size)

    def _buf(self, call, role, obj, writable=False):
        return as_buf(self._s.ffi, self._where(call), role, obj, writable)

    def _root(self, call, root, what="root"):
        # any integer (numpy's too, via __index__), but not a bool or a float
        try:
            value = None if isinstance(root, bool) else operator.index(root)
        except TypeError:
            value = None
        if value is None or not 0 <= value < self.size:
            raise InvalidArgument("%s: %s %r is not a rank in 0 .. %d"
                                  % (self._where(call), what, root, self.size - 1))
        return value

    def _same_dtype(self, call, a, b, an, bn):
        if a.dtype != b.dtype:
            raise InvalidDtype("%s: %s is %s but %s is %s; both must have the same dtype"
                               % (self._where(call), bn, DTYPE_NAMES[b.dtype], an,
                                  DTYPE_NAMES[a.dtype]))

    def _need(self, call, buf, role, count, why):
        if buf.count != count:
            raise InvalidArgument("%s: %s holds %d elements, but %s needs %d"
                                  % (self._where(call), role, buf.count, why, count))

    # ---- issuing ------------------------------------------------------------

    def _run(self, call, nonblocking, args, keep, result):
        s = self._s
        fname = "weft_" + ("i" + call if nonblocking else call)
        with s.lock:
            handle = self._handle(("i" if nonblocking else "") + call)
            if not nonblocking:
                st = getattr(s.lib, fname)(handle, *args)
                if st:
                    raise s.error(st)
                return result
            creq = s.ffi.new("weft_request **")
            st = getattr(s.lib, fname)(handle, *args, creq)
            if st:
                raise s.error(st)
            req = Request(s, creq, keep, result, "i" + call)
            s.pending.add(req)
            return req

    def _allreduce(self, nb, send, recv, op):
        c = "iallreduce" if nb else "allreduce"
        code = _op_code(self._where(c), op)
        s = self._buf(c, "send", send, writable=recv is None)
        r = s if recv is None else self._buf(c, "recv", recv, writable=True)
        if recv is not None:
            self._same_dtype(c, s, r, "send", "recv")
            self._need(c, r, "recv", s.count, "send's count")
        return self._run("allreduce", nb, (s.ptr, r.ptr, s.count, s.code, code), (s, r),
                         send if recv is None else recv)

    def _broadcast(self, nb, buf, root):
        c = "ibroadcast" if nb else "broadcast"
        root = self._root(c, root)
        b = self._buf(c, "buf", buf, writable=self.rank != root)
        return self._run("broadcast", nb, (b.ptr, b.ptr, b.count, b.code, root), (b,), buf)

    def _reduce(self, nb, send, recv, op, root):
        c = "ireduce" if nb else "reduce"
        code = _op_code(self._where(c), op)
        root = self._root(c, root)
        on_root = self.rank == root
        s = self._buf(c, "send", send, writable=on_root and recv is None)
        r = s if recv is None else self._buf(c, "recv", recv, writable=on_root)
        if recv is not None:
            self._same_dtype(c, s, r, "send", "recv")
            self._need(c, r, "recv", s.count, "send's count")
        rptr = r.ptr if on_root else self._s.ffi.NULL
        return self._run("reduce", nb, (s.ptr, rptr, s.count, s.code, code, root), (s, r),
                         (send if recv is None else recv) if on_root else None)

    def _allgather(self, nb, send, recv):
        c = "iallgather" if nb else "allgather"
        s = self._buf(c, "send", send)
        r = self._buf(c, "recv", recv, writable=True)
        self._same_dtype(c, s, r, "send", "recv")
        self._need(c, r, "recv", s.count * self.size,
                   "%d ranks of %d elements" % (self.size, s.count))
        return self._run("allgather", nb, (s.ptr, r.ptr, s.count, s.code), (s, r), recv)

    def _reduce_scatter(self, nb, send, recv, op):
        c = "ireduce_scatter" if nb else "reduce_scatter"
        code = _op_code(self._where(c), op)
        s = self._buf(c, "send", send)
        r = self._buf(c, "recv", recv, writable=True)
        self._same_dtype(c, s, r, "send", "recv")
        self._need(c, s, "send", r.count * self.size,
                   "%d ranks of recv's %d elements" % (self.size, r.count))
        return self._run("reduce_scatter", nb, (s.ptr, r.ptr, r.count, r.code, code), (s, r),
                         recv)

    def _gather(self, nb, send, recv, root):
        c = "igather" if nb else "gather"
        root = self._root(c, root)
        s = self._buf(c, "send", send)
        keep, rptr = (s,), self._s.ffi.NULL
        if self.rank == root:
            r = self._buf(c, "recv", recv, writable=True)
            self._same_dtype(c, s, r, "send", "recv")
            self._need(c, r, "recv", s.count * self.size,
                       "%d ranks of %d elements" % (self.size, s.count))
            keep, rptr = (s, r), r.ptr
        return self._run("gather", nb, (s.ptr, rptr, s.count, s.code, root), keep,
                         recv if self.rank == root else None)

    def _scatter(self, nb, send, recv, root):
        c = "iscatter" if nb else "scatter"
        root = self._root(c, root)
        r = self._buf(c, "recv", recv, writable=True)
        keep, sptr = (r,), self._s.ffi.NULL
        if self.rank == root:
            s = self._buf(c, "send", send)
            self._same_dtype(c, s, r, "send", "recv")
            self._need(c, s, "send", r.count * self.size,
                       "%d ranks of recv's %d elements" % (self.size, r.count))
            keep, sptr = (s, r), s.ptr
        return self._run("scatter", nb, (sptr, r.ptr, r.count, r.code, root), keep, recv)

    def _alltoall(self, nb, send, recv):
        c = "ialltoall" if nb else "alltoall"
        s = self._buf(c, "send", send)
        r = self._buf(c, "recv", recv, writable=True)
        self._same_dtype(c, s, r, "send", "recv")
        self._need(c, r, "recv", s.count, "send's count")
        if s.count % self.size:
            raise InvalidArgument("%s: send holds %d elements, not a multiple of the %d ranks "
                                  "(one block per rank)" % (self._where(c), s.count, self.size))
        return self._run("alltoall", nb, (s.ptr, r.ptr, s.count // self.size, s.code), (s, r),
                         recv)

    def _p2p(self, nb, call, buf, peer, tag):
        c = ("i" if nb else "") + call
        peer = self._root(c, peer, "peer")
        try:
            value = operator.index(tag)
        except TypeError:
            value = -1
        if not 0 <= value <= 0x7fffffff:
            raise InvalidArgument("%s: tag %r must be an integer in 0 .. 2^31-1"
                                  % (self._where(c), tag))
        tag = value
        b = self._buf(c, "buf", buf, writable=call == "recv")
        return self._run(call, nb, (b.ptr, b.count, b.code, peer, tag), (b,), buf)

    # ---- the public calls ------------------------------------------------------

    def allreduce(self, send, recv=None, op="sum"):
        """recv = op over ranks of send (recv None: in place, into send). Returns the result."""
        return self._allreduce(False, send, recv, op)

    def iallreduce(self, send, recv=None, op="sum"):
        return self._allreduce(True, send, recv, op)

    def broadcast(self, buf, root=0):
        """buf = root's buf on every rank."""
        return self._broadcast(False, buf, root)

    def ibroadcast(self, buf, root=0):
        return self._broadcast(True, buf, root)

    def reduce(self, send, recv=None, op="sum", root=0):
        """root's recv = op over ranks of send (recv None: in place on root).
        Other ranks' recv is not written (may be None); returns None there."""
        return self._reduce(False, send, recv, op, root)

    def ireduce(self, send, recv=None, op="sum", root=0):
        return self._reduce(True, send, recv, op, root)

    def allgather(self, send, recv):
        """recv (size x len(send)) gets rank r's send as block r."""
        return self._allgather(False, send, recv)

    def iallgather(self, send, recv):
        return self._allgather(True, send, recv)

    def reduce_scatter(self, send, recv, op="sum"):
        """send holds size blocks of len(recv); rank r's recv = op over ranks of block r."""
        return self._reduce_scatter(False, send, recv, op)

    def ireduce_scatter(self, send, recv, op="sum"):
        return self._reduce_scatter(True, send, recv, op)

    def gather(self, send, recv=None, root=0):
        """root's recv (size x len(send)) gets rank r's send as block r."""
        return self._gather(False, send, recv, root)

    def igather(self, send, recv=None, root=0):
        return self._gather(True, send, recv, root)

    def scatter(self, send, recv, root=0):
        """rank r's recv = block r of root's send (size x len(recv)); send may be None off root."""
        return self._scatter(False, send, recv, root)

    def iscatter(self, send, recv, root=0):
        return self._scatter(True, send, recv, root)

    def alltoall(self, send, recv):
        """block j of send goes to rank j, landing as block (sender's rank) of its recv."""
        return self._alltoall(False, send, recv)

    def ialltoall(self, send, recv):
        return self._alltoall(True, send, recv)

    def barrier(self):
        return self._run("barrier", False, (), (), None)

    def ibarrier(self):
        return self._run("barrier", True, (), (), None)

    def send(self, buf, peer, tag=0):
        """Sends buf to rank peer; the matching recv names the same tag, count and dtype."""
        return self._p2p(False, "send", buf, peer, tag)

    def isend(self, buf, peer, tag=0):
        return self._p2p(True, "send", buf, peer, tag)

    def recv(self, buf, peer, tag=0):
        return self._p2p(False, "recv", buf, peer, tag)

    def irecv(self, buf, peer, tag=0):
        return self._p2p(True, "recv", buf, peer, tag)

    def split(self, color, key=0):
        """Collective: ranks with the same color (>= 0) form a new communicator,
        ordered by key then rank. color None or weft.UNDEFINED: this rank joins
        none and gets None."""
        s = self._s
        color = UNDEFINED if color is None else int(color)
        out = s.ffi.new("weft_comm **")
        with s.lock:
            st = s.lib.weft_comm_split(self._handle("split"), color, int(key), out)
            if st:
                raise s.error(st)
        return Communicator._wrap(out[0]) if out[0] != s.ffi.NULL else None
