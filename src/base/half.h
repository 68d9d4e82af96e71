/* half.h - conversions between float and the 16-bit float types (IEEE
 * binary16 "f16" and bfloat16 "bf16"), round to nearest even, NaN kept NaN,
 * subnormals exact. Written as branch-light integer code so loops using them
 * vectorize and the result does not depend on the CPU's F16C support. */
#ifndef WEFT_HALF_H
#define WEFT_HALF_H

#include <stdint.h>
#include <string.h>

/* Host and CUDA device alike: the kernels (src/cuda/kernels.cu) round with
 * these very functions, so a device result is the host's, bit for bit. */
#ifndef WEFT_HD
#ifdef __CUDACC__
#define WEFT_HD __host__ __device__ static inline
#else
#define WEFT_HD static inline
#endif
#endif

/* Every result below is computed unconditionally and picked with a bit
 * mask, never with if/else or ?: around a float operation: compilers will not
 * hoist a float operation out of a branch (it might trap), so a branch there
 * stops the loop from vectorizing, while masks become vector blends.
 * Magnitudes (sign cleared) are compared as int32_t: x86 has signed vector
 * compares only and would emulate unsigned ones with two more instructions.
 * The float additions rely on the default rounding mode (to nearest even) and
 * on float arithmetic without excess precision, which every x86-64 and
 * AArch64 target has. Flush-to-zero changes no result: no step produces or
 * needs a float subnormal. */

WEFT_HD uint32_t weft_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

WEFT_HD float weft_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* All ones when cond holds, else zero. */
WEFT_HD uint32_t weft_half_mask(int cond) {
  return 0u - (uint32_t)(cond != 0);
}

WEFT_HD uint32_t weft_half_pick(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

/* Exact. A NaN keeps its payload and is made quiet, as vcvtph2ps does. */
WEFT_HD float weft_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t mag = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa, f32 places */
  uint32_t exp = mag & 0x0f800000u;
  uint32_t normal = mag + ((127u - 15u) << 23);
  uint32_t quiet = weft_half_mask((mag & 0x007fffffu) != 0) & 0x00400000u;
  uint32_t special = mag | 0x7f800000u | quiet;
  /* A subnormal m * 2^-24: read m as the mantissa of 2^-14 * (1 + m/1024) and
   * take 2^-14 away, exact by Sterbenz and free of float subnormals. */
  float sub = weft_f32_from_bits(mag + (113u << 23)) - weft_f32_from_bits(113u << 23);
  uint32_t out = weft_half_pick(weft_half_mask(exp == 0x0f800000u), special, normal);
  out = weft_half_pick(weft_half_mask(exp == 0), weft_f32_bits(sub), out);
  return weft_f32_from_bits(out | sign);
}

/* Round to nearest even; from 65520 on (past the largest f16, 65504) the
 * result is Inf; a NaN keeps the top of its payload and is made quiet.
 * Every candidate is built as the f16 encoding shifted left by 13, so one
 * shift at the end narrows the result: were the selects written on 16-bit
 * values, compilers would narrow each candidate separately (a pack apiece). */
WEFT_HD uint16_t weft_float_to_f16(float f) {
  uint32_t u = weft_f32_bits(f);
  uint32_t mag = u & 0x7fffffffu;
  /* Normal results: rebias, then add just under half an ulp plus the last
   * kept bit, so ties go to even; a carry out of the mantissa bumps the
   * exponent, which is the right answer, up to Inf (0x7c00 << 13). */
  uint32_t normal = mag - ((127u - 15u) << 23) + 0x0fffu + ((mag >> 13) & 1u);
  normal = normal < (0x7c00u << 13) ? normal : (0x7c00u << 13);
  /* Results below 2^-14: adding 0.5f leaves an ulp of 2^-24, the f16
   * subnormal step, so the float adder rounds to the f16 grid for us; the
   * bits above 0.5f's are the f16 encoding (0x400 = 2^-14 when it rounds up). */
  uint32_t sub = (weft_f32_bits(weft_f32_from_bits(mag) + 0.5f) - 0x3f000000u) << 13;
  uint32_t nan = (mag - 0x70000000u) | 0x00400000u; /* exponent 0x7c00, quiet bit */
  uint32_t out = weft_half_pick(weft_half_mask((int32_t)mag < (113 << 23)), sub, normal);
  out = weft_half_pick(weft_half_mask((int32_t)mag > 0x7f800000), nan, out);
  uint32_t sign = (u ^ mag) >> 3; /* bit 31 to bit 15 + 13 */
  return (uint16_t)((out | sign) >> 13);
}

/* Exact: bf16 is the top half of a float. A NaN is made quiet. */
WEFT_HD float weft_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  u |= weft_half_mask((int32_t)(u & 0x7fffffffu) > 0x7f800000) & 0x00400000u;
  return weft_f32_from_bits(u);
}

/* Round to nearest even on the low 16 bits; the carry handles subnormals,
 * the mantissa-to-exponent step and overflow to Inf alike. Both candidates
 * keep the result in the top half, narrowed by one shift (see f16 above). */
WEFT_HD uint16_t weft_float_to_bf16(float f) {
  uint32_t u = weft_f32_bits(f);
  uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  uint32_t nan = u | 0x00400000u;
  int is_nan = (int32_t)(u & 0x7fffffffu) > 0x7f800000;
  return (uint16_t)(weft_half_pick(weft_half_mask(is_nan), nan, rounded) >> 16);
}

#endif
