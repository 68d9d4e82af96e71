/* tcp_transport.c - the TCP transport's table, per-communicator state,
 * listener, progress and wait. The data path is in tcp_conn.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
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
#include "src/mem/mem.h"
#include "tcp.h"

/* The published address is the listener's, packed (net.h). */
static bool tcp_addr_unpack(const void *blob, size_t len, struct sockaddr_storage *a,
                            socklen_t *alen) {
  return len == NET_ADDR_PACKED && net_addr_unpack(blob, a, alen);
}

/* The interfaces a socket could use: up, with an address; loopback last. */
static weft_status tcp_probe(char *why, size_t why_len) {
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list)) {
    snprintf(why, why_len, "cannot list the network interfaces: %s", strerror(errno));
    return WEFT_ERR_UNSUPPORTED;
  }
  size_t used = 0;
  int n = 0;
  why[0] = 0;
  for (int loop = 0; loop < 2; loop++)
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
      if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
      if (!!(i->ifa_flags & IFF_LOOPBACK) != loop) continue;
      char where[NI_MAXHOST];
      socklen_t alen = i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                          : sizeof(struct sockaddr_in6);
      if (getnameinfo(i->ifa_addr, alen, where, sizeof where, NULL, 0, NI_NUMERICHOST)) continue;
      if (used < why_len)
        used += (size_t)snprintf(why + used, why_len - used, "%s%s %s", n ? ", " : "interfaces ",
                                 i->ifa_name, where);
      n++;
    }
  freeifaddrs(list);
  if (n == 0) {
    snprintf(why, why_len, "no network interface is up with an address");
    return WEFT_ERR_UNSUPPORTED;
  }
  return WEFT_OK;
}

static weft_status tcp_init(const weft_transport_init_args *args, weft_tp_ctx **out,
                            void *addr, size_t *addr_len) {
  tcp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return WEFT_ERR_NOMEM;
  ctx->args = args;
  ctx->slot_mem = args->slot_mem ? args->slot_mem : &weft_mem_host;
  ctx->listen_fd = -1;
  size_t nconns = (size_t)args->size * WEFT_TP_CHANNELS;
  ctx->conns = calloc(nconns, sizeof *ctx->conns);
  ctx->pfds = calloc(nconns + 2, sizeof *ctx->pfds);
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
  *out = (weft_tp_ctx *)ctx;
  return WEFT_OK;
nomem:
  free(ctx->conns);
  free(ctx->pfds);
  free(ctx);
  return WEFT_ERR_NOMEM;
}

static int tcp_send_depth(const weft_tp_ctx *ctx) {
  (void)ctx;
  return TCP_SEND_DEPTH;
}

static bool tcp_can_reach(weft_tp_ctx *tctx, int peer, const void *peer_addr,
                          size_t addr_len, char *why, size_t why_len) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
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

static weft_status tcp_connect(weft_tp_ctx *tctx, int peer, int channel, const void *peer_addr,
                               size_t addr_len, weft_tp_conn **out) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  if (peer < 0 || peer >= ctx->args->size || peer == ctx->args->rank || channel < 0 ||
      channel >= WEFT_TP_CHANNELS)
    return WEFT_ERR_INVALID;
  tcp_conn **slot = &ctx->conns[tcp_conn_index(peer, channel)];
  if (!*slot) WEFT_CHECK(tcp_conn_create(ctx, peer, channel, slot));
  tcp_conn *c = *slot;
  *out = (weft_tp_conn *)c;
  if (c->state != TCP_CONN_AWAIT_ACCEPT || ctx->args->rank > peer) return WEFT_OK;
  struct sockaddr_storage a;
  socklen_t alen;
  if (!tcp_addr_unpack(peer_addr, addr_len, &a, &alen))
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL, "peer %d published a malformed address", peer);
  return tcp_conn_dial(c, &a, alen);
}

static weft_status tcp_progress(weft_tp_ctx *tctx, bool *progressed) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  *progressed = ctx->data_moved;
  ctx->data_moved = false;
  if (ctx->awaiting_accept > 0) WEFT_CHECK(tcp_conn_accept_one(ctx, progressed));
  if (ctx->nsending > 0)
    for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
      tcp_conn *c = ctx->conns[p];
      if (c && c->state == TCP_CONN_UP && c->sq_count) WEFT_CHECK(tcp_conn_push_sends(c, progressed));
    }
  return WEFT_OK;
}

static weft_status tcp_wait(weft_tp_ctx *tctx, int timeout_ms) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  struct pollfd *pf = ctx->pfds;
  nfds_t n = 0;
  pf[n++] = (struct pollfd){.fd = ctx->args->wake_fd, .events = POLLIN};
  if (ctx->awaiting_accept > 0) pf[n++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
    tcp_conn *c = ctx->conns[p];
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

static void tcp_abort_all(weft_tp_ctx *tctx, const char *reason) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
    tcp_conn *c = ctx->conns[p];
    if (!c || c->state != TCP_CONN_UP) continue;
    /* A frame cannot be cut into the middle of a half-written one; then the
     * peer just sees the connection end. */
    if (!c->sq_count || c->sq[c->sq_head].sent == 0) {
      size_t tlen = strnlen(reason, TCP_ABORT_TEXT_MAX);
      tcp_frame_hdr h = {htonl(TCP_FRAME_MAGIC | TCP_FRAME_ABORT), 0, htonl((uint32_t)tlen), 0};
      struct iovec iov[2] = {{&h, sizeof h}, {(void *)reason, tlen}};
      struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
      if (sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        WEFT_INFO(WEFT_SUBSYS_NET, "tcp: abort notice to peer %d not sent: %s", c->peer,
                  strerror(errno));
    }
    shutdown(c->fd, SHUT_WR);
    c->state = TCP_CONN_DEAD;
    c->dead_status = WEFT_ERR_ABORTED;
  }
}

static void tcp_fini(weft_tp_ctx *tctx) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  if (!ctx) return;
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++)
    if (ctx->conns[p]) tcp_conn_destroy(ctx->conns[p]);
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  free(ctx->conns);
  free(ctx->pfds);
  free(ctx);
}

const weft_transport weft_transport_tcp = {
    .abi_version = WEFT_TRANSPORT_ABI,
    .name = "tcp",
    .caps = {.send_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .recv_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .map_kinds = 0, /* no shared address space with a remote peer */
             .sends_are_stores = false},
    .probe = tcp_probe,
    .init = tcp_init,
    .send_depth = tcp_send_depth,
    .can_reach = tcp_can_reach,
    .connect = tcp_connect,
    .send_ready = tcp_send_ready,
    .send = tcp_send,
    .send_idle = tcp_send_idle,
    .recv_peek = tcp_recv_peek,
    .recv_release = tcp_recv_release,
    .recv_into = tcp_recv_into,
    .register_mem = weft_tp_no_register,
    .deregister_mem = weft_tp_no_deregister,
    .map_peer_mem = weft_tp_no_map,
    .progress = tcp_progress,
    .wait = tcp_wait,
    .abort_all = tcp_abort_all,
    .fini = tcp_fini,
};
