/* api.h - what the public entry points (src/api) share: the check of a
 * user's handle, which they make before anything below them reads it, and
 * the request of a weft_iNAME call. */
#ifndef WEFT_API_H
#define WEFT_API_H

#include <stdatomic.h>
#include <stdbool.h>

#include "src/comm/comm.h"
#include "src/engine/engine.h"
#include "src/mem/mem.h"
#include "weft.h"

/* The refusal of a handle that is not a live communicator (NULL, destroyed,
 * never created): WEFT_ERR_INVALID, the sentence in weft_last_error(NULL). */
weft_status weft_api_dead_handle(const char *call);

/* In an entry point: return the refusal unless `comm` is live. */
#define WEFT_API_LIVE(comm, call)                                    \
  do {                                                               \
    if (!weft_comm_is_live(comm)) return weft_api_dead_handle(call); \
  } while (0)

/* weft.h: "a communicator is used by one thread at a time". A call that
 * finds another thread inside a call on the same communicator fails, and so
 * does the call it met, when it ends (its partners may have been paired with
 * the other thread's calls): WEFT_ERR_INVALID naming the rule, never a
 * silently wrong result. One exchange and one store per call. Waiting on a
 * request from another thread is no call on the communicator: allowed. */
static inline weft_status weft_api_enter(weft_comm *comm, const char *call, unsigned *clashes_at) {
  if (atomic_exchange_explicit(&comm->core.in_call, 1, memory_order_acquire)) {
    atomic_fetch_add_explicit(&comm->core.clashes, 1, memory_order_relaxed);
    return weft_core_error(&comm->core, WEFT_ERR_INVALID, call,
                           "another thread is inside a call on this communicator, which is used "
                           "by one thread at a time (weft.h): give each thread its own "
                           "(weft_comm_split), or wait on requests from the other threads");
  }
  *clashes_at = atomic_load_explicit(&comm->core.clashes, memory_order_relaxed);
  weft_mem_thread_enter(); /* weft_api_leave brings the caller's CUDA context back */
  return WEFT_OK;
}

static inline weft_status weft_api_leave(weft_comm *comm, const char *call, unsigned clashes_at,
                                         weft_status st) {
  bool clashed = atomic_load_explicit(&comm->core.clashes, memory_order_relaxed) != clashes_at;
  atomic_store_explicit(&comm->core.in_call, 0, memory_order_release);
  weft_mem_thread_restore(); /* a device buffer's context made current: the caller's back */
  if (clashed && st >= 0)
    return weft_core_error(&comm->core, WEFT_ERR_INVALID, call,
                           "another thread called on this communicator during this call, which "
                           "breaks the rule of one thread at a time (weft.h): its result cannot "
                           "be trusted");
  return st;
}

/* A public entry point's body: the handle checked, then `body` (a call of
 * the entry's work) inside the one-thread mark. */
#define WEFT_API_CALL(comm, call, body)                   \
  do {                                                    \
    WEFT_API_LIVE(comm, call);                            \
    unsigned clashes_at_ = 0;                             \
    WEFT_CHECK(weft_api_enter(comm, call, &clashes_at_)); \
    return weft_api_leave(comm, call, clashes_at_, body); \
  } while (0)

/* A zeroed request for a weft_iNAME call on `comm`; *req is set to NULL
 * first, so a call refused later leaves the caller's handle NULL.
 * WEFT_ERR_INVALID (sentence written) when req is NULL or comm is not
 * live, WEFT_ERR_NOMEM without memory. */
weft_status weft_api_request_new(weft_comm *comm, const char *call, weft_request **req,
                                 weft_request **out);

#endif
