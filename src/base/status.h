/* status.h - internal side of weft_status: the "try again" code used between
 * the algorithms and the transports, and the CHECK macros that log where an
 * error passed on its way up (file:line under WEFT_DEBUG=TRACE). */
#ifndef WEFT_STATUS_H
#define WEFT_STATUS_H

#include "src/base/log.h"
#include "weft.h"

/* Not an error: the operation cannot make progress now (no credit, no data
 * yet). Never returned through the public API. */
#define WEFT_AGAIN ((weft_status)1)

/* weft_comm_revoke: the words a revoking rank's notice carries, and how a
 * peer that fails by that notice (WEFT_ERR_PEER_LOST, as for any notice)
 * turns it into WEFT_ERR_REVOKED, as weft.h promises every rank. */
#define WEFT_REVOKED_WORDS "revoked the communicator (weft_comm_revoke)"
weft_status weft_status_revoked_or(weft_status st, const char *words);

#define WEFT_CHECK(expr)                                                          \
  do {                                                                            \
    weft_status check_status_ = (expr);                                           \
    if (check_status_ < 0) {                                                      \
      WEFT_TRACE(WEFT_SUBSYS_ALL, "%s:%d %s -> %s", __FILE__, __LINE__, #expr,   \
                 weft_status_name(check_status_));                                \
      return check_status_;                                                       \
    }                                                                             \
  } while (0)

/* Same, but jumps to a cleanup label with `var` set. */
#define WEFT_CHECK_GOTO(expr, var, label)                                         \
  do {                                                                            \
    (var) = (expr);                                                               \
    if ((var) < 0) {                                                              \
      WEFT_TRACE(WEFT_SUBSYS_ALL, "%s:%d %s -> %s", __FILE__, __LINE__, #expr,   \
                 weft_status_name(var));                                          \
      goto label;                                                                 \
    }                                                                             \
  } while (0)

/* Return anything but OK (an error or WEFT_AGAIN) to the caller. */
#define WEFT_STATUS_PASS(expr)                \
  do {                                        \
    weft_status pass_status_ = (expr);        \
    if (pass_status_ != WEFT_OK) return pass_status_; \
  } while (0)

/* errno -> status at the edge: resets and EOF mean the peer is gone. */
weft_status weft_status_from_errno(int err);

#endif
