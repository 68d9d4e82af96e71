/* ibv_transport.c - the verbs transport's table and per-communicator state:
 * device and port discovery through the verbs table (WEFT_IB_HCA rules, the
 * NIC hwloc places nearest this rank first), GID choice for RoCE, the side
 * socket listener, progress, wait, async events and aborting. The queue pairs
 * and the data path are in ibv_conn.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ibv.h"
#include "src/base/log.h"
#include "src/base/settings.h"
#include "transports/ibv/ibv_settings.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "src/topo/topo.h"

#define IBV_ADDR_MAGIC 0x57454942u /* "WEIB" */
#define IBV_WAIT_SLICE_MS 1        /* completions have no fd here: bounded naps between polls */

/* ---- device and port choice -------------------------------------------------- */

/* WEFT_IB_HCA: the WEFT_SOCKET_IFNAME syntax (prefixes, "=" exact, leading
 * "^" excludes), each entry optionally ":port" ("mlx5_0:1"). */
bool ibv_hca_match(const char *rules, const char *dev, int port) {
  if (!rules || !*rules) return true;
  bool exclude = rules[0] == '^';
  const char *p = rules + (exclude ? 1 : 0);
  bool hit = false;
  while (*p && !hit) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char entry[96];
    snprintf(entry, sizeof entry, "%.*s", (int)(n < sizeof entry ? n : sizeof entry - 1), p);
    bool exact = entry[0] == '=';
    char *name = entry + (exact ? 1 : 0);
    int want_port = 0;
    char *colon = strchr(name, ':');
    if (colon) {
      *colon = 0;
      want_port = atoi(colon + 1);
    }
    bool name_ok = exact ? !strcmp(name, dev) : !strncmp(name, dev, strlen(name));
    hit = *name && name_ok && (want_port == 0 || want_port == port);
    p += n + (end ? 1 : 0);
  }
  return exclude ? !hit : hit;
}

/* How NCCL and perftest pick a RoCE GID: version 2 over version 1, an
 * IPv4-mapped address over a global IPv6 one over a link-local one; unset
 * entries never. Higher is better; 0 unusable. */
int ibv_gid_score(const union ibv_gid *gid, int roce_version) {
  static const uint8_t zero[16];
  if (!memcmp(gid->raw, zero, 16)) return 0;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  int family = !memcmp(gid->raw, v4mapped, 12)                         ? 3
               : (gid->raw[0] == 0xfe && (gid->raw[1] & 0xc0) == 0x80) ? 1
                                                                       : 2;
  return (roce_version == 2 ? 10 : 0) + family;
}

/* RoCE version of a GID entry: the verbs call when the library has it, else sysfs. */
static int ibv_gid_roce_version(ibv_ctx *ctx, int index) {
  if (ctx->api->query_gid_ex) {
    struct ibv_gid_entry e;
    if (ctx->api->query_gid_ex(ctx->dev, ctx->port, (uint32_t)index, &e, 0, sizeof e) == 0)
      return e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
  }
  char path[192], text[32] = "";
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%u/gid_attrs/types/%d", ctx->dev_name,
           ctx->port, index);
  FILE *f = fopen(path, "r");
  if (f) {
    if (!fgets(text, sizeof text, f)) text[0] = 0;
    fclose(f);
  }
  return strstr(text, "v2") ? 2 : 1;
}

static weft_status ibv_pick_gid(ibv_ctx *ctx, int table_len) {
  long long forced = ibv_settings()->gid_index; /* auto: -1 */
  if (forced >= 0) {
    if (forced >= table_len || ctx->api->query_gid(ctx->dev, ctx->port, (int)forced, &ctx->gid)) {
      weft_error_sink_set(ctx->args->errors,
                          "ibv: WEFT_IB_GID_INDEX=%lld does not exist on %s "
                          "port %u (%d entries)",
                          forced, ctx->dev_name, ctx->port, table_len);
      return WEFT_ERR_INVALID;
    }
    ctx->gid_index = (int)forced;
    return WEFT_OK;
  }
  int best = -1, best_score = 0;
  for (int i = 0; i < table_len; i++) {
    union ibv_gid g;
    if (ctx->api->query_gid(ctx->dev, ctx->port, i, &g)) continue;
    int score = ctx->link_layer == IBV_LINK_LAYER_ETHERNET
                    ? ibv_gid_score(&g, ibv_gid_roce_version(ctx, i))
                    : ibv_gid_score(&g, 0);
    if (score > best_score) {
      best = i;
      best_score = score;
      ctx->gid = g;
    }
    if (ctx->link_layer != IBV_LINK_LAYER_ETHERNET && best >= 0) break; /* IB: GID 0 */
  }
  if (best < 0) {
    weft_error_sink_set(ctx->args->errors,
                        "ibv: %s port %u has no usable GID (is an IP address "
                        "configured on its netdev?)",
                        ctx->dev_name, ctx->port);
    return WEFT_ERR_UNSUPPORTED;
  }
  ctx->gid_index = best;
  return WEFT_OK;
}

/* The NUMA node this rank runs on, from the CPU it is on now (-1 unknown). */
static int ibv_my_numa_node(void) {
  int cpu = sched_getcpu();
  if (cpu < 0) return -1;
  for (int node = 0; node < 64; node++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/node%d", cpu, node);
    if (access(path, F_OK) == 0) return node;
  }
  return -1;
}

typedef struct ibv_candidate {
  struct ibv_device *dev;
  char name[64];
  int port;
  int numa;
} ibv_candidate;

/* Lists active ports that pass WEFT_IB_HCA; writes why none did. */
static int ibv_list_ports(ibv_ctx *ctx, struct ibv_device **list, int ndev,
                          ibv_candidate *out, int max, char *why, size_t why_len) {
  const char *rules = ibv_settings()->hca;
  int n = 0;
  snprintf(why, why_len, "%d device(s), none with an active port", ndev);
  for (int d = 0; d < ndev && n < max; d++) {
    const char *name = ctx->api->get_device_name(list[d]);
    struct ibv_context *dc = ctx->api->open_device(list[d]);
    if (!dc) continue;
    struct ibv_device_attr da;
    if (ctx->api->query_device(dc, &da) == 0)
      for (int p = 1; p <= da.phys_port_cnt && n < max; p++) {
        struct ibv_port_attr pa;
        if (ctx->api->query_port(dc, (uint8_t)p, &pa) || pa.state != IBV_PORT_ACTIVE) continue;
        if (pa.link_layer != IBV_LINK_LAYER_INFINIBAND && pa.link_layer != IBV_LINK_LAYER_ETHERNET)
          continue;
        if (!ibv_hca_match(rules, name, p)) {
          snprintf(why, why_len, "no active port passes WEFT_IB_HCA=%s", rules);
          continue;
        }
        out[n] = (ibv_candidate){.dev = list[d], .port = p, .numa = -1};
        snprintf(out[n].name, sizeof out[n].name, "%s", name);
        n++;
      }
    ctx->api->close_device(dc);
  }
  return n;
}

/* hwloc's view of where each NIC hangs: prefer one on this rank's NUMA node. */
static int ibv_choose_nearest(ibv_candidate *cand, int n) {
  if (n <= 1) return 0;
  weft_topo *topo = calloc(1, sizeof *topo);
  weft_error_sink err;
  int mine = ibv_my_numa_node(), pick = 0;
  if (topo && weft_topo_load(NULL, topo, &err) == WEFT_OK)
    for (int i = 0; i < n; i++)
      for (int t = 0; t < topo->n_rdma; t++)
        if (!strcmp(topo->rdma[t].name, cand[i].name)) cand[i].numa = topo->rdma[t].numa_node;
  free(topo);
  for (int i = 0; i < n; i++)
    if (mine >= 0 && cand[i].numa == mine) {
      pick = i;
      break;
    }
  return pick;
}

static weft_status ibv_open(ibv_ctx *ctx) {
  weft_error_sink *err = ctx->args->errors;
  int ndev = 0;
  errno = 0;
  struct ibv_device **list = ctx->api->get_device_list(&ndev);
  if (!list) {
    int e = errno;
    weft_error_sink_set(err, "ibv: no RDMA devices: ibv_get_device_list failed: %s%s", strerror(e),
                        e == ENOSYS ? " (no RDMA support in this kernel)" : "");
    return WEFT_ERR_UNSUPPORTED;
  }
  ibv_candidate cand[16];
  char why[160];
  int n = ndev > 0 ? ibv_list_ports(ctx, list, ndev, cand, 16, why, sizeof why) : 0;
  if (n == 0) {
    ctx->api->free_device_list(list);
    if (ndev == 0)
      weft_error_sink_set(err, "ibv: no RDMA device found");
    else
      weft_error_sink_set(err, "ibv: %s", why);
    return WEFT_ERR_UNSUPPORTED;
  }
  ibv_candidate *c = &cand[ibv_choose_nearest(cand, n)];
  ctx->dev = ctx->api->open_device(c->dev);
  ctx->api->free_device_list(list);
  snprintf(ctx->dev_name, sizeof ctx->dev_name, "%s", c->name);
  ctx->port = (uint8_t)c->port;
  struct ibv_port_attr pa;
  if (!ctx->dev || ctx->api->query_port(ctx->dev, ctx->port, &pa)) {
    weft_error_sink_set(err, "ibv: cannot open %s port %d: %s", c->name, c->port, strerror(errno));
    return WEFT_ERR_UNSUPPORTED;
  }
  ctx->link_layer = pa.link_layer;
  ctx->mtu = pa.active_mtu;
  ctx->lid = pa.lid;
  if (ctx->link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid == 0) {
    weft_error_sink_set(err, "ibv: %s port %d has no LID (is a subnet manager running?)", c->name,
                        c->port);
    return WEFT_ERR_UNSUPPORTED;
  }
  WEFT_CHECK(ibv_pick_gid(ctx, pa.gid_tbl_len));
  ctx->pd = ctx->api->alloc_pd(ctx->dev);
  if (!ctx->pd) {
    weft_error_sink_set(err, "ibv: ibv_alloc_pd on %s: %s", c->name, strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  /* async events are read in progress, never waited for */
  int fl = fcntl(ctx->dev->async_fd, F_GETFL);
  if (fl >= 0) fcntl(ctx->dev->async_fd, F_SETFL, fl | O_NONBLOCK);
  WEFT_INFO(WEFT_SUBSYS_NET, "ibv: rank %d uses %s port %u (%s, MTU %d, GID index %d)",
            ctx->args->rank, ctx->dev_name, ctx->port,
            ctx->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", 128 << ctx->mtu,
            ctx->gid_index);
  return WEFT_OK;
}

/* Registered memory is pinned: too low a memlock limit fails later in
 * ibv_reg_mr with a bare ENOMEM, so say now what to change. */
static weft_status ibv_check_memlock(ibv_ctx *ctx) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) || rl.rlim_cur == RLIM_INFINITY) return WEFT_OK;
  /* a connection registers its receive and send rings and a control page;
   * a peer may get one per host channel (collectives, and p2p once a
   * message goes to it); the device channel's, in a job on device buffers,
   * are checked by their registration (ENOMEM names ulimit -l there) */
  uint64_t per_peer = WEFT_TP_HOST_CHANNELS * (2 * (uint64_t)ctx->nslots * ctx->stride + 4096);
  uint64_t need = per_peer * (uint64_t)(ctx->args->size > 1 ? ctx->args->size - 1 : 1);
  if (rl.rlim_cur >= need) return WEFT_OK;
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long caps = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "CapEff: %llx", &caps) == 1) break;
  if (f) fclose(f);
  if (caps & (1ull << 14)) return WEFT_OK; /* CAP_IPC_LOCK: no limit applies */
  weft_error_sink_set(ctx->args->errors,
                      "ibv: the locked-memory limit (ulimit -l) is %llu KiB but %d ranks need "
                      "about %llu KiB of registered memory: raise it with `ulimit -l unlimited`, "
                      "'* - memlock unlimited' in /etc/security/limits.conf, LimitMEMLOCK=infinity "
                      "for systemd services, or `--ulimit memlock=-1` for containers",
                      (unsigned long long)(rl.rlim_cur >> 10), ctx->args->size,
                      (unsigned long long)(need >> 10));
  return WEFT_ERR_UNSUPPORTED;
}

/* ---- the table's members ------------------------------------------------------ */

static void ibv_close(ibv_ctx *ctx) {
  ibv_mr_cache_fini(&ctx->mr);
  ibv_gdr_fini(&ctx->gdr);
  if (ctx->pd) ctx->api->dealloc_pd(ctx->pd);
  if (ctx->dev) ctx->api->close_device(ctx->dev);
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  for (int e = 0; ctx->incoming && e < ctx->args->size * WEFT_TP_CHANNELS; e++)
    if (ctx->incoming[e].fd >= 0) close(ctx->incoming[e].fd);
  free(ctx->incoming);
  free(ctx->conns);
  free(ctx->pfds);
  free(ctx);
}

/* The library, then the devices and their ports, as init would find them. */
static weft_status ibv_probe(char *why, size_t why_len) {
  weft_error_sink err = {{0}, {0}};
  const ibv_api *api = ibv_api_load(&err);
  if (!api) {
    snprintf(why, why_len, "%s", err.msg);
    return WEFT_ERR_UNSUPPORTED;
  }
  int ndev = 0;
  errno = 0;
  struct ibv_device **list = api->get_device_list(&ndev);
  if (!list || ndev <= 0) {
    snprintf(why, why_len, "%s: no RDMA device%s%s", api->library, errno ? ": " : "",
             errno ? strerror(errno) : "");
    if (list) api->free_device_list(list);
    return WEFT_ERR_UNSUPPORTED;
  }
  size_t used = (size_t)snprintf(why, why_len, "%s:", api->library);
  int active = 0;
  for (int d = 0; d < ndev; d++) {
    const char *name = api->get_device_name(list[d]);
    struct ibv_context *dc = api->open_device(list[d]);
    struct ibv_device_attr da;
    int ports = 0;
    if (dc && api->query_device(dc, &da) == 0)
      for (int p = 1; p <= da.phys_port_cnt; p++) {
        struct ibv_port_attr pa;
        if (api->query_port(dc, (uint8_t)p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) ports++;
      }
    if (dc) api->close_device(dc);
    active += ports;
    if (used < why_len)
      used += (size_t)snprintf(why + used, why_len - used, " %s (%d active port%s)", name, ports,
                               ports == 1 ? "" : "s");
  }
  api->free_device_list(list);
  return active > 0 ? WEFT_OK : WEFT_ERR_UNSUPPORTED;
}

static weft_status ibv_init(const weft_transport_init_args *args, weft_tp_ctx **out,
                            void *addr, size_t *addr_len) {
  if (!args->place) {
    weft_error_sink_set(args->errors, "ibv: no place information");
    return WEFT_ERR_UNSUPPORTED;
  }
  const ibv_api *api = ibv_api_load(args->errors);
  if (!api) return WEFT_ERR_UNSUPPORTED;
  ibv_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return WEFT_ERR_NOMEM;
  ctx->args = args;
  ctx->slot_mem = args->slot_mem ? args->slot_mem : &weft_mem_host;
  ctx->api = api;
  ctx->listen_fd = -1;
  long long qps = ibv_settings()->qps_per_peer;
  ctx->nqp = qps < 1 ? 1 : qps > IBV_MAX_QPS ? IBV_MAX_QPS : (int)qps;
  ctx->nslots = IBV_SLOTS;
  ctx->stride = (IBV_TAG_BYTES + args->chunk_bytes + 63) & ~(size_t)63;
  ctx->max_inline = sizeof(uint64_t);
  ctx->conns = calloc((size_t)args->size * WEFT_TP_CHANNELS, sizeof *ctx->conns);
  ctx->incoming = calloc((size_t)args->size * WEFT_TP_CHANNELS, sizeof *ctx->incoming);
  for (int e = 0; ctx->incoming && e < args->size * WEFT_TP_CHANNELS; e++) ctx->incoming[e].fd = -1;
  ctx->pfds = calloc(2 * (size_t)args->size * WEFT_TP_CHANNELS + 3, sizeof *ctx->pfds);
  weft_status st = WEFT_ERR_NOMEM;
  if (!ctx->conns || !ctx->incoming || !ctx->pfds) goto fail;
  if ((st = ibv_check_memlock(ctx)) || (st = ibv_open(ctx))) goto fail;
  long long zc = (long long)ibv_settings()->zcopy_bytes;
  ctx->zcopy_bytes = zc > 0 ? (size_t)zc : 0;
  ctx->mr = (ibv_mr_cache){.api = api, .pd = ctx->pd, .max_bytes = (size_t)1 << 30};
  ibv_gdr_init(&ctx->gdr, api, ctx->pd);
  /* The side socket listens where the rendezvous was reached from: that
   * interface reaches the peers. */
  struct sockaddr_storage local = args->local_addr;
  socklen_t local_len = args->local_addr_len;
  if (local_len == 0) {
    struct sockaddr_in *lo = (struct sockaddr_in *)&local;
    lo->sin_family = AF_INET;
    lo->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    local_len = sizeof *lo;
  }
  net_addr_set_port(&local, 0);
  st = net_listen(&local, local_len, 1024, &ctx->listen_fd, &ctx->addr, &ctx->addr_len,
                  args->errors);
  if (st) goto fail;
  ctx->self.magic = IBV_ADDR_MAGIC;
  ctx->self.link_layer = ctx->link_layer;
  ctx->self.loopback_ok = weft_settings()->transport == WEFT_TRANSPORT_IBV;
  ctx->self.device_channel = ibv_settings()->gdr != IBV_GDR_OFF;
  ctx->self.place = *args->place;
  ctx->self.place.rdma_devices = 1; /* what the verbs table found, not hwloc's count */
  net_addr_pack(&ctx->addr, ctx->self.sock);
  memcpy(addr, &ctx->self, sizeof ctx->self);
  *addr_len = sizeof ctx->self;
  *out = (weft_tp_ctx *)ctx;
  return WEFT_OK;
fail:
  ibv_close(ctx);
  return st;
}

static bool ibv_addr_read(const void *blob, size_t len, ibv_addr *out) {
  if (len != sizeof *out) return false;
  memcpy(out, blob, sizeof *out);
  return out->magic == IBV_ADDR_MAGIC;
}

static bool ibv_publishes_device_channel(const void *peer_addr, size_t addr_len) {
  ibv_addr pa;
  return ibv_addr_read(peer_addr, addr_len, &pa) && pa.device_channel;
}

static int ibv_send_depth(const weft_tp_ctx *ctx) {
  return ((const ibv_ctx *)ctx)->nslots;
}

static bool ibv_can_reach(weft_tp_ctx *tctx, int peer, const void *peer_addr, size_t addr_len,
                          char *why, size_t why_len) {
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  ibv_addr pa;
  (void)peer;
  if (!ibv_addr_read(peer_addr, addr_len, &pa)) {
    snprintf(why, why_len, "ibv: the peer published no verbs address");
    return false;
  }
  if (pa.link_layer != ctx->link_layer) {
    snprintf(why, why_len, "ibv: the peer's port is %s, ours %s",
             pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
             ctx->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
    return false;
  }
  bool same_host = !strncmp(pa.place.host_id, ctx->self.place.host_id, sizeof pa.place.host_id);
  if (same_host && pa.loopback_ok && ctx->self.loopback_ok) {
    snprintf(why, why_len, "same host, through %s port %u (loopback: WEFT_TRANSPORT=ibv)",
             ctx->dev_name, ctx->port);
    return true;
  }
  if (!weft_select_ibv_reaches(&ctx->self.place, &pa.place, why, why_len)) return false;
  size_t used = strlen(why);
  snprintf(why + used, why_len - used, "; %s port %u, %d QP(s)", ctx->dev_name, ctx->port,
           ctx->nqp);
  return true;
}

static weft_status ibv_connect(weft_tp_ctx *tctx, int peer, int channel, const void *peer_addr,
                               size_t addr_len, weft_tp_conn **out) {
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  ibv_addr pa;
  if (peer < 0 || peer >= ctx->args->size || peer == ctx->args->rank || channel < 0 ||
      channel >= WEFT_TP_CHANNELS)
    return WEFT_ERR_INVALID;
  ibv_conn **slot = &ctx->conns[ibv_conn_index(peer, channel)];
  if (!*slot) WEFT_CHECK(ibv_conn_create(ctx, peer, channel, slot));
  ibv_conn *c = *slot;
  *out = (weft_tp_conn *)c;
  if (c->fd >= 0 || c->state == IBV_CONN_DEAD || ctx->args->rank > peer) return WEFT_OK;
  struct sockaddr_storage a;
  socklen_t alen;
  if (!ibv_addr_read(peer_addr, addr_len, &pa) || !net_addr_unpack(pa.sock, &a, &alen))
    return ibv_conn_fail(c, WEFT_ERR_PROTOCOL, "peer %d published a malformed verbs address", peer);
  if (c->device && !c->set_up) {
    /* our hello carries the GPU ring's address: dialed once it is made
     * (ibv_conn_poll), when the core has named the GPU */
    if (!c->dial_held) {
      c->dial_held = true;
      c->dial_addr = a;
      c->dial_len = alen;
    }
    return WEFT_OK;
  }
  return ibv_conn_dial(c, &a, alen);
}

/* Fatal async events fail the connection they name (or all of them). */
static void ibv_async_events(ibv_ctx *ctx, bool *progressed) {
  struct ibv_async_event ev;
  while (ctx->api->get_async_event(ctx->dev, &ev) == 0) {
    enum ibv_event_type t = ev.event_type;
    bool fatal = t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR ||
                 t == IBV_EVENT_QP_ACCESS_ERR || t == IBV_EVENT_CQ_ERR ||
                 t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_PORT_ERR;
    for (int p = 0; fatal && p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
      ibv_conn *c = ctx->conns[p];
      if (!c || c->state == IBV_CONN_DEAD) continue;
      bool mine = t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_PORT_ERR ||
                  (t == IBV_EVENT_CQ_ERR && ev.element.cq == c->cq);
      for (int q = 0; q < ctx->nqp && !mine; q++)
        mine = t != IBV_EVENT_CQ_ERR && ev.element.qp == c->qps[q].qp;
      if (mine)
        ibv_conn_fail(c, WEFT_ERR_PEER_LOST,
                      "ibv: async event %s on the connection to peer %d "
                      "(%s port %u)",
                      ctx->api->event_type_str(t), c->peer, ctx->dev_name, ctx->port);
    }
    WEFT_INFO(WEFT_SUBSYS_NET, "ibv: async event %s", ctx->api->event_type_str(t));
    ctx->api->ack_async_event(&ev);
    *progressed = true;
  }
}

/* A connection that fails here (an error completion, an async event, a
 * peer's failure notice) fails the call now: the algorithm may be waiting on
 * another peer and never touch this one again. */
static weft_status ibv_progress(weft_tp_ctx *tctx, bool *progressed) {
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  *progressed = ctx->moved;
  ctx->moved = false;
  weft_status st = WEFT_OK;
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++)
    if (ctx->conns[p]) ctx->conns[p]->alive_before = ctx->conns[p]->state != IBV_CONN_DEAD;
  ibv_async_events(ctx, progressed);
  if (ctx->not_up > 0 || ctx->nincoming > 0) WEFT_CHECK(ibv_conn_accept(ctx, progressed));
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
    ibv_conn *c = ctx->conns[p];
    if (!c) continue;
    if (c->state != IBV_CONN_DEAD)
      ibv_conn_poll(c, progressed);
    else if (ibv_side_owes(c))
      ibv_conn_send_owed(c); /* its failure notice */
    if (c->alive_before && c->state == IBV_CONN_DEAD && st == WEFT_OK) st = c->dead_status;
    else if (!c->alive_before && st == WEFT_OK)
      st = ibv_conn_take_late_notice(c);
  }
  return st;
}

static weft_status ibv_wait(weft_tp_ctx *tctx, int timeout_ms) {
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  struct pollfd *pf = ctx->pfds;
  nfds_t n = 0;
  if (ctx->args->wake_fd >= 0)
    pf[n++] = (struct pollfd){.fd = ctx->args->wake_fd, .events = POLLIN};
  pf[n++] = (struct pollfd){.fd = ctx->dev->async_fd, .events = POLLIN};
  if (ctx->not_up > 0) pf[n++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
  for (int e = 0; ctx->nincoming > 0 && e < ctx->args->size * WEFT_TP_CHANNELS; e++)
    if (ctx->incoming[e].fd >= 0)
      pf[n++] = (struct pollfd){.fd = ctx->incoming[e].fd, .events = POLLIN};
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
    ibv_conn *c = ctx->conns[p];
    if (!c || c->fd < 0) continue;
    short ev = c->state != IBV_CONN_DEAD && !c->peer_ended && !c->dialing ? POLLIN : 0;
    if (ibv_side_owes(c)) ev |= POLLOUT; /* room for what it owes, or the connect done */
    if (ev) pf[n++] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  int ms = timeout_ms < IBV_WAIT_SLICE_MS ? timeout_ms : IBV_WAIT_SLICE_MS;
  if (poll(pf, n, ms) < 0 && errno != EINTR) {
    weft_error_sink_set(ctx->args->errors, "poll: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  return WEFT_OK;
}

static void ibv_abort_all(weft_tp_ctx *tctx, const char *reason) {
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++)
    if (ctx->conns[p]) ibv_conn_notify_abort(ctx->conns[p], reason);
}

static void ibv_fini(weft_tp_ctx *tctx) {
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  if (!ctx) return;
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++)
    if (ctx->conns[p]) ibv_conn_destroy(ctx->conns[p]);
  ibv_close(ctx);
}

/* Device memory for RDMA to and from it (GPUDirect, ibv_gdr.c): DEVICE
 * through the context's registration cache, DMABUF from the caller's fd.
 * The descriptor carries what a peer's RDMA needs: address, length, rkey. */
typedef struct ibv_mem_body {
  uint64_t addr, len;
  uint32_t rkey, reserved;
} ibv_mem_body;

static weft_status ibv_register_mem(weft_tp_ctx *tctx, const weft_mem_region *region,
                                    weft_tp_mem *handle, weft_mem_desc *desc) {
  handle->region = *region;
  handle->region.kind = WEFT_MEMORY_COUNT; /* refused until registered */
  handle->priv[0] = handle->priv[1] = 0;
  const weft_mem_ops *dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
  weft_mem_range range;
  if (region->kind == WEFT_MEMORY_DEVICE) {
    if (!dev || !dev->range_of(region->ptr, region->bytes, &range)) return WEFT_ERR_UNSUPPORTED;
  } else if (region->kind != WEFT_MEMORY_DMABUF || region->dmabuf_fd < 0) {
    return WEFT_ERR_UNSUPPORTED;
  }
  ibv_ctx *ctx = ibv_ctx_of(tctx);
  struct ibv_mr *mr;
  if (region->kind == WEFT_MEMORY_DEVICE) {
    ibv_gdr_entry *e;
    WEFT_CHECK(ibv_gdr_get(&ctx->gdr, region->ptr, region->bytes, &e));
    handle->priv[0] = (uintptr_t)e;
    mr = e->mr;
  } else {
    if (!ctx->api->reg_dmabuf_mr) return WEFT_ERR_UNSUPPORTED;
    mr = ctx->api->reg_dmabuf_mr(ctx->pd, region->dmabuf_offset, region->bytes,
                                 (uint64_t)(uintptr_t)region->ptr, region->dmabuf_fd,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ);
    if (!mr) {
      weft_error_sink_set(ctx->args->errors, "ibv: ibv_reg_dmabuf_mr of %zu bytes (fd %d): %s",
                          region->bytes, region->dmabuf_fd, strerror(errno));
      return errno == EOPNOTSUPP || errno == ENOSYS ? WEFT_ERR_UNSUPPORTED : WEFT_ERR_SYSTEM;
    }
    handle->priv[1] = (uintptr_t)mr;
  }
  handle->region.kind = region->kind;
  if (desc) {
    ibv_mem_body body = {.addr = (uint64_t)(uintptr_t)region->ptr,
                         .len = region->bytes,
                         .rkey = mr->rkey};
    memset(desc, 0, sizeof *desc);
    desc->version = WEFT_MEM_DESC_VERSION;
    desc->kind = (uint8_t)region->kind;
    desc->body_len = (uint16_t)sizeof body;
    desc->len = region->bytes;
    memcpy(desc->body, &body, sizeof body);
  }
  return WEFT_OK;
}

static void ibv_deregister_mem(weft_tp_ctx *tctx, weft_tp_mem *handle) {
  if (handle->region.kind == WEFT_MEMORY_DEVICE)
    ibv_gdr_put(&ibv_ctx_of(tctx)->gdr, (ibv_gdr_entry *)handle->priv[0]);
  else if (handle->region.kind == WEFT_MEMORY_DMABUF)
    ibv_ctx_of(tctx)->api->dereg_mr((struct ibv_mr *)handle->priv[1]);
  handle->region.kind = WEFT_MEMORY_COUNT;
}

const weft_transport weft_transport_ibv = {
    .abi_version = WEFT_TRANSPORT_ABI,
    .name = "ibv",
    .caps = {.send_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .recv_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .map_kinds = 0, /* its registrations stay inside (ibv_mr.c, ibv_gdr.c) */
             .sends_are_stores = false,
             .device_channel = true},
    .probe = ibv_probe,
    .init = ibv_init,
    .send_depth = ibv_send_depth,
    .can_reach = ibv_can_reach,
    .publishes_device_channel = ibv_publishes_device_channel,
    .connect = ibv_connect,
    .send_ready = ibv_send_ready,
    .send = ibv_send,
    .send_idle = ibv_send_idle,
    .recv_peek = ibv_recv_peek,
    .recv_release = ibv_recv_release,
    .recv = ibv_recv,
    .register_mem = ibv_register_mem,
    .deregister_mem = ibv_deregister_mem,
    .map_peer_mem = weft_tp_no_map, /* no shared address space with a remote peer */
    .release_peer_mem = weft_tp_no_release,
    .progress = ibv_progress,
    .wait = ibv_wait,
    .abort_all = ibv_abort_all,
    .fini = ibv_fini,
};
