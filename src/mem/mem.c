/* mem.c - the host memory table. */
#include "src/mem/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/half.h"
#include "src/mem/reduce.h"

static void host_copy(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src) memcpy(dst, src, bytes);
}

/* One pass per dtype; the loops vectorize (half.h is branch-free). */
static void host_scale(void *buf, size_t count, weft_dtype dtype, double factor) {
  float ff = (float)factor;
  switch (dtype) {
    case WEFT_F32: {
      float *p = buf;
      for (size_t i = 0; i < count; i++) p[i] *= ff;
      break;
    }
    case WEFT_F64: {
      double *p = buf;
      for (size_t i = 0; i < count; i++) p[i] *= factor;
      break;
    }
    case WEFT_F16: {
      uint16_t *p = buf;
      for (size_t i = 0; i < count; i++) p[i] = weft_float_to_f16(weft_f16_to_float(p[i]) * ff);
      break;
    }
    case WEFT_BF16: {
      uint16_t *p = buf;
      for (size_t i = 0; i < count; i++) p[i] = weft_float_to_bf16(weft_bf16_to_float(p[i]) * ff);
      break;
    }
#define WEFT_SCALE_INT_(dt, type)                                          \
  case dt: {                                                               \
    type *p = buf;                                                         \
    for (size_t i = 0; i < count; i++) p[i] = (type)((double)p[i] * factor); \
    break;                                                                 \
  }
      WEFT_SCALE_INT_(WEFT_I8, int8_t)
      WEFT_SCALE_INT_(WEFT_U8, uint8_t)
      WEFT_SCALE_INT_(WEFT_I32, int32_t)
      WEFT_SCALE_INT_(WEFT_I64, int64_t)
#undef WEFT_SCALE_INT_
    default: break;
  }
}

/* Page-aligned, so views handed to a framework suit any vector width. */
static void *host_alloc(size_t bytes) {
  void *p = NULL;
  size_t len = (bytes + 4095) & ~(size_t)4095;
  if (posix_memalign(&p, 4096, len ? len : 4096)) return NULL;
  memset(p, 0, len ? len : 4096);
  return p;
}

static void host_release(void *ptr) { free(ptr); }

const weft_mem_ops weft_mem_host = {
    .kind = WEFT_MEMORY_HOST,
    .name = "host",
    .copy = host_copy,
    .reduce = weft_reduce_kernel,
    .finish = weft_reduce_finish,
    .scale = host_scale,
    .alloc = host_alloc,
    .release = host_release,
};

const weft_mem_ops *weft_mem_for(const void *ptr) {
  (void)ptr; /* CUDA builds will ask the driver which memory holds ptr */
  return &weft_mem_host;
}

/* Shared memory is host memory to the processor: the same table. */
const weft_mem_ops *weft_mem_by_kind(weft_memory kind) {
  return kind == WEFT_MEMORY_HOST || kind == WEFT_MEMORY_SHARED ? &weft_mem_host : NULL;
}
