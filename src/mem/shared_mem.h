/* shared_mem.h - host memory that other ranks of this host can map.
 * weft_mem_alloc (weft.h) backs each allocation with its own memfd and
 * remembers it here, so that a collective can describe its buffers to peers
 * (a weft_mem_key) and a transport that reaches a peer's memory (shm) can
 * map them. Thread-safe: allocations may come and go while calls run. */
#ifndef WEFT_SHARED_MEM_H
#define WEFT_SHARED_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a buffer in shareable memory (weft_mem_alloc) lies, as its owner
 * describes it to a peer in a message: the owner's process, the memfd that
 * backs it, and the buffer's place in it. The receiver trusts none of it:
 * the transport checks the inode and every bound against what it maps. */
typedef struct weft_mem_key {
  uint32_t pid;    /* the owner's process id */
  int32_t fd;      /* the memfd's descriptor number there */
  uint64_t ino;    /* the memfd's inode: a reused descriptor number is caught */
  uint64_t offset; /* the buffer's first byte in the memfd */
  uint64_t len;    /* the buffer's length in bytes */
} weft_mem_key;

/* Whether [ptr, ptr + len) lies inside one weft_mem_alloc allocation; if so
 * *key describes it for a peer. len 0 is never shared (nothing to map). */
bool weft_shared_mem_find(const void *ptr, size_t len, weft_mem_key *key);

#endif
