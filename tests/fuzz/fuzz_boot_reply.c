/* fuzz_boot_reply.c - a rank's reading of the rendezvous answer: the fixed
 * reply, then the table of every rank's info (src/comm/bootstrap.c,
 * boot_reply_parse and boot_table_parse). The first byte picks the world
 * size the rank expects, as a rank's size comes from its caller. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/comm/bootstrap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int world = 1 + data[0] % 8;
  data++, size--;
  boot_reply reply;
  if (boot_reply_parse(data, size, &reply) != WEFT_OK) return 0;
  if (strnlen(reply.msg, sizeof reply.msg) == sizeof reply.msg) __builtin_trap();
  boot_rank_info *all = calloc((size_t)world, sizeof *all);
  if (!all) return 0;
  if (boot_table_parse(data + BOOT_REPLY_BYTES, size - BOOT_REPLY_BYTES, world, all) == WEFT_OK)
    for (int r = 0; r < world; r++)
      if (all[r].addr_len > BOOT_ADDR_BYTES ||
          strnlen(all[r].host, BOOT_HOST_BYTES) == BOOT_HOST_BYTES)
        __builtin_trap();
  free(all);
  return 0;
}
