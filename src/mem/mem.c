/* mem.c - the host memory table. */
#include "src/mem/mem.h"

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/half.h"
#include "src/mem/reduce.h"
#include "src/mem/shared_mem.h"
#ifdef WEFT_HAVE_CUDA
#include "src/cuda/cuda_mem.h"
#endif

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

/* The wire kernels (reduce.c) take floats; the table takes any memory. */
static void host_narrow(void *dst, const void *src, size_t count, weft_dtype wire) {
  weft_wire_narrow(dst, src, count, wire);
}

static void host_widen(void *dst, const void *src, size_t count, weft_dtype wire) {
  weft_wire_widen(dst, src, count, wire);
}

static void host_reduce_wire(void *dst, const void *a, const void *b, size_t count,
                             weft_dtype wire, weft_op op, int postdiv, void *stage) {
  weft_wire_reduce(dst, a, b, count, wire, op, postdiv, stage);
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

/* ---- the asynchronous members: host memory does the work at once ---- */

static weft_status host_stream_create(weft_mem_stream **stream, void *errors) {
  (void)errors;
  *stream = NULL;
  return WEFT_OK;
}

static void host_stream_destroy(weft_mem_stream *stream) { (void)stream; }

static weft_status host_stream_after_user(weft_mem_stream *stream, void *user_stream) {
  (void)stream;
  (void)user_stream;
  return WEFT_OK;
}

static weft_status host_user_wait_signal(void *user_stream, weft_mem_stream *stream, uint32_t value) {
  (void)stream;
  (void)user_stream;
  (void)value;
  return WEFT_OK;
}

static weft_status host_signal(weft_mem_stream *stream, uint32_t value) {
  (void)stream;
  (void)value;
  return WEFT_OK;
}

/* The host's direct allreduce sums in pieces that stay in L1 (direct_
 * allreduce.c); no one-pass form here. */
static weft_status host_reduce_all_async(void *const *outs, const void *const *ins, int n,
                                         size_t count, weft_dtype dtype, weft_op op, int postdiv,
                                         weft_mem_stream *stream, weft_mem_token *token) {
  (void)outs, (void)ins, (void)n, (void)count, (void)dtype, (void)op, (void)postdiv, (void)stream;
  *token = 0;
  return WEFT_ERR_UNSUPPORTED;
}

static weft_status host_record(weft_mem_stream *stream, weft_mem_token *token) {
  (void)stream;
  *token = 0;
  return WEFT_OK;
}

static weft_status host_poll(weft_mem_stream *stream, weft_mem_token token) {
  (void)stream;
  (void)token;
  return WEFT_OK;
}

static weft_status host_copy_async(void *dst, const void *src, size_t bytes,
                                   weft_mem_stream *stream, weft_mem_token *token) {
  (void)stream;
  host_copy(dst, src, bytes);
  *token = 0;
  return WEFT_OK;
}

static weft_status host_reduce_async(void *dst, const void *a, const void *b, size_t count,
                                     weft_dtype dtype, weft_op op, int postdiv,
                                     weft_mem_stream *stream, weft_mem_token *token) {
  (void)stream;
  weft_reduce_kernel(dst, a, b, count, dtype, op, postdiv);
  *token = 0;
  return WEFT_OK;
}

/* Host memory is host memory: both directions are a copy. */
static weft_status host_copy_between(void *dst, const void *src, size_t bytes,
                                     weft_mem_stream *stream, weft_mem_token *token) {
  return host_copy_async(dst, src, bytes, stream, token);
}

/* Slots are filled by the wire before they are read: no clearing, and
 * untouched pages cost nothing until a chunk lands there. */
static void *host_alloc_slots(size_t bytes) {
  void *p = NULL;
  size_t len = (bytes + 4095) & ~(size_t)4095;
  return posix_memalign(&p, 4096, len ? len : 4096) ? NULL : p;
}

static void host_free_slots(void *ptr, size_t bytes) {
  (void)bytes;
  free(ptr);
}

static void *host_alloc_scratch(size_t bytes) { return malloc(bytes ? bytes : 1); }

static void host_free_scratch(void *ptr) { free(ptr); }

static weft_status host_map_peer(const weft_mem_desc *desc, void **base, void **local,
                                 void *errors) {
  (void)desc, (void)errors;
  *base = *local = NULL;
  return WEFT_ERR_UNSUPPORTED; /* SHARED memory is the transport's to map (shm) */
}

static void host_unmap_peer(void *base) {
  (void)base;
}

/* ---- a gradient set's work: done at once on host memory ---- */

static void *host_pieces_create(const void *bucket, const weft_mem_piece *pieces, int n) {
  (void)bucket;
  weft_mem_piece *t = malloc(sizeof *t * (size_t)(n > 0 ? n : 1));
  if (t && n > 0) memcpy(t, pieces, sizeof *t * (size_t)n);
  return t;
}

static void host_pieces_destroy(void *table) { free(table); }

static weft_status host_pieces_move(void *bucket, const void *table, int n, size_t most,
                                    weft_dtype dtype, double factor, bool to_bucket, void *user_stream,
                                    void *errors) {
  (void)most, (void)user_stream, (void)errors;
  const weft_mem_piece *p = table;
  size_t esz = weft_dtype_size(dtype);
  for (int i = 0; i < n; i++) {
    char *in_bucket = (char *)bucket + p[i].offset * esz;
    void *dst = to_bucket ? in_bucket : p[i].tensor;
    memcpy(dst, to_bucket ? p[i].tensor : in_bucket, p[i].count * esz);
    if (factor != 1.0) host_scale(dst, p[i].count, dtype, factor);
  }
  return WEFT_OK;
}

static weft_status host_scale_on(void *buf, size_t count, weft_dtype dtype, double factor,
                                 void *user_stream, void *errors) {
  (void)user_stream, (void)errors;
  host_scale(buf, count, dtype, factor);
  return WEFT_OK;
}

static weft_status host_mark_create(const void *near, void **mark, void *errors) {
  (void)near, (void)errors;
  *mark = NULL;
  return WEFT_OK;
}

static void host_mark_destroy(void *mark) { (void)mark; }

static weft_status host_mark_record(void *mark, void *user_stream, void *errors) {
  (void)mark, (void)user_stream, (void)errors;
  return WEFT_OK;
}

static weft_status host_mark_poll(void *mark, void *errors) {
  (void)mark, (void)errors;
  return WEFT_OK;
}

static void *host_alloc_on(int device, size_t bytes) {
  (void)device;
  return host_alloc_scratch(bytes);
}

static bool host_range_of(const void *buf, size_t bytes, weft_mem_range *out) {
  (void)buf, (void)bytes, (void)out;
  return false;
}

static weft_status host_export_dmabuf(const weft_mem_range *range, int *fd, void *errors) {
  (void)range, (void)errors;
  *fd = -1;
  return WEFT_ERR_UNSUPPORTED;
}

static bool host_dmabuf_supported(int device, char *why, size_t why_len) {
  (void)device;
  if (why && why_len) snprintf(why, why_len, "host memory is not exported");
  return false;
}

const weft_mem_ops weft_mem_host = {
    .kind = WEFT_MEMORY_HOST,
    .name = "host",
    .copy = host_copy,
    .reduce = weft_reduce_kernel,
    .finish = weft_reduce_finish,
    .scale = host_scale,
    .narrow = host_narrow,
    .widen = host_widen,
    .reduce_wire = host_reduce_wire,
    .alloc = host_alloc,
    .release = host_release,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_after_user = host_stream_after_user,
    .user_wait_signal = host_user_wait_signal,
    .signal = host_signal,
    .record = host_record,
    .poll = host_poll,
    .copy_async = host_copy_async,
    .reduce_async = host_reduce_async,
    .reduce_all_async = host_reduce_all_async,
    .copy_to_host = host_copy_between,
    .copy_from_host = host_copy_between,
    .alloc_slots = host_alloc_slots,
    .free_slots = host_free_slots,
    .alloc_scratch = host_alloc_scratch,
    .free_scratch = host_free_scratch,
    .alloc_on = host_alloc_on,
    .describe = weft_shared_mem_describe,
    .map_peer = host_map_peer,
    .unmap_peer = host_unmap_peer,
    .range_of = host_range_of,
    .export_dmabuf = host_export_dmabuf,
    .dmabuf_supported = host_dmabuf_supported,
    .pieces_create = host_pieces_create,
    .pieces_destroy = host_pieces_destroy,
    .pieces_move = host_pieces_move,
    .scale_on = host_scale_on,
    .mark_create = host_mark_create,
    .mark_destroy = host_mark_destroy,
    .mark_record = host_mark_record,
    .mark_poll = host_mark_poll,
};

void weft_mem_thread_enter(void) {
#ifdef WEFT_HAVE_CUDA
  weft_cuda_thread_enter();
#endif
}

void weft_mem_thread_restore(void) {
#ifdef WEFT_HAVE_CUDA
  weft_cuda_thread_restore();
#endif
}

weft_memory weft_mem_kind_of(const void *ptr, int *device) {
#ifdef WEFT_HAVE_CUDA
  return weft_cuda_pointer_kind(ptr, device);
#else
  (void)ptr, (void)device;
  return WEFT_MEMORY_HOST;
#endif
}

const weft_mem_ops *weft_mem_for(const void *ptr) {
#ifdef WEFT_HAVE_CUDA
  if (weft_cuda_pointer_kind(ptr, NULL) == WEFT_MEMORY_DEVICE) return &weft_mem_device;
#else
  (void)ptr;
#endif
  return &weft_mem_host;
}

/* Shared memory is host memory to the processor: the same table. */
const weft_mem_ops *weft_mem_by_kind(weft_memory kind) {
  if (kind == WEFT_MEMORY_HOST || kind == WEFT_MEMORY_SHARED) return &weft_mem_host;
#ifdef WEFT_HAVE_CUDA
  if (kind == WEFT_MEMORY_DEVICE && weft_cuda_usable(NULL, 0)) return &weft_mem_device;
#endif
  return NULL;
}
