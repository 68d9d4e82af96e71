/* ibv_conn.c - one verbs connection: the side-socket handshake that trades
 * queue pair numbers, GIDs, buffer addresses and keys (with the job key's
 * proof), the RESET -> INIT -> RTR -> RTS transitions, and the data path:
 * RDMA write with immediate into the peer's slots, credits written back,
 * unsignaled sends with periodic signalling, completions polled here.
 * Nothing here waits on the side socket (transport.h: only `wait` blocks):
 * what it has not taken or brought yet waits in the connection (or in an
 * ibv_incoming) for a later call. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ibv.h"
#include "src/base/log.h"
#include "src/mem/mem.h"
#include "transports/ibv/ibv_settings.h"
#include "src/base/status.h"

#define IBV_INFO_MAGIC 0x57494e46u  /* "WINF" */
#define IBV_FRAME_READY 0x57495244u /* "WIRD": the dialer's queue pairs are RTR */
#define IBV_FRAME_ABORT 0x57494142u /* "WIAB": a failure notice follows */
#define IBV_WR_SIGNALED_KIND (1ull << 63)
#define IBV_WR_CREDIT_KIND (1ull << 62)
#define IBV_WR_DATA_KIND (1ull << 61)
#define IBV_WR_FLUSH_KIND (1ull << 60)

static const char ibv_hello_context[] = "weft ibv hello";
static const uint8_t ibv_no_challenge[WEFT_AUTH_CHALLENGE_BYTES];

/* Per queue pair: room for every slot's chunk plus as many credit writes,
 * with slack so periodic signalling never starves the queue. */
static int ibv_sq_depth(const ibv_ctx *ctx) {
  return 3 * ctx->nslots + 8; /* the device channel: a tag and a data write per chunk */
}
static int ibv_rq_depth(const ibv_ctx *ctx) {
  return (ctx->nslots + ctx->nqp - 1) / ctx->nqp + 1;
}

weft_status ibv_conn_fail(ibv_conn *c, weft_status st, const char *fmt, ...) {
  char what[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (c->state == IBV_CONN_DEAD) return c->dead_status;
  weft_error_sink_set(c->ctx->args->errors, "%s", what);
  WEFT_INFO(WEFT_SUBSYS_NET, "ibv: connection to peer %d (%s) failed: %s", c->peer, c->where, what);
  if (c->state != IBV_CONN_UP) c->ctx->not_up--;
  c->state = IBV_CONN_DEAD;
  c->dead_status = st;
  return st;
}

/* ---- resources ------------------------------------------------------------------ */

static void *ibv_alloc_pages(size_t bytes) {
  void *p = NULL;
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  return posix_memalign(&p, 4096, rounded) ? NULL : p;
}

static weft_status ibv_conn_register(ibv_conn *c) {
  ibv_ctx *ctx = c->ctx;
  size_t ring = (size_t)ctx->nslots * ctx->stride;
  /* the slot rings through the memory table: a CUDA build's are pinned, so
   * device copies out of them run asynchronously (mem.h) */
  c->rx_buf = ctx->slot_mem->alloc_slots(ring);
  c->tx_buf = ctx->slot_mem->alloc_slots(ring);
  c->ctrl = ibv_alloc_pages(sizeof *c->ctrl);
  if (!c->rx_buf || !c->tx_buf || !c->ctrl) return WEFT_ERR_NOMEM;
  memset(c->ctrl, 0, sizeof *c->ctrl);
  int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  c->rx_mr = ctx->api->reg_mr(ctx->pd, c->rx_buf, ring, remote);
  c->tx_mr = c->rx_mr ? ctx->api->reg_mr(ctx->pd, c->tx_buf, ring, IBV_ACCESS_LOCAL_WRITE) : NULL;
  c->ctrl_mr = c->tx_mr ? ctx->api->reg_mr(ctx->pd, c->ctrl, sizeof *c->ctrl, remote) : NULL;
  if (!c->ctrl_mr)
    return ibv_conn_fail(c, errno == ENOMEM ? WEFT_ERR_NOMEM : WEFT_ERR_SYSTEM,
                         "ibv: ibv_reg_mr of %zu bytes for peer %d: %s%s", ring, c->peer,
                         strerror(errno),
                         errno == ENOMEM ? " (raise the locked-memory limit: ulimit -l)" : "");
  return WEFT_OK;
}

static weft_status ibv_qp_to_init(ibv_conn *c, struct ibv_qp *qp) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                          .pkey_index = 0,
                          .port_num = c->ctx->port,
                          .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  if (c->ctx->api->modify_qp(qp, &a,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: QP to INIT for peer %d: %s", c->peer,
                         strerror(errno));
  return WEFT_OK;
}

static weft_status ibv_post_recv_for(ibv_conn *c, uint32_t chunk) {
  struct ibv_qp *qp = c->qps[chunk % (uint32_t)c->ctx->nqp].qp;
  /* a write with immediate places no data through the receive: no SGE */
  struct ibv_recv_wr wr = {.wr_id = chunk, .sg_list = NULL, .num_sge = 0}, *bad;
  int rc = c->ctx->api->post_recv(qp, &wr, &bad);
  if (rc)
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: ibv_post_recv for peer %d: %s", c->peer,
                         strerror(rc));
  return WEFT_OK;
}

static weft_status ibv_qp_to_rts(ibv_conn *c, struct ibv_qp *qp, const ibv_qp_info *in, int q);

/* ---- the device channel ---------------------------------------------------------
 *
 * Chunks of GPU memory. Where the NIC can register this rank's GPU memory
 * (GPUDirect RDMA, ibv_gdr.c) the receive slots are a GPU ring it writes
 * into, and a chunk whose source is registered is written straight from
 * it: no copy through host memory at either end. The processor cannot read
 * GPU memory, so each chunk's tag goes first, by its own RDMA write into a
 * host array (one queue pair: it lands before the data's write with
 * immediate completes). A NIC's writes into GPU memory are not promised to
 * be visible to the GPU's kernels when the completion is (PCIe lets them
 * sit in flight): before a chunk is handed over, a flush makes them so, an
 * RDMA read of the ring through a loopback queue pair (as NCCL does by
 * default; a read completes only after the writes before it landed), one
 * per batch of chunks that arrived. cuFlushGPUDirectRDMAWrites would do it
 * too, where the driver has it; the read needs nothing but the NIC.
 * Where registration is refused (or WEFT_IB_GDR=off) each end stages by
 * itself: chunks land in host slots and are copied up into a GPU ring
 * before they are handed over, or are copied down before they are sent. */

static const weft_mem_ops *ibv_dev_mem(void) {
  return weft_mem_by_kind(WEFT_MEMORY_DEVICE);
}

/* The loopback queue pair whose reads flush the NIC's writes into the ring. */
static weft_status ibv_flush_qp(ibv_conn *c) {
  ibv_ctx *ctx = c->ctx;
  const ibv_api *api = ctx->api;
  struct ibv_qp_init_attr ia = {.send_cq = c->cq,
                                .recv_cq = c->cq,
                                .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1,
                                        .max_recv_sge = 1}};
  c->flush_word = ibv_alloc_pages(sizeof *c->flush_word);
  c->flush_qp = c->flush_word ? api->create_qp(ctx->pd, &ia) : NULL;
  c->flush_mr = c->flush_qp ? api->reg_mr(ctx->pd, c->flush_word, sizeof *c->flush_word,
                                          IBV_ACCESS_LOCAL_WRITE)
                            : NULL;
  if (!c->flush_mr)
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: the flush queue pair for peer %d: %s", c->peer,
                         strerror(errno));
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                          .port_num = ctx->port,
                          .qp_access_flags = IBV_ACCESS_REMOTE_READ};
  if (api->modify_qp(c->flush_qp, &a,
                     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: flush QP to INIT: %s", strerror(errno));
  /* connected to itself: our own address, queue pair and sequence number */
  ibv_qp_info self;
  memset(&self, 0, sizeof self);
  self.mtu = htonl((uint32_t)ctx->mtu);
  self.lid = htonl(ctx->lid);
  memcpy(self.gid, ctx->gid.raw, 16);
  self.qpn[0] = htonl(c->flush_qp->qp_num);
  self.psn = htonl(c->psn);
  return ibv_qp_to_rts(c, c->flush_qp, &self, 0);
}

/* Makes the device channel's GPU memory, once the core named the GPU
 * (WEFT_AGAIN before). */
static weft_status ibv_device_setup(ibv_conn *c) {
  ibv_ctx *ctx = c->ctx;
  if (c->set_up) return WEFT_OK;
  const weft_mem_ops *dev = ibv_dev_mem();
  if (!__atomic_load_n(&ctx->args->device_stream, __ATOMIC_ACQUIRE)) return WEFT_AGAIN;
  if (!dev)
    return ibv_conn_fail(c, WEFT_ERR_UNSUPPORTED,
                         "ibv: the device channel to peer %d without a usable CUDA driver", c->peer);
  size_t ring = (size_t)ctx->nslots * ctx->stride;
  c->rx_tags = ibv_alloc_pages((size_t)ctx->nslots * IBV_TAG_BYTES);
  c->tags_mr = c->rx_tags ? ctx->api->reg_mr(ctx->pd, c->rx_tags,
                                             (size_t)ctx->nslots * IBV_TAG_BYTES,
                                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                          : NULL;
  if (!c->tags_mr)
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: registering the tag array for peer %d: %s",
                         c->peer, strerror(errno));
  char *gpu = dev->alloc_on(ctx->args->device, ring);
  if (!gpu)
    return ibv_conn_fail(c, WEFT_ERR_NOMEM, "ibv: %zu bytes of device %d's memory for peer %d",
                         ring, ctx->args->device, c->peer);
  if (ibv_gdr_get(&ctx->gdr, gpu, ring, &c->rx_gdr) == WEFT_OK) {
    c->rx_dev = gpu;
    if (ibv_settings()->gdr_flush) WEFT_CHECK(ibv_flush_qp(c));
  } else {
    c->rx_mirror = gpu;
  }
  WEFT_INFO(WEFT_SUBSYS_NET, "ibv: device channel to peer %d: %s", c->peer,
            c->rx_dev ? "chunks land in GPU memory (GPUDirect RDMA)"
                      : "chunks land in host memory and are copied up");
  c->set_up = true;
  return WEFT_OK;
}

static void ibv_device_destroy(ibv_conn *c) {
  const ibv_api *api = c->ctx->api;
  if (c->flush_qp) api->destroy_qp(c->flush_qp);
  if (c->flush_mr) api->dereg_mr(c->flush_mr);
  if (c->tags_mr) api->dereg_mr(c->tags_mr);
  free(c->flush_word);
  free(c->rx_tags);
  char *gpu = c->rx_dev ? c->rx_dev : c->rx_mirror;
  if (c->rx_gdr) {
    ibv_gdr_put(&c->ctx->gdr, c->rx_gdr);
    ibv_gdr_forget(&c->ctx->gdr, gpu, (size_t)c->ctx->nslots * c->ctx->stride);
  }
  const weft_mem_ops *dev = ibv_dev_mem();
  if (gpu && dev) dev->free_scratch(gpu);
}

weft_status ibv_conn_create(ibv_ctx *ctx, int peer, int channel, ibv_conn **out) {
  ibv_conn *c = calloc(1, sizeof *c);
  if (!c) return WEFT_ERR_NOMEM;
  c->ctx = ctx;
  c->peer = peer;
  c->channel = channel;
  c->device = channel == WEFT_TP_CHANNEL_DEVICE;
  c->fd = -1;
  c->state = ctx->args->rank < peer ? IBV_CONN_AWAIT_INFO : IBV_CONN_AWAIT_HELLO;
  snprintf(c->where, sizeof c->where, "not connected");
  ctx->not_up++;
  *out = c;
  const ibv_api *api = ctx->api;
  int sq = ibv_sq_depth(ctx), rq = ibv_rq_depth(ctx);
  c->cq = api->create_cq(ctx->dev, ctx->nqp * (sq + rq), c, NULL, 0);
  if (!c->cq)
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: ibv_create_cq for peer %d: %s", peer,
                         strerror(errno));
  for (int q = 0; q < ctx->nqp; q++) {
    struct ibv_qp_init_attr ia = {.send_cq = c->cq,
                                  .recv_cq = c->cq,
                                  .qp_type = IBV_QPT_RC,
                                  .sq_sig_all = 0,
                                  .cap = {.max_send_wr = (uint32_t)sq,
                                          .max_recv_wr = (uint32_t)rq,
                                          .max_send_sge = 2, /* tag + user data */
                                          .max_recv_sge = 1,
                                          .max_inline_data = ctx->max_inline}};
    c->qps[q].qp = api->create_qp(ctx->pd, &ia);
    if (!c->qps[q].qp)
      return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: ibv_create_qp for peer %d: %s", peer,
                           strerror(errno));
    WEFT_CHECK(ibv_qp_to_init(c, c->qps[q].qp));
  }
  WEFT_CHECK(ibv_conn_register(c));
  /* every slot gets its receive before the peer can learn our queue pairs */
  for (uint32_t k = 0; k < (uint32_t)ctx->nslots; k++) WEFT_CHECK(ibv_post_recv_for(c, k));
  uint64_t r = ((uint64_t)getpid() << 20) ^ (uint64_t)time(NULL) ^ ((uint64_t)peer << 8) ^
               (uint64_t)(uintptr_t)c;
  c->psn = (uint32_t)(r * 0x9E3779B97F4A7C15ull >> 40) & 0xffffff;
  if (c->device) {
    weft_status st = ibv_device_setup(c);
    if (st < 0) return st;
  }
  return WEFT_OK;
}

void ibv_conn_destroy(ibv_conn *c) {
  const ibv_api *api = c->ctx->api;
  for (int s = 0; s < IBV_MAX_SLOTS; s++) {
    if (c->zc[s]) ibv_mr_cache_put(&c->ctx->mr, c->zc[s]);
    if (c->gz[s]) ibv_gdr_put(&c->ctx->gdr, c->gz[s]);
  }
  for (int q = 0; q < c->ctx->nqp; q++)
    if (c->qps[q].qp) api->destroy_qp(c->qps[q].qp);
  if (c->device) ibv_device_destroy(c);
  if (c->cq) api->destroy_cq(c->cq);
  if (c->rx_mr) api->dereg_mr(c->rx_mr);
  if (c->tx_mr) api->dereg_mr(c->tx_mr);
  if (c->ctrl_mr) api->dereg_mr(c->ctrl_mr);
  size_t ring = (size_t)c->ctx->nslots * c->ctx->stride;
  if (c->rx_buf) c->ctx->slot_mem->free_slots(c->rx_buf, ring);
  if (c->tx_buf) c->ctx->slot_mem->free_slots(c->tx_buf, ring);
  free(c->ctrl);
  if (c->fd >= 0) close(c->fd);
  free(c);
}

/* ---- the side socket's writes ------------------------------------------------------- */

/* Whether the side socket still owes the peer bytes, or its connect has
 * not completed: progress goes on with it, and wait watches for room. */
bool ibv_side_owes(const ibv_conn *c) {
  return c->fd >= 0 && (c->dialing || c->wsent < c->wlen);
}

/* Sends what the side socket will take now; the rest stays for a later call
 * (progress, or a data call that reads the side socket). Never waits: a
 * peer that stops reading must not hold a data call (transport.h). 0, or
 * the errno that ended the socket (what it owed is dropped then). */
static int ibv_side_send(ibv_conn *c) {
  while (c->fd >= 0 && !c->dialing && c->wsent < c->wlen) {
    ssize_t n = send(c->fd, c->wbuf + c->wsent, c->wlen - c->wsent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c->wsent += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    int e = n < 0 ? errno : EPIPE;
    c->wlen = c->wsent = 0;
    return e;
  }
  if (c->wsent == c->wlen) c->wlen = c->wsent = 0;
  return 0;
}

/* ibv_side_send for the handshake: a socket that fails fails the pair. */
static weft_status ibv_side_flush(ibv_conn *c) {
  int e = ibv_side_send(c);
  if (e)
    return ibv_conn_fail(c, WEFT_ERR_PEER_LOST, "ibv: handshake with peer %d (%s): send: %s",
                         c->peer, c->where, strerror(e));
  return WEFT_OK;
}

/* Puts `len` bytes behind what the side socket still owes (the caller
 * sends them). False when they do not fit (never for the handshake's
 * messages and one notice: wbuf is sized for them). */
static bool ibv_side_queue(ibv_conn *c, const void *buf, size_t len) {
  if (c->wsent == c->wlen) c->wlen = c->wsent = 0;
  if (len > sizeof c->wbuf - c->wlen) return false;
  memcpy(c->wbuf + c->wlen, buf, len);
  c->wlen += len;
  return true;
}

/* The dialer's connect, started in ibv_conn_dial: complete once the socket
 * is writable. 0 (done, or still under way), or the errno it failed with
 * (what the socket owed is dropped then). */
static int ibv_side_connected(ibv_conn *c) {
  if (!c->dialing) return 0;
  struct pollfd p = {.fd = c->fd, .events = POLLOUT};
  if (poll(&p, 1, 0) != 1) return 0;
  int e = 0;
  socklen_t el = sizeof e;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el)) e = errno;
  c->dialing = false;
  if (e) c->wlen = c->wsent = 0;
  return e;
}

/* ibv_side_connected for the handshake: a refusal fails the pair, as it did
 * at once when connect waited (the peer's listener existed, so it is gone). */
static weft_status ibv_side_dialed(ibv_conn *c) {
  int e = ibv_side_connected(c);
  if (e)
    return ibv_conn_fail(c, WEFT_ERR_PEER_LOST, "ibv: cannot connect to %s: %s", c->where,
                         strerror(e));
  return ibv_side_flush(c);
}

void ibv_conn_send_owed(ibv_conn *c) {
  int e = ibv_side_connected(c);
  if (!e) e = ibv_side_send(c);
  if (e)
    WEFT_INFO(WEFT_SUBSYS_NET, "ibv: abort notice to peer %d not sent: %s", c->peer, strerror(e));
}

/* ---- handshake ------------------------------------------------------------------- */

static void ibv_info_fill(ibv_conn *c, ibv_qp_info *in) {
  ibv_ctx *ctx = c->ctx;
  memset(in, 0, sizeof *in);
  in->magic = htonl(IBV_INFO_MAGIC);
  in->from = htonl((uint32_t)ctx->args->rank);
  in->to = htonl((uint32_t)c->peer);
  in->nqp = htonl((uint32_t)ctx->nqp);
  in->channel = htonl((uint32_t)c->channel);
  in->comm_hi = htonl((uint32_t)(ctx->args->comm_id >> 32));
  in->comm_lo = htonl((uint32_t)ctx->args->comm_id);
  in->lid = htonl(ctx->lid);
  in->link_layer = htonl(ctx->link_layer);
  in->mtu = htonl((uint32_t)ctx->mtu);
  in->nslots = htonl((uint32_t)ctx->nslots);
  memcpy(in->gid, ctx->gid.raw, 16);
  for (int q = 0; q < ctx->nqp; q++) in->qpn[q] = htonl(c->qps[q].qp->qp_num);
  in->psn = htonl(c->psn);
  in->stride = htonl((uint32_t)ctx->stride);
  in->slots_addr = htobe64((uint64_t)(uintptr_t)(c->rx_dev ? c->rx_dev : c->rx_buf));
  in->credit_addr = htobe64((uint64_t)(uintptr_t)&c->ctrl->credits);
  in->slots_rkey = htonl(c->rx_dev ? c->rx_gdr->mr->rkey : c->rx_mr->rkey);
  in->credit_rkey = htonl(c->ctrl_mr->rkey);
  if (c->device) {
    in->tags_addr = htobe64((uint64_t)(uintptr_t)c->rx_tags);
    in->tags_rkey = htonl(c->tags_mr->rkey);
    in->gdr = htonl(c->rx_dev ? 1u : 0u);
  }
}

/* Our queue pairs and buffers, proven with the job key: queued, and sent as
 * far as the socket takes them now. */
static weft_status ibv_send_info(ibv_conn *c) {
  uint8_t msg[IBV_HELLO_BYTES];
  ibv_qp_info in;
  ibv_info_fill(c, &in);
  memcpy(msg, &in, sizeof in);
  weft_auth_mac(c->ctx->args->auth, ibv_hello_context, ibv_no_challenge, &in, sizeof in,
                msg + sizeof in);
  if (!ibv_side_queue(c, msg, sizeof msg)) return WEFT_ERR_INTERNAL; /* the first bytes */
  return ibv_side_flush(c);
}

/* Why the peer's info cannot be used, or NULL. */
static const char *ibv_info_check(const ibv_conn *c, const ibv_qp_info *in) {
  const ibv_ctx *ctx = c->ctx;
  uint64_t comm = ((uint64_t)ntohl(in->comm_hi) << 32) | ntohl(in->comm_lo);
  if (ntohl(in->magic) != IBV_INFO_MAGIC) return "not a weft verbs handshake";
  if (comm != ctx->args->comm_id) return "a handshake for another communicator";
  if (ntohl(in->from) != (uint32_t)c->peer || ntohl(in->to) != (uint32_t)ctx->args->rank)
    return "a handshake with the wrong ranks";
  if (ntohl(in->channel) != (uint32_t)c->channel) return "a handshake for another channel";
  if (ntohl(in->nqp) != (uint32_t)ctx->nqp) return "WEFT_IB_QPS_PER_PEER differs between the ranks";
  if (ntohl(in->nslots) != (uint32_t)ctx->nslots || ntohl(in->stride) != ctx->stride)
    return "WEFT_CHUNK_BYTES differs between the ranks";
  if (ntohl(in->link_layer) != ctx->link_layer) return "one port is InfiniBand, the other RoCE";
  return NULL;
}

static weft_status ibv_qp_to_rts(ibv_conn *c, struct ibv_qp *qp, const ibv_qp_info *in,
                                 int q) {
  ibv_ctx *ctx = c->ctx;
  enum ibv_mtu peer_mtu = (enum ibv_mtu)ntohl(in->mtu);
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = peer_mtu < ctx->mtu ? peer_mtu : ctx->mtu,
                          .dest_qp_num = ntohl(in->qpn[q]),
                          .rq_psn = ntohl(in->psn),
                          .max_dest_rd_atomic = 1,
                          .min_rnr_timer = 12};
  a.ah_attr.port_num = ctx->port;
  if (ctx->link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1; /* RoCE routes by GID */
    memcpy(a.ah_attr.grh.dgid.raw, in->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)ctx->gid_index;
    a.ah_attr.grh.hop_limit = 255;
  } else {
    a.ah_attr.dlid = (uint16_t)ntohl(in->lid);
  }
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (ctx->api->modify_qp(qp, &a, mask))
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: QP to RTR for peer %d: %s", c->peer,
                         strerror(errno));
  long long timeout = ibv_settings()->timeout;
  long long retry = ibv_settings()->retry_cnt;
  struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS,
                          /* 4.096 us * 2^18 = 1.07 s per try, 7 tries: NCCL's values,
                             long enough for a switch to reroute */
                          .timeout = (uint8_t)(timeout < 1    ? 1
                                               : timeout > 31 ? 31
                                                              : timeout),
                          .retry_cnt = (uint8_t)(retry < 0   ? 0
                                                 : retry > 7 ? 7
                                                             : retry),
                          .rnr_retry = 7, /* credits keep receives posted; never give up on RNR */
                          .sq_psn = c->psn,
                          .max_rd_atomic = 1};
  mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
         IBV_QP_MAX_QP_RD_ATOMIC;
  if (ctx->api->modify_qp(qp, &r, mask))
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: QP to RTS for peer %d: %s", c->peer,
                         strerror(errno));
  return WEFT_OK;
}

static weft_status ibv_conn_use_info(ibv_conn *c, const uint8_t *msg) {
  ibv_qp_info in;
  memcpy(&in, msg, sizeof in);
  const char *why = NULL;
  if (!weft_auth_verify(c->ctx->args->auth, ibv_hello_context, ibv_no_challenge, &in, sizeof in,
                        msg + sizeof in))
    why = "it did not prove the job key (WEFT_AUTH_TOKEN differs?)";
  if (!why) why = ibv_info_check(c, &in);
  if (why)
    return ibv_conn_fail(c, WEFT_ERR_MISMATCH, "ibv: peer %d (%s) sent %s", c->peer, c->where, why);
  for (int q = 0; q < c->ctx->nqp; q++) WEFT_CHECK(ibv_qp_to_rts(c, c->qps[q].qp, &in, q));
  c->r_slots = be64toh(in.slots_addr);
  c->r_credit = be64toh(in.credit_addr);
  c->r_slots_rkey = ntohl(in.slots_rkey);
  c->r_credit_rkey = ntohl(in.credit_rkey);
  c->r_tags = be64toh(in.tags_addr);
  c->r_tags_rkey = ntohl(in.tags_rkey);
  c->r_gdr = ntohl(in.gdr) != 0;
  return WEFT_OK;
}

static void ibv_conn_set_where(ibv_conn *c) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  if (!getpeername(c->fd, (struct sockaddr *)&a, &len))
    net_addr_str((struct sockaddr *)&a, c->where, sizeof c->where);
}

static void ibv_conn_now_up(ibv_conn *c) {
  c->state = IBV_CONN_UP;
  c->ctx->not_up--;
  c->ctx->moved = true;
  WEFT_INFO(WEFT_SUBSYS_NET, "ibv: rank %d connected to peer %d channel %d (%d QP(s), %d slots)",
            c->ctx->args->rank, c->peer, c->channel, c->ctx->nqp, c->ctx->nslots);
}

/* Starts the side socket's connect and queues the hello behind it: both
 * finish in later calls (ibv_side_dialed), so `connect`, which a data call
 * may make on first use, never waits for the peer. A refusal the kernel
 * gives at once fails here; the peer's listener existed, so it is gone. */
weft_status ibv_conn_dial(ibv_conn *c, const struct sockaddr_storage *addr, socklen_t len) {
  net_addr_str((const struct sockaddr *)addr, c->where, sizeof c->where);
  c->fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) return ibv_conn_fail(c, WEFT_ERR_PEER_LOST, "ibv: socket: %s", strerror(errno));
  net_set_nodelay(c->fd);
  if (connect(c->fd, (const struct sockaddr *)addr, len)) {
    if (errno != EINPROGRESS)
      return ibv_conn_fail(c, WEFT_ERR_PEER_LOST, "ibv: cannot connect to %s: %s", c->where,
                           strerror(errno));
    c->dialing = true;
  }
  WEFT_CHECK(ibv_send_info(c));
  return ibv_side_dialed(c);
}

/* A whole hello from an incoming side socket: refused (closed, with a
 * warning) when it is not for a connection we wait for, else the
 * connection takes the socket and answers with its own info. */
static weft_status ibv_conn_take_hello(ibv_ctx *ctx, int fd, const uint8_t *msg, const char *why,
                                       bool *progressed) {
  ibv_qp_info in;
  uint32_t from = 0, channel = 0;
  ibv_conn **slot = NULL;
  if (!why) {
    memcpy(&in, msg, sizeof in);
    from = ntohl(in.from);
    channel = ntohl(in.channel);
    if (from >= (uint32_t)ctx->args->rank || ntohl(in.to) != (uint32_t)ctx->args->rank)
      why = "a handshake with the wrong ranks";
    else if (channel >= WEFT_TP_CHANNELS)
      why = "a handshake for an unknown channel";
    else if (*(slot = &ctx->conns[ibv_conn_index((int)from, (int)channel)]) &&
             ((*slot)->fd >= 0 || (*slot)->state != IBV_CONN_AWAIT_HELLO))
      why = "a second connection from the same rank and channel";
  }
  if (why) {
    WEFT_WARN(WEFT_SUBSYS_NET, "ibv: rank %d refused an incoming connection: %s", ctx->args->rank,
              why);
    close(fd);
    return WEFT_OK;
  }
  if (!*slot) {
    weft_status st = ibv_conn_create(ctx, (int)from, (int)channel, slot);
    if (st) {
      close(fd);
      return st;
    }
  }
  ibv_conn *c = *slot;
  c->fd = fd;
  ibv_conn_set_where(c);
  *progressed = true;
  if (c->device && !c->set_up) {
    /* the peer's first device call came before ours: our GPU ring is not
     * made yet, so the answer waits (ibv_conn_poll) */
    memcpy(c->held, msg, sizeof c->held);
    c->hello_held = true;
    return WEFT_OK;
  }
  WEFT_CHECK(ibv_conn_use_info(c, msg));
  WEFT_CHECK(ibv_send_info(c));
  c->state = IBV_CONN_AWAIT_READY;
  return WEFT_OK;
}

/* Reads what an incoming socket has of its hello: a whole one is taken,
 * an end or an error refused, and one not whole by its deadline too (as
 * long as a hello could keep the listener, no longer). */
static weft_status ibv_incoming_read(ibv_ctx *ctx, ibv_incoming *in, bool *progressed) {
  const char *why = NULL;
  char text[64];
  while (in->got < sizeof in->msg) {
    ssize_t r = recv(in->fd, in->msg + in->got, sizeof in->msg - in->got, MSG_DONTWAIT);
    if (r > 0) {
      in->got += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (weft_now() < in->deadline) return WEFT_OK;
      why = "timed out while receiving";
    } else if (r == 0) {
      why = "connection closed by the other side";
    } else {
      snprintf(text, sizeof text, "recv: %s", strerror(errno));
      why = text;
    }
    break;
  }
  int fd = in->fd;
  in->fd = -1;
  ctx->nincoming--;
  return ibv_conn_take_hello(ctx, fd, in->msg, why, progressed);
}

/* The listener's side: new side sockets while connections wait for their
 * hello (one entry each, the rest stay queued in the listener), and what
 * has come of the hellos on their way. Never waits. */
weft_status ibv_conn_accept(ibv_ctx *ctx, bool *progressed) {
  int max = ctx->args->size * WEFT_TP_CHANNELS;
  for (int e = 0; ctx->not_up > 0 && ctx->nincoming < max && e < max; e++) {
    ibv_incoming *in = &ctx->incoming[e];
    if (in->fd >= 0) continue;
    int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    net_set_nodelay(fd);
    double wait = ctx->args->timeout_s < 2.0 ? ctx->args->timeout_s : 2.0;
    *in = (ibv_incoming){.fd = fd, .deadline = weft_now() + wait};
    ctx->nincoming++;
  }
  for (int e = 0; ctx->nincoming > 0 && e < max; e++)
    if (ctx->incoming[e].fd >= 0) WEFT_CHECK(ibv_incoming_read(ctx, &ctx->incoming[e], progressed));
  return WEFT_OK;
}

/* ---- the side socket after the hello ---------------------------------------------- */

static weft_status ibv_side_frame(ibv_conn *c) {
  uint32_t hdr[2];
  memcpy(hdr, c->rbuf, sizeof hdr);
  uint32_t type = ntohl(hdr[0]), len = ntohl(hdr[1]);
  if (type == IBV_FRAME_READY && c->state == IBV_CONN_AWAIT_READY) {
    ibv_conn_now_up(c);
    return WEFT_OK;
  }
  if (type == IBV_FRAME_ABORT) {
    char text[IBV_ABORT_TEXT + 1];
    snprintf(text, sizeof text, "%.*s", (int)len, (const char *)c->rbuf + sizeof hdr);
    c->peer_said_abort = true;
    weft_status st =
        ibv_conn_fail(c, WEFT_ERR_PEER_LOST, "peer %d passed on a failure: %s", c->peer, text);
    snprintf(c->ctx->args->errors->origin, sizeof c->ctx->args->errors->origin, "%s", text);
    return st;
  }
  return ibv_conn_fail(c, WEFT_ERR_PROTOCOL,
                       "ibv: unexpected message %#x on the side socket "
                       "from peer %d (%s)",
                       type, c->peer, c->where);
}

/* Reads what the side socket has: the acceptor's info (dialer), then frames. */
static weft_status ibv_side_read(ibv_conn *c, bool *progressed) {
  while (c->fd >= 0 && !c->peer_ended && c->state != IBV_CONN_DEAD) {
    size_t want;
    if (c->state == IBV_CONN_AWAIT_INFO) {
      want = IBV_HELLO_BYTES;
    } else if (c->rgot < 8) {
      want = 8;
    } else {
      uint32_t len = ntohl(((uint32_t *)c->rbuf)[1]);
      want = 8 + (len > IBV_ABORT_TEXT ? IBV_ABORT_TEXT : len);
    }
    if (c->rgot < want) {
      ssize_t r = recv(c->fd, c->rbuf + c->rgot, want - c->rgot, MSG_DONTWAIT);
      if (r == 0) {
        c->peer_ended = true; /* not an error yet: its chunks may still be unread */
        *progressed = true;
        break;
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        c->peer_ended = true;
        break;
      }
      c->rgot += (size_t)r;
      *progressed = true;
      continue;
    }
    if (c->state == IBV_CONN_AWAIT_INFO) {
      c->rgot = 0;
      WEFT_CHECK(ibv_conn_use_info(c, c->rbuf));
      /* Up once READY is queued: the acceptor's queue pairs are ready for
       * our writes already; it waits for READY (sent now or by a later
       * call) before it writes to ours. */
      uint32_t ready[2] = {htonl(IBV_FRAME_READY), 0};
      if (!ibv_side_queue(c, ready, sizeof ready)) return WEFT_ERR_INTERNAL;
      WEFT_CHECK(ibv_side_flush(c));
      ibv_conn_now_up(c);
      continue;
    }
    c->rgot = 0;
    WEFT_CHECK(ibv_side_frame(c));
  }
  return WEFT_OK;
}

void ibv_conn_notify_abort(ibv_conn *c, const char *reason) {
  /* a connection whose queue pair failed still has its socket: the peer
   * must hear why rather than see only the end of the process */
  /* also when the peer failed first: it may still read ours (a timeout's
   * culprit exchange, src/engine/engine.c, needs every rank's notice) */
  if (c->fd < 0 || c->abort_sent) return;
  c->abort_sent = true;
  size_t tlen = strnlen(reason, IBV_ABORT_TEXT);
  uint8_t frame[8 + IBV_ABORT_TEXT];
  uint32_t hdr[2] = {htonl(IBV_FRAME_ABORT), htonl((uint32_t)tlen)};
  memcpy(frame, hdr, sizeof hdr);
  memcpy(frame + 8, reason, tlen);
  /* behind what the socket still owes (the handshake's last bytes); what
   * it does not take now, progress sends later */
  if (ibv_side_queue(c, frame, 8 + tlen))
    ibv_conn_send_owed(c);
  else
    WEFT_INFO(WEFT_SUBSYS_NET, "ibv: abort notice to peer %d not sent: no room", c->peer);
  if (c->state == IBV_CONN_DEAD) return;
  if (c->state != IBV_CONN_UP) c->ctx->not_up--;
  c->state = IBV_CONN_DEAD;
  c->dead_status = WEFT_ERR_ABORTED;
}

/* ---- completions -------------------------------------------------------------------- */

static weft_status ibv_completion(ibv_conn *c, const struct ibv_wc *wc) {
  ibv_ctx *ctx = c->ctx;
  if (wc->status != IBV_WC_SUCCESS && !(wc->wr_id & IBV_WR_DATA_KIND)) {
    /* A credit or an empty write that found no peer: a peer that finished
     * and exited needs no credits. Like its socket closing, this is an error
     * only once we need something from it; a lost chunk is one at once. */
    if (!c->peer_ended && wc->status != IBV_WC_WR_FLUSH_ERR)
      WEFT_INFO(WEFT_SUBSYS_NET, "ibv: a credit to peer %d was not delivered (%s): peer gone?",
                c->peer, ctx->api->wc_status_str(wc->status));
    c->peer_ended = true;
    /* the QP is in error now: every request on it completes (flushed), none
     * will free queue slots through a signaled success */
    for (int q = 0; q < ctx->nqp; q++) c->qps[q].sq_used = c->qps[q].unsignaled = 0;
    return WEFT_OK;
  }
  if (wc->status != IBV_WC_SUCCESS)
    return ibv_conn_fail(c, WEFT_ERR_PEER_LOST,
                         "ibv: a work request to peer %d (%s) failed: %s (status %d, vendor "
                         "error %#x) on %s port %u",
                         c->peer, c->where, ctx->api->wc_status_str(wc->status), wc->status,
                         wc->vendor_err, ctx->dev_name, ctx->port);
  if (wc->wr_id & IBV_WR_FLUSH_KIND) {
    c->flushed = c->flush_upto;
    c->flush_posted = false;
    return WEFT_OK;
  }
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    uint32_t k = ntohl(wc->imm_data);
    uint32_t slot = k % (uint32_t)ctx->nslots;
    if (!(wc->wc_flags & IBV_WC_WITH_IMM) || k - c->rx_tail >= (uint32_t)ctx->nslots ||
        c->slot_full[slot] || wc->byte_len < (c->device ? 0u : IBV_TAG_BYTES) ||
        wc->byte_len > ctx->stride)
      return ibv_conn_fail(c, WEFT_ERR_PROTOCOL,
                           "ibv: peer %d wrote chunk %u (%u bytes) "
                           "outside its credits (next expected %u)",
                           c->peer, k, wc->byte_len, c->rx_tail);
    c->slot_full[slot] = 1;
    c->slot_len[slot] = wc->byte_len;
    return WEFT_OK;
  }
  if (wc->wr_id & IBV_WR_SIGNALED_KIND) {
    int q = (int)((wc->wr_id >> 16) & 0xff);
    c->qps[q].sq_used -= (int)(wc->wr_id & 0xffff);
  }
  return WEFT_OK;
}

static weft_status ibv_post_write(ibv_conn *c, int q, struct ibv_send_wr *wr, bool signal) {
  ibv_conn_qp *qs = &c->qps[q];
  int depth = ibv_sq_depth(c->ctx);
  if (qs->sq_used >= depth) return WEFT_AGAIN;
  /* Unsignaled work requests cost no completion; every few (and whenever the
   * queue is half full) one is signaled, and its completion frees them all. */
  int every = c->ctx->nslots / 2 > 0 ? c->ctx->nslots / 2 : 1;
  qs->unsignaled++;
  if (signal || qs->unsignaled >= every || qs->sq_used + 1 >= depth / 2) {
    wr->send_flags |= IBV_SEND_SIGNALED;
    wr->wr_id |= IBV_WR_SIGNALED_KIND | ((uint64_t)q << 16) | (uint64_t)qs->unsignaled;
    qs->unsignaled = 0;
  }
  qs->sq_used++;
  struct ibv_send_wr *bad;
  int rc = c->ctx->api->post_send(qs->qp, wr, &bad);
  if (rc)
    return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: ibv_post_send to peer %d: %s", c->peer,
                         strerror(rc));
  return WEFT_OK;
}

/* Tells the peer how many chunks we released: an inline 8-byte RDMA write
 * into its credit word, no completion on its side. */
static weft_status ibv_send_credit(ibv_conn *c) {
  c->ctrl->credit_src = c->rx_tail;
  struct ibv_sge sge = {.addr = (uintptr_t)&c->ctrl->credit_src,
                        .length = sizeof(uint64_t),
                        .lkey = c->ctrl_mr->lkey};
  struct ibv_send_wr wr = {.wr_id = IBV_WR_CREDIT_KIND,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_INLINE};
  wr.wr.rdma.remote_addr = c->r_credit;
  wr.wr.rdma.rkey = c->r_credit_rkey;
  weft_status st = ibv_post_write(c, 0, &wr, false);
  c->credit_dirty = st == WEFT_AGAIN;
  return st == WEFT_AGAIN ? WEFT_OK : st;
}

/* Completions only: the side socket is read by progress, and by the data
 * calls before they answer WEFT_AGAIN (a syscall per chunk would cost more
 * than the rest of the data path). */
static weft_status ibv_conn_poll_cq(ibv_conn *c, bool *progressed) {
  if (c->state == IBV_CONN_DEAD) return c->dead_status;
  if (c->state != IBV_CONN_UP && c->state != IBV_CONN_AWAIT_READY) return WEFT_OK;
  struct ibv_wc wc[16];
  int n;
  do {
    n = c->ctx->api->poll_cq(c->cq, 16, wc);
    if (n < 0)
      return ibv_conn_fail(c, WEFT_ERR_PEER_LOST,
                           "ibv: polling the completion queue of peer %d "
                           "failed (overrun?)",
                           c->peer);
    for (int i = 0; i < n; i++) WEFT_CHECK(ibv_completion(c, &wc[i]));
    if (n > 0) *progressed = true;
  } while (n == 16);
  if (c->credit_dirty) WEFT_CHECK(ibv_send_credit(c));
  return WEFT_OK;
}

/* The peer's notice that came after ours (the connection is dead, so no
 * poll reads its socket any more): read once, for the timeout's culprit
 * exchange (src/engine/engine.c), which collects every rank's. Only notices
 * follow the handshake on the side socket. */
weft_status ibv_conn_take_late_notice(ibv_conn *c) {
  if (c->state != IBV_CONN_DEAD || !c->abort_sent || c->peer_said_abort || c->fd < 0 ||
      c->peer_ended)
    return WEFT_OK;
  for (;;) {
    size_t want = 8;
    if (c->rgot >= 8) {
      uint32_t len = ntohl(((uint32_t *)c->rbuf)[1]);
      want = 8 + (len > IBV_ABORT_TEXT ? IBV_ABORT_TEXT : len);
    }
    if (c->rgot < want) {
      ssize_t r = recv(c->fd, c->rbuf + c->rgot, want - c->rgot, MSG_DONTWAIT);
      if (r <= 0) {
        if (r == 0 || (errno != EAGAIN && errno != EINTR)) c->peer_ended = true;
        return WEFT_OK;
      }
      c->rgot += (size_t)r;
      continue;
    }
    c->rgot = 0;
    uint32_t hdr[2];
    memcpy(hdr, c->rbuf, sizeof hdr);
    if (ntohl(hdr[0]) != IBV_FRAME_ABORT) continue;
    char text[IBV_ABORT_TEXT + 1];
    snprintf(text, sizeof text, "%.*s", (int)(want - 8), (const char *)c->rbuf + sizeof hdr);
    c->peer_said_abort = true;
    weft_error_sink_set(c->ctx->args->errors, "peer %d passed on a failure: %s", c->peer, text);
    snprintf(c->ctx->args->errors->origin, sizeof c->ctx->args->errors->origin, "%s", text);
    return WEFT_ERR_PEER_LOST;
  }
}

weft_status ibv_conn_poll(ibv_conn *c, bool *progressed) {
  if (c->state == IBV_CONN_DEAD) return c->dead_status;
  if (c->dial_held && c->fd < 0) {
    weft_status st = ibv_device_setup(c);
    if (st < 0) return st;
    if (st == WEFT_AGAIN) return WEFT_OK; /* the GPU is not named yet */
    c->dial_held = false;
    *progressed = true;
    WEFT_CHECK(ibv_conn_dial(c, &c->dial_addr, c->dial_len));
  }
  if (c->hello_held) {
    weft_status st = ibv_device_setup(c);
    if (st < 0) return st;
    if (st == WEFT_OK) {
      c->hello_held = false;
      *progressed = true;
      WEFT_CHECK(ibv_conn_use_info(c, c->held));
      WEFT_CHECK(ibv_send_info(c));
      c->state = IBV_CONN_AWAIT_READY;
    }
  }
  if (c->dialing) {
    WEFT_CHECK(ibv_side_dialed(c));
    if (c->dialing) return WEFT_OK; /* nothing to read before the connect completes */
  }
  if (c->wsent < c->wlen) WEFT_CHECK(ibv_side_flush(c));
  WEFT_CHECK(ibv_side_read(c, progressed));
  return ibv_conn_poll_cq(c, progressed);
}

/* ---- data path ---------------------------------------------------------------------- */

/* Polls completions; with `side`, reads the side socket too (handshake,
 * failure notices, the peer's end). */
static weft_status ibv_conn_usable(ibv_conn *c, bool side) {
  bool progressed = false;
  WEFT_CHECK(side ? ibv_conn_poll(c, &progressed) : ibv_conn_poll_cq(c, &progressed));
  if (progressed) c->ctx->moved = true;
  return WEFT_OK;
}

/* Gives back the region references of chunks the NIC is done with: those
 * the peer released (their write landed), or all once the queues are idle. */
static void ibv_zc_reap(ibv_conn *c, bool all_done) {
  uint32_t released = (uint32_t)c->ctrl->credits;
  while (c->zc_pending && c->zc_tail != c->tx_head) {
    if (!all_done && (int32_t)(released - c->zc_tail) <= 0) break;
    ibv_mr_entry **e = &c->zc[c->zc_tail % (uint32_t)c->ctx->nslots];
    if (*e) {
      ibv_mr_cache_put(&c->ctx->mr, *e);
      *e = NULL;
      c->zc_pending--;
    }
    ibv_gdr_entry **g = &c->gz[c->zc_tail % (uint32_t)c->ctx->nslots];
    if (*g) {
      ibv_gdr_put(&c->ctx->gdr, *g);
      *g = NULL;
      c->zc_pending--;
    }
    c->zc_tail++;
  }
  if (!c->zc_pending) c->zc_tail = c->tx_head;
}

static weft_status ibv_send_room(ibv_conn *c) {
  if (c->zc_pending) ibv_zc_reap(c, false);
  uint32_t in_flight = c->tx_head - (uint32_t)c->ctrl->credits;
  int q = (int)(c->tx_head % (uint32_t)c->ctx->nqp);
  int wrs = c->device ? 2 : 1; /* the device channel: the tag's write, then the data's */
  return in_flight < (uint32_t)c->ctx->nslots && c->qps[q].sq_used + wrs <= ibv_sq_depth(c->ctx)
             ? WEFT_OK
             : WEFT_AGAIN;
}

static weft_status ibv_ready(ibv_conn *c) {
  if (c->state == IBV_CONN_UP && ibv_send_room(c) == WEFT_OK) return WEFT_OK;
  WEFT_CHECK(ibv_conn_usable(c, false));
  if (c->state == IBV_CONN_UP && ibv_send_room(c) == WEFT_OK) return WEFT_OK;
  WEFT_CHECK(ibv_conn_usable(c, true));
  if (c->state != IBV_CONN_UP) {
    if (c->peer_ended)
      return ibv_conn_fail(c, WEFT_ERR_PEER_LOST,
                           "peer %d ended or crashed during the verbs "
                           "handshake",
                           c->peer);
    return WEFT_AGAIN;
  }
  if (ibv_send_room(c) == WEFT_OK) return WEFT_OK;
  if (c->peer_ended)
    return ibv_conn_fail(c, WEFT_ERR_PEER_LOST,
                         "peer %d (%s) ended or crashed while this rank "
                         "waited for room to send",
                         c->peer, c->where);
  return WEFT_AGAIN;
}

weft_status ibv_send_ready(weft_tp_conn *conn) {
  return ibv_ready(ibv_conn_of(conn));
}

/* A source that cannot be registered: copied down into the bounce slot on
 * the channel's stream first. The one wait inside a data call: bounded by a
 * copy of one chunk, and by the timeout where the GPU stops. */
static weft_status ibv_copy_down(ibv_conn *c, void *host, const void *src, size_t bytes) {
  ibv_ctx *ctx = c->ctx;
  const weft_mem_ops *dev = ibv_dev_mem();
  weft_mem_token token = 0;
  weft_status st = dev->copy_to_host(host, src, bytes, ctx->args->device_stream, &token);
  double deadline = weft_now() + ctx->args->timeout_s;
  if (st == WEFT_OK)
    while ((st = dev->poll(ctx->args->device_stream, token)) == WEFT_AGAIN)
      if (weft_now() > deadline) {
        st = WEFT_ERR_TIMEOUT;
        break;
      }
  if (st < 0)
    return ibv_conn_fail(c, st, "ibv: copying a chunk for peer %d out of device %d: %s", c->peer,
                         ctx->args->device, ctx->args->errors->msg);
  c->staged_sends++;
  return WEFT_OK;
}

/* The device channel's send: the tag into the peer's tag array, then the
 * data with the immediate, on one queue pair (in order). */
static weft_status ibv_send_device(ibv_conn *c, const void *src, size_t bytes, weft_tag tag) {
  ibv_ctx *ctx = c->ctx;
  uint32_t k = c->tx_head, slot = k % (uint32_t)ctx->nslots;
  int q = (int)(k % (uint32_t)ctx->nqp);
  char *bounce = c->tx_buf + (size_t)slot * ctx->stride;
  uint32_t head[4] = {weft_tag_seq(tag), weft_tag_sig(tag), (uint32_t)bytes, 0};
  memcpy(bounce, head, sizeof head);
  struct ibv_sge tag_sge = {
      .addr = (uintptr_t)bounce, .length = IBV_TAG_BYTES, .lkey = c->tx_mr->lkey};
  struct ibv_send_wr tag_wr = {.wr_id = IBV_WR_DATA_KIND,
                               .sg_list = &tag_sge,
                               .num_sge = 1,
                               .opcode = IBV_WR_RDMA_WRITE};
  tag_wr.wr.rdma.remote_addr = c->r_tags + (uint64_t)slot * IBV_TAG_BYTES;
  tag_wr.wr.rdma.rkey = c->r_tags_rkey;
  ibv_gdr_entry *g = NULL;
  struct ibv_sge data = {.addr = (uintptr_t)bounce + IBV_TAG_BYTES,
                         .length = (uint32_t)bytes,
                         .lkey = c->tx_mr->lkey};
  if (bytes && ibv_gdr_get(&ctx->gdr, src, bytes, &g) == WEFT_OK)
    data = (struct ibv_sge){.addr = (uintptr_t)src, .length = (uint32_t)bytes, .lkey = g->mr->lkey};
  else if (bytes)
    WEFT_CHECK(ibv_copy_down(c, bounce + IBV_TAG_BYTES, src, bytes));
  struct ibv_send_wr wr = {.wr_id = IBV_WR_DATA_KIND,
                           .sg_list = &data,
                           .num_sge = bytes ? 1 : 0,
                           .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                           .imm_data = htonl(k)};
  wr.wr.rdma.remote_addr = c->r_slots + (uint64_t)slot * ctx->stride;
  wr.wr.rdma.rkey = c->r_slots_rkey;
  weft_status st = ibv_post_write(c, q, &tag_wr, false);
  if (st == WEFT_OK) st = ibv_post_write(c, q, &wr, false);
  if (st != WEFT_OK) {
    if (g) ibv_gdr_put(&ctx->gdr, g);
    return st == WEFT_AGAIN ? WEFT_ERR_INTERNAL : st; /* ibv_send_room promised both */
  }
  c->gz[slot] = g;
  if (g) c->zc_pending++;
  c->tx_head++;
  uint32_t in_flight = c->tx_head - (uint32_t)c->ctrl->credits;
  if (in_flight > c->max_in_flight) c->max_in_flight = in_flight;
  return WEFT_OK;
}

weft_status ibv_send(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                     const struct weft_mem_ops *mem, unsigned flags) {
  (void)flags; /* a posted write moves at once; the receiver copies out of its slot either way */
  ibv_conn *c = ibv_conn_of(conn);
  weft_status st = ibv_ready(c);
  if (st) return st == WEFT_AGAIN ? WEFT_ERR_INTERNAL : st;
  ibv_ctx *ctx = c->ctx;
  if (bytes > ctx->args->chunk_bytes) return WEFT_ERR_INVALID;
  if (c->device) return ibv_send_device(c, src, bytes, tag);
  uint32_t k = c->tx_head, slot = k % (uint32_t)ctx->nslots;
  char *bounce = c->tx_buf + (size_t)slot * ctx->stride;
  uint32_t head[4] = {weft_tag_seq(tag), weft_tag_sig(tag), (uint32_t)bytes, 0};
  memcpy(bounce, head, sizeof head);
  struct ibv_sge sge[2] = {
      {.addr = (uintptr_t)bounce, .length = IBV_TAG_BYTES, .lkey = c->tx_mr->lkey}};
  int nsge = 1;
  ibv_mr_entry *zc = NULL;
  if (ctx->zcopy_bytes && bytes >= ctx->zcopy_bytes && mem->kind == WEFT_MEMORY_HOST) {
    /* the tag from the bounce slot, the data straight from the caller */
    weft_status st = ibv_mr_cache_get(&ctx->mr, src, bytes, &zc);
    if (st < 0)
      return ibv_conn_fail(c, st,
                           "ibv: registering %zu bytes at %p for peer %d "
                           "failed (ulimit -l?)",
                           bytes, src, c->peer);
    if (zc)
      sge[nsge++] =
          (struct ibv_sge){.addr = (uintptr_t)src, .length = (uint32_t)bytes, .lkey = zc->mr->lkey};
  }
  if (!zc) {
    if (bytes) mem->copy(bounce + IBV_TAG_BYTES, src, bytes);
    sge[0].length += (uint32_t)bytes;
  }
  c->zc[slot] = zc;
  struct ibv_send_wr wr = {.wr_id = IBV_WR_DATA_KIND,
                           .sg_list = sge,
                           .num_sge = nsge,
                           .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                           .imm_data = htonl(k)};
  wr.wr.rdma.remote_addr = c->r_slots + (uint64_t)slot * ctx->stride;
  wr.wr.rdma.rkey = c->r_slots_rkey;
  WEFT_CHECK(ibv_post_write(c, (int)(k % (uint32_t)ctx->nqp), &wr, false));
  if (zc) c->zc_pending++;
  c->tx_head++;
  uint32_t in_flight = c->tx_head - (uint32_t)c->ctrl->credits;
  if (in_flight > c->max_in_flight) c->max_in_flight = in_flight;
  return WEFT_OK;
}

/* Complete means the NIC is done with every posted write: the caller may
 * then destroy the communicator without cutting a write short. A queue whose
 * last requests were unsignaled gets a signaled empty write behind them (a
 * QP completes in order), so their completion becomes visible. */
weft_status ibv_send_idle(weft_tp_conn *conn) {
  ibv_conn *c = ibv_conn_of(conn);
  if (c->state == IBV_CONN_DEAD) return c->dead_status;
  if (c->state != IBV_CONN_UP && c->state != IBV_CONN_AWAIT_READY) return WEFT_OK;
  WEFT_CHECK(ibv_conn_usable(c, false));
  bool busy = false;
  for (int q = 0; q < c->ctx->nqp; q++) {
    ibv_conn_qp *qs = &c->qps[q];
    if (qs->sq_used == 0) continue;
    busy = true;
    if (qs->unsignaled == 0) continue; /* a signaled one is on its way */
    struct ibv_send_wr wr = {
        .wr_id = 0, .sg_list = NULL, .num_sge = 0, .opcode = IBV_WR_RDMA_WRITE};
    wr.wr.rdma.remote_addr = c->r_credit;
    wr.wr.rdma.rkey = c->r_credit_rkey;
    weft_status st = ibv_post_write(c, q, &wr, true);
    if (st < 0) return st;
  }
  if (!busy) {
    if (c->zc_pending) ibv_zc_reap(c, true);
    return WEFT_OK;
  }
  WEFT_CHECK(ibv_conn_usable(c, true));
  return WEFT_AGAIN;
}

/* The device channel: the chunk at rx_tail made visible to the GPU, where
 * it lies in GPU memory: flushed (GPUDirect) or copied up (staged). */
static weft_status ibv_device_visible(ibv_conn *c, size_t bytes, const void **data) {
  ibv_ctx *ctx = c->ctx;
  uint32_t slot = c->rx_tail % (uint32_t)ctx->nslots;
  if (c->rx_dev) {
    if (c->flush_qp && (int32_t)(c->rx_tail - c->flushed) >= 0) {
      if (!c->flush_posted) {
        /* one read flushes every write that landed before it: all the
         * chunks that have arrived in order from here */
        uint32_t upto = c->rx_tail;
        while (upto - c->rx_tail < (uint32_t)ctx->nslots && c->slot_full[upto % (uint32_t)ctx->nslots])
          upto++;
        struct ibv_sge sge = {.addr = (uintptr_t)c->flush_word,
                              .length = sizeof *c->flush_word,
                              .lkey = c->flush_mr->lkey};
        struct ibv_send_wr wr = {.wr_id = IBV_WR_FLUSH_KIND,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_READ,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)c->rx_dev + (uint64_t)slot * ctx->stride;
        wr.wr.rdma.rkey = c->rx_gdr->mr->rkey;
        int rc = ctx->api->post_send(c->flush_qp, &wr, &bad);
        if (rc)
          return ibv_conn_fail(c, WEFT_ERR_SYSTEM, "ibv: the flush read for peer %d: %s", c->peer,
                               strerror(rc));
        c->flush_upto = upto;
        c->flush_posted = true;
      }
      WEFT_CHECK(ibv_conn_usable(c, false));
      if ((int32_t)(c->rx_tail - c->flushed) >= 0) return WEFT_AGAIN;
    }
    *data = c->rx_dev + (size_t)slot * ctx->stride;
    return WEFT_OK;
  }
  const weft_mem_ops *dev = ibv_dev_mem();
  char *up = c->rx_mirror + (size_t)slot * ctx->stride;
  if (!c->up_done) {
    if (!c->up_busy) {
      weft_status st = dev->copy_from_host(up, c->rx_buf + (size_t)slot * ctx->stride, bytes,
                                           ctx->args->device_stream, &c->up_token);
      if (st < 0)
        return ibv_conn_fail(c, st, "ibv: copying a chunk from peer %d up to device %d: %s",
                             c->peer, ctx->args->device, ctx->args->errors->msg);
      c->up_busy = true;
    }
    weft_status st = dev->poll(ctx->args->device_stream, c->up_token);
    if (st == WEFT_AGAIN) return WEFT_AGAIN;
    if (st < 0)
      return ibv_conn_fail(c, st, "ibv: copying a chunk from peer %d up to device %d: %s", c->peer,
                           ctx->args->device, ctx->args->errors->msg);
    c->up_busy = false;
    c->up_done = true;
  }
  *data = up;
  return WEFT_OK;
}

static weft_status ibv_peek(ibv_conn *c, weft_tag tag, size_t bytes, const void **data) {
  ibv_ctx *ctx = c->ctx;
  if (bytes > ctx->args->chunk_bytes) return WEFT_ERR_INVALID;
  uint32_t slot = c->rx_tail % (uint32_t)ctx->nslots;
  /* the device channel's tags lie apart from its chunks, in host memory */
  char *p = c->device ? (char *)c->rx_tags + (size_t)slot * IBV_TAG_BYTES
                      : c->rx_buf + (size_t)slot * ctx->stride;
  if (!c->peeked) {
    if (!c->slot_full[slot]) WEFT_CHECK(ibv_conn_usable(c, false));
    if (!c->slot_full[slot]) WEFT_CHECK(ibv_conn_usable(c, true));
    if (!c->slot_full[slot]) {
      if (c->peer_ended)
        return ibv_conn_fail(c, WEFT_ERR_PEER_LOST,
                             "peer %d (%s) ended or crashed while this "
                             "rank waited for data",
                             c->peer, c->where);
      return WEFT_AGAIN;
    }
    uint32_t head[4]; /* {seq, sig, len, 0}: ibv_send */
    memcpy(head, p, sizeof head);
    weft_error_sink *sink = ctx->args->errors;
    size_t carried = c->slot_len[slot] - (c->device ? 0 : IBV_TAG_BYTES);
    if (weft_chunk_check(sink, c->peer, weft_tag_make(head[0], head[1]), tag, head[2], bytes))
      return ibv_conn_fail(c, WEFT_ERR_MISMATCH, "%s", sink->msg);
    if (carried != head[2])
      return ibv_conn_fail(c, WEFT_ERR_PROTOCOL,
                           "ibv: peer %d's chunk says %u bytes but the "
                           "write carried %zu",
                           c->peer, head[2], carried);
    c->peeked = true;
  }
  if (c->device) return ibv_device_visible(c, bytes, data);
  *data = p + IBV_TAG_BYTES;
  return WEFT_OK;
}

weft_status ibv_recv_peek(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data) {
  return ibv_peek(ibv_conn_of(conn), tag, bytes, data);
}

static weft_status ibv_release(ibv_conn *c) {
  if (!c->peeked) return c->state == IBV_CONN_DEAD ? c->dead_status : WEFT_ERR_INTERNAL;
  c->peeked = false;
  c->up_done = false;
  c->slot_full[c->rx_tail % (uint32_t)c->ctx->nslots] = 0;
  /* the receive for the chunk that will reuse this slot, then the credit:
   * the peer cannot write before it sees the credit */
  WEFT_CHECK(ibv_post_recv_for(c, c->rx_tail + (uint32_t)c->ctx->nslots));
  c->rx_tail++;
  return ibv_send_credit(c);
}

weft_status ibv_recv_release(weft_tp_conn *conn) {
  return ibv_release(ibv_conn_of(conn));
}

static weft_status ibv_recv_into(weft_tp_conn *conn, weft_tag tag, size_t bytes, void *dst,
                                 const struct weft_mem_ops *mem) {
  ibv_conn *c = ibv_conn_of(conn);
  const void *slot = NULL;
  if (c->device) {
    /* copied on the channel's stream; the slot goes back once it is done */
    ibv_ctx *ctx = c->ctx;
    const weft_mem_ops *dev = ibv_dev_mem();
    if (!c->out_busy) {
      WEFT_STATUS_PASS(ibv_peek(c, tag, bytes, &slot));
      weft_status st = dev->copy_async(dst, slot, bytes, ctx->args->device_stream, &c->out_token);
      if (st < 0)
        return ibv_conn_fail(c, st, "ibv: copying a chunk from peer %d on device %d: %s", c->peer,
                             ctx->args->device, ctx->args->errors->msg);
      c->out_busy = true;
    }
    weft_status st = dev->poll(ctx->args->device_stream, c->out_token);
    if (st == WEFT_AGAIN) return WEFT_AGAIN;
    c->out_busy = false;
    if (st < 0)
      return ibv_conn_fail(c, st, "ibv: copying a chunk from peer %d on device %d: %s", c->peer,
                           ctx->args->device, ctx->args->errors->msg);
    return ibv_release(c);
  }
  WEFT_STATUS_PASS(ibv_peek(c, tag, bytes, &slot));
  if (bytes) mem->copy(dst, slot, bytes);
  return ibv_release(c);
}

weft_status ibv_recv(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks) {
  return weft_tp_recv_first(ibv_recv_into, conn, tag, chunk_bytes, bytes, dst, mem, chunks);
}
