/* shared_mem.h - host memory that other ranks of this host can map.
 * weft_mem_alloc (weft.h) backs each allocation with its own memfd and
 * remembers it here, so that a collective can describe its buffers to peers
 * (a weft_mem_key) and a transport that reaches a peer's memory (shm) can
 * map them. Thread-safe: allocations may come and go while calls run. */
#ifndef WEFT_SHARED_MEM_H
#define WEFT_SHARED_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include "transports/transport.h"

/* Whether [ptr, ptr + len) lies inside one weft_mem_alloc allocation; if so
 * *key describes it for a peer. len 0 is never shared (nothing to map). */
bool weft_shared_mem_find(const void *ptr, size_t len, weft_mem_key *key);

#endif
