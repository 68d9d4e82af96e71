/* mem.h - the memory table: how the algorithms and transports copy and reduce
 * a buffer without assuming it is a host pointer. Host memory now; a CUDA
 * table (device copies, reduction kernels, IPC handles) plugs in beside it. */
#ifndef WEFT_MEM_H
#define WEFT_MEM_H

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
 * maps. */
#define WEFT_MEM_DESC_VERSION 1
#define WEFT_MEM_DESC_BODY 80
typedef struct weft_mem_desc {
  uint8_t version;   /* WEFT_MEM_DESC_VERSION */
  uint8_t kind;      /* weft_memory */
  uint16_t body_len; /* bytes of body in use */
  uint32_t reserved; /* 0 */
  uint64_t len;      /* the buffer's length in bytes */
  uint8_t body[WEFT_MEM_DESC_BODY];
} weft_mem_desc;
_Static_assert(sizeof(weft_mem_desc) == 96, "a descriptor's size is part of the wire");

typedef struct weft_mem_ops {
  weft_memory kind;
  const char *name;
  /* dst = src for `bytes` bytes; both in this memory; no overlap. */
  void (*copy)(void *dst, const void *src, size_t bytes);
  /* dst = a op b element-wise, dividing by postdiv for WEFT_AVG (reduce.h).
   * `a` and `dst` are in this memory; `b` may be host memory (a receive slot). */
  void (*reduce)(void *dst, const void *a, const void *b, size_t count, weft_dtype dtype,
                 weft_op op, int postdiv);
  /* dst = src / postdiv for WEFT_AVG, else a copy (nothing when dst == src). */
  void (*finish)(void *dst, const void *src, size_t count, weft_dtype dtype, weft_op op,
                 int postdiv);
  /* buf[i] *= factor in place (gradient pre/post-division): floats computed
   * in float (double for f64) and rounded once; integers through double,
   * truncated toward zero. */
  void (*scale)(void *buf, size_t count, weft_dtype dtype, double factor);
  /* `bytes` of zero-filled memory of this kind (owned gradient buckets), or
   * NULL; freed with release (NULL is a no-op). */
  void *(*alloc)(size_t bytes);
  void (*release)(void *ptr);
} weft_mem_ops;

/* The table for the memory holding `ptr` (host for every pointer today). */
const weft_mem_ops *weft_mem_for(const void *ptr);

/* The table of a memory kind, or NULL when this build has none for it. */
const weft_mem_ops *weft_mem_by_kind(weft_memory kind);

extern const weft_mem_ops weft_mem_host;

#endif
