/* tcp_transport.c - the TCP transport's table, per-communicator state,
 * listener, progress and wait. The data path is in tcp_conn.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "tcp.h"

/* The published address is the listener's, packed (net.h). */
static bool tcp_addr_unpack(const void *blob, size_t len, struct sockaddr_storage *a,
                            socklen_t *alen) {
  return len == NET_ADDR_PACKED && net_addr_unpack(blob, a, alen);
}

static weft_status tcp_init(const weft_transport_init_args *args, weft_transport_ctx **out,
                            void *addr, size_t *addr_len) {
  weft_transport_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return WEFT_ERR_NOMEM;
  ctx->args = args;
  ctx->listen_fd = -1;
  ctx->conns = calloc((size_t)args->size, sizeof *ctx->conns);
  ctx->pfds = calloc((size_t)args->size + 2, sizeof *ctx->pfds);
  if (!ctx->conns || !ctx->pfds) goto nomem;

  /* The default interface is the one that reached the rendezvous; the
   * settings can name another. */
  const char *rules = weft_settings()->tcp.socket_ifname;
  int family = WEFT_FAMILY_NUMBER(weft_settings()->tcp.socket_family);
  struct sockaddr_storage local = args->local_addr;
  socklen_t local_len = args->local_addr_len;
  if (*rules || family || local_len == 0) {
    char ifname[64];
    weft_status st = net_pick_local_addr(rules, family, local_len ? (struct sockaddr *)&local : NULL,
                                         local_len, &local, &local_len, ifname, sizeof ifname,
                                         args->errors);
    if (st) {
      free(ctx->conns);
      free(ctx->pfds);
      free(ctx);
      return st;
    }
    WEFT_INFO(WEFT_SUBSYS_NET, "tcp: data sockets on interface %s", ifname);
  }
  net_addr_set_port(&local, 0);
  weft_status st = net_listen(&local, local_len, 1024, &ctx->listen_fd, &ctx->addr,
                              &ctx->addr_len, args->errors);
  if (st) {
    free(ctx->conns);
    free(ctx->pfds);
    free(ctx);
    return st;
  }
  net_addr_pack(&ctx->addr, addr);
  *addr_len = NET_ADDR_PACKED;
  char where[80];
  WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d listens on %s", args->rank,
            net_addr_str((struct sockaddr *)&ctx->addr, where, sizeof where));
  *out = ctx;
  return WEFT_OK;
nomem:
  free(ctx->conns);
  free(ctx->pfds);
  free(ctx);
  return WEFT_ERR_NOMEM;
}

static bool tcp_can_reach(weft_transport_ctx *ctx, int peer, const void *peer_addr,
                          size_t addr_len, char *why, size_t why_len) {
  struct sockaddr_storage a;
  socklen_t alen;
  char where[80];
  (void)peer;
  if (!tcp_addr_unpack(peer_addr, addr_len, &a, &alen)) {
    snprintf(why, why_len, "tcp: the peer published no usable address");
    return false;
  }
  if (a.ss_family != ctx->addr.ss_family) {
    snprintf(why, why_len, "tcp: the peer listens on %s, another address family than ours",
             net_addr_str((struct sockaddr *)&a, where, sizeof where));
    return false;
  }
  snprintf(why, why_len, "tcp to %s", net_addr_str((struct sockaddr *)&a, where, sizeof where));
  return true;
}

static weft_status tcp_connect(weft_transport_ctx *ctx, int peer, const void *peer_addr,
                               size_t addr_len, weft_conn **out) {
  if (peer < 0 || peer >= ctx->args->size || peer == ctx->args->rank) return WEFT_ERR_INVALID;
  if (!ctx->conns[peer]) WEFT_CHECK(tcp_conn_create(ctx, peer, &ctx->conns[peer]));
  weft_conn *c = ctx->conns[peer];
  *out = c;
  if (c->state != TCP_CONN_AWAIT_ACCEPT || ctx->args->rank > peer) return WEFT_OK;
  struct sockaddr_storage a;
  socklen_t alen;
  if (!tcp_addr_unpack(peer_addr, addr_len, &a, &alen))
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL, "peer %d published a malformed address", peer);
  return tcp_conn_dial(c, &a, alen);
}

static weft_status tcp_progress(weft_transport_ctx *ctx, bool *progressed) {
  *progressed = ctx->data_moved;
  ctx->data_moved = false;
  if (ctx->awaiting_accept > 0) WEFT_CHECK(tcp_conn_accept_one(ctx, progressed));
  if (ctx->nsending > 0)
    for (int p = 0; p < ctx->args->size; p++) {
      weft_conn *c = ctx->conns[p];
      if (c && c->state == TCP_CONN_UP && c->sq_count) WEFT_CHECK(tcp_conn_push_sends(c, progressed));
    }
  return WEFT_OK;
}

static weft_status tcp_wait(weft_transport_ctx *ctx, int timeout_ms) {
  struct pollfd *pf = ctx->pfds;
  nfds_t n = 0;
  pf[n++] = (struct pollfd){.fd = ctx->args->wake_fd, .events = POLLIN};
  if (ctx->awaiting_accept > 0) pf[n++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
  for (int p = 0; p < ctx->args->size; p++) {
    weft_conn *c = ctx->conns[p];
    if (!c || c->state != TCP_CONN_UP) continue;
    short ev = (short)((c->want_recv ? POLLIN : 0) | (c->sq_count ? POLLOUT : 0));
    c->want_recv = false;
    if (ev) pf[n++] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  if (poll(pf, n, timeout_ms) < 0 && errno != EINTR) {
    weft_error_sink_set(ctx->args->errors, "poll: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  return WEFT_OK;
}

static void tcp_abort_all(weft_transport_ctx *ctx, const char *reason) {
  for (int p = 0; p < ctx->args->size; p++) {
    weft_conn *c = ctx->conns[p];
    if (!c || c->state != TCP_CONN_UP) continue;
    /* A frame cannot be cut into the middle of a half-written one; then the
     * peer just sees the connection end. */
    if (!c->sq_count || c->sq[c->sq_head].sent == 0) {
      size_t tlen = strnlen(reason, TCP_ABORT_TEXT_MAX);
      tcp_frame_hdr h = {htonl(TCP_FRAME_MAGIC | TCP_FRAME_ABORT), 0, htonl((uint32_t)tlen), 0};
      struct iovec iov[2] = {{&h, sizeof h}, {(void *)reason, tlen}};
      struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
      if (sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        WEFT_INFO(WEFT_SUBSYS_NET, "tcp: abort notice to peer %d not sent: %s", p, strerror(errno));
    }
    shutdown(c->fd, SHUT_WR);
    c->state = TCP_CONN_DEAD;
    c->dead_status = WEFT_ERR_ABORTED;
  }
}

static void tcp_fini(weft_transport_ctx *ctx) {
  if (!ctx) return;
  for (int p = 0; p < ctx->args->size; p++)
    if (ctx->conns[p]) tcp_conn_destroy(ctx->conns[p]);
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  free(ctx->conns);
  free(ctx->pfds);
  free(ctx);
}

const weft_transport weft_transport_tcp = {
    .abi_version = WEFT_TRANSPORT_ABI,
    .name = "tcp",
    .sends_are_stores = false,
    .init = tcp_init,
    .can_reach = tcp_can_reach,
    .connect = tcp_connect,
    .send_ready = tcp_send_ready,
    .send = tcp_send,
    .send_idle = tcp_send_idle,
    .recv_peek = tcp_recv_peek,
    .recv_release = tcp_recv_release,
    .recv_into = tcp_recv_into,
    .map_peer_mem = weft_transport_no_map, /* no shared address space with a remote peer */
    .progress = tcp_progress,
    .wait = tcp_wait,
    .abort_all = tcp_abort_all,
    .fini = tcp_fini,
};
