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
  WEFT_CTL_PROBE_STATE = 19, /* its answer */
  /* growing (recover.c): a guest, a process that is no rank yet, talks to
   * the member it dialed (its sponsor) on its one connection, both ways */
  WEFT_CTL_JOIN = 20,  /* guest: let me in (its pid and host) */
  WEFT_CTL_ADMIT = 21, /* sponsor: your rank and the new size */
  WEFT_CTL_INFO = 22,  /* guest: what it publishes for the new communicator */
  WEFT_CTL_TABLE = 23  /* sponsor: the new communicator's id and every rank's */
};

/* The `from` of a guest's hello, and of its messages in the inbox: guest g
 * (in the order they arrived) is from WEFT_CTL_GUEST(g), a negative number. */
#define WEFT_CTL_GUEST_HELLO 0xFFFFFFFFu
#define WEFT_CTL_GUEST(g) (-2 - (g))
#define WEFT_CTL_GUEST_INDEX(from) (-2 - (from))

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
 * to say yet: a dead peer then shows as lost at once. On an open one,
 * pings it now and then (at most every WEFT_SUSPECT / 4): a cut link then
 * shows within WEFT_SUSPECT. For whoever waits to hear from `peer`. */
void weft_ctl_touch(weft_ctl *ctl, int peer);
/* Whether every message queued so far (to peers and guests) has reached
 * its host (its kernel acknowledged it), or that peer is lost. */
bool weft_ctl_flushed(weft_ctl *ctl);

/* A message to guest `g` on its connection; false if it is gone. */
bool weft_ctl_send_guest(weft_ctl *ctl, int g, uint32_t kind, const void *body, size_t len);
/* Whether guest g's connection is still open. */
bool weft_ctl_guest_alive(const weft_ctl *ctl, int g);

/* The guest's side, blocking, on a connection it dialed to a member's
 * listener: its hello and messages (hello: comm_id, and the nonce that every
 * frame's MAC covers, both ways), and reading one whole frame until the
 * deadline (WEFT_ERR_TIMEOUT, WEFT_ERR_PEER_LOST when it ends, or
 * WEFT_ERR_PROTOCOL when a frame fails its proof). *body is malloc'ed. */
weft_status weft_ctl_guest_hello(int fd, uint64_t comm_id, const weft_auth_key *key,
                                 uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], double deadline,
                                 weft_error_sink *err);
weft_status weft_ctl_guest_send(int fd, const weft_auth_key *key,
                                const uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], uint32_t kind,
                                const void *body, size_t len, double deadline,
                                weft_error_sink *err);
weft_status weft_ctl_guest_recv(int fd, const weft_auth_key *key,
                                const uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], uint32_t *kind,
                                uint8_t **body, uint32_t *len, double deadline,
                                weft_error_sink *err);

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
