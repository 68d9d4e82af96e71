/* support.c - support.h's calls, each a thin step down into the
 * communicator (src/comm) or the memory table (src/mem). */
#include "src/api/support.h"

#include <stdarg.h>
#include <stdio.h>

#include "src/comm/comm.h"
#include "src/mem/mem.h"

weft_status weft_api_error(weft_comm *comm, weft_status st, const char *call, const char *fmt,
                           ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return weft_core_error(&comm->core, st, call, "%s", what);
}

weft_status weft_api_handle_error(weft_status st, const char *call, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return weft_init_error(st, -1, call, "%s", what);
}

bool weft_api_comm_live(const weft_comm *comm) {
  return weft_comm_is_live(comm);
}

bool weft_api_one_host(const weft_comm *comm) {
  return comm->core.hosts.nhosts == 1;
}

/* Gradient sets take host memory only for now: a device tensor (declared,
 * or a device pointer declared as host) has no table here. */
const weft_api_mem *weft_api_mem_of(const void *ptr, weft_memory memory) {
  if (memory != WEFT_MEMORY_HOST && memory != WEFT_MEMORY_DEVICE) return NULL;
  if (ptr && weft_mem_kind_of(ptr, NULL) != memory) return NULL;
  return weft_mem_by_kind(memory);
}

bool weft_api_mem_is_host(const weft_api_mem *mem) {
  return mem->kind == WEFT_MEMORY_HOST;
}

void weft_api_mem_copy(const weft_api_mem *mem, void *dst, const void *src, size_t bytes) {
  mem->copy(dst, src, bytes);
}

void weft_api_mem_scale(const weft_api_mem *mem, void *buf, size_t count, weft_dtype dtype,
                        double factor) {
  mem->scale(buf, count, dtype, factor);
}

void *weft_api_mem_alloc(const weft_api_mem *mem, size_t bytes) {
  return mem->alloc(bytes);
}

void weft_api_mem_release(const weft_api_mem *mem, void *ptr) {
  mem->release(ptr);
}
