/* test_reduce_ops.c - the element steps the CUDA kernels run
 * (src/mem/reduce_ops.h) against the host's vectorized kernels (reduce.c,
 * mem.c), bit for bit, on fresh random data full of the awkward values:
 * NaNs with payloads, infinities, signed zeros, subnormals, f16/bf16 values
 * on rounding ties, integer extremes. Every dtype x op, both operand
 * orders, postdiv 1..7; the avg's division, scale, and f32 on the wire.
 * A device that runs these steps computes what the host computes. One
 * freedom IEEE 754 leaves: which NaN's payload an addition, product or
 * division of NaNs returns (x86 gives its first operand's, and the compiler
 * may swap the operands of a commutative +; NVIDIA GPUs give the canonical
 * NaN). There a NaN must meet a NaN, any payload; min and max choose an
 * operand, so their NaNs are compared bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "src/mem/mem.h"
#include "src/mem/reduce.h"
#include "src/mem/reduce_ops.h"

#define N 4099

static uint64_t rng;

/* A value of `size` bytes: random bits, or one of the awkward ones. */
static void awkward(void *out, weft_dtype dt) {
  uint64_t r = harness_rng(&rng), pick = harness_rng(&rng) % 16;
  switch (dt) {
    case WEFT_F32: {
      /* 65520 rounds to f16's Inf (a tie with 65536), just below it to 65504 */
      static const uint32_t special[] = {0x7fc00001u, 0xffc12345u, 0x7f800000u, 0xff800000u,
                                         0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu,
                                         0x3f800000u, 0x7f7fffffu, 0x477ff000u, 0x477fefffu,
                                         0x7f800001u};
      uint32_t v = (uint32_t)r;
      pick = harness_rng(&rng) % 24;
      if (pick < 13) {
        v = special[pick];
      } else if (pick < 17) {
        /* f16's range (exponents 2^-25 .. 2^15), the 13 bits f16 drops on
         * the tie or one step beside it: what narrowing rounds differently */
        static const uint32_t low13[] = {0x1000u, 0x0fffu, 0x1001u, 0x0000u};
        uint32_t exp = 102u + (uint32_t)(r >> 40) % 41u;
        v = (v & 0x807fe000u) | exp << 23 | low13[pick - 13];
      } else if (pick < 20) {
        static const uint32_t low16[] = {0x8000u, 0x7fffu, 0x8001u};
        v = (v & 0xffff0000u) | low16[pick - 17]; /* bf16's tie, anywhere in f32's range */
      }
      memcpy(out, &v, 4);
      break;
    }
    case WEFT_F64: {
      static const uint64_t special[] = {0x7ff8000000000001ull, 0xfff0000000000000ull,
                                         0x7ff0000000000000ull, 0x8000000000000000ull, 0,
                                         1, 0x000fffffffffffffull, 0x3ff0000000000000ull};
      uint64_t v = pick < 8 ? special[pick] : r;
      memcpy(out, &v, 8);
      break;
    }
    case WEFT_F16:
    case WEFT_BF16: {
      static const uint16_t special[] = {0x7e01, 0xfc00, 0x7c00, 0x8000, 0x0000, 0x0001,
                                         0x03ff, 0x7bff, 0x7f81, 0x3c01};
      uint16_t v = pick < 10 ? special[pick] : (uint16_t)r;
      memcpy(out, &v, 2);
      break;
    }
    case WEFT_I8:
    case WEFT_U8: {
      static const uint8_t special[] = {0x80, 0x7f, 0xff, 0, 1};
      uint8_t v = pick < 5 ? special[pick] : (uint8_t)r;
      memcpy(out, &v, 1);
      break;
    }
    case WEFT_I32: {
      static const uint32_t special[] = {0x80000000u, 0x7fffffffu, 0xffffffffu, 0, 1};
      uint32_t v = pick < 5 ? special[pick] : (uint32_t)r;
      memcpy(out, &v, 4);
      break;
    }
    case WEFT_I64: {
      static const uint64_t special[] = {0x8000000000000000ull, 0x7fffffffffffffffull,
                                         0xffffffffffffffffull, 0, 1};
      uint64_t v = pick < 5 ? special[pick] : r;
      memcpy(out, &v, 8);
      break;
    }
    default: break;
  }
}

/* The header's element step for dtype dt, at element i. */
static void one(weft_dtype dt, void *dst, const void *a, const void *b, size_t i, int op, int pd) {
#define ONE_(X, T)                                                                    \
  ((T *)dst)[i] = weft_op_##X(((const T *)a)[i], ((const T *)b)[i], op, pd);          \
  break;
  switch (dt) {
    case WEFT_F32: ONE_(f32, float)
    case WEFT_F64: ONE_(f64, double)
    case WEFT_F16: ONE_(f16, uint16_t)
    case WEFT_BF16: ONE_(bf16, uint16_t)
    case WEFT_I8: ONE_(i8, int8_t)
    case WEFT_U8: ONE_(u8, uint8_t)
    case WEFT_I32: ONE_(i32, int32_t)
    case WEFT_I64: ONE_(i64, int64_t)
    default: break;
  }
#undef ONE_
}

static void one_finish(weft_dtype dt, void *dst, const void *src, size_t i, int pd) {
#define FIN_(X, T)                                                                    \
  ((T *)dst)[i] = weft_op_##X##_finish(((const T *)src)[i], pd);                      \
  break;
  switch (dt) {
    case WEFT_F32: FIN_(f32, float)
    case WEFT_F64: FIN_(f64, double)
    case WEFT_F16: FIN_(f16, uint16_t)
    case WEFT_BF16: FIN_(bf16, uint16_t)
    case WEFT_I8: FIN_(i8, int8_t)
    case WEFT_U8: FIN_(u8, uint8_t)
    case WEFT_I32: FIN_(i32, int32_t)
    case WEFT_I64: FIN_(i64, int64_t)
    default: break;
  }
#undef FIN_
}

static void one_scale(weft_dtype dt, void *buf, size_t i, double f) {
#define SC_(X, T)                                                                     \
  ((T *)buf)[i] = weft_scale_##X(((T *)buf)[i], f);                                   \
  break;
  switch (dt) {
    case WEFT_F32: SC_(f32, float)
    case WEFT_F64: SC_(f64, double)
    case WEFT_F16: SC_(f16, uint16_t)
    case WEFT_BF16: SC_(bf16, uint16_t)
    case WEFT_I8: SC_(i8, int8_t)
    case WEFT_U8: SC_(u8, uint8_t)
    case WEFT_I32: SC_(i32, int32_t)
    case WEFT_I64: SC_(i64, int64_t)
    default: break;
  }
#undef SC_
}

static bool is_nan(weft_dtype dt, const void *p) {
  switch (dt) {
    case WEFT_F32: { uint32_t u; memcpy(&u, p, 4); return (u & 0x7fffffffu) > 0x7f800000u; }
    case WEFT_F64: { uint64_t u; memcpy(&u, p, 8); return (u & ~(1ull << 63)) > 0x7ff0000000000000ull; }
    case WEFT_F16: { uint16_t u; memcpy(&u, p, 2); return (u & 0x7fff) > 0x7c00; }
    case WEFT_BF16: { uint16_t u; memcpy(&u, p, 2); return (u & 0x7fff) > 0x7f80; }
    default: return false;
  }
}

/* The first element where the two differ, or -1; with any_nan, two NaNs
 * of any payloads are alike. */
static long differs_as(weft_dtype dt, const void *x, const void *y, size_t n, bool any_nan) {
  size_t esz = weft_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    const char *p = (const char *)x + i * esz, *q = (const char *)y + i * esz;
    if (!memcmp(p, q, esz)) continue;
    if (any_nan && is_nan(dt, p) && is_nan(dt, q)) continue;
    return (long)i;
  }
  return -1;
}

/* Element `at` of a buffer of `esz`-byte elements, its bits as a number. */
static unsigned long long bits_at(const void *buf, long at, size_t esz) {
  const char *p = (const char *)buf + (size_t)at * esz;
  uint64_t u8 = 0;
  uint32_t u4 = 0;
  uint16_t u2 = 0;
  uint8_t u1 = 0;
  switch (esz) {
    case 8: memcpy(&u8, p, 8); return u8;
    case 4: memcpy(&u4, p, 4); return u4;
    case 2: memcpy(&u2, p, 2); return u2;
    default: memcpy(&u1, p, 1); return u1;
  }
}

/* Says where the host kernel and the header's step first differ, with the
 * operands' bits when there are operands (a, b may be NULL); counts it. */
static void report(int *bad, const char *what, long at, size_t esz, const void *host,
                   const void *dev, const void *a, size_t a_esz, const void *b, size_t b_esz) {
  if ((*bad)++ >= 10) return;
  fprintf(stderr, "%s: element %ld differs: host %0*llx, header %0*llx", what, at, (int)esz * 2,
          bits_at(host, at, esz), (int)esz * 2, bits_at(dev, at, esz));
  if (a) fprintf(stderr, " (a %0*llx", (int)a_esz * 2, bits_at(a, at, a_esz));
  if (a && b) fprintf(stderr, ", b %0*llx", (int)b_esz * 2, bits_at(b, at, b_esz));
  fprintf(stderr, a ? ")\n" : "\n");
}

static long differs(const void *x, const void *y, size_t n, size_t esz) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)x + i * esz, (const char *)y + i * esz, esz)) return (long)i;
  return -1;
}

/* Whether v * f, truncated toward zero, fits v's integer dtype (the scale's
 * result is defined); always true for the floats. */
static bool scale_in_range(weft_dtype dt, const void *v, double f) {
  int8_t i8;
  uint8_t u8;
  int32_t i32;
  int64_t i64;
  switch (dt) {
    case WEFT_I8: memcpy(&i8, v, 1); return i8 * f > -129.0 && i8 * f < 128.0;
    case WEFT_U8: memcpy(&u8, v, 1); return u8 * f > -1.0 && u8 * f < 256.0;
    case WEFT_I32: memcpy(&i32, v, 4); return i32 * f > -2147483649.0 && i32 * f < 2147483648.0;
    case WEFT_I64:
      memcpy(&i64, v, 8);
      return (double)i64 * f >= -9223372036854775808.0 && (double)i64 * f < 9223372036854775808.0;
    default: return true;
  }
}

static void every_dtype_and_op(void **state) {
  (void)state;
  int bad = 0;
  for (int dt = 0; dt < WEFT_DTYPE_COUNT; dt++) {
    size_t esz = weft_dtype_size((weft_dtype)dt);
    char *a = malloc(N * esz), *b = malloc(N * esz), *host = malloc(N * esz), *dev = malloc(N * esz);
    for (size_t i = 0; i < N; i++) {
      awkward(a + i * esz, (weft_dtype)dt);
      awkward(b + i * esz, (weft_dtype)dt);
    }
    for (int op = 0; op < WEFT_OP_COUNT; op++)
      for (int pd = 1; pd <= 7; pd++)
        for (int swap = 0; swap < 2; swap++) {
          const char *x = swap ? b : a, *y = swap ? a : b;
          weft_reduce_kernel(host, x, y, N, (weft_dtype)dt, (weft_op)op, pd);
          for (size_t i = 0; i < N; i++) one((weft_dtype)dt, dev, x, y, i, op, pd);
          bool any_nan = op != WEFT_MIN && op != WEFT_MAX;
          long at = differs_as((weft_dtype)dt, host, dev, N, any_nan);
          char what[96];
          snprintf(what, sizeof what, "%s %s postdiv %d%s", weft_dtype_name((weft_dtype)dt),
                   weft_op_name((weft_op)op), pd, swap ? " (b op a)" : "");
          if (at >= 0) report(&bad, what, at, esz, host, dev, x, esz, y, esz);
        }
    /* the avg's division, once the sum is complete */
    for (int pd = 2; pd <= 7; pd++) {
      weft_reduce_finish(host, a, N, (weft_dtype)dt, WEFT_AVG, pd);
      for (size_t i = 0; i < N; i++) one_finish((weft_dtype)dt, dev, a, i, pd);
      long at = differs_as((weft_dtype)dt, host, dev, N, true);
      char what[64];
      snprintf(what, sizeof what, "%s finish / %d", weft_dtype_name((weft_dtype)dt), pd);
      if (at >= 0) report(&bad, what, at, esz, host, dev, a, esz, NULL, 0);
    }
    /* scale, as gradient sets pre- and post-divide */
    static const double factors[] = {0.5, 0.125, 1.0 / 3, 3.0, -2.5, 1e-3, -1.0, 1.0 / 7};
    for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++) {
      memcpy(host, a, N * esz);
      memcpy(dev, a, N * esz);
      weft_mem_host.scale(host, N, (weft_dtype)dt, factors[f]);
      for (size_t i = 0; i < N; i++) {
        one_scale((weft_dtype)dt, dev, i, factors[f]);
        /* integers: a product out of the type's range is undefined in C
         * (x86 gives 0x80000000, a GPU saturates), so such elements are
         * left out here, on both sides; every other one is compared */
        if (!scale_in_range((weft_dtype)dt, a + i * esz, factors[f]))
          memcpy(dev + i * esz, host + i * esz, esz);
      }
      long at = differs_as((weft_dtype)dt, host, dev, N, true);
      char what[64];
      snprintf(what, sizeof what, "%s scale %g", weft_dtype_name((weft_dtype)dt), factors[f]);
      if (at >= 0) report(&bad, what, at, esz, host, dev, a, esz, NULL, 0);
    }
    free(a), free(b), free(host), free(dev);
  }
  if (bad) fail_msg("%d differences between the device's element steps and the host kernels", bad);
}

/* f32 carried as f16/bf16: narrow on random f32 and on the values beside
 * the rounding ties, widen on every one of the 65536 encodings, reduce with
 * every op (all but avg sum) and postdiv 1..7, kept rounded (a stage) or
 * not, into a separate dst and in place (dst == a) on the host's side. */
#define ALL16 65536

static void f32_on_the_wire(void **state) {
  (void)state;
  int bad = 0;
  float *a = malloc(ALL16 * 4), *hd = malloc(ALL16 * 4), *dd = malloc(ALL16 * 4);
  uint16_t *b = malloc(ALL16 * 2), *hs = malloc(N * 2), *ds = malloc(N * 2);
  for (size_t i = 0; i < N; i++) {
    awkward(&a[i], WEFT_F32);
    awkward(&b[i], i % 2 ? WEFT_F16 : WEFT_BF16);
  }
  static const weft_dtype wires[] = {WEFT_BF16, WEFT_F16};
  for (int w = 0; w < 2; w++) {
    weft_dtype wire = wires[w];
    const char *wn = weft_dtype_name(wire);
    char what[96];
    weft_wire_narrow(hs, a, N, wire);
    for (size_t i = 0; i < N; i++) ds[i] = weft_wire_narrow_one(a[i], wire);
    long at = differs(hs, ds, N, 2);
    snprintf(what, sizeof what, "%s narrow", wn);
    if (at >= 0) report(&bad, what, at, 2, hs, ds, a, 4, NULL, 0);

    uint16_t *every = malloc(ALL16 * 2);
    for (size_t i = 0; i < ALL16; i++) every[i] = (uint16_t)i;
    weft_wire_widen(hd, every, ALL16, wire);
    for (size_t i = 0; i < ALL16; i++) dd[i] = weft_wire_widen_one(every[i], wire);
    at = differs(hd, dd, ALL16, 4);
    snprintf(what, sizeof what, "%s widen (every encoding)", wn);
    if (at >= 0) report(&bad, what, at, 4, hd, dd, every, 2, NULL, 0);
    free(every);

    for (int op = 0; op < WEFT_OP_COUNT; op++)
      for (int pd = 1; pd <= 7; pd++)
        for (int kept = 0; kept < 2; kept++)
          for (int in_place = 0; in_place < 2; in_place++) {
            uint16_t *stage = kept ? hs : NULL;
            if (in_place) {
              memcpy(hd, a, N * 4);
              weft_wire_reduce(hd, hd, b, N, wire, (weft_op)op, pd, stage);
            } else {
              weft_wire_reduce(hd, a, b, N, wire, (weft_op)op, pd, stage);
            }
            for (size_t i = 0; i < N; i++) {
              dd[i] = weft_wire_reduce_one(a[i], b[i], wire, op, pd);
              if (kept) {
                ds[i] = weft_wire_narrow_one(dd[i], wire);
                dd[i] = weft_wire_widen_one(ds[i], wire);
              }
            }
            snprintf(what, sizeof what, "%s reduce %s / %d%s%s", wn, weft_op_name((weft_op)op), pd,
                     kept ? ", kept rounded" : "", in_place ? ", in place" : "");
            if (kept && (at = differs_as(wire, hs, ds, N, true)) >= 0)
              report(&bad, what, at, 2, hs, ds, a, 4, b, 2);
            if ((at = differs_as(WEFT_F32, hd, dd, N, true)) >= 0)
              report(&bad, what, at, 4, hd, dd, a, 4, b, 2);
          }
  }
  free(a), free(hd), free(dd), free(b), free(hs), free(ds);
  if (bad) fail_msg("%d differences on the wire", bad);
}

int main(void) {
  const char *env = getenv("WEFT_TEST_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
  printf("# seed %llu (set WEFT_TEST_SEED to repeat)\n", (unsigned long long)seed);
  rng = harness_seed(seed, 0, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_dtype_and_op),
      cmocka_unit_test(f32_on_the_wire),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
