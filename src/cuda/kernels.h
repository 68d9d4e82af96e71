/* kernels.h - the device kernels (kernels.cu), as host code launches them
 * through the driver (cuModuleGetFunction by name, cuLaunchKernel with one
 * pointer per parameter, in this order). X is a dtype's short name: f32 f64
 * f16 bf16 i8 u8 i32 i64; T its storage type.
 *   weft_k_reduce_X  (T *dst, const T *a, const T *b, size_t n, int op, int postdiv)
 *   weft_k_finish_X  (T *dst, const T *src, size_t n, int postdiv)
 *   weft_k_scale_X   (T *buf, size_t n, double factor)
 *   weft_k_direct_X  (weft_k_members m, int n, size_t count, int op, int postdiv,
 *                     int vec16)
 *       every out[p][i] = in[0][i] op ... op in[n-1][i] (weft_op_X_all), p < n
 *       <= WEFT_K_MEMBERS: the direct allreduce's slice in one pass, read once
 *       and stored n times; vec16: every pointer 16-byte aligned, 16-byte
 *       loads and stores (the rest of count element by element)
 *   weft_k_pieces_X  (T *bucket, const weft_k_piece *pieces, int n, double factor,
 *                     int to_bucket)
 *       a gradient bucket's pack (to_bucket: bucket[offset + i] = tensor[i]
 *       * factor) or unpack (tensor[i] = bucket[offset + i] * factor) of
 *       every piece in one launch: blockIdx.y walks the pieces, x the
 *       elements; factor 1.0 copies bit for bit
 *   weft_k_wire_narrow (uint16_t *dst, const float *src, size_t n, int wire)
 *   weft_k_wire_widen  (float *dst, const uint16_t *src, size_t n, int wire)
 *   weft_k_wire_reduce (float *dst, const float *a, const uint16_t *b, size_t n,
 *                       int wire, int op, int postdiv, uint16_t *stage)
 * The fatbin (sm_75, sm_80, sm_90 and compute_90 PTX) is embedded in the library
 * at build time where nvcc is found (WEFT_HAVE_CUDA_KERNELS). */
#ifndef WEFT_CUDA_KERNELS_H
#define WEFT_CUDA_KERNELS_H

#include <stddef.h>

#ifdef WEFT_HAVE_CUDA_KERNELS
extern const unsigned char weft_cuda_fatbin[];
extern const size_t weft_cuda_fatbin_len;
#endif

/* The members' buffers of a weft_k_direct_X launch, by value (device
 * addresses; unused entries 0). */
#define WEFT_K_MEMBERS 8
typedef struct weft_k_members {
  unsigned long long in[WEFT_K_MEMBERS], out[WEFT_K_MEMBERS];
} weft_k_members;

/* One piece of a weft_k_pieces_X launch, in device memory: a tensor's
 * address, its element offset in the bucket and its element count. */
typedef struct weft_k_piece {
  unsigned long long tensor, offset, count;
} weft_k_piece;

/* The short names, indexed by weft_dtype. */
#define WEFT_CUDA_DTYPE_NAMES {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"}

#endif
