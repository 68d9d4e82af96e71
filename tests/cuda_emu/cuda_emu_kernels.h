/* cuda_emu_kernels.h - the kernels the CUDA stand-in (cuda_emu.c) can run:
 * a table of host implementations that cuModuleGetFunction looks up by name
 * and cuLaunchKernel queues. Each entry carries the kernel's parameter
 * layout, because the driver copies the parameter values at launch: a
 * pointer to a stack variable that changes after cuLaunchKernel must not
 * change what the kernel sees. Add a kernel: write its host version in
 * cuda_emu_kernels.c, touching memory only through cuda_emu_span, and add
 * a row to cuda_emu_kernels[]. */
#ifndef WEFT_CUDA_EMU_KERNELS_H
#define WEFT_CUDA_EMU_KERNELS_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>

#define CUDA_EMU_MAX_PARAMS 16

/* One launch as its kernel sees it: the grid and block as given to
 * cuLaunchKernel (a kernel covers exactly the elements its threads would:
 * one without a grid-stride loop leaves the rest untouched when the grid is
 * too small), and the context it runs in (opaque). */
typedef struct cuda_emu_launch {
  unsigned int grid[3], block[3];
  unsigned int shared_bytes;
  int device;
  const void *ctx;
} cuda_emu_launch;

/* The bytes [ptr, ptr + bytes) as this launch's device may touch them: the
 * stand-in's read-write alias of a live allocation of that device, of a peer
 * buffer opened by IPC, or pinned host memory. NULL for anything else
 * (freed, past the end of the allocation, another device's memory without
 * peer access, pageable host memory): the kernel then returns
 * CUDA_ERROR_ILLEGAL_ADDRESS, which the context keeps, as a GPU does. */
void *cuda_emu_span(const cuda_emu_launch *launch, CUdeviceptr ptr, size_t bytes);

typedef struct cuda_emu_param {
  size_t size, align; /* the C type's sizeof and _Alignof; {0, 0} ends the list */
} cuda_emu_param;
#define CUDA_EMU_PARAM(type) \
  { sizeof(type), _Alignof(type) }

typedef struct cuda_emu_kernel {
  const char *name; /* the kernel's (extern "C") name in the fatbin */
  /* params[i] points to a copy of the i-th parameter's value, made at launch */
  CUresult (*run)(const cuda_emu_launch *launch, void **params);
  /* a test-only kernel that holds its stream: its first parameter, a
   * double, is how many seconds it runs once it reaches the head of its
   * stream (other streams go on meanwhile), as a long kernel does */
  bool holds;
  cuda_emu_param params[CUDA_EMU_MAX_PARAMS];
} cuda_emu_kernel;

extern const cuda_emu_kernel cuda_emu_kernels[];
extern const size_t cuda_emu_kernel_count;

#endif
