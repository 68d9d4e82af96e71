# _buffers.py - turns what a caller passes (numpy arrays, torch tensors,
# anything with the buffer protocol) into (pointer, count, dtype) for the C
# calls, and refuses what weft cannot take before anything is sent: a buffer
# that is refused here never reaches a peer, so no rank is left waiting.
import sys

from ._errors import InvalidArgument, InvalidDtype

# weft's dtypes: name -> (code in weft.h, bytes per element)
DTYPES = {
    "f32": (0, 4), "f64": (1, 8), "f16": (2, 2), "bf16": (3, 2),
    "i8": (4, 1), "u8": (5, 1), "i32": (6, 4), "i64": (7, 8),
}

DTYPE_NAMES = {
    "f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
    "i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64",
}

_NUMPY_KINDS = {
    ("f", 4): "f32", ("f", 8): "f64", ("f", 2): "f16",
    ("i", 1): "i8", ("u", 1): "u8", ("i", 4): "i32", ("i", 8): "i64",
}

_TORCH_NAMES = {
    "torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16",
    "torch.bfloat16": "bf16", "torch.int8": "i8", "torch.uint8": "u8",
    "torch.int32": "i32", "torch.int64": "i64",
}

# struct-module format letters of the buffer protocol (native sizes, as
# memoryview reports them)
_FORMATS = {"f": "f32", "d": "f64", "e": "f16"}
# integer letters by (signed, bytes): a C long is 8 bytes here, 4 elsewhere
_INT_SIZES = {(True, 1): "i8", (False, 1): "u8", (True, 4): "i32", (True, 8): "i64"}

SUPPORTED = "float32, float64, float16, bfloat16 (torch), int8, uint8, int32, int64"


class Buf:
    """One buffer as weft sees it. `keep` holds whatever must stay alive
    while weft may still touch the memory (the caller's object, cffi's
    view of it)."""
    __slots__ = ("ptr", "count", "dtype", "code", "itemsize", "writable", "keep", "obj")

    def __init__(self, ptr, count, dtype, writable, keep, obj):
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.code, self.itemsize = DTYPES[dtype]
        self.writable = writable
        self.keep = keep
        self.obj = obj


def _torch_tensor_class():
    # torch is never imported here: a caller who passes a tensor has done it
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _numpy_class():
    np = sys.modules.get("numpy")
    return getattr(np, "ndarray", None) if np is not None else None


def _describe(obj):
    return type(obj).__module__ + "." + type(obj).__qualname__


def _from_torch(ffi, where, role, t):
    if t.device.type != "cpu":
        raise InvalidArgument(
            "%s: %s is a tensor on %s; this release of weft takes CPU buffers only "
            "(GPU buffers come with weft's GPU support). Pass t.cpu() and copy back, "
            "or use NCCL for GPU tensors for now." % (where, role, t.device))
    if str(t.layout) != "torch.strided":
        raise InvalidArgument("%s: %s is a %s tensor; weft takes dense (strided) tensors"
                              % (where, role, t.layout))
    dtype = _TORCH_NAMES.get(str(t.dtype))
    if dtype is None:
        raise InvalidDtype("%s: %s has dtype %s, which weft does not reduce or move; "
                           "supported: %s" % (where, role, t.dtype, SUPPORTED))
    if not t.is_contiguous():
        raise InvalidArgument("%s: %s is not contiguous (shape %s, strides %s); pass "
                              "t.contiguous() and copy back" % (where, role, tuple(t.shape),
                                                               t.stride()))
    ptr = ffi.cast("void *", t.data_ptr())
    return Buf(ptr, t.numel(), dtype, True, t, t)


def _from_numpy(ffi, where, role, a):
    kind = (a.dtype.kind, a.dtype.itemsize)
    dtype = _NUMPY_KINDS.get(kind)
    if dtype is None or a.dtype.fields is not None:
        raise InvalidDtype("%s: %s has dtype %s, which weft does not reduce or move; "
                           "supported: %s" % (where, role, a.dtype, SUPPORTED))
    if not a.dtype.isnative:
        raise InvalidDtype("%s: %s has dtype %s in non-native byte order; pass "
                           "a.astype(a.dtype.newbyteorder('=')) instead" % (where, role, a.dtype))
    if not a.flags.c_contiguous:
        raise InvalidArgument("%s: %s is not contiguous (shape %s, strides %s); pass "
                              "numpy.ascontiguousarray(a) and copy back"
                              % (where, role, a.shape, a.strides))
    ptr = ffi.cast("void *", a.__array_interface__["data"][0])
    return Buf(ptr, a.size, dtype, bool(a.flags.writeable), a, a)


def _from_buffer_protocol(ffi, where, role, obj):
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument("%s: %s is a %s, not a buffer (pass a numpy array, a torch "
                              "tensor or an object with the buffer protocol)"
                              % (where, role, _describe(obj))) from None
    # only the description is read from the memoryview, which is released at
    # once: cffi takes its own view of obj below (a memoryview left in a
    # reference cycle with cffi's view of it crashed the garbage collector)
    with mv:
        fmt, itemsize, nbytes = mv.format, mv.itemsize, mv.nbytes
        readonly, contiguous, shape, strides = mv.readonly, mv.c_contiguous, mv.shape, mv.strides
    order, letter = (fmt[0], fmt[1:]) if fmt[:1] in "@=<>!" else ("@", fmt)
    native = order in "@=" or (order == "<") == (sys.byteorder == "little")
    dtype = None
    if native and letter in _FORMATS:
        dtype = _FORMATS[letter]
    elif native and len(letter) == 1 and letter in "bhilqBHILQ":
        dtype = _INT_SIZES.get((letter.islower(), itemsize))
    if dtype is None:
        raise InvalidDtype("%s: %s has buffer format %r, which weft does not reduce or move; "
                           "supported: %s" % (where, role, fmt, SUPPORTED))
    if not contiguous:
        raise InvalidArgument("%s: %s is not contiguous (shape %s, strides %s)"
                              % (where, role, shape, strides))
    view = ffi.from_buffer(obj, require_writable=False)
    return Buf(ffi.cast("void *", view), nbytes // itemsize, dtype, not readonly, (obj, view), obj)


def as_buf(ffi, where, role, obj, writable=False):
    """`where` names rank and call ("weft allreduce on rank 1 of 4"), `role`
    the argument ("send"); both go into the message."""
    if obj is None:
        raise InvalidArgument("%s: %s is None" % (where, role))
    tensor = _torch_tensor_class()
    ndarray = _numpy_class()
    if tensor is not None and isinstance(obj, tensor):
        buf = _from_torch(ffi, where, role, obj)
    elif ndarray is not None and isinstance(obj, ndarray):
        buf = _from_numpy(ffi, where, role, obj)
    else:
        buf = _from_buffer_protocol(ffi, where, role, obj)
    if writable and not buf.writable:
        raise InvalidArgument("%s: %s is read-only, but weft writes the result into it"
                              % (where, role))
    return buf
