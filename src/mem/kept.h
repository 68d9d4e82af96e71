/* kept.h - buffers the user keeps allocated until it deregisters them
 * (weft_comm_register): their descriptors carry WEFT_MEM_DESC_KEEP (mem.h),
 * so peers keep them mapped across calls instead of closing them before
 * each call ends. Counted: a range registered twice (two communicators) is
 * kept until both let go. Process-wide, thread-safe. */
#ifndef WEFT_KEPT_H
#define WEFT_KEPT_H

#include <stdbool.h>
#include <stddef.h>

#include "weft.h"

/* WEFT_ERR_NOMEM without memory. */
weft_status weft_mem_keep(const void *ptr, size_t bytes);
/* False when no registration starts at `ptr`. */
bool weft_mem_unkeep(const void *ptr);
/* Whether [ptr, ptr + bytes) lies inside one kept range; a load of a count
 * where none is kept. */
bool weft_mem_is_kept(const void *ptr, size_t bytes);

#endif
