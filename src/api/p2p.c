/* api/p2p.c - weft_send, weft_recv and their non-blocking forms: the engine's
 * p2p checks and fills the request (src/engine/p2p.c), the engine moves it
 * on the communicator's lane (its own channel of the same connections). */
#include <stdlib.h>

#include "src/api/api.h"
#include "src/base/status.h"
#include "src/comm/comm.h"
#include "src/engine/engine.h"
#include "src/engine/p2p.h"
#include "weft.h"

/* A blocking message: submitted and driven by the caller. */
static weft_status p2p_blocking(weft_request *r, weft_status setup) {
  if (setup < 0) return setup;
  weft_engine_submit(r, false);
  return weft_engine_wait(r);
}

/* A non-blocking message: the progress thread moves it. */
static weft_status p2p_issue(weft_request **req, weft_request *r, weft_status setup) {
  if (setup < 0) {
    free(r);
    return setup;
  }
  r->on_heap = true;
  weft_engine_submit(r, true);
  *req = r;
  return WEFT_OK;
}

static weft_status weft_send_body(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype,
                                  int peer, int tag) {
  weft_request r = {.kind = WEFT_REQ_SEND};
  return p2p_blocking(
      &r, weft_p2p_setup(&r, &comm->core, "weft_send", true, buf, count, dtype, peer, tag));
}

WEFT_API weft_status weft_send(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype,
                               int peer, int tag) {
  WEFT_API_CALL(comm, "weft_send", weft_send_body(comm, buf, count, dtype, peer, tag));
}

static weft_status weft_recv_body(weft_comm *comm, void *buf, size_t count, weft_dtype dtype,
                                  int peer, int tag) {
  weft_request r = {.kind = WEFT_REQ_SEND};
  return p2p_blocking(
      &r, weft_p2p_setup(&r, &comm->core, "weft_recv", false, buf, count, dtype, peer, tag));
}

WEFT_API weft_status weft_recv(weft_comm *comm, void *buf, size_t count, weft_dtype dtype, int peer,
                               int tag) {
  WEFT_API_CALL(comm, "weft_recv", weft_recv_body(comm, buf, count, dtype, peer, tag));
}

static weft_status weft_isend_body(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype,
                                   int peer, int tag, weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_isend", req, &r));
  return p2p_issue(
      req, r, weft_p2p_setup(r, &comm->core, "weft_isend", true, buf, count, dtype, peer, tag));
}

WEFT_API weft_status weft_isend(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype,
                                int peer, int tag, weft_request **req) {
  WEFT_API_CALL(comm, "weft_isend", weft_isend_body(comm, buf, count, dtype, peer, tag, req));
}

static weft_status weft_irecv_body(weft_comm *comm, void *buf, size_t count, weft_dtype dtype,
                                   int peer, int tag, weft_request **req) {
  weft_request *r = NULL;
  WEFT_CHECK(weft_api_request_new(comm, "weft_irecv", req, &r));
  return p2p_issue(
      req, r, weft_p2p_setup(r, &comm->core, "weft_irecv", false, buf, count, dtype, peer, tag));
}

WEFT_API weft_status weft_irecv(weft_comm *comm, void *buf, size_t count, weft_dtype dtype,
                                int peer, int tag, weft_request **req) {
  WEFT_API_CALL(comm, "weft_irecv", weft_irecv_body(comm, buf, count, dtype, peer, tag, req));
}
