// kernels.cu - the reductions on device memory: every dtype x op, the avg's
// division, scale and f32 on the wire, one element step each from
// src/mem/reduce_ops.h (the header the host tests prove equal to the host's
// kernels). Grid-stride loops; every parameter a plain value, as the driver
// API's cuLaunchKernel passes them (kernels.h lists the names and layouts).
#include <stddef.h>
#include <stdint.h>

#include "src/cuda/kernels.h"
#include "src/mem/reduce_ops.h"

#define WEFT_GRID_STRIDE(i, n)                                                  \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

#define WEFT_KERNELS(X, T)                                                      \
  extern "C" __global__ void weft_k_reduce_##X(T *dst, const T *a, const T *b, \
                                               size_t n, int op, int postdiv) { \
    WEFT_GRID_STRIDE(i, n) dst[i] = weft_op_##X(a[i], b[i], op, postdiv);       \
  }                                                                             \
  extern "C" __global__ void weft_k_finish_##X(T *dst, const T *src, size_t n,  \
                                               int postdiv) {                   \
    WEFT_GRID_STRIDE(i, n) dst[i] = weft_op_##X##_finish(src[i], postdiv);      \
  }                                                                             \
  extern "C" __global__ void weft_k_scale_##X(T *buf, size_t n, double factor) { \
    WEFT_GRID_STRIDE(i, n) buf[i] = weft_scale_##X(buf[i], factor);             \
  }

// The direct allreduce's slice in one pass (kernels.h, weft_k_direct_X):
// each element of every member's input read once, the result stored into
// every member's output, 16 bytes at a time where all pointers allow. One
// thread owns an element (or a 16-byte group) and reads all of it before it
// writes, so in place (out[p] == in[p]) is safe.
#define WEFT_DIRECT_KERNEL(X, T)                                                          \
  extern "C" __global__ void weft_k_direct_##X(weft_k_members m, int n, size_t count,     \
                                               int op, int postdiv, int vec16) {         \
    const size_t lanes = 16 / sizeof(T);                                                  \
    const size_t groups = vec16 ? count / lanes : 0;                                      \
    WEFT_GRID_STRIDE(g, groups) {                                                         \
      T v[WEFT_K_MEMBERS][16 / sizeof(T)];                                                \
      for (int p = 0; p < n; p++) {                                                       \
        uint4 w = ((const uint4 *)(uintptr_t)m.in[p])[g];                                 \
        memcpy(v[p], &w, 16);                                                             \
      }                                                                                   \
      T r[16 / sizeof(T)];                                                                \
      for (size_t l = 0; l < lanes; l++) {                                                \
        T e[WEFT_K_MEMBERS];                                                              \
        for (int p = 0; p < n; p++) e[p] = v[p][l];                                       \
        r[l] = weft_op_##X##_all(e, n, op, postdiv);                                      \
      }                                                                                   \
      uint4 w;                                                                            \
      memcpy(&w, r, 16);                                                                  \
      for (int p = 0; p < n; p++) ((uint4 *)(uintptr_t)m.out[p])[g] = w;                  \
    }                                                                                     \
    WEFT_GRID_STRIDE(j, count - groups * lanes) {                                         \
      size_t i = groups * lanes + j;                                                      \
      T e[WEFT_K_MEMBERS];                                                                \
      for (int p = 0; p < n; p++) e[p] = ((const T *)(uintptr_t)m.in[p])[i];              \
      T r = weft_op_##X##_all(e, n, op, postdiv);                                         \
      for (int p = 0; p < n; p++) ((T *)(uintptr_t)m.out[p])[i] = r;                      \
    }                                                                                     \
  }

// A bucket's pack or unpack (kernels.h, weft_k_pieces_X): blocks along y
// take pieces, along x elements; factor 1.0 moves the bits as they are (a
// NaN's payload too), as the host's memcpy does.
#define WEFT_PIECES_KERNEL(X, T)                                                          \
  extern "C" __global__ void weft_k_pieces_##X(T *bucket, const weft_k_piece *pieces,     \
                                               int n, double factor, int to_bucket) {     \
    for (int p = blockIdx.y; p < n; p += gridDim.y) {                                     \
      T *t = (T *)(uintptr_t)pieces[p].tensor;                                            \
      T *b = bucket + pieces[p].offset;                                                   \
      T *dst = to_bucket ? b : t;                                                         \
      const T *src = to_bucket ? t : b;                                                   \
      size_t count = pieces[p].count;                                                     \
      if (factor == 1.0) {                                                                \
        WEFT_GRID_STRIDE(i, count) dst[i] = src[i];                                       \
      } else {                                                                            \
        WEFT_GRID_STRIDE(i, count) dst[i] = weft_scale_##X(src[i], factor);               \
      }                                                                                   \
    }                                                                                     \
  }

WEFT_PIECES_KERNEL(f32, float)
WEFT_PIECES_KERNEL(f64, double)
WEFT_PIECES_KERNEL(f16, uint16_t)
WEFT_PIECES_KERNEL(bf16, uint16_t)
WEFT_PIECES_KERNEL(i8, int8_t)
WEFT_PIECES_KERNEL(u8, uint8_t)
WEFT_PIECES_KERNEL(i32, int32_t)
WEFT_PIECES_KERNEL(i64, int64_t)

WEFT_DIRECT_KERNEL(f32, float)
WEFT_DIRECT_KERNEL(f64, double)
WEFT_DIRECT_KERNEL(f16, uint16_t)
WEFT_DIRECT_KERNEL(bf16, uint16_t)
WEFT_DIRECT_KERNEL(i8, int8_t)
WEFT_DIRECT_KERNEL(u8, uint8_t)
WEFT_DIRECT_KERNEL(i32, int32_t)
WEFT_DIRECT_KERNEL(i64, int64_t)

WEFT_KERNELS(f32, float)
WEFT_KERNELS(f64, double)
WEFT_KERNELS(f16, uint16_t)
WEFT_KERNELS(bf16, uint16_t)
WEFT_KERNELS(i8, int8_t)
WEFT_KERNELS(u8, uint8_t)
WEFT_KERNELS(i32, int32_t)
WEFT_KERNELS(i64, int64_t)

extern "C" __global__ void weft_k_wire_narrow(uint16_t *dst, const float *src, size_t n,
                                              int wire) {
  WEFT_GRID_STRIDE(i, n) dst[i] = weft_wire_narrow_one(src[i], wire);
}

extern "C" __global__ void weft_k_wire_widen(float *dst, const uint16_t *src, size_t n, int wire) {
  WEFT_GRID_STRIDE(i, n) dst[i] = weft_wire_widen_one(src[i], wire);
}

// dst = a + widen(b) (divided for an avg); with a stage, the value rounded to
// the wire type goes there and dst keeps exactly that value (reduce.h)
extern "C" __global__ void weft_k_wire_reduce(float *dst, const float *a, const uint16_t *b,
                                              size_t n, int wire, int op, int postdiv,
                                              uint16_t *stage) {
  WEFT_GRID_STRIDE(i, n) {
    float v = weft_wire_reduce_one(a[i], b[i], wire, op, postdiv);
    if (stage) {
      uint16_t h = weft_wire_narrow_one(v, wire);
      stage[i] = h;
      v = weft_wire_widen_one(h, wire);
    }
    dst[i] = v;
  }
}
