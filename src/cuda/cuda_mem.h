/* cuda_mem.h - device memory through the CUDA driver table (cuda_api.h):
 * what a pointer is, the communicator's stream with its completion tokens
 * (src/mem/mem.h says how the engine uses them), copies between device and
 * pinned host memory, and pinned staging. Built only with CUDA
 * (WEFT_HAVE_CUDA); src/mem/mem.c asks it which table a pointer takes. */
#ifndef WEFT_CUDA_MEM_H
#define WEFT_CUDA_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include "src/mem/mem.h"

/* The device table (kind WEFT_MEMORY_DEVICE). */
extern const weft_mem_ops weft_mem_device;

/* What `ptr` is: WEFT_MEMORY_DEVICE (and *ordinal, the device) for memory
 * of a GPU, WEFT_MEMORY_HOST for anything else (pinned host memory is host
 * memory to the processor). Without a usable driver every pointer is host
 * memory: no device pointer can exist there. Costs one driver call once the
 * driver is loaded, nothing (a load of a flag) before. */
weft_memory weft_cuda_pointer_kind(const void *ptr, int *ordinal);

/* The stream of one communicator on device `ordinal` (its primary
 * context), and its end: waits for what it queued, frees its events.
 * Errors of its work are worded into `errors` (a weft_error_sink). */
weft_status weft_cuda_stream_create(int ordinal, weft_mem_stream **stream, void *errors);
void weft_cuda_stream_destroy(weft_mem_stream *stream);
/* Makes the stream's signal word now (user_wait_signal makes it on first
 * use), so that the signals of calls whose user streams wait only later
 * (a gradient set's buckets) are written from the first. */
weft_status weft_cuda_signal_prepare(weft_mem_stream *stream);

/* Pinned host memory that the ranks of this host can map: a weft_mem_alloc
 * allocation (a memfd, WEFT_MEMORY_SHARED) page-locked for the GPUs'
 * copies. Staged device buffers in it are read by peers where they lie
 * (the direct allreduce of shared buffers), with no copy through the shm
 * transport's slots: the staging between GPUs that cannot reach each
 * other. NULL when either step fails (the caller stages in ordinary pinned
 * memory then). */
void *weft_cuda_alloc_shared_pinned(size_t bytes);
void weft_cuda_free_shared_pinned(void *ptr);

/* Whether the calling thread's CUDA context, as the current weft call
 * found it, is one of the process's own (cuCtxCreate's) rather than none or
 * a device's primary context (GPU `ordinal`'s is asked first), the kind
 * weft works in (the runtime API's and PyTorch's): a NULL stream there is
 * that context's legacy stream, which weft cannot order its work after. */
bool weft_cuda_caller_context_foreign(int ordinal);

/* Whether peers can map `buf` by a legacy IPC handle: false for device
 * memory from cuMemCreate (PyTorch's expandable segments, cudaMallocAsync
 * pools), true for cuMemAlloc's and for anything that is not device memory.
 * One driver call. */
bool weft_cuda_ipc_exportable(const void *buf);

/* Device memory on GPU `ordinal` (cuMemAlloc: peers can map it by its IPC
 * handle), whatever context is current; NULL with the reason logged.
 * Freed with weft_mem_device.free_scratch. */
void *weft_cuda_alloc_on(int ordinal, size_t bytes);

/* The synchronous members (copy, reduce, finish, ...) of the device table
 * run on `stream` on this thread until weft_cuda_sync_end, which returns the
 * first error they met (worded into the stream's sink) or WEFT_OK. Outside
 * such a bracket they run on the legacy default stream and only log an
 * error. An algorithm on device buffers over the device channel runs in
 * one (src/coll/coll_device.c). */
void weft_cuda_sync_begin(weft_mem_stream *stream);
weft_status weft_cuda_sync_end(void);

/* The CUDA context that was current on this thread before weft switched
 * it (to a buffer's device's primary context) goes back; nothing where
 * weft switched none. Called as a public entry point returns. */
void weft_cuda_thread_restore(void);
/* As a public entry point starts: what an earlier switch outside any call
 * remembered is forgotten, so the restore brings back this call's caller's. */
void weft_cuda_thread_enter(void);

/* Whether this build has its kernels (nvcc at build time): without them
 * device buffers are always staged, reduced on the host. */
static inline bool weft_cuda_has_kernels(void) {
#ifdef WEFT_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

/* Whether the driver is loaded and has a device, with the reason in `why`
 * either way (weft-info). Loads the driver on first use. */
bool weft_cuda_usable(char *why, size_t why_len);

#endif
