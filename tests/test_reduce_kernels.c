/* test_reduce_kernels.c - checks every (dtype, op) kernel of reduce.c and the
 * conversions of half.h against references built independently here: wide
 * integers with explicit wrap, and double arithmetic rounded by a rounding
 * written in this file (never half.h's). Data is random and fresh each run;
 * a failure prints the seed, and WEFT_TEST_SEED=<seed> replays it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/base/half.h"
#include "src/mem/reduce.h"

/* ---- seed and random numbers ---------------------------------------------- */

static unsigned long long g_seed;

typedef struct rng {
  uint64_t state;
} rng;

/* splitmix64: small, fast, and good enough for test data. */
static uint64_t rng_next(rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Each test draws from its own stream, so one test replays alone. */
static rng rng_for(const char *test_name) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = test_name; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return (rng){g_seed ^ h};
}

#define CHECK(cond, ...)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      print_error(__VA_ARGS__);                                                      \
      print_error("\n  seed %llu (rerun with WEFT_TEST_SEED=%llu)\n", g_seed, g_seed); \
      fail();                                                                        \
    }                                                                                \
  } while (0)

/* ---- independent float formats ------------------------------------------- */

/* A binary float format: significand bits including the hidden one, smallest
 * normal exponent, largest exponent, exponent field width. */
typedef struct fmt {
  int prec;
  int emin;
  int emax;
  int exp_bits;
} fmt;

static const fmt FMT_F16 = {11, -14, 15, 5};
static const fmt FMT_BF16 = {8, -126, 127, 8};
static const fmt FMT_F32 = {24, -126, 127, 8};
static const fmt FMT_F64 = {53, -1022, 1023, 11};

static uint64_t fmt_exp_all(const fmt *f) {
  return (1ull << f->exp_bits) - 1;
}

static uint64_t fmt_sign_bit(const fmt *f) {
  return 1ull << (f->prec - 1 + f->exp_bits);
}

static int fmt_is_nan(uint64_t bits, const fmt *f) {
  int mant_bits = f->prec - 1;
  uint64_t mant = bits & ((1ull << mant_bits) - 1);
  return ((bits >> mant_bits) & fmt_exp_all(f)) == fmt_exp_all(f) && mant != 0;
}

/* The exact value of an encoding, by the textbook formula. */
static double ref_decode(uint64_t bits, const fmt *f) {
  int mant_bits = f->prec - 1;
  uint64_t mant = bits & ((1ull << mant_bits) - 1);
  uint64_t exp = (bits >> mant_bits) & fmt_exp_all(f);
  double v;
  if (exp == fmt_exp_all(f))
    v = mant ? NAN : INFINITY;
  else if (exp == 0)
    v = ldexp((double)mant, f->emin - mant_bits);
  else
    v = ldexp((double)(mant | 1ull << mant_bits), (int)exp - 1 + f->emin - mant_bits);
  return (bits & fmt_sign_bit(f)) ? -v : v;
}

/* x rounded to nearest even in format f: scale x so that one unit in the
 * last place of its binade (or the subnormal step) is 1, round to an integer
 * with nearbyint (ties to even in the default mode), then encode. */
static uint64_t ref_round(double x, const fmt *f) {
  int mant_bits = f->prec - 1;
  uint64_t sign = signbit(x) ? fmt_sign_bit(f) : 0;
  uint64_t inf = fmt_exp_all(f) << mant_bits;
  if (isnan(x))
    return inf | 1ull << (mant_bits - 1);
  double ax = fabs(x);
  if (isinf(ax))
    return sign | inf;
  if (ax == 0)
    return sign;
  int e;
  frexp(ax, &e);
  e -= 1; /* ax in [2^e, 2^(e+1)) */
  if (e < f->emin)
    e = f->emin;
  double units = nearbyint(ax / ldexp(1.0, e - mant_bits));
  if (units >= ldexp(1.0, f->prec)) { /* rounded up into the next binade */
    units /= 2;
    e += 1;
  }
  if (e > f->emax)
    return sign | inf;
  if (units < ldexp(1.0, mant_bits)) /* subnormal or zero */
    return sign | (uint64_t)units;
  uint64_t field = (uint64_t)(e - f->emin + 1);
  return sign | field << mant_bits | ((uint64_t)units - (1ull << mant_bits));
}

/* ---- dtypes as the test sees them -------------------------------------------- */

enum kind { KIND_FLOAT, KIND_SIGNED, KIND_UNSIGNED };

typedef struct dtype_info {
  weft_dtype dtype;
  const char *name;
  size_t size;
  enum kind kind;
  const fmt *fmt; /* floats only */
} dtype_info;

static const dtype_info DTYPES[] = {
    {WEFT_F32, "f32", 4, KIND_FLOAT, &FMT_F32},   {WEFT_F64, "f64", 8, KIND_FLOAT, &FMT_F64},
    {WEFT_F16, "f16", 2, KIND_FLOAT, &FMT_F16},   {WEFT_BF16, "bf16", 2, KIND_FLOAT, &FMT_BF16},
    {WEFT_I8, "i8", 1, KIND_SIGNED, NULL},        {WEFT_U8, "u8", 1, KIND_UNSIGNED, NULL},
    {WEFT_I32, "i32", 4, KIND_SIGNED, NULL},      {WEFT_I64, "i64", 8, KIND_SIGNED, NULL},
};
#define NUM_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

static const char *const OP_NAMES[] = {"sum", "prod", "min", "max", "avg"};

static uint64_t width_mask(const dtype_info *t) {
  return t->size == 8 ? ~0ull : (1ull << (t->size * 8)) - 1;
}

/* Element i of a buffer as raw bits, zero-extended. */
static uint64_t get_bits(const void *buf, size_t i, size_t size) {
  const char *p = (const char *)buf + i * size;
  uint8_t v8;
  uint16_t v16;
  uint32_t v32;
  uint64_t v64;
  switch (size) {
  case 1: memcpy(&v8, p, 1); return v8;
  case 2: memcpy(&v16, p, 2); return v16;
  case 4: memcpy(&v32, p, 4); return v32;
  default: memcpy(&v64, p, 8); return v64;
  }
}

static void set_bits(void *buf, size_t i, size_t size, uint64_t bits) {
  char *p = (char *)buf + i * size;
  uint8_t v8 = (uint8_t)bits;
  uint16_t v16 = (uint16_t)bits;
  uint32_t v32 = (uint32_t)bits;
  switch (size) {
  case 1: memcpy(p, &v8, 1); break;
  case 2: memcpy(p, &v16, 2); break;
  case 4: memcpy(p, &v32, 4); break;
  default: memcpy(p, &bits, 8); break;
  }
}

/* Integer bits as a value: two's complement written out, no casts that wrap. */
static int64_t int_value(const dtype_info *t, uint64_t bits) {
  uint64_t mask = width_mask(t);
  uint64_t v = bits & mask;
  if (t->kind == KIND_SIGNED && (v >> (t->size * 8 - 1)))
    return -(int64_t)(~v & mask) - 1;
  return (int64_t)v;
}

/* Rounds an exact double to the dtype: hardware casts for f32/f64, the
 * reference rounding for f16/bf16. */
static uint64_t float_encode(const dtype_info *t, double v) {
  if (t->dtype == WEFT_F32) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
  }
  if (t->dtype == WEFT_F64) {
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
  }
  return ref_round(v, t->fmt);
}

/* Rounds to the compute precision the contract names: float for every type
 * but f64. A double holds the float result of +, * or / on floats exactly
 * after this cast (53 >= 2*24+2, so rounding twice changes nothing). */
static double compute_round(const dtype_info *t, double v) {
  return t->dtype == WEFT_F64 ? v : (double)(float)v;
}

static int64_t trunc_div(int64_t s, int d) {
  uint64_t mag = s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
  uint64_t q = mag / (uint64_t)d;
  return s < 0 ? -(int64_t)q : (int64_t)q;
}

/* ---- the reference reduction ---------------------------------------------- */

static uint64_t ref_float_minmax(const dtype_info *t, uint64_t abits, uint64_t bbits, weft_op op) {
  double a = ref_decode(abits, t->fmt);
  double b = ref_decode(bbits, t->fmt);
  if (isnan(a) || isnan(b))
    return float_encode(t, NAN);
  if (a != b)
    return ((a < b) == (op == WEFT_MIN)) ? abits : bbits;
  if (a != 0)
    return abits;
  /* +0 and -0: -0 is the smaller one, whatever the order of the operands. */
  int negative = op == WEFT_MIN ? (signbit(a) || signbit(b)) : (signbit(a) && signbit(b));
  return negative ? fmt_sign_bit(t->fmt) : 0;
}

static uint64_t ref_float_divide(const dtype_info *t, double v, int postdiv) {
  return float_encode(t, compute_round(t, v / postdiv));
}

static uint64_t ref_float_op(const dtype_info *t, uint64_t abits, uint64_t bbits, weft_op op,
                             int postdiv) {
  double a = ref_decode(abits, t->fmt);
  double b = ref_decode(bbits, t->fmt);
  switch (op) {
  case WEFT_SUM: return float_encode(t, a + b);
  case WEFT_PROD: return float_encode(t, a * b);
  case WEFT_AVG:
    if (postdiv <= 1)
      return float_encode(t, a + b);
    return ref_float_divide(t, compute_round(t, a + b), postdiv);
  default: return ref_float_minmax(t, abits, bbits, op);
  }
}

static uint64_t ref_int_op(const dtype_info *t, uint64_t abits, uint64_t bbits, weft_op op,
                           int postdiv) {
  uint64_t mask = width_mask(t);
  int64_t a = int_value(t, abits);
  int64_t b = int_value(t, bbits);
  uint64_t sum = ((uint64_t)a + (uint64_t)b) & mask;
  switch (op) {
  case WEFT_SUM: return sum;
  case WEFT_PROD: return ((uint64_t)a * (uint64_t)b) & mask;
  case WEFT_MIN: return (a < b ? abits : bbits) & mask;
  case WEFT_MAX: return (a > b ? abits : bbits) & mask;
  default:
    if (postdiv <= 1)
      return sum;
    return (uint64_t)trunc_div(int_value(t, sum), postdiv) & mask;
  }
}

static uint64_t ref_op(const dtype_info *t, uint64_t a, uint64_t b, weft_op op, int postdiv) {
  if (t->kind == KIND_FLOAT)
    return ref_float_op(t, a, b, op, postdiv);
  return ref_int_op(t, a, b, op, postdiv);
}

static uint64_t ref_finish(const dtype_info *t, uint64_t src, weft_op op, int postdiv) {
  if (op != WEFT_AVG || postdiv <= 1)
    return src;
  if (t->kind == KIND_FLOAT)
    return ref_float_divide(t, ref_decode(src, t->fmt), postdiv);
  return (uint64_t)trunc_div(int_value(t, src), postdiv) & width_mask(t);
}

/* A float result matches when the bits are equal, or when both are NaN (the
 * payload of a NaN is not part of the contract). */
static int same_result(const dtype_info *t, uint64_t got, uint64_t want) {
  if (t->kind == KIND_FLOAT && fmt_is_nan(want, t->fmt))
    return fmt_is_nan(got, t->fmt);
  return got == want;
}

/* ---- random data ------------------------------------------------------------- */

/* Mostly numbers with exponents near 1 (where sums round and tie), with
 * specials and raw bit patterns (subnormals, Inf, NaN, huge) mixed in. */
static uint64_t random_float(rng *r, const fmt *f) {
  int mant_bits = f->prec - 1;
  uint64_t mant_mask = (1ull << mant_bits) - 1;
  uint64_t exp_all = fmt_exp_all(f);
  uint64_t sign = (rng_next(r) & 1) ? fmt_sign_bit(f) : 0;
  unsigned pick = (unsigned)(rng_next(r) % 16);
  if (pick == 0)
    return rng_next(r) & (fmt_sign_bit(f) * 2 - 1);
  if (pick == 1) {
    const uint64_t specials[] = {0,
                                 exp_all << mant_bits,                              /* Inf */
                                 exp_all << mant_bits | 1ull << (mant_bits - 1),    /* qNaN */
                                 exp_all << mant_bits | 1,                          /* sNaN */
                                 1,                                                 /* min subnormal */
                                 mant_mask,                                         /* max subnormal */
                                 1ull << mant_bits,                                 /* min normal */
                                 (exp_all - 1) << mant_bits | mant_mask};           /* max finite */
    return sign | specials[rng_next(r) % 8];
  }
  int64_t bias = (int64_t)(exp_all >> 1);
  int64_t window = f->exp_bits == 5 ? 16 : 24;
  int64_t e = bias - window + (int64_t)(rng_next(r) % (uint64_t)(2 * window + 1));
  e = e < 0 ? 0 : e > (int64_t)exp_all - 1 ? (int64_t)exp_all - 1 : e;
  return sign | (uint64_t)e << mant_bits | (rng_next(r) & mant_mask);
}

static uint64_t random_int(rng *r, const dtype_info *t) {
  uint64_t mask = width_mask(t);
  if (rng_next(r) % 8 != 0)
    return rng_next(r) & mask;
  uint64_t top = t->kind == KIND_SIGNED ? 1ull << (t->size * 8 - 1) : 0;
  const uint64_t extremes[] = {0, 1, mask, top, top - 1, top + 1, mask - 1, 2};
  return extremes[rng_next(r) % 8] & mask;
}

static uint64_t random_elem(rng *r, const dtype_info *t) {
  return t->kind == KIND_FLOAT ? random_float(r, t->fmt) : random_int(r, t);
}

/* b is sometimes a itself or its negation: equal inputs, exact cancellation. */
static uint64_t random_partner(rng *r, const dtype_info *t, uint64_t a) {
  switch (rng_next(r) % 8) {
  case 0: return a;
  case 1:
    if (t->kind == KIND_FLOAT)
      return a ^ fmt_sign_bit(t->fmt);
    return (0 - a) & width_mask(t);
  default: return random_elem(r, t);
  }
}

/* ---- buffers with guards -------------------------------------------------- */

/* Every buffer has `offset` elements before the data (to test unaligned
 * starts) and GUARD elements after it, filled with a pattern that must
 * survive: a kernel that writes past count, or before dst, fails. */
enum { GUARD = 16, PATTERN = 0xa5 };

typedef struct guarded {
  unsigned char *base;
  size_t bytes;
  void *data;
} guarded;

static guarded guarded_alloc(const dtype_info *t, size_t count, size_t offset) {
  guarded g;
  g.bytes = (offset + count + GUARD) * t->size;
  g.base = malloc(g.bytes);
  assert_non_null(g.base);
  memset(g.base, PATTERN, g.bytes);
  g.data = g.base + offset * t->size;
  return g;
}

static int guards_intact(const guarded *g, size_t count, size_t size) {
  size_t lo = (size_t)((unsigned char *)g->data - g->base);
  size_t hi = lo + count * size;
  for (size_t i = 0; i < g->bytes; i++)
    if ((i < lo || i >= hi) && g->base[i] != PATTERN)
      return 0;
  return 1;
}

/* ---- reduce cases ----------------------------------------------------------- */

enum alias_mode { ALIAS_NONE, ALIAS_DST_A, ALIAS_DST_B, ALIAS_A_B, ALIAS_ALL, ALIAS_MODES };
static const char *const ALIAS_NAMES[] = {"dst,a,b distinct", "dst==a", "dst==b",
                                          "a==b", "dst==a==b"};

typedef struct reduce_run {
  const dtype_info *t;
  weft_op op;
  size_t count;
  size_t offset;
  int postdiv;
  enum alias_mode mode;
} reduce_run;

static void describe_run(const reduce_run *run) {
  print_error("%s %s count=%zu offset=%zu postdiv=%d %s: ", run->t->name, OP_NAMES[run->op],
              run->count, run->offset, run->postdiv, ALIAS_NAMES[run->mode]);
}

/* Where weft_reduce_kernel writes its result, for each aliasing mode. */
static guarded *call_reduce(const reduce_run *run, guarded *a, guarded *b, guarded *d) {
  const dtype_info *t = run->t;
  switch (run->mode) {
  case ALIAS_NONE:
    weft_reduce_kernel(d->data, a->data, b->data, run->count, t->dtype, run->op, run->postdiv);
    return d;
  case ALIAS_DST_A:
    weft_reduce_kernel(a->data, a->data, b->data, run->count, t->dtype, run->op, run->postdiv);
    return a;
  case ALIAS_DST_B:
    weft_reduce_kernel(b->data, a->data, b->data, run->count, t->dtype, run->op, run->postdiv);
    return b;
  case ALIAS_A_B:
    weft_reduce_kernel(d->data, a->data, a->data, run->count, t->dtype, run->op, run->postdiv);
    return d;
  default:
    weft_reduce_kernel(a->data, a->data, a->data, run->count, t->dtype, run->op, run->postdiv);
    return a;
  }
}

static void check_unchanged(const reduce_run *run, const guarded *g, const uint64_t *vals,
                            const char *which) {
  for (size_t i = 0; i < run->count; i++) {
    uint64_t got = get_bits(g->data, i, run->t->size);
    if (got != vals[i])
      describe_run(run);
    CHECK(got == vals[i], "input %s changed at %zu", which, i);
  }
}

static void run_reduce(const reduce_run *run, rng *r) {
  const dtype_info *t = run->t;
  size_t n = run->count;
  int same_inputs = run->mode == ALIAS_A_B || run->mode == ALIAS_ALL;
  uint64_t *av = malloc((n + 1) * sizeof *av);
  uint64_t *bv = malloc((n + 1) * sizeof *bv);
  assert_non_null(av);
  assert_non_null(bv);
  guarded a = guarded_alloc(t, n, run->offset);
  guarded b = guarded_alloc(t, n, run->offset);
  guarded d = guarded_alloc(t, n, run->offset);
  for (size_t i = 0; i < n; i++) {
    av[i] = random_elem(r, t);
    bv[i] = same_inputs ? av[i] : random_partner(r, t, av[i]);
    set_bits(a.data, i, t->size, av[i]);
    set_bits(b.data, i, t->size, bv[i]);
  }
  guarded *out = call_reduce(run, &a, &b, &d);
  for (size_t i = 0; i < n; i++) {
    uint64_t want = ref_op(t, av[i], bv[i], run->op, run->postdiv);
    uint64_t got = get_bits(out->data, i, t->size);
    if (!same_result(t, got, want))
      describe_run(run);
    CHECK(same_result(t, got, want), "element %zu: a=0x%llx b=0x%llx want 0x%llx got 0x%llx", i,
          (unsigned long long)av[i], (unsigned long long)bv[i], (unsigned long long)want,
          (unsigned long long)got);
  }
  if (out != &a)
    check_unchanged(run, &a, av, "a");
  if (out != &b && !same_inputs)
    check_unchanged(run, &b, bv, "b");
  int intact = guards_intact(&a, n, t->size) && guards_intact(&b, n, t->size) &&
               guards_intact(&d, n, t->size);
  if (!intact)
    describe_run(run);
  CHECK(intact, "wrote outside [0, count)");
  free(a.base);
  free(b.base);
  free(d.base);
  free(av);
  free(bv);
}

static const size_t COUNTS[] = {0, 1, 7, 63, 1000, 4099};
#define NUM_COUNTS (sizeof COUNTS / sizeof COUNTS[0])

/* avg: 1, 3, 4 as asked, plus 0 and -2 (no division) and divisors that
 * stress the integer quotient (larger than every 8-bit sum, the float limit
 * 2^24, INT_MAX). Other ops: postdiv must be ignored. */
static const int AVG_POSTDIVS_INT[] = {1, 3, 4, 0, -2, 2, 7, 255, 256, 1 << 24, 2147483647};
static const int AVG_POSTDIVS_FLOAT[] = {1, 3, 4, 0, -2, 2, 7, 1000};
static const int OTHER_POSTDIVS[] = {1, 3, 4};

typedef struct reduce_case {
  const dtype_info *t;
  weft_op op;
} reduce_case;

static void test_reduce_case(void **state) {
  const reduce_case *c = *state;
  const int *postdivs = OTHER_POSTDIVS;
  size_t num_postdivs = sizeof OTHER_POSTDIVS / sizeof OTHER_POSTDIVS[0];
  if (c->op == WEFT_AVG && c->t->kind == KIND_FLOAT) {
    postdivs = AVG_POSTDIVS_FLOAT;
    num_postdivs = sizeof AVG_POSTDIVS_FLOAT / sizeof AVG_POSTDIVS_FLOAT[0];
  } else if (c->op == WEFT_AVG) {
    postdivs = AVG_POSTDIVS_INT;
    num_postdivs = sizeof AVG_POSTDIVS_INT / sizeof AVG_POSTDIVS_INT[0];
  }
  char name[32];
  snprintf(name, sizeof name, "reduce %s %s", c->t->name, OP_NAMES[c->op]);
  rng r = rng_for(name);
  for (size_t offset = 0; offset < 2; offset++)
    for (size_t ci = 0; ci < NUM_COUNTS; ci++)
      for (size_t pi = 0; pi < num_postdivs; pi++)
        for (int mode = 0; mode < ALIAS_MODES; mode++) {
          reduce_run run = {c->t, c->op, COUNTS[ci], offset, postdivs[pi], (enum alias_mode)mode};
          run_reduce(&run, &r);
        }
}

/* ---- weft_reduce_finish ------------------------------------------------------ */

static void run_finish(const dtype_info *t, weft_op op, size_t n, int postdiv, int in_place,
                       rng *r) {
  uint64_t *sv = malloc((n + 1) * sizeof *sv);
  assert_non_null(sv);
  guarded src = guarded_alloc(t, n, 1);
  guarded dst = guarded_alloc(t, n, 1);
  for (size_t i = 0; i < n; i++) {
    sv[i] = random_elem(r, t);
    set_bits(src.data, i, t->size, sv[i]);
  }
  guarded *out = in_place ? &src : &dst;
  weft_reduce_finish(out->data, src.data, n, t->dtype, op, postdiv);
  for (size_t i = 0; i < n; i++) {
    uint64_t want = ref_finish(t, sv[i], op, postdiv);
    uint64_t got = get_bits(out->data, i, t->size);
    /* A copy must keep every bit, NaN payloads included. */
    int ok = (op == WEFT_AVG && postdiv > 1) ? same_result(t, got, want) : got == want;
    CHECK(ok, "finish %s %s count=%zu postdiv=%d %s: element %zu src=0x%llx want 0x%llx got 0x%llx",
          t->name, OP_NAMES[op], n, postdiv, in_place ? "in place" : "copy", i,
          (unsigned long long)sv[i], (unsigned long long)want, (unsigned long long)got);
  }
  CHECK(guards_intact(&src, n, t->size) && guards_intact(&dst, n, t->size),
        "finish %s %s count=%zu postdiv=%d: wrote outside [0, count)", t->name, OP_NAMES[op], n,
        postdiv);
  free(src.base);
  free(dst.base);
  free(sv);
}

static void test_finish(void **state) {
  const dtype_info *t = *state;
  static const int postdivs[] = {1, 3, 4, 0, 7};
  char name[32];
  snprintf(name, sizeof name, "finish %s", t->name);
  rng r = rng_for(name);
  for (int op = 0; op < WEFT_OP_COUNT; op++)
    for (size_t ci = 0; ci < NUM_COUNTS; ci++)
      for (size_t pi = 0; pi < sizeof postdivs / sizeof postdivs[0]; pi++)
        for (int in_place = 0; in_place < 2; in_place++)
          run_finish(t, (weft_op)op, COUNTS[ci], postdivs[pi], in_place, &r);
}

/* ---- min/max special values -------------------------------------------------- */

/* Every NaN pattern against every kind of value, in both operand orders and
 * in every lane of a vector-sized buffer. */
static void test_minmax_nan(void **state) {
  const dtype_info *t = *state;
  const fmt *f = t->fmt;
  int mant_bits = f->prec - 1;
  uint64_t inf = fmt_exp_all(f) << mant_bits;
  uint64_t sign = fmt_sign_bit(f);
  const uint64_t nans[] = {inf | 1ull << (mant_bits - 1), inf | 1, sign | inf | 1ull << (mant_bits - 1),
                           inf | ((1ull << mant_bits) - 1)};
  const uint64_t others[] = {0, sign, inf, sign | inf, 1, (fmt_exp_all(f) >> 1) << mant_bits,
                             sign | 1ull << mant_bits, nans[0]};
  enum { N = 37 };
  unsigned char a[N * 8], b[N * 8], d[N * 8];
  for (int op = WEFT_MIN; op <= WEFT_MAX; op++)
    for (size_t ni = 0; ni < sizeof nans / sizeof nans[0]; ni++)
      for (size_t oi = 0; oi < sizeof others / sizeof others[0]; oi++)
        for (int nan_first = 0; nan_first < 2; nan_first++) {
          for (size_t i = 0; i < N; i++) {
            set_bits(a, i, t->size, nan_first ? nans[ni] : others[oi]);
            set_bits(b, i, t->size, nan_first ? others[oi] : nans[ni]);
          }
          weft_reduce_kernel(d, a, b, N, t->dtype, (weft_op)op, 1);
          for (size_t i = 0; i < N; i++)
            CHECK(fmt_is_nan(get_bits(d, i, t->size), f),
                  "%s %s(0x%llx, 0x%llx) lane %zu: got 0x%llx, want NaN", t->name,
                  OP_NAMES[op], (unsigned long long)get_bits(a, i, t->size),
                  (unsigned long long)get_bits(b, i, t->size), i,
                  (unsigned long long)get_bits(d, i, t->size));
        }
}

/* min(+0, -0) is -0 and max is +0 in either order, so that ranks combining
 * in different orders agree bit for bit. */
static void test_minmax_signed_zero(void **state) {
  const dtype_info *t = *state;
  uint64_t neg = fmt_sign_bit(t->fmt);
  const uint64_t pairs[4][2] = {{0, neg}, {neg, 0}, {0, 0}, {neg, neg}};
  const uint64_t want_min[4] = {neg, neg, 0, neg};
  const uint64_t want_max[4] = {0, 0, 0, neg};
  unsigned char a[8], b[8], d[8];
  for (int k = 0; k < 4; k++) {
    set_bits(a, 0, t->size, pairs[k][0]);
    set_bits(b, 0, t->size, pairs[k][1]);
    weft_reduce_kernel(d, a, b, 1, t->dtype, WEFT_MIN, 1);
    CHECK(get_bits(d, 0, t->size) == want_min[k], "%s min of zeros %d", t->name, k);
    weft_reduce_kernel(d, a, b, 1, t->dtype, WEFT_MAX, 1);
    CHECK(get_bits(d, 0, t->size) == want_max[k], "%s max of zeros %d", t->name, k);
  }
}

/* Hand-worked integer averages: the quotient of a negative (or wrapped)
 * sum truncates toward zero, never toward minus infinity. */
static void test_avg_truncates_toward_zero(void **state) {
  (void)state;
  static const struct {
    weft_dtype dtype;
    int64_t a, b;
    int postdiv;
    int64_t want;
  } cases[] = {
      {WEFT_I32, -7, 0, 4, -1},           {WEFT_I32, -7, 0, 3, -2},
      {WEFT_I32, 7, 0, 4, 1},             {WEFT_I32, -2147483647 - 1, -1, 3, 715827882},
      {WEFT_I32, -2147483647 - 1, 0, 2147483647, -1},
      {WEFT_I8, -128, -1, 3, 42},         {WEFT_I8, -100, -27, 4, -31},
      {WEFT_I8, -1, -2, 4, 0},            {WEFT_U8, 255, 2, 3, 0},
      {WEFT_U8, 200, 50, 3, 83},          {WEFT_I64, -9, 0, 4, -2},
      {WEFT_I64, INT64_MIN, -1, 3, 3074457345618258602},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const dtype_info *t = NULL;
    for (size_t i = 0; i < NUM_DTYPES; i++)
      if (DTYPES[i].dtype == cases[k].dtype)
        t = &DTYPES[i];
    unsigned char a[8], b[8], d[8];
    set_bits(a, 0, t->size, (uint64_t)cases[k].a);
    set_bits(b, 0, t->size, (uint64_t)cases[k].b);
    weft_reduce_kernel(d, a, b, 1, t->dtype, WEFT_AVG, cases[k].postdiv);
    int64_t got = int_value(t, get_bits(d, 0, t->size));
    CHECK(got == cases[k].want, "%s avg(%lld, %lld) / %d: got %lld, want %lld", t->name,
          (long long)cases[k].a, (long long)cases[k].b, cases[k].postdiv, (long long)got,
          (long long)cases[k].want);
  }
}

/* An integer avg's 64-bit round trip (src/coll/coll.c): every value of
 * the narrow type widens to itself (sign-extended for i8 and i32, not for
 * u8) and narrows back unchanged, in and out of every position. */
static void test_widen_narrow_i64(void **state) {
  (void)state;
  static const struct {
    weft_dtype dtype;
    int64_t v;
  } cases[] = {
      {WEFT_I8, -128},       {WEFT_I8, 127},        {WEFT_I8, -1},
      {WEFT_U8, 255},        {WEFT_U8, 128},        {WEFT_I32, INT32_MIN},
      {WEFT_I32, INT32_MAX}, {WEFT_I32, -100},      {WEFT_I64, INT64_MIN},
      {WEFT_I64, INT64_MAX},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const dtype_info *t = NULL;
    for (size_t i = 0; i < NUM_DTYPES; i++)
      if (DTYPES[i].dtype == cases[k].dtype)
        t = &DTYPES[i];
    unsigned char narrow[8 * 33], back[8 * 33 + 8];
    int64_t wide[33];
    for (size_t i = 0; i < 33; i++)
      set_bits(narrow, i, t->size, (uint64_t)(i == 17 ? cases[k].v : (int64_t)i));
    memset(back, 0xA5, sizeof back);
    weft_widen_i64(wide, narrow, 33, t->dtype);
    weft_narrow_i64(back, wide, 33, t->dtype);
    CHECK(wide[17] == cases[k].v, "%s widen(%lld): got %lld", t->name, (long long)cases[k].v,
          (long long)wide[17]);
    CHECK(!memcmp(back, narrow, 33 * t->size), "%s narrow(widen(%lld)) differs", t->name,
          (long long)cases[k].v);
    CHECK(back[33 * t->size] == 0xA5, "%s narrow wrote past the end", t->name);
  }
}

/* Unknown dtype or op: nothing is written. */
static void test_unknown_does_nothing(void **state) {
  (void)state;
  unsigned char a[64], b[64], d[64];
  memset(a, 1, sizeof a);
  memset(b, 2, sizeof b);
  memset(d, PATTERN, sizeof d);
  const weft_dtype bad_dtypes[] = {WEFT_DTYPE_COUNT, (weft_dtype)-1, (weft_dtype)99};
  const weft_op bad_ops[] = {WEFT_OP_COUNT, (weft_op)-1, (weft_op)77};
  for (size_t i = 0; i < 3; i++) {
    weft_reduce_kernel(d, a, b, 8, bad_dtypes[i], WEFT_SUM, 1);
    weft_reduce_kernel(d, a, b, 8, WEFT_F32, bad_ops[i], 1);
    weft_reduce_finish(d, a, 8, bad_dtypes[i], WEFT_AVG, 2);
    weft_reduce_finish(d, a, 8, WEFT_F32, bad_ops[i], 2);
  }
  for (size_t i = 0; i < sizeof d; i++)
    assert_int_equal(d[i], PATTERN);
}

/* ---- half.h conversions ------------------------------------------------------ */

typedef struct half_api {
  const char *name;
  const fmt *fmt;
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
  uint32_t quiet_bit16; /* the quiet bit of the 16-bit NaN */
} half_api;

static float call_f16_to_float(uint16_t h) { return weft_f16_to_float(h); }
static uint16_t call_float_to_f16(float f) { return weft_float_to_f16(f); }
static float call_bf16_to_float(uint16_t h) { return weft_bf16_to_float(h); }
static uint16_t call_float_to_bf16(float f) { return weft_float_to_bf16(f); }

static const half_api HALF_F16 = {"f16", &FMT_F16, call_f16_to_float, call_float_to_f16, 0x0200};
static const half_api HALF_BF16 = {"bf16", &FMT_BF16, call_bf16_to_float, call_float_to_bf16,
                                   0x0040};

/* All 65536 encodings: widening is exact (value and sign), narrowing it back
 * gives the same bits; a NaN stays NaN and comes out quiet both ways. */
static void test_half_exhaustive(void **state) {
  const half_api *h = *state;
  for (uint32_t bits = 0; bits <= 0xffff; bits++) {
    float f = h->to_float((uint16_t)bits);
    double want = ref_decode(bits, h->fmt);
    uint16_t back = h->from_float(f);
    if (isnan(want)) {
      CHECK(isnan(f) && (weft_f32_bits(f) & 0x00400000u), "%s 0x%04x: widened to 0x%08x, want quiet NaN",
            h->name, bits, weft_f32_bits(f));
      CHECK(fmt_is_nan(back, h->fmt) && (back & h->quiet_bit16),
            "%s 0x%04x: round trip gave 0x%04x, want quiet NaN", h->name, bits, back);
      continue;
    }
    CHECK((double)f == want && !signbit(f) == !signbit(want), "%s 0x%04x: widened to %a, want %a",
          h->name, bits, (double)f, want);
    CHECK(back == bits, "%s 0x%04x: round trip gave 0x%04x", h->name, bits, back);
  }
}

typedef struct rounding_case {
  float in;
  uint16_t want;
} rounding_case;

static void check_rounding_table(const half_api *h, const rounding_case *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint16_t got = h->from_float(cases[i].in);
    CHECK(got == cases[i].want, "%s(%a): got 0x%04x, want 0x%04x", h->name, (double)cases[i].in,
          got, cases[i].want);
    /* The table also vouches for the reference used by the sweeps. */
    uint64_t ref = ref_round(cases[i].in, h->fmt);
    CHECK(ref == cases[i].want, "reference %s(%a): got 0x%04llx, want 0x%04x", h->name,
          (double)cases[i].in, (unsigned long long)ref, cases[i].want);
  }
}

static void test_f16_rounding_ties(void **state) {
  (void)state;
  static const rounding_case cases[] = {
      {0x1.002p0f, 0x3c00},   /* 1 + 2^-11: tie, down to even 1.0 */
      {0x1.006p0f, 0x3c02},   /* 1 + 3*2^-11: tie, up to even */
      {0x1.002002p0f, 0x3c01}, /* just above the tie */
      {0x1.001ffep0f, 0x3c00}, /* just below the tie */
      {-0x1.006p0f, 0xbc02},  /* ties are symmetric */
      {2049.0f, 0x6800},      /* step 2 at 2048: tie to even 2048 */
      {2051.0f, 0x6802},      /* tie to even 2052 */
      {0x1.ffcp0f, 0x3fff},   /* exact */
      {0x1.ffep0f, 0x4000},   /* tie at the top of a binade carries into the exponent */
  };
  check_rounding_table(&HALF_F16, cases, sizeof cases / sizeof cases[0]);
}

static void test_f16_overflow(void **state) {
  (void)state;
  static const rounding_case cases[] = {
      {65504.0f, 0x7bff},      {65519.0f, 0x7bff},     {0x1.ffdffep15f, 0x7bff},
      {65520.0f, 0x7c00},      {65536.0f, 0x7c00},     {1e10f, 0x7c00},
      {FLT_MAX, 0x7c00},       {-FLT_MAX, 0xfc00},     {-65520.0f, 0xfc00},
      {INFINITY, 0x7c00},      {-INFINITY, 0xfc00},
  };
  check_rounding_table(&HALF_F16, cases, sizeof cases / sizeof cases[0]);
}

static void test_f16_subnormal(void **state) {
  (void)state;
  static const rounding_case cases[] = {
      {0x1p-24f, 0x0001},         {0x1p-25f, 0x0000},     /* tie to even 0 */
      {0x1.000002p-25f, 0x0001},  {0x3p-25f, 0x0002},     /* tie to even 2 */
      {0x5p-25f, 0x0002},         {0x7p-25f, 0x0004},
      {0x3ffp-24f, 0x03ff},       {0x7ffp-25f, 0x0400},  /* tie at the top: min normal */
      {0x1p-15f, 0x0200},         {0x1p-14f, 0x0400},
      {FLT_TRUE_MIN, 0x0000},     {-FLT_TRUE_MIN, 0x8000},
      {-0x1p-26f, 0x8000},        {-0x3p-25f, 0x8002},
      {0.0f, 0x0000},             {-0.0f, 0x8000},
      {0x1.fffffcp-127f, 0x0000}, /* largest float subnormal */
  };
  check_rounding_table(&HALF_F16, cases, sizeof cases / sizeof cases[0]);
}

static void test_bf16_rounding(void **state) {
  (void)state;
  static const rounding_case cases[] = {
      {0x1.01p0f, 0x3f80},       {0x1.03p0f, 0x3f82},       {0x1.010002p0f, 0x3f81},
      {-0x1.03p0f, 0xbf82},      {0x1.ffp0f, 0x4000},
      {FLT_MAX, 0x7f80},         {-FLT_MAX, 0xff80},        /* overflow */
      {0x1.fefffep127f, 0x7f7f}, {0x1.ffp127f, 0x7f80},     /* tie at the top: Inf */
      {0x1.fdp127f, 0x7f7e},     {INFINITY, 0x7f80},        /* tie to even */
      {0x1p-134f, 0x0000},       {0x3p-134f, 0x0002},       /* subnormal ties */
      {0x1.0002p-134f, 0x0001},  {0x1p-133f, 0x0001},
      {0x1.fep-127f, 0x0080},    {FLT_TRUE_MIN, 0x0000},    {-FLT_TRUE_MIN, 0x8000},
      {-0.0f, 0x8000},
  };
  check_rounding_table(&HALF_BF16, cases, sizeof cases / sizeof cases[0]);
}

/* Narrowing a float NaN, quiet or signalling, gives a quiet NaN (a plain
 * truncation would turn 0x7f800001 into Inf). */
static void test_half_nan_from_float(void **state) {
  const half_api *h = *state;
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f802000u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t got = h->from_float(weft_f32_from_bits(nans[i]));
    CHECK(fmt_is_nan(got, h->fmt) && (got & h->quiet_bit16), "%s(0x%08x): got 0x%04x", h->name,
          nans[i], got);
  }
}

/* Random floats, raw and concentrated on the format's range, against the
 * reference rounding. */
static void test_half_random_sweep(void **state) {
  const half_api *h = *state;
  char name[32];
  snprintf(name, sizeof name, "sweep %s", h->name);
  rng r = rng_for(name);
  const fmt *f16 = h->fmt;
  int lowest = f16->emin - f16->prec - 2; /* exponents a little beyond both ends */
  int span = f16->emax + 3 - lowest;
  for (int k = 0; k < (1 << 21); k++) {
    uint32_t u = (uint32_t)rng_next(&r);
    if (k & 1) {
      int field = lowest + (int)(rng_next(&r) % (uint64_t)span) + 127;
      field = field < 0 ? 0 : field > 254 ? 254 : field;
      u = (u & 0x807fffffu) | (uint32_t)field << 23;
    }
    float f = weft_f32_from_bits(u);
    uint16_t got = h->from_float(f);
    uint64_t want = ref_round(f, f16);
    CHECK(fmt_is_nan(want, f16) ? fmt_is_nan(got, f16) : got == want,
          "%s(%a = 0x%08x): got 0x%04x, want 0x%04llx", h->name, (double)f, u, got,
          (unsigned long long)want);
  }
}

/* The wire kernels (reduce.h, weft_wire_*: f32 data carried as bf16 / f16)
 * against the textbook reference: narrow rounds every float to nearest even
 * (ties, subnormals, overflow and all), widen is exact, reduce adds a float
 * and a widened value in float (the correctly rounded sum: the exact sum in
 * double, cast) and divides for avg (float / int in double, cast: correctly
 * rounded too), and with a stage rounds that once, keeping in dst the value
 * of the bits it stages. Odd lengths and offsets reach the vector tails. */
static void test_wire_kernels(void **state) {
  const half_api *h = *state;
  weft_dtype wire = h->fmt == &FMT_BF16 ? WEFT_BF16 : WEFT_F16;
  char name[32];
  snprintf(name, sizeof name, "wire %s", h->name);
  rng r = rng_for(name);
  enum { N = 1027 };
  float *a = malloc(sizeof(float) * N), *dst = malloc(sizeof(float) * N);
  float *wide = malloc(sizeof(float) * N);
  uint16_t *b = malloc(sizeof(uint16_t) * N), *stage = malloc(sizeof(uint16_t) * N);
  uint16_t *narrow = malloc(sizeof(uint16_t) * N);
  for (int round = 0; round < 64; round++) {
    size_t count = 1 + rng_next(&r) % N;
    for (size_t i = 0; i < count; i++) {
      /* values near the wire type's own range: ties, subnormals, overflow */
      int e = (int)(rng_next(&r) % 40) - (wire == WEFT_F16 ? 26 : 20);
      uint32_t u = (uint32_t)rng_next(&r);
      if (i % 7 == 3) u &= 0xffffe000u | 0x1000u; /* a tie for f16 (bf16 below) */
      if (i % 7 == 5) u = (u & 0xffff0000u) | 0x8000u;
      a[i] = ldexpf(1.0f + (float)(u & 0x7fffff) / 8388608.0f, e) * (u >> 31 ? -1.0f : 1.0f);
      if (i % 7 == 3 || i % 7 == 5)
        a[i] = weft_f32_from_bits((weft_f32_bits(a[i]) & 0xff800000u) | (u & 0x007fffffu));
      b[i] = (uint16_t)ref_round(ldexp((double)(rng_next(&r) % 4096) - 2048, e / 2 - 11), h->fmt);
    }
    weft_wire_narrow(narrow, a, count, wire);
    weft_wire_widen(wide, b, count, wire);
    for (size_t i = 0; i < count; i++) {
      uint64_t want = ref_round(a[i], h->fmt);
      CHECK(narrow[i] == want, "narrow %s(%a): got 0x%04x, want 0x%04llx", h->name, (double)a[i],
            narrow[i], (unsigned long long)want);
      CHECK((double)wide[i] == ref_decode(b[i], h->fmt), "widen %s(0x%04x): got %a, want %a",
            h->name, b[i], (double)wide[i], ref_decode(b[i], h->fmt));
    }
    int postdiv = 1 + (int)(rng_next(&r) % 5);
    weft_op op = round % 2 ? WEFT_AVG : WEFT_SUM;
    int staged = round % 4 >= 2;
    memcpy(dst, a, sizeof(float) * count); /* dst aliases a, as a tree's partial does */
    weft_wire_reduce(dst, round % 8 < 4 ? dst : a, b, count, wire, op, postdiv,
                     staged ? stage : NULL);
    for (size_t i = 0; i < count; i++) {
      float sum = (float)((double)a[i] + ref_decode(b[i], h->fmt));
      float want = op == WEFT_AVG && postdiv > 1 ? (float)((double)sum / postdiv) : sum;
      if (!staged) {
        CHECK(dst[i] == want || (isnan(dst[i]) && isnan(want)),
              "reduce %s %s/%d: %a + 0x%04x gave %a, want %a", h->name, weft_op_name(op),
              postdiv, (double)a[i], b[i], (double)dst[i], (double)want);
        continue;
      }
      uint64_t bits = ref_round(want, h->fmt);
      CHECK(stage[i] == bits, "reduce %s %s/%d staged: %a + 0x%04x staged 0x%04x, want 0x%04llx",
            h->name, weft_op_name(op), postdiv, (double)a[i], b[i], stage[i],
            (unsigned long long)bits);
      CHECK((double)dst[i] == ref_decode(bits, h->fmt) || isnan(dst[i]),
            "reduce %s staged: kept %a, sent 0x%04x", h->name, (double)dst[i], stage[i]);
    }
  }
  free(a);
  free(dst);
  free(wide);
  free(b);
  free(stage);
  free(narrow);
}

/* The reference rounding and decoding, pointed at the f32 format, must agree
 * with the hardware's double->float cast and with the bits themselves; this
 * is what makes them trustworthy for f16 and bf16. */
static void test_reference_self_check(void **state) {
  (void)state;
  rng r = rng_for("reference self check");
  for (int k = 0; k < (1 << 20); k++) {
    uint64_t u = rng_next(&r);
    if (k & 1) /* doubles near and beyond the float range */
      u = (u & 0x800fffffffffffffull) | (uint64_t)(1023 - 160 + rng_next(&r) % 300) << 52;
    double x;
    memcpy(&x, &u, 8);
    float hw = (float)x;
    uint32_t hw_bits;
    memcpy(&hw_bits, &hw, 4);
    uint64_t ref = ref_round(x, &FMT_F32);
    CHECK(isnan(x) ? fmt_is_nan(ref, &FMT_F32) : ref == hw_bits,
          "ref_round f32(%a): 0x%08llx, hardware 0x%08x", x, (unsigned long long)ref, hw_bits);
    double back = ref_decode(u, &FMT_F64);
    CHECK(isnan(x) ? isnan(back) : memcmp(&back, &x, 8) == 0, "ref_decode f64(0x%016llx)",
          (unsigned long long)u);
    double back32 = ref_decode(u >> 32, &FMT_F32);
    float f32 = weft_f32_from_bits((uint32_t)(u >> 32));
    CHECK(isnan(f32) ? isnan(back32) : (back32 == (double)f32 && !signbit(back32) == !signbit(f32)),
          "ref_decode f32(0x%08x)", (unsigned)(u >> 32));
  }
}

/* ---- main ---------------------------------------------------------------------- */

static unsigned long long pick_seed(void) {
  const char *env = getenv("WEFT_TEST_SEED");
  if (env && *env)
    return strtoull(env, NULL, 0);
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (unsigned long long)ts.tv_sec * 1000000007ull ^ (unsigned long long)ts.tv_nsec;
}

#define MAX_TESTS 128

int main(void) {
  static struct CMUnitTest tests[MAX_TESTS];
  static char names[MAX_TESTS][48];
  static reduce_case cases[NUM_DTYPES * WEFT_OP_COUNT];
  size_t n = 0;
  g_seed = pick_seed();
  printf("test_reduce_kernels: seed %llu (replay with WEFT_TEST_SEED=%llu)\n", g_seed, g_seed);

#define ADD_TEST(fn, state, ...)                                                       \
  do {                                                                                 \
    snprintf(names[n], sizeof names[n], __VA_ARGS__);                                  \
    tests[n] = (struct CMUnitTest){names[n], fn, NULL, NULL, (void *)(state)};         \
    n++;                                                                               \
  } while (0)

  for (size_t t = 0; t < NUM_DTYPES; t++)
    for (int op = 0; op < WEFT_OP_COUNT; op++) {
      reduce_case *c = &cases[t * WEFT_OP_COUNT + (size_t)op];
      *c = (reduce_case){&DTYPES[t], (weft_op)op};
      ADD_TEST(test_reduce_case, c, "reduce_%s_%s", DTYPES[t].name, OP_NAMES[op]);
    }
  for (size_t t = 0; t < NUM_DTYPES; t++)
    ADD_TEST(test_finish, &DTYPES[t], "finish_%s", DTYPES[t].name);
  for (size_t t = 0; t < NUM_DTYPES; t++)
    if (DTYPES[t].kind == KIND_FLOAT) {
      ADD_TEST(test_minmax_nan, &DTYPES[t], "minmax_nan_%s", DTYPES[t].name);
      ADD_TEST(test_minmax_signed_zero, &DTYPES[t], "minmax_signed_zero_%s", DTYPES[t].name);
    }
  ADD_TEST(test_avg_truncates_toward_zero, NULL, "avg_truncates_toward_zero");
  ADD_TEST(test_widen_narrow_i64, NULL, "widen_narrow_i64");
  ADD_TEST(test_unknown_does_nothing, NULL, "unknown_dtype_op_does_nothing");
  ADD_TEST(test_reference_self_check, NULL, "reference_self_check");
  ADD_TEST(test_half_exhaustive, &HALF_F16, "f16_exhaustive_round_trip");
  ADD_TEST(test_half_exhaustive, &HALF_BF16, "bf16_exhaustive_round_trip");
  ADD_TEST(test_f16_rounding_ties, NULL, "f16_rounding_ties");
  ADD_TEST(test_f16_overflow, NULL, "f16_overflow_to_inf");
  ADD_TEST(test_f16_subnormal, NULL, "f16_subnormal_results");
  ADD_TEST(test_bf16_rounding, NULL, "bf16_rounding_overflow_subnormal");
  ADD_TEST(test_half_nan_from_float, &HALF_F16, "f16_nan_from_float");
  ADD_TEST(test_half_nan_from_float, &HALF_BF16, "bf16_nan_from_float");
  ADD_TEST(test_half_random_sweep, &HALF_F16, "f16_random_sweep");
  ADD_TEST(test_half_random_sweep, &HALF_BF16, "bf16_random_sweep");
  ADD_TEST(test_wire_kernels, &HALF_F16, "wire_f16_kernels");
  ADD_TEST(test_wire_kernels, &HALF_BF16, "wire_bf16_kernels");
#undef ADD_TEST

  int failed = _cmocka_run_group_tests("reduce", tests, n, NULL, NULL);
  if (failed)
    printf("test_reduce_kernels: %d failed; seed %llu (replay with WEFT_TEST_SEED=%llu)\n", failed,
           g_seed, g_seed);
  return failed;
}
