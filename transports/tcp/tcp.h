/* tcp.h - the TCP transport's private types. A connection per (peer, channel)
 * carries frames both ways: a 20-byte header (magic+type, the call's number,
 * length, the chunk's whole length, the call's signature: call_tag.h) then
 * the payload. A collectives connection may be
 * several sockets, its streams (WEFT_TCP_STREAMS): a large chunk is cut in
 * order into one piece per stream, each a frame of its own, so the receiver
 * reads each piece straight to its place; small chunks ride stream 0 alone.
 * Streams past the first may be driven by a few helper threads
 * (WEFT_TCP_THREADS, tcp_pool.c), stream 0 always by the caller, so a small
 * chunk is never handed off. With several interfaces (a WEFT_SOCKET_IFNAME
 * list) each rail has a listener and stream s rides rail s mod rails.
 * The lower rank of a pair dials every stream, naming the channel, the
 * stream and the count in its handshake; the higher accepts.
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

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "src/base/net.h"
#include "transports/transport.h"

#define TCP_FRAME_MAGIC 0x57460000u /* "WF" + type in the low 16 bits */
#define TCP_FRAME_DATA 1u
#define TCP_FRAME_ABORT 2u
#define TCP_ABORT_TEXT_MAX 300
#define TCP_HANDSHAKE_MAGIC 0x57464853u /* "WFHS" */
#define TCP_SEND_DEPTH 8 /* chunks in flight per connection (transport.h: send_depth) */
/* Chunks of at least this many bytes are written at the next progress, not
 * when posted (tcp_send): the kernel pushes a partial segment at the end of
 * every write, so one sendmsg for a call's chunks moves them faster.
 * Smaller chunks go out at once (their latency is the cost), and so do
 * chunks on a pipeline's path (WEFT_SEND_NOW) (docs/tuning.md, "When a
 * large chunk is written"; docs/tuning.md, "Sends on a pipeline's path"). */
#define TCP_DEFER_MIN (64u << 10)
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
 * that gave only the packed address is watched by its sockets alone.
 * Then (TCP_ADDR_EXT) the streams it wants per collectives connection and
 * its rails, and the listener of each rail past the first: a pair uses the
 * smaller stream count and the rails both have, so both ranks reach the same
 * answer from the same published facts. */
#define TCP_ADDR_BYTES (NET_ADDR_PACKED + 4 + 8 + 8)
#define TCP_MAX_STREAMS 16 /* WEFT_TCP_STREAMS' bound */
#define TCP_MAX_THREADS 16 /* WEFT_TCP_THREADS' bound */
#define TCP_MAX_RAILS 4    /* interfaces striped over; fits WEFT_TRANSPORT_ADDR_MAX */
#define TCP_ADDR_EXT(rails) (TCP_ADDR_BYTES + 2 + ((rails) - 1) * NET_ADDR_PACKED)
_Static_assert(TCP_ADDR_EXT(TCP_MAX_RAILS) <= WEFT_TRANSPORT_ADDR_MAX, "rails fit the address");
/* A chunk is cut into pieces of at least this many bytes, so a small chunk
 * costs one frame on stream 0, as with one stream; pieces start at
 * multiples of TCP_PIECE_ALIGN. */
#define TCP_PIECE_MIN (32u << 10)
#define TCP_PIECE_ALIGN 64u
/* A peer's process seen gone (pidfd readable) fails a connection that has
 * nothing to read, cannot send, or was never dialed after this long: its
 * last bytes may still be on their way (between network namespaces, behind
 * a shaped link); any byte from it restarts the wait. */
#define TCP_GONE_GRACE_S 1.0

typedef struct tcp_frame_hdr {
  uint32_t magic_type; /* network byte order on the wire, like every field */
  uint32_t seq;         /* the call's number; with sig, the chunk's tag */
  uint32_t len;        /* this frame's payload: the chunk, or its piece on this stream */
  uint32_t total;      /* the whole chunk's length (0 from a sender that did not say: len) */
  uint32_t sig;        /* the call's signature (call_tag.h) */
} tcp_frame_hdr;

/* The dialer's first bytes (all big-endian), followed by an HMAC over them. */
typedef struct tcp_handshake {
  uint32_t magic;
  uint32_t from;
  uint32_t to;
  uint32_t channel; /* < WEFT_TP_CHANNELS in the low 16 bits; the stream in bits 16..23,
                       the connection's stream count in bits 24..31 (0: one) */
  uint32_t comm_hi, comm_lo;
} tcp_handshake;
#define TCP_HANDSHAKE_BYTES (sizeof(tcp_handshake) + 32) /* + WEFT_AUTH_MAC_BYTES */

/* ---- wire parsers: pure functions over bytes a peer sent, fuzzed on their
 * own (tests/fuzz/). They check the length first and never read past it. */

typedef struct tcp_handshake_info {
  uint32_t magic, from, to, channel;
  uint32_t stream, nstreams; /* from the channel word; nstreams >= 1 */
  uint64_t comm_id;
  const uint8_t *signed_part; /* sizeof(tcp_handshake) bytes the MAC covers */
  const uint8_t *mac;         /* WEFT_AUTH_MAC_BYTES */
} tcp_handshake_info;

typedef struct tcp_frame_info {
  uint32_t type; /* TCP_FRAME_DATA, TCP_FRAME_ABORT, or anything a peer sent */
  weft_tag tag;
  uint32_t len;
  uint32_t total; /* the chunk's length: len when the sender wrote 0 */
} tcp_frame_info;

/* tcp_wire.c: the bytes on the wire (below both the connection and the helpers). */
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

/* One socket of a connection. The caller's thread drives stream 0, and every
 * stream when there is no helper thread (owner -1): then nothing here is
 * shared and no lock is taken. A stream a helper drives (owner >= 0) is
 * shared with it under `lock`: the caller posts sends and the piece to
 * receive, the helper moves bytes and reports completion or failure, and
 * once the caller marks it dead (tcp_conn_fail) the helper touches neither
 * it nor the caller's buffers again. */
typedef struct tcp_stream {
  tcp_conn *conn;
  int index; /* in its connection */
  int rail;  /* the interface it rides */
  int fd;
  int owner; /* the helper thread that drives it, -1: the caller */
  pthread_mutex_t lock;
  tcp_send_entry sq[TCP_SEND_DEPTH]; /* ring of pieces */
  int sq_head, sq_count;
  tcp_frame_hdr rhdr; /* header of the frame being received */
  size_t rhdr_got;
  size_t rpay_got;    /* payload bytes received into the target */
  bool want_recv;     /* caller-driven: a data call said AGAIN waiting for input */
  /* helper-driven: the piece the caller posted, where it goes and what it must be */
  bool rx_posted, rx_done;
  char *rx_target;
  size_t rx_len, rx_total;
  weft_tag rx_tag;
  bool dead;              /* the connection failed: the helper leaves it */
  weft_status failed;     /* what the helper found, for the caller to report */
  bool failed_notice;     /* `origin` holds the peer's failure notice */
  char why[256];
  char origin[TCP_ABORT_TEXT_MAX + 1];
} tcp_stream;

/* A connection this rank accepted whose first bytes (the dialer's proof
 * and, on a notice, its words) have not all come: read as they come, from
 * progress, so a slow dialer (a throttled link, a client that says nothing)
 * never holds the rank up; refused at its deadline (tcp_conn.c). */
typedef struct tcp_dialin {
  int fd;
  int from;        /* -1 until its proof is read: only a notice stays past that */
  double deadline; /* accepted + 2 s (WEFT_TIMEOUT if shorter) */
  size_t got;      /* bytes of buf read */
  uint8_t buf[TCP_HANDSHAKE_BYTES + sizeof(tcp_frame_hdr) + TCP_ABORT_TEXT_MAX];
} tcp_dialin;
/* Dial-ins held at once: every peer's streams dial in at most twice over;
 * past this, the one that waited longest is refused. */
#define TCP_DIALINS_MAX(size) (2 * (size) + 16)

/* What this rank knows of one peer that TCP carries (from can_reach). */
typedef struct tcp_peer {
  bool known;                   /* can_reach said yes: an address to dial */
  struct sockaddr_storage addr; /* its listener (rail 0) */
  socklen_t addr_len;
  int nstreams;                 /* streams of the collectives connection (0: one) */
  int nrails;                   /* rails both have (0: one) */
  struct sockaddr_storage rail_addr[TCP_MAX_RAILS]; /* its listener on each rail */
  socklen_t rail_len[TCP_MAX_RAILS];
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
  enum tcp_conn_state state;
  weft_status dead_status; /* why, once DEAD */
  char where[80];          /* peer's address, for messages */
  int nstreams;            /* 1 unless the collectives channel to a peer that wants more */
  int accepted;            /* streams up (the accepting side counts them) */
  int queued;              /* pieces queued on the caller-driven streams */
  tcp_stream *streams;     /* nstreams of them; streams[0] is driven by the caller */
  atomic_bool heard;       /* a helper moved bytes of this peer's (tcp_conn_again) */

  bool rframe_done;   /* every piece of the chunk received, not yet released */
  char *slot;         /* receive slot for recv_peek, chunk_bytes long (ctx->slot_mem) */
  int probe_fd;       /* AWAIT_ACCEPT: a liveness probe's connect in flight, else -1 */
  double probe_at;    /* when the last probe started */
};

/* The helper threads of one context (tcp_pool.c). */
typedef struct tcp_worker {
  tcp_ctx *ctx;
  pthread_t thread;
  int wake_fd;           /* eventfd: work posted, or stop */
  pthread_mutex_t lock;  /* guards `list` */
  tcp_stream **list;     /* the streams it drives */
  int n, cap;
  atomic_int changed;    /* the list grew since the helper last copied it */
} tcp_worker;

struct tcp_ctx {
  const weft_transport_init_args *args; /* owned by the core, outlives ctx */
  const struct weft_mem_ops *slot_mem;  /* where receive slots come from (init args) */
  int listen_fd;            /* rail 0's listener: dials, failure notices, probes */
  struct sockaddr_storage addr;
  socklen_t addr_len;
  int nrails;               /* interfaces this rank listens on (1 without a list) */
  int rail_fd[TCP_MAX_RAILS]; /* listeners past rail 0, -1 where none ([0] unused) */
  struct sockaddr_storage rail_addr[TCP_MAX_RAILS]; /* each rail's listener ([0] = addr) */
  socklen_t rail_len[TCP_MAX_RAILS];
  char rail_name[TCP_MAX_RAILS][64]; /* its interface, for the report */
  int want_streams;         /* what this rank publishes (WEFT_TCP_STREAMS or auto) */
  int want_threads;         /* -1 until decided (first can_reach: cores per rank known) */
  tcp_worker *workers;      /* want_threads of them once started, else NULL */
  int nworkers;             /* started */
  atomic_bool stop;         /* the helpers end */
  atomic_bool helper_moved; /* a helper moved bytes since the last progress */
  int done_fd;              /* eventfd a helper writes when a piece ends or fails, -1 */
  tcp_conn **conns;         /* by tcp_conn_index(peer, channel); NULL until first needed */
  tcp_peer *peers;          /* by rank */
  uint64_t host_hash;       /* this rank's host identity, hashed (TCP_ADDR_BYTES) */
  char cc_loopback[NET_CC_NAME]; /* congestion control of connections to this host's own
                                    addresses, "" to keep the default (tcp_congestion_for) */
  char cc_other[NET_CC_NAME];    /* of the others, "" likewise */
  char cc_default[NET_CC_NAME];  /* the system's, which new sockets get */
  unsigned wait_gen;        /* counts waits, for tcp_peer.polled */
  int *pfd_peer;            /* for each pfds entry: the peer whose pidfd it is, else -1 */
  bool accept_pending;      /* the listener was readable in the last wait */
  bool notices_sent;        /* abort_all told every peer's listener once */
  int *notice_fd;           /* by peer: the notice connects in flight (tcp_notices_dial) */
  int *answered_fd;         /* dials answered with an abort frame, open until fini */
  int nanswered;
  tcp_dialin *dialins; /* accepted, not yet said who they are (tcp_conn.c) */
  int ndialins, dialins_cap;
  tcp_ctx *fork_next, *fork_prev; /* every live context, for tcp_fork_child */
  int awaiting_accept;      /* conns in TCP_CONN_AWAIT_ACCEPT */
  struct pollfd *pfds;      /* scratch for wait (tcp_pfds_max entries) */
  int nsending;             /* conns with pieces queued on caller-driven streams */
  bool data_moved;          /* bytes moved inside a data call since the last progress:
                               partial progress, so no timeout while a chunk drains */
};

/* Entries tcp_wait may poll: every stream, a probe per connection, a pidfd
 * per peer, the wake fd, the listeners and the helpers' done fd. */
static inline size_t tcp_pfds_max(int size) {
  return (size_t)size * WEFT_TP_CHANNELS * (TCP_MAX_STREAMS + 1) + (size_t)size + 2 +
         TCP_MAX_RAILS + (size_t)TCP_DIALINS_MAX(size);
}

/* How a chunk of `bytes` is cut over a connection's streams: the number of
 * pieces (stream i carries piece i) and each piece's length but the last,
 * which takes the rest. Both ends compute it from the length alone. */
static inline int tcp_pieces(int nstreams, size_t bytes, size_t *piece) {
  size_t most = bytes / TCP_PIECE_MIN;
  int n = nstreams < 1 ? 1 : (size_t)nstreams < most ? nstreams : most ? (int)most : 1;
  size_t p = (bytes + (size_t)n - 1) / (size_t)n;
  *piece = n > 1 ? (p + TCP_PIECE_ALIGN - 1) / TCP_PIECE_ALIGN * TCP_PIECE_ALIGN : bytes;
  return n;
}

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
/* Reads WEFT_TCP_CONGESTION once the listeners exist: which congestion
 * control each route gets, the listeners set to what an accepted
 * connection should start with. WEFT_ERR_INVALID, said in args->errors,
 * where a named one is refused. */
weft_status tcp_congestion_init(tcp_ctx *ctx);
/* For weft-info: the system's congestion control and what the setting makes of it. */
void tcp_congestion_describe(char *out, size_t len);
/* The congestion control a connection to `to` gets ("" keeps the default). */
const char *tcp_congestion_for(const tcp_ctx *ctx, const struct sockaddr_storage *to,
                               socklen_t len);
weft_status tcp_conn_create(tcp_ctx *ctx, int peer, int channel, tcp_conn **out);
/* Dials every stream of `c`, stream s from this rank's rail s mod rails to
 * the peer's listener on that rail. */
weft_status tcp_conn_dial(tcp_conn *c);
/* Takes a dial waiting at listen_fd, if any, into the dial-ins, and
 * advances them all (tcp_dialins_advance). */
weft_status tcp_conn_accept_one(tcp_ctx *ctx, int listen_fd, bool *progressed);
/* Reads what has come on every dial-in without waiting: a proven data dial
 * becomes its connection's stream (or, with `answer`, gets an abort frame
 * with those words: tcp_answer_waiting_dials), a notice whose words are all
 * here fails the communicator (WEFT_ERR_PEER_LOST; dropped with `answer`),
 * a probe is closed, and a stranger or a dial past its deadline is refused
 * with a warning. */
weft_status tcp_dialins_advance(tcp_ctx *ctx, const char *answer, bool *progressed);
weft_status tcp_conn_push_sends(tcp_conn *c, bool *progressed);
/* The stream's lock, taken only when a helper shares it. */
static inline void tcp_stream_lock(tcp_stream *s) {
  if (s->owner >= 0) pthread_mutex_lock(&s->lock);
}
static inline void tcp_stream_unlock(tcp_stream *s) {
  if (s->owner >= 0) pthread_mutex_unlock(&s->lock);
}
/* tcp_wire.c: writes what the socket takes of the stream's queue; completed pieces leave
 * it. Returns the bytes written, or -errno (never 0 while pieces wait). */
ssize_t tcp_stream_write(tcp_stream *s);
/* Reads the rest of the frame header, then payload into target (len bytes). Returns
 * the bytes read, 0 at the end of the stream, or -errno. */
ssize_t tcp_stream_read(tcp_stream *s, char *target, size_t len);

/* tcp_pool.c: the helper threads. */
/* Starts ctx->want_threads helpers once (the first connection with more
 * than one stream); WEFT_OK also when it could start none (the caller then
 * drives every stream itself). */
weft_status tcp_pool_start(tcp_ctx *ctx);
/* Gives stream s (not stream 0) to a helper. */
void tcp_pool_adopt(tcp_ctx *ctx, tcp_stream *s);
/* Wakes the helper that drives s (work was posted). */
void tcp_pool_wake(tcp_ctx *ctx, const tcp_stream *s);
/* Ends and joins every helper; afterwards the caller drives every stream
 * (owner -1). Bounded: each helper is woken and ends after its current
 * non-blocking calls (a notice's text: at most 1 s). */
void tcp_pool_stop(tcp_ctx *ctx);
#define TCP_POOL_POLL_MS 1000 /* a wake fd write ends it at once: only a safety net */
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
 * a connection of its own (TCP_NOTICE_CHANNEL), in two steps: dial starts
 * every connect (ctx->notice_fd), send waits for them (1 s in all) and
 * writes the text. abort_all dials before it tells anyone else, so by the
 * time a peer can see this rank's failure (or a rank that heard of it
 * leave), this rank's connection already waits in that peer's listener. */
void tcp_notices_dial(tcp_ctx *ctx);
/* Writes an abort frame with `reason` (cut at TCP_ABORT_TEXT_MAX) on fd in
 * one non-blocking sendmsg, after `prefix` (a notice's proof) when not
 * NULL: a few hundred bytes, all or nothing. -1 with errno when not sent. */
ssize_t tcp_send_abort(int fd, const void *prefix, size_t prefix_len, const char *reason);
void tcp_notices_send(tcp_ctx *ctx, const char *reason);
/* A rank passing a peer's failure on answers the dials still waiting in
 * its listeners' queues: the peer that dialed may have sent its chunks
 * already and be waiting on that connection. Accepting none, this rank's
 * exit would reset it, and the peer would take the reset for the first
 * cause; so each gets an abort frame with `reason`, as the open connections
 * do (0.2 s in all for the dialers' proofs). Notices waiting there are
 * dropped: this rank has its first cause. */
void tcp_answer_waiting_dials(tcp_ctx *ctx, const char *reason);
void tcp_conn_destroy(tcp_conn *c);

/* the table's data members */
weft_status tcp_send_ready(weft_tp_conn *conn);
weft_status tcp_send(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                     const struct weft_mem_ops *mem, unsigned flags);
weft_status tcp_send_idle(weft_tp_conn *conn);
weft_status tcp_recv_peek(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data);
weft_status tcp_recv_release(weft_tp_conn *conn);
/* one chunk placed straight into dst from the socket (recv takes runs a
 * chunk at a time through it) */
weft_status tcp_recv_into(weft_tp_conn *conn, weft_tag tag, size_t bytes, void *dst,
                          const struct weft_mem_ops *mem);
weft_status tcp_recv(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks);

#endif
