/* api.h - what the public entry points (src/api) share: the check of a
 * user's handle, which they make before anything below them reads it, and
 * the request of a weft_iNAME call. */
#ifndef WEFT_API_H
#define WEFT_API_H

#include "src/comm/comm.h"
#include "src/engine/engine.h"
#include "weft.h"

/* The refusal of a handle that is not a live communicator (NULL, destroyed,
 * never created): WEFT_ERR_INVALID, the sentence in weft_last_error(NULL). */
weft_status weft_api_dead_handle(const char *call);

/* In an entry point: return the refusal unless `comm` is live. */
#define WEFT_API_LIVE(comm, call)                                    \
  do {                                                               \
    if (!weft_comm_is_live(comm)) return weft_api_dead_handle(call); \
  } while (0)

/* A zeroed request for a weft_iNAME call on `comm`; *req is set to NULL
 * first, so a call refused later leaves the caller's handle NULL.
 * WEFT_ERR_INVALID (sentence written) when req is NULL or comm is not
 * live, WEFT_ERR_NOMEM without memory. */
weft_status weft_api_request_new(weft_comm *comm, const char *call, weft_request **req,
                                 weft_request **out);

#endif
