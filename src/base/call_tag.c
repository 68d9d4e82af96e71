/* call_tag.c - the words for a chunk's tag (call_tag.h), and the check every
 * transport makes on an arriving chunk (error_sink.h). */
#include <stdio.h>

#include "src/base/call_tag.h"
#include "src/base/error_sink.h"

static const struct {
  const char *call;
  int has_dtype, has_op, has_root;
} sig_kinds[] = {
    [WEFT_SIG_NONE] = {"a message", 0, 0, 0},
    [WEFT_SIG_BARRIER] = {"weft_barrier", 0, 0, 0},
    [WEFT_SIG_ALLREDUCE] = {"weft_allreduce", 1, 1, 0},
    [WEFT_SIG_BROADCAST] = {"weft_broadcast", 1, 0, 1},
    [WEFT_SIG_REDUCE] = {"weft_reduce", 1, 1, 1},
    [WEFT_SIG_ALLGATHER] = {"weft_allgather", 1, 0, 0},
    [WEFT_SIG_REDUCE_SCATTER] = {"weft_reduce_scatter", 1, 1, 0},
    [WEFT_SIG_GATHER] = {"weft_gather", 1, 0, 1},
    [WEFT_SIG_SCATTER] = {"weft_scatter", 1, 0, 1},
    [WEFT_SIG_ALLTOALL] = {"weft_alltoall", 1, 0, 0},
    [WEFT_SIG_CHECK] = {"WEFT_CHECK's fingerprint exchange", 0, 0, 0},
    [WEFT_SIG_GRAD_BUCKET] = {"a gradient bucket's allreduce", 1, 1, 0},
};

void weft_sig_describe(uint32_t sig, char *buf, size_t len) {
  weft_call_sig s = weft_sig_unpack(sig);
  if ((size_t)s.kind >= sizeof sig_kinds / sizeof sig_kinds[0]) {
    snprintf(buf, len, "an unknown call (signature 0x%08x)", sig);
    return;
  }
  size_t used = 0;
  int grad = s.kind == WEFT_SIG_GRAD_BUCKET;
  weft_appendf(buf, len, &used, "%s", sig_kinds[s.kind].call);
  if (!sig_kinds[s.kind].has_dtype) return; /* no device buffers either */
  weft_appendf(buf, len, &used, grad ? " (%s" : "(%s",
               s.dtype >= 0 ? weft_dtype_name((weft_dtype)s.dtype) : "?");
  if (sig_kinds[s.kind].has_op)
    weft_appendf(buf, len, &used, ", %s", s.op >= 0 ? weft_op_name((weft_op)s.op) : "?");
  if (s.wire >= 0) weft_appendf(buf, len, &used, ", wire %s", weft_dtype_name((weft_dtype)s.wire));
  if (sig_kinds[s.kind].has_root) weft_appendf(buf, len, &used, ", root=%u", s.root);
  weft_appendf(buf, len, &used, ")");
  if (grad) weft_appendf(buf, len, &used, " in step %u", s.root); /* mod 2^16 */
  if (s.in_place_device) weft_appendf(buf, len, &used, " on device memory over CUDA IPC");
}

weft_status weft_chunk_check(weft_error_sink *sink, int peer, weft_tag tag, weft_tag want,
                             size_t len, size_t want_len) {
  if (tag == want) {
    if (len == want_len) return WEFT_OK;
    weft_error_sink_set(sink,
                        "peer %d sent a %zu-byte chunk where this rank expects %zu bytes in call "
                        "#%u (counts or dtypes differ between ranks)",
                        peer, len, want_len, weft_tag_seq(want));
    return WEFT_ERR_MISMATCH;
  }
  char theirs[128], mine[128];
  weft_sig_describe(weft_tag_sig(tag), theirs, sizeof theirs);
  weft_sig_describe(weft_tag_sig(want), mine, sizeof mine);
  if (weft_tag_seq(tag) != weft_tag_seq(want))
    weft_error_sink_set(sink,
                        "peer %d sent data of its collective call #%u, %s, while this rank is in "
                        "call #%u, %s (a rank skipped or added a call)",
                        peer, weft_tag_seq(tag), theirs, weft_tag_seq(want), mine);
  else if ((weft_tag_sig(tag) ^ weft_tag_sig(want)) == WEFT_SIG_IN_PLACE_DEVICE)
    weft_error_sink_set(sink,
                        "rank %d called %s as its call #%u, this rank %s: pass device memory on "
                        "every rank or host memory on every rank",
                        peer, theirs, weft_tag_seq(want), mine);
  else
    weft_error_sink_set(sink,
                        "rank %d called %s as its call #%u, this rank %s: every rank must make the "
                        "same call",
                        peer, theirs, weft_tag_seq(want), mine);
  return WEFT_ERR_MISMATCH;
}
