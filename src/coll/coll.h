/* coll.h - one collective call, set up and checked (coll.c): the public
 * entry points (src/api) call a setup here, then hand the call to the engine
 * (src/engine), which advances it and asks the rest of this file's calls
 * when it is done or failed. Nothing here calls the engine. */
#ifndef WEFT_COLL_H
#define WEFT_COLL_H

#include <stddef.h>

#include "src/algo/algo.h"
#include "src/coll/core.h"
#include "weft.h"

/* The buffers a call touches on this rank, in elements: read from sendbuf,
 * written to recvbuf (0: not touched on this rank, may be NULL). The one
 * overlap allowed is in place: sendbuf + send_at == recvbuf + recv_at, as
 * in_place_rule says in words (NULL: the call never runs in place). */
typedef struct weft_coll_span {
  size_t send_elems, recv_elems;
  size_t send_at, recv_at;
  const char *in_place_rule;
} weft_coll_span;

struct weft_coll_staged;

/* How a call's buffers are reached: decided once per call, where its
 * buffers are classified (weft_coll_stage_in), and the setup takes the
 * start that route needs. */
typedef enum weft_coll_route {
  WEFT_ROUTE_HOST,     /* host memory: the algorithm works on the buffers */
  WEFT_ROUTE_STAGED,   /* device buffers copied through pinned host memory, whole */
  WEFT_ROUTE_SLICED,   /* ... in slices, each copied back once its algorithm is done */
  WEFT_ROUTE_IN_PLACE, /* device buffers where they lie, over CUDA IPC (the direct rounds), or a
                          copy of them in weft's device memory where peers cannot map them
                          (bounced: no legacy IPC handle); STAGED after all where a rank
                          cannot map one (weft_coll_device_restage) */
  WEFT_ROUTE_DEVICE_CHANNEL, /* device buffers where they lie, the host algorithm over the
                                transports' device channel (verbs: GPUDirect RDMA), its
                                reductions as kernels on this GPU (core.h, device_channel_all) */
} weft_coll_route;

/* One collective call as its caller holds it: set up here, driven by the
 * engine, read by the recorder and the timeout. `coll` is all the
 * algorithm sees (algo.h: its inputs and state); the rest is the caller's. */
typedef struct weft_coll_task {
  weft_coll coll;    /* first: an advance of coll.c's finds its task (weft_coll_task_of) */
  weft_core *comm;   /* the communicator's core */
  uint8_t kind;      /* which call it is, for its checks and messages */
  bool allreduce;    /* it is an allreduce (a gradient set's bucket too) */
  bool broadcast;    /* it is a broadcast: with allreduce, what the hierarchical form on
                        device buffers takes (coll_device.c) */
  double issued;     /* weft_now() when issued (engine.c): the recorder's and the timeout's start */
  uint32_t rec_slot; /* its flight recorder entry (recorder.c) */
  /* written by the communicator's links (comm_link.c): the peer of the last
   * WEFT_AGAIN and what was awaited from it, for the engine's sleep, the
   * timeout's sentence and the recorder */
  int waiting_peer;
  const char *waiting_for;
  bool quiet_failure; /* its failure is seen by every rank: no notice to peers */
  void *check;        /* WEFT_CHECK's fingerprint phase, an integer avg's buffer (coll.c) */
  uint8_t token;      /* weft_barrier's one byte */
  weft_coll_span span;             /* what the call touches on this rank (coll.c's checks) */
  struct weft_coll_staged *staged; /* device buffers staged through host memory, or bounced
                                      through weft's device memory (coll_device.c) */
  bool may_map_device;             /* the call may run on device buffers in place (a collective
                                      the direct algorithm can take: coll_device.c) */
  weft_coll_route route;           /* how its buffers are reached, decided once (coll_device.c) */
  bool device_restaging;           /* in place fell back to staging as it ran */
  int wire_dtype;                  /* the call's own wire dtype (a gradient set's); -1: the
                                      communicator's (weft_comm_set_wire_dtype) */
  uint64_t step_plus1;             /* a gradient set's bucket: its step + 1, in its signature */
  uint32_t device_signal;          /* a non-blocking device call's value for the user's stream
                                      (weft_coll_device_issue); 0: none, or signalled */
  void *user_stream;               /* the CUDA stream the call is ordered after: the
                                      communicator's (weft_comm_set_stream), or a gradient
                                      set's own */
  bool defer_user_link;            /* that stream is not made to wait for the result at issue
                                      (a gradient set's bucket: the set links it at its wait) */
  size_t device_scratch_bytes;     /* ... with this much device scratch (the reductions') */
  /* staged device buffers may run in slices (coll_device.c): how the call's
   * algorithm starts on one slice (a collective whose buffers each hold
   * count elements: allreduce, broadcast, reduce); NULL: in one piece */
  weft_status (*slice_start)(weft_coll *coll);
  /* the direct rounds as coll runs them (direct_guard): their advance, and
   * the collective's host algorithm should they fall back (NULL: the ring
   * allreduce) */
  weft_status (*direct_advance)(weft_coll *coll);
  weft_status (*direct_host_start)(weft_coll *coll);
  /* room for the context of its links (a weft_call_links) */
  _Alignas(max_align_t) unsigned char link_ctx[WEFT_LINK_CTX_BYTES];
} weft_coll_task;

_Static_assert(offsetof(weft_coll_task, coll) == 0, "an advance finds its task from its coll");

/* The task whose `coll` this is (const or not); only for a weft_coll set up here. */
#define weft_coll_task_of(coll) \
  _Generic((coll),                                                              \
      const weft_coll *: (const weft_coll_task *)(const void *)(coll),          \
      default: (weft_coll_task *)(void *)(coll))

/* A setup's answer besides OK (give the call to the engine) and errors (the
 * sentence is written): the call is already complete on this rank (count 0,
 * one rank). */
#define WEFT_COLL_DONE ((weft_status)2)

/* What the caller of a setup acts on: OK, WEFT_COLL_DONE or an error. Any
 * other positive status (a WEFT_AGAIN that climbed out of a memory table,
 * say) is no success: it becomes WEFT_ERR_INTERNAL with a sentence, never a
 * half-built call handed to the engine. */
static inline weft_status weft_coll_setup_verdict(weft_coll_task *task, weft_status setup) {
  if (setup <= 0 || setup == WEFT_COLL_DONE) return setup;
  return weft_core_error(task->comm, WEFT_ERR_INTERNAL, task->coll.call ? task->coll.call : "a collective",
                         "the call's setup answered %s (%d), neither done nor an error: a bug in "
                         "weft, the call was not started",
                         weft_status_name(setup), (int)setup);
}

/* Each checks its arguments against `comm` (the core of a communicator the
 * caller found live), takes the call's sequence number and starts its
 * algorithm in `coll`; `call` is the name the user called ("weft_iallreduce"). */
weft_status weft_coll_allreduce_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      weft_dtype dtype, weft_op op);
/* A gradient set's bucket: an allreduce whose signature carries the set's
 * `step`, with the set's own `wire` dtype (-1: the communicator's). With
 * own_stream (a device set), ordered after `stream` instead of the
 * communicator's, and that stream is not made to wait for the result at
 * issue: the set links it later, at its wait (weft_coll_device_stream_wait),
 * so the backward kernels queued after the bucket are not held behind it. */
weft_status weft_coll_bucket_allreduce_setup(weft_coll_task *task, const char *call,
                                             weft_core *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, weft_dtype dtype, weft_op op, int wire,
                                             uint64_t step, bool own_stream, void *stream);
weft_status weft_coll_broadcast_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      weft_dtype dtype, int root);
weft_status weft_coll_reduce_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                   const void *sendbuf, void *recvbuf, size_t count,
                                   weft_dtype dtype, weft_op op, int root);
weft_status weft_coll_allgather_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t sendcount,
                                      weft_dtype dtype);
weft_status weft_coll_reduce_scatter_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                           const void *sendbuf, void *recvbuf, size_t recvcount,
                                           weft_dtype dtype, weft_op op);
weft_status weft_coll_gather_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                   const void *sendbuf, void *recvbuf, size_t sendcount,
                                   weft_dtype dtype, int root);
weft_status weft_coll_scatter_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                    const void *sendbuf, void *recvbuf, size_t recvcount,
                                    weft_dtype dtype, int root);
weft_status weft_coll_alltoall_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     weft_dtype dtype);
weft_status weft_coll_barrier_setup(weft_coll_task *task, const char *call, weft_core *comm);

/* What the engine asks of a running call. */
/* WEFT_OK once every chunk the call sent is out (its buffers may be reused). */
weft_status weft_coll_flush(weft_coll_task *task);
/* The call is over: the peers it touched are no longer its. */
void weft_coll_end(weft_coll_task *task);
/* The sentence for a failure the engine saw while driving it; fails the
 * communicator and tells the peers. Returns the status to report. */
weft_status weft_coll_failed(weft_coll_task *task, weft_status st);
/* A timeout, worded with `verdict`: what the ranks found out together about
 * whom they waited on (the engine's culprit exchange). `st`: WEFT_ERR_TIMEOUT,
 * or WEFT_ERR_MISMATCH where the ranks found they wait in different calls. */
weft_status weft_coll_timed_out(weft_coll_task *task, weft_status st, const char *verdict);
/* Frees what the call's setup held besides the algorithm (WEFT_CHECK's phase,
 * an integer avg's 64-bit buffer; the task's check holds both). */
void weft_coll_release(weft_coll_task *task);

#endif
