/* cuda_emu_kernels.c - host versions of the kernels the CUDA stand-in runs
 * (cuda_emu_kernels.h says how to add one). Each does what its threads
 * would do on the GPU, no more: the elements the launch's threads cover,
 * through cuda_emu_span, so a wrong grid or a wrong pointer shows. */
#include "cuda_emu_kernels.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/cuda/kernels.h"
#include "src/mem/reduce_ops.h"

/* Threads along x: blockIdx.x * blockDim.x + threadIdx.x takes these values
 * (y and z repeat them). */
static uint64_t threads_x(const cuda_emu_launch *l) {
  return (uint64_t)l->grid[0] * l->block[0];
}

/* dst[i] = a[i] + b[i] for i = blockIdx.x * blockDim.x + threadIdx.x < n:
 * one thread per element, no grid-stride loop. */
static CUresult test_add_f32(const cuda_emu_launch *l, void **params) {
  CUdeviceptr dst = *(CUdeviceptr *)params[0];
  CUdeviceptr a = *(CUdeviceptr *)params[1];
  CUdeviceptr b = *(CUdeviceptr *)params[2];
  size_t n = *(size_t *)params[3];
  uint64_t covered = threads_x(l) < n ? threads_x(l) : n;
  if (!covered) return CUDA_SUCCESS;
  size_t bytes = covered * sizeof(float);
  float *d = cuda_emu_span(l, dst, bytes);
  const float *x = cuda_emu_span(l, a, bytes);
  const float *y = cuda_emu_span(l, b, bytes);
  if (!d || !x || !y) return CUDA_ERROR_ILLEGAL_ADDRESS;
  for (uint64_t i = 0; i < covered; i++) d[i] = x[i] + y[i];
  return CUDA_SUCCESS;
}

/* weft_emu_test_spin(double seconds): does nothing, for that long (the
 * stand-in holds its stream: cuda_emu_kernel.holds) */
static CUresult test_spin(const cuda_emu_launch *l, void **params) {
  (void)l, (void)params;
  return CUDA_SUCCESS;
}

/* ---- weft's kernels (src/cuda/kernels.cu): grid-stride loops over n, so
 * every element is covered whatever the grid; the same element steps ---- */

#define EMU_SPAN(var, T, ptr, n)                                  \
  T *var = (n) ? cuda_emu_span(l, (ptr), (n) * sizeof(T)) : NULL; \
  if ((n) && !var) return CUDA_ERROR_ILLEGAL_ADDRESS;

#define EMU_KERNELS(X, T)                                                       \
  static CUresult emu_reduce_##X(const cuda_emu_launch *l, void **p) {          \
    size_t n = *(size_t *)p[3];                                                 \
    EMU_SPAN(d, T, *(CUdeviceptr *)p[0], n)                                     \
    EMU_SPAN(a, const T, *(CUdeviceptr *)p[1], n)                               \
    EMU_SPAN(b, const T, *(CUdeviceptr *)p[2], n)                               \
    int op = *(int *)p[4], postdiv = *(int *)p[5];                              \
    for (size_t i = 0; i < n; i++) d[i] = weft_op_##X(a[i], b[i], op, postdiv); \
    return CUDA_SUCCESS;                                                        \
  }                                                                             \
  static CUresult emu_finish_##X(const cuda_emu_launch *l, void **p) {          \
    size_t n = *(size_t *)p[2];                                                 \
    EMU_SPAN(d, T, *(CUdeviceptr *)p[0], n)                                     \
    EMU_SPAN(s, const T, *(CUdeviceptr *)p[1], n)                               \
    int postdiv = *(int *)p[3];                                                 \
    for (size_t i = 0; i < n; i++) d[i] = weft_op_##X##_finish(s[i], postdiv);  \
    return CUDA_SUCCESS;                                                        \
  }                                                                             \
  static CUresult emu_scale_##X(const cuda_emu_launch *l, void **p) {           \
    size_t n = *(size_t *)p[1];                                                 \
    EMU_SPAN(b, T, *(CUdeviceptr *)p[0], n)                                     \
    double f = *(double *)p[2];                                                 \
    for (size_t i = 0; i < n; i++) b[i] = weft_scale_##X(b[i], f);              \
    return CUDA_SUCCESS;                                                        \
  }

/* The direct kernels' running sum, kept from launch to launch (a fresh
 * buffer per launch costs its page faults, as much as the sum itself):
 * kernels run one at a time, under the stand-in's lock. */
static void *emu_direct_acc(size_t bytes) {
  static void *acc;
  static size_t acc_bytes;
  if (bytes > acc_bytes) {
    void *grown = realloc(acc, bytes);
    if (!grown) return NULL;
    acc = grown;
    acc_bytes = bytes;
  }
  return acc;
}

/* weft_k_direct_X (kernels.h): the members' spans checked, then element by
 * element in weft_op_X_all's order; vec16 only changes how a GPU loads, but
 * it promises 16-byte aligned pointers, which is checked here. */
#define EMU_DIRECT(X, T)                                                                \
  static CUresult emu_direct_##X(const cuda_emu_launch *l, void **p) {                  \
    const weft_k_members *m = p[0];                                                     \
    int n = *(int *)p[1];                                                               \
    size_t count = *(size_t *)p[2];                                                     \
    int op = *(int *)p[3], postdiv = *(int *)p[4], vec16 = *(int *)p[5];                \
    if (n < 2 || n > WEFT_K_MEMBERS) return CUDA_ERROR_INVALID_VALUE;                   \
    const T *in[WEFT_K_MEMBERS];                                                        \
    T *out[WEFT_K_MEMBERS];                                                             \
    for (int k = 0; k < n; k++) {                                                       \
      if (vec16 && ((m->in[k] | m->out[k]) & 15)) return CUDA_ERROR_MISALIGNED_ADDRESS; \
      EMU_SPAN(i_, const T, (CUdeviceptr)m->in[k], count)                               \
      EMU_SPAN(o_, T, (CUdeviceptr)m->out[k], count)                                    \
      in[k] = i_, out[k] = o_;                                                          \
    }                                                                                   \
    /* weft_op_X_all's steps, one member at a time into a buffer of its own  \
     * (as fast on a CPU as the pairwise kernels and copies it replaces), then \
     * stored into every output: the same bits, whatever aliases what */       \
    T *acc = emu_direct_acc(count * sizeof(T));                                         \
    if (count && !acc) return CUDA_ERROR_OUT_OF_MEMORY;                                 \
    for (size_t i = 0; i < count; i++)                                                  \
      acc[i] = weft_op_##X(in[0][i], in[1][i], op, n == 2 ? postdiv : 1);               \
    for (int k = 2; k < n; k++)                                                         \
      for (size_t i = 0; i < count; i++)                                                \
        acc[i] = weft_op_##X(acc[i], in[k][i], op, k == n - 1 ? postdiv : 1);           \
    for (int k = 0; k < n; k++) memcpy(out[k], acc, count * sizeof(T));                 \
    return CUDA_SUCCESS;                                                                \
  }

EMU_DIRECT(f32, float)
EMU_DIRECT(f64, double)
EMU_DIRECT(f16, uint16_t)
EMU_DIRECT(bf16, uint16_t)
EMU_DIRECT(i8, int8_t)
EMU_DIRECT(u8, uint8_t)
EMU_DIRECT(i32, int32_t)
EMU_DIRECT(i64, int64_t)

EMU_KERNELS(f32, float)
EMU_KERNELS(f64, double)
EMU_KERNELS(f16, uint16_t)
EMU_KERNELS(bf16, uint16_t)
EMU_KERNELS(i8, int8_t)
EMU_KERNELS(u8, uint8_t)
EMU_KERNELS(i32, int32_t)
EMU_KERNELS(i64, int64_t)

/* weft_k_pieces_X (kernels.h): the piece table read from device memory,
 * then each piece's span on both sides; blockIdx.y and x loop, so every
 * piece and element is covered whatever the grid. */
#define EMU_PIECES(X, T)                                                                \
  static CUresult emu_pieces_##X(const cuda_emu_launch *l, void **p) {                  \
    CUdeviceptr bucket = *(CUdeviceptr *)p[0], table = *(CUdeviceptr *)p[1];            \
    int n = *(int *)p[2], to_bucket = *(int *)p[4];                                     \
    double factor = *(double *)p[3];                                                    \
    if (n <= 0) return CUDA_SUCCESS;                                                    \
    if (!l->grid[1]) return CUDA_ERROR_INVALID_VALUE;                                   \
    const weft_k_piece *pc = cuda_emu_span(l, table, (size_t)n * sizeof(weft_k_piece)); \
    if (!pc) return CUDA_ERROR_ILLEGAL_ADDRESS;                                         \
    for (int k = 0; k < n; k++) {                                                       \
      size_t count = pc[k].count;                                                       \
      EMU_SPAN(t, T, (CUdeviceptr)pc[k].tensor, count)                                  \
      EMU_SPAN(b, T, bucket + pc[k].offset * sizeof(T), count)                          \
      T *dst = to_bucket ? b : t;                                                       \
      const T *src = to_bucket ? t : b;                                                 \
      if (factor == 1.0)                                                                \
        memmove(dst, src, count * sizeof(T));                                           \
      else                                                                              \
        for (size_t i = 0; i < count; i++) dst[i] = weft_scale_##X(src[i], factor);     \
    }                                                                                   \
    return CUDA_SUCCESS;                                                                \
  }

EMU_PIECES(f32, float)
EMU_PIECES(f64, double)
EMU_PIECES(f16, uint16_t)
EMU_PIECES(bf16, uint16_t)
EMU_PIECES(i8, int8_t)
EMU_PIECES(u8, uint8_t)
EMU_PIECES(i32, int32_t)
EMU_PIECES(i64, int64_t)

static CUresult emu_wire_narrow(const cuda_emu_launch *l, void **p) {
  size_t n = *(size_t *)p[2];
  EMU_SPAN(d, uint16_t, *(CUdeviceptr *)p[0], n)
  EMU_SPAN(s, const float, *(CUdeviceptr *)p[1], n)
  int wire = *(int *)p[3];
  for (size_t i = 0; i < n; i++) d[i] = weft_wire_narrow_one(s[i], wire);
  return CUDA_SUCCESS;
}

static CUresult emu_wire_widen(const cuda_emu_launch *l, void **p) {
  size_t n = *(size_t *)p[2];
  EMU_SPAN(d, float, *(CUdeviceptr *)p[0], n)
  EMU_SPAN(s, const uint16_t, *(CUdeviceptr *)p[1], n)
  int wire = *(int *)p[3];
  for (size_t i = 0; i < n; i++) d[i] = weft_wire_widen_one(s[i], wire);
  return CUDA_SUCCESS;
}

static CUresult emu_wire_reduce(const cuda_emu_launch *l, void **p) {
  size_t n = *(size_t *)p[3];
  EMU_SPAN(d, float, *(CUdeviceptr *)p[0], n)
  EMU_SPAN(a, const float, *(CUdeviceptr *)p[1], n)
  EMU_SPAN(b, const uint16_t, *(CUdeviceptr *)p[2], n)
  int wire = *(int *)p[4], op = *(int *)p[5], postdiv = *(int *)p[6];
  CUdeviceptr stage_ptr = *(CUdeviceptr *)p[7];
  uint16_t *stage = NULL;
  if (stage_ptr && n && !(stage = cuda_emu_span(l, stage_ptr, n * sizeof(uint16_t))))
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  for (size_t i = 0; i < n; i++) {
    float v = weft_wire_reduce_one(a[i], b[i], wire, op, postdiv);
    if (stage) {
      stage[i] = weft_wire_narrow_one(v, wire);
      v = weft_wire_widen_one(stage[i], wire);
    }
    d[i] = v;
  }
  return CUDA_SUCCESS;
}

#define EMU_ROWS(X, T)                                                                    \
  {.name = "weft_k_reduce_" #X,                                                           \
   .run = emu_reduce_##X,                                                                 \
   .params = {CUDA_EMU_PARAM(T *), CUDA_EMU_PARAM(const T *), CUDA_EMU_PARAM(const T *),  \
              CUDA_EMU_PARAM(size_t), CUDA_EMU_PARAM(int), CUDA_EMU_PARAM(int)}},         \
      {.name = "weft_k_finish_" #X,                                                       \
       .run = emu_finish_##X,                                                             \
       .params = {CUDA_EMU_PARAM(T *), CUDA_EMU_PARAM(const T *), CUDA_EMU_PARAM(size_t), \
                  CUDA_EMU_PARAM(int)}},                                                  \
      {.name = "weft_k_scale_" #X,                                                        \
       .run = emu_scale_##X,                                                              \
       .params = {CUDA_EMU_PARAM(T *), CUDA_EMU_PARAM(size_t), CUDA_EMU_PARAM(double)}},  \
      {.name = "weft_k_direct_" #X,                                                       \
       .run = emu_direct_##X,                                                             \
       .params = {CUDA_EMU_PARAM(weft_k_members), CUDA_EMU_PARAM(int), CUDA_EMU_PARAM(size_t), \
                  CUDA_EMU_PARAM(int), CUDA_EMU_PARAM(int), CUDA_EMU_PARAM(int)}},              \
      {.name = "weft_k_pieces_" #X,                                                       \
       .run = emu_pieces_##X,                                                             \
       .params = {CUDA_EMU_PARAM(T *), CUDA_EMU_PARAM(const weft_k_piece *), CUDA_EMU_PARAM(int), \
                  CUDA_EMU_PARAM(double), CUDA_EMU_PARAM(int)}},

const cuda_emu_kernel cuda_emu_kernels[] = {
    EMU_ROWS(f32, float) EMU_ROWS(f64, double) EMU_ROWS(f16, uint16_t) EMU_ROWS(bf16, uint16_t)
        EMU_ROWS(i8, int8_t) EMU_ROWS(u8, uint8_t) EMU_ROWS(i32, int32_t) EMU_ROWS(i64, int64_t){
            .name = "weft_k_wire_narrow",
            .run = emu_wire_narrow,
            .params = {CUDA_EMU_PARAM(uint16_t *), CUDA_EMU_PARAM(const float *),
                       CUDA_EMU_PARAM(size_t), CUDA_EMU_PARAM(int)}},
    {.name = "weft_k_wire_widen",
     .run = emu_wire_widen,
     .params = {CUDA_EMU_PARAM(float *), CUDA_EMU_PARAM(const uint16_t *), CUDA_EMU_PARAM(size_t),
                CUDA_EMU_PARAM(int)}},
    {.name = "weft_k_wire_reduce",
     .run = emu_wire_reduce,
     .params = {CUDA_EMU_PARAM(float *), CUDA_EMU_PARAM(const float *),
                CUDA_EMU_PARAM(const uint16_t *), CUDA_EMU_PARAM(size_t), CUDA_EMU_PARAM(int),
                CUDA_EMU_PARAM(int), CUDA_EMU_PARAM(int), CUDA_EMU_PARAM(uint16_t *)}},
    {.name = "weft_emu_test_spin", .run = test_spin, .params = {CUDA_EMU_PARAM(double)}, .holds = true},
    {.name = "weft_emu_test_add_f32",
     .run = test_add_f32,
     .params = {CUDA_EMU_PARAM(float *), CUDA_EMU_PARAM(const float *),
                CUDA_EMU_PARAM(const float *), CUDA_EMU_PARAM(size_t)}},
};
const size_t cuda_emu_kernel_count = sizeof cuda_emu_kernels / sizeof cuda_emu_kernels[0];
