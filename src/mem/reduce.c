/* reduce.c - the element-wise kernels behind every collective: one plain loop
 * per (dtype, op), generated from per-type helpers, compiled once per x86
 * vector width and picked at load time, so the AVX2/AVX-512 units do the work
 * on machines that have them. */
#include "src/mem/reduce.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "src/base/half.h"

/* target_clones needs ifunc support (glibc) and is x86 specific; elsewhere
 * the kernels are built for the baseline target only. */
/* ThreadSanitizer instruments the ifunc resolver, which runs before the
 * sanitizer is up and crashes at load: plain kernels there. */
#if defined(__has_feature) /* clang spells "under ThreadSanitizer" this way */
#if __has_feature(thread_sanitizer)
#define WEFT_UNDER_TSAN 1
#endif
#endif
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__) && !defined(WEFT_UNDER_TSAN)
#if __has_attribute(target_clones)
#define WEFT_KERNEL __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#endif
#ifndef WEFT_KERNEL
#define WEFT_KERNEL
#endif

/* The loops read a[i] and b[i] before writing dst[i], so dst == a or dst == b
 * carries no dependence between iterations; `restrict` would be a lie there.
 * The pragma says so instead: without it clang guards the vector loop with an
 * overlap test that in-place calls fail, and runs those scalar. */
#if defined(__clang__)
/* At -O0/-O1 clang does not vectorize and would warn that the pragma's
 * request failed, which breaks -Werror debug builds. */
#pragma clang diagnostic ignored "-Wpass-failed"
#define WEFT_NO_LOOP_DEPENDENCE _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define WEFT_NO_LOOP_DEPENDENCE _Pragma("GCC ivdep")
#else
#define WEFT_NO_LOOP_DEPENDENCE
#endif

/* ---- per-type helpers ---------------------------------------------------
 * Each type X has a compute type X_ct, load/store between the two, and the
 * operations on X_ct. f16 and bf16 compute in float and round once on store. */

static inline uint64_t f64_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static inline double f64_from_bits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* min/max return NaN when either input is. Equal inputs differ at most in the
 * sign of zero; -0 counts as below +0 (OR/AND of the bits), so a op b and
 * b op a agree bit for bit and ranks that combine in different orders still
 * produce identical buffers. */
static inline float f32_min(float x, float y) {
  float lo = (x < y || x != x) ? x : y;
  return x == y ? weft_f32_from_bits(weft_f32_bits(x) | weft_f32_bits(y)) : lo;
}

static inline float f32_max(float x, float y) {
  float hi = (x > y || x != x) ? x : y;
  return x == y ? weft_f32_from_bits(weft_f32_bits(x) & weft_f32_bits(y)) : hi;
}

static inline double f64_min(double x, double y) {
  double lo = (x < y || x != x) ? x : y;
  return x == y ? f64_from_bits(f64_bits(x) | f64_bits(y)) : lo;
}

static inline double f64_max(double x, double y) {
  double hi = (x > y || x != x) ? x : y;
  return x == y ? f64_from_bits(f64_bits(x) & f64_bits(y)) : hi;
}

typedef float f32_ct;
#define f32_load(v) (v)
#define f32_store(v) (v)
#define f32_sum(x, y) ((x) + (y))
#define f32_prod(x, y) ((x) * (y))
#define f32_div(s, d) ((s) / (float)(d))

typedef double f64_ct;
#define f64_load(v) (v)
#define f64_store(v) (v)
#define f64_sum(x, y) ((x) + (y))
#define f64_prod(x, y) ((x) * (y))
#define f64_div(s, d) ((s) / (double)(d))

/* float keeps 24 bits, at least 2p+2 for f16 (p = 11) and bf16 (p = 8), so
 * rounding a float sum, product or quotient to them again gives the correctly
 * rounded result: computing in float costs no accuracy. */
typedef float f16_ct;
#define f16_load(v) weft_f16_to_float(v)
#define f16_store(v) weft_float_to_f16(v)
#define f16_sum f32_sum
#define f16_prod f32_prod
#define f16_min f32_min
#define f16_max f32_max
#define f16_div f32_div

typedef float bf16_ct;
#define bf16_load(v) weft_bf16_to_float(v)
#define bf16_store(v) weft_float_to_bf16(v)
#define bf16_sum f32_sum
#define bf16_prod f32_prod
#define bf16_min f32_min
#define bf16_max f32_max
#define bf16_div f32_div

/* Integers wrap: the arithmetic is done in unsigned (or in int, which cannot
 * overflow for 8-bit operands) and narrowed, which GCC and clang define as
 * modulo 2^N. Division truncates toward zero. x86 has no vector integer
 * division, so 8- and 32-bit quotients go through float and double: the
 * rounding error of |s|/d is below |s| * 2^-24 / d (float, |s| <= 256) or
 * |s| * 2^-53 / d (double, |s| <= 2^31), less than the 1/d that separates a
 * non-integer quotient from the next integer, so truncating the rounded
 * quotient is exact; (float)d may round once d > 2^24, but |s|/d < 1 then
 * either way. 64-bit quotients stay scalar. */
#define PICK_SMALLER(x, y) ((x) < (y) ? (x) : (y))
#define PICK_LARGER(x, y) ((x) > (y) ? (x) : (y))

typedef int8_t i8_ct;
#define i8_load(v) (v)
#define i8_store(v) (v)
#define i8_sum(x, y) ((int8_t)((x) + (y)))
#define i8_prod(x, y) ((int8_t)((x) * (y)))
#define i8_min PICK_SMALLER
#define i8_max PICK_LARGER
#define i8_div(s, d) ((int8_t)((float)(s) / (float)(d)))

typedef uint8_t u8_ct;
#define u8_load(v) (v)
#define u8_store(v) (v)
#define u8_sum(x, y) ((uint8_t)((x) + (y)))
#define u8_prod(x, y) ((uint8_t)((x) * (y)))
#define u8_min PICK_SMALLER
#define u8_max PICK_LARGER
#define u8_div(s, d) ((uint8_t)((float)(s) / (float)(d)))

typedef int32_t i32_ct;
#define i32_load(v) (v)
#define i32_store(v) (v)
#define i32_sum(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
#define i32_prod(x, y) ((int32_t)((uint32_t)(x) * (uint32_t)(y)))
#define i32_min PICK_SMALLER
#define i32_max PICK_LARGER
#define i32_div(s, d) ((int32_t)((double)(s) / (double)(d)))

typedef int64_t i64_ct;
#define i64_load(v) (v)
#define i64_store(v) (v)
#define i64_sum(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define i64_prod(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))
#define i64_min PICK_SMALLER
#define i64_max PICK_LARGER
#define i64_div(s, d) ((s) / (int64_t)(d))

/* ---- kernels -------------------------------------------------------------- */

typedef void (*reduce_fn)(void *dst, const void *a, const void *b, size_t count, int postdiv);
typedef void (*finish_fn)(void *dst, const void *src, size_t count, int postdiv);

/* dst[i] = EXPR, with x = a[i] and y = b[i] loaded into the compute type. */
#define DEFINE_REDUCE_LOOP(name, X, T, EXPR)                                         \
  WEFT_KERNEL static void name(void *dst_, const void *a_, const void *b_, size_t count, \
                               int postdiv) {                                        \
    T *dst = dst_;                                                                   \
    const T *a = a_;                                                                 \
    const T *b = b_;                                                                 \
    (void)postdiv;                                                                   \
    WEFT_NO_LOOP_DEPENDENCE                                                          \
    for (size_t i = 0; i < count; i++) {                                             \
      X##_ct x = X##_load(a[i]);                                                     \
      X##_ct y = X##_load(b[i]);                                                     \
      dst[i] = X##_store(EXPR);                                                      \
    }                                                                                \
  }

/* avg is sum, divided in the same pass only when there is something to
 * divide by; the plain sum kernel serves every other call. */
#define DEFINE_AVG(X, T)                                                             \
  DEFINE_REDUCE_LOOP(reduce_##X##_avg_div, X, T, X##_div(X##_sum(x, y), postdiv))    \
  static void reduce_##X##_avg(void *dst, const void *a, const void *b, size_t count, \
                               int postdiv) {                                        \
    if (postdiv > 1)                                                                 \
      reduce_##X##_avg_div(dst, a, b, count, postdiv);                               \
    else                                                                             \
      reduce_##X##_sum(dst, a, b, count, postdiv);                                   \
  }

#define DEFINE_FINISH(X, T)                                                          \
  WEFT_KERNEL static void finish_##X(void *dst_, const void *src_, size_t count,     \
                                     int postdiv) {                                  \
    T *dst = dst_;                                                                   \
    const T *src = src_;                                                             \
    WEFT_NO_LOOP_DEPENDENCE                                                          \
    for (size_t i = 0; i < count; i++)                                               \
      dst[i] = X##_store(X##_div(X##_load(src[i]), postdiv));                        \
  }

#define DEFINE_KERNELS(X, T)                                                         \
  DEFINE_REDUCE_LOOP(reduce_##X##_sum, X, T, X##_sum(x, y))                          \
  DEFINE_REDUCE_LOOP(reduce_##X##_prod, X, T, X##_prod(x, y))                        \
  DEFINE_REDUCE_LOOP(reduce_##X##_min, X, T, X##_min(x, y))                          \
  DEFINE_REDUCE_LOOP(reduce_##X##_max, X, T, X##_max(x, y))                          \
  DEFINE_AVG(X, T)                                                                   \
  DEFINE_FINISH(X, T)

DEFINE_KERNELS(f32, float)
DEFINE_KERNELS(f64, double)
DEFINE_KERNELS(f16, uint16_t)
DEFINE_KERNELS(bf16, uint16_t)
DEFINE_KERNELS(i8, int8_t)
DEFINE_KERNELS(u8, uint8_t)
DEFINE_KERNELS(i32, int32_t)
DEFINE_KERNELS(i64, int64_t)

#define REDUCE_ROW(X)                                                                \
  [WEFT_SUM] = reduce_##X##_sum, [WEFT_PROD] = reduce_##X##_prod,                    \
  [WEFT_MIN] = reduce_##X##_min, [WEFT_MAX] = reduce_##X##_max,                      \
  [WEFT_AVG] = reduce_##X##_avg

static const reduce_fn reduce_table[WEFT_DTYPE_COUNT][WEFT_OP_COUNT] = {
    [WEFT_F32] = {REDUCE_ROW(f32)}, [WEFT_F64] = {REDUCE_ROW(f64)},
    [WEFT_F16] = {REDUCE_ROW(f16)}, [WEFT_BF16] = {REDUCE_ROW(bf16)},
    [WEFT_I8] = {REDUCE_ROW(i8)},   [WEFT_U8] = {REDUCE_ROW(u8)},
    [WEFT_I32] = {REDUCE_ROW(i32)}, [WEFT_I64] = {REDUCE_ROW(i64)},
};

static const finish_fn finish_table[WEFT_DTYPE_COUNT] = {
    [WEFT_F32] = finish_f32, [WEFT_F64] = finish_f64, [WEFT_F16] = finish_f16,
    [WEFT_BF16] = finish_bf16, [WEFT_I8] = finish_i8,  [WEFT_U8] = finish_u8,
    [WEFT_I32] = finish_i32, [WEFT_I64] = finish_i64,
};

/* Kept here rather than calling weft_dtype_size() so the kernels stand alone. */
static const size_t elem_size[WEFT_DTYPE_COUNT] = {
    [WEFT_F32] = 4, [WEFT_F64] = 8, [WEFT_F16] = 2, [WEFT_BF16] = 2,
    [WEFT_I8] = 1,  [WEFT_U8] = 1,  [WEFT_I32] = 4, [WEFT_I64] = 8,
};

/* ---- entry points --------------------------------------------------------- */

void weft_reduce_kernel(void *dst, const void *a, const void *b, size_t count, weft_dtype dtype,
                 weft_op op, int postdiv) {
  /* Compared as unsigned so that negative enum values are rejected too. */
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT || (unsigned)op >= WEFT_OP_COUNT || count == 0)
    return;
  reduce_table[dtype][op](dst, a, b, count, postdiv);
}

void weft_reduce_finish(void *dst, const void *src, size_t count, weft_dtype dtype, weft_op op,
                        int postdiv) {
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT || (unsigned)op >= WEFT_OP_COUNT || count == 0)
    return;
  if (op == WEFT_AVG && postdiv > 1) {
    finish_table[dtype](dst, src, count, postdiv);
    return;
  }
  if (dst != src)
    memmove(dst, src, count * elem_size[dtype]);
}

/* ---- integer avg in 64 bits ------------------------------------------------ */

#define WIDEN_CASE_(dt, type)                                                        \
  case dt: {                                                                         \
    const type *s = src;                                                             \
    for (size_t i = 0; i < count; i++) dst[i] = s[i];                                \
    break;                                                                           \
  }

void weft_widen_i64(int64_t *dst, const void *src, size_t count, weft_dtype dtype) {
  switch (dtype) {
    WIDEN_CASE_(WEFT_I8, int8_t)
    WIDEN_CASE_(WEFT_U8, uint8_t)
    WIDEN_CASE_(WEFT_I32, int32_t)
    WIDEN_CASE_(WEFT_I64, int64_t)
    default: break;
  }
}
#undef WIDEN_CASE_

/* Narrowing a value that fits is exact; one that does not wraps (modulo 2^N
 * in GCC and clang), never undefined. */
#define NARROW_CASE_(dt, type)                                                       \
  case dt: {                                                                         \
    type *d = dst;                                                                   \
    for (size_t i = 0; i < count; i++) d[i] = (type)src[i];                          \
    break;                                                                           \
  }

void weft_narrow_i64(void *dst, const int64_t *src, size_t count, weft_dtype dtype) {
  switch (dtype) {
    NARROW_CASE_(WEFT_I8, int8_t)
    NARROW_CASE_(WEFT_U8, uint8_t)
    NARROW_CASE_(WEFT_I32, int32_t)
    NARROW_CASE_(WEFT_I64, int64_t)
    default: break;
  }
}
#undef NARROW_CASE_

/* ---- f32 on the wire as f16 / bf16 ----------------------------------------
 * One loop per (wire type, divide or not, kept rounded or not): a branch
 * on postdiv or stage inside the loop would stop it from vectorizing. */

#define DEFINE_WIRE(X)                                                               \
  WEFT_KERNEL static void wire_narrow_##X(void *dst_, const float *src, size_t count) { \
    uint16_t *dst = dst_;                                                            \
    for (size_t i = 0; i < count; i++) dst[i] = X##_store(src[i]);                   \
  }                                                                                  \
  WEFT_KERNEL static void wire_widen_##X(float *dst, const void *src_, size_t count) {  \
    const uint16_t *src = src_;                                                      \
    for (size_t i = 0; i < count; i++) dst[i] = X##_load(src[i]);                    \
  }                                                                                  \
  DEFINE_WIRE_REDUCE(X, sum, x + y)                                                  \
  DEFINE_WIRE_REDUCE(X, div, (x + y) / (float)postdiv)

/* dst = a + widen(b) (EXPR), and the staged form that keeps the rounded value. */
#define DEFINE_WIRE_REDUCE(X, name, EXPR)                                            \
  WEFT_KERNEL static void wire_reduce_##X##_##name(float *dst, const float *a,       \
                                                   const void *b_, size_t count,     \
                                                   int postdiv) {                    \
    const uint16_t *b = b_;                                                          \
    (void)postdiv;                                                                   \
    WEFT_NO_LOOP_DEPENDENCE                                                          \
    for (size_t i = 0; i < count; i++) {                                             \
      float x = a[i], y = X##_load(b[i]);                                            \
      dst[i] = EXPR;                                                                 \
    }                                                                                \
  }                                                                                  \
  WEFT_KERNEL static void wire_reduce_##X##_##name##_staged(                         \
      float *dst, const float *a, const void *b_, size_t count, int postdiv,         \
      void *stage_) {                                                                \
    const uint16_t *b = b_;                                                          \
    uint16_t *stage = stage_;                                                        \
    (void)postdiv;                                                                   \
    WEFT_NO_LOOP_DEPENDENCE                                                          \
    for (size_t i = 0; i < count; i++) {                                             \
      float x = a[i], y = X##_load(b[i]);                                            \
      uint16_t h = X##_store(EXPR);                                                  \
      stage[i] = h;                                                                  \
      dst[i] = X##_load(h);                                                          \
    }                                                                                \
  }

DEFINE_WIRE(bf16)
DEFINE_WIRE(f16)

void weft_wire_narrow(void *dst, const float *src, size_t count, weft_dtype wire) {
  if (wire == WEFT_BF16) wire_narrow_bf16(dst, src, count);
  if (wire == WEFT_F16) wire_narrow_f16(dst, src, count);
}

void weft_wire_widen(float *dst, const void *src, size_t count, weft_dtype wire) {
  if (wire == WEFT_BF16) wire_widen_bf16(dst, src, count);
  if (wire == WEFT_F16) wire_widen_f16(dst, src, count);
}

void weft_wire_reduce(float *dst, const float *a, const void *b, size_t count, weft_dtype wire,
                      weft_op op, int postdiv, void *stage) {
  bool div = op == WEFT_AVG && postdiv > 1;
  if (wire == WEFT_BF16) {
    if (stage)
      (div ? wire_reduce_bf16_div_staged : wire_reduce_bf16_sum_staged)(dst, a, b, count, postdiv,
                                                                        stage);
    else
      (div ? wire_reduce_bf16_div : wire_reduce_bf16_sum)(dst, a, b, count, postdiv);
  } else if (wire == WEFT_F16) {
    if (stage)
      (div ? wire_reduce_f16_div_staged : wire_reduce_f16_sum_staged)(dst, a, b, count, postdiv,
                                                                      stage);
    else
      (div ? wire_reduce_f16_div : wire_reduce_f16_sum)(dst, a, b, count, postdiv);
  }
}
