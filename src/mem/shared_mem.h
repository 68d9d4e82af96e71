/* shared_mem.h - host memory that other ranks of this host can map.
 * weft_mem_alloc (weft.h) backs each allocation with its own memfd and
 * remembers it here, so that a collective can describe its buffers to peers
 * (a weft_mem_desc of kind WEFT_MEMORY_SHARED) and a transport that reaches
 * a peer's memory (shm) can map them. Thread-safe: allocations may come and
 * go while calls run. */
#ifndef WEFT_SHARED_MEM_H
#define WEFT_SHARED_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/mem/mem.h"
#include "weft.h"

/* The body of a WEFT_MEMORY_SHARED descriptor: the owner's process, the
 * memfd that backs the buffer, and the buffer's place in it. */
typedef struct weft_shared_key {
  uint32_t pid;    /* the owner's process id */
  int32_t fd;      /* the memfd's descriptor number there */
  uint64_t ino;    /* the memfd's inode: a reused descriptor number is caught */
  uint64_t offset; /* the buffer's first byte in the memfd */
} weft_shared_key;

/* Whether [ptr, ptr + len) lies inside one weft_mem_alloc allocation; if so
 * *desc describes it for a peer. len 0 is never shared (nothing to map). */
bool weft_shared_mem_describe(const void *ptr, size_t len, weft_mem_desc *desc);

/* The key inside a peer's descriptor: WEFT_ERR_PROTOCOL when it is not a
 * shared-memory descriptor of this version (its sender's words are not
 * trusted: the transport still checks the key against what it maps). */
weft_status weft_shared_mem_key(const weft_mem_desc *desc, weft_shared_key *key);

#endif
