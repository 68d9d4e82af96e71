/* tcp.h - the TCP transport's private types. One socket per (peer, channel)
 * carries frames both ways: a 16-byte header (magic+type, seq, length) then
 * the payload. The lower rank of a pair dials, naming the channel in its
 * handshake; the higher accepts on its one listener.
 *
 * How every rank learns of a death or a failure, although connections open
 * lazily (issue 14, items 3 and 4; none costs a system call per chunk):
 *  - a child forked without exec closes its copies of the sockets at once
 *    (pthread_atfork), so the death of a rank shows as EOF or a refused dial
 *    on every host, whoever else the rank forked;
 *  - a connection still waiting for its peer's dial probes the peer's
 *    listener every TCP_PROBE_INTERVAL_S while waiting: refused = gone;
 *  - a peer on this host (same pid namespace, its pid published with its
 *    address) is watched through a pidfd while this rank waits for it;
 *  - the first rank to fail, of its own cause, sends its notice to every
 *    peer's listener (abort_all), which every wait watches; ranks that fail
 *    because of a notice only pass it on their open connections. */
#ifndef WEFT_TCP_H
#define WEFT_TCP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "src/base/net.h"
#include "transports/transport.h"

#define TCP_FRAME_MAGIC 0x57460000u /* "WF" + type in the low 16 bits */
#define TCP_FRAME_DATA 1u
#define TCP_FRAME_ABORT 2u
#define TCP_ABORT_TEXT_MAX 300
#define TCP_HANDSHAKE_MAGIC 0x57464853u /* "WFHS" */
#define TCP_SEND_DEPTH 8 /* chunks in flight per connection (transport.h: send_depth) */
/* The handshake's channel for a failure notice (abort_all): a one-shot
 * connection that carries one abort frame to a peer this rank had no
 * connection with. Any rank may dial any other for it, lower or higher. */
#define TCP_NOTICE_CHANNEL 0xffffu
/* The handshake's channel for a liveness probe (tcp_wait): the accepter
 * closes it at once. Any rank may dial any other for it. */
#define TCP_PROBE_CHANNEL 0xfffeu
/* A connection waiting for its peer's dial probes the peer's listener this
 * often: a live process's kernel accepts even while the process computes,
 * an ended one's refuses (its forked children closed their copies of the
 * listener, tcp_fork_child). One connect per waited peer per interval. */
#define TCP_PROBE_INTERVAL_S 2.0

/* What a rank publishes: its listener (net.h's packed address), then, for
 * peers on the same host, what tells whether its process still lives: pid,
 * pid namespace, and a hash of the host identity (all big-endian). A peer
 * that gave only the packed address is watched by its sockets alone. */
#define TCP_ADDR_BYTES (NET_ADDR_PACKED + 4 + 8 + 8)
/* A peer's process seen gone (pidfd readable) fails a connection that has
 * nothing to read, cannot send, or was never dialed after this long: its
 * last bytes may still be on their way (between network namespaces, behind
 * a shaped link); any byte from it restarts the wait. */
#define TCP_GONE_GRACE_S 1.0

typedef struct tcp_frame_hdr {
  uint32_t magic_type; /* network byte order on the wire, like every field */
  uint32_t seq;
  uint32_t len;
  uint32_t reserved;
} tcp_frame_hdr;

/* The dialer's first bytes (all big-endian), followed by an HMAC over them. */
typedef struct tcp_handshake {
  uint32_t magic;
  uint32_t from;
  uint32_t to;
  uint32_t channel; /* < WEFT_TP_CHANNELS */
  uint32_t comm_hi, comm_lo;
} tcp_handshake;
#define TCP_HANDSHAKE_BYTES (sizeof(tcp_handshake) + 32) /* + WEFT_AUTH_MAC_BYTES */

/* ---- wire parsers: pure functions over bytes a peer sent, fuzzed on their
 * own (tests/fuzz/). They check the length first and never read past it. */

typedef struct tcp_handshake_info {
  uint32_t magic, from, to, channel;
  uint64_t comm_id;
  const uint8_t *signed_part; /* sizeof(tcp_handshake) bytes the MAC covers */
  const uint8_t *mac;         /* WEFT_AUTH_MAC_BYTES */
} tcp_handshake_info;

typedef struct tcp_frame_info {
  uint32_t type; /* TCP_FRAME_DATA, TCP_FRAME_ABORT, or anything a peer sent */
  uint32_t seq;
  uint32_t len;
} tcp_frame_info;

/* WEFT_ERR_PROTOCOL when shorter than TCP_HANDSHAKE_BYTES. */
/* A handshake on TCP_NOTICE_CHANNEL or TCP_PROBE_CHANNEL may come from any
 * other rank; the caller still checks `from` against the communicator's size. */
weft_status tcp_handshake_parse(const uint8_t *buf, size_t len, tcp_handshake_info *out);
/* After the MAC was verified: NULL when the handshake is one `my_rank` of
 * communicator `comm_id` accepts, else why not. */
const char *tcp_handshake_check(const tcp_handshake_info *hs, uint32_t my_rank, uint64_t comm_id);
/* WEFT_ERR_PROTOCOL when shorter than a header or not a weft frame (magic). */
weft_status tcp_frame_parse(const uint8_t *buf, size_t len, tcp_frame_info *out);

typedef struct tcp_send_entry {
  tcp_frame_hdr hdr;
  const char *src;
  size_t len;
  size_t sent; /* bytes of header+payload already written */
} tcp_send_entry;

enum tcp_conn_state { TCP_CONN_AWAIT_ACCEPT, TCP_CONN_UP, TCP_CONN_DEAD };

typedef struct tcp_ctx tcp_ctx;
typedef struct tcp_conn tcp_conn;

/* What this rank knows of one peer that TCP carries (from can_reach). */
typedef struct tcp_peer {
  bool known;                   /* can_reach said yes: an address to dial */
  struct sockaddr_storage addr; /* its listener */
  socklen_t addr_len;
  uint32_t pid;     /* same host and pid namespace: its pid, else 0 */
  int pidfd;        /* opened at its first wait, -1 before (or none) */
  bool pidfd_tried;
  double gone_at;   /* when its process was seen ended (0: alive); any
                       byte from it since moves this forward */
  const char *gone_why; /* how it was seen, for the sentence */
  unsigned polled;  /* the wait generation that last polled its pidfd */
} tcp_peer;

struct tcp_conn {
  tcp_ctx *ctx;
  int peer;
  int channel;
  int fd;
  enum tcp_conn_state state;
  weft_status dead_status; /* why, once DEAD */
  char where[80];          /* peer's address, for messages */

  tcp_send_entry *sq; /* ring of TCP_SEND_DEPTH entries */
  int sq_head, sq_count;

  tcp_frame_hdr rhdr; /* header of the frame being received */
  size_t rhdr_got;
  size_t rpay_got;    /* payload bytes received into the target */
  bool rframe_done;   /* header and payload complete, not yet released */
  char *slot;         /* receive slot for recv_peek, chunk_bytes long (ctx->slot_mem) */
  bool want_recv;     /* a data call said AGAIN waiting for input */
  int probe_fd;       /* AWAIT_ACCEPT: a liveness probe's connect in flight, else -1 */
  double probe_at;    /* when the last probe started */
};

struct tcp_ctx {
  const weft_transport_init_args *args; /* owned by the core, outlives ctx */
  const struct weft_mem_ops *slot_mem;  /* where receive slots come from (init args) */
  int listen_fd;
  struct sockaddr_storage addr;
  socklen_t addr_len;
  tcp_conn **conns;         /* by tcp_conn_index(peer, channel); NULL until first needed */
  tcp_peer *peers;          /* by rank */
  uint64_t host_hash;       /* this rank's host identity, hashed (TCP_ADDR_BYTES) */
  unsigned wait_gen;        /* counts waits, for tcp_peer.polled */
  int *pfd_peer;            /* for each pfds entry: the peer whose pidfd it is, else -1 */
  bool accept_pending;      /* the listener was readable in the last wait */
  bool notices_sent;        /* abort_all told every peer's listener once */
  tcp_ctx *fork_next, *fork_prev; /* every live context, for tcp_fork_child */
  int awaiting_accept;      /* conns in TCP_CONN_AWAIT_ACCEPT */
  struct pollfd *pfds;      /* scratch for wait, size * (WEFT_TP_CHANNELS + 1) + 2 entries */
  int nsending;             /* conns with queued sends */
  bool data_moved;          /* bytes moved inside a data call since the last progress:
                               partial progress, so no timeout while a chunk drains */
};

static inline int tcp_conn_index(int peer, int channel) {
  return peer * WEFT_TP_CHANNELS + channel;
}
/* The contract's opaque handles are these (transport.h). */
static inline tcp_conn *tcp_conn_of(weft_tp_conn *c) {
  return (tcp_conn *)c;
}
static inline tcp_ctx *tcp_ctx_of(weft_tp_ctx *c) {
  return (tcp_ctx *)c;
}

/* tcp_conn.c */
weft_status tcp_conn_create(tcp_ctx *ctx, int peer, int channel, tcp_conn **out);
weft_status tcp_conn_dial(tcp_conn *c, const struct sockaddr_storage *addr,
                          socklen_t len);
weft_status tcp_conn_accept_one(tcp_ctx *ctx, bool *progressed);
weft_status tcp_conn_push_sends(tcp_conn *c, bool *progressed);
weft_status tcp_conn_fail(tcp_conn *c, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* WEFT_AGAIN, or the failure when c's peer process is gone (tcp_peer.gone_at)
 * past TCP_GONE_GRACE_S: called only where a data call would say WEFT_AGAIN. */
weft_status tcp_conn_again(tcp_conn *c);
/* Returns `st` (a failure of a connection), or WEFT_ERR_PEER_LOST when a
 * failure notice waits on the listener: a peer that closed, reset or refused
 * may have done so because it heard of a failure first, and that first cause
 * is what this rank reports. Error paths only (it polls the listener). */
weft_status tcp_notice_first(tcp_ctx *ctx, weft_status st);
/* Probes: started by tcp_wait for a connection still waiting for its
 * peer's dial; tcp_conn_probe_done when its socket is ready. */
void tcp_conn_probe_start(tcp_conn *c, double now);
void tcp_conn_probe_done(tcp_conn *c);
/* The notice of a failure, as abort_all sends it to every peer's listener on
 * a connection of its own (TCP_NOTICE_CHANNEL). */
void tcp_send_notices(tcp_ctx *ctx, const char *reason);
void tcp_conn_destroy(tcp_conn *c);

/* the table's data members */
weft_status tcp_send_ready(weft_tp_conn *conn);
weft_status tcp_send(weft_tp_conn *conn, const void *src, size_t bytes, uint32_t seq,
                     const struct weft_mem_ops *mem);
weft_status tcp_send_idle(weft_tp_conn *conn);
weft_status tcp_recv_peek(weft_tp_conn *conn, uint32_t seq, size_t bytes, const void **data);
weft_status tcp_recv_release(weft_tp_conn *conn);
weft_status tcp_recv_into(weft_tp_conn *conn, uint32_t seq, size_t bytes, void *dst,
                          const struct weft_mem_ops *mem);

#endif
