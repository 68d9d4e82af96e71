/* fuzz_tcp_frame.c - the TCP transport's frame header (tcp_frame_parse) and
 * the chunk-tag check every transport applies to it (weft_chunk_check). */
#include <stdint.h>
#include <string.h>

#include "transports/tcp/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tcp_frame_info f;
  if (tcp_frame_parse(data, size, &f) != WEFT_OK) return 0;
  if (f.type > 0xffffu) __builtin_trap();
  weft_error_sink sink;
  weft_status st = weft_chunk_check(&sink, 3, f.seq, 7, f.len, 4096);
  if (st == WEFT_OK && (f.seq != 7 || f.len != 4096)) __builtin_trap(); /* a wrong chunk passed */
  if (st != WEFT_OK && strnlen(sink.msg, sizeof sink.msg) == sizeof sink.msg) __builtin_trap();
  return 0;
}
