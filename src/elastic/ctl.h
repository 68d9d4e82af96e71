/* ctl.h - a communicator's control plane: a listener of its own and TCP
 * connections to its peers, used only to recover from a failure (the
 * agreement, agree.h). The data transports cannot be trusted for that: a
 * failed call leaves chunks half sent on them, and a dead rank may hold a
 * shared segment or a queue pair in any state. The control plane carries a
 * few small messages, is opened at creation (one listening fd) and dials a
 * peer only when it first has something to tell it.
 *
 * It is also the failure detector recovery relies on. A peer counts as
 * lost, for good, when
 *  - its listener refuses a dial (no process holds it: the rank ended),
 *  - a connection with it ends (EOF, reset), after everything it sent
 *    before has been read,
 *  - its process ends, on this host (a pidfd, so a forked child that still
 *    holds its sockets does not keep it alive), or
 *  - a dial or a write gets no answer from its host for WEFT_SUSPECT
 *    seconds (a cut link, a host that is down).
 * A live rank that is late (computing, not yet in the agreement) is waited
 * for: its kernel accepts the dial, and nothing here counts it as lost.
 *
 * A connection carries frames one way, from the dialer. It proves it
 * belongs to the job with the job key (auth.h), without a round trip: its
 * first frame names the communicator, the dialer's rank and a fresh nonce,
 * and every frame carries a MAC over that nonce, its header and its body.
 * So a frame is on its way as soon as the kernel connected, and reaches a
 * peer that is not reading any more (its kernel takes it): what a rank
 * relays before it leaves the agreement is never held up by a rank that
 * already left. (A recording of a whole connection could be replayed
 * within the communicator's life; it repeats what that rank said.) */
#ifndef WEFT_ELASTIC_CTL_H
#define WEFT_ELASTIC_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "src/base/auth.h"
#include "src/base/error_sink.h"
#include "src/base/net.h"
#include "weft.h"

typedef struct weft_ctl weft_ctl;

/* What a message is for (the agreement's kinds; ctl itself uses the rest). */
enum {
  WEFT_CTL_PROPOSAL = 16,    /* a participant's input, to the coordinator */
  WEFT_CTL_DECISION = 17,    /* the outcome, from whoever holds it, to everyone */
  WEFT_CTL_PROBE_ASK = 18,   /* the stall probe: which call are you in? */
  WEFT_CTL_PROBE_STATE = 19  /* its answer */
};

/* One received message; `body` stays valid until weft_ctl_take or close. */
typedef struct weft_ctl_msg {
  int from;
  uint32_t kind;
  uint32_t epoch;
  uint32_t len;
  uint8_t *body;
  struct weft_ctl_msg *next;
} weft_ctl_msg;

/* Opens the listener on `local` (port 0: any), for rank `rank` of `size`,
 * communicator `comm_id`. *addr gets the address to publish. */
weft_status weft_ctl_open(int rank, int size, uint64_t comm_id, const weft_auth_key *key,
                          const struct sockaddr_storage *local, socklen_t local_len,
                          double suspect_s, weft_ctl **out, uint8_t addr[NET_ADDR_PACKED],
                          weft_error_sink *err);
/* What a peer published: its listener, its pid, and whether it runs on
 * this host (then its pid is watched). */
void weft_ctl_set_peer(weft_ctl *ctl, int peer, const uint8_t addr[NET_ADDR_PACKED], uint32_t pid,
                       bool same_host);
/* The communicator's id, once learned (every hello names it). */
void weft_ctl_set_id(weft_ctl *ctl, uint64_t comm_id);
/* Closes every socket and frees everything. NULL is fine. */
void weft_ctl_close(weft_ctl *ctl);

int weft_ctl_rank(const weft_ctl *ctl);
int weft_ctl_size(const weft_ctl *ctl);

/* Whether `peer` is lost, and the sentence that says why (NULL if not). */
const char *weft_ctl_lost(const weft_ctl *ctl, int peer);
/* Counts `peer` as lost (a rank that other ranks report lost). */
void weft_ctl_mark_lost(weft_ctl *ctl, int peer, const char *why);

/* Queues a message to `peer` (dialing it first if need be). Never blocks;
 * a lost peer's messages are dropped. */
void weft_ctl_send(weft_ctl *ctl, int peer, uint32_t kind, uint32_t epoch, const void *body,
                   size_t len);
/* Dials `peer` if no connection to it is open or under way, with nothing
 * to say yet: a dead peer then shows as lost at once. */
void weft_ctl_touch(weft_ctl *ctl, int peer);
/* Whether every message queued so far has reached each peer's host (its
 * kernel acknowledged it) or that peer is lost. */
bool weft_ctl_flushed(weft_ctl *ctl);

/* Moves every connection once: accepts, dials, writes, reads whole
 * messages into the inbox, notices losses. Waits in poll at most until
 * `until` for something to happen (0: does not wait). Returns WEFT_OK, or
 * WEFT_ERR_SYSTEM / WEFT_ERR_NOMEM with a sentence in *err. */
weft_status weft_ctl_progress(weft_ctl *ctl, double until, weft_error_sink *err);

/* The received messages, oldest first (NULL when none). */
weft_ctl_msg *weft_ctl_inbox(weft_ctl *ctl);
/* Removes one message of the inbox and frees it. */
void weft_ctl_take(weft_ctl *ctl, weft_ctl_msg *msg);

#endif
