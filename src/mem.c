/* mem.c - the host memory table. */
#include "mem.h"

#include <string.h>

#include "reduce.h"

static void host_copy(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src) memcpy(dst, src, bytes);
}

const weft_mem_ops weft_mem_host = {
    .kind = WEFT_MEM_HOST,
    .name = "host",
    .copy = host_copy,
    .reduce = weft_reduce_kernel,
    .finish = weft_reduce_finish,
};

const weft_mem_ops *weft_mem_for(const void *ptr) {
  (void)ptr; /* CUDA builds will ask the driver which memory holds ptr */
  return &weft_mem_host;
}
