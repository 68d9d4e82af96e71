/* support.c - support.h's calls, each a thin step down into the
 * communicator (src/comm) or the memory table (src/mem). */
#include "src/api/support.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "src/base/error_sink.h"
#include "src/base/net.h"
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

void *weft_api_comm_stream(const weft_comm *comm) {
  return comm->core.user_stream;
}

double weft_api_comm_timeout(const weft_comm *comm) {
  return comm->core.fail.timeout_s;
}

/* Host or device memory, as declared: a pointer of the other kind (a device
 * pointer declared as host, say), or device memory in a build or on a
 * machine without CUDA, has no table here. */
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

/* ---- a device gradient set's work on a stream ---------------------------------- */

/* A member's refusal as the user reads it: the sentence the table wrote. */
static weft_status mem_refused(weft_comm *comm, weft_status st, const char *call, const char *what,
                               const weft_error_sink *sink) {
  return weft_api_error(comm, st, call, "%s: %s", what, sink->msg[0] ? sink->msg : weft_status_name(st));
}

void *weft_api_pieces_create(const weft_api_mem *mem, const void *bucket, const weft_api_piece *pieces,
                             int n) {
  weft_mem_piece *p = malloc(sizeof *p * (size_t)(n > 0 ? n : 1));
  if (!p) return NULL;
  for (int i = 0; i < n; i++) p[i] = (weft_mem_piece){pieces[i].tensor, pieces[i].offset, pieces[i].count};
  weft_mem_thread_enter();
  void *t = mem->pieces_create(bucket, p, n);
  weft_mem_thread_restore();
  free(p);
  return t;
}

void weft_api_pieces_destroy(const weft_api_mem *mem, void *table) {
  if (!table) return;
  weft_mem_thread_enter();
  mem->pieces_destroy(table);
  weft_mem_thread_restore();
}

weft_status weft_api_pieces_move(weft_comm *comm, const char *call, const char *what,
                                 const weft_api_mem *mem, void *bucket, const void *table, int n,
                                 size_t most, weft_dtype dtype, double factor, bool to_bucket,
                                 void *stream) {
  weft_error_sink sink = {{0}, {0}};
  weft_mem_thread_enter();
  weft_status st = mem->pieces_move(bucket, table, n, most, dtype, factor, to_bucket, stream, &sink);
  weft_mem_thread_restore();
  return st ? mem_refused(comm, st, call, what, &sink) : WEFT_OK;
}

weft_status weft_api_scale_on(weft_comm *comm, const char *call, const char *what,
                              const weft_api_mem *mem, void *buf, size_t count, weft_dtype dtype,
                              double factor, void *stream) {
  weft_error_sink sink = {{0}, {0}};
  weft_mem_thread_enter();
  weft_status st = mem->scale_on(buf, count, dtype, factor, stream, &sink);
  weft_mem_thread_restore();
  return st ? mem_refused(comm, st, call, what, &sink) : WEFT_OK;
}

weft_status weft_api_mark_create(weft_comm *comm, const char *call, const weft_api_mem *mem,
                                 const void *near, void **mark) {
  weft_error_sink sink = {{0}, {0}};
  weft_mem_thread_enter();
  weft_status st = mem->mark_create(near, mark, &sink);
  weft_mem_thread_restore();
  return st ? mem_refused(comm, st, call, "an event for the set's stream", &sink) : WEFT_OK;
}

void weft_api_mark_destroy(const weft_api_mem *mem, void *mark) {
  if (!mark) return;
  weft_mem_thread_enter();
  mem->mark_destroy(mark);
  weft_mem_thread_restore();
}

weft_status weft_api_mark_record(weft_comm *comm, const char *call, const weft_api_mem *mem, void *mark,
                                 void *stream) {
  weft_error_sink sink = {{0}, {0}};
  weft_mem_thread_enter();
  weft_status st = mem->mark_record(mark, stream, &sink);
  weft_mem_thread_restore();
  return st ? mem_refused(comm, st, call, "recording an event on the stream", &sink) : WEFT_OK;
}

weft_status weft_api_mark_wait(weft_comm *comm, const char *call, const char *what,
                               const weft_api_mem *mem, void *mark) {
  weft_error_sink sink = {{0}, {0}};
  double timeout = comm->core.fail.timeout_s, deadline = weft_now() + timeout;
  weft_mem_thread_enter();
  weft_status st;
  while ((st = mem->mark_poll(mark, &sink)) == WEFT_AGAIN && weft_now() < deadline) sched_yield();
  weft_mem_thread_restore();
  if (st == WEFT_AGAIN)
    return weft_api_error(comm, WEFT_ERR_TIMEOUT, call,
                          "%s did not complete on the GPU in %.1f s (WEFT_TIMEOUT): is the set's stream "
                          "held by other work?",
                          what, timeout);
  return st ? mem_refused(comm, st, call, what, &sink) : WEFT_OK;
}
