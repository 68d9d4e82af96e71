/* cuda_emu.h - what the CUDA stand-in (libweft_cuda_emu.so, tests only)
 * reports about this process, so tests can check that weft gives back every
 * buffer, stream, event, IPC mapping and dma-buf descriptor it took (at
 * weft_comm_destroy, after a failure). Look it up with dlsym("weft_cuda_emu_counts") in the library
 * WEFT_CUDA_LIBRARY names. */
#ifndef WEFT_CUDA_EMU_H
#define WEFT_CUDA_EMU_H

typedef struct weft_cuda_emu_counters {
  int allocations;      /* cuMemAlloc not yet freed */
  int host_allocations; /* cuMemHostAlloc not yet freed, cuMemHostRegister not yet undone */
  int streams;          /* cuStreamCreate not yet destroyed */
  int events;           /* cuEventCreate not yet destroyed */
  int modules;          /* cuModuleLoadData not yet unloaded */
  int ipc_mappings;     /* cuIpcOpenMemHandle not yet closed, each open counted */
  int pending;          /* queued operations not yet executed, every stream */
  int primary_refs;     /* cuDevicePrimaryCtxRetain not yet released, every device */
  int reclaimed;        /* of the above, freed by a primary context's reset, not by their owner */
  int ipc_opened;       /* cuIpcOpenMemHandle that succeeded, ever */
  int ipc_exported;     /* cuIpcGetMemHandle that succeeded, ever */
  int dmabuf_exported;  /* cuMemGetHandleForAddressRange (a dma-buf) that succeeded, ever */
  int dmabuf_open;      /* of those descriptors, how many are still open in this process
                           (the same file behind the number, checked when counted) */
  /* bytes the copies between host and device memory moved, ever (what
   * staging costs; GPUDirect RDMA moves none for a device collective) */
  long long htod_bytes, dtoh_bytes;
} weft_cuda_emu_counters;

typedef void (*weft_cuda_emu_counts_fn)(weft_cuda_emu_counters *out);

/* Settings (read at cuInit):
 *   WEFT_CUDA_EMU_DEVICES  devices, default 1, at most 16; 0: cuInit answers
 *                          CUDA_ERROR_NO_DEVICE and cuDeviceGetCount 0
 *   WEFT_CUDA_EMU_SEED     the seed of the order queued work runs in (default 1)
 *   WEFT_CUDA_EMU_MEMORY   bytes of device memory per device (default 4 GiB)
 *   WEFT_CUDA_EMU_IPC      0: cuIpcOpenMemHandle refuses every handle
 *                          (CUDA_ERROR_PEER_ACCESS_UNSUPPORTED), as between
 *                          GPUs that cannot reach each other
 *   WEFT_CUDA_EMU_LEGACY_IPC  0: device memory as cuMemCreate makes it
 *                          (PyTorch's expandable segments): no legacy IPC
 *                          handle, cuIpcGetMemHandle answers
 *                          CUDA_ERROR_NOT_SUPPORTED
 *   WEFT_CUDA_EMU_DMABUF   0: no dma-buf export (a driver or kernel without
 *                          it): cuMemGetHandleForAddressRange answers
 *                          CUDA_ERROR_NOT_SUPPORTED for every
 *                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, and
 *                          CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED says 0
 *   WEFT_CUDA_EMU_REPORT   a file each process appends its counters to at
 *                          exit ("pid P ipc_opened N ipc_exported N
 *                          ipc_mappings M allocations A host_allocations H
 *                          primary_refs R dmabuf_exported D dmabuf_open O")
 *   WEFT_CUDA_EMU_KERNEL_FAULT  N: the Nth kernel this process runs (from 1)
 *                          faults with CUDA_ERROR_ILLEGAL_ADDRESS, as a kernel
 *                          reading a bad address on a GPU; with
 *   WEFT_CUDA_EMU_FAULT_RANK    only in the process whose WEFT_RANK is this
 *   WEFT_CUDA_EMU_HANG_S   a synchronize that saw nothing run for this long
 *                          (default 60 s; a cuStreamWaitValue32 whose word is
 *                          never written) prints the stuck waits and aborts,
 *                          where a GPU would hang for good
 *
 * Test-only kernels (by name from any module): weft_emu_test_add_f32, and
 * weft_emu_test_spin(double seconds), which holds its stream that long once
 * it reaches the head, as a long kernel does, while other streams go on.
 *
 * Contexts of a process's own: cuCtxCreate (CUDA 13's cuCtxCreate_v4) and
 * cuCtxDestroy, each with its own legacy (NULL) stream; an event recorded
 * on a stream of another context is refused (CUDA_ERROR_INVALID_HANDLE).
 *
 * Virtual memory management, as PyTorch's expandable segments use it:
 * cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
 * cuMemRelease, cuMemAddressFree, cuMemGetAllocationGranularity (a page).
 * Mapped memory has no legacy IPC handle, and an address unmapped may be
 * mapped again to other memory.
 *
 * GPUDirect RDMA: cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
 * gives a new descriptor (O_RDWR | O_CLOEXEC) of the allocation's memory,
 * byte 0 at dptr, which must be the base of a live cuMemAlloc allocation;
 * size a nonzero multiple of the host page size, at most the allocation
 * rounded up to whole pages; flags 0 (else CUDA_ERROR_INVALID_VALUE, as for
 * an inner address or another handle type). cuMemMap'd memory and pinned
 * host memory: CUDA_ERROR_NOT_SUPPORTED. Attributes: GPU_DIRECT_RDMA_SUPPORTED
 * 1, DMA_BUF_SUPPORTED 1 (0 with WEFT_CUDA_EMU_DMABUF=0),
 * GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS 0 (no cuFlushGPUDirectRDMAWrites),
 * GPU_DIRECT_RDMA_WRITES_ORDERING 0 (NONE), GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
 * 0, HOST_ALLOC_DMA_BUF_SUPPORTED 0. cuMemFree with such a descriptor still
 * open is allowed (the memory lives on behind the descriptor, as a dma-buf
 * holds a reference); only the device address goes.
 *
 * Undefined uses abort the process naming the call: cuMemFree of memory
 * exported with cuIpcGetMemHandle while another process still has it open
 * (cuIpcOpenMemHandle without cuIpcCloseMemHandle yet).
 */

#endif
