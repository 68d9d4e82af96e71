/* reduce.h - element-wise reduction kernels for every (dtype, op) pair.
 * Host memory only; the memory table (mem.h) routes device buffers elsewhere.
 * Kernels are plain loops the compiler vectorizes; f16/bf16 go through float
 * and round to nearest even once per call. */
#ifndef WEFT_REDUCE_H
#define WEFT_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"

/* dst[i] = a[i] op b[i] for i < count. dst may alias a or b (exactly, not
 * partially). WEFT_AVG reduces as WEFT_SUM; when postdiv > 1 and op is
 * WEFT_AVG, the result is divided by postdiv in the same pass (floats: the
 * sum is formed in the type's compute precision - float for f16/bf16 - then
 * divided, then rounded once; integers: wrapping sum, then division
 * truncating toward zero). postdiv is ignored for every other op.
 * min/max propagate NaN: if either input is NaN the result is NaN.
 * Unknown dtype/op: does nothing (callers validate first). */
void weft_reduce_kernel(void *dst, const void *a, const void *b, size_t count, weft_dtype dtype,
                 weft_op op, int postdiv);

/* dst[i] = src[i] / postdiv when op is WEFT_AVG and postdiv > 1, otherwise a
 * copy (or nothing when dst == src). Same division rules as weft_reduce_kernel. */
void weft_reduce_finish(void *dst, const void *src, size_t count, weft_dtype dtype, weft_op op,
                        int postdiv);

/* An integer avg sums in 64 bits (src/coll/coll.c): dst[i] = src[i] as
 * int64_t, for src of dtype i8, u8, i32 or i64. */
void weft_widen_i64(int64_t *dst, const void *src, size_t count, weft_dtype dtype);

/* dst[i] = src[i] narrowed to dtype (i8, u8, i32, i64): the caller knows the
 * values fit (a mean of values of that dtype); any other value wraps. */
void weft_narrow_i64(void *dst, const int64_t *src, size_t count, weft_dtype dtype);

/* ---- f32 data on the wire as f16 or bf16 (weft_coll.wire, algo.h) ------------
 * `wire` is WEFT_BF16 or WEFT_F16 (anything else: nothing is done). Rounding
 * is half.h's, to nearest even, as the f16/bf16 kernels above. */

/* dst[i] (wire) = src[i] (f32) rounded. */
void weft_wire_narrow(void *dst, const float *src, size_t count, weft_dtype wire);

/* dst[i] (f32) = src[i] (wire), exact. */
void weft_wire_widen(float *dst, const void *src, size_t count, weft_dtype wire);

/* dst[i] = a[i] + widen(b[i]) in f32, `a` first (NaN bits), divided by
 * postdiv when op is WEFT_AVG and postdiv > 1 (any other op sums). Then, when
 * `stage` is not NULL: stage[i] = dst[i] rounded to wire and dst[i] =
 * widen(stage[i]), so the value sent on (stage) is the value kept (dst). dst
 * may alias a exactly; stage aliases nothing. */
void weft_wire_reduce(float *dst, const float *a, const void *b, size_t count, weft_dtype wire,
                      weft_op op, int postdiv, void *stage);

#endif
