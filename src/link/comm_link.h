/* comm_link.h - a communicator's peer table (weft_peer_table) and the links over
 * it (link.h): member m of a call is rank m of the communicator; each rank is
 * reached through the connection of the transport chosen for it, opened on
 * first use at the address the peer published. What the call waits for and
 * which peer failed land in the call's fields, for the engine's sleep, the
 * timeout's sentence and the flight recorder. The communicator (src/comm)
 * starts the transports and fills the table when it learns its peers; call
 * setup, the engine and p2p reach the transports through it. */
#ifndef WEFT_COMM_LINK_H
#define WEFT_COMM_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/error_sink.h"
#include "src/base/status.h"
#include "src/link/link.h"
#include "transports/transport.h"

#define WEFT_MAX_TRANSPORTS 3

/* A transport running in this communicator. */
typedef struct weft_transport_in_use {
  const weft_transport *ops;
  weft_tp_ctx *ctx;
  int builtin; /* index in the built-in table (the id peers publish) */
} weft_transport_in_use;

/* How one peer is reached. */
typedef struct weft_peer_route {
  int tp; /* index into tps; -1 for this rank */
  /* per channel (transport.h): WEFT_TP_CHANNEL_COLL for the collectives,
   * WEFT_TP_CHANNEL_P2P for point-to-point messages; NULL until first used */
  weft_tp_conn *conn[WEFT_TP_CHANNELS];
  const void *addr; /* what the peer published for that transport: its
                       connect address (the communicator's memory) */
  size_t addr_len;
  uint32_t last_send_seq; /* last collective that sent to this peer */
  bool is_active;         /* on the list of peers touched by the current call */
} weft_peer_route;

/* The peer table: the transports in use, which one reaches each peer and
 * its connections (one per channel: collectives, messages), the peers the
 * current call touched, progress, and the sink the transports write their
 * sentences to. */
typedef struct weft_peer_table {
  weft_transport_in_use tps[WEFT_MAX_TRANSPORTS]; /* in selection order */
  int ntps;
  weft_peer_route *peers; /* by rank; own entry unused */
  int *active;           /* ranks touched by the current call */
  int nactive;
  uint64_t events;      /* completed sends/receives, counted by the links: the
                           engine's sign of progress, for the timeout */
  weft_error_sink sink; /* transport error sentences land here */
} weft_peer_table;

/* The connection to `peer` on `channel` (its transport's connect on first
 * use, at the address the peer published: one address for every channel).
 * An error has its sentence in the sink. */
static inline weft_status weft_peer_table_conn(weft_peer_table *l, int peer, int channel,
                                               weft_tp_conn **out) {
  weft_peer_route *p = &l->peers[peer];
  if (!p->conn[channel]) {
    const weft_transport_in_use *t = &l->tps[p->tp];
    weft_status st =
        t->ops->connect(t->ctx, peer, channel, p->addr, p->addr_len, &p->conn[channel]);
    if (st < 0) return st;
  }
  *out = p->conn[channel];
  return WEFT_OK;
}

/* Closes the mappings of the peers' device memory lent for a call, and
 * with `kept_too` the registered ones as well (weft_comm_deregister: every
 * rank does it between two barriers). */
static inline void weft_peer_table_release_mem(weft_peer_table *l, int size, bool kept_too) {
  for (int peer = 0; peer < size; peer++) {
    weft_peer_route *p = &l->peers[peer];
    if (p->tp >= 0 && p->conn[WEFT_TP_CHANNEL_COLL])
      l->tps[p->tp].ops->release_peer_mem(p->conn[WEFT_TP_CHANNEL_COLL], kept_too);
  }
}

/* Before a failure notice: opens the collectives' pair with each of
 * `peers` (n ranks) whose transport carries no notice to a peer it never
 * connected to (shm: the lower rank makes the segment the higher one waits
 * for), so the notice reaches a peer waiting for that pair. Over tcp a
 * notice goes to every listener without a connection, so none is opened
 * (a new one costs an fd and an accept that waits for the dialer's proof). */
static inline void weft_peer_table_open_for_notices(weft_peer_table *l, const int *peers, int n,
                                                    int size, int me) {
  for (int i = 0; peers && i < n; i++) {
    int p = peers[i];
    weft_tp_conn *conn;
    if (p < 0 || p >= size || p == me || l->peers[p].tp < 0 || l->peers[p].conn[WEFT_TP_CHANNEL_COLL] ||
        l->tps[l->peers[p].tp].ops->caps.notices_reach_unconnected)
      continue;
    (void)weft_peer_table_conn(l, p, WEFT_TP_CHANNEL_COLL, &conn);
  }
}

/* Tells every peer, through every transport, that this rank failed. */
static inline void weft_peer_table_abort_all(weft_peer_table *l, const char *reason) {
  for (int t = 0; t < l->ntps; t++) l->tps[t].ops->abort_all(l->tps[t].ctx, reason);
}

/* The links of one call over a peer table. */
typedef struct weft_call_links {
  weft_peer_table *links;
  /* the call's (communicator ranks): the peer of the last WEFT_AGAIN or
   * failure and what was awaited from it, the peer whose link failed */
  int *waiting_peer, *fail_peer;
  const char **waiting_for;
  /* device buffers where they lie (coll.h, WEFT_ROUTE_DEVICE_CHANNEL):
   * chunks to a peer whose transport carries device chunks take its
   * device channel (transport.h), the rest (CUDA IPC's descriptors to the
   * ranks of this host) the collectives' */
  bool device;
} weft_call_links;

_Static_assert(sizeof(weft_call_links) <= WEFT_LINK_CTX_BYTES,
               "a communicator's links fit the room a call keeps for them");

extern const weft_link_ops weft_call_links_ops;

/* Sets cl up for one call over `links` and returns its links. `cl` may be
 * the room a call keeps (weft_coll.link_ctx). */
static inline weft_link weft_call_links_init(weft_call_links *cl, weft_peer_table *links,
                                             int *waiting_peer, int *fail_peer,
                                             const char **waiting_for) {
  *cl = (weft_call_links){.links = links,
                          .waiting_peer = waiting_peer,
                          .fail_peer = fail_peer,
                          .waiting_for = waiting_for,
                          .device = false};
  return (weft_link){.ops = &weft_call_links_ops, .ctx = cl};
}

#endif
