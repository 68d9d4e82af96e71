/* reduce_ops.h - one element of every reduction, for the host and the CUDA
 * kernels alike (gcc compiles it as C11, nvcc as CUDA C++): sum, prod, min,
 * max and avg of every dtype, the avg's division, scale, and f32 carried as
 * f16/bf16. The host's vectorized loops (reduce.c, mem.c) are a second
 * writing of the same rules; tests/test_reduce_ops.c proves the two agree
 * bit for bit on fresh random data with NaNs, infinities, signed zeros,
 * subnormals, rounding ties and integer extremes, so what the device
 * computes is what the host computes, without a GPU. The rules:
 *  - f16/bf16 compute in float and round once to nearest even (half.h);
 *  - min/max propagate NaN (the first operand's when both are), and -0
 *    counts as below +0, so a op b and b op a agree bit for bit;
 *  - integers wrap (unsigned arithmetic), and divide truncating toward zero;
 *  - avg is the sum, divided by postdiv when postdiv > 1. */
#ifndef WEFT_REDUCE_OPS_H
#define WEFT_REDUCE_OPS_H

#include <stdint.h>
#include <string.h>

#include "src/base/half.h"
#include "weft.h"

WEFT_HD uint64_t weft_f64_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

WEFT_HD double weft_f64_from_bits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

WEFT_HD float weft_op_f32_min(float x, float y) {
  float lo = (x < y || x != x) ? x : y;
  return x == y ? weft_f32_from_bits(weft_f32_bits(x) | weft_f32_bits(y)) : lo;
}

WEFT_HD float weft_op_f32_max(float x, float y) {
  float hi = (x > y || x != x) ? x : y;
  return x == y ? weft_f32_from_bits(weft_f32_bits(x) & weft_f32_bits(y)) : hi;
}

WEFT_HD double weft_op_f64_min(double x, double y) {
  double lo = (x < y || x != x) ? x : y;
  return x == y ? weft_f64_from_bits(weft_f64_bits(x) | weft_f64_bits(y)) : lo;
}

WEFT_HD double weft_op_f64_max(double x, double y) {
  double hi = (x > y || x != x) ? x : y;
  return x == y ? weft_f64_from_bits(weft_f64_bits(x) & weft_f64_bits(y)) : hi;
}

/* One dtype's element steps: `X` the dtype's short name, `T` its storage,
 * `CT` the type it computes in, LOAD/STORE between them, and the five
 * operations on CT (DIV(s, d): s divided by the integer d). */
#define WEFT_REDUCE_OPS(X, T, CT, LOAD, STORE, SUM, PROD, MIN, MAX, DIV)              \
  /* a op b; `op` a weft_op, postdiv for avg */                                       \
  WEFT_HD T weft_op_##X(T a, T b, int op, int postdiv) {                              \
    CT x = LOAD(a), y = LOAD(b);                                                      \
    switch (op) {                                                                     \
      case WEFT_SUM: return STORE(SUM(x, y));                                         \
      case WEFT_PROD: return STORE(PROD(x, y));                                       \
      case WEFT_MIN: return STORE(MIN(x, y));                                         \
      case WEFT_MAX: return STORE(MAX(x, y));                                         \
      case WEFT_AVG: return postdiv > 1 ? STORE(DIV(SUM(x, y), postdiv)) : STORE(SUM(x, y)); \
      default: return a;                                                              \
    }                                                                                 \
  }                                                                                   \
  /* an avg's result: v divided by postdiv (the caller asks only when > 1) */         \
  WEFT_HD T weft_op_##X##_finish(T v, int postdiv) {                                  \
    return STORE(DIV(LOAD(v), postdiv));                                              \
  }                                                                                   \
  /* v[0] op v[1] op ... op v[n-1], n >= 2, in that order, postdiv at the last \
   * step: the direct allreduce's sum of one element over its n members, as   \
   * the pairwise steps make it (fused kernel and host alike) */               \
  WEFT_HD T weft_op_##X##_all(const T *v, int n, int op, int postdiv) {               \
    T acc = weft_op_##X(v[0], v[1], op, n == 2 ? postdiv : 1);                        \
    for (int p = 2; p < n; p++) acc = weft_op_##X(acc, v[p], op, p == n - 1 ? postdiv : 1); \
    return acc;                                                                       \
  }

#define WEFT_ID_(v) (v)
#define WEFT_SUM_(x, y) ((x) + (y))
#define WEFT_PROD_(x, y) ((x) * (y))
#define WEFT_SMALLER_(x, y) ((x) < (y) ? (x) : (y))
#define WEFT_LARGER_(x, y) ((x) > (y) ? (x) : (y))
#define WEFT_FDIV_(s, d) ((s) / (float)(d))
#define WEFT_DDIV_(s, d) ((s) / (double)(d))
#define WEFT_I8_SUM_(x, y) ((int8_t)((x) + (y)))
#define WEFT_I8_PROD_(x, y) ((int8_t)((x) * (y)))
#define WEFT_I8_DIV_(s, d) ((int8_t)((float)(s) / (float)(d)))
#define WEFT_U8_SUM_(x, y) ((uint8_t)((x) + (y)))
#define WEFT_U8_PROD_(x, y) ((uint8_t)((x) * (y)))
#define WEFT_U8_DIV_(s, d) ((uint8_t)((float)(s) / (float)(d)))
#define WEFT_I32_SUM_(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
#define WEFT_I32_PROD_(x, y) ((int32_t)((uint32_t)(x) * (uint32_t)(y)))
#define WEFT_I32_DIV_(s, d) ((int32_t)((double)(s) / (double)(d)))
#define WEFT_I64_SUM_(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define WEFT_I64_PROD_(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))
#define WEFT_I64_DIV_(s, d) ((s) / (int64_t)(d))

WEFT_REDUCE_OPS(f32, float, float, WEFT_ID_, WEFT_ID_, WEFT_SUM_, WEFT_PROD_, weft_op_f32_min,
                weft_op_f32_max, WEFT_FDIV_)
WEFT_REDUCE_OPS(f64, double, double, WEFT_ID_, WEFT_ID_, WEFT_SUM_, WEFT_PROD_, weft_op_f64_min,
                weft_op_f64_max, WEFT_DDIV_)
WEFT_REDUCE_OPS(f16, uint16_t, float, weft_f16_to_float, weft_float_to_f16, WEFT_SUM_, WEFT_PROD_,
                weft_op_f32_min, weft_op_f32_max, WEFT_FDIV_)
WEFT_REDUCE_OPS(bf16, uint16_t, float, weft_bf16_to_float, weft_float_to_bf16, WEFT_SUM_,
                WEFT_PROD_, weft_op_f32_min, weft_op_f32_max, WEFT_FDIV_)
WEFT_REDUCE_OPS(i8, int8_t, int8_t, WEFT_ID_, WEFT_ID_, WEFT_I8_SUM_, WEFT_I8_PROD_, WEFT_SMALLER_,
                WEFT_LARGER_, WEFT_I8_DIV_)
WEFT_REDUCE_OPS(u8, uint8_t, uint8_t, WEFT_ID_, WEFT_ID_, WEFT_U8_SUM_, WEFT_U8_PROD_,
                WEFT_SMALLER_, WEFT_LARGER_, WEFT_U8_DIV_)
WEFT_REDUCE_OPS(i32, int32_t, int32_t, WEFT_ID_, WEFT_ID_, WEFT_I32_SUM_, WEFT_I32_PROD_,
                WEFT_SMALLER_, WEFT_LARGER_, WEFT_I32_DIV_)
WEFT_REDUCE_OPS(i64, int64_t, int64_t, WEFT_ID_, WEFT_ID_, WEFT_I64_SUM_, WEFT_I64_PROD_,
                WEFT_SMALLER_, WEFT_LARGER_, WEFT_I64_DIV_)

/* buf[i] *= factor (mem.h, scale): floats in float (double for f64),
 * rounded once; integers through double, truncated toward zero. */
WEFT_HD float weft_scale_f32(float v, double factor) {
  return v * (float)factor;
}
WEFT_HD double weft_scale_f64(double v, double factor) {
  return v * factor;
}
WEFT_HD uint16_t weft_scale_f16(uint16_t v, double factor) {
  return weft_float_to_f16(weft_f16_to_float(v) * (float)factor);
}
WEFT_HD uint16_t weft_scale_bf16(uint16_t v, double factor) {
  return weft_float_to_bf16(weft_bf16_to_float(v) * (float)factor);
}
WEFT_HD int8_t weft_scale_i8(int8_t v, double factor) {
  return (int8_t)((double)v * factor);
}
WEFT_HD uint8_t weft_scale_u8(uint8_t v, double factor) {
  return (uint8_t)((double)v * factor);
}
WEFT_HD int32_t weft_scale_i32(int32_t v, double factor) {
  return (int32_t)((double)v * factor);
}
WEFT_HD int64_t weft_scale_i64(int64_t v, double factor) {
  return (int64_t)((double)v * factor);
}

/* f32 on the wire (reduce.h): `wire` WEFT_BF16 or WEFT_F16. */
WEFT_HD uint16_t weft_wire_narrow_one(float v, int wire) {
  return wire == WEFT_BF16 ? weft_float_to_bf16(v) : weft_float_to_f16(v);
}
WEFT_HD float weft_wire_widen_one(uint16_t v, int wire) {
  return wire == WEFT_BF16 ? weft_bf16_to_float(v) : weft_f16_to_float(v);
}
/* a + widen(b), divided by postdiv for an avg with postdiv > 1 */
WEFT_HD float weft_wire_reduce_one(float a, uint16_t b, int wire, int op, int postdiv) {
  float y = weft_wire_widen_one(b, wire);
  return op == WEFT_AVG && postdiv > 1 ? (a + y) / (float)postdiv : a + y;
}

#endif
