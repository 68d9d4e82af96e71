"""weft as a torch.distributed backend.

    import torch.distributed as dist
    import weft.torch                      # registers the backend "weft"
    dist.init_process_group("weft")        # under torchrun, weftrun or mpirun

Collectives on CPU tensors go through weft's non-blocking requests; see
docs/torch.md for what is supported and what is refused.
"""
import atexit
import ctypes
import glob
import inspect
import os

import torch as _torch
import torch.distributed as _dist

__all__ = ["BACKEND", "ProcessGroupWeft", "peer_transport", "recover"]

BACKEND = "weft"


def _env_from_launcher():
    """Fill torch's RANK / WORLD_SIZE / LOCAL_RANK from mpirun's or Slurm's
    variables when no torch launcher set them, so a script started by mpirun
    needs no edits (MASTER_ADDR and MASTER_PORT it must still be given, e.g.
    mpirun -x MASTER_ADDR=host -x MASTER_PORT=29500). torchrun and weftrun set
    them all already; variables already set are never changed."""
    if "RANK" in os.environ:
        return
    for rank, size, local in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ):
        if rank in os.environ and size in os.environ:
            os.environ["RANK"] = os.environ[rank]
            os.environ.setdefault("WORLD_SIZE", os.environ[size])
            if local in os.environ:
                os.environ.setdefault("LOCAL_RANK", os.environ[local])
            return


def _load_backend():
    # A build tree keeps the extension apart from these sources (meson test
    # sets WEFT_TORCH_EXT_DIR); an installed package has it right here.
    ext_dir = os.environ.get("WEFT_TORCH_EXT_DIR")
    if ext_dir and ext_dir not in __path__:
        __path__.append(ext_dir)
    # A wheel (pip install .) holds libweft.so in the package folder. Loaded
    # here first, the extension finds it by its soname whatever RPATH the
    # wheel's builder left (with Debian 12's meson 1.0, meson-python keeps
    # the build tree's).
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libweft.so")
    if os.path.isfile(lib):
        ctypes.CDLL(lib)
    built = [f for d in __path__ for f in glob.glob(os.path.join(d, "_backend*.so"))]
    try:
        from . import _backend
    except ImportError as e:
        why = (f"{built[0]} does not load: {e}" if built else
               f"there is no weft/torch/_backend*.so in {', '.join(__path__)}")
        raise ImportError(
            f"weft.torch: this weft has no torch.distributed backend: {why}. It is built against the "
            "torch that the installing Python imports, so install torch first, then weft again "
            "(pip install --force-reinstall --no-deps . from weft's source); a meson build needs "
            "a Python with torch, its C++ headers and a C++ compiler (docs/torch.md)") from e
    return _backend


# Without the extension there is nothing to register: the import fails here,
# with the sentence of why, rather than at init_process_group("weft") with
# torch's "Invalid backend".
_backend = _load_backend()
ProcessGroupWeft = _backend.ProcessGroupWeft


def _create(store, rank, size, timeout):
    return _backend.create(store, rank, size, timeout)


def _register():
    if getattr(_dist.Backend, BACKEND.upper(), None) is not None:
        return  # registered already (the module reloaded)
    if "devices" in inspect.signature(_dist.Backend.register_backend).parameters:
        # torch 2.x: cuda too, so CUDA tensors reach weft, which refuses them
        # with a sentence on weft's GPU support instead of torch's "no
        # backend"; object collectives and barrier still pick cpu
        _dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    else:  # torch 1.13: one process group for every device
        _dist.Backend.register_backend(BACKEND, _create)


def peer_transport(peer, group=None):
    """The transport weft chose for `peer` in `group` ("shm", "tcp", "self")."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupWeft):
        # torch 2.x wraps backends in a ProcessGroup
        pg = pg._get_backend(_torch.device("cpu"))
    return pg.peer_transport(peer)


_recovery_stores = []  # rank 0's store server must outlive the group made on it


def _reachable_host():
    """An address of this host the other ranks can reach: the one a socket
    toward MASTER_ADDR leaves from (nothing is sent), else 127.0.0.1."""
    import socket
    target = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def recover(group=None, timeout=None):
    """After a collective raised because a rank was lost: the survivors
    agree on who is alive (weft_comm_shrink over weft's control plane, no
    rendezvous through the old rank 0, which may be the one that died),
    the new rank 0 starts a TCPStore and passes its address to the others
    over the shrunk communicator, and every survivor destroys the default
    process group and makes a new one of the survivors on that store.
    Returns (rank, world_size) of the new group. Call it on every survivor;
    modules wrapped in DDP must be wrapped again (their group is gone)."""
    import datetime
    be = _dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(be, ProcessGroupWeft):
        be = be._get_backend(_torch.device("cpu"))  # torch 2.x wraps backends
    rank, size = be._shrink()
    wait = timeout if timeout is not None else datetime.timedelta(seconds=300)
    try:
        if rank == 0:
            host = _reachable_host()
            store = _dist.TCPStore(host, 0, size, True, wait, wait_for_workers=False)
            where = "%s:%d" % (host, store.port)
        else:
            where = ""
        where = be._shrunk_broadcast(where)
    finally:
        be._shrunk_destroy()
    if rank != 0:
        host, port = where.rsplit(":", 1)
        store = _dist.TCPStore(host, int(port), size, False, wait)
    _recovery_stores.append(store)
    _dist.destroy_process_group()
    _dist.init_process_group(BACKEND, store=store, rank=rank, world_size=size, timeout=wait)
    return rank, size


_env_from_launcher()
_register()
# Before the interpreter finalizes: a completer thread that finishes a future
# with a Python callback then needs the GIL, and Python 3.11 ends such a
# thread mid-way once finalization began (the process aborts). Groups left
# alive at exit (no destroy_process_group) are stopped here instead.
atexit.register(_backend.shutdown_all)

from .grad import GradReducer  # noqa: E402 (after the backend it needs loads)

__all__ += ["GradReducer"]

try:  # the DDP comm hooks (weft.torch.hooks) come with the Python package
    from .hooks import *  # noqa: F401,F403
    from . import hooks as _hooks

    __all__ += list(getattr(_hooks, "__all__", []))
except ImportError:
    pass
