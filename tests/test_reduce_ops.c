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
      static const uint32_t special[] = {0x7fc00001u, 0xffc12345u, 0x7f800000u, 0xff800000u,
                                         0x80000000u, 0x00000000u, 0x00000001u, 0x807fffffu,
                                         0x3f800000u, 0x7f7fffffu};
      uint32_t v = pick < 10 ? special[pick] : (uint32_t)r;
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

static long differs(const void *x, const void *y, size_t n, size_t esz) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)x + i * esz, (const char *)y + i * esz, esz)) return (long)i;
  return -1;
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
          if (at >= 0 && bad++ < 10)
            fprintf(stderr, "%s %s postdiv %d%s: element %ld differs (host %016llx, device %016llx)\n",
                    weft_dtype_name((weft_dtype)dt), weft_op_name((weft_op)op), pd,
                    swap ? " (b op a)" : "", at,
                    (unsigned long long)(esz == 8 ? *(uint64_t *)(host + at * esz)
                                                  : esz == 4 ? *(uint32_t *)(host + at * esz)
                                                  : esz == 2 ? *(uint16_t *)(host + at * esz)
                                                             : *(uint8_t *)(host + at * esz)),
                    (unsigned long long)(esz == 8 ? *(uint64_t *)(dev + at * esz)
                                                  : esz == 4 ? *(uint32_t *)(dev + at * esz)
                                                  : esz == 2 ? *(uint16_t *)(dev + at * esz)
                                                             : *(uint8_t *)(dev + at * esz)));
        }
    /* the avg's division, once the sum is complete */
    for (int pd = 2; pd <= 7; pd++) {
      weft_reduce_finish(host, a, N, (weft_dtype)dt, WEFT_AVG, pd);
      for (size_t i = 0; i < N; i++) one_finish((weft_dtype)dt, dev, a, i, pd);
      long at = differs_as((weft_dtype)dt, host, dev, N, true);
      if (at >= 0 && bad++ < 10)
        fprintf(stderr, "%s finish / %d: element %ld differs\n", weft_dtype_name((weft_dtype)dt),
                pd, at);
    }
    /* scale, as gradient sets pre- and post-divide */
    static const double factors[] = {0.5, 0.125, 1.0 / 3, 3.0, -2.5, 1e-3};
    for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++) {
      memcpy(host, a, N * esz);
      memcpy(dev, a, N * esz);
      weft_mem_host.scale(host, N, (weft_dtype)dt, factors[f]);
      for (size_t i = 0; i < N; i++) one_scale((weft_dtype)dt, dev, i, factors[f]);
      long at = differs_as((weft_dtype)dt, host, dev, N, true);
      /* integers: a factor that takes a value out of range is undefined in
       * C on both sides; only the floats are compared for those */
      if (at >= 0 && (dt <= WEFT_BF16 || fabs(factors[f]) <= 1.0) && bad++ < 10)
        fprintf(stderr, "%s scale %g: element %ld differs\n", weft_dtype_name((weft_dtype)dt),
                factors[f], at);
    }
    free(a), free(b), free(host), free(dev);
  }
  if (bad) fail_msg("%d differences between the device's element steps and the host kernels", bad);
}

static void f32_on_the_wire(void **state) {
  (void)state;
  int bad = 0;
  float *a = malloc(N * 4), *hd = malloc(N * 4), *dd = malloc(N * 4);
  uint16_t *b = malloc(N * 2), *hs = malloc(N * 2), *ds = malloc(N * 2);
  for (size_t i = 0; i < N; i++) {
    awkward(&a[i], WEFT_F32);
    awkward(&b[i], WEFT_F16);
  }
  static const weft_dtype wires[] = {WEFT_BF16, WEFT_F16};
  for (int w = 0; w < 2; w++) {
    weft_dtype wire = wires[w];
    weft_wire_narrow(hs, a, N, wire);
    for (size_t i = 0; i < N; i++) ds[i] = weft_wire_narrow_one(a[i], wire);
    if (differs(hs, ds, N, 2) >= 0) bad++, fprintf(stderr, "%s narrow differs\n", weft_dtype_name(wire));
    weft_wire_widen(hd, b, N, wire);
    for (size_t i = 0; i < N; i++) dd[i] = weft_wire_widen_one(b[i], wire);
    if (differs(hd, dd, N, 4) >= 0) bad++, fprintf(stderr, "%s widen differs\n", weft_dtype_name(wire));
    for (int op = WEFT_SUM; op <= WEFT_AVG; op += WEFT_AVG - WEFT_SUM)
      for (int pd = 1; pd <= 5; pd++) {
        weft_wire_reduce(hd, a, b, N, wire, (weft_op)op, pd, hs);
        for (size_t i = 0; i < N; i++) {
          ds[i] = weft_wire_narrow_one(weft_wire_reduce_one(a[i], b[i], wire, op, pd), wire);
          dd[i] = weft_wire_widen_one(ds[i], wire);
        }
        if (differs_as(wire, hs, ds, N, true) >= 0 || differs_as(WEFT_F32, hd, dd, N, true) >= 0)
          bad++, fprintf(stderr, "%s reduce %s / %d differs\n", weft_dtype_name(wire),
                         weft_op_name((weft_op)op), pd);
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
