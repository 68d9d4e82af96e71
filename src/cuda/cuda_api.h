/* cuda_api.h - every CUDA driver call weft makes, through one table filled at
 * run time by dlopen of libcuda.so.1 (or the file WEFT_CUDA_LIBRARY names:
 * the tests' stand-in, tests/cuda_emu), as the verbs table is
 * (transports/ibv/ibv_api.h). Nothing links CUDA: one build runs on a node
 * without a GPU or a driver and reports CUDA as unusable there. The types
 * are the driver API's own (cuda.h, from the toolkit at build time); the
 * members take the driver's versioned symbol names (cuMemAlloc_v2, ...), so
 * the table calls the ABI these prototypes describe. */
#ifndef WEFT_CUDA_API_H
#define WEFT_CUDA_API_H

#include <cuda.h>
#include <stddef.h>

#include "src/base/error_sink.h"

typedef struct weft_cuda_api {
  const char *library; /* the file that was opened */
  int driver_version;  /* cuDriverGetVersion: 13000 for CUDA 13.0 */

  /* the driver, devices, contexts */
  CUresult (*init)(unsigned int flags);                       /* cuInit */
  CUresult (*driver_get_version)(int *version);               /* cuDriverGetVersion */
  CUresult (*get_error_string)(CUresult error, const char **str); /* cuGetErrorString */
  CUresult (*get_error_name)(CUresult error, const char **str);   /* cuGetErrorName */
  CUresult (*device_get_count)(int *count);                   /* cuDeviceGetCount */
  CUresult (*device_get)(CUdevice *device, int ordinal);      /* cuDeviceGet */
  CUresult (*device_get_name)(char *name, int len, CUdevice device); /* cuDeviceGetName */
  CUresult (*device_get_attribute)(int *value, CUdevice_attribute attr,
                                   CUdevice device);          /* cuDeviceGetAttribute */
  CUresult (*device_get_pci_bus_id)(char *id, int len, CUdevice device); /* cuDeviceGetPCIBusId */
  CUresult (*device_can_access_peer)(int *can, CUdevice device,
                                     CUdevice peer);          /* cuDeviceCanAccessPeer */
  CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice device); /* cuDevicePrimaryCtxRetain */
  CUresult (*primary_ctx_release)(CUdevice device); /* cuDevicePrimaryCtxRelease_v2 */
  CUresult (*ctx_get_current)(CUcontext *ctx);      /* cuCtxGetCurrent */
  CUresult (*ctx_set_current)(CUcontext ctx);       /* cuCtxSetCurrent */

  /* what a pointer is (unified addressing): host, pinned host, device N */
  CUresult (*pointer_get_attributes)(unsigned int n, CUpointer_attribute *attrs, void **data,
                                     CUdeviceptr ptr); /* cuPointerGetAttributes */
  CUresult (*mem_get_address_range)(CUdeviceptr *base, size_t *size,
                                     CUdeviceptr ptr); /* cuMemGetAddressRange_v2 */

  /* memory */
  CUresult (*mem_alloc)(CUdeviceptr *ptr, size_t bytes);                /* cuMemAlloc_v2 */
  CUresult (*mem_free)(CUdeviceptr ptr);                                /* cuMemFree_v2 */
  CUresult (*mem_host_alloc)(void **ptr, size_t bytes, unsigned int flags); /* cuMemHostAlloc */
  CUresult (*mem_free_host)(void *ptr);                                 /* cuMemFreeHost */
  CUresult (*mem_host_register)(void *ptr, size_t bytes, unsigned int flags); /* cuMemHostRegister_v2 */
  CUresult (*mem_host_unregister)(void *ptr);                           /* cuMemHostUnregister */
  CUresult (*memset_d8_async)(CUdeviceptr dst, unsigned char value, size_t n,
                              CUstream stream); /* cuMemsetD8Async */
  CUresult (*memcpy_htod_async)(CUdeviceptr dst, const void *src, size_t bytes,
                                CUstream stream); /* cuMemcpyHtoDAsync_v2 */
  CUresult (*memcpy_dtoh_async)(void *dst, CUdeviceptr src, size_t bytes,
                                CUstream stream); /* cuMemcpyDtoHAsync_v2 */
  CUresult (*memcpy_dtod_async)(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                CUstream stream); /* cuMemcpyDtoDAsync_v2 */

  /* streams and events: the engine polls events, it never synchronizes a
   * stream per chunk (src/mem/mem.h) */
  CUresult (*stream_create)(CUstream *stream, unsigned int flags); /* cuStreamCreate */
  CUresult (*stream_destroy)(CUstream stream);                     /* cuStreamDestroy_v2 */
  CUresult (*stream_wait_event)(CUstream stream, CUevent event,
                                unsigned int flags);               /* cuStreamWaitEvent */
  CUresult (*stream_query)(CUstream stream);                       /* cuStreamQuery */
  CUresult (*stream_synchronize)(CUstream stream);                 /* cuStreamSynchronize */
  CUresult (*event_create)(CUevent *event, unsigned int flags);    /* cuEventCreate */
  CUresult (*event_destroy)(CUevent event);                        /* cuEventDestroy_v2 */
  CUresult (*event_record)(CUevent event, CUstream stream);        /* cuEventRecord */
  CUresult (*event_query)(CUevent event);                          /* cuEventQuery */
  CUresult (*event_synchronize)(CUevent event);                    /* cuEventSynchronize */
  /* stream memory operations: the user's stream waits at issue for a value
   * weft's stream writes once a call's result is in place (weft.h's stream
   * order for calls in flight); 32-bit, which every device supports */
  CUresult (*stream_wait_value32)(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                  unsigned int flags); /* cuStreamWaitValue32_v2 */
  CUresult (*stream_write_value32)(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                   unsigned int flags); /* cuStreamWriteValue32_v2 */

  /* the kernels: the fatbin embedded at build time (src/cuda/kernels.cu) */
  CUresult (*module_load_data)(CUmodule *module, const void *image);  /* cuModuleLoadData */
  CUresult (*module_unload)(CUmodule module);                         /* cuModuleUnload */
  CUresult (*module_get_function)(CUfunction *fn, CUmodule module,
                                  const char *name);                  /* cuModuleGetFunction */
  CUresult (*launch_kernel)(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,
                            unsigned int bx, unsigned int by, unsigned int bz,
                            unsigned int shared_bytes, CUstream stream, void **params,
                            void **extra); /* cuLaunchKernel */

  /* within a host: a peer's device buffer by its IPC handle */
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle *handle, CUdeviceptr ptr); /* cuIpcGetMemHandle */
  CUresult (*ipc_open_mem_handle)(CUdeviceptr *ptr, CUipcMemHandle handle,
                                  unsigned int flags); /* cuIpcOpenMemHandle_v2 */
  CUresult (*ipc_close_mem_handle)(CUdeviceptr ptr);   /* cuIpcCloseMemHandle */

  /* across hosts: an allocation as a dma-buf a NIC registers (GPUDirect
   * RDMA, ibv_reg_dmabuf_mr). Optional (CUDA >= 11.7 and a kernel with
   * dma-buf): NULL where the driver lacks it, and GPUDirect then goes by
   * nvidia-peermem or staging. */
  CUresult (*mem_get_handle_for_address_range)(void *handle, CUdeviceptr ptr, size_t size,
                                               CUmemRangeHandleType type,
                                               unsigned long long flags); /* cuMemGetHandleForAddressRange */
} weft_cuda_api;

/* The table for the library WEFT_CUDA_LIBRARY names (default libcuda.so.1),
 * loaded and initialized (cuInit) once per process. NULL with the reason in
 * `err` when there is no such library, a required symbol is missing, the
 * driver is older than the toolkit weft was built with, or cuInit fails (no
 * device: "CUDA_ERROR_NO_DEVICE"). Thread-safe. */
const weft_cuda_api *weft_cuda_api_load(weft_error_sink *err);

/* "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)": a driver
 * error in words, for the sentences that name the call, device and buffer. */
void weft_cuda_error_words(const weft_cuda_api *api, CUresult result, char *out, size_t len);

#endif
