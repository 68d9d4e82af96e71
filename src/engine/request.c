/* request.c - how a request ends: completed by whoever drove it (the engine's
 * queue, engine.c, or the p2p lane, p2p.c), then freed by the caller of a
 * weft_iNAME call. Apart from both drivers, so that each calls down into it
 * and neither calls the other back. */
#include <stdatomic.h>
#include <stdlib.h>

#include "src/engine/engine.h"

void weft_request_complete(weft_request *req, weft_status st) {
  weft_coll *coll = &req->task.coll;
  if (coll->cleanup) coll->cleanup(coll);
  weft_coll_release(&req->task);
  weft_coll_scratch_release(coll);
  req->status = st;
  atomic_store_explicit(&req->done, 1, memory_order_release);
}

weft_status weft_request_free(weft_request *req) {
  weft_status st = req->status;
  free(req);
  return st;
}
