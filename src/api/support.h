/* support.h - what code built on the public API inside the library (the
 * gradient sets, src/grad) needs beyond weft.h: the sentence the user reads
 * with weft_last_error, one fact about a communicator, and the memory table
 * of a buffer, opaque. Nothing here exposes a communicator's or the memory
 * table's layout, so src/grad depends on this file and weft.h alone. */
#ifndef WEFT_API_SUPPORT_H
#define WEFT_API_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "weft.h"

/* Records a failure on `comm` with the sentence the user reads (it starts
 * with the rank and `call`). Returns st. */
weft_status weft_api_error(weft_comm *comm, weft_status st, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same where there is no communicator to record it on (a bad handle). */
weft_status weft_api_handle_error(weft_status st, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

bool weft_api_comm_live(const weft_comm *comm);
/* Every rank of `comm` runs on one host (shared buffers may pay off). */
bool weft_api_one_host(const weft_comm *comm);

/* weft_iallreduce of a gradient set's bucket in step `step`, which its
 * chunks' signature carries (call_tag.h), with `wire` for this call only
 * (weft_comm_set_wire_dtype's values; -1: the communicator's), the set's
 * own option. `stream` NULL: ordered on the communicator's stream as any
 * call. A device set passes its own: the call starts after the work queued
 * on stream->stream now, that stream is NOT made to wait for the result
 * (the backward kernels queued after it go on), and stream->signal gets the
 * value weft_api_stream_after_buckets takes to link it later (0: none). */
typedef struct weft_api_bucket_stream {
  void *stream;    /* a CUstream; NULL: the legacy default stream */
  uint32_t signal; /* out */
} weft_api_bucket_stream;
weft_status weft_api_ibucket_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, weft_dtype dtype, weft_op op, int wire,
                                       uint64_t step, weft_api_bucket_stream *stream,
                                       weft_request **req);
/* Work queued on `stream` (a CUstream) from now on waits until every
 * bucket issued up to the one whose signal this is has its result in
 * place. Never blocks; 0: nothing to wait for. */
weft_status weft_api_stream_after_buckets(weft_comm *comm, void *stream, uint32_t signal);
/* The communicator's stream (weft_comm_set_stream) and timeout in seconds. */
void *weft_api_comm_stream(const weft_comm *comm);
double weft_api_comm_timeout(const weft_comm *comm);

/* weft_barrier's work under another call's name, inside that call's
 * one-thread mark (weft_comm_deregister's two barriers). */
weft_status weft_api_barrier(weft_comm *comm, const char *call);

/* A memory kind's table, opaque: copy, scale, allocate in that memory. */
typedef struct weft_mem_ops weft_api_mem;
/* The table for `ptr` (NULL: by `memory` alone), or NULL when this build
 * has no table for that memory. */
const weft_api_mem *weft_api_mem_of(const void *ptr, weft_memory memory);
bool weft_api_mem_is_host(const weft_api_mem *mem);
/* dst = src for `bytes` bytes, both in this memory, no overlap. */
void weft_api_mem_copy(const weft_api_mem *mem, void *dst, const void *src, size_t bytes);
/* buf[i] *= factor in place (rounding as the memory table says, mem.h). */
void weft_api_mem_scale(const weft_api_mem *mem, void *buf, size_t count, weft_dtype dtype,
                        double factor);
/* `bytes` of zeroed memory of this kind, or NULL; weft_api_mem_release frees it. */
void *weft_api_mem_alloc(const weft_api_mem *mem, size_t bytes);
void weft_api_mem_release(const weft_api_mem *mem, void *ptr);

/* ---- a device gradient set's work on a stream (mem.h says what each does) ----
 * Queued on `stream` (a CUstream; NULL: the legacy stream), never blocking;
 * a refusal is recorded on `comm` naming `call` and `what`, and returned.
 * On host memory each is done at once (marks are always reached). The
 * caller's CUDA context is current again when each returns. */
/* One tensor of a packed bucket: `count` elements at `tensor`, at element
 * `offset` of the bucket. */
typedef struct weft_api_piece {
  void *tensor;
  size_t offset, count;
} weft_api_piece;
void *weft_api_pieces_create(const weft_api_mem *mem, const void *bucket, const weft_api_piece *pieces,
                             int n);
void weft_api_pieces_destroy(const weft_api_mem *mem, void *table);
weft_status weft_api_pieces_move(weft_comm *comm, const char *call, const char *what,
                                 const weft_api_mem *mem, void *bucket, const void *table, int n,
                                 size_t most, weft_dtype dtype, double factor, bool to_bucket,
                                 void *stream);
weft_status weft_api_scale_on(weft_comm *comm, const char *call, const char *what,
                              const weft_api_mem *mem, void *buf, size_t count, weft_dtype dtype,
                              double factor, void *stream);
weft_status weft_api_mark_create(weft_comm *comm, const char *call, const weft_api_mem *mem,
                                 const void *near, void **mark);
void weft_api_mark_destroy(const weft_api_mem *mem, void *mark);
weft_status weft_api_mark_record(weft_comm *comm, const char *call, const weft_api_mem *mem, void *mark,
                                 void *stream);
/* The host waits until the work before the mark is done, at most the
 * communicator's timeout (WEFT_ERR_TIMEOUT, naming `what`). */
weft_status weft_api_mark_wait(weft_comm *comm, const char *call, const char *what,
                               const weft_api_mem *mem, void *mark);

#endif
