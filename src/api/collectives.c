/* api/collectives.c - the public collectives, blocking and non-blocking: each
 * sets its call up in src/coll (checks, sequence number, algorithm) and hands
 * it to the engine (src/engine), which runs it in issue order. A blocking
 * call's request lives on the caller's stack and the caller drives it. */
#include <stdatomic.h>
#include <stdlib.h>

#include "src/api/api.h"
#include "src/api/support.h"
#include "src/base/status.h"
#include "src/coll/coll.h"
#include "src/coll/coll_device.h"
#include "src/engine/engine.h"
#include "weft.h"

/* A blocking call: the caller drives it (behind any earlier non-blocking ones). */
static inline weft_status coll_blocking(weft_request *r, weft_status setup) {
  return weft_engine_blocking(r, setup);
}

/* A non-blocking call: queued, and the progress thread moves it. *signal,
 * where asked: the value of its end on the device's signal word (0: none),
 * taken before the engine may end it. */
static weft_status coll_issue_signal(weft_request *r, weft_request **req, weft_status setup,
                                     uint32_t *signal) {
  setup = weft_coll_setup_verdict(&r->task, setup);
  /* device buffers: the user's stream waits for the result from here on */
  if (setup == WEFT_OK && (setup = weft_coll_device_issue(&r->task)) < 0)
    weft_coll_release(&r->task);
  if (setup < 0) {
    free(r);
    return setup;
  }
  if (signal) *signal = r->task.device_signal;
  weft_request_coll(r, true);
  if (setup == WEFT_COLL_DONE) {
    atomic_store(&r->done, 1);
  } else {
    weft_engine_submit(r, true);
  }
  *req = r;
  return WEFT_OK;
}

static weft_status coll_issue(weft_request *r, weft_request **req, weft_status setup) {
  return coll_issue_signal(r, req, setup, NULL);
}

static weft_status weft_allreduce_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, weft_dtype dtype, weft_op op) {
  weft_request r;
  return coll_blocking(&r, weft_coll_allreduce_setup(&r.task, "weft_allreduce", &comm->core,
                                                     sendbuf, recvbuf, count, dtype, op));
}

WEFT_API weft_status weft_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_op op) {
  WEFT_API_CALL(comm, "weft_allreduce",
                weft_allreduce_body(comm, sendbuf, recvbuf, count, dtype, op));
}

static weft_status weft_iallreduce_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, weft_dtype dtype, weft_op op,
                                        weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_iallreduce", req, &r));
  return coll_issue(r, req,
                    weft_coll_allreduce_setup(&r->task, "weft_iallreduce", &comm->core, sendbuf,
                                              recvbuf, count, dtype, op));
}

WEFT_API weft_status weft_iallreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, weft_dtype dtype, weft_op op,
                                     weft_request **req) {
  WEFT_API_CALL(comm, "weft_iallreduce",
                weft_iallreduce_body(comm, sendbuf, recvbuf, count, dtype, op, req));
}

weft_status weft_api_ibucket_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, weft_dtype dtype, weft_op op, int wire,
                                       uint64_t step, weft_api_bucket_stream *stream,
                                       weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_iallreduce", req, &r));
  /* the set's wire dtype, step and stream go with the call, not through the communicator */
  uint32_t signal = 0;
  weft_status st = coll_issue_signal(
      r, req,
      weft_coll_bucket_allreduce_setup(&r->task, "weft_iallreduce", &comm->core, sendbuf, recvbuf, count,
                                       dtype, op, wire, step, stream != NULL, stream ? stream->stream : NULL),
      &signal);
  if (stream) stream->signal = st ? 0 : signal;
  return st;
}

weft_status weft_api_stream_after_buckets(weft_comm *comm, void *stream, uint32_t signal) {
  return weft_coll_device_stream_wait(&comm->core, stream, signal);
}

static weft_status weft_broadcast_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, weft_dtype dtype, int root) {
  weft_request r;
  return coll_blocking(&r, weft_coll_broadcast_setup(&r.task, "weft_broadcast", &comm->core,
                                                     sendbuf, recvbuf, count, dtype, root));
}

WEFT_API weft_status weft_broadcast(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, int root) {
  WEFT_API_CALL(comm, "weft_broadcast",
                weft_broadcast_body(comm, sendbuf, recvbuf, count, dtype, root));
}

static weft_status weft_ibroadcast_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, weft_dtype dtype, int root,
                                        weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_ibroadcast", req, &r));
  return coll_issue(r, req,
                    weft_coll_broadcast_setup(&r->task, "weft_ibroadcast", &comm->core, sendbuf,
                                              recvbuf, count, dtype, root));
}

WEFT_API weft_status weft_ibroadcast(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, weft_dtype dtype, int root, weft_request **req) {
  WEFT_API_CALL(comm, "weft_ibroadcast",
                weft_ibroadcast_body(comm, sendbuf, recvbuf, count, dtype, root, req));
}

static weft_status weft_reduce_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_op op, int root) {
  weft_request r;
  return coll_blocking(&r, weft_coll_reduce_setup(&r.task, "weft_reduce", &comm->core, sendbuf,
                                                  recvbuf, count, dtype, op, root));
}

WEFT_API weft_status weft_reduce(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 weft_dtype dtype, weft_op op, int root) {
  WEFT_API_CALL(comm, "weft_reduce",
                weft_reduce_body(comm, sendbuf, recvbuf, count, dtype, op, root));
}

static weft_status weft_ireduce_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, weft_dtype dtype, weft_op op, int root,
                                     weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_ireduce", req, &r));
  return coll_issue(r, req,
                    weft_coll_reduce_setup(&r->task, "weft_ireduce", &comm->core, sendbuf, recvbuf,
                                           count, dtype, op, root));
}

WEFT_API weft_status weft_ireduce(weft_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  weft_dtype dtype, weft_op op, int root, weft_request **req) {
  WEFT_API_CALL(comm, "weft_ireduce",
                weft_ireduce_body(comm, sendbuf, recvbuf, count, dtype, op, root, req));
}

static weft_status weft_allgather_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t sendcount, weft_dtype dtype) {
  weft_request r;
  return coll_blocking(&r, weft_coll_allgather_setup(&r.task, "weft_allgather", &comm->core,
                                                     sendbuf, recvbuf, sendcount, dtype));
}

WEFT_API weft_status weft_allgather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t sendcount, weft_dtype dtype) {
  WEFT_API_CALL(comm, "weft_allgather",
                weft_allgather_body(comm, sendbuf, recvbuf, sendcount, dtype));
}

static weft_status weft_iallgather_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t sendcount, weft_dtype dtype, weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_iallgather", req, &r));
  return coll_issue(r, req,
                    weft_coll_allgather_setup(&r->task, "weft_iallgather", &comm->core, sendbuf,
                                              recvbuf, sendcount, dtype));
}

WEFT_API weft_status weft_iallgather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t sendcount, weft_dtype dtype, weft_request **req) {
  WEFT_API_CALL(comm, "weft_iallgather",
                weft_iallgather_body(comm, sendbuf, recvbuf, sendcount, dtype, req));
}

static weft_status weft_reduce_scatter_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                            size_t recvcount, weft_dtype dtype, weft_op op) {
  weft_request r;
  return coll_blocking(
      &r, weft_coll_reduce_scatter_setup(&r.task, "weft_reduce_scatter", &comm->core, sendbuf,
                                         recvbuf, recvcount, dtype, op));
}

WEFT_API weft_status weft_reduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t recvcount, weft_dtype dtype, weft_op op) {
  WEFT_API_CALL(comm, "weft_reduce_scatter",
                weft_reduce_scatter_body(comm, sendbuf, recvbuf, recvcount, dtype, op));
}

static weft_status weft_ireduce_scatter_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                             size_t recvcount, weft_dtype dtype, weft_op op,
                                             weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_ireduce_scatter", req, &r));
  return coll_issue(r, req,
                    weft_coll_reduce_scatter_setup(&r->task, "weft_ireduce_scatter", &comm->core,
                                                   sendbuf, recvbuf, recvcount, dtype, op));
}

WEFT_API weft_status weft_ireduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t recvcount, weft_dtype dtype, weft_op op,
                                          weft_request **req) {
  WEFT_API_CALL(comm, "weft_ireduce_scatter",
                weft_ireduce_scatter_body(comm, sendbuf, recvbuf, recvcount, dtype, op, req));
}

static weft_status weft_gather_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t sendcount, weft_dtype dtype, int root) {
  weft_request r;
  return coll_blocking(&r, weft_coll_gather_setup(&r.task, "weft_gather", &comm->core, sendbuf,
                                                  recvbuf, sendcount, dtype, root));
}

WEFT_API weft_status weft_gather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t sendcount, weft_dtype dtype, int root) {
  WEFT_API_CALL(comm, "weft_gather",
                weft_gather_body(comm, sendbuf, recvbuf, sendcount, dtype, root));
}

static weft_status weft_igather_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t sendcount, weft_dtype dtype, int root,
                                     weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_igather", req, &r));
  return coll_issue(r, req,
                    weft_coll_gather_setup(&r->task, "weft_igather", &comm->core, sendbuf, recvbuf,
                                           sendcount, dtype, root));
}

WEFT_API weft_status weft_igather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t sendcount, weft_dtype dtype, int root,
                                  weft_request **req) {
  WEFT_API_CALL(comm, "weft_igather",
                weft_igather_body(comm, sendbuf, recvbuf, sendcount, dtype, root, req));
}

static weft_status weft_scatter_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, weft_dtype dtype, int root) {
  weft_request r;
  return coll_blocking(&r, weft_coll_scatter_setup(&r.task, "weft_scatter", &comm->core, sendbuf,
                                                   recvbuf, recvcount, dtype, root));
}

WEFT_API weft_status weft_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t recvcount, weft_dtype dtype, int root) {
  WEFT_API_CALL(comm, "weft_scatter",
                weft_scatter_body(comm, sendbuf, recvbuf, recvcount, dtype, root));
}

static weft_status weft_iscatter_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, weft_dtype dtype, int root,
                                      weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_iscatter", req, &r));
  return coll_issue(r, req,
                    weft_coll_scatter_setup(&r->task, "weft_iscatter", &comm->core, sendbuf,
                                            recvbuf, recvcount, dtype, root));
}

WEFT_API weft_status weft_iscatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t recvcount, weft_dtype dtype, int root,
                                   weft_request **req) {
  WEFT_API_CALL(comm, "weft_iscatter",
                weft_iscatter_body(comm, sendbuf, recvbuf, recvcount, dtype, root, req));
}

static weft_status weft_alltoall_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, weft_dtype dtype) {
  weft_request r;
  return coll_blocking(&r, weft_coll_alltoall_setup(&r.task, "weft_alltoall", &comm->core, sendbuf,
                                                    recvbuf, count, dtype));
}

WEFT_API weft_status weft_alltoall(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, weft_dtype dtype) {
  WEFT_API_CALL(comm, "weft_alltoall", weft_alltoall_body(comm, sendbuf, recvbuf, count, dtype));
}

static weft_status weft_ialltoall_body(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, weft_dtype dtype, weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_ialltoall", req, &r));
  return coll_issue(r, req,
                    weft_coll_alltoall_setup(&r->task, "weft_ialltoall", &comm->core, sendbuf,
                                             recvbuf, count, dtype));
}

WEFT_API weft_status weft_ialltoall(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_request **req) {
  WEFT_API_CALL(comm, "weft_ialltoall",
                weft_ialltoall_body(comm, sendbuf, recvbuf, count, dtype, req));
}

weft_status weft_api_barrier(weft_comm *comm, const char *call) {
  weft_request r;
  return coll_blocking(&r, weft_coll_barrier_setup(&r.task, call, &comm->core));
}

WEFT_API weft_status weft_barrier(weft_comm *comm) {
  WEFT_API_CALL(comm, "weft_barrier", weft_api_barrier(comm, "weft_barrier"));
}

static weft_status weft_ibarrier_body(weft_comm *comm, weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_ibarrier", req, &r));
  return coll_issue(r, req, weft_coll_barrier_setup(&r->task, "weft_ibarrier", &comm->core));
}

WEFT_API weft_status weft_ibarrier(weft_comm *comm, weft_request **req) {
  WEFT_API_CALL(comm, "weft_ibarrier", weft_ibarrier_body(comm, req));
}
