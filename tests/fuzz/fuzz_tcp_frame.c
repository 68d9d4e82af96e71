/* fuzz_tcp_frame.c - the TCP transport's frame header (tcp_frame_parse) and
 * the chunk-tag check every transport applies to it (weft_chunk_check), with
 * the words for any signature a peer may send. */
#include <stdint.h>
#include <string.h>

#include "transports/tcp/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tcp_frame_info f;
  if (tcp_frame_parse(data, size, &f) != WEFT_OK) return 0;
  if (f.type > 0xffffu) __builtin_trap();
  weft_error_sink sink;
  /* the tag of call #7, an f32 sum allreduce; a peer's signature may be any
   * 32 bits, which the sentence then describes (weft_sig_describe) */
  weft_tag want = weft_tag_make(
      7, weft_sig_pack((weft_call_sig){WEFT_SIG_ALLREDUCE, WEFT_F32, WEFT_SUM, -1, 0}));
  weft_status st = weft_chunk_check(&sink, 3, f.tag, want, f.len, 4096);
  if (st == WEFT_OK && (f.tag != want || f.len != 4096)) __builtin_trap(); /* a wrong chunk passed */
  if (st != WEFT_OK && strnlen(sink.msg, sizeof sink.msg) == sizeof sink.msg) __builtin_trap();
  return 0;
}
