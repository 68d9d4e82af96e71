/* tcp_transport.c - the TCP transport's table, per-communicator state,
 * listeners (one per rail), the stream and thread counts, progress and wait.
 * The data path is in tcp_conn.c, the helper threads in tcp_pool.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/base/net.h"
#include "transports/tcp/tcp_settings.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "src/topo/select.h"
#include "tcp.h"

/* The published address: the listener's, packed (net.h), then the liveness
 * facts (TCP_ADDR_BYTES), then the streams and rails (TCP_ADDR_EXT); the
 * shorter forms are accepted too (one stream, one rail). */
static bool tcp_addr_ext_ok(const uint8_t *b, size_t len) {
  if (len == NET_ADDR_PACKED || len == TCP_ADDR_BYTES) return true;
  if (len < TCP_ADDR_EXT(1)) return false;
  int streams = b[TCP_ADDR_BYTES], rails = b[TCP_ADDR_BYTES + 1];
  return streams >= 1 && streams <= TCP_MAX_STREAMS && rails >= 1 && rails <= TCP_MAX_RAILS &&
         len == (size_t)TCP_ADDR_EXT(rails);
}
static bool tcp_addr_unpack(const void *blob, size_t len, struct sockaddr_storage *a,
                            socklen_t *alen) {
  return tcp_addr_ext_ok(blob, len) && net_addr_unpack(blob, a, alen);
}

static void tcp_put64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}
static uint64_t tcp_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

/* FNV-1a: host identities are compared, never trusted for anything more. */
static uint64_t tcp_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
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
  if (used < why_len) {
    char cc[160];
    tcp_congestion_describe(cc, sizeof cc);
    snprintf(why + used, why_len - used, "; %s", cc);
  }
  return WEFT_OK;
}

static void tcp_fini(weft_tp_ctx *tctx);

/* ---- fork: a child must not keep this process's sockets ------------------
 * A child forked without exec (a DataLoader's workers) inherits every socket,
 * and SOCK_CLOEXEC does not help without exec. Then, when this process dies,
 * its sockets stay open in the child: no peer sees EOF, local or remote, and
 * they wait their whole timeout. So the child closes its copies at once (the
 * child handler of pthread_atfork: close is async-signal-safe), and a peer's
 * liveness never depends on who holds a socket last. The registry lock is
 * held across the fork, so the child sees a list no thread was changing.
 * A child that tries the parent's communicator gets an error, never its
 * parent's streams. */
static pthread_mutex_t tcp_fork_lock = PTHREAD_MUTEX_INITIALIZER;
static tcp_ctx *tcp_fork_list;
static pthread_once_t tcp_fork_once = PTHREAD_ONCE_INIT;

static void tcp_fork_prepare(void) {
  pthread_mutex_lock(&tcp_fork_lock);
}
static void tcp_fork_parent(void) {
  pthread_mutex_unlock(&tcp_fork_lock);
}
static void tcp_fork_child(void) {
  for (tcp_ctx *ctx = tcp_fork_list; ctx; ctx = ctx->fork_next) {
    if (ctx->listen_fd >= 0) close(ctx->listen_fd);
    ctx->listen_fd = -1;
    for (int i = 0; i < ctx->nanswered; i++) close(ctx->answered_fd[i]);
    ctx->nanswered = 0;
    for (int i = 0; i < ctx->ndialins; i++) close(ctx->dialins[i].fd);
    ctx->ndialins = 0;
    for (int r = 1; r < ctx->nrails; r++) {
      if (ctx->rail_fd[r] >= 0) close(ctx->rail_fd[r]);
      ctx->rail_fd[r] = -1;
    }
    /* The helpers were not copied into the child and their locks may be
     * held: the child drives nothing and never takes a stream's lock. */
    ctx->workers = NULL;
    ctx->nworkers = 0;
    ctx->want_threads = 0;
    if (ctx->done_fd >= 0) close(ctx->done_fd);
    ctx->done_fd = -1;
    for (int i = 0; i < ctx->args->size * WEFT_TP_CHANNELS; i++) {
      tcp_conn *c = ctx->conns[i];
      if (!c) continue;
      for (int j = 0; j < c->nstreams; j++) {
        tcp_stream *st = &c->streams[j];
        if (st->fd >= 0) close(st->fd);
        st->fd = -1;
        st->owner = -1;
        st->sq_count = 0;
      }
      if (c->probe_fd >= 0) close(c->probe_fd);
      c->probe_fd = -1;
      if (c->state == TCP_CONN_AWAIT_ACCEPT) ctx->awaiting_accept--;
      if (c->queued) ctx->nsending--;
      c->queued = 0;
      c->state = TCP_CONN_DEAD;
      c->dead_status = WEFT_ERR_INVALID;
    }
    for (int p = 0; p < ctx->args->size; p++) {
      if (ctx->peers[p].pidfd >= 0) close(ctx->peers[p].pidfd);
      ctx->peers[p].pidfd = -1;
    }
  }
  pthread_mutex_unlock(&tcp_fork_lock);
}
static void tcp_fork_register_once(void) {
  if (pthread_atfork(tcp_fork_prepare, tcp_fork_parent, tcp_fork_child))
    WEFT_WARN(WEFT_SUBSYS_NET, "tcp: cannot register the fork handler: a child forked later "
                               "keeps this rank's sockets, and its death is seen at the timeout");
}
static void tcp_fork_track(tcp_ctx *ctx) {
  pthread_once(&tcp_fork_once, tcp_fork_register_once);
  pthread_mutex_lock(&tcp_fork_lock);
  ctx->fork_next = tcp_fork_list;
  if (tcp_fork_list) tcp_fork_list->fork_prev = ctx;
  tcp_fork_list = ctx;
  pthread_mutex_unlock(&tcp_fork_lock);
}
static void tcp_fork_untrack(tcp_ctx *ctx) {
  pthread_mutex_lock(&tcp_fork_lock);
  if (ctx->fork_prev)
    ctx->fork_prev->fork_next = ctx->fork_next;
  else if (tcp_fork_list == ctx)
    tcp_fork_list = ctx->fork_next;
  if (ctx->fork_next) ctx->fork_next->fork_prev = ctx->fork_prev;
  ctx->fork_next = ctx->fork_prev = NULL;
  pthread_mutex_unlock(&tcp_fork_lock);
}

/* CPUs this process may run on (a launcher that binds ranks gives each its
 * share), at least 1. */
static int tcp_cpus(void) {
  cpu_set_t set;
  if (!sched_getaffinity(0, sizeof set, &set) && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Streams this rank asks for: WEFT_TCP_STREAMS, else one per rail and more
 * where there are cores to drive them (a 2- or 3-CPU rank keeps one: extra
 * sockets there only add system calls). The pair takes the smaller of both
 * ranks' numbers. */
static int tcp_want_streams(int rails) {
  long long set = tcp_settings()->streams;
  if (set != WEFT_SETTING_AUTO) return (int)set;
  int cpus = tcp_cpus();
  int n = cpus >= 8 ? 4 : cpus >= 4 ? 2 : 1;
  return n > rails ? n : rails;
}

/* Helper threads: WEFT_TCP_THREADS, else, once the ranks on this host are
 * known, one per two cores a rank has beyond three, never more than the
 * streams past the first (stream 0 is the caller's). */
static int tcp_want_threads(const tcp_ctx *ctx) {
  long long set = tcp_settings()->threads;
  int most = ctx->want_streams - 1;
  int n;
  if (set != WEFT_SETTING_AUTO) {
    n = (int)set;
  } else {
    int local = ctx->args->local_size > 0 ? ctx->args->local_size : 1;
    int per_rank = tcp_cpus() / local;
    n = per_rank >= 4 ? per_rank / 2 : 0;
  }
  return n < most ? n : most;
}

/* With a WEFT_SOCKET_IFNAME list (comma-separated, not an exclusion) each
 * entry that matches an interface not taken yet is a rail, in the list's
 * order: rail i of every rank should reach rail i of the others. Returns
 * how many rails it found (0 without a list); ctx->rail_addr holds them. */
static int tcp_pick_rails(tcp_ctx *ctx, const char *rules, int family) {
  if (!strchr(rules, ',') || rules[0] == '^') return 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", rules);
  int n = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok && n < TCP_MAX_RAILS;
       tok = strtok_r(NULL, ",", &save)) {
    weft_error_sink err;
    char name[64];
    struct sockaddr_storage a;
    socklen_t alen;
    if (net_pick_local_addr(tok, family, NULL, 0, &a, &alen, name, sizeof name, &err)) continue;
    bool taken = false;
    for (int r = 0; r < n; r++) taken |= !strcmp(ctx->rail_name[r], name);
    if (taken) continue;
    ctx->rail_addr[n] = a;
    ctx->rail_len[n] = alen;
    snprintf(ctx->rail_name[n], sizeof ctx->rail_name[n], "%s", name);
    n++;
  }
  return n;
}

static weft_status tcp_init(const weft_transport_init_args *args, weft_tp_ctx **out,
                            void *addr, size_t *addr_len) {
  tcp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return WEFT_ERR_NOMEM;
  ctx->args = args;
  ctx->slot_mem = args->slot_mem ? args->slot_mem : &weft_mem_host;
  ctx->listen_fd = -1;
  ctx->done_fd = -1;
  ctx->want_threads = -1;
  ctx->nrails = 1;
  for (int r = 0; r < TCP_MAX_RAILS; r++) ctx->rail_fd[r] = -1;
  size_t nconns = (size_t)args->size * WEFT_TP_CHANNELS;
  size_t npfds = tcp_pfds_max(args->size);
  ctx->conns = calloc(nconns, sizeof *ctx->conns);
  ctx->pfds = calloc(npfds, sizeof *ctx->pfds);
  ctx->pfd_peer = calloc(npfds, sizeof *ctx->pfd_peer);
  ctx->peers = calloc((size_t)args->size, sizeof *ctx->peers);
  if (!ctx->conns || !ctx->pfds || !ctx->pfd_peer || !ctx->peers) goto nomem;
  for (int p = 0; p < args->size; p++) ctx->peers[p].pidfd = -1;
  /* Two ranks compare pids only inside one pid namespace on one host. */
  if (args->place && args->place->pid_ns && args->place->host_id[0])
    ctx->host_hash = tcp_hash(args->place->host_id) ^ args->place->pid_ns;

  /* The default interface is the one that reached the rendezvous; the
   * settings can name another, or a list of rails. */
  const char *rules = tcp_settings()->socket_ifname;
  int family = WEFT_FAMILY_NUMBER(tcp_settings()->socket_family);
  struct sockaddr_storage local = args->local_addr;
  socklen_t local_len = args->local_addr_len;
  int rails = tcp_pick_rails(ctx, rules, family);
  if (rails >= 2) {
    ctx->nrails = rails;
    local = ctx->rail_addr[0];
    local_len = ctx->rail_len[0];
    WEFT_INFO(WEFT_SUBSYS_NET, "tcp: data sockets on %d interfaces, %s first", rails,
              ctx->rail_name[0]);
  } else if (*rules || family || local_len == 0) {
    char ifname[64];
    weft_status st = net_pick_local_addr(rules, family, local_len ? (struct sockaddr *)&local : NULL,
                                         local_len, &local, &local_len, ifname, sizeof ifname,
                                         args->errors);
    if (st) {
      tcp_fini((weft_tp_ctx *)ctx);
      return st;
    }
    snprintf(ctx->rail_name[0], sizeof ctx->rail_name[0], "%s", ifname);
    WEFT_INFO(WEFT_SUBSYS_NET, "tcp: data sockets on interface %s", ifname);
  }
  net_addr_set_port(&local, 0);
  weft_status st = net_listen(&local, local_len, 1024, &ctx->listen_fd, &ctx->addr,
                              &ctx->addr_len, args->errors);
  for (int r = 1; !st && r < ctx->nrails; r++)
    st = net_listen(&ctx->rail_addr[r], ctx->rail_len[r], 1024, &ctx->rail_fd[r],
                    &ctx->rail_addr[r], &ctx->rail_len[r], args->errors);
  if (!st) st = tcp_congestion_init(ctx);
  if (st) {
    tcp_fini((weft_tp_ctx *)ctx);
    return st;
  }
  ctx->rail_addr[0] = ctx->addr;
  ctx->rail_len[0] = ctx->addr_len;
  ctx->want_streams = tcp_want_streams(ctx->nrails);
  uint8_t *blob = addr;
  net_addr_pack(&ctx->addr, blob);
  uint32_t pid = ctx->host_hash ? htonl((uint32_t)getpid()) : 0;
  memcpy(blob + NET_ADDR_PACKED, &pid, 4);
  tcp_put64(blob + NET_ADDR_PACKED + 4, args->place ? args->place->pid_ns : 0);
  tcp_put64(blob + NET_ADDR_PACKED + 12, ctx->host_hash);
  blob[TCP_ADDR_BYTES] = (uint8_t)ctx->want_streams;
  blob[TCP_ADDR_BYTES + 1] = (uint8_t)ctx->nrails;
  for (int r = 1; r < ctx->nrails; r++)
    net_addr_pack(&ctx->rail_addr[r], blob + TCP_ADDR_EXT(r));
  *addr_len = TCP_ADDR_EXT(ctx->nrails);
  tcp_fork_track(ctx);
  char where[80];
  WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d listens on %s (%d rail%s), wants %d stream%s",
            args->rank, net_addr_str((struct sockaddr *)&ctx->addr, where, sizeof where),
            ctx->nrails, ctx->nrails > 1 ? "s" : "", ctx->want_streams,
            ctx->want_streams > 1 ? "s" : "");
  *out = (weft_tp_ctx *)ctx;
  return WEFT_OK;
nomem:
  tcp_fini((weft_tp_ctx *)ctx);
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
  /* The pair's streams and rails, from both ranks' published numbers: the
   * smaller stream count, and the rails both have, in order, of one family
   * on both sides. */
  const uint8_t *b = peer_addr;
  bool ext = addr_len >= TCP_ADDR_EXT(1);
  int peer_streams = ext ? b[TCP_ADDR_BYTES] : 1, peer_rails = ext ? b[TCP_ADDR_BYTES + 1] : 1;
  int streams = peer_streams < ctx->want_streams ? peer_streams : ctx->want_streams;
  struct sockaddr_storage rail_addr[TCP_MAX_RAILS];
  socklen_t rail_len[TCP_MAX_RAILS];
  rail_addr[0] = a;
  rail_len[0] = alen;
  int rails = 1;
  while (rails < ctx->nrails && rails < peer_rails && rails < streams &&
         net_addr_unpack(b + TCP_ADDR_EXT(rails), &rail_addr[rails], &rail_len[rails]) &&
         rail_addr[rails].ss_family == ctx->rail_addr[rails].ss_family)
    rails++;
  if (ctx->want_threads < 0) ctx->want_threads = tcp_want_threads(ctx);
  net_addr_str((struct sockaddr *)&a, where, sizeof where);
  if (streams == 1) {
    snprintf(why, why_len, "tcp to %s", where);
  } else {
    size_t used = (size_t)snprintf(why, why_len, "tcp x%d streams", streams);
    if (ctx->want_threads > 0 && used < why_len)
      used += (size_t)snprintf(why + used, why_len - used, " (%d helper thread%s)",
                               ctx->want_threads, ctx->want_threads > 1 ? "s" : "");
    for (int r = 0; r < rails && rails > 1 && used < why_len; r++)
      used += (size_t)snprintf(why + used, why_len - used, "%s%s", r ? "," : " over ",
                               ctx->rail_name[r][0] ? ctx->rail_name[r] : "?");
    for (int r = 0; r < rails && used < why_len; r++) {
      char w[80];
      used += (size_t)snprintf(why + used, why_len - used, "%s%s", r ? ", " : " to ",
                               net_addr_str((struct sockaddr *)&rail_addr[r], w, sizeof w));
    }
  }
  /* Kept for the failure notices (abort_all), the streams' dials and, on
   * this host, the peer's pid to watch while waiting for it (tcp_wait). */
  if (peer >= 0 && peer < ctx->args->size && peer != ctx->args->rank) {
    tcp_peer *p = &ctx->peers[peer];
    p->nstreams = streams;
    p->nrails = rails;
    for (int r = 0; r < rails; r++) {
      p->rail_addr[r] = rail_addr[r];
      p->rail_len[r] = rail_len[r];
    }
    uint32_t pid = 0;
    if (addr_len >= TCP_ADDR_BYTES) memcpy(&pid, b + NET_ADDR_PACKED, 4);
    pid = ntohl(pid);
    bool same_place = addr_len >= TCP_ADDR_BYTES && ctx->host_hash &&
                      tcp_get64(b + NET_ADDR_PACKED + 12) == ctx->host_hash &&
                      tcp_get64(b + NET_ADDR_PACKED + 4) == ctx->args->place->pid_ns;
    p->known = true;
    p->addr = a;
    p->addr_len = alen;
    p->pid = same_place && pid > 0 && (pid_t)pid != getpid() ? pid : 0;
  }
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
  /* The pair's streams and rails come from can_reach; a caller that
   * connects straight away (the contract allows it) learns them here. */
  char why[256];
  if (!ctx->peers[peer].known && !tcp_can_reach(tctx, peer, peer_addr, addr_len, why, sizeof why))
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL, "peer %d cannot be reached: %s", peer, why);
  if (!tcp_addr_unpack(peer_addr, addr_len, &a, &alen) || !ctx->peers[peer].known)
    return tcp_conn_fail(c, WEFT_ERR_PROTOCOL, "peer %d published a malformed address", peer);
  weft_status st = tcp_conn_dial(c);
  return st ? tcp_notice_first(ctx, st) : WEFT_OK;
}

static weft_status tcp_progress(weft_tp_ctx *tctx, bool *progressed) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  *progressed = ctx->data_moved;
  ctx->data_moved = false;
  if (ctx->nworkers > 0 && atomic_exchange(&ctx->helper_moved, false)) *progressed = true;
  /* accept_pending: a failure notice (or a dial) came while nothing was
   * awaited; the flag comes from a wait, so no accept call per round, except
   * while a dial-in has not said all it says (at most 2 s each). */
  if (ctx->awaiting_accept > 0 || ctx->accept_pending || ctx->ndialins > 0) {
    ctx->accept_pending = false;
    WEFT_CHECK(tcp_conn_accept_one(ctx, ctx->listen_fd, progressed));
    for (int r = 1; r < ctx->nrails; r++)
      WEFT_CHECK(tcp_conn_accept_one(ctx, ctx->rail_fd[r], progressed));
  }
  if (ctx->nsending > 0)
    for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
      tcp_conn *c = ctx->conns[p];
      if (c && c->state == TCP_CONN_UP && c->queued) WEFT_CHECK(tcp_conn_push_sends(c, progressed));
    }
  return WEFT_OK;
}

/* The pidfd of a peer on this host, opened at its first wait: it becomes
 * readable when the process ends, however many processes (children it
 * forked without exec, as DataLoader workers are) still hold its sockets.
 * No pidfd (a kernel before 5.3): sockets alone tell, as before. */
static int tcp_peer_pidfd(tcp_peer *p) {
  if (p->pidfd_tried) return p->pidfd;
  p->pidfd_tried = true;
#ifdef SYS_pidfd_open
  p->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)p->pid, 0);
  if (p->pidfd < 0 && errno == ESRCH) p->gone_at = weft_now(); /* already gone */
#endif
  return p->pidfd;
}

/* Also sleeps on the listener always (a failure notice may come from any
 * rank) and on the pidfd of each same-host peer it waits for: a wait is
 * already the slow path, so watching costs no system call per chunk. */
static weft_status tcp_wait(weft_tp_ctx *tctx, int timeout_ms) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  struct pollfd *pf = ctx->pfds;
  int *who = ctx->pfd_peer;
  unsigned gen = ++ctx->wait_gen;
  double now = 0; /* read once, only when a connection waits for a dial */
  nfds_t n = 0;
  who[n] = -1;
  pf[n++] = (struct pollfd){.fd = ctx->args->wake_fd, .events = POLLIN};
  who[n] = -1;
  pf[n++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
  for (int r = 1; r < ctx->nrails; r++) {
    who[n] = -1;
    pf[n++] = (struct pollfd){.fd = ctx->rail_fd[r], .events = POLLIN};
  }
  /* and the dial-ins, whose next bytes progress reads */
  for (int i = 0; i < ctx->ndialins; i++) {
    who[n] = -1;
    pf[n++] = (struct pollfd){.fd = ctx->dialins[i].fd, .events = POLLIN};
  }
  nfds_t listeners = n; /* entries 1 .. listeners - 1: the rails' listeners, the dial-ins */
  nfds_t done_at = 0; /* the helpers' done fd, 0 when none */
  if (ctx->nworkers > 0) {
    done_at = n;
    who[n] = -1;
    pf[n++] = (struct pollfd){.fd = ctx->done_fd, .events = POLLIN};
  }
  for (int i = 0; i < ctx->args->size * WEFT_TP_CHANNELS; i++) {
    tcp_conn *c = ctx->conns[i];
    if (!c || c->state == TCP_CONN_DEAD) continue;
    bool up = c->state == TCP_CONN_UP;
    bool waited_for = !up; /* not yet dialed: waited for once created */
    for (int j = 0; j < c->nstreams; j++) {
      tcp_stream *s = &c->streams[j];
      if (s->owner >= 0) { /* its helper watches it and writes the done fd */
        waited_for = true;
        continue;
      }
      short ev = (short)((s->want_recv ? POLLIN : 0) | (up && s->sq_count ? POLLOUT : 0));
      s->want_recv = false;
      waited_for |= ev != 0;
      if (up && ev) {
        who[n] = -1;
        pf[n++] = (struct pollfd){.fd = s->fd, .events = ev};
      }
    }
    tcp_peer *p = &ctx->peers[c->peer];
    if (!up && !p->gone_at) { /* waiting for its dial: is it still there? */
      if (!now) now = weft_now();
      if (c->probe_fd < 0 && now - c->probe_at >= TCP_PROBE_INTERVAL_S)
        tcp_conn_probe_start(c, now);
      if (c->probe_fd >= 0) {
        who[n] = -2 - i; /* a probe: the connection's index */
        pf[n++] = (struct pollfd){.fd = c->probe_fd, .events = POLLOUT};
      }
    }
    if (waited_for && p->pid && !p->gone_at && p->polled != gen && tcp_peer_pidfd(p) >= 0) {
      p->polled = gen;
      who[n] = c->peer;
      pf[n++] = (struct pollfd){.fd = p->pidfd, .events = POLLIN};
    }
  }
  int ready = poll(pf, n, timeout_ms);
  if (ready < 0 && errno != EINTR) {
    weft_error_sink_set(ctx->args->errors, "poll: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  if (ready > 0) {
    for (nfds_t i = 1; i < listeners; i++)
      if (pf[i].revents) ctx->accept_pending = true;
    if (done_at && pf[done_at].revents) {
      uint64_t drained;
      if (read(ctx->done_fd, &drained, sizeof drained) < 0) { /* raced with another read: fine */
      }
    }
    for (nfds_t i = listeners; i < n; i++)
      if (who[i] <= -2 && pf[i].revents)
        tcp_conn_probe_done(ctx->conns[-2 - who[i]]);
      else if (who[i] >= 0 && pf[i].revents) {
        ctx->peers[who[i]].gone_at = weft_now();
        ctx->peers[who[i]].gone_why =
            "its process ended, while processes it forked may still hold its sockets";
        WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d sees peer %d (pid %u) ended", ctx->args->rank,
                  who[i], ctx->peers[who[i]].pid);
      }
  }
  return WEFT_OK;
}

/* Connections open lazily and the lower rank dials, so a rank that fails
 * early holds connections to few peers; the others would wait for it (or
 * for a dial it will never make) until their timeout. And an abort frame on
 * an open connection is read only when its peer reads that connection: a
 * peer waiting for a third rank does not. So a rank that fails first, of its
 * own cause, also dials every peer's listener, which every wait watches, and
 * leaves its notice there (tcp_notices_dial/send: all dials at once, 1 s in
 * all). A rank that fails because of a peer's notice (errors->origin is set)
 * only passes it on its open connections, and on the dials waiting in its
 * listener (tcp_answer_waiting_dials): the first rank told everyone, so a
 * failure costs one dial per peer, not one per pair of ranks. */
static void tcp_abort_all(weft_tp_ctx *tctx, const char *reason) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  bool tell_all = !ctx->args->errors->origin[0] && !ctx->notices_sent;
  if (tell_all) {
    ctx->notices_sent = true;
    tcp_notices_dial(ctx); /* first: see tcp.h */
  }
  tcp_pool_stop(ctx); /* then only this thread writes the sockets */
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
    tcp_conn *c = ctx->conns[p];
    if (!c || c->state != TCP_CONN_UP) continue;
    /* On every stream, as the peer may be reading any of them. A frame
     * cannot be cut into the middle of a half-written one; then the peer
     * just sees that stream end. */
    for (int j = 0; j < c->nstreams; j++) {
      tcp_stream *s = &c->streams[j];
      if ((!s->sq_count || s->sq[s->sq_head].sent == 0) &&
          tcp_send_abort(s->fd, NULL, 0, reason) < 0)
        WEFT_INFO(WEFT_SUBSYS_NET, "tcp: abort notice to peer %d not sent: %s", c->peer,
                  strerror(errno));
      shutdown(s->fd, SHUT_WR);
    }
    c->state = TCP_CONN_DEAD;
    c->dead_status = WEFT_ERR_ABORTED;
  }
  /* Only a rank passing a notice on: a rank that tells everyone leaves
   * the notices waiting here for its culprit grace to read (engine.c). */
  if (ctx->args->errors->origin[0]) tcp_answer_waiting_dials(ctx, reason);
  if (tell_all) tcp_notices_send(ctx, reason);
}

static void tcp_fini(weft_tp_ctx *tctx) {
  tcp_ctx *ctx = tcp_ctx_of(tctx);
  if (!ctx) return;
  tcp_fork_untrack(ctx);
  tcp_pool_stop(ctx);
  for (int p = 0; ctx->conns && p < ctx->args->size * WEFT_TP_CHANNELS; p++)
    if (ctx->conns[p]) tcp_conn_destroy(ctx->conns[p]);
  for (int p = 0; ctx->peers && p < ctx->args->size; p++)
    if (ctx->peers[p].pidfd >= 0) close(ctx->peers[p].pidfd);
  for (int i = 0; i < ctx->nanswered; i++) close(ctx->answered_fd[i]);
  free(ctx->answered_fd);
  for (int i = 0; i < ctx->ndialins; i++) close(ctx->dialins[i].fd);
  free(ctx->dialins);
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  for (int r = 1; r < TCP_MAX_RAILS; r++)
    if (ctx->rail_fd[r] >= 0) close(ctx->rail_fd[r]);
  free(ctx->conns);
  free(ctx->pfds);
  free(ctx->pfd_peer);
  free(ctx->peers);
  free(ctx);
}

const weft_transport weft_transport_tcp = {
    .abi_version = WEFT_TRANSPORT_ABI,
    .name = "tcp",
    .caps = {.send_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .recv_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .map_kinds = 0, /* no shared address space with a remote peer */
             .sends_are_stores = false,
             .notices_reach_unconnected = true},
    .probe = tcp_probe,
    .init = tcp_init,
    .send_depth = tcp_send_depth,
    .can_reach = tcp_can_reach,
    .publishes_device_channel = weft_tp_no_device_channel,
    .connect = tcp_connect,
    .send_ready = tcp_send_ready,
    .send = tcp_send,
    .send_idle = tcp_send_idle,
    .recv_peek = tcp_recv_peek,
    .recv_release = tcp_recv_release,
    .recv = tcp_recv,
    .register_mem = weft_tp_no_register,
    .deregister_mem = weft_tp_no_deregister,
    .map_peer_mem = weft_tp_no_map,
    .release_peer_mem = weft_tp_no_release,
    .progress = tcp_progress,
    .wait = tcp_wait,
    .abort_all = tcp_abort_all,
    .fini = tcp_fini,
};
