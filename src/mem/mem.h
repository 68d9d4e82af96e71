/* mem.h - the memory table: how the algorithms and transports copy and reduce
 * a buffer without assuming it is a host pointer. Host memory now; a CUDA
 * table (device copies, reduction kernels, IPC handles) plugs in beside it. */
#ifndef WEFT_MEM_H
#define WEFT_MEM_H

#include <stddef.h>

#include "weft.h"

typedef enum weft_mem_kind { WEFT_MEM_HOST = 0, WEFT_MEM_KIND_COUNT } weft_mem_kind;

typedef struct weft_mem_ops {
  weft_mem_kind kind;
  const char *name;
  /* dst = src for `bytes` bytes; both in this memory; no overlap. */
  void (*copy)(void *dst, const void *src, size_t bytes);
  /* dst = a op b element-wise, dividing by postdiv for WEFT_AVG (reduce.h).
   * `a` and `dst` are in this memory; `b` may be host memory (a receive slot). */
  void (*reduce)(void *dst, const void *a, const void *b, size_t count, weft_dtype dtype,
                 weft_op op, int postdiv);
  /* dst = src / postdiv for WEFT_AVG, else a copy (nothing when dst == src). */
  void (*finish)(void *dst, const void *src, size_t count, weft_dtype dtype, weft_op op,
                 int postdiv);
  /* buf[i] *= factor in place (gradient pre/post-division): floats computed
   * in float (double for f64) and rounded once; integers through double,
   * truncated toward zero. */
  void (*scale)(void *buf, size_t count, weft_dtype dtype, double factor);
  /* `bytes` of zero-filled memory of this kind (owned gradient buckets), or
   * NULL; freed with release (NULL is a no-op). */
  void *(*alloc)(size_t bytes);
  void (*release)(void *ptr);
} weft_mem_ops;

/* The table for the memory holding `ptr` (host for every pointer today). */
const weft_mem_ops *weft_mem_for(const void *ptr);

/* The table of a memory kind, or NULL when this build has none for it. */
const weft_mem_ops *weft_mem_by_kind(weft_mem_kind kind);

extern const weft_mem_ops weft_mem_host;

#endif
