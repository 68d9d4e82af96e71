/* fuzz_shm_addr.c - the shm transport's reading of a peer's published
 * address (shm_addr_parse) and the reachability rules applied to it
 * (can_reach through the transport's table, as selection calls it). */
#include <stdint.h>
#include <string.h>

#include "src/topo/select.h"
#include "transports/shm/shm.h"

static weft_error_sink sink;
static weft_place place;
static weft_transport_init_args args;
static weft_tp_ctx *ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ctx) {
    weft_place_here(NULL, &place);
    args = (weft_transport_init_args){.rank = 0,
                                      .size = 4,
                                      .chunk_bytes = 4096,
                                      .timeout_s = 1,
                                      .wake_fd = -1,
                                      .errors = &sink,
                                      .place = &place,
                                      .local_size = 4};
    uint8_t blob[WEFT_TRANSPORT_ADDR_MAX];
    size_t blob_len;
    if (weft_transport_shm.init(&args, &ctx, blob, &blob_len)) __builtin_trap();
  }
  shm_addr a;
  bool parsed = shm_addr_parse(data, size, &a) == WEFT_OK;
  char why[192];
  bool reach = weft_transport_shm.can_reach(ctx, 1, data, size, why, sizeof why);
  if (reach && !parsed) __builtin_trap();
  if (strnlen(why, sizeof why) == sizeof why) __builtin_trap();
  return 0;
}
