/* cuda_emu_kernels.c - host versions of the kernels the CUDA stand-in runs
 * (cuda_emu_kernels.h says how to add one). Each does what its threads
 * would do on the GPU, no more: the elements the launch's threads cover,
 * through cuda_emu_span, so a wrong grid or a wrong pointer shows. */
#include "cuda_emu_kernels.h"

#include <stdint.h>

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

const cuda_emu_kernel cuda_emu_kernels[] = {
    {.name = "weft_emu_test_add_f32",
     .run = test_add_f32,
     .params = {CUDA_EMU_PARAM(float *), CUDA_EMU_PARAM(const float *),
                CUDA_EMU_PARAM(const float *), CUDA_EMU_PARAM(size_t)}},
};
const size_t cuda_emu_kernel_count = sizeof cuda_emu_kernels / sizeof cuda_emu_kernels[0];
