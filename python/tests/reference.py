# reference.py - test data and the independent references: every rank can
# rebuild every other rank's input from (seed, case, rank), and the expected
# results are computed here in float64 or Python integers (wrapping where
# weft.h says integer arithmetic wraps), never through weft.
import numpy as np

try:
    import torch
except ImportError:  # the torch cases are skipped
    torch = None

DTYPES = ["f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"]
OPS = ["sum", "prod", "min", "max", "avg"]
FLOATS = {"f32", "f64", "f16", "bf16"}
INT_BITS = {"i8": (8, True), "u8": (8, False), "i32": (32, True), "i64": (64, True)}
NUMPY = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8,
         "u8": np.uint8, "i32": np.int32, "i64": np.int64}
TORCH = {} if torch is None else {
    "f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
    "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64}
# relative precision of one rounding (f16/bf16 data are chosen so that sums
# and products are exact; only avg's division rounds)
EPS = {"f64": 2.0 ** -52, "f32": 2.0 ** -23, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}
PROD_FACTORS = np.array([-2, -1.5, -1, -0.5, 0.5, 1, 1.5, 2])

COUNTS = [0, 1, 2, 3, 5, 8, 13, 64, 100, 257, 1000, 4097, 65537]


def stable_rng(seed, *key):
    # hash() of str is salted per process: derive from integers only
    return np.random.default_rng([seed] + [int(k) for k in key])


def values(dtype, op, n, gen):
    """Inputs of one rank as float64 (floats) or a Python-int object array
    (ints), chosen so that the exact reference is representable."""
    if dtype in INT_BITS:
        bits, signed = INT_BITS[dtype]
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        # the full range, so sums and products wrap; int64 via two halves
        if bits == 64:
            v = gen.integers(-(1 << 62), 1 << 62, n, dtype=np.int64).astype(object) * 2 + \
                gen.integers(0, 2, n).astype(object)
        else:
            v = gen.integers(lo, hi + 1, n, dtype=np.int64).astype(object)
        return v
    if op == "prod":
        return gen.choice(PROD_FACTORS, n)
    if dtype in ("f16", "bf16"):
        # multiples of 1/4 in [-8, 8]: sums of 4 ranks are exact in both
        return gen.integers(-32, 33, n) / 4.0
    return gen.standard_normal(n)


def wrap(v, dtype):
    bits, signed = INT_BITS[dtype]
    m = 1 << bits
    v = np.array([int(x) % m for x in v], dtype=object)
    if signed:
        v = np.array([x - m if x >= m >> 1 else x for x in v], dtype=object)
    return v


def trunc_div(v, n):
    return np.array([-((-x) // n) if x < 0 else x // n for x in v], dtype=object)


def rounded(v, dtype):
    """The values a buffer of dtype holds for float64 input v (identity for
    the exact data above; rounds f32/f64 normals to the dtype)."""
    if dtype in INT_BITS:
        return v
    if dtype == "bf16":
        return torch.tensor(v, dtype=torch.float64).to(torch.bfloat16).double().numpy()
    return v.astype(NUMPY[dtype]).astype(np.float64)


def reduce(xs, op, dtype):
    """xs: every rank's values (as held by dtype). The exact result."""
    size = len(xs)
    if dtype in INT_BITS:
        stack = np.stack(xs) if len(xs[0]) else np.zeros((size, 0), dtype=object)
        if op == "sum":
            return wrap(stack.sum(axis=0), dtype) if len(xs[0]) else xs[0]
        if op == "prod":
            return wrap(stack.prod(axis=0), dtype) if len(xs[0]) else xs[0]
        if op == "min":
            return stack.min(axis=0) if len(xs[0]) else xs[0]
        if op == "max":
            return stack.max(axis=0) if len(xs[0]) else xs[0]
        if not len(xs[0]):
            return xs[0]
        total = stack.sum(axis=0)
        if dtype == "i64":  # i64 avg sums in 64 bits and may wrap first
            total = wrap(total, dtype)
        return trunc_div(total, size)
    stack = np.stack(xs)
    if op == "sum":
        return stack.sum(axis=0)
    if op == "prod":
        return stack.prod(axis=0)
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    return stack.sum(axis=0) / size


def tolerance(xs, op, dtype):
    """Allowed |got - ref| per element."""
    if dtype in INT_BITS or op in ("min", "max"):
        return 0.0
    size = len(xs)
    if dtype in ("f16", "bf16"):
        if op == "avg":  # one rounding of an exact sum's quotient
            return EPS[dtype] * np.abs(np.stack(xs).sum(axis=0) / size)
        return 0.0
    # f32/f64: every partial sum may round once
    if op == "prod":
        return 0.0
    mag = np.abs(np.stack(xs)).sum(axis=0)
    return size * EPS[dtype] * mag / (size if op == "avg" else 1)


def check(got, ref, tol, what):
    """Raises AssertionError naming the first wrong element."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, "%s: %d elements, expected %d" % (what, got.size, ref.size)
    if ref.dtype == object:
        bad = np.nonzero(np.array([int(a) != int(b) for a, b in zip(got, ref)], dtype=bool))[0]
    else:
        bad = np.nonzero(~(np.abs(got.astype(np.float64) - ref) <= tol))[0]
    if len(bad):
        i = bad[0]
        t = tol if np.isscalar(tol) else tol[i]
        raise AssertionError("%s: element %d of %d is %r, expected %r (tolerance %g); %d wrong"
                             % (what, i, ref.size, got[i], ref[i], t, len(bad)))


def make(v, dtype, kind):
    """A buffer of dtype holding v: a numpy array or a torch tensor."""
    if kind == "torch":
        if dtype in INT_BITS:
            return torch.tensor([int(x) for x in v], dtype=TORCH[dtype]) if len(v) else \
                torch.zeros(0, dtype=TORCH[dtype])
        return torch.tensor(np.asarray(v, dtype=np.float64)).to(TORCH[dtype])
    if dtype in INT_BITS:
        return np.array([int(x) for x in v], dtype=NUMPY[dtype]) if len(v) else \
            np.zeros(0, dtype=NUMPY[dtype])
    return np.asarray(v, dtype=np.float64).astype(NUMPY[dtype])


def empty(n, dtype, kind, fill=0):
    if kind == "torch":
        return torch.full((n,), fill, dtype=TORCH[dtype])
    return np.full(n, fill, dtype=NUMPY[dtype])


def read(buf, dtype):
    """A buffer's contents as float64 or Python ints."""
    if torch is not None and isinstance(buf, torch.Tensor):
        if dtype in INT_BITS:
            return np.array(buf.tolist(), dtype=object).reshape(-1)
        return buf.double().numpy().reshape(-1)
    a = np.asarray(buf).reshape(-1)
    if dtype in INT_BITS:
        return np.array([int(x) for x in a], dtype=object)
    return a.astype(np.float64)


def kinds_for(dtype):
    """Containers that can hold dtype here: bf16 only in torch."""
    if dtype == "bf16":
        return ["torch"] if torch is not None else []
    return ["numpy", "torch"] if torch is not None else ["numpy"]
