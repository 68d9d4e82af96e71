/* api/requests.c - weft_wait, weft_test, weft_wait_all: the engine drives a
 * request until it is done; a done request is freed and its handle NULLed.
 * And what every entry point shares (api.h): the handle check, a new
 * request. */
#include <stddef.h>
#include <stdlib.h>

#include "src/api/api.h"
#include "src/base/status.h"
#include "src/comm/comm.h"
#include "src/engine/engine.h"
#include "weft.h"

weft_status weft_api_dead_handle(const char *call) {
  return weft_init_error(WEFT_ERR_INVALID, -1, call,
                         "the communicator handle is not a live communicator (NULL, destroyed, "
                         "or never created)");
}

weft_status weft_api_request_new(weft_comm *comm, const char *call, weft_request **req,
                                 weft_request **out) {
  if (!req)
    return weft_comm_is_live(comm)
               ? weft_core_error(&comm->core, WEFT_ERR_INVALID, call, "req is NULL")
               : weft_init_error(WEFT_ERR_INVALID, -1, call, "req is NULL");
  *req = NULL;
  WEFT_API_LIVE(comm, call);
  *out = calloc(1, sizeof **out);
  return *out ? WEFT_OK : WEFT_ERR_NOMEM;
}

static weft_status request_finish(weft_request **req) {
  weft_status st = weft_request_free(*req);
  *req = NULL;
  return st;
}

WEFT_API weft_status weft_wait(weft_request **req) {
  if (!req) return weft_init_error(WEFT_ERR_INVALID, -1, "weft_wait", "req is NULL");
  if (!*req) return WEFT_OK;
  weft_mem_thread_enter(); /* may drive device calls: the caller's context back after */
  weft_engine_wait(*req);
  weft_mem_thread_restore();
  return request_finish(req);
}

WEFT_API weft_status weft_test(weft_request **req, int *done) {
  if (!req || !done)
    return weft_init_error(WEFT_ERR_INVALID, -1, "weft_test", "req or done is NULL");
  *done = 1;
  if (!*req) return WEFT_OK;
  weft_mem_thread_enter();
  bool finished = weft_engine_test(*req);
  weft_mem_thread_restore();
  if (!finished) {
    *done = 0;
    return WEFT_OK;
  }
  return request_finish(req);
}

WEFT_API weft_status weft_wait_all(weft_request **reqs, int n) {
  if (n < 0 || (n > 0 && !reqs))
    return weft_init_error(WEFT_ERR_INVALID, -1, "weft_wait_all", "reqs is NULL or n < 0");
  weft_status first = WEFT_OK;
  for (int i = 0; i < n; i++) {
    weft_status st = weft_wait(&reqs[i]);
    if (st && !first) first = st;
  }
  return first;
}
