/* mem.h - the memory table: how the algorithms and transports copy and reduce
 * a buffer without assuming it is a host pointer. Host memory now; a CUDA
 * table (device copies, reduction kernels, IPC handles) plugs in beside it. */
#ifndef WEFT_MEM_H
#define WEFT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft.h"

/* Memory kinds are weft.h's weft_memory, one type for the public API, this
 * table and the transports. A set of kinds (what a transport can send from,
 * say) is a bitmask of WEFT_MEMORY_BIT. */
#define WEFT_MEMORY_BIT(kind) (1u << (unsigned)(kind))

/* A buffer as its owner describes it to a peer in a message, so the peer
 * can reach it (transport.h: register_mem, map_peer_mem). Fixed size, so it
 * fits in a message; versioned and tagged with its kind, so a receiver built
 * later or earlier refuses what it cannot read instead of misreading it.
 * The body is the kind's own layout, in the owner's byte order (only ranks
 * of one host exchange kinds that map memory):
 *  - WEFT_MEMORY_SHARED: weft_shared_key (shared_mem.h);
 *  - WEFT_MEMORY_DEVICE (issue 15): an IPC handle (64 bytes for CUDA's
 *    legacy cudaIpcMemHandle_t or a cuMem fabric handle), the device's
 *    ordinal and the buffer's offset in the allocation;
 *  - WEFT_MEMORY_DMABUF: not sent; the fd is registered locally (verbs).
 * The receiver trusts none of it: it checks every field against what it
 * maps. WEFT_MEM_DESC_KEEP: the owner keeps the memory allocated until it
 * says otherwise (weft_comm_register), so a peer may keep its mapping
 * across calls; without it, a device buffer is lent for the call only, and
 * the peer closes its mapping before it tells the owner the call is done
 * (the owner may free the buffer then: CUDA leaves freeing memory another
 * process has open undefined). SHARED memory is always kept: a mapping of
 * a memfd outlives the owner's unmapping. */
#define WEFT_MEM_DESC_KEEP 1u
#define WEFT_MEM_DESC_VERSION 1
#define WEFT_MEM_DESC_BODY 80
typedef struct weft_mem_desc {
  uint8_t version;   /* WEFT_MEM_DESC_VERSION */
  uint8_t kind;      /* weft_memory */
  uint16_t body_len; /* bytes of body in use */
  uint32_t flags;    /* WEFT_MEM_DESC_KEEP, else 0 */
  uint64_t len;      /* the buffer's length in bytes */
  uint8_t body[WEFT_MEM_DESC_BODY];
} weft_mem_desc;
_Static_assert(sizeof(weft_mem_desc) == 96, "a descriptor's size is part of the wire");

/* ---- stream-ordered work: the design the GPU issue (15) fills in --------
 *
 * What a device table must do, and why the members below look as they do:
 *
 *  - The user hands a CUDA stream as `void *` (weft.h will gain *_on_stream
 *    forms of the calls, or a stream in the call options). The operation
 *    must start after the work already queued on that stream, and work the
 *    user queues later must wait for the operation, without the host thread
 *    blocking: NCCL's contract. The table therefore keeps its own stream per
 *    communicator (stream_create) and links the two with events, never with
 *    a synchronize: `stream_after_user` records an event on the user's
 *    stream and makes ours wait on it (cuStreamWaitEvent). The reverse
 *    link is made at issue too, before the call's work exists:
 *    `user_wait_signal` makes the user's stream wait for a value that
 *    `signal`, queued on ours after the call's last work, writes
 *    (cuStreamWaitValue32 / cuStreamWriteValue32). Host: no-ops.
 *
 *  - Copies and reductions on device memory are queued on our stream and
 *    return at once with a completion token (`*_async`). The engine never
 *    waits on a stream: it keeps the token with the chunk and calls `poll`
 *    from its progress loop, beside the transports' progress, so one
 *    thread overlaps device-to-host copy of chunk k+1, the wire for chunk k
 *    and host-to-device copy plus reduction of chunk k-1. A token is the
 *    table's own 64-bit number (CUDA: an index into a ring of events
 *    recorded after the work, with a generation to catch reuse); 0 means
 *    "already complete", which is what the host table always returns, so
 *    the host path costs one predictable branch per chunk and no call.
 *    Tokens complete in the order they were issued on one stream, so the
 *    engine polls only the oldest it holds. `record` gives a token for
 *    everything queued so far (the end of a call).
 *
 *  - Transports read and write host memory only (caps in transport.h say
 *    otherwise only for GPUDirect). A device buffer's chunk therefore goes
 *    through pinned host staging: `copy_to_host` before a send,
 *    `copy_from_host` (or a reduction whose `b` is host memory) after a
 *    receive. The receive slots a transport fills come from `alloc_slots`
 *    of the table named in the transport's init args, so that a CUDA build
 *    hands out pinned memory there and the copies out of slots are
 *    asynchronous; the host table hands out ordinary pages.
 *
 *  - Scratch an algorithm needs for a call (coll.c's weft_coll_scratch)
 *    comes from `alloc_scratch` of the call's table: device memory for
 *    device buffers, so a reduction never reads across PCIe by accident.
 *    Scratch and slots are allocated once (per call or per connection),
 *    never per chunk.
 *
 *  - Errors of asynchronous work (a kernel fault) come back from `poll` as
 *    a negative status with the sentence in the sink given at stream_create;
 *    the call then fails like a transport error, with the rank and call.
 *
 * Members the host table implements synchronously are at today's speed:
 * the algorithms keep calling the synchronous members (copy, reduce) on the
 * host path until issue 15 moves the chunk pipeline onto tokens. */

/* One tensor of a gradient bucket that is packed (src/grad's copy mode):
 * `count` elements at `tensor`, at element `offset` of the bucket. */
typedef struct weft_mem_piece {
  void *tensor;
  size_t offset, count;
} weft_mem_piece;

/* Device memory as a NIC reaches it (GPUDirect RDMA, transports/ibv/ibv_gdr.c):
 * the allocation that holds a buffer, and with export_dmabuf its dma-buf. */
typedef struct weft_mem_range {
  void *base;         /* the allocation's first byte: byte 0 of its dma-buf */
  size_t bytes;       /* the allocation, rounded up to the host's page */
  uint64_t buffer_id; /* the driver's number for the allocation, never given to
                         another (memory freed and allocated again at the same
                         address has a new one); 0 where the driver has none */
  int device;         /* its GPU's ordinal */
} weft_mem_range;

/* The table's stream for one communicator: opaque (CUDA: a CUstream and its
 * event ring). The host table's is NULL: work happens at once. */
typedef struct weft_mem_stream weft_mem_stream;

/* A completion token (above); 0: already complete. */
typedef uint64_t weft_mem_token;

typedef struct weft_mem_ops {
  weft_memory kind;
  const char *name;
  /* dst = src for `bytes` bytes; both in this memory; no overlap. */
  void (*copy)(void *dst, const void *src, size_t bytes);
  /* dst = a op b element-wise, dividing by postdiv for WEFT_AVG (reduce.h).
   * `dst` is in this memory; `a` and `b` are in this memory or host memory
   * (a receive slot), and either may be `dst` itself. Operand order
   * matters for NaN bits, so callers that must agree pass the same order. */
  void (*reduce)(void *dst, const void *a, const void *b, size_t count, weft_dtype dtype,
                 weft_op op, int postdiv);
  /* dst = src / postdiv for WEFT_AVG, else a copy (nothing when dst == src). */
  void (*finish)(void *dst, const void *src, size_t count, weft_dtype dtype, weft_op op,
                 int postdiv);
  /* buf[i] *= factor in place (gradient pre/post-division): floats computed
   * in float (double for f64) and rounded once; integers through double,
   * truncated toward zero. */
  void (*scale)(void *buf, size_t count, weft_dtype dtype, double factor);
  /* f32 data carried between ranks as `wire` (WEFT_BF16 or WEFT_F16; the
   * algorithms' wire dtype, algo.h), rounded to nearest even (reduce.h):
   * narrow: dst (wire) = src (f32); widen: dst (f32) = src (wire), exact;
   * reduce_wire: dst = a + widen(b) in f32 (divided by postdiv for avg),
   * then, with a stage, stage = dst rounded and dst = widen(stage). dst, a
   * and stage are in this memory; the source of widen and b of reduce_wire
   * in it or in host memory (a receive slot). */
  void (*narrow)(void *dst, const void *src, size_t count, weft_dtype wire);
  void (*widen)(void *dst, const void *src, size_t count, weft_dtype wire);
  void (*reduce_wire)(void *dst, const void *a, const void *b, size_t count, weft_dtype wire,
                      weft_op op, int postdiv, void *stage);
  /* `bytes` of zero-filled memory of this kind (owned gradient buckets), or
   * NULL; freed with release (NULL is a no-op). */
  void *(*alloc)(size_t bytes);
  void (*release)(void *ptr);

  /* ---- streams and asynchronous work (the design above) ---- */

  /* Makes this table's stream for a communicator; errors of its work are
   * worded into `errors` (a weft_error_sink, transport.h; void * here so
   * this layer needs nothing above it). Host: *stream = NULL, WEFT_OK. */
  weft_status (*stream_create)(weft_mem_stream **stream, void *errors);
  void (*stream_destroy)(weft_mem_stream *stream);
  /* Our stream's later work waits for what is queued on `user_stream` now
   * (the user's CUDA stream; NULL: the default stream). Never blocks. */
  weft_status (*stream_after_user)(weft_mem_stream *stream, void *user_stream);
  /* Work queued later on `user_stream` waits until `stream`'s signal word
   * reaches `value` (compared with wrap-around: a count of calls). */
  weft_status (*user_wait_signal)(void *user_stream, weft_mem_stream *stream, uint32_t value);
  /* Queued on `stream`: its signal word becomes `value` once the work
   * queued before it is done. */
  weft_status (*signal)(weft_mem_stream *stream, uint32_t value);
  /* A token for everything queued on `stream` so far. */
  weft_status (*record)(weft_mem_stream *stream, weft_mem_token *token);
  /* WEFT_OK when the token's work is done, WEFT_AGAIN when not yet, a
   * negative status when it failed. Never blocks; 0 is always done. */
  weft_status (*poll)(weft_mem_stream *stream, weft_mem_token token);
  /* copy and reduce, queued on `stream`; *token completes when done. The
   * buffers stay untouched by the caller until then. */
  weft_status (*copy_async)(void *dst, const void *src, size_t bytes, weft_mem_stream *stream,
                            weft_mem_token *token);
  weft_status (*reduce_async)(void *dst, const void *a, const void *b, size_t count,
                              weft_dtype dtype, weft_op op, int postdiv, weft_mem_stream *stream,
                              weft_mem_token *token);
  /* Every outs[p] = ins[0] op ins[1] op ... op ins[n-1], element-wise in
   * that order (postdiv at the last step), for 2 <= n <= 8, in one pass
   * queued on `stream` (the direct allreduce's slice: each input read once,
   * the result stored n times); in place (outs[p] == ins[p]) is safe.
   * WEFT_ERR_UNSUPPORTED where the table has no such pass (host, n > 8): the
   * caller makes it from reduce_async and copy_async. */
  weft_status (*reduce_all_async)(void *const *outs, const void *const *ins, int n, size_t count,
                                  weft_dtype dtype, weft_op op, int postdiv,
                                  weft_mem_stream *stream, weft_mem_token *token);
  /* Between this memory and (pinned) host memory, queued on `stream`:
   * `host` is host memory, the other side is of this kind. Host: memcpy. */
  weft_status (*copy_to_host)(void *host, const void *src, size_t bytes, weft_mem_stream *stream,
                              weft_mem_token *token);
  weft_status (*copy_from_host)(void *dst, const void *host, size_t bytes,
                                weft_mem_stream *stream, weft_mem_token *token);

  /* ---- allocation through the table, never per chunk ---- */

  /* Host memory a transport receives into and this table's copies read
   * from (CUDA: pinned, so those copies run asynchronously). Page aligned,
   * not cleared. NULL when there is no memory. */
  void *(*alloc_slots)(size_t bytes);
  void (*free_slots)(void *ptr, size_t bytes);
  /* Scratch of this kind for one call (partial sums, gathered blocks). Not
   * cleared. NULL when there is no memory; free_scratch(NULL) is a no-op. */
  void *(*alloc_scratch)(size_t bytes);
  void (*free_scratch)(void *ptr);
  /* Scratch of this kind on GPU `device` (a transport's device ring,
   * transports/ibv): as alloc_scratch, freed with free_scratch. Host: the
   * device is ignored. */
  void *(*alloc_on)(int device, size_t bytes);

  /* ---- buffers a process of this host reaches (the direct allreduce) ---- */

  /* Fills `desc` for [buf, buf + bytes) so that another process of this
   * host can map it: host memory from weft_mem_alloc (kind SHARED), device
   * memory through a CUDA IPC handle of its allocation (kind DEVICE). False
   * when it cannot be described (ordinary host memory, a driver refusal). */
  bool (*describe)(const void *buf, size_t bytes, weft_mem_desc *desc);
  /* Maps what a peer described with this table's describe: *base is the
   * mapping (for unmap_peer), *local the buffer's first byte. Checks every
   * field against what it maps (WEFT_ERR_PROTOCOL), words a refusal into
   * `errors` (a weft_error_sink). The host table maps nothing here (shm
   * maps SHARED itself): WEFT_ERR_UNSUPPORTED. */
  weft_status (*map_peer)(const weft_mem_desc *desc, void **base, void **local, void *errors);
  void (*unmap_peer)(void *base);

  /* ---- device memory a NIC reads and writes (GPUDirect RDMA) ---- */

  /* The allocation holding [buf, buf + bytes): one driver query, no export
   * (a registration cache looks its entries up by it every call). False
   * for anything but device memory. Host: false. */
  bool (*range_of)(const void *buf, size_t bytes, weft_mem_range *out);
  /* The whole allocation `range` as a dma-buf: *fd is a new descriptor the
   * caller closes once it registered it (the registration holds the
   * memory, as NCCL does). WEFT_ERR_UNSUPPORTED, the reason worded into
   * `errors` (a weft_error_sink), where the driver cannot export it (no
   * cuMemGetHandleForAddressRange, a kernel without dma-buf, memory from
   * an allocator that did not ask for it). Host: WEFT_ERR_UNSUPPORTED. */
  weft_status (*export_dmabuf)(const weft_mem_range *range, int *fd, void *errors);
  /* Whether device `device` can export dma-bufs at all (the driver's
   * attribute), with the reason in `why` either way. Host: false. */
  bool (*dmabuf_supported)(int device, char *why, size_t why_len);

  /* ---- a gradient set's work on the user's stream (src/grad) ----
   * A device set's packing, scaling and links run where its gradients are
   * made: queued on `user_stream` (a CUstream; NULL: the legacy default
   * stream of the buffer's device), after the kernels that made them, never
   * blocking the host. Errors are worded into `errors` (a weft_error_sink).
   * The host table does the work at once; its marks are always reached. */
  /* The pieces of one bucket where its kernel reads them (device memory,
   * written once, on the bucket's device); NULL when there is no memory. */
  void *(*pieces_create)(const void *bucket, const weft_mem_piece *pieces, int n);
  void (*pieces_destroy)(void *table);
  /* Every piece of `table` in one launch: to_bucket, bucket[offset + i] =
   * tensor[i] * factor (the pack); else tensor[i] = bucket[offset + i] *
   * factor (the unpack). factor 1: a copy, bit for bit; else scale's
   * rounding. `most`: the largest piece's count (the launch's width). */
  weft_status (*pieces_move)(void *bucket, const void *table, int n, size_t most, weft_dtype dtype,
                             double factor, bool to_bucket, void *user_stream, void *errors);
  /* buf[i] *= factor, as scale, queued on `user_stream`. */
  weft_status (*scale_on)(void *buf, size_t count, weft_dtype dtype, double factor,
                          void *user_stream, void *errors);
  /* A mark (an event of the device holding `near`): recorded on a stream
   * and polled by the host (WEFT_OK once the
   * work before it is done, WEFT_AGAIN before, a negative status when that
   * work failed). A mark never recorded is reached. */
  weft_status (*mark_create)(const void *near, void **mark, void *errors);
  void (*mark_destroy)(void *mark);
  weft_status (*mark_record)(void *mark, void *user_stream, void *errors);
  weft_status (*mark_poll)(void *mark, void *errors);
} weft_mem_ops;

/* The table for the memory holding `ptr`: the device table for a GPU's
 * memory in a CUDA build with a usable driver, else the host's. */
const weft_mem_ops *weft_mem_for(const void *ptr);

/* What `ptr` is: WEFT_MEMORY_DEVICE (and *device, its ordinal, when not
 * NULL) or WEFT_MEMORY_HOST. One flag test where CUDA is not built or has no
 * driver; one driver call where it has. */
weft_memory weft_mem_kind_of(const void *ptr, int *device);

/* A public entry point's bracket: at entry, enter; as it returns, restore:
 * the caller's own CUDA context is current again on this thread where the
 * device table switched it during the call (a flag test where it did not,
 * or CUDA is not built). */
void weft_mem_thread_enter(void);
void weft_mem_thread_restore(void);

/* The table of a memory kind, or NULL when this build has none for it. */
const weft_mem_ops *weft_mem_by_kind(weft_memory kind);

extern const weft_mem_ops weft_mem_host;

#endif
