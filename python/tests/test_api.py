# test_api.py - the package's contract beyond the data: bad input refused
# with a clear message before anything is sent, errors carrying the status
# and the library's sentence, requests (buffers kept alive, test, wait with a
# timeout, destroy with requests outstanding), the library search order,
# and the cffi declarations against include/weft.h.
import gc
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import ranks
import weft
from weft import _lib

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def comm():
    c = weft.init(0, 1)
    yield c
    c.destroy()


# ---- bad input ---------------------------------------------------------------

def refused(exc, fn, *words):
    """fn() must raise exc, a WeftError with status WEFT_ERR_INVALID, whose
    message names the call, the rank and every word."""
    with pytest.raises(exc) as info:
        fn()
    e = info.value
    assert isinstance(e, weft.WeftError) and e.status == "WEFT_ERR_INVALID", repr(e)
    text = str(e)
    for w in ("rank 0",) + words:
        assert w in text, "%r not in %r" % (w, text)
    return text


def test_wrong_dtypes_refused(comm):
    for bad in (np.zeros(4, np.uint32), np.zeros(4, bool), np.zeros(4, np.complex64),
                np.zeros(4, np.int16)):
        refused(weft.InvalidDtype, lambda: comm.allreduce(bad), "allreduce", str(bad.dtype),
                "supported")
    refused(TypeError, lambda: comm.allreduce(np.zeros(4, ">f4")), "byte order")
    x = np.zeros(4, np.float32)
    text = refused(weft.InvalidDtype, lambda: comm.allreduce(x, np.zeros(4, np.float64)),
                   "allreduce", "float64", "float32", "same dtype")
    assert "recv" in text and "send" in text


@needs_torch
def test_torch_dtypes_and_devices(comm):
    refused(weft.InvalidDtype, lambda: comm.allreduce(torch.zeros(3, dtype=torch.bool)),
            "torch.bool")
    refused(weft.InvalidDtype, lambda: comm.broadcast(torch.zeros(3, dtype=torch.complex64), 0),
            "broadcast", "complex64")
    # a tensor off the CPU (meta here: the same path a CUDA tensor takes)
    text = refused(weft.InvalidArgument, lambda: comm.allreduce(torch.zeros(3, device="meta")),
                   "meta", "CPU buffers only", "GPU")
    assert "GPU buffers come with" in text
    refused(weft.InvalidArgument,
            lambda: comm.allreduce(torch.zeros(4, 4).t()), "not contiguous")
    refused(weft.InvalidArgument,
            lambda: comm.allreduce(torch.zeros(4).to_sparse()), "dense")
    # every supported torch dtype goes through
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
               torch.uint8, torch.int32, torch.int64):
        t = torch.ones(5, dtype=dt)
        comm.allreduce(t, op="max")
        assert t.tolist() == [1] * 5


def test_non_contiguous_and_read_only_refused(comm):
    x = np.arange(10, dtype=np.float32)
    refused(weft.InvalidArgument, lambda: comm.allreduce(x[::2]), "allreduce", "send",
            "not contiguous")
    refused(weft.InvalidArgument, lambda: comm.allgather(x[:2], np.zeros((4, 4), np.float32).T),
            "recv", "not contiguous")
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    refused(weft.InvalidArgument, lambda: comm.allreduce(ro), "read-only")
    refused(weft.InvalidArgument, lambda: comm.allreduce(np.ones(3, np.float32), ro),
            "recv", "read-only")
    refused(weft.InvalidArgument, lambda: comm.recv(b"abc", 0), "recv", "read-only")
    # read-only is fine where weft only reads: a send buffer, a broadcast's root
    out = np.zeros(3, np.float32)
    comm.allreduce(ro, out)
    assert out.tolist() == [1, 1, 1]
    comm.broadcast(ro, 0)
    # the buffer protocol: array.array, bytearray (u8), memoryview
    import array
    a = array.array("d", [1.5, 2.5])
    comm.allreduce(a, op="sum")
    assert list(a) == [1.5, 2.5]
    comm.allreduce(bytearray(b"\x01\x02"))
    refused(weft.InvalidArgument, lambda: comm.allreduce([1.0, 2.0]), "list", "not a buffer")
    refused(weft.InvalidArgument, lambda: comm.allreduce(None), "send is None")
    refused(weft.InvalidDtype, lambda: comm.allreduce(array.array("u", "ab")), "format")


def test_sizes_roots_ops_refused(comm):
    x = np.zeros(6, np.float32)
    refused(weft.InvalidArgument, lambda: comm.allreduce(x, np.zeros(5, np.float32)),
            "recv holds 5 elements", "needs 6")
    refused(weft.InvalidArgument, lambda: comm.allgather(x, np.zeros(5, np.float32)),
            "allgather", "recv holds 5")
    refused(weft.InvalidArgument, lambda: comm.reduce_scatter(x, np.zeros(5, np.float32)),
            "reduce_scatter", "send holds 6")
    refused(weft.InvalidArgument, lambda: comm.alltoall(x, np.zeros(7, np.float32)),
            "alltoall", "recv holds 7")
    refused(weft.InvalidArgument, lambda: comm.allreduce(x, op="mean"), "op 'mean'")
    refused(weft.InvalidArgument, lambda: comm.broadcast(x, root=1), "root 1", "0 .. 0")
    refused(weft.InvalidArgument, lambda: comm.ireduce(x, root=-1), "ireduce", "root -1")
    refused(weft.InvalidArgument, lambda: comm.send(x, 3), "send", "peer 3")
    refused(weft.InvalidArgument, lambda: comm.isend(x, 0, tag=-2), "isend", "tag -2")
    refused(weft.InvalidArgument, lambda: comm.irecv(x, 0, tag="a"), "irecv", "tag 'a'")
    refused(weft.InvalidArgument, lambda: comm.broadcast(x, root=True), "root True")
    refused(weft.InvalidArgument, lambda: comm.broadcast(x, root=0.0), "root 0.0")
    comm.broadcast(x, root=np.int64(0))  # numpy integers are integers
    # a refusal of the library itself (alltoall never in place) is the same class
    with pytest.raises(weft.InvalidArgument, match="in place"):
        comm.alltoall(x, x)


def refused_then_fine(comm):
    """A refused call sends nothing: rank 0's bad calls leave no partial
    collective behind, so the next good one matches on every rank."""
    x = np.full(1000, comm.rank + 1.0, np.float32)
    if comm.rank == 0:
        for bad in (lambda: comm.allreduce(x, np.zeros(999, np.float32)),
                    lambda: comm.allreduce(x[::2]),
                    lambda: comm.allreduce(x, np.zeros(1000, np.float64)),
                    lambda: comm.iallgather(x, np.zeros(3, np.float32))):
            try:
                bad()
            except weft.InvalidArgument:
                pass
            else:
                raise AssertionError("a bad call went through")
    comm.allreduce(x)
    return x[:3].tolist()


@pytest.mark.parametrize("size", [2, 3])
def test_refused_call_sends_nothing(size):
    total = float(sum(range(1, size + 1)))
    assert ranks.run(size, refused_then_fine, timeout=60) == [[total] * 3] * size


# ---- init and errors -----------------------------------------------------------

def run_python(code, env=None, timeout=60):
    e = dict(os.environ)
    for k in ("WEFT_RANK", "WEFT_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        e.pop(k, None)
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(weft.__file__)))
    e["WEFT_LIBRARY"] = _lib.path()
    e.update(env or {})
    # from / : python -c puts the working folder first on sys.path, which
    # must not be python/ of the checkout when a copy of the package is tested
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def test_wire_dtype_names(comm):
    """f32, bf16 and f16 are taken (one rank: nothing crosses a host, the sum
    stays exact); anything else is refused by name before the library sees it."""
    x = np.arange(1, 1001, dtype=np.float32) / 7
    for wire in ("bf16", "f16", "f32"):
        comm.set_wire_dtype(wire)
        y = x.copy()
        comm.allreduce(y)
        assert np.array_equal(y, x)
    refused(weft.InvalidArgument, lambda: comm.set_wire_dtype("fp8"), "set_wire_dtype", "fp8")


def test_init_errors_carry_the_library_sentence():
    p = run_python("import weft\ntry:\n    weft.init()\nexcept weft.WeftError as e:\n"
                   "    print(e.status, '|', e.message)\n")
    assert p.returncode == 0, p.stderr
    status, msg = p.stdout.split("|", 1)
    assert status.strip() == "WEFT_ERR_INVALID"
    assert "no rank and world size" in msg and "weftrun" in msg, msg
    with pytest.raises(TypeError, match="unknown argument"):
        weft.init(0, 1, colour=3)
    with pytest.raises(TypeError, match="both rank and size"):
        weft.init(rank=0)
    with pytest.raises(TypeError, match="must be integers"):
        weft.init(0.5, 2, rendezvous="127.0.0.1:1")
    with pytest.raises(TypeError, match="needs rank and size"):
        weft.init(timeout=3)
    with pytest.raises(weft.InvalidArgument, match="128"):
        weft.init(0, 2, unique_id=b"short")
    with pytest.raises(weft.WeftError) as info:
        weft.init(0, 2, unique_id=bytes(128))
    assert info.value.status == "WEFT_ERR_INVALID" and "weft_get_unique_id" in str(info.value)
    with pytest.raises(weft.WeftError, match="needs a rendezvous"):
        weft.init(0, 2)
    with pytest.raises(weft.WeftError, match="rank 5 is not in"):
        weft.init(5, 2, rendezvous="127.0.0.1:1")


def test_init_with_config_and_queries():
    with weft.init(0, 1, timeout=2.5, local_rank=0) as c:
        assert (c.rank, c.size, c.local_rank, c.local_size) == (0, 1, 0, 1)
        assert c.peer_transport(0)[0] == "self"
        assert "rank 0 of 1" in repr(c)
    assert "destroyed" in repr(c)
    c.destroy()  # twice: nothing
    with pytest.raises(weft.Aborted, match="destroyed"):
        c.allreduce(np.zeros(2, np.float32))
    assert re.match(r"\d+\.\d+\.\d+", weft.library_version())
    # in a process of its own: the id's rendezvous server thread would stay in
    # this one (the tests fork ranks from it) until its timeout
    p = run_python("import weft\nuid = weft.get_unique_id()\n"
                   "assert isinstance(uid, bytes) and len(uid) == 128\n"
                   "with weft.init(0, 1, unique_id=uid) as c:\n    print(c.size)\n",
                   {"WEFT_DEBUG": "NONE"})
    assert p.returncode == 0 and p.stdout.strip() == "1", p.stderr


# ---- requests --------------------------------------------------------------------

def request_keeps_buffers(comm):
    """Rank 0 drops every reference to its buffers while its requests run
    (rank 1 joins late); the request keeps them alive, and wait() hands the
    result back."""
    if comm.rank == 1:
        time.sleep(0.5)
    # out of place, with the send buffers held by nothing but their requests
    reqs = [comm.iallreduce(np.full(100000, float(i + comm.rank), np.float64),
                            np.zeros(100000, np.float64)) for i in range(4)]
    gc.collect()
    junk = [np.full(100000, -1.0) for _ in range(8)]  # would reuse freed memory
    out = [r.wait()[:2].tolist() for r in reqs]
    del junk
    return out


def test_request_keeps_buffers_alive():
    got = ranks.run(2, request_keeps_buffers, timeout=60)
    want = [[2.0 * i + 1] * 2 for i in range(4)]
    assert got == [want, want]


def request_wait_and_test(comm):
    x = np.ones(10, np.float32)
    if comm.rank == 1:
        time.sleep(1.0)
        comm.allreduce(x)
        return "late"
    req = comm.iallreduce(x)
    assert req.test() is False and not req.done
    try:
        req.wait(timeout=0.05)
    except weft.WeftError:
        raise AssertionError("a wait timeout must not be a WeftError")
    except TimeoutError as e:
        assert "still running" in str(e), e
    else:
        raise AssertionError("wait(timeout) returned before the peer joined")
    assert req.wait() is x and req.done and x.tolist() == [2.0] * 10
    assert req.test() is True and req.wait() is x  # completed: both return at once
    return "waited"


def test_request_wait_timeout_and_test():
    assert ranks.run(2, request_wait_and_test, timeout=60) == ["waited", "late"]


def destroy_with_outstanding(comm):
    """Rank 0 destroys its communicator with a request outstanding (rank 1
    never joins it): the request fails with Aborted, and does not hang."""
    if comm.rank == 1:
        time.sleep(0.5)
        return "stayed out"
    req = comm.iallreduce(np.ones(8, np.float32))
    comm.destroy()
    try:
        req.wait()
    except weft.Aborted as e:
        assert e.status == "WEFT_ERR_ABORTED", e
        return "aborted"
    raise AssertionError("the request completed without its peer")


def test_destroy_with_outstanding_request():
    got = ranks.run(2, destroy_with_outstanding, timeout=60, env={"WEFT_TIMEOUT": "10"})
    assert got == ["aborted", "stayed out"]


# ---- the library search order ------------------------------------------------------

def test_library_search_order(tmp_path):
    built = _lib.path()
    # WEFT_LIBRARY names a file: that one
    p = run_python("import weft; print(weft.library_path())", {"WEFT_LIBRARY": built})
    assert p.returncode == 0 and p.stdout.strip() == built, p.stderr
    # WEFT_LIBRARY names nothing: an error that says so, never another library
    p = run_python("import weft; weft.library_path()", {"WEFT_LIBRARY": str(tmp_path / "no.so")})
    assert p.returncode != 0 and "WEFT_LIBRARY=" in p.stderr and "is not a file" in p.stderr
    # installed: a copy of the package with _install.py wins over WEFT_LIBRARY
    pkg = tmp_path / "site" / "weft"
    shutil.copytree(os.path.dirname(weft.__file__), pkg)
    (pkg / "_install.py").write_text("LIBRARY = %r\n" % built)
    p = run_python("import weft; print(weft.library_path(), weft.__file__)",
                   {"PYTHONPATH": str(tmp_path / "site"), "WEFT_LIBRARY": "/nonexistent"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [built, str(pkg / "__init__.py")]
    # a copy with the library next to it (a wheel's layout)
    (pkg / "_install.py").unlink()
    shutil.copy(built, pkg / "libweft.so")
    p = run_python("import weft; print(weft.library_path())",
                   {"PYTHONPATH": str(tmp_path / "site"), "WEFT_LIBRARY": "/nonexistent"})
    assert p.stdout.strip() == str(pkg / "libweft.so"), p.stderr
    # nothing anywhere: the error lists where it looked
    os.unlink(pkg / "libweft.so")
    p = run_python("import weft; weft.library_path()",
                   {"PYTHONPATH": str(tmp_path / "site"), "WEFT_LIBRARY": "",
                    "LD_LIBRARY_PATH": ""})
    if p.returncode == 0:
        pytest.skip("a libweft is installed system-wide; the not-found message cannot be seen")
    assert "libweft.so not found" in p.stderr and "WEFT_LIBRARY" in p.stderr


def test_build_tree_found_from_a_checkout():
    builds = _lib._build_tree_candidates()
    if not builds:
        pytest.skip("no build*/libweft.so inside the checkout")
    p = run_python("import weft; print(weft.library_path())",
                   {"PYTHONPATH": os.path.join(SOURCE_ROOT, "python"), "WEFT_LIBRARY": ""})
    assert p.returncode == 0 and p.stdout.strip() == builds[0], p.stderr


def test_build_tree_half_built_or_sanitized_is_passed_by(tmp_path):
    """A checkout with two more build folders, newer than the one to take:
    one half built (meson makes the link libweft.so before the library it
    names), one built with a sanitizer (python cannot open that library).
    import weft takes the plain, finished one, and fails on neither."""
    shutil.copytree(os.path.dirname(weft.__file__), tmp_path / "python" / "weft")
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "weft.h").write_text("/* a checkout */\n")
    (tmp_path / "build-done").mkdir()
    shutil.copy(_lib.path(), tmp_path / "build-done" / "libweft.so")
    os.utime(tmp_path / "build-done" / "libweft.so", (1, 1))  # the oldest
    (tmp_path / "build-half").mkdir()
    os.symlink("libweft.so.0", tmp_path / "build-half" / "libweft.so")  # not there yet
    asan = tmp_path / "build-asan"
    (asan / "meson-info").mkdir(parents=True)
    (asan / "meson-info" / "intro-buildoptions.json").write_text(
        '[{"name": "b_sanitize", "value": "address,undefined"}]')
    shutil.copy(_lib.path(), asan / "libweft.so")
    p = run_python("import weft; print(weft.library_path())",
                   {"PYTHONPATH": str(tmp_path / "python"), "WEFT_LIBRARY": ""})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(tmp_path / "build-done" / "libweft.so")


def _normalise(decl):
    decl = re.sub(r"\bWEFT_API\b", "", decl)
    decl = re.sub(r"\s+", " ", decl).strip()
    decl = re.sub(r"\s*([(),*])\s*", r"\1", decl)
    return decl


def test_declarations_match_the_header():
    """Every function the package declares has exactly that prototype in
    include/weft.h, and the enums keep their values."""
    header = os.path.join(SOURCE_ROOT, "include", "weft.h")
    if not os.path.isfile(header):
        pytest.skip("include/weft.h is not next to the package (an installed copy)")
    text = open(header).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    protos = {}
    for m in re.finditer(r"WEFT_API\s+([^;{]*?\b(weft_\w+)\s*\([^;]*?\))\s*;", text, flags=re.S):
        protos[m.group(2)] = _normalise(m.group(1))
    cdef = re.sub(r"/\*.*?\*/", "", _lib.CDEF, flags=re.S)
    declared = re.findall(r"^([^\n;]*?\b(weft_\w+)\s*\([^;]*?\))\s*;", cdef, flags=re.M | re.S)
    assert len(declared) > 40
    for decl, name in declared:
        assert name in protos, "%s is declared in _lib.py but not in weft.h" % name
        assert _normalise(decl) == protos[name], "%s differs:\n  _lib.py: %s\n  weft.h:  %s" % (
            name, _normalise(decl), protos[name])
    ffi, lib = _lib.load()
    names = {"WEFT_F32": 0, "WEFT_BF16": 3, "WEFT_I64": 7, "WEFT_AVG": 4, "WEFT_MAX": 3}
    for name, value in names.items():
        assert re.search(r"\b%s = %d\b" % (name, value), text), name
        assert getattr(lib, name) == value
    for m in re.finditer(r"X\((\w+), (-?\d+),", text):
        assert getattr(lib, "WEFT_" + m.group(1)) == int(m.group(2)), m.group(1)
    for name, (code, size) in weft.DTYPES.items():
        assert lib.weft_dtype_size(code) == size, name
