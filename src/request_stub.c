/* request_stub.c - TEMPORARY: non-blocking forms that run the blocking call
 * and return a completed request. Replaced by the progress engine. */
#include <stdlib.h>
#include "weft.h"
#include "status.h"

struct weft_request { weft_status st; };

static weft_status done_req(weft_status st, weft_request **req) {
  *req = malloc(sizeof **req);
  if (!*req) return WEFT_ERR_NOMEM;
  (*req)->st = st;
  return WEFT_OK;
}
#define STUB(call) do { if (!req) return WEFT_ERR_INVALID; *req = NULL; weft_status s_ = (call); if (s_ < 0 && s_ != WEFT_ERR_PEER_LOST && s_ != WEFT_ERR_TIMEOUT && s_ != WEFT_ERR_MISMATCH) return s_; return done_req(s_, req);} while (0)

WEFT_API weft_status weft_iallreduce(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, weft_op o, weft_request **req) { STUB(weft_allreduce(c, s, r, n, d, o)); }
WEFT_API weft_status weft_ibroadcast(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, int root, weft_request **req) { STUB(weft_broadcast(c, s, r, n, d, root)); }
WEFT_API weft_status weft_ireduce(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, weft_op o, int root, weft_request **req) { STUB(weft_reduce(c, s, r, n, d, o, root)); }
WEFT_API weft_status weft_iallgather(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, weft_request **req) { STUB(weft_allgather(c, s, r, n, d)); }
WEFT_API weft_status weft_ireduce_scatter(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, weft_op o, weft_request **req) { STUB(weft_reduce_scatter(c, s, r, n, d, o)); }
WEFT_API weft_status weft_igather(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, int root, weft_request **req) { STUB(weft_gather(c, s, r, n, d, root)); }
WEFT_API weft_status weft_iscatter(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, int root, weft_request **req) { STUB(weft_scatter(c, s, r, n, d, root)); }
WEFT_API weft_status weft_ialltoall(weft_comm *c, const void *s, void *r, size_t n, weft_dtype d, weft_request **req) { STUB(weft_alltoall(c, s, r, n, d)); }
WEFT_API weft_status weft_ibarrier(weft_comm *c, weft_request **req) { STUB(weft_barrier(c)); }
WEFT_API weft_status weft_wait(weft_request **req) {
  if (!req || !*req) return WEFT_OK;
  weft_status st = (*req)->st; free(*req); *req = NULL; return st;
}
WEFT_API weft_status weft_test(weft_request **req, int *done) { *done = 1; return weft_wait(req); }
WEFT_API weft_status weft_wait_all(weft_request **reqs, int n) {
  weft_status first = WEFT_OK;
  for (int i = 0; i < n; i++) { weft_status s = weft_wait(&reqs[i]); if (s && !first) first = s; }
  return first;
}
WEFT_API weft_status weft_send(weft_comm *c, const void *b, size_t n, weft_dtype d, int p, int t) { (void)c; (void)b; (void)n; (void)d; (void)p; (void)t; return WEFT_ERR_UNSUPPORTED; }
WEFT_API weft_status weft_recv(weft_comm *c, void *b, size_t n, weft_dtype d, int p, int t) { (void)c; (void)b; (void)n; (void)d; (void)p; (void)t; return WEFT_ERR_UNSUPPORTED; }
WEFT_API weft_status weft_isend(weft_comm *c, const void *b, size_t n, weft_dtype d, int p, int t, weft_request **req) { *req = NULL; return weft_send(c, b, n, d, p, t); }
WEFT_API weft_status weft_irecv(weft_comm *c, void *b, size_t n, weft_dtype d, int p, int t, weft_request **req) { *req = NULL; return weft_recv(c, b, n, d, p, t); }
WEFT_API weft_status weft_comm_split(weft_comm *c, int color, int key, weft_comm **out) { (void)c; (void)color; (void)key; *out = NULL; return WEFT_ERR_UNSUPPORTED; }
