/* comm.c - creating and ending communicators: the three ways in (environment,
 * explicit config, unique id), the rendezvous that joins them, the set of
 * live handles that makes a double destroy an error instead of a crash, and
 * the sentences every failure leaves in weft_last_error. */
#include "src/comm/comm.h"

#include "src/engine/engine.h"
#include "src/engine/p2p.h"
#include "src/coll/coll_device.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/mem/mem.h"
#include "src/mem/kept.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "src/topo/topo.h"
#include "transports/tcp/tcp_settings.h"
#include "transports/transport_settings.h"

/* ---- live handles --------------------------------------------------------- */

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static weft_comm **live;
static int nlive, live_cap;
/* Every call checks its handle; a global lock per call costs more than a
 * small collective's own work. A thread remembers the last handle it found
 * live and how many handles had been removed then: while no handle has
 * been removed since, that one is still live (only removal ends a handle). */
static atomic_uint_fast64_t live_removals;
static _Thread_local const weft_comm *live_seen;
static _Thread_local uint64_t live_seen_removals;

static bool live_add(weft_comm *comm) {
  pthread_mutex_lock(&live_lock);
  bool ok = true;
  if (nlive == live_cap) {
    int cap = live_cap ? live_cap * 2 : 16;
    weft_comm **grown = realloc(live, sizeof *grown * (size_t)cap);
    if (grown) {
      live = grown;
      live_cap = cap;
    } else {
      ok = false;
    }
  }
  if (ok) live[nlive++] = comm;
  pthread_mutex_unlock(&live_lock);
  return ok;
}

void weft_comm_dump_all(const char *why) {
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < nlive; i++)
    weft_recorder_dump(&live[i]->core.recorder, live[i]->core.rank, live[i]->core.size, why);
  pthread_mutex_unlock(&live_lock);
}

static bool live_remove(weft_comm *comm) {
  pthread_mutex_lock(&live_lock);
  bool found = false;
  for (int i = 0; i < nlive; i++)
    if (live[i] == comm) {
      live[i] = live[--nlive];
      atomic_fetch_add_explicit(&live_removals, 1, memory_order_release);
      found = true;
      break;
    }
  pthread_mutex_unlock(&live_lock);
  return found;
}

bool weft_comm_is_live(const weft_comm *comm) {
  if (!comm) return false;
  if (comm == live_seen &&
      atomic_load_explicit(&live_removals, memory_order_acquire) == live_seen_removals)
    return true;
  pthread_mutex_lock(&live_lock);
  bool found = false;
  for (int i = 0; i < nlive && !found; i++) found = live[i] == comm;
  if (found) {
    live_seen = comm;
    live_seen_removals = atomic_load_explicit(&live_removals, memory_order_relaxed);
  }
  pthread_mutex_unlock(&live_lock);
  return found;
}

/* ---- errors ----------------------------------------------------------------- */

static _Thread_local char thread_error[768];

weft_status weft_init_error(weft_status st, int rank, const char *call, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (rank >= 0)
    snprintf(thread_error, sizeof thread_error, "weft rank %d %s: %s (%s)", rank, call, what,
             weft_status_name(st));
  else
    snprintf(thread_error, sizeof thread_error, "weft %s: %s (%s)", call, what,
             weft_status_name(st));
  WEFT_WARN(WEFT_SUBSYS_INIT, "%s", thread_error);
  return st;
}

WEFT_API const char *weft_last_error(const weft_comm *comm) {
  if (!comm || !weft_comm_is_live(comm)) return thread_error;
  return comm->core.fail.last_error;
}

/* ---- creation ------------------------------------------------------------- */

static double timeout_or_setting(double timeout_s) {
  if (timeout_s > 0) return timeout_s;
  return weft_settings()->timeout_s;
}

/* A refused WEFT_* value fails creation before this rank dials; a rank that
 * hosts the rendezvous passes the sentence on to every rank that arrives, so
 * nobody waits for the timeout to learn of a bad setting on rank 0. */
static weft_status settings_usable(int rank, const char *call) {
  char why[400];
  weft_transport_settings_register(); /* so that their settings are checked too */
  weft_status st = weft_settings_check(why, sizeof why);
  return st ? weft_init_error(st, rank, call, "%s", why) : WEFT_OK;
}

static void comm_free(weft_comm *comm) {
  weft_ctl_close(comm->ctl);
  weft_p2p_lane_free(&comm->core);
  weft_peer_table *l = &comm->core.links;
  for (int t = 0; t < l->ntps; t++) l->tps[t].ops->fini(l->tps[t].ctx);
  if (comm->engine.wake_fd >= 0) close(comm->engine.wake_fd);
  pthread_mutex_destroy(&comm->engine.call_lock);
  pthread_mutex_destroy(&comm->ctl_lock);
  pthread_mutex_destroy(&comm->engine.q_lock);
  pthread_cond_destroy(&comm->engine.q_cond);
  free(comm->peers);
  free(l->peers);
  free(l->active);
  weft_recorder_free(&comm->core.recorder);
  free((void *)comm->core.hosts.host_members);
  free((void *)comm->core.hosts.leaders);
  free((void *)comm->core.hosts.index_peers);
  free((void *)comm->core.hosts.host_of);
  weft_choice_free(&comm->core.choice);
  weft_coll_device_free(&comm->core); /* its stream, events and staging */
  for (size_t i = 0; i < comm->nregistered; i++) weft_mem_unkeep(comm->registered[i]);
  free(comm->registered);
  free(comm->guests);
  comm->magic = 0;
  free(comm);
}

static int spin_default(int local_size) {
  long long spin_us = weft_settings()->spin_us;
  if (spin_us != WEFT_SETTING_AUTO) return (int)spin_us;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  /* spinning steals the core an oversubscribed peer needs to make progress */
  return local_size > cores ? 0 : 50;
}

/* ---- transports ------------------------------------------------------------ */

/* Every transport this build has; the index is what ranks publish. */
static const weft_transport *const builtin_transports[] = {
    &weft_transport_shm, &weft_transport_tcp,
#ifdef WEFT_HAVE_IBV
    &weft_transport_ibv, /* last: the index is what ranks publish, keep the others' */
#endif
};
#define BUILTIN_COUNT ((int)(sizeof builtin_transports / sizeof builtin_transports[0]))

/* hwloc's discovery takes milliseconds: once per process. */
static weft_topo process_topo;
static weft_status process_topo_status;
static void process_topo_load(void) {
  weft_error_sink err;
  process_topo_status = weft_topo_load(NULL, &process_topo, &err);
  if (process_topo_status) {
    WEFT_WARN(WEFT_SUBSYS_INIT, "topology: %s; continuing without it", err.msg);
    memset(&process_topo, 0, sizeof process_topo);
    gethostname(process_topo.hostname, sizeof process_topo.hostname - 1);
    process_topo.source = "none";
  }
}
static const weft_topo *topo_here(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, process_topo_load);
  return &process_topo;
}

void weft_comm_peer_address(const weft_comm *comm, int peer, int builtin, const void **addr,
                            size_t *len) {
  const boot_rank_info *info = &comm->peers[peer].info;
  *addr = NULL;
  *len = 0;
  /* entries: transport index, length, bytes (lengths checked: peers' data) */
  for (size_t off = 0; off + 2 <= info->addr_len;) {
    size_t n = info->addr[off + 1];
    if (off + 2 + n > info->addr_len) return;
    if (info->addr[off] == builtin) {
      *addr = &info->addr[off + 2];
      *len = n;
      return;
    }
    off += 2 + n;
  }
}

void weft_transports_describe(char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int b = 0; b < BUILTIN_COUNT; b++) {
    char why[256] = "";
    weft_status st = builtin_transports[b]->probe(why, sizeof why);
    used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s (built, %s: %s)",
                             b ? ", " : "", builtin_transports[b]->name,
                             st == WEFT_OK ? "usable here" : "not usable here", why);
  }
}

/* Starts the transports in selection order and packs their addresses. */
static weft_status transports_start(weft_comm *comm, boot_rank_info *mine, const char *call) {
  const char *built[BUILTIN_COUNT], *order[BUILTIN_COUNT];
  for (int b = 0; b < BUILTIN_COUNT; b++) built[b] = builtin_transports[b]->name;
  char why[256] = "";
  int n = weft_select_order(topo_here(), built, BUILTIN_COUNT,
                            weft_settings()->transport == WEFT_TRANSPORT_AUTO
                                ? NULL
                                : weft_setting_str(WEFT_SETTING_TRANSPORT),
                            order, why, sizeof why);
  if (n <= 0) return weft_init_error(WEFT_ERR_INVALID, comm->core.rank, call, "%s", why);
  size_t off = mine->addr_len;
  for (int i = 0; i < n; i++) {
    int b = 0;
    while (b < BUILTIN_COUNT && strcmp(builtin_transports[b]->name, order[i])) b++;
    if (b == BUILTIN_COUNT) continue;
    const weft_transport *ops = builtin_transports[b];
    uint8_t blob[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = 0;
    weft_tp_ctx *ctx = NULL;
    weft_status st = ops->init(&comm->tp_args, &ctx, blob, &len);
    if (st == WEFT_ERR_UNSUPPORTED && n > 1) {
      WEFT_INFO(WEFT_SUBSYS_INIT, "transport %s unusable here: %s", ops->name,
                comm->core.links.sink.msg);
      continue;
    }
    if (st)
      return weft_init_error(st, comm->core.rank, call, "transport %s: %s", ops->name,
                             comm->core.links.sink.msg);
    comm->core.links.tps[comm->core.links.ntps++] =
        (weft_transport_in_use){.ops = ops, .ctx = ctx, .builtin = b};
    if (len > 255 || off + 2 + len > sizeof mine->addr)
      return weft_init_error(WEFT_ERR_INTERNAL, comm->core.rank, call,
                             "transport addresses too long");
    mine->addr[off] = (uint8_t)b;
    mine->addr[off + 1] = (uint8_t)len;
    memcpy(&mine->addr[off + 2], blob, len);
    off += 2 + len;
  }
  /* the control plane, for recovery (recover.c) */
  uint8_t ctl_addr[NET_ADDR_PACKED];
  weft_status st = weft_ctl_open(comm->core.rank, comm->core.size, 0, &comm->auth_key,
                                 &comm->tp_args.local_addr, comm->tp_args.local_addr_len,
                                 weft_settings()->suspect_s, &comm->ctl, ctl_addr,
                                 &comm->core.links.sink);
  if (st)
    return weft_init_error(st, comm->core.rank, call, "control plane: %s",
                           comm->core.links.sink.msg);
  if (off + 2 + NET_ADDR_PACKED > sizeof mine->addr)
    return weft_init_error(WEFT_ERR_INTERNAL, comm->core.rank, call,
                           "transport addresses too long");
  mine->addr[off] = WEFT_COMM_CTL_ADDR_ID;
  mine->addr[off + 1] = NET_ADDR_PACKED;
  memcpy(&mine->addr[off + 2], ctl_addr, NET_ADDR_PACKED);
  off += 2 + NET_ADDR_PACKED;
  mine->addr_len = (uint16_t)off;
  return WEFT_OK;
}

/* Whether calls on device buffers take the device channel (core.h): a
 * transport that carries device chunks was started by every rank and each
 * published that its channel is on (ibv: WEFT_IB_GDR is not off). Then,
 * where no two ranks share a host, or that transport is forced
 * (WEFT_TRANSPORT), the selection links every pair through it, on every
 * rank alike: every call on device buffers takes it (device_channel_all).
 * Where several hosts hold several ranks, ranks of one host reach each
 * other over shm (CUDA IPC) and the hosts over it: allreduces and
 * broadcasts take the hierarchical form (device_channel_hier). */
static void device_channel_decide(weft_comm *comm) {
  weft_peer_table *l = &comm->core.links;
  comm->core.device_channel_all = comm->core.device_channel_hier = false;
  int dc = -1;
  for (int t = 0; t < l->ntps; t++)
    if (l->tps[t].ops->caps.device_channel) dc = t;
  if (dc < 0 || comm->core.size < 2) return;
  bool forced = weft_settings()->transport != WEFT_TRANSPORT_AUTO &&
                !strcmp(weft_setting_str(WEFT_SETTING_TRANSPORT), l->tps[dc].ops->name);
  for (int p = 0; p < comm->core.size; p++) {
    const void *addr;
    size_t len;
    weft_comm_peer_address(comm, p, l->tps[dc].builtin, &addr, &len);
    if (!addr || !l->tps[dc].ops->publishes_device_channel(addr, len)) return;
  }
  bool flat = forced || comm->core.hosts.nhosts == comm->core.size;
  if (!flat && comm->core.hosts.nhosts < 2) return; /* one host: CUDA IPC, as before */
  const char *my_host = comm->peers[comm->core.rank].info.host;
  for (int p = 0; p < comm->core.size; p++) {
    if (p == comm->core.rank) continue;
    const weft_transport *ops = l->tps[l->peers[p].tp].ops;
    bool same_host = !strcmp(comm->peers[p].info.host, my_host);
    /* flat: the device channel to every peer; else it between hosts and
     * a transport that maps device memory (shm: CUDA IPC) within one */
    bool fits = flat || !same_host ? l->peers[p].tp == dc
                                   : (ops->caps.map_kinds & WEFT_MEMORY_BIT(WEFT_MEMORY_DEVICE)) != 0;
    if (!fits) {
      /* every rank published it, yet this pair took another (ports of
       * another link layer): the others may decide otherwise, said loudly */
      WEFT_WARN(WEFT_SUBSYS_INIT,
                "rank %d reaches peer %d over %s though every rank started %s with its device "
                "channel: device buffers are staged through host memory on this rank (set "
                "WEFT_IB_GDR=off on every rank if calls on device buffers then disagree)",
                comm->core.rank, p, ops->name, l->tps[dc].ops->name);
      return;
    }
  }
  if (!flat) {
    comm->core.device_channel_hier = true;
    WEFT_INFO(WEFT_SUBSYS_INIT,
              "rank %d: allreduces and broadcasts on device buffers take CUDA IPC within a host "
              "and %s's device channel between hosts",
              comm->core.rank, l->tps[dc].ops->name);
    return;
  }
  comm->core.device_channel_all = true;
  /* no pair's sends are stores: the exchange never asks (its question is a
   * host word, which the device channel does not carry) */
  comm->core.choice.exchange_verdict = -1;
  comm->core.choice.no_shared_maps = true;
  WEFT_INFO(WEFT_SUBSYS_INIT, "rank %d: calls on device buffers take %s's device channel",
            comm->core.rank, l->tps[dc].ops->name);
}

/* First transport, in order, that reaches each peer; its reason is kept. */
/* The peer table (core.links) gets the transport and the address the
 * links connect to; the reason stays here, for weft_comm_peer_transport. */
static weft_status transports_choose(weft_comm *comm, const char *call) {
  weft_peer_table *l = &comm->core.links;
  comm->core.choice.sends_are_stores = true;
  for (int p = 0; p < comm->core.size; p++) {
    weft_peer *peer = &comm->peers[p];
    weft_peer_route *lp = &l->peers[p];
    lp->tp = -1;
    if (p == comm->core.rank) {
      snprintf(peer->why, sizeof peer->why, "this rank");
      continue;
    }
    char refusals[512] = "";
    for (int t = 0; t < l->ntps && lp->tp < 0; t++) {
      const void *addr;
      size_t len;
      weft_comm_peer_address(comm, p, l->tps[t].builtin, &addr, &len);
      char why[192] = "the peer did not start this transport";
      if (addr && l->tps[t].ops->can_reach(l->tps[t].ctx, p, addr, len, why, sizeof why)) {
        lp->tp = t;
        lp->addr = addr;
        lp->addr_len = len;
        snprintf(peer->why, sizeof peer->why, "%s", why);
      } else {
        size_t used = strlen(refusals);
        snprintf(refusals + used, sizeof refusals - used, "%s%s: %s", used ? "; " : "",
                 l->tps[t].ops->name, why);
      }
    }
    if (lp->tp < 0)
      return weft_init_error(WEFT_ERR_UNSUPPORTED, comm->core.rank, call,
                             "no transport reaches peer %d on %s (%s)", p, peer->info.host,
                             refusals);
    WEFT_INFO(WEFT_SUBSYS_INIT, "rank %d -> peer %d: %s (%s)", comm->core.rank, p,
              l->tps[lp->tp].ops->name, peer->why);
    comm->core.choice.sends_are_stores &= l->tps[lp->tp].ops->caps.sends_are_stores;
  }
  device_channel_decide(comm);
  return WEFT_OK;
}

/* A communicator with its settings, before it knows its peers. NULL: no memory. */
static weft_comm *comm_alloc(int rank, int size, int local_rank, double timeout_s) {
  weft_comm *comm = calloc(1, sizeof *comm);
  if (!comm) return NULL;
  comm->magic = WEFT_COMM_MAGIC;
  comm->core.rank = rank;
  comm->core.size = size;
  comm->local_rank = local_rank;
  comm->core.hosts.local_size = 1;
  comm->core.fail.timeout_s = timeout_s;
  comm->engine.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  pthread_mutex_init(&comm->engine.call_lock, NULL);
  pthread_mutex_init(&comm->ctl_lock, NULL);
  pthread_mutex_init(&comm->engine.q_lock, NULL);
  pthread_cond_init(&comm->engine.q_cond, NULL);
  const weft_settings_values *set = weft_settings();
  comm->core.chunk_bytes = set->chunk_bytes;
  comm->core.engine = &comm->engine;
  comm->peers = calloc((size_t)size, sizeof *comm->peers);
  comm->core.links.peers = calloc((size_t)size, sizeof *comm->core.links.peers);
  comm->core.links.active = calloc((size_t)size, sizeof *comm->core.links.active);
  if (!comm->peers || !comm->core.links.peers || !comm->core.links.active ||
      comm->engine.wake_fd < 0) {
    comm_free(comm);
    return NULL;
  }
  comm->engine.spin_us = spin_default(1);
  weft_recorder_init(&comm->core.recorder);
  if (comm->core.recorder.cap) weft_recorder_install_signal(weft_comm_dump_all);
  comm->core.check_calls = set->check;
  comm->core.wire = set->wire_dtype == WEFT_WIRE_BF16  ? WEFT_BF16
                    : set->wire_dtype == WEFT_WIRE_F16 ? WEFT_F16
                                                       : WEFT_F32;
  weft_choice_init(&comm->core.choice, rank, size);
  /* Yielding instead of sleeping keeps a waiting rank runnable: a sleeping one
   * costs a cross-CPU wake-up per chunk, which dominates on oversubscribed or
   * virtualized hosts (docs/tuning.md, "Waiting ranks yield before they sleep");
   * sched_yield still hands the core to any runnable thread, so it does not
   * starve the caller's other work. */
  comm->engine.yield_us = (int)set->yield_us;
  comm->engine.keep_place = weft_spread_keep;
  /* send/recv: their own channel of this communicator's connections */
  if (weft_p2p_lane_create(&comm->core)) {
    comm_free(comm);
    return NULL;
  }
  return comm;
}

/* What the transports of `comm` get; `like` (may be comm itself) supplies
 * the interface the rendezvous was reached from. */
static void comm_tp_args(weft_comm *comm, const weft_comm *like) {
  weft_transport_init_args *a = &comm->tp_args;
  comm->core.tp_args = a;
  a->rank = comm->core.rank;
  a->size = comm->core.size;
  a->chunk_bytes = comm->core.chunk_bytes;
  a->timeout_s = comm->core.fail.timeout_s;
  a->wake_fd = comm->engine.wake_fd;
  a->errors = &comm->core.links.sink;
  a->place = &comm->place;
  a->auth = &comm->auth_key;
  if (like != comm) {
    a->local_addr = like->tp_args.local_addr;
    a->local_addr_len = like->tp_args.local_addr_len;
  }
}

/* When every host holds as many ranks as this one: the rank of this one's
 * index on every host, in the leaders' order (the hierarchical allreduce's
 * network groups, one per index, so every rank of a host crosses the
 * network with its share). Left NULL otherwise. */
static weft_status hosts_index_peers(weft_comm *comm, const boot_rank_info *all, const char *call) {
  weft_hosts *h = &comm->core.hosts;
  if (h->nhosts < 2 || h->local_size < 2 || h->nhosts * h->local_size != comm->core.size)
    return WEFT_OK;
  int *peers = malloc(sizeof(int) * (size_t)h->nhosts);
  if (!peers) return weft_init_error(WEFT_ERR_NOMEM, comm->core.rank, call, "out of memory");
  for (int k = 0; k < h->nhosts; k++) {
    const char *host = all[h->leaders[k]].host;
    int seen = 0;
    peers[k] = -1;
    for (int p = 0; p < comm->core.size; p++) {
      if (strcmp(all[p].host, host)) continue;
      if (seen++ == h->host_index) peers[k] = p;
    }
    if (seen != h->local_size) { /* hosts of unequal sizes: no index groups */
      free(peers);
      return WEFT_OK;
    }
  }
  h->index_peers = peers;
  return WEFT_OK;
}

/* Everybody's infos arrived: who is on this host, which transport reaches
 * each peer. `all` is indexed by rank in `comm`. */
static weft_status comm_learn(weft_comm *comm, const boot_rank_info *all, uint64_t id,
                              const char *call) {
  comm->id = id;
  comm->tp_args.comm_id = id;
  const char *my_host = all[comm->core.rank].host;
  int local_index = 0;
  comm->core.hosts.local_size = 0;
  for (int p = 0; p < comm->core.size; p++) {
    comm->peers[p].info = all[p];
    if (!strcmp(all[p].host, my_host)) {
      if (p < comm->core.rank) local_index++;
      comm->core.hosts.local_size++;
    }
  }
  if (comm->local_rank < 0) comm->local_rank = local_index;
  weft_hosts *h = &comm->core.hosts;
  comm->tp_args.local_size = h->local_size;
  /* hosts: members of mine, and every host's lowest rank, both ascending */
  int *members = malloc(sizeof(int) * (size_t)h->local_size);
  int *leaders = malloc(sizeof(int) * (size_t)comm->core.size);
  h->host_members = members;
  h->leaders = leaders;
  if (!members || !leaders)
    return weft_init_error(WEFT_ERR_NOMEM, comm->core.rank, call, "out of memory");
  h->nhosts = 0;
  int m = 0;
  for (int p = 0; p < comm->core.size; p++) {
    if (!strcmp(all[p].host, my_host)) {
      if (p == comm->core.rank) h->host_index = m;
      members[m++] = p;
    }
    bool first = true;
    for (int q = 0; q < p && first; q++) first = strcmp(all[q].host, all[p].host) != 0;
    if (!first) continue;
    if (!strcmp(all[p].host, my_host)) h->leader_index = h->nhosts;
    leaders[h->nhosts++] = p;
  }
  int *host_of = malloc(sizeof(int) * (size_t)comm->core.size);
  if (!host_of) return weft_init_error(WEFT_ERR_NOMEM, comm->core.rank, call, "out of memory");
  for (int p = 0; p < comm->core.size; p++)
    for (int k = 0; k < h->nhosts; k++)
      if (!strcmp(all[leaders[k]].host, all[p].host)) host_of[p] = k;
  h->host_of = host_of;
  WEFT_CHECK(hosts_index_peers(comm, all, call));
  if (comm->ctl) {
    if (weft_settings()->stall_probe_s > 0) comm->core.stall_probe = weft_comm_stall_probe;
    weft_ctl_set_id(comm->ctl, id);
    for (int p = 0; p < comm->core.size; p++) {
      const void *addr;
      size_t len;
      weft_comm_peer_address(comm, p, WEFT_COMM_CTL_ADDR_ID, &addr, &len);
      if (p != comm->core.rank && addr && len == NET_ADDR_PACKED)
        weft_ctl_set_peer(comm->ctl, p, addr, all[p].pid, !strcmp(all[p].host, my_host));
    }
  }
  weft_choice_learn(&comm->core.choice, comm->core.size, h->nhosts, comm->core.chunk_bytes);
  comm->engine.spin_us = spin_default(h->local_size);
  if (comm->core.size == 1) {
    comm->core.links.peers[0].tp = -1;
    return WEFT_OK;
  }
  return transports_choose(comm, call);
}

/* With more ranks on a host than CPUs they may use, waiting ranks yield
 * rather than sleep, so the kernel places them when they wake and seldom
 * moves them after: always runnable and always cache-hot, they are poor
 * candidates for its balancer: a core may keep more than its share of ranks
 * for whole runs, and every small call waits on it (docs/tuning.md, "More
 * ranks than cores"). So each rank steps onto CPU local_rank mod (its CPUs)
 * and gets its own mask back at once: an even start, not a binding (the
 * kernel may move it; the caller's mask and its other threads are untouched).
 * Only the thread that started the communicator steps, once per process (by
 * pid: a forked child starts afresh), and again, at most every
 * SPREAD_AGAIN_S, when a blocking call of that thread finds itself elsewhere
 * as it starts to wait: a rank that slept after its start (allocating,
 * reading data) was placed anew on waking. */
#define SPREAD_AGAIN_S 0.05
static _Atomic pid_t spread_pid;       /* the process that chose spread_cpu */
static _Atomic int spread_cpu = -1;    /* this process's CPU to step onto */
static _Thread_local bool spread_mine; /* this thread stepped at the start */
static _Thread_local double spread_last;

static bool spread_step(int cpu) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) || !CPU_ISSET(cpu, &allowed)) return false;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one)) return false;
  sched_setaffinity(0, sizeof allowed, &allowed);
  return true;
}

static void spread_once(const weft_comm *comm) {
  int mode = weft_settings()->spread;
  if (mode == WEFT_SPREAD_NEVER || atomic_exchange(&spread_pid, getpid()) == getpid()) return;
  atomic_store(&spread_cpu, -1);
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed)) return;
  int count = CPU_COUNT(&allowed);
  /* one CPU allowed: bound already (weftrun, mpirun), nothing to choose */
  if (count < 2 || (comm->core.hosts.local_size <= count && mode != WEFT_SPREAD_ALWAYS)) return;
  int want = comm->local_rank % count;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != want) continue;
    if (spread_step(cpu)) {
      atomic_store(&spread_cpu, cpu);
      spread_mine = true;
      spread_last = weft_now();
      WEFT_INFO(WEFT_SUBSYS_INIT, "rank %d: %d ranks here on %d CPUs: started on CPU %d",
                comm->core.rank, comm->core.hosts.local_size, count, cpu);
    }
    return;
  }
}

void weft_spread_keep(void) {
  if (!spread_mine) return;
  int cpu = atomic_load_explicit(&spread_cpu, memory_order_relaxed);
  if (cpu < 0 || sched_getcpu() == cpu) return;
  double now = weft_now();
  if (now - spread_last < SPREAD_AGAIN_S) return;
  spread_last = now;
  if (spread_step(cpu)) WEFT_TRACE(WEFT_SUBSYS_INIT, "stepped back onto CPU %d", cpu);
}

static weft_status comm_publish(weft_comm *comm, const char *call) {
  if (!live_add(comm))
    return weft_init_error(WEFT_ERR_NOMEM, comm->core.rank, call, "out of memory");
  WEFT_INFO(WEFT_SUBSYS_INIT, "rank %d/%d ready (local %d/%d, chunk %zu B, spin %d us)",
            comm->core.rank, comm->core.size, comm->local_rank, comm->core.hosts.local_size,
            comm->core.chunk_bytes, comm->engine.spin_us);
  return WEFT_OK;
}

/* Joins the job: dial the rendezvous at `server`, publish the transport
 * addresses, learn every peer's, choose a transport per peer. */
static weft_status comm_create(int rank, int size, int local_rank,
                               const struct sockaddr_storage *server, socklen_t server_len,
                               const uint8_t nonce[BOOT_NONCE_BYTES], boot_server *srv,
                               double timeout_s, const char *call, weft_comm **out) {
  weft_comm *comm = comm_alloc(rank, size, local_rank, timeout_s);
  if (!comm) {
    weft_init_error(WEFT_ERR_NOMEM, rank, call, "out of memory");
    boot_server_finish(srv, rank, weft_last_error(NULL)); /* the server this rank hosts tells the rest */
    return WEFT_ERR_NOMEM;
  }
  weft_status st = settings_usable(rank, call);
  if (st) goto fail;
  char job[BOOT_JOB_BYTES];
  weft_env_job_id(job, sizeof job);
  weft_log_set_rank(rank);
  weft_place_here(topo_here(), &comm->place);
  weft_auth_key_for_job(nonce, BOOT_NONCE_BYTES, &comm->auth_key);
  comm_tp_args(comm, comm);
  boot_rank_info mine = {.rank = (uint32_t)rank, .pid = (uint32_t)getpid()};
  snprintf(mine.host, sizeof mine.host, "%s", comm->place.host_id);
  if (size > 1) {
    double deadline = weft_now() + timeout_s;
    int fd;
    weft_transport_init_args *a = &comm->tp_args;
    st = boot_connect(server, server_len, deadline, &fd, &a->local_addr, &a->local_addr_len,
                      &comm->core.links.sink);
    if (st) {
      weft_init_error(st, rank, call, "%s", comm->core.links.sink.msg);
      goto fail;
    }
    st = transports_start(comm, &mine, call);
    if (st) {
      close(fd);
      goto fail;
    }
    boot_rank_info *all = calloc((size_t)size, sizeof *all);
    if (!all) {
      close(fd);
      st = weft_init_error(WEFT_ERR_NOMEM, rank, call, "out of memory");
      goto fail;
    }
    uint64_t id;
    st = boot_exchange(fd, nonce, job, rank, size, &mine, deadline, &id, all,
                       &comm->core.links.sink);
    /* through the rendezvous, either way: the server this rank hosts ends
     * once every rank has its answer (no thread or fd outlives the init) */
    boot_server_finish(srv, rank, NULL);
    srv = NULL;
    if (st)
      weft_init_error(st, rank, call, "%s", comm->core.links.sink.msg);
    else
      st = comm_learn(comm, all, id, call);
    free(all);
    if (st) goto fail;
  } else {
    comm->local_rank = local_rank < 0 ? 0 : local_rank;
    st = comm_learn(comm, &mine, 1, call);
    if (st) goto fail;
  }
  st = comm_publish(comm, call);
  if (st) goto fail;
  spread_once(comm);
  *out = comm;
  return WEFT_OK;
fail:
  boot_server_finish(srv, rank, weft_last_error(NULL)); /* failed before the rendezvous: tell the rest */
  comm_free(comm);
  return st;
}

/* ---- sub-communicators ---------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t weft_comm_derive_id(const weft_comm *parent, uint64_t salt) {
  return mix64(parent->id ^ mix64(salt));
}

weft_status weft_comm_child_start(weft_comm *parent, int rank, int size, const char *call,
                                  weft_comm **out, boot_rank_info *mine) {
  weft_comm *comm = comm_alloc(rank, size, -1, parent->core.fail.timeout_s);
  *out = comm;
  if (!comm) return weft_core_error(&parent->core, WEFT_ERR_NOMEM, call, "out of memory");
  comm->place = parent->place;
  comm->auth_key = parent->auth_key;
  comm_tp_args(comm, parent);
  memset(mine, 0, sizeof *mine);
  mine->rank = (uint32_t)rank;
  mine->pid = (uint32_t)getpid();
  snprintf(mine->host, sizeof mine->host, "%s", parent->place.host_id);
  weft_status st = size > 1 ? transports_start(comm, mine, call) : WEFT_OK;
  if (st)
    snprintf(parent->core.fail.last_error, sizeof parent->core.fail.last_error, "%s",
             weft_last_error(NULL));
  return st;
}

weft_status weft_comm_child_finish(weft_comm *parent, weft_comm *comm, const boot_rank_info *all,
                                   uint64_t id, const char *call) {
  comm->local_rank = -1;
  weft_status st = comm_learn(comm, all, id, call);
  if (!st) st = comm_publish(comm, call);
  if (st && parent)
    snprintf(parent->core.fail.last_error, sizeof parent->core.fail.last_error, "%s",
             weft_last_error(NULL));
  if (!st && !parent) spread_once(comm);
  return st;
}

void weft_comm_host_here(char *out, size_t len) {
  weft_place place;
  weft_place_here(topo_here(), &place);
  snprintf(out, len, "%s", place.host_id);
}

weft_status weft_comm_guest_start(int rank, int size, double timeout_s,
                                  const struct sockaddr_storage *local, socklen_t local_len,
                                  const weft_auth_key *key, const char *call, weft_comm **out,
                                  boot_rank_info *mine) {
  weft_comm *comm = comm_alloc(rank, size, -1, timeout_s);
  *out = comm;
  if (!comm) return weft_init_error(WEFT_ERR_NOMEM, rank, call, "out of memory");
  WEFT_CHECK(settings_usable(rank, call));
  weft_log_set_rank(rank);
  weft_place_here(topo_here(), &comm->place);
  comm->auth_key = *key;
  comm_tp_args(comm, comm);
  comm->tp_args.local_addr = *local;
  comm->tp_args.local_addr_len = local_len;
  memset(mine, 0, sizeof *mine);
  mine->rank = (uint32_t)rank;
  mine->pid = (uint32_t)getpid();
  snprintf(mine->host, sizeof mine->host, "%s", comm->place.host_id);
  return size > 1 ? transports_start(comm, mine, call) : WEFT_OK;
}

void weft_comm_child_drop(weft_comm *comm) {
  if (comm) comm_free(comm);
}

typedef struct split_entry {
  int32_t color, key;
  boot_rank_info info; /* the new communicator's addresses */
} split_entry;

/* An allgather over `parent` (live), made as weft_allgather makes it: the
 * communicators sit below the public entry points and do not call them. */
static weft_status parent_allgather(weft_comm *parent, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype) {
  weft_request r;
  return weft_engine_blocking(
      &r, weft_coll_allgather_setup(&r.task, "weft_allgather", &parent->core, sendbuf, recvbuf,
                                    count, dtype));
}

/* Two allgathers over the parent: everybody's (color, key), then everybody's
 * new addresses; ranks of one color build their communicator from what the
 * members published. Every rank makes both calls, whatever its color, so the
 * parent's collectives stay matched. */
WEFT_API weft_status weft_comm_split(weft_comm *parent, int color, int key, weft_comm **newcomm) {
  const char *call = "weft_comm_split";
  if (!newcomm) {
    if (weft_comm_is_live(parent))
      return weft_core_error(&parent->core, WEFT_ERR_INVALID, call, "newcomm is NULL");
    return weft_init_error(WEFT_ERR_INVALID, -1, call, "newcomm is NULL");
  }
  *newcomm = NULL;
  if (!weft_comm_is_live(parent))
    return weft_init_error(WEFT_ERR_INVALID, -1, call, "the parent is not a live communicator");
  if (color < 0 && color != WEFT_UNDEFINED)
    return weft_core_error(&parent->core, WEFT_ERR_INVALID, call,
                           "color %d is negative (colors are >= 0, or WEFT_UNDEFINED)", color);
  int n = parent->core.size;
  int32_t mine_ck[2] = {color, key};
  int32_t *ck = malloc(sizeof(int32_t) * 2 * (size_t)n);
  split_entry *all = calloc((size_t)n, sizeof *all);
  weft_comm *comm = NULL;
  weft_status st;
  if (!ck || !all) {
    free(ck);
    free(all);
    return weft_core_error(&parent->core, WEFT_ERR_NOMEM, call, "out of memory");
  }
  st = parent_allgather(parent, mine_ck, ck, 2, WEFT_I32);
  if (st) goto done;
  /* members of my color ordered by (key, parent rank): my new rank and size */
  int size = 0, rank = 0;
  for (int p = 0; p < n && color != WEFT_UNDEFINED; p++) {
    if (ck[2 * p] != color) continue;
    size++;
    if (ck[2 * p + 1] < key || (ck[2 * p + 1] == key && p < parent->core.rank)) rank++;
  }
  split_entry me = {.color = color, .key = key};
  weft_status local = WEFT_OK;
  if (color != WEFT_UNDEFINED) local = weft_comm_child_start(parent, rank, size, call, &comm, &me.info);
  /* a rank that failed locally still takes part (color -2 tells the others) */
  if (local) me.color = -2;
  st = parent_allgather(parent, &me, all, sizeof me, WEFT_U8);
  if (st) goto done;
  for (int p = 0; p < n; p++)
    if (all[p].color == -2) {
      st = local
               ? local
               : weft_core_error(&parent->core, WEFT_ERR_PEER_LOST, call,
                                 "rank %d of the parent could not set up its part of the split", p);
      goto done;
    }
  if (color == WEFT_UNDEFINED) goto done;
  boot_rank_info *infos = calloc((size_t)size, sizeof *infos);
  if (!infos) {
    st = weft_core_error(&parent->core, WEFT_ERR_NOMEM, call, "out of memory");
    goto done;
  }
  for (int p = 0; p < n; p++)
    if (all[p].color == color) infos[all[p].info.rank] = all[p].info;
  /* the same on every member: the parent, how many calls it has seen, the color */
  uint64_t id = weft_comm_derive_id(parent, ((uint64_t)parent->core.seq << 32) | (uint32_t)color);
  st = weft_comm_child_finish(parent, comm, infos, id, call);
  free(infos);
  if (st) goto done;
  WEFT_INFO(WEFT_SUBSYS_INIT, "split: parent rank %d, color %d, key %d -> rank %d of %d",
            parent->core.rank, color, key, rank, size);
  *newcomm = comm;
  comm = NULL;
done:
  weft_comm_child_drop(comm);
  free(ck);
  free(all);
  return st;
}

static weft_status resolve_rendezvous(const char *text, int rank, const char *call,
                                      struct sockaddr_storage *addr, socklen_t *len) {
  char host[256];
  int port;
  weft_error_sink err;
  int family = WEFT_FAMILY_NUMBER(tcp_settings()->socket_family);
  if (net_split_hostport(text, host, sizeof host, &port, &err) ||
      net_resolve(host, port, family, addr, len, &err))
    return weft_init_error(WEFT_ERR_INVALID, rank, call, "rendezvous: %s", err.msg);
  if (port == 0)
    return weft_init_error(WEFT_ERR_INVALID, rank, call, "rendezvous \"%s\" needs a port", text);
  return WEFT_OK;
}

/* Rank 0 of an address-based job hosts the rendezvous server. */
static weft_status host_rendezvous(const struct sockaddr_storage *addr, socklen_t len, int size,
                                   double timeout_s, const char *call, boot_server **srv) {
  static const uint8_t zero_nonce[BOOT_NONCE_BYTES];
  struct sockaddr_storage bound;
  socklen_t bound_len;
  weft_error_sink err;
  char job[BOOT_JOB_BYTES];
  weft_env_job_id(job, sizeof job);
  weft_status st = boot_server_start(addr, len, zero_nonce, size, job, timeout_s, &bound,
                                     &bound_len, srv, &err);
  if (st == WEFT_ERR_SYSTEM && !net_addr_is_loopback((const struct sockaddr *)addr)) {
    /* the name resolved to an address that is not ours (NAT, alias): listen on all */
    struct sockaddr_storage any = {0};
    any.ss_family = addr->ss_family;
    net_addr_set_port(&any, net_addr_port((const struct sockaddr *)addr));
    socklen_t any_len =
        addr->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    st = boot_server_start(&any, any_len, zero_nonce, size, job, timeout_s, &bound, &bound_len,
                           srv, &err);
  }
  if (st)
    return weft_init_error(
        st, 0, call, "cannot host the rendezvous: %s (is another job using this port?)", err.msg);
  return WEFT_OK;
}

static weft_status init_from_address(int rank, int size, int local_rank, const char *rendezvous,
                                     double timeout_s, const char *call, weft_comm **comm) {
  static const uint8_t zero_nonce[BOOT_NONCE_BYTES];
  struct sockaddr_storage addr = {0};
  socklen_t len = 0;
  boot_server *srv = NULL; /* rank 0's, owned by its comm_create (which checks the settings) */
  if (size > 1) {
    if (!rendezvous || !*rendezvous)
      return weft_init_error(WEFT_ERR_INVALID, rank, call,
                             "a job of %d ranks needs a rendezvous address (host:port)", size);
    WEFT_CHECK(resolve_rendezvous(rendezvous, rank, call, &addr, &len));
    if (rank == 0) WEFT_CHECK(host_rendezvous(&addr, len, size, timeout_s, call, &srv));
  }
  return comm_create(rank, size, local_rank, &addr, len, zero_nonce, srv, timeout_s, call, comm);
}

WEFT_API weft_status weft_comm_init_env(weft_comm **comm) {
  const char *call = "weft_comm_init_env";
  if (!comm) return weft_init_error(WEFT_ERR_INVALID, -1, call, "comm is NULL");
  *comm = NULL;
  weft_settings_reload();
  weft_env_job job;
  char why[300];
  if (weft_env_read(&job, why, sizeof why))
    return weft_init_error(WEFT_ERR_INVALID, -1, call, "%s", why);
  WEFT_INFO(WEFT_SUBSYS_INIT, "rank %d of %d from the %s environment, rendezvous %s", job.rank,
            job.size, job.source, job.rendezvous[0] ? job.rendezvous : "(none)");
  return init_from_address(job.rank, job.size, job.local_rank, job.rendezvous,
                           timeout_or_setting(0), call, comm);
}

WEFT_API weft_status weft_comm_init_config(const weft_config *cfg, weft_comm **comm) {
  const char *call = "weft_comm_init_config";
  if (!comm) return weft_init_error(WEFT_ERR_INVALID, -1, call, "comm is NULL");
  *comm = NULL;
  if (!cfg) return weft_init_error(WEFT_ERR_INVALID, -1, call, "cfg is NULL");
  if (cfg->version != WEFT_CONFIG_VERSION)
    return weft_init_error(WEFT_ERR_INVALID, -1, call,
                           "cfg->version is %u, expected %u (call weft_config_init first)",
                           cfg->version, WEFT_CONFIG_VERSION);
  if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
    return weft_init_error(WEFT_ERR_INVALID, cfg->rank, call,
                           "rank %d is not in 0 .. size-1 (size %d)", cfg->rank, cfg->size);
  return init_from_address(cfg->rank, cfg->size, cfg->local_rank, cfg->rendezvous,
                           timeout_or_setting(cfg->timeout_s), call, comm);
}

/* Unique id: "WFID", the rendezvous address packed (net.h), job nonce. */
#define UID_MAGIC 0x57464944u

WEFT_API weft_status weft_get_unique_id(weft_unique_id *id) {
  const char *call = "weft_get_unique_id";
  if (!id) return weft_init_error(WEFT_ERR_INVALID, -1, call, "id is NULL");
  memset(id, 0, sizeof *id);
  WEFT_CHECK(settings_usable(-1, call));
  struct sockaddr_storage local, bound;
  socklen_t local_len, bound_len;
  char ifname[64];
  weft_error_sink err;
  weft_status st = net_pick_local_addr(tcp_settings()->socket_ifname,
                                       WEFT_FAMILY_NUMBER(tcp_settings()->socket_family), NULL,
                                       0, &local, &local_len, ifname, sizeof ifname, &err);
  if (st) return weft_init_error(st, -1, call, "%s", err.msg);
  uint8_t nonce[BOOT_NONCE_BYTES];
  if (getrandom(nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
    return weft_init_error(WEFT_ERR_SYSTEM, -1, call, "getrandom failed");
  boot_server *srv;
  st = boot_server_start(&local, local_len, nonce, 0, NULL, timeout_or_setting(0), &bound,
                         &bound_len, &srv, &err);
  if (st) return weft_init_error(st, -1, call, "%s", err.msg);
  boot_server_register(srv); /* a rank of this process adopts it, else it is joined at exit */
  uint8_t *p = (uint8_t *)id->bytes;
  uint32_t magic = htonl(UID_MAGIC);
  memcpy(p, &magic, 4);
  net_addr_pack(&bound, p + 4);
  memcpy(p + 24, nonce, BOOT_NONCE_BYTES);
  return WEFT_OK;
}

static weft_status init_from_id(weft_comm **comm, const weft_unique_id *id, int rank, int size,
                                int local_rank, double timeout_s, const char *call) {
  if (!comm) return weft_init_error(WEFT_ERR_INVALID, rank, call, "comm is NULL");
  *comm = NULL;
  if (!id) return weft_init_error(WEFT_ERR_INVALID, rank, call, "id is NULL");
  if (size < 1 || rank < 0 || rank >= size)
    return weft_init_error(WEFT_ERR_INVALID, rank, call, "rank %d is not in 0 .. size-1 (size %d)",
                           rank, size);
  const uint8_t *p = (const uint8_t *)id->bytes;
  uint32_t magic;
  memcpy(&magic, p, 4);
  struct sockaddr_storage addr;
  socklen_t len;
  if (ntohl(magic) != UID_MAGIC || !net_addr_unpack(p + 4, &addr, &len))
    return weft_init_error(WEFT_ERR_INVALID, rank, call,
                           "the id was not made by weft_get_unique_id (or was damaged in transit)");
  /* the id's server, when this process made it: this rank owns it (one rank has no rendezvous) */
  boot_server *srv = size > 1 ? boot_server_adopt(p + 24) : NULL;
  return comm_create(rank, size, local_rank, &addr, len, p + 24, srv, timeout_s, call, comm);
}

WEFT_API weft_status weft_comm_init_rank(weft_comm **comm, const weft_unique_id *id, int rank,
                                         int size) {
  return init_from_id(comm, id, rank, size, -1, timeout_or_setting(0), "weft_comm_init_rank");
}

/* torchpg (issue 16): the id path with a configuration's timeout and local rank, for
 * frameworks that pass their own timeout (torch.distributed's process group timeout). */
WEFT_API weft_status weft_comm_init_rank_config(weft_comm **comm, const weft_unique_id *id,
                                                const weft_config *cfg) {
  const char *call = "weft_comm_init_rank_config";
  if (!cfg || cfg->version != WEFT_CONFIG_VERSION) {
    if (comm) *comm = NULL;
    return weft_init_error(WEFT_ERR_INVALID, -1, call,
                           "cfg is NULL or not filled by weft_config_init");
  }
  if (cfg->rendezvous) {
    if (comm) *comm = NULL;
    return weft_init_error(WEFT_ERR_INVALID, cfg->rank, call,
                           "cfg->rendezvous must be NULL: the unique id carries the rendezvous");
  }
  return init_from_id(comm, id, cfg->rank, cfg->size, cfg->local_rank,
                      timeout_or_setting(cfg->timeout_s), call);
}

/* ---- destroy, abort --------------------------------------------------------------- */

/* A rank that only sent in its last call (a broadcast's root) may not know
 * that a peer failed in it (weft.h): a failure notice already here is the
 * destroy's error, so no disagreement goes unreported. It looks once, without
 * waiting: a notice still on its way is not waited for. */
static weft_status destroy_hears_failure(weft_comm *comm) {
  weft_core *core = &comm->core;
  if (core->fail.failed || core->size == 1) return WEFT_OK;
  weft_peer_table *l = &core->links;
  for (int t = 0; t < l->ntps; t++) {
    l->sink.origin[0] = 0;
    bool moved;
    /* wait(0) reads what waits at a listener into the next progress (tcp) */
    weft_status st = l->tps[t].ops->progress(l->tps[t].ctx, &moved);
    if (st >= 0) st = l->tps[t].ops->wait(l->tps[t].ctx, 0);
    if (st >= 0) st = l->tps[t].ops->progress(l->tps[t].ctx, &moved);
    if (st >= 0) continue;
    return weft_init_error(st, core->rank, "weft_comm_destroy", "%s",
                           l->sink.origin[0] ? l->sink.origin : l->sink.msg);
  }
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_destroy(weft_comm *comm) {
  if (!live_remove(comm))
    return weft_init_error(WEFT_ERR_INVALID, -1, "weft_comm_destroy",
                           "not a live communicator (destroyed twice, or never created)");
  weft_mem_thread_enter();
  weft_engine_stop(&comm->core);
  weft_status st = destroy_hears_failure(comm);
  comm_free(comm);
  weft_mem_thread_restore(); /* its device streams' context made current: the caller's back */
  return st;
}

static void comm_stop(weft_comm *comm, int how) {
  int none = 0;
  atomic_compare_exchange_strong(&comm->core.fail.aborted, &none, how); /* the first one holds */
  uint64_t one = 1;
  if (write(comm->engine.wake_fd, &one, sizeof one) < 0) { /* already signalled: fine */
  }
  /* No call running: tell the peers from here. A running call does it
   * itself when it sees the flag (one thread drives the transport). */
  if (pthread_mutex_trylock(&comm->engine.call_lock) == 0) {
    if (!comm->core.fail.failed) {
      how = atomic_load(&comm->core.fail.aborted);
      comm->core.fail.failed = weft_fail_stopped(how);
      const char *call = how == WEFT_STOP_REVOKE ? "weft_comm_revoke" : "weft_comm_abort";
      weft_core_error(&comm->core, comm->core.fail.failed, call, "%s",
                      weft_fail_stopped_words(how));
      /* A peer of this host waiting for a pair this rank never opened
       * would hear nothing until its timeout (a revoke before any call) */
      weft_peer_table_open_for_notices(&comm->core.links, comm->core.hosts.host_members,
                                       comm->core.hosts.local_size, comm->core.size,
                                       comm->core.rank);
      char reason[128];
      if (how == WEFT_STOP_REVOKE)
        snprintf(reason, sizeof reason, "rank %d %s", comm->core.rank, WEFT_REVOKED_WORDS);
      else
        snprintf(reason, sizeof reason, "rank %d called weft_comm_abort", comm->core.rank);
      weft_peer_table_abort_all(&comm->core.links, reason);
    }
    pthread_mutex_unlock(&comm->engine.call_lock);
  }
}

WEFT_API weft_status weft_comm_abort(weft_comm *comm) {
  if (!weft_comm_is_live(comm))
    return weft_init_error(WEFT_ERR_INVALID, -1, "weft_comm_abort", "not a live communicator");
  comm_stop(comm, WEFT_STOP_ABORT);
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_revoke(weft_comm *comm) {
  if (!weft_comm_is_live(comm))
    return weft_init_error(WEFT_ERR_INVALID, -1, "weft_comm_revoke", "not a live communicator");
  comm_stop(comm, WEFT_STOP_REVOKE);
  return WEFT_OK;
}
