/* ibv.h - the RDMA verbs transport's private types. Between two ranks, per
 * channel: one side socket (the lower rank dials, to the one listener) that carries the queue-pair handshake,
 * failure notices and end-of-process, and `nqp` RC queue pairs that carry the
 * data. A chunk is an RDMA write with immediate from the sender's registered
 * bounce slot into the receiver's registered slot k % nslots; the immediate
 * value is k, so slots may fill out of order across queue pairs. The receiver
 * pre-posts one receive per free slot and returns credits by RDMA-writing its
 * release count into the sender's credit word. */
#ifndef WEFT_IBV_H
#define WEFT_IBV_H

#include <stdbool.h>
#include <stdint.h>

#include "ibv_api.h"
#include "src/base/auth.h"
#include "src/base/net.h"
#include "src/topo/select.h"
#include "transports/transport.h"

#define IBV_MAX_QPS 8
#define IBV_MAX_SLOTS 64
#define IBV_SLOTS 8 /* receive slots per connection: the send depth (transport.h) */
#define IBV_TAG_BYTES 16 /* {seq, sig, len, 0} before each chunk in a slot (call_tag.h) */
#define IBV_ABORT_TEXT 300
#define IBV_HELLO_BYTES (sizeof(ibv_qp_info) + WEFT_AUTH_MAC_BYTES) /* a side's info, proven */

/* The registration cache (ibv_mr.c) for zero-copy sends from user memory. */
#define IBV_MR_MAX_ENTRIES 256
typedef struct ibv_mr_entry {
  uintptr_t start, end; /* page-aligned */
  struct ibv_mr *mr;    /* NULL: a free entry */
  int refs;             /* posted writes reading from it */
  uint64_t last_use;
  bool stale; /* its pages went away while in use: dropped at release */
} ibv_mr_entry;

typedef struct ibv_mr_cache {
  const ibv_api *api;
  struct ibv_pd *pd;
  size_t bytes, max_bytes;
  uint64_t clock, hits, misses, invalidations;
  ibv_mr_entry e[IBV_MR_MAX_ENTRIES];
} ibv_mr_cache;

weft_status ibv_mr_cache_get(ibv_mr_cache *cache, const void *addr, size_t len, ibv_mr_entry **out);
void ibv_mr_cache_put(ibv_mr_cache *cache, ibv_mr_entry *e);
void ibv_mr_cache_invalidate(ibv_mr_cache *cache, const void *addr, size_t len);
void ibv_mr_cache_fini(ibv_mr_cache *cache);

/* GPUDirect RDMA (ibv_gdr.c): registrations of device allocations, kept
 * per buffer ID. */
#define IBV_GDR_ENTRIES 256
typedef struct ibv_gdr_entry {
  uint64_t buffer_id; /* the driver's, never reused for another allocation */
  uintptr_t base;     /* the allocation (the MR covers all of it) */
  size_t bytes;
  struct ibv_mr *mr; /* NULL: a free entry */
  int refs;          /* posted writes and connections using it */
  uint64_t last_use;
} ibv_gdr_entry;

typedef struct ibv_gdr {
  const ibv_api *api;
  struct ibv_pd *pd;
  int device;    /* the GPU decided for (-1: none seen yet) */
  int mode;      /* enum ibv_gdr_choice: DMABUF, PEERMEM or OFF */
  char why[300]; /* the choice in words */
  bool warned;   /* a refusal was said at WARN once */
  size_t bytes;  /* registered */
  int live;      /* entries holding a registration */
  uint64_t clock, hits, misses, refused;
  ibv_gdr_entry e[IBV_GDR_ENTRIES];
} ibv_gdr;

/* The way to register device `device`'s memory here, as a choice of
 * WEFT_IB_GDR's words (never AUTO), with the reason in `why`. */
int ibv_gdr_choose(const ibv_api *api, int device, char *why, size_t why_len);
void ibv_gdr_init(ibv_gdr *g, const ibv_api *api, struct ibv_pd *pd);
/* The registration of the allocation holding [buf, buf + bytes), made or
 * found, with a reference for the caller (ibv_gdr_put). WEFT_ERR_UNSUPPORTED
 * when it is not device memory or cannot be registered (the caller stages;
 * the refusal is said once per context). */
weft_status ibv_gdr_get(ibv_gdr *g, const void *buf, size_t bytes, ibv_gdr_entry **out);
void ibv_gdr_put(ibv_gdr *g, ibv_gdr_entry *e);
/* Drops unused registrations overlapping [buf, buf + bytes) (the memory is
 * about to be freed). */
void ibv_gdr_forget(ibv_gdr *g, const void *buf, size_t bytes);
void ibv_gdr_fini(ibv_gdr *g);

/* What a rank publishes (packed into the rendezvous). */
typedef struct ibv_addr {
  uint32_t magic;
  uint8_t link_layer;  /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
  uint8_t loopback_ok; /* WEFT_TRANSPORT=ibv: same-host peers go through the NIC too */
  uint8_t device_channel; /* WEFT_IB_GDR is not off: device chunks on WEFT_TP_CHANNEL_DEVICE */
  uint8_t reserved;
  weft_place place;              /* rdma_devices: usable ports found through the verbs table */
  uint8_t sock[NET_ADDR_PACKED]; /* the side socket's listener */
} ibv_addr;

/* One side's queue pairs and buffers, sent over the side socket. Integers
 * in network byte order. */
typedef struct ibv_qp_info {
  uint32_t magic, from, to, nqp;
  uint32_t channel; /* < WEFT_TP_CHANNELS */
  uint32_t comm_hi, comm_lo;
  uint32_t lid, link_layer, mtu, nslots;
  uint8_t gid[16];
  uint32_t qpn[IBV_MAX_QPS];
  uint32_t psn, stride;
  uint64_t slots_addr, credit_addr;
  uint32_t slots_rkey, credit_rkey;
  uint64_t tags_addr; /* the device channel: where the chunks' tags go (host memory) */
  uint32_t tags_rkey;
  uint32_t gdr; /* the device channel: 1 when the slots are GPU memory the NIC writes */
} ibv_qp_info;

/* Memory the peer writes into: the receive slots are separate; this is the
 * word it returns credits through, and the word our credits are sent from. */
typedef struct ibv_ctrl {
  volatile uint64_t credits; /* chunks the peer has released (peer writes) */
  uint64_t credit_src;       /* our release count, sent inline */
} ibv_ctrl;

typedef struct ibv_conn_qp {
  struct ibv_qp *qp;
  int sq_used;    /* posted send WRs not yet reaped through a signaled completion */
  int unsignaled; /* WRs posted since the last signaled one */
} ibv_conn_qp;

enum ibv_conn_state {
  IBV_CONN_AWAIT_HELLO, /* acceptor: the lower rank has not dialed yet */
  IBV_CONN_AWAIT_INFO,  /* dialer: hello sent, waiting for the acceptor's queue pairs */
  IBV_CONN_AWAIT_READY, /* acceptor: ours are RTS; the dialer's may not be RTR yet */
  IBV_CONN_UP,
  IBV_CONN_DEAD
};

typedef struct ibv_ctx ibv_ctx;
typedef struct ibv_conn ibv_conn;

/* A side socket the listener accepted whose hello has not all come: read
 * a little in each progress, refused once `deadline` passes. */
typedef struct ibv_incoming {
  int fd; /* -1: a free entry */
  double deadline;
  size_t got;
  uint8_t msg[IBV_HELLO_BYTES];
} ibv_incoming;

struct ibv_conn {
  ibv_ctx *ctx;
  int peer;
  int channel;
  int fd; /* side socket, -1 until connected */
  enum ibv_conn_state state;
  weft_status dead_status;
  bool peer_ended;      /* its side socket closed: what it wrote is still read */
  bool abort_sent;      /* our failure notice went out */
  bool peer_said_abort; /* it failed first and told us */
  bool alive_before;    /* scratch for progress: not dead when it started */
  char where[80];
  uint8_t rbuf[IBV_HELLO_BYTES + IBV_ABORT_TEXT]; /* partial reads */
  size_t rgot;
  /* The side socket's writes never wait (transport.h): what the socket did
   * not take yet waits here, in order, for later calls (ibv_side_flush).
   * At most our info, the dialer's READY and a failure notice. */
  bool dialing; /* the side socket's connect has not completed */
  uint8_t wbuf[IBV_HELLO_BYTES + 8 + 8 + IBV_ABORT_TEXT];
  size_t wlen, wsent;

  struct ibv_cq *cq;
  ibv_conn_qp qps[IBV_MAX_QPS];
  uint32_t psn;
  char *rx_buf, *tx_buf;
  ibv_ctrl *ctrl;
  struct ibv_mr *rx_mr, *tx_mr, *ctrl_mr;

  uint64_t r_slots, r_credit; /* the peer's */
  uint32_t r_slots_rkey, r_credit_rkey;

  uint32_t tx_head;  /* chunks posted */
  uint32_t rx_tail;  /* chunks released */
  bool credit_dirty; /* a credit update is owed to the peer (the SQ was full) */
  bool peeked;
  uint8_t slot_full[IBV_MAX_SLOTS];
  uint32_t slot_len[IBV_MAX_SLOTS]; /* bytes the write carried, tag included */
  uint32_t max_in_flight;           /* most chunks this rank had posted and not released */
  ibv_mr_entry *zc[IBV_MAX_SLOTS];  /* the user region chunk k was written from, or NULL */
  ibv_gdr_entry *gz[IBV_MAX_SLOTS]; /* the device allocation chunk k was written from, or NULL */
  uint32_t zc_tail;                 /* oldest chunk whose region reference may still be held */
  uint32_t zc_pending;              /* chunks holding a region reference */

  /* WEFT_TP_CHANNEL_DEVICE (ibv_conn.c, "the device channel") */
  bool device;       /* this connection carries device chunks */
  bool set_up;       /* its GPU memory is made (the init args named the GPU) */
  bool hello_held;   /* the peer's hello came first: answered once set up */
  bool dial_held;    /* we dial, once set up, to dial_addr */
  struct sockaddr_storage dial_addr;
  socklen_t dial_len;
  uint8_t held[IBV_HELLO_BYTES];
  char *rx_dev;      /* the GPU ring the NIC writes (GPUDirect), or NULL: ... */
  char *rx_mirror;   /* ... chunks land in rx_buf and are copied up into this GPU ring */
  ibv_gdr_entry *rx_gdr;
  uint8_t *rx_tags;  /* host: chunk k's tag {seq, sig, len, 0} at k % nslots */
  struct ibv_mr *tags_mr;
  uint64_t r_tags;
  uint32_t r_tags_rkey;
  bool r_gdr;        /* the peer's slots are GPU memory */
  struct ibv_qp *flush_qp; /* loopback: its RDMA read makes the NIC's writes visible */
  struct ibv_mr *flush_mr;
  uint64_t *flush_word;
  uint32_t flushed;    /* chunks before this one are visible to the GPU */
  uint32_t flush_upto; /* what the posted flush makes visible */
  bool flush_posted;
  bool up_busy, up_done; /* the chunk at rx_tail: copied up into rx_mirror */
  weft_mem_token up_token;
  bool out_busy;         /* recv: the chunk at rx_tail copied into the caller's buffer */
  weft_mem_token out_token;
  uint64_t staged_sends; /* chunks whose source could not be registered: copied down first */
};

struct ibv_ctx {
  const weft_transport_init_args *args;
  const struct weft_mem_ops *slot_mem; /* where slot rings come from (init args) */
  const ibv_api *api;
  struct ibv_context *dev;
  struct ibv_pd *pd;
  char dev_name[64];
  uint8_t port;
  uint8_t link_layer;
  enum ibv_mtu mtu;
  uint16_t lid;
  int gid_index;
  union ibv_gid gid;
  uint32_t max_inline;
  int nqp, nslots;
  size_t stride; /* slot size: tag + chunk_bytes, rounded to 64 */
  int listen_fd;
  struct sockaddr_storage addr;
  socklen_t addr_len;
  ibv_addr self;
  ibv_conn **conns; /* by ibv_conn_index(peer, channel) */
  int not_up;               /* conns still handshaking */
  ibv_incoming *incoming;   /* size * WEFT_TP_CHANNELS: hellos on their way */
  int nincoming;            /* its entries in use */
  struct pollfd *pfds;      /* 2 * size * WEFT_TP_CHANNELS + 3 */
  bool moved;               /* a data call completed something since the last progress */
  size_t zcopy_bytes;       /* chunks at least this long go from user memory; 0 = never */
  ibv_mr_cache mr;
  ibv_gdr gdr; /* device memory's registrations (ibv_gdr.c) */
};

static inline int ibv_conn_index(int peer, int channel) {
  return peer * WEFT_TP_CHANNELS + channel;
}
/* The contract's opaque handles are these (transport.h). */
static inline ibv_conn *ibv_conn_of(weft_tp_conn *c) {
  return (ibv_conn *)c;
}
static inline ibv_ctx *ibv_ctx_of(weft_tp_ctx *c) {
  return (ibv_ctx *)c;
}

/* ibv_transport.c */
bool ibv_hca_match(const char *rules, const char *dev, int port);
int ibv_gid_score(const union ibv_gid *gid, int roce_version);

/* ibv_conn.c */
weft_status ibv_conn_create(ibv_ctx *ctx, int peer, int channel, ibv_conn **out);
weft_status ibv_conn_dial(ibv_conn *c, const struct sockaddr_storage *addr, socklen_t len);
weft_status ibv_conn_accept(ibv_ctx *ctx, bool *progressed);
bool ibv_side_owes(const ibv_conn *c); /* bytes wait to go out (or the connect to complete) */
/* Sends what a connection's side socket owes as far as it goes now, a
 * failure only logged: a failure notice, also on a dead connection. */
void ibv_conn_send_owed(ibv_conn *c);
weft_status ibv_conn_poll(ibv_conn *c, bool *progressed);
weft_status ibv_conn_take_late_notice(ibv_conn *c);
weft_status ibv_conn_fail(ibv_conn *c, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ibv_conn_notify_abort(ibv_conn *c, const char *reason);
void ibv_conn_destroy(ibv_conn *c);

/* the table's data members */
weft_status ibv_send_ready(weft_tp_conn *conn);
weft_status ibv_send(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                     const struct weft_mem_ops *mem, unsigned flags);
weft_status ibv_send_idle(weft_tp_conn *conn);
weft_status ibv_recv_peek(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data);
weft_status ibv_recv_release(weft_tp_conn *conn);
weft_status ibv_recv(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks);

#endif
