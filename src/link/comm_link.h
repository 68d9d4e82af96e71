/* comm_link.h - a communicator's links (link.h): member m of a call is rank
 * m of the communicator; each rank is reached through the connection of the
 * transport chosen for it, opened on first use. What the call waits for and
 * which peer failed land in the call's fields, for the engine's sleep, the
 * timeout's sentence and the flight recorder. */
#ifndef WEFT_COMM_LINK_H
#define WEFT_COMM_LINK_H

#include "src/link/link.h"

struct weft_comm;

typedef struct weft_comm_link {
  struct weft_comm *comm;
  /* the call's (communicator ranks): the peer of the last WEFT_AGAIN or
   * failure and what was awaited from it, the peer whose link failed */
  int *waiting_peer, *fail_peer;
  const char **waiting_for;
} weft_comm_link;

_Static_assert(sizeof(weft_comm_link) <= WEFT_LINK_CTX_BYTES,
               "a communicator's links fit the room a call keeps for them");

extern const weft_link_ops weft_comm_link_ops;

/* Sets cl up for one call on `comm` and returns its links. `cl` may be the
 * room a call keeps (weft_coll.link_ctx). */
static inline weft_link weft_comm_link_init(weft_comm_link *cl, struct weft_comm *comm,
                                            int *waiting_peer, int *fail_peer,
                                            const char **waiting_for) {
  *cl = (weft_comm_link){.comm = comm,
                         .waiting_peer = waiting_peer,
                         .fail_peer = fail_peer,
                         .waiting_for = waiting_for};
  return (weft_link){.ops = &weft_comm_link_ops, .ctx = cl};
}

#endif
