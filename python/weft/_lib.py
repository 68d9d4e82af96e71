# _lib.py - finds libweft.so and opens it through cffi in ABI mode (no
# compiler needed at install or import time); the declarations below are a
# copy of the parts of include/weft.h the package calls, which
# tests/test_declarations.py compares with the header.
import glob
import json
import os

# cffi is imported when the plain API first needs it (declarations()), not
# here: weft.torch (a C++ extension) and a torch venv without cffi import this
# package too, and must not fail on it.

# Only what the package uses. Enums are declared with their values so a
# reordering in weft.h shows up as a test failure, not as wrong calls.
CDEF = """
typedef enum weft_status {
  WEFT_OK = 0, WEFT_ERR_INVALID = -1, WEFT_ERR_NOMEM = -2, WEFT_ERR_TIMEOUT = -3,
  WEFT_ERR_PEER_LOST = -4, WEFT_ERR_SYSTEM = -5, WEFT_ERR_BOOTSTRAP = -6,
  WEFT_ERR_MISMATCH = -7, WEFT_ERR_ABORTED = -8, WEFT_ERR_UNSUPPORTED = -9,
  WEFT_ERR_PROTOCOL = -10, WEFT_ERR_INTERNAL = -11, WEFT_ERR_REVOKED = -12
} weft_status;
typedef enum weft_dtype {
  WEFT_F32 = 0, WEFT_F64 = 1, WEFT_F16 = 2, WEFT_BF16 = 3,
  WEFT_I8 = 4, WEFT_U8 = 5, WEFT_I32 = 6, WEFT_I64 = 7, WEFT_DTYPE_COUNT
} weft_dtype;
typedef enum weft_op {
  WEFT_SUM = 0, WEFT_PROD = 1, WEFT_MIN = 2, WEFT_MAX = 3, WEFT_AVG = 4, WEFT_OP_COUNT
} weft_op;
typedef struct weft_comm weft_comm;
typedef struct weft_request weft_request;

const char *weft_strerror(weft_status status);
const char *weft_status_name(weft_status status);
const char *weft_last_error(const weft_comm *comm);
size_t weft_dtype_size(weft_dtype dtype);
const char *weft_version_string(void);

typedef struct weft_config {
  uint32_t version;
  int rank;
  int size;
  int local_rank;
  const char *rendezvous;
  double timeout_s;
} weft_config;
void weft_config_init(weft_config *cfg);
weft_status weft_comm_init_env(weft_comm **comm);
weft_status weft_comm_init_config(const weft_config *cfg, weft_comm **comm);
typedef struct weft_unique_id { char bytes[128]; } weft_unique_id;
weft_status weft_get_unique_id(weft_unique_id *id);
weft_status weft_comm_init_rank(weft_comm **comm, const weft_unique_id *id, int rank, int size);
int weft_comm_rank(const weft_comm *comm);
int weft_comm_size(const weft_comm *comm);
int weft_comm_local_rank(const weft_comm *comm);
int weft_comm_local_size(const weft_comm *comm);
weft_status weft_comm_peer_transport(const weft_comm *comm, int peer, const char **transport,
                                     const char **reason);
weft_status weft_comm_destroy(weft_comm *comm);
weft_status weft_comm_abort(weft_comm *comm);
weft_status weft_comm_set_wire_dtype(weft_comm *comm, weft_dtype wire);
weft_status weft_comm_split(weft_comm *comm, int color, int key, weft_comm **newcomm);
weft_status weft_comm_revoke(weft_comm *comm);
weft_status weft_comm_agree(weft_comm *comm, uint32_t *flags, int *failed, int *nfailed);
weft_status weft_comm_shrink(weft_comm *comm, weft_comm **newcomm);
weft_status weft_comm_grow_id(const weft_comm *comm, weft_unique_id *id);
weft_status weft_comm_grow(weft_comm *comm, int nnew, weft_comm **newcomm);
weft_status weft_comm_join(const weft_unique_id *id, weft_comm **newcomm);

weft_status weft_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           weft_dtype dtype, weft_op op);
weft_status weft_broadcast(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           weft_dtype dtype, int root);
weft_status weft_reduce(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        weft_dtype dtype, weft_op op, int root);
weft_status weft_allgather(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                           weft_dtype dtype);
weft_status weft_reduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                size_t recvcount, weft_dtype dtype, weft_op op);
weft_status weft_gather(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                        weft_dtype dtype, int root);
weft_status weft_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                         weft_dtype dtype, int root);
weft_status weft_alltoall(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                          weft_dtype dtype);
weft_status weft_barrier(weft_comm *comm);
weft_status weft_send(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype, int peer,
                      int tag);
weft_status weft_recv(weft_comm *comm, void *buf, size_t count, weft_dtype dtype, int peer,
                      int tag);

weft_status weft_iallreduce(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                            weft_dtype dtype, weft_op op, weft_request **req);
weft_status weft_ibroadcast(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                            weft_dtype dtype, int root, weft_request **req);
weft_status weft_ireduce(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         weft_dtype dtype, weft_op op, int root, weft_request **req);
weft_status weft_iallgather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                            size_t sendcount, weft_dtype dtype, weft_request **req);
weft_status weft_ireduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, weft_dtype dtype, weft_op op,
                                 weft_request **req);
weft_status weft_igather(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                         weft_dtype dtype, int root, weft_request **req);
weft_status weft_iscatter(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                          weft_dtype dtype, int root, weft_request **req);
weft_status weft_ialltoall(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           weft_dtype dtype, weft_request **req);
weft_status weft_ibarrier(weft_comm *comm, weft_request **req);
weft_status weft_isend(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype, int peer,
                       int tag, weft_request **req);
weft_status weft_irecv(weft_comm *comm, void *buf, size_t count, weft_dtype dtype, int peer,
                       int tag, weft_request **req);
weft_status weft_wait(weft_request **req);
weft_status weft_test(weft_request **req, int *done);
"""

# The soname first: an installed library without its development symlink
# (libweft.so) is still found.
_NAMES = ("libweft.so.0", "libweft.so")


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def _installed_candidates():
    """The library meson installed with this package (its path is written
    into _install.py at install time), or one copied next to the package."""
    out = []
    try:
        from . import _install  # generated by python/meson.build, absent in a checkout
        out.append(_install.LIBRARY)
    except ImportError:
        pass
    out.extend(os.path.join(_package_dir(), n) for n in _NAMES)
    return out


def _sanitized(build_dir):
    """Whether meson built this folder with a sanitizer (b_sanitize): such a
    libweft cannot be opened by a python that was not started with the
    sanitizer's runtime first (tools/test.sh keeps one beside the others)."""
    try:
        with open(os.path.join(build_dir, "meson-info", "intro-buildoptions.json")) as f:
            options = json.load(f)
    except (OSError, ValueError):
        return False
    return any(o.get("name") == "b_sanitize" and o.get("value") not in ("none", "", None)
               for o in options if isinstance(o, dict))


def _build_tree_candidates():
    """A checkout: python/weft/ sits two levels below the source root; meson
    build folders are named build* there (README, common notes). build/
    first, then the most recently built other one; not a sanitizer's build,
    nor one whose library is not there yet."""
    root = os.path.dirname(os.path.dirname(_package_dir()))
    if not os.path.isfile(os.path.join(root, "include", "weft.h")):
        return []
    found = []
    for p in glob.glob(os.path.join(root, "build*", "libweft.so")):
        if _sanitized(os.path.dirname(p)):
            continue
        try:  # a tree being built has the link before its target: pass it by
            found.append((os.path.basename(os.path.dirname(p)) != "build", -os.path.getmtime(p), p))
        except OSError:
            pass
    return [p for _, _, p in sorted(found)]


def find_library():
    """Returns (path, how found). Order: next to the package (installed),
    WEFT_LIBRARY, a build folder of the checkout, then the dynamic loader's
    own search (LD_LIBRARY_PATH, ld.so.cache). Raises OSError listing
    every place looked at."""
    tried = []
    for path in _installed_candidates():
        if os.path.isfile(path):
            return path, "installed with the package"
        tried.append(path)
    env = os.environ.get("WEFT_LIBRARY", "")
    if env:
        if os.path.isfile(env):
            return os.path.abspath(env), "WEFT_LIBRARY"
        # A set but wrong WEFT_LIBRARY is a mistake to report, not to skip
        # past: loading some other libweft would hide it.
        raise OSError("WEFT_LIBRARY=%s is not a file (unset it, or point it at a built "
                      "libweft.so, e.g. build/libweft.so)" % env)
    tried.append("WEFT_LIBRARY (unset)")
    for path in _build_tree_candidates():
        return path, "build folder of the checkout"
    tried.append(os.path.join(os.path.dirname(os.path.dirname(_package_dir())),
                              "build*/libweft.so"))
    return None, tried


_ffi = None
_lib = None
_path = None
_declared = None


def declarations():
    """The FFI with CDEF parsed, opening nothing. Parsing takes about 70 ms
    (pycparser), more than the rest of an import: a process that forks ranks
    calls this first, so that its children share the result."""
    global _declared
    if _declared is None:
        try:
            import cffi
        except ImportError as e:
            raise ImportError(
                "weft: the plain weft API (weft.init, Communicator) needs cffi, which this "
                "Python lacks: pip install cffi (Debian: apt-get install python3-cffi). "
                "weft.torch, the torch.distributed backend, needs only torch.") from e
        ffi = cffi.FFI()
        ffi.cdef(CDEF)
        _declared = ffi
    return _declared


def load():
    """Opens the library once per process; returns (ffi, lib)."""
    global _ffi, _lib, _path
    if _lib is not None:
        return _ffi, _lib
    ffi = declarations()
    path, how = find_library()
    if path is None:
        errors = []
        for name in _NAMES:
            try:
                lib = ffi.dlopen(name)
            except OSError as e:
                errors.append(str(e))
                continue
            _ffi, _lib, _path = ffi, lib, name
            return ffi, lib
        raise OSError("weft: libweft.so not found; looked at " + ", ".join(how) +
                      " and the loader's path (" + "; ".join(errors) +
                      "). Set WEFT_LIBRARY=/path/to/libweft.so or install weft "
                      "(meson install).")
    try:
        lib = ffi.dlopen(path)
    except OSError as e:
        raise OSError("weft: could not load %s (%s): %s" % (path, how, e)) from e
    _ffi, _lib, _path = ffi, lib, path
    return ffi, lib


def path():
    load()
    return _path
