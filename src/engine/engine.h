/* engine.h - requests and the engine that drives them. Every operation, the
 * blocking ones included, is a request: collectives wait in one queue per
 * communicator and run one at a time in issue order (the order that matches
 * them across ranks); point-to-point messages run beside them on their own
 * lane (p2p.h: a channel of the same connections), driven by the same
 * driver. Whoever holds the communicator's call lock drives: a caller
 * blocked in weft_wait or a blocking call, or else the communicator's
 * progress thread, which steps aside as soon as a caller wants to drive, so
 * a blocking call never hands its data off to another thread. */
#ifndef WEFT_ENGINE_H
#define WEFT_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "src/coll/coll.h"
#include "src/coll/core.h"
#include "src/engine/engine_state.h"
#include "src/engine/p2p.h"

typedef enum weft_req_kind { WEFT_REQ_COLL, WEFT_REQ_SEND, WEFT_REQ_RECV } weft_req_kind;

struct weft_request {
  weft_core *comm; /* the communicator's core (send/recv too: its lane is a channel) */
  weft_req_kind kind;
  bool on_heap;      /* made by a weft_iNAME call: freed by wait/test; else it
                        lives on a blocking caller's stack */
  bool started;      /* the engine has advanced it (the recorder knows) */
  bool time_pending; /* a blocking call queued by its own driver on an idle
                        engine: the driver takes its issue time after its first
                        sends (queue_pass), not before them */
  bool algo_done;    /* the algorithm finished; its sends may still be draining */
  atomic_int done;   /* set last, with `status`: the driver never touches it after */
  weft_status status;
  weft_request *next; /* collective queue, or the p2p lane's per-peer list */
  weft_coll_task task; /* collectives: the call and its algorithm's state machine */
  weft_p2p_op p2p;    /* send/recv: the message */
};

/* Appends a started request to its communicator's queue (collectives) or
 * lane (send/recv). With `wake`, the progress thread is started if needed
 * and told there is work: non-blocking calls; a blocking caller drives
 * itself right after. Never blocks on the network. */
void weft_engine_submit(weft_request *req, bool wake);

/* Drives until `req` is done; returns its status. Bounded by the timeout:
 * no progress for that long fails the communicator. */
weft_status weft_engine_wait(weft_request *req);

/* A blocking collective: submit, then drive until it is done (as submit
 * and wait), taking the driver's place first when it is free. */
weft_status weft_engine_call(weft_request *req);

/* One non-blocking pass when nobody else is driving; true when `req` is done. */
bool weft_engine_test(weft_request *req);

/* A collective set up in req->task (a weft_coll_*_setup) made a request:
 * on_heap for a weft_iNAME call's (wait/test free it), else it lives on a
 * blocking caller's stack. Inline: it is on every blocking call's path. */
static inline void weft_request_coll(weft_request *req, bool on_heap) {
  req->comm = req->task.comm;
  req->kind = WEFT_REQ_COLL;
  req->on_heap = on_heap;
  req->algo_done = false;
  req->started = false;
  req->time_pending = false;
  req->status = WEFT_OK;
}

/* A blocking collective whose setup (weft_coll_*_setup on req->task) said
 * `setup`: complete already, refused (its sentence written), or driven
 * here until done, as weft_engine_call. The request lives on the caller's
 * stack. */
static inline weft_status weft_engine_blocking(weft_request *req, weft_status setup) {
  setup = weft_coll_setup_verdict(&req->task, setup);
  if (setup == WEFT_COLL_DONE) return WEFT_OK;
  if (setup < 0) return setup;
  weft_request_coll(req, false);
  return weft_engine_call(req);
}

/* Frees a done request made for a weft_iNAME call (src/api); returns its status. */
weft_status weft_request_free(weft_request *req);

/* Marks `req` done with `st`. The driver's last touch of it. */
void weft_request_complete(weft_request *req, weft_status st);

/* For destroy: stops the progress thread and completes every outstanding
 * request with WEFT_ERR_ABORTED. */
void weft_engine_stop(weft_core *comm);

#endif
