/* error_sink.h - where a lower layer (a transport, the socket helpers, the
 * topology loader) writes the sentence describing its last error, for the
 * communicator to pass on to the user. Implemented in status.c. */
#ifndef WEFT_ERROR_SINK_H
#define WEFT_ERROR_SINK_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/call_tag.h"
#include "weft.h"

/* The sentence describing the last error of a transport or helper. */
typedef struct weft_error_sink {
  char msg[384];
  char origin[384]; /* when the error is a peer's failure notice: its words,
                       passed on unchanged so every rank names the first cause */
} weft_error_sink;
void weft_error_sink_set(weft_error_sink *sink, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* snprintf that appends at buf + *used and never runs past len (cuts
 * quietly): for sentences and descriptions built in pieces. */
void weft_appendf(char *buf, size_t len, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Every transport checks an arriving chunk's tag (call_tag.h) the same way:
 * a chunk of another call, of another signature (collective, dtype, op,
 * root) or of another size is WEFT_ERR_MISMATCH, with one sentence for each
 * case written to `sink`, naming both calls. WEFT_OK when (tag, len) are the
 * expected ones. Implemented in call_tag.c. */
weft_status weft_chunk_check(weft_error_sink *sink, int peer, weft_tag tag, weft_tag want,
                             size_t len, size_t want_len);

#endif
