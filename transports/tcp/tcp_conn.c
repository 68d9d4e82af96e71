/* tcp_conn.c - one TCP connection to a peer: dialing and accepting with a
 * handshake that names the communicator, and the framed data path. Sends go
 * straight from the caller's buffer (writev of header+payload); receives read
 * header and payload with one readv, into a slot or into the caller's buffer.
 * A connection of several streams cuts each chunk into pieces in order
 * (tcp_pieces): piece i goes out on stream i and is read straight to its
 * offset, by the caller or by the helper that drives the stream (tcp_pool.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "src/base/auth.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "transports/tcp/tcp_settings.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "tcp.h"

/* The dialer's first bytes: who it is, for which communicator, and an
 * HMAC over that with the job key. Sent at once (no round trip), so a dialer
 * that fails right after connecting still leaves its failure notice behind it.
 * A replay gains nothing: the communicator id is random and a second
 * connection from the same rank is refused. */
static const char tcp_hello_context[] = "weft tcp hello";
static const uint8_t tcp_no_challenge[WEFT_AUTH_CHALLENGE_BYTES];

weft_status tcp_conn_fail(tcp_conn *c, weft_status st, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  weft_error_sink_set(c->ctx->args->errors, "%s", what);
  WEFT_INFO(WEFT_SUBSYS_NET, "tcp: connection to peer %d (%s) failed: %s", c->peer, c->where, what);
  if (c->state == TCP_CONN_AWAIT_ACCEPT) c->ctx->awaiting_accept--;
  if (c->queued) c->ctx->nsending--;
  c->queued = 0;
  /* From here no helper touches this connection's streams, nor the
   * caller's buffers its pieces point into. */
  for (int i = 0; i < c->nstreams; i++) {
    tcp_stream *s = &c->streams[i];
    tcp_stream_lock(s);
    s->sq_count = 0;
    s->rx_posted = false;
    s->dead = true;
    tcp_stream_unlock(s);
  }
  c->state = TCP_CONN_DEAD;
  c->dead_status = st;
  return st;
}

static inline void tcp_peer_heard(tcp_conn *c);

weft_status tcp_conn_again(tcp_conn *c) {
  const tcp_peer *p = &c->ctx->peers[c->peer];
  if (!p->gone_at) return WEFT_AGAIN;
  if (c->nstreams > 1 && atomic_exchange(&c->heard, false)) tcp_peer_heard(c); /* its helpers' bytes */
  if (weft_now() - p->gone_at < TCP_GONE_GRACE_S) return WEFT_AGAIN;
  return tcp_conn_fail(c, WEFT_ERR_PEER_LOST, "peer %d (%s) is gone: %s", c->peer, c->where,
                       p->gone_why ? p->gone_why : "its process ended");
}

/* A byte from a peer seen gone: its last data is still arriving (the
 * grace restarts). Only a gone peer pays for the clock. */
static inline void tcp_peer_heard(tcp_conn *c) {
  tcp_peer *p = &c->ctx->peers[c->peer];
  if (p->gone_at) p->gone_at = weft_now();
}

/* Streams of the connection to `peer` on `channel`: what the published
 * addresses give for collectives; messages keep one (a message that fails
 * fails only the lane, so no helper may still hold the user's buffer). */
static int tcp_conn_streams_for(const tcp_ctx *ctx, int peer, int channel) {
  int n = ctx->peers[peer].nstreams;
  return channel == WEFT_TP_CHANNEL_COLL && n > 1 ? n : 1;
}

weft_status tcp_conn_create(tcp_ctx *ctx, int peer, int channel, tcp_conn **out) {
  tcp_conn *c = calloc(1, sizeof *c);
  if (!c) return WEFT_ERR_NOMEM;
  c->nstreams = tcp_conn_streams_for(ctx, peer, channel);
  c->streams = calloc((size_t)c->nstreams, sizeof *c->streams);
  if (!c->streams) {
    free(c);
    return WEFT_ERR_NOMEM;
  }
  int rails = ctx->peers[peer].nrails > 1 ? ctx->peers[peer].nrails : 1;
  for (int i = 0; i < c->nstreams; i++) {
    tcp_stream *s = &c->streams[i];
    s->conn = c;
    s->index = i;
    s->rail = i % rails;
    s->fd = -1;
    s->owner = -1;
    pthread_mutex_init(&s->lock, NULL);
  }
  c->ctx = ctx;
  c->peer = peer;
  c->channel = channel;
  c->probe_fd = -1;
  c->probe_at = weft_now(); /* the first probe after one interval of waiting */
  c->state = TCP_CONN_AWAIT_ACCEPT;
  snprintf(c->where, sizeof c->where, "not connected");
  ctx->awaiting_accept++;
  *out = c;
  return WEFT_OK;
}

void tcp_conn_destroy(tcp_conn *c) {
  for (int i = 0; i < c->nstreams; i++) {
    if (c->streams[i].fd >= 0) close(c->streams[i].fd);
    pthread_mutex_destroy(&c->streams[i].lock);
  }
  if (c->probe_fd >= 0) close(c->probe_fd);
  free(c->streams);
  if (c->slot) c->ctx->slot_mem->free_slots(c->slot, c->ctx->args->chunk_bytes);
  free(c);
}

typedef struct tcp_proof {
  tcp_handshake hs;
  uint8_t mac[WEFT_AUTH_MAC_BYTES];
} tcp_proof;
_Static_assert(sizeof(tcp_proof) == TCP_HANDSHAKE_BYTES, "no padding in the proof");

/* The dialer's first bytes for (peer, channel word: tcp_handshake). */
static void tcp_hello(const tcp_ctx *ctx, int peer, uint32_t channel, tcp_proof *proof) {
  *proof = (tcp_proof){.hs = {htonl(TCP_HANDSHAKE_MAGIC), htonl((uint32_t)ctx->args->rank),
                              htonl((uint32_t)peer), htonl(channel),
                              htonl((uint32_t)(ctx->args->comm_id >> 32)),
                              htonl((uint32_t)ctx->args->comm_id)}};
  weft_auth_mac(ctx->args->auth, tcp_hello_context, tcp_no_challenge, &proof->hs,
                sizeof proof->hs, proof->mac);
}

static void tcp_tune_socket(int fd) {
  net_set_nodelay(fd);
  int bytes = (int)tcp_settings()->buf_bytes;
  if (bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
}

/* Every stream has its socket: the connection is up, and its streams past
 * the first go to the helpers, if this rank has any. */
static void tcp_conn_up(tcp_conn *c) {
  tcp_ctx *ctx = c->ctx;
  if (c->probe_fd >= 0) close(c->probe_fd); /* the dial came: no need */
  c->probe_fd = -1;
  c->state = TCP_CONN_UP;
  ctx->awaiting_accept--;
  struct sockaddr_storage peer;
  socklen_t len = sizeof peer;
  if (!getpeername(c->streams[0].fd, (struct sockaddr *)&peer, &len))
    net_addr_str((struct sockaddr *)&peer, c->where, sizeof c->where);
  if (c->nstreams > 1 && ctx->want_threads > 0 && tcp_pool_start(ctx) == WEFT_OK)
    for (int i = 1; i < c->nstreams; i++) tcp_pool_adopt(ctx, &c->streams[i]);
  char cc[NET_CC_NAME]; /* once per connection: what the socket has, not what was asked */
  net_get_congestion(c->streams[0].fd, cc);
  WEFT_INFO(WEFT_SUBSYS_NET,
            "tcp: rank %d connected to peer %d (channel %d, %d stream%s) at %s, congestion "
            "control %s",
            ctx->args->rank, c->peer, c->channel, c->nstreams, c->nstreams > 1 ? "s" : "", c->where,
            cc[0] ? cc : "unknown");
}

/* ---- congestion control ------------------------------------------------
 *
 * A pacing congestion control (bbr, some systems' default) spaces each burst
 * out at the rate it last measured, and a collective is a burst after an idle
 * wait (every call after a barrier). Over loopback nothing is lost or queued,
 * so the pacing only slows (docs/tuning.md, "TCP congestion control"). So by
 * default (auto) a connection to one of this host's own addresses uses cubic,
 * or reno, which every kernel has, where the default is neither; connections
 * to other hosts keep the default, the network's owner's choice. It must be
 * set before the handshake: a socket switched away from bbr later keeps
 * pacing. An accepted socket starts with its listener's, so the listeners
 * take the loopback choice and an accepted connection from another host
 * switches back (to bbr, which then starts its own pacing). */

static bool tcp_cc_unpaced(const char *name) {
  return !strcmp(name, "cubic") || !strcmp(name, "reno");
}

/* Sets `name` on every socket of fds[n]; 0 or the first refusal's errno. */
static int tcp_cc_set_all(const int *fds, int n, const char *name) {
  int e = 0;
  for (int i = 0; !e && i < n; i++) e = net_set_congestion(fds[i], name);
  return e;
}

/* What WEFT_TCP_CONGESTION makes of the system's default `dflt`: the names
 * for connections to this host's own addresses and to the others ("" keeps
 * the default). Each candidate is set on fds[n] (the listeners, or a
 * scratch socket for weft-info) as it is tried, so they end with the
 * loopback choice; 0, or the errno of a named one the kernel refused. */
static int tcp_cc_decide(const int *fds, int n, const char *dflt, char loopback[NET_CC_NAME],
                         char other[NET_CC_NAME]) {
  const char *want = tcp_settings()->congestion;
  loopback[0] = other[0] = 0;
  if (!strcmp(want, "system") || !dflt[0]) return 0;
  if (strcmp(want, "auto") && *want) { /* a name: every data connection */
    int e = strlen(want) < NET_CC_NAME ? tcp_cc_set_all(fds, n, want) : ENAMETOOLONG;
    if (e) return e;
    snprintf(loopback, NET_CC_NAME, "%s", want);
    snprintf(other, NET_CC_NAME, "%s", want);
    return 0;
  }
  if (tcp_cc_unpaced(dflt)) return 0;
  static const char *const calm[] = {"cubic", "reno"};
  for (size_t i = 0; i < sizeof calm / sizeof calm[0]; i++)
    if (!tcp_cc_set_all(fds, n, calm[i])) {
      snprintf(loopback, NET_CC_NAME, "%s", calm[i]);
      return 0;
    }
  tcp_cc_set_all(fds, n, dflt); /* the default then; it works, only slower here */
  return 0;
}

weft_status tcp_congestion_init(tcp_ctx *ctx) {
  int fds[TCP_MAX_RAILS] = {ctx->listen_fd};
  for (int r = 1; r < ctx->nrails; r++) fds[r] = ctx->rail_fd[r];
  net_get_congestion(ctx->listen_fd, ctx->cc_default);
  int e = tcp_cc_decide(fds, ctx->nrails, ctx->cc_default, ctx->cc_loopback, ctx->cc_other);
  if (e) {
    weft_error_sink_set(ctx->args->errors,
                        "WEFT_TCP_CONGESTION=%s: the kernel refuses it (%s); "
                        "net.ipv4.tcp_allowed_congestion_control lists those a process may use",
                        tcp_settings()->congestion, strerror(e));
    return WEFT_ERR_INVALID;
  }
  if (ctx->cc_loopback[0] && strcmp(ctx->cc_loopback, ctx->cc_other))
    WEFT_INFO(WEFT_SUBSYS_NET,
              "tcp: rank %d: connections to this host's own addresses use %s, others the "
              "system's %s (WEFT_TCP_CONGESTION=auto)",
              ctx->args->rank, ctx->cc_loopback, ctx->cc_default);
  return WEFT_OK;
}

void tcp_congestion_describe(char *out, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  char dflt[NET_CC_NAME] = "", loopback[NET_CC_NAME], other[NET_CC_NAME];
  if (fd >= 0) net_get_congestion(fd, dflt);
  int e = tcp_cc_decide(&fd, fd >= 0, dflt, loopback, other);
  if (!dflt[0])
    snprintf(out, len, "congestion control unknown");
  else if (e)
    snprintf(out, len, "congestion control %s (WEFT_TCP_CONGESTION=%s is refused: %s)", dflt,
             tcp_settings()->congestion, strerror(e));
  else if (!loopback[0])
    snprintf(out, len, "congestion control %s", dflt);
  else if (!strcmp(loopback, other))
    snprintf(out, len, "congestion control %s (WEFT_TCP_CONGESTION; the system's %s)", loopback,
             dflt);
  else
    snprintf(out, len, "congestion control %s, %s within this host (it paces: WEFT_TCP_CONGESTION)",
             dflt, loopback);
  if (fd >= 0) close(fd);
}

const char *tcp_congestion_for(const tcp_ctx *ctx, const struct sockaddr_storage *to,
                               socklen_t len) {
  if (!strcmp(ctx->cc_loopback, ctx->cc_other)) return ctx->cc_loopback; /* no route asked */
  return net_addr_is_local(to, len) ? ctx->cc_loopback : ctx->cc_other;
}

/* An accepted socket has its listener's congestion control: the loopback
 * choice. One from another host goes back to what that route gets. */
static void tcp_accepted_congestion(const tcp_ctx *ctx, int fd) {
  if (!ctx->cc_loopback[0] || !strcmp(ctx->cc_loopback, ctx->cc_other)) return;
  struct sockaddr_storage peer;
  socklen_t len = sizeof peer;
  if (getpeername(fd, (struct sockaddr *)&peer, &len)) return;
  const char *want = tcp_congestion_for(ctx, &peer, len);
  if (!*want) want = ctx->cc_default;
  if (strcmp(want, ctx->cc_loopback)) net_set_congestion(fd, want);
}

/* A connect, bound to this rank's address on a rail where `from` is given
 * (so a stream leaves by the interface it stripes over), with the
 * congestion control its route calls for (tcp_congestion_for) set before
 * the handshake: set later, a pacing one's pacing stays. */
static weft_status tcp_dial_from(const tcp_ctx *ctx, const struct sockaddr_storage *from,
                                 socklen_t from_len, const struct sockaddr_storage *to,
                                 socklen_t to_len, double deadline, int *out,
                                 weft_error_sink *err) {
  char where[80], mine[80] = "";
  net_addr_str((const struct sockaddr *)to, where, sizeof where);
  if (from) net_addr_str((const struct sockaddr *)from, mine, sizeof mine);
  int fd = socket(to->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    weft_error_sink_set(err, "socket: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  const char *cc = tcp_congestion_for(ctx, to, to_len);
  if (*cc) net_set_congestion(fd, cc); /* allowed: the listener took it at init */
  struct sockaddr_storage local = from ? *from : (struct sockaddr_storage){0};
  if (from) net_addr_set_port(&local, 0);
  int e = 0;
  if (from && bind(fd, (const struct sockaddr *)&local, from_len))
    e = errno;
  else if (connect(fd, (const struct sockaddr *)to, to_len) && errno != EINPROGRESS)
    e = errno;
  else {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    double left = deadline - weft_now();
    int ms = left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
    socklen_t el = sizeof e;
    if (poll(&p, 1, ms) != 1)
      e = ETIMEDOUT;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el))
      e = errno;
  }
  if (e) {
    close(fd);
    if (from)
      weft_error_sink_set(err, "cannot connect from %s to %s: %s", mine, where, strerror(e));
    else
      weft_error_sink_set(err, "cannot connect to %s: %s", where, strerror(e));
    return e == ETIMEDOUT ? WEFT_ERR_TIMEOUT : WEFT_ERR_PEER_LOST;
  }
  net_set_nodelay(fd);
  *out = fd;
  return WEFT_OK;
}

weft_status tcp_conn_dial(tcp_conn *c) {
  tcp_ctx *ctx = c->ctx;
  const tcp_peer *p = &ctx->peers[c->peer];
  double deadline = weft_now() + ctx->args->timeout_s;
  bool rails = p->nrails > 1;
  for (int i = 0; i < c->nstreams; i++) {
    tcp_stream *s = &c->streams[i];
    const struct sockaddr_storage *to = s->rail ? &p->rail_addr[s->rail] : &p->addr;
    socklen_t to_len = s->rail ? p->rail_len[s->rail] : p->addr_len;
    net_addr_str((const struct sockaddr *)to, c->where, sizeof c->where);
    int fd;
    weft_error_sink err;
    /* The peer's listener existed before the rendezvous ended: a refusal now
     * means the peer is gone, so no retrying. */
    weft_status st =
        tcp_dial_from(ctx, rails ? &ctx->rail_addr[s->rail] : NULL,
                      rails ? ctx->rail_len[s->rail] : 0, to, to_len, deadline, &fd, &err);
    if (st) {
      if (c->nstreams > 1)
        return tcp_conn_fail(c, WEFT_ERR_PEER_LOST, "stream %d of %d to peer %d: %s", i,
                             c->nstreams, c->peer, err.msg);
      return tcp_conn_fail(c, WEFT_ERR_PEER_LOST, "%s", err.msg);
    }
    s->fd = fd;
    tcp_tune_socket(fd);
    tcp_proof proof;
    uint32_t word = (uint32_t)c->channel | (uint32_t)i << 16 |
                    (c->nstreams > 1 ? (uint32_t)c->nstreams << 24 : 0);
    tcp_hello(ctx, c->peer, word, &proof);
    st = net_send_all(fd, &proof, sizeof proof, deadline, &err);
    if (st)
      return tcp_conn_fail(c, WEFT_ERR_PEER_LOST, "handshake with %s: %s", c->where, err.msg);
  }
  tcp_conn_up(c);
  return WEFT_OK;
}

/* A peer's failure notice on a connection of its own (tcp_notices_send): the
 * communicator fails with the peer's words (NULL: cut off), as from an abort
 * frame. */
static weft_status tcp_notice_take(tcp_ctx *ctx, int from, const char *words) {
  char text[TCP_ABORT_TEXT_MAX + 1];
  if (words && words[0])
    snprintf(text, sizeof text, "%s", words);
  else
    snprintf(text, sizeof text, "rank %d failed (its notice was cut off)", from);
  weft_error_sink_set(ctx->args->errors, "peer %d passed on a failure: %s", from, text);
  snprintf(ctx->args->errors->origin, sizeof ctx->args->errors->origin, "%s", text);
  WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d got a failure notice from peer %d: %s",
            ctx->args->rank, from, text);
  return WEFT_ERR_PEER_LOST;
}

void tcp_notices_dial(tcp_ctx *ctx) {
  int n = ctx->args->size;
  if (ctx->notice_fd) return;
  int *fd = malloc((size_t)n * sizeof *fd);
  if (!fd) return;
  ctx->notice_fd = fd;
  /* Every connect starts at once, so an unreachable peer costs its share of
   * one bounded wait, not a timeout each. */
  for (int p = 0; p < n; p++) {
    fd[p] = -1;
    if (p == ctx->args->rank || !ctx->peers[p].known || ctx->peers[p].gone_at) continue;
    const tcp_peer *peer = &ctx->peers[p];
    int s = socket(peer->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) break; /* out of fds: the peers left learn at their timeout */
    if (connect(s, (const struct sockaddr *)&peer->addr, peer->addr_len) && errno != EINPROGRESS) {
      close(s);
      continue;
    }
    fd[p] = s;
  }
}

ssize_t tcp_send_abort(int fd, const void *prefix, size_t prefix_len, const char *reason) {
  size_t tlen = strnlen(reason, TCP_ABORT_TEXT_MAX);
  tcp_frame_hdr h = {htonl(TCP_FRAME_MAGIC | TCP_FRAME_ABORT), 0, htonl((uint32_t)tlen), 0, 0};
  struct iovec iov[3] = {{(void *)prefix, prefix_len}, {&h, sizeof h}, {(void *)reason, tlen}};
  struct msghdr msg = {.msg_iov = prefix ? iov : iov + 1, .msg_iovlen = prefix ? 3 : 2};
  return sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void tcp_notices_send(tcp_ctx *ctx, const char *reason) {
  int n = ctx->args->size;
  int *fd = ctx->notice_fd;
  if (!fd) return;
  ctx->notice_fd = NULL;
  /* the wait's scratch (tcp_pfds_max entries: enough), not in a wait now */
  int *who = ctx->pfd_peer; /* pfds entry -> peer */
  struct pollfd *pf = ctx->pfds;
  int pending = 0;
  for (int p = 0; p < n; p++) pending += fd[p] >= 0;
  double budget = ctx->args->timeout_s < 1.0 ? ctx->args->timeout_s : 1.0;
  double deadline = weft_now() + budget;
  while (pending > 0) {
    nfds_t k = 0;
    for (int p = 0; p < n; p++)
      if (fd[p] >= 0) {
        who[k] = p;
        pf[k++] = (struct pollfd){.fd = fd[p], .events = POLLOUT};
      }
    int ms = (int)((deadline - weft_now()) * 1000);
    if (ms <= 0 || poll(pf, k, ms) <= 0) break;
    for (nfds_t i = 0; i < k; i++) {
      if (!pf[i].revents) continue;
      int p = who[i], soerr = 0;
      socklen_t sl = sizeof soerr;
      if (!getsockopt(fd[p], SOL_SOCKET, SO_ERROR, &soerr, &sl) && !soerr) {
        tcp_proof proof;
        tcp_hello(ctx, p, TCP_NOTICE_CHANNEL, &proof);
        if (tcp_send_abort(fd[p], &proof, sizeof proof, reason) < 0)
          WEFT_INFO(WEFT_SUBSYS_NET, "tcp: failure notice to peer %d not sent: %s", p,
                    strerror(errno));
      }
      close(fd[p]); /* the kernel still delivers what was sent */
      fd[p] = -1;
      pending--;
    }
  }
  for (int p = 0; p < n; p++)
    if (fd[p] >= 0) {
      WEFT_INFO(WEFT_SUBSYS_NET, "tcp: failure notice to peer %d not sent: no connection in %.1f s",
                p, budget);
      close(fd[p]);
    }
  free(fd);
}

/* A dialer's proof, checked: NULL when it is one of this communicator's
 * ranks, else why not. */
static const char *tcp_proof_check(tcp_ctx *ctx, const uint8_t *proof, tcp_handshake_info *hs) {
  if (tcp_handshake_parse(proof, TCP_HANDSHAKE_BYTES, hs)) return "a malformed handshake";
  if (!weft_auth_verify(ctx->args->auth, tcp_hello_context, tcp_no_challenge, hs->signed_part,
                        sizeof(tcp_handshake), hs->mac))
    return "it did not prove the job key (a foreign client, or WEFT_AUTH_TOKEN differs)";
  const char *why = tcp_handshake_check(hs, (uint32_t)ctx->args->rank, ctx->args->comm_id);
  if (why) return why;
  if ((hs->channel == TCP_NOTICE_CHANNEL || hs->channel == TCP_PROBE_CHANNEL) &&
      hs->from >= (uint32_t)ctx->args->size)
    return "notice or probe from a rank outside the communicator";
  return NULL;
}

/* A proven data dial becomes the stream it names; else why not. */
static weft_status tcp_dial_adopt(tcp_ctx *ctx, int fd, const tcp_handshake_info *hs,
                                  const char **why) {
  int from = (int)hs->from, channel = (int)hs->channel;
  tcp_conn **slot = &ctx->conns[tcp_conn_index(from, channel)];
  if (*slot && (*slot)->state != TCP_CONN_AWAIT_ACCEPT)
    *why = "second connection from the same rank and channel";
  else if ((int)hs->nstreams != tcp_conn_streams_for(ctx, from, channel))
    *why = "its stream count differs from what the published addresses give";
  else if (*slot && (*slot)->streams[hs->stream].fd >= 0)
    *why = "second connection from the same rank, channel and stream";
  if (*why) return WEFT_OK;
  if (!*slot) WEFT_CHECK(tcp_conn_create(ctx, from, channel, slot));
  tcp_conn *c = *slot;
  c->streams[hs->stream].fd = fd;
  if (++c->accepted == c->nstreams) tcp_conn_up(c);
  return WEFT_OK;
}

/* Dialers send their proof right after connecting; a client that does not
 * is not one of our ranks and gets this long. */
static double tcp_dialin_wait_s(const tcp_ctx *ctx) {
  return ctx->args->timeout_s < 2.0 ? ctx->args->timeout_s : 2.0;
}

/* Takes one waiting dial off the listener into the dial-ins; false when
 * none waits. Past TCP_DIALINS_MAX, the one nearest its deadline goes. */
static bool tcp_dialin_accept(tcp_ctx *ctx, int listen_fd) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return false; /* nothing waiting (EAGAIN) or a transient failure */
  tcp_tune_socket(fd);
  tcp_accepted_congestion(ctx, fd);
  int max = TCP_DIALINS_MAX(ctx->args->size);
  if (ctx->ndialins == max) {
    int oldest = 0;
    for (int i = 1; i < max; i++)
      if (ctx->dialins[i].deadline < ctx->dialins[oldest].deadline) oldest = i;
    WEFT_WARN(WEFT_SUBSYS_NET,
              "tcp: rank %d refused an incoming connection: %d connections have not said who "
              "they are, and this one waited longest",
              ctx->args->rank, max);
    close(ctx->dialins[oldest].fd);
    ctx->dialins[oldest] = ctx->dialins[--ctx->ndialins];
  }
  if (ctx->ndialins == ctx->dialins_cap) {
    int cap = ctx->dialins_cap ? 2 * ctx->dialins_cap : 4;
    tcp_dialin *grown = realloc(ctx->dialins, (size_t)(cap < max ? cap : max) * sizeof *grown);
    if (!grown) {
      WEFT_WARN(WEFT_SUBSYS_NET, "tcp: rank %d refused an incoming connection: out of memory",
                ctx->args->rank);
      close(fd);
      return true;
    }
    ctx->dialins = grown;
    ctx->dialins_cap = cap < max ? cap : max;
  }
  tcp_dialin *d = &ctx->dialins[ctx->ndialins++];
  d->fd = fd;
  d->deadline = weft_now() + tcp_dialin_wait_s(ctx);
  d->got = 0;
  d->from = -1;
  return true;
}

static void tcp_dialin_drop(tcp_ctx *ctx, int i, const char *why) {
  tcp_dialin *d = &ctx->dialins[i];
  if (why)
    WEFT_WARN(WEFT_SUBSYS_NET, "tcp: rank %d refused an incoming connection: %s", ctx->args->rank,
              why);
  if (d->fd >= 0) close(d->fd);
  ctx->dialins[i] = ctx->dialins[--ctx->ndialins];
}

/* What a proven notice's first bytes hold: the proof, a frame header and
 * the words it announces (at most TCP_ABORT_TEXT_MAX). */
static size_t tcp_dialin_need(const tcp_dialin *d, const char **words, size_t *words_len) {
  size_t hdr = TCP_HANDSHAKE_BYTES, text = hdr + sizeof(tcp_frame_hdr);
  *words = NULL;
  *words_len = 0;
  if (d->got < text) return text;
  tcp_frame_info f = {0};
  if (tcp_frame_parse(d->buf + hdr, sizeof(tcp_frame_hdr), &f) || f.type != TCP_FRAME_ABORT)
    return text; /* no words: "cut off" */
  *words = (const char *)d->buf + text;
  *words_len = f.len < TCP_ABORT_TEXT_MAX ? f.len : TCP_ABORT_TEXT_MAX;
  return text + *words_len;
}

/* This rank has failed: a data dial gets an abort frame with `answer`
 * (tcp_answer_waiting_dials), and its fd stays open until fini. */
static void tcp_dial_answer(tcp_ctx *ctx, int fd, int from, const char *answer) {
  if (tcp_send_abort(fd, NULL, 0, answer) < 0)
    WEFT_INFO(WEFT_SUBSYS_NET, "tcp: abort notice to peer %d's waiting dial not sent: %s", from,
              strerror(errno));
  else
    WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d answered peer %d's waiting dial with its failure",
              ctx->args->rank, from);
  shutdown(fd, SHUT_WR);
  /* Open until fini, as the open connections are: closing now, with the
   * dialer's chunks unread, would reset it at once. */
  size_t cap = (size_t)TCP_DIALINS_MAX(ctx->args->size);
  if (!ctx->answered_fd) ctx->answered_fd = malloc(cap * sizeof *ctx->answered_fd);
  if (ctx->answered_fd && (size_t)ctx->nanswered < cap)
    ctx->answered_fd[ctx->nanswered++] = fd;
  else
    close(fd);
}

/* Reads what has come on dial-in i, and ends it once it said enough:
 * WEFT_ERR_PEER_LOST with a notice it completed (none with `answer`), else
 * OK. */
static weft_status tcp_dialin_step(tcp_ctx *ctx, int i, double now, const char *answer,
                                   bool *progressed) {
  tcp_dialin *d = &ctx->dialins[i];
  for (;;) {
    if (d->from < 0 && d->got == TCP_HANDSHAKE_BYTES) { /* the proof is here */
      tcp_handshake_info hs = {0};
      const char *why = tcp_proof_check(ctx, d->buf, &hs);
      if (!why && hs.channel == TCP_PROBE_CHANNEL) { /* a peer checking that we live: we do */
        tcp_dialin_drop(ctx, i, NULL);
        return WEFT_OK;
      }
      if (!why && hs.channel != TCP_NOTICE_CHANNEL) {
        int fd = d->fd;
        if (answer) {
          tcp_dial_answer(ctx, fd, (int)hs.from, answer);
        } else {
          WEFT_CHECK(tcp_dial_adopt(ctx, fd, &hs, &why));
          if (!why) *progressed = true;
        }
        if (!why) d->fd = -1; /* the connection's now */
        tcp_dialin_drop(ctx, i, why);
        return WEFT_OK;
      }
      if (why) {
        tcp_dialin_drop(ctx, i, why);
        return WEFT_OK;
      }
      d->from = (int)hs.from; /* a notice: its words follow */
    }
    const char *words;
    size_t words_len;
    size_t need =
        d->got < TCP_HANDSHAKE_BYTES ? TCP_HANDSHAKE_BYTES : tcp_dialin_need(d, &words, &words_len);
    if (d->got >= need) { /* a notice, whole */
      char text[TCP_ABORT_TEXT_MAX + 1];
      snprintf(text, sizeof text, "%.*s", (int)words_len, words ? words : "");
      int from = d->from;
      tcp_dialin_drop(ctx, i, NULL);
      return answer ? WEFT_OK : tcp_notice_take(ctx, from, text);
    }
    ssize_t r = recv(d->fd, d->buf + d->got, need - d->got, MSG_DONTWAIT);
    if (r > 0) {
      d->got += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    bool open = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (open && now < d->deadline) return WEFT_OK; /* the rest comes later */
    if (d->from >= 0) {                            /* a proven notice, cut off */
      int from = d->from;
      tcp_dialin_drop(ctx, i, NULL);
      return answer ? WEFT_OK : tcp_notice_take(ctx, from, NULL);
    }
    char why[160];
    if (open)
      snprintf(why, sizeof why, "it sent %zu of the %zu bytes that say who it is in %.1f s", d->got,
               (size_t)TCP_HANDSHAKE_BYTES, tcp_dialin_wait_s(ctx));
    else
      snprintf(why, sizeof why, "it %s after %zu of the %zu bytes that say who it is",
               r == 0 ? "closed" : strerror(errno), d->got, (size_t)TCP_HANDSHAKE_BYTES);
    tcp_dialin_drop(ctx, i, why);
    return WEFT_OK;
  }
}

weft_status tcp_dialins_advance(tcp_ctx *ctx, const char *answer, bool *progressed) {
  if (!ctx->ndialins) return WEFT_OK;
  double now = weft_now();
  /* backwards: a dial-in that ends takes the last one's place */
  for (int i = ctx->ndialins - 1; i >= 0; i--)
    WEFT_CHECK(tcp_dialin_step(ctx, i, now, answer, progressed));
  return WEFT_OK;
}

/* Polls the dial-ins' sockets until one is readable or `until`. */
static void tcp_dialins_sleep(tcp_ctx *ctx, double until) {
  struct pollfd *pf = ctx->pfds; /* tcp_pfds_max counts TCP_DIALINS_MAX of them */
  double soonest = until;
  for (int i = 0; i < ctx->ndialins; i++) {
    pf[i] = (struct pollfd){.fd = ctx->dialins[i].fd, .events = POLLIN};
    if (ctx->dialins[i].deadline < soonest) soonest = ctx->dialins[i].deadline;
  }
  int ms = (int)((soonest - weft_now()) * 1000) + 1;
  if (ms > 0 && poll(pf, (nfds_t)ctx->ndialins, ms) < 0) { /* EINTR: the caller loops */
  }
}

void tcp_answer_waiting_dials(tcp_ctx *ctx, const char *reason) {
  for (int r = 0; r < ctx->nrails; r++) {
    int lfd = r ? ctx->rail_fd[r] : ctx->listen_fd;
    for (int k = 0; lfd >= 0 && k < TCP_DIALINS_MAX(ctx->args->size) && tcp_dialin_accept(ctx, lfd);
         k++) {
    }
  }
  /* Dialers send their proof right after connecting; one budget for all,
   * so a stray client cannot hold the failing rank up. */
  double budget = ctx->args->timeout_s < 0.2 ? ctx->args->timeout_s : 0.2;
  double until = weft_now() + budget;
  for (;;) {
    bool moved = false;
    (void)tcp_dialins_advance(ctx, reason, &moved);
    if (!ctx->ndialins || weft_now() >= until) return;
    tcp_dialins_sleep(ctx, until);
  }
}

/* The peer's listener refused: no process holds it any more, so the peer
 * ended (it existed before the rendezvous ended and lives until fini, which
 * comes only after the peer dialed every connection it needed). */
static void tcp_probe_refused(tcp_conn *c) {
  tcp_peer *p = &c->ctx->peers[c->peer];
  if (!p->gone_at) p->gone_at = weft_now() - TCP_GONE_GRACE_S;
  net_addr_str((const struct sockaddr *)&p->addr, c->where, sizeof c->where);
  p->gone_why = "its listener refuses connections, so its process ended before it connected "
                "to this rank";
  WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d: peer %d's listener refuses a probe", c->ctx->args->rank,
            c->peer);
}

static void tcp_probe_send(tcp_conn *c, int fd) {
  tcp_proof proof;
  tcp_hello(c->ctx, c->peer, TCP_PROBE_CHANNEL, &proof);
  if (send(fd, &proof, sizeof proof, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { /* best effort */
  }
  close(fd);
}

void tcp_conn_probe_start(tcp_conn *c, double now) {
  const tcp_peer *p = &c->ctx->peers[c->peer];
  c->probe_at = now;
  if (!p->known || c->probe_fd >= 0) return;
  int fd = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return; /* no fd now: the next interval tries again */
  WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d still waits for peer %d's dial: probing its listener",
            c->ctx->args->rank, c->peer);
  if (!connect(fd, (const struct sockaddr *)&p->addr, p->addr_len))
    tcp_probe_send(c, fd);
  else if (errno == EINPROGRESS)
    c->probe_fd = fd;
  else {
    if (errno == ECONNREFUSED) tcp_probe_refused(c);
    close(fd);
  }
}

void tcp_conn_probe_done(tcp_conn *c) {
  int err = 0;
  socklen_t len = sizeof err;
  int fd = c->probe_fd;
  c->probe_fd = -1;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)) err = errno;
  if (!err) {
    tcp_probe_send(c, fd);
    return;
  }
  /* Anything but a refusal (unreachable, timed out) says nothing of the
   * process: the link may be down, and the timeout judges that. */
  if (err == ECONNREFUSED) tcp_probe_refused(c);
  close(fd);
}

weft_status tcp_conn_accept_one(tcp_ctx *ctx, int listen_fd, bool *progressed) {
  tcp_dialin_accept(ctx, listen_fd);
  return tcp_dialins_advance(ctx, NULL, progressed);
}

weft_status tcp_notice_first(tcp_ctx *ctx, weft_status st) {
  for (int i = 0; i < 8 && tcp_dialin_accept(ctx, ctx->listen_fd); i++) {
  }
  /* An error path: here the words of a notice that is on its way are worth
   * waiting for, each dial-in until its deadline. */
  for (;;) {
    bool moved = false;
    weft_status notice = tcp_dialins_advance(ctx, NULL, &moved);
    if (notice == WEFT_ERR_PEER_LOST) return notice; /* only a notice fails so */
    if (notice < 0 || !ctx->ndialins) return st;
    tcp_dialins_sleep(ctx, weft_now() + 2.0);
  }
}

/* ---- send path ---------------------------------------------------------- */

static weft_status tcp_read_abort(tcp_conn *c, tcp_stream *s, const char *target,
                                  size_t in_target);

/* Frames a dead peer sent before its failure notice that are looked past. */
#define TCP_NOTICE_SCAN_FRAMES 64

/* A send failed because the peer is gone. If it left a failure notice that we
 * have not read yet, report that (the first cause) instead of "broken pipe".
 * The notice may sit behind data frames the peer sent before it failed (an
 * algorithm that sends to a peer twice before it reads): the connection is
 * dead, so those are read and dropped on the way, as long as they are here. */
static weft_status tcp_send_failed(tcp_conn *c, tcp_stream *s, int err) {
  for (int f = 0; f < TCP_NOTICE_SCAN_FRAMES && s->rhdr_got == 0 && !c->rframe_done; f++) {
    tcp_frame_hdr h;
    ssize_t n = recv(s->fd, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
    if (n != (ssize_t)sizeof h) break;
    uint32_t type = ntohl(h.magic_type), len = ntohl(h.len);
    if (type == (TCP_FRAME_MAGIC | TCP_FRAME_ABORT)) {
      if (recv(s->fd, &s->rhdr, sizeof h, MSG_DONTWAIT) == (ssize_t)sizeof h)
        return tcp_read_abort(c, s, NULL, 0);
      break;
    }
    int queued = 0; /* a data frame is dropped only when all of it is here */
    if (type != (TCP_FRAME_MAGIC | TCP_FRAME_DATA) || ioctl(s->fd, FIONREAD, &queued) ||
        (size_t)queued < sizeof h + len ||
        recv(s->fd, NULL, sizeof h + len, MSG_TRUNC | MSG_DONTWAIT) != (ssize_t)(sizeof h + len))
      break;
  }
  weft_status st = weft_status_from_errno(err) == WEFT_ERR_SYSTEM ? WEFT_ERR_SYSTEM
                                                                  : WEFT_ERR_PEER_LOST;
  if (c->nstreams > 1)
    st = tcp_conn_fail(c, st, "sending to peer %d (%s) on stream %d of %d: %s", c->peer, c->where,
                       s->index, c->nstreams, strerror(err));
  else
    st = tcp_conn_fail(c, st, "sending to peer %d (%s): %s", c->peer, c->where, strerror(err));
  return tcp_notice_first(c->ctx, st);
}

/* The caller's side of one stream's sends. */
static weft_status tcp_stream_push(tcp_conn *c, tcp_stream *s, bool *progressed) {
  while (s->sq_count) {
    int before = s->sq_count;
    ssize_t w = tcp_stream_write(s);
    if (w < 0) {
      if (w == -EINTR) return WEFT_OK;
      if (w == -EAGAIN) { /* a gone peer reads no more: see tcp_conn_again */
        weft_status st = c->ctx->peers[c->peer].gone_at ? tcp_conn_again(c) : WEFT_AGAIN;
        return st == WEFT_AGAIN ? WEFT_OK : st;
      }
      return tcp_send_failed(c, s, (int)-w);
    }
    tcp_peer_heard(c);
    *progressed = true;
    c->ctx->data_moved = true;
    c->queued -= before - s->sq_count;
    if (before > s->sq_count && c->queued == 0) c->ctx->nsending--;
  }
  return WEFT_OK;
}

weft_status tcp_conn_push_sends(tcp_conn *c, bool *progressed) {
  for (int i = 0; i < c->nstreams && c->queued; i++) {
    tcp_stream *s = &c->streams[i];
    if (s->owner < 0 && s->sq_count) WEFT_CHECK(tcp_stream_push(c, s, progressed));
  }
  return WEFT_OK;
}

/* What a helper found on stream s becomes the connection's failure, with
 * its sentence; a peer's notice keeps its words as the first cause. */
static weft_status tcp_stream_absorb(tcp_conn *c, tcp_stream *s) {
  char why[sizeof s->why], origin[sizeof s->origin];
  tcp_stream_lock(s);
  weft_status st = s->failed;
  bool notice = s->failed_notice;
  memcpy(why, s->why, sizeof why);
  memcpy(origin, s->origin, sizeof origin);
  tcp_stream_unlock(s);
  st = tcp_conn_fail(c, st, "%s", why);
  if (notice) {
    snprintf(c->ctx->args->errors->origin, sizeof c->ctx->args->errors->origin, "%s", origin);
    return st;
  }
  return st == WEFT_ERR_PEER_LOST ? tcp_notice_first(c->ctx, st) : st;
}

/* A helper's stream: its failure, or whether `full` pieces are queued. */
static weft_status tcp_stream_busy(tcp_conn *c, tcp_stream *s, int full) {
  tcp_stream_lock(s);
  bool failed = s->failed != WEFT_OK;
  bool busy = s->sq_count >= full;
  tcp_stream_unlock(s);
  if (failed) return tcp_stream_absorb(c, s);
  return busy ? WEFT_AGAIN : WEFT_OK;
}

static weft_status tcp_ready(tcp_conn *c) {
  if (c->state == TCP_CONN_DEAD) return c->dead_status;
  if (c->state != TCP_CONN_UP)
    return c->ctx->peers[c->peer].gone_at ? tcp_conn_again(c) : WEFT_AGAIN;
  for (int i = 0; i < c->nstreams; i++) {
    tcp_stream *s = &c->streams[i];
    weft_status st = s->owner < 0 ? (s->sq_count < TCP_SEND_DEPTH ? WEFT_OK : WEFT_AGAIN)
                                  : tcp_stream_busy(c, s, TCP_SEND_DEPTH);
    if (st == WEFT_AGAIN) return c->ctx->peers[c->peer].gone_at ? tcp_conn_again(c) : WEFT_AGAIN;
    if (st) return st;
  }
  return WEFT_OK;
}

weft_status tcp_send_ready(weft_tp_conn *conn) {
  return tcp_ready(tcp_conn_of(conn));
}

weft_status tcp_send(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                     const struct weft_mem_ops *mem, unsigned flags) {
  tcp_conn *c = tcp_conn_of(conn);
  (void)mem; /* host memory: the socket reads it directly */
  weft_status st = tcp_ready(c);
  if (st) return st == WEFT_AGAIN ? WEFT_ERR_INTERNAL : st;
  if (bytes > c->ctx->args->chunk_bytes) return WEFT_ERR_INVALID;
  size_t piece;
  int n = tcp_pieces(c->nstreams, bytes, &piece);
  /* the helpers' pieces first, so they move while the caller writes its own */
  for (int i = n - 1; i >= 0; i--) {
    tcp_stream *s = &c->streams[i];
    size_t off = (size_t)i * piece, len = i == n - 1 ? bytes - off : piece;
    tcp_stream_lock(s);
    tcp_send_entry *e = &s->sq[(s->sq_head + s->sq_count) % TCP_SEND_DEPTH];
    e->hdr = (tcp_frame_hdr){htonl(TCP_FRAME_MAGIC | TCP_FRAME_DATA), htonl(weft_tag_seq(tag)),
                             htonl((uint32_t)len), htonl((uint32_t)bytes),
                             htonl(weft_tag_sig(tag))};
    e->src = (const char *)src + off;
    e->len = len;
    e->sent = 0;
    s->sq_count++;
    tcp_stream_unlock(s);
    if (s->owner >= 0) {
      tcp_pool_wake(c->ctx, s);
    } else if (c->queued++ == 0) {
      c->ctx->nsending++;
    }
  }
  /* A large chunk waits for the transport's progress, which the engine runs
   * once the algorithm has posted what it can: then one sendmsg carries
   * every chunk queued (up to TCP_SEND_DEPTH), rather than one each. A
   * chunk on a pipeline's path (WEFT_SEND_NOW) does not: the next rank
   * waits for it. */
  if (bytes >= TCP_DEFER_MIN && !(flags & WEFT_SEND_NOW)) return WEFT_OK;
  bool progressed;
  return tcp_conn_push_sends(c, &progressed);
}

weft_status tcp_send_idle(weft_tp_conn *conn) {
  tcp_conn *c = tcp_conn_of(conn);
  if (c->state == TCP_CONN_DEAD) return c->dead_status;
  if (c->state != TCP_CONN_UP) return WEFT_OK; /* nothing was ever posted */
  bool progressed;
  WEFT_CHECK(tcp_conn_push_sends(c, &progressed));
  if (c->queued) return WEFT_AGAIN;
  for (int i = 1; i < c->nstreams; i++)
    if (c->streams[i].owner >= 0) WEFT_STATUS_PASS(tcp_stream_busy(c, &c->streams[i], 1));
  return WEFT_OK;
}

/* ---- receive path ------------------------------------------------------- */

static weft_status tcp_read_abort(tcp_conn *c, tcp_stream *s, const char *target,
                                  size_t in_target) {
  size_t len = ntohl(s->rhdr.len);
  if (len > TCP_ABORT_TEXT_MAX) len = TCP_ABORT_TEXT_MAX;
  char text[TCP_ABORT_TEXT_MAX + 1];
  size_t got = in_target < len ? in_target : len;
  if (got) memcpy(text, target, got);
  weft_error_sink err;
  if (got < len && net_recv_all(s->fd, text + got, len - got, weft_now() + 1.0, &err)) len = got;
  text[len] = 0;
  weft_status st = tcp_conn_fail(c, WEFT_ERR_PEER_LOST, "peer %d passed on a failure: %s", c->peer, text);
  snprintf(c->ctx->args->errors->origin, sizeof c->ctx->args->errors->origin, "%s", text);
  return st;
}

static weft_status tcp_check_header(tcp_conn *c, tcp_stream *s, weft_tag tag, size_t len,
                                    size_t total, const char *target) {
  tcp_frame_info f;
  if (tcp_frame_parse((const uint8_t *)&s->rhdr, sizeof s->rhdr, &f))
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL, "garbage on the connection from %s", c->where);
  if (f.type == TCP_FRAME_ABORT) return tcp_read_abort(c, s, target, s->rpay_got);
  if (f.type != TCP_FRAME_DATA)
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL, "unknown frame type %u from %s", f.type, c->where);
  weft_error_sink *sink = c->ctx->args->errors;
  if (weft_chunk_check(sink, c->peer, f.tag, tag, f.total, total))
    return tcp_conn_fail(c, WEFT_ERR_MISMATCH, "%s", sink->msg);
  if (f.len != len)
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL,
                         "peer %d sent a %u-byte piece of a %zu-byte chunk on stream %d of %d "
                         "where %zu bytes belong",
                         c->peer, f.len, total, s->index, c->nstreams, len);
  return WEFT_OK;
}

/* The caller's side of one piece (`len` bytes of a `total`-byte chunk) on
 * stream s into target; OK when complete. */
static weft_status tcp_stream_recv(tcp_conn *c, tcp_stream *s, weft_tag tag, size_t len,
                                   size_t total, char *target) {
  while (s->rhdr_got < sizeof s->rhdr || s->rpay_got < len) {
    bool hdr_was_open = s->rhdr_got < sizeof s->rhdr;
    ssize_t r = tcp_stream_read(s, target, len);
    if (r == 0) {
      if (c->nstreams > 1)
        return tcp_notice_first(
            c->ctx, tcp_conn_fail(c, WEFT_ERR_PEER_LOST,
                                  "peer %d (%s) closed stream %d of %d: its process ended or "
                                  "crashed, or the stream was cut",
                                  c->peer, c->where, s->index, c->nstreams));
      return tcp_notice_first(
          c->ctx, tcp_conn_fail(c, WEFT_ERR_PEER_LOST,
                                "peer %d (%s) closed the connection: its process ended or crashed",
                                c->peer, c->where));
    }
    if (r < 0) {
      if (r == -EINTR) continue;
      if (r == -EAGAIN) {
        s->want_recv = true;
        return c->ctx->peers[c->peer].gone_at ? tcp_conn_again(c) : WEFT_AGAIN;
      }
      return tcp_notice_first(c->ctx, tcp_conn_fail(c, WEFT_ERR_PEER_LOST,
                                                    "receiving from peer %d (%s): %s", c->peer,
                                                    c->where, strerror((int)-r)));
    }
    tcp_peer_heard(c);
    c->ctx->data_moved = true;
    if (hdr_was_open && s->rhdr_got == sizeof s->rhdr)
      WEFT_CHECK(tcp_check_header(c, s, tag, len, total, target));
  }
  return WEFT_OK;
}

/* Reads one chunk of `bytes` into target, piece i from stream i; OK when
 * every piece is complete. */
static weft_status tcp_recv_frame(tcp_conn *c, weft_tag tag, size_t bytes, char *target) {
  if (c->state == TCP_CONN_DEAD) return c->dead_status;
  if (c->state != TCP_CONN_UP) {
    c->streams[0].want_recv = true;
    return c->ctx->peers[c->peer].gone_at ? tcp_conn_again(c) : WEFT_AGAIN;
  }
  size_t piece;
  int n = tcp_pieces(c->nstreams, bytes, &piece);
  bool pending = false;
  for (int i = 0; i < n; i++) {
    tcp_stream *s = &c->streams[i];
    size_t off = (size_t)i * piece, len = i == n - 1 ? bytes - off : piece;
    if (s->owner < 0) {
      weft_status st = tcp_stream_recv(c, s, tag, len, bytes, target + off);
      if (st == WEFT_AGAIN)
        pending = true;
      else if (st)
        return st;
      continue;
    }
    tcp_stream_lock(s);
    bool failed = s->failed != WEFT_OK, posted = s->rx_posted, done = s->rx_done;
    if (!failed && !posted) {
      s->rx_posted = true;
      s->rx_target = target + off;
      s->rx_len = len;
      s->rx_total = bytes;
      s->rx_tag = tag;
    }
    tcp_stream_unlock(s);
    if (failed) return tcp_stream_absorb(c, s);
    if (!posted) tcp_pool_wake(c->ctx, s);
    if (!done) pending = true;
  }
  if (pending) return c->ctx->peers[c->peer].gone_at ? tcp_conn_again(c) : WEFT_AGAIN;
  for (int i = 0; i < n; i++) {
    tcp_stream *s = &c->streams[i];
    tcp_stream_lock(s);
    s->rhdr_got = 0;
    s->rpay_got = 0;
    s->rx_posted = s->rx_done = false;
    tcp_stream_unlock(s);
  }
  return WEFT_OK;
}

weft_status tcp_recv_peek(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data) {
  tcp_conn *c = tcp_conn_of(conn);
  if (bytes > c->ctx->args->chunk_bytes) return WEFT_ERR_INVALID;
  if (!c->slot) { /* once per connection, on its first peek */
    c->slot = c->ctx->slot_mem->alloc_slots(c->ctx->args->chunk_bytes);
    if (!c->slot) return WEFT_ERR_NOMEM;
  }
  if (!c->rframe_done) {
    weft_status st = tcp_recv_frame(c, tag, bytes, c->slot);
    if (st) return st;
    c->rframe_done = true;
  }
  *data = c->slot;
  return WEFT_OK;
}

weft_status tcp_recv_release(weft_tp_conn *conn) {
  tcp_conn *c = tcp_conn_of(conn);
  if (!c->rframe_done) return c->state == TCP_CONN_DEAD ? c->dead_status : WEFT_ERR_INTERNAL;
  c->rframe_done = false;
  return WEFT_OK;
}

weft_status tcp_recv_into(weft_tp_conn *conn, weft_tag tag, size_t bytes, void *dst,
                          const struct weft_mem_ops *mem) {
  tcp_conn *c = tcp_conn_of(conn);
  (void)mem; /* host memory: the socket writes it directly */
  if (c->rframe_done) return WEFT_ERR_INTERNAL; /* a peeked chunk was not released */
  return tcp_recv_frame(c, tag, bytes, dst);
}

weft_status tcp_recv(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks) {
  return weft_tp_recv_first(tcp_recv_into, conn, tag, chunk_bytes, bytes, dst, mem, chunks);
}
