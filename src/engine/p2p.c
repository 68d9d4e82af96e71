/* p2p.c - weft_send / weft_recv and their non-blocking forms, on the lane:
 * channel WEFT_TP_CHANNEL_P2P of the communicator's own connections (p2p.h
 * says why a lane, and what a message looks like on the wire).
 *
 * Per peer, sends go out one message at a time in issue order; incoming
 * messages are taken in arrival order, and each is matched, at its header,
 * to the oldest posted receive with its tag, or kept as unexpected. A
 * receive posted later takes the oldest unexpected message with its tag, so
 * messages with one tag are never overtaken by each other. Incoming data is
 * only pulled from a peer while a receive from it is posted: a peer that
 * sends what nobody receives fills its own credits and waits, bounded by
 * the timeout like everything else. */
#include "src/engine/p2p.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/coll/coll_device.h"
#include "src/engine/engine.h"
#include "src/mem/mem.h"
#include "src/base/status.h"

#define HEADER_MAGIC 0x57503250u      /* "WP2P" */
#define HEADER_MAGIC_LENT 0x4c503250u /* "WP2L": a device buffer lent over CUDA IPC; its
                                         descriptor (a weft_mem_desc) is the only chunk after */

struct weft_p2p_unexpected {
  weft_p2p_unexpected *next;
  int tag;
  weft_dtype dtype;
  size_t bytes;
  bool complete;
  weft_request *taker; /* a receive matched while the data still arrives */
  unsigned char data[];
};

typedef struct p2p_peer {
  weft_request *sends, *sends_tail; /* in issue order; the head is on the wire */
  weft_request *recvs, *recvs_tail; /* posted and not matched yet, in post order */
  uint32_t sent_msgs, recvd_msgs;   /* messages started each way: their chunk tag */
  /* the incoming message being received */
  bool in_busy;
  int in_tag;
  weft_dtype in_dtype;
  size_t in_bytes, in_moved;
  bool in_lent; /* its data is in the sender's device buffer, described in the next chunk */
  weft_request *in_req; /* its receive, or NULL: into in_ux */
  weft_p2p_unexpected *in_ux;
  weft_p2p_unexpected *ux, *ux_tail; /* unexpected messages, in arrival order */
} p2p_peer;

struct weft_p2p_lane {
  p2p_peer *peers;
  weft_request *posted, *posted_tail; /* handed over by weft_p2p_post (q_lock) */
  atomic_int outstanding;             /* posted and not complete */
  int waiting_peer;
  const char *waiting_for;
  /* the lane's own failure (p2p.h), sticky, and its sentence: the
   * communicator's last_error may be overwritten by a later collective's */
  weft_status failed;
  char last_error[768];
  /* the lane's timeout, apart from the collectives': its chunks moved
   * (events), the driver's reading when they last did, and `restart`: the
   * lane went from idle to busy (set under q_lock by a poster), so its
   * clock starts again at the next reading */
  uint64_t events, events_seen;
  double last_moved;
  atomic_bool restart;
};

weft_status weft_p2p_lane_create(weft_core *comm) {
  weft_p2p_lane *l = calloc(1, sizeof *l);
  if (!l) return WEFT_ERR_NOMEM;
  l->peers = calloc((size_t)comm->size, sizeof *l->peers);
  if (!l->peers) {
    free(l);
    return WEFT_ERR_NOMEM;
  }
  l->waiting_peer = -1;
  comm->engine->lane = l;
  return WEFT_OK;
}

static void ux_free_list(weft_p2p_unexpected *u) {
  while (u) {
    weft_p2p_unexpected *next = u->next;
    free(u);
    u = next;
  }
}

void weft_p2p_lane_free(weft_core *comm) {
  weft_p2p_lane *l = comm->engine ? comm->engine->lane : NULL;
  if (!l) return;
  for (int p = 0; p < comm->size; p++) ux_free_list(l->peers[p].ux);
  free(l->peers);
  free(l);
  comm->engine->lane = NULL;
}

static void complete(weft_core *comm, weft_request *r, weft_status st) {
  atomic_fetch_sub(&comm->engine->lane->outstanding, 1);
  weft_coll_device_msg_end(comm, r->p2p.dev); /* a device buffer's staging block goes back */
  r->p2p.dev = NULL;
  weft_request_complete(r, st);
}

/* A receive whose data is all in its buffer: a device buffer's staged copy
 * goes back to it first (waited for: the receive completes with it there). */
static void recv_complete(weft_core *comm, weft_request *r) {
  weft_status st = r->p2p.dev ? weft_coll_device_msg_finish(comm, r->p2p.call, r->p2p.dev) : WEFT_OK;
  complete(comm, r, st);
}

/* A failure of the lane worded by p2p itself (a mismatch, a malformed
 * header, no memory, the lane's timeout): the lane fails alone (p2p.h), its
 * sentence on the communicator (weft_last_error) and kept for later calls.
 * The transports are not aborted: their other channel carries the
 * collectives, which go on. Returns st. */
static weft_status lane_fail(weft_core *comm, weft_status st, const char *call, const char *fmt,
                             ...) __attribute__((format(printf, 4, 5)));
static weft_status lane_fail(weft_core *comm, weft_status st, const char *call, const char *fmt,
                             ...) {
  weft_p2p_lane *l = comm->engine->lane;
  if (l->failed) return st; /* the first cause stays */
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  weft_core_error(comm, st, call, "%s", what);
  memcpy(l->last_error, comm->fail.last_error, sizeof l->last_error);
  l->failed = st;
  return st;
}

static void append(weft_request **head, weft_request **tail, weft_request *r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static weft_status check_match(weft_core *comm, const weft_request *r, int peer, int tag,
                               weft_dtype dtype, size_t bytes) {
  const weft_p2p_op *o = &r->p2p;
  if (o->bytes == bytes && o->dtype == dtype) return WEFT_OK;
  return lane_fail(comm, WEFT_ERR_MISMATCH, "weft_recv",
                   "the message from peer %d with tag %d is %zu bytes of %s, but the receive "
                   "posted for it expects %zu elements of %s (%zu bytes)",
                   peer, tag, bytes, weft_dtype_name(dtype), o->count, weft_dtype_name(o->dtype),
                   o->bytes);
}

/* Data of a complete unexpected message into the receive that takes it. */
static weft_status ux_deliver(weft_core *comm, p2p_peer *pp, weft_p2p_unexpected *u,
                              weft_request *r) {
  if (u->bytes) weft_mem_for(r->p2p.recv_buf)->copy(r->p2p.recv_buf, u->data, u->bytes);
  weft_p2p_unexpected **at = &pp->ux, *prev = NULL;
  while (*at != u) {
    prev = *at;
    at = &(*at)->next;
  }
  *at = u->next;
  if (pp->ux_tail == u) pp->ux_tail = prev;
  free(u);
  recv_complete(comm, r);
  return WEFT_OK;
}

/* A new receive: the oldest unexpected message with its tag, else it waits. */
static weft_status post_recv(weft_core *comm, weft_request *r) {
  p2p_peer *pp = &comm->engine->lane->peers[r->p2p.peer];
  for (weft_p2p_unexpected *u = pp->ux; u; u = u->next) {
    if (u->tag != r->p2p.tag || u->taker) continue;
    WEFT_CHECK(check_match(comm, r, r->p2p.peer, u->tag, u->dtype, u->bytes));
    if (u->complete) return ux_deliver(comm, pp, u, r);
    u->taker = r; /* still arriving: delivered when complete */
    return WEFT_OK;
  }
  append(&pp->recvs, &pp->recvs_tail, r);
  return WEFT_OK;
}

/* A send to this rank itself: straight into a posted receive, or kept. */
static weft_status post_self_send(weft_core *comm, weft_request *r) {
  p2p_peer *pp = &comm->engine->lane->peers[comm->rank];
  const weft_p2p_op *o = &r->p2p;
  weft_request **at = &pp->recvs, *prev = NULL;
  for (; *at; prev = *at, at = &(*at)->next) {
    weft_request *rr = *at;
    if (rr->p2p.tag != o->tag) continue;
    WEFT_CHECK(check_match(comm, rr, comm->rank, o->tag, o->dtype, o->bytes));
    *at = rr->next;
    if (pp->recvs_tail == rr) pp->recvs_tail = prev;
    if (o->bytes) weft_mem_for(rr->p2p.recv_buf)->copy(rr->p2p.recv_buf, o->send_buf, o->bytes);
    recv_complete(comm, rr);
    complete(comm, r, WEFT_OK);
    return WEFT_OK;
  }
  weft_p2p_unexpected *u = malloc(sizeof *u + o->bytes);
  if (!u) return lane_fail(comm, WEFT_ERR_NOMEM, o->call, "no memory to keep a message to self");
  *u = (weft_p2p_unexpected){.tag = o->tag, .dtype = o->dtype, .bytes = o->bytes, .complete = true};
  if (o->bytes) weft_mem_for(o->send_buf)->copy(u->data, o->send_buf, o->bytes);
  if (pp->ux_tail)
    pp->ux_tail->next = u;
  else
    pp->ux = u;
  pp->ux_tail = u;
  complete(comm, r, WEFT_OK);
  return WEFT_OK;
}

static weft_status take_posted(weft_core *comm) {
  weft_p2p_lane *l = comm->engine->lane;
  pthread_mutex_lock(&comm->engine->q_lock);
  weft_request *r = l->posted;
  l->posted = l->posted_tail = NULL;
  pthread_mutex_unlock(&comm->engine->q_lock);
  weft_status st = WEFT_OK;
  while (r) {
    weft_request *next = r->next;
    if (st < 0) {
      complete(comm, r, st);
    } else if (r->kind == WEFT_REQ_RECV) {
      st = post_recv(comm, r);
      if (st < 0) complete(comm, r, st);
    } else if (r->p2p.peer == comm->rank) {
      st = post_self_send(comm, r);
      if (st < 0) complete(comm, r, st);
    } else {
      p2p_peer *pp = &l->peers[r->p2p.peer];
      append(&pp->sends, &pp->sends_tail, r);
    }
    r = next;
  }
  return st;
}

/* ---- the lane's connections -------------------------------------------------
 * Everything p2p takes from the communicator's transports is in this
 * section: the connection to a peer on channel WEFT_TP_CHANNEL_P2P of the
 * transport the peer table chose for it (made on first use, at the address
 * the peer published once for every channel), and the chunk operations on
 * it, each chunk tagged with the message's number on that pair and
 * direction. Progress counts in comm->links.events (the driver's sign that
 * something moved) and in the lane's own events (its timeout). */

static weft_status lane_conn(weft_core *comm, int peer, const weft_transport **ops,
                             weft_tp_conn **conn) {
  WEFT_CHECK(weft_peer_table_conn(&comm->links, peer, WEFT_TP_CHANNEL_P2P, conn));
  *ops = comm->links.tps[comm->links.peers[peer].tp].ops;
  return WEFT_OK;
}

static void lane_moved(weft_core *comm) {
  comm->links.events++;
  comm->engine->lane->events++;
}

/* Sends one chunk of message `msg` once there is room. */
static weft_status lane_send(weft_core *comm, int peer, uint32_t msg, const void *src, size_t bytes,
                             const weft_mem_ops *mem) {
  const weft_transport *ops;
  weft_tp_conn *c;
  WEFT_CHECK(lane_conn(comm, peer, &ops, &c));
  WEFT_STATUS_PASS(ops->send_ready(c));
  weft_status st = ops->send(c, src, bytes, msg, mem, 0);
  if (st == WEFT_OK) lane_moved(comm);
  return st;
}

/* WEFT_OK once every chunk sent to `peer` is out (the buffer may be reused). */
static weft_status lane_send_idle(weft_core *comm, int peer) {
  const weft_transport *ops;
  weft_tp_conn *c;
  WEFT_CHECK(lane_conn(comm, peer, &ops, &c));
  return ops->send_idle(c);
}

/* WEFT_OK once the peer released every chunk sent to it (a lent buffer's
 * descriptor: after its copy out of the buffer). */
static weft_status lane_send_released(weft_core *comm, int peer) {
  const weft_transport *ops;
  weft_tp_conn *c;
  WEFT_CHECK(lane_conn(comm, peer, &ops, &c));
  if (!ops->send_released) return WEFT_ERR_INTERNAL; /* lendable() asked for it */
  return ops->send_released(c);
}

/* The chunk after a lent message's header: the sender's device buffer,
 * mapped over CUDA IPC, copied into the receive (its device buffer, or host
 * memory: a host receive, an unexpected message's buffer), the mapping
 * closed, and only then the chunk released (the sender waits for that). */
static weft_status take_lent(weft_core *comm, int peer, p2p_peer *pp) {
  const weft_transport *ops;
  weft_tp_conn *c;
  WEFT_CHECK(lane_conn(comm, peer, &ops, &c));
  const void *slot;
  WEFT_STATUS_PASS(ops->recv_peek(c, pp->recvd_msgs, sizeof(weft_mem_desc), &slot));
  weft_mem_desc desc;
  memcpy(&desc, slot, sizeof desc);
  void *local = NULL;
  weft_status st = desc.len == pp->in_bytes ? ops->map_peer_mem(c, &desc, &local) : WEFT_ERR_PROTOCOL;
  if (st)
    return lane_fail(comm, st < 0 ? st : WEFT_ERR_PROTOCOL, "weft_recv",
                     "peer %d lent a device buffer of %zu bytes over CUDA IPC (message #%u), which this rank "
                     "cannot map: %s (WEFT_CUDA_IPC=0 on every rank stages messages instead)",
                     peer, pp->in_bytes, pp->recvd_msgs, comm->links.sink.msg);
  weft_request *r = pp->in_req;
  if (pp->in_bytes)
    st = r && r->p2p.dev ? weft_coll_device_msg_take(comm, "weft_recv", r->p2p.dev, NULL, local, pp->in_bytes)
                         : weft_coll_device_msg_take(comm, "weft_recv", NULL, r ? r->p2p.recv_buf : pp->in_ux->data,
                                                     local, pp->in_bytes);
  ops->release_peer_mem(c, false); /* before the release: the sender may free it then */
  if (st) return lane_fail(comm, st, "weft_recv", "%s", comm->fail.last_error);
  st = ops->recv_release(c);
  if (st == WEFT_OK) lane_moved(comm);
  return st;
}

/* Copies the next chunk of message `msg` (`bytes` long) out of the link. */
static weft_status lane_recv_copy(weft_core *comm, int peer, uint32_t msg, size_t bytes,
                                  void *dst) {
  const weft_transport *ops;
  weft_tp_conn *c;
  WEFT_CHECK(lane_conn(comm, peer, &ops, &c));
  const void *slot;
  WEFT_STATUS_PASS(ops->recv_peek(c, msg, bytes, &slot));
  memcpy(dst, slot, bytes);
  weft_status st = ops->recv_release(c);
  if (st == WEFT_OK) lane_moved(comm);
  return st;
}

/* Receives the next chunk of message `msg` straight into `dst`. */
static weft_status lane_recv_into(weft_core *comm, int peer, uint32_t msg, size_t bytes, void *dst,
                                  const weft_mem_ops *mem) {
  const weft_transport *ops;
  weft_tp_conn *c;
  WEFT_CHECK(lane_conn(comm, peer, &ops, &c));
  size_t chunks;
  weft_status st = ops->recv(c, msg, bytes, bytes, dst, mem, &chunks);
  if (st == WEFT_OK) lane_moved(comm);
  return st;
}

/* ---- moving messages ------------------------------------------------------- */

/* Moves the head send of `peer` as far as it goes; OK when the peer has no
 * more sends or it waits. */
static weft_status push_sends(weft_core *comm, int peer) {
  p2p_peer *pp = &comm->engine->lane->peers[peer];
  while (pp->sends) {
    weft_request *r = pp->sends;
    weft_p2p_op *o = &r->p2p;
    uint32_t msg = pp->sent_msgs;
    const weft_mem_ops *mem = o->send_buf ? weft_mem_for(o->send_buf) : &weft_mem_host;
    if (!o->header_moved) {
      /* a device buffer: its copy to the host (or, lent, the stream's work
       * on it) must be done first */
      if (o->dev) WEFT_STATUS_PASS(weft_coll_device_msg_ready(comm, o->dev));
      WEFT_STATUS_PASS(lane_send(comm, peer, msg, o->header, sizeof o->header, &weft_mem_host));
      o->header_moved = true;
    }
    if (o->lent && !o->desc_moved) {
      WEFT_STATUS_PASS(lane_send(comm, peer, msg, &o->desc, sizeof o->desc, &weft_mem_host));
      o->desc_moved = true;
    }
    while (o->moved < o->bytes) {
      size_t n = o->bytes - o->moved < comm->chunk_bytes ? o->bytes - o->moved : comm->chunk_bytes;
      WEFT_STATUS_PASS(lane_send(comm, peer, msg, (const char *)o->send_buf + o->moved, n, mem));
      o->moved += n;
    }
    /* complete only when the buffer may be reused: every chunk is out; a
     * lent buffer, once the peer released its descriptor, after its copy */
    WEFT_STATUS_PASS(lane_send_idle(comm, peer));
    if (o->lent) WEFT_STATUS_PASS(lane_send_released(comm, peer));
    pp->sends = r->next;
    if (!pp->sends) pp->sends_tail = NULL;
    pp->sent_msgs++;
    complete(comm, r, WEFT_OK);
  }
  return WEFT_OK;
}

/* Starts the next incoming message of `peer` at its header. */
static weft_status take_header(weft_core *comm, int peer) {
  p2p_peer *pp = &comm->engine->lane->peers[peer];
  uint8_t h[WEFT_P2P_HEADER_BYTES];
  WEFT_STATUS_PASS(lane_recv_copy(comm, peer, pp->recvd_msgs, sizeof h, h));
  uint32_t magic, tag, dtype;
  uint64_t bytes;
  memcpy(&magic, h, 4);
  memcpy(&tag, h + 4, 4);
  memcpy(&bytes, h + 8, 8);
  dtype = tag >> 24;
  tag &= 0xFFFFFF;
  if ((magic != HEADER_MAGIC && magic != HEADER_MAGIC_LENT) || dtype >= WEFT_DTYPE_COUNT || bytes > SIZE_MAX / 2 ||
      bytes % weft_dtype_size((weft_dtype)dtype))
    return lane_fail(comm, WEFT_ERR_PROTOCOL, "weft_recv",
                     "peer %d sent a malformed message header (message #%u)", peer, pp->recvd_msgs);
  pp->in_busy = true;
  pp->in_tag = (int)tag;
  pp->in_dtype = (weft_dtype)dtype;
  pp->in_bytes = (size_t)bytes;
  pp->in_moved = 0;
  pp->in_lent = magic == HEADER_MAGIC_LENT;
  pp->in_req = NULL;
  pp->in_ux = NULL;
  weft_request **at = &pp->recvs, *prev = NULL;
  for (; *at; prev = *at, at = &(*at)->next) {
    if ((*at)->p2p.tag != pp->in_tag) continue;
    weft_request *r = *at;
    WEFT_CHECK(check_match(comm, r, peer, pp->in_tag, pp->in_dtype, pp->in_bytes));
    *at = r->next;
    if (pp->recvs_tail == r) pp->recvs_tail = prev;
    pp->in_req = r;
    return WEFT_OK;
  }
  weft_p2p_unexpected *u = malloc(sizeof *u + pp->in_bytes);
  if (!u)
    return lane_fail(comm, WEFT_ERR_NOMEM, "weft_recv",
                     "no memory to keep an unexpected message of %zu bytes from peer %d (tag %d)",
                     pp->in_bytes, peer, pp->in_tag);
  *u = (weft_p2p_unexpected){.tag = pp->in_tag, .dtype = pp->in_dtype, .bytes = pp->in_bytes};
  if (pp->ux_tail)
    pp->ux_tail->next = u;
  else
    pp->ux = u;
  pp->ux_tail = u;
  pp->in_ux = u;
  return WEFT_OK;
}

/* Receives from `peer` while a receive from it is posted (or a message is
 * half in). */
static weft_status pull_recvs(weft_core *comm, int peer) {
  p2p_peer *pp = &comm->engine->lane->peers[peer];
  while (pp->in_busy || pp->recvs) {
    if (!pp->in_busy) WEFT_STATUS_PASS(take_header(comm, peer));
    unsigned char *dst = pp->in_req ? pp->in_req->p2p.recv_buf : pp->in_ux->data;
    const weft_mem_ops *mem = pp->in_req ? weft_mem_for(dst) : &weft_mem_host;
    if (pp->in_lent) {
      WEFT_STATUS_PASS(take_lent(comm, peer, pp));
      pp->in_lent = false;
      pp->in_moved = pp->in_bytes;
    }
    while (pp->in_moved < pp->in_bytes) {
      size_t left = pp->in_bytes - pp->in_moved;
      size_t n = left < comm->chunk_bytes ? left : comm->chunk_bytes;
      WEFT_STATUS_PASS(lane_recv_into(comm, peer, pp->recvd_msgs, n, dst + pp->in_moved, mem));
      pp->in_moved += n;
    }
    pp->in_busy = false;
    pp->recvd_msgs++;
    if (pp->in_req) {
      recv_complete(comm, pp->in_req);
    } else {
      pp->in_ux->complete = true;
      if (pp->in_ux->taker) WEFT_CHECK(ux_deliver(comm, pp, pp->in_ux, pp->in_ux->taker));
    }
    pp->in_req = NULL;
    pp->in_ux = NULL;
  }
  return WEFT_OK;
}

/* Completes everything outstanding with the lane's failure. */
static void lane_failed(weft_core *comm, weft_status st) {
  weft_p2p_lane *l = comm->engine->lane;
  /* a transport's error on a channel-1 connection: worded by the transport */
  if (!l->failed)
    lane_fail(comm, st, "weft_send/weft_recv", "%s",
              comm->links.sink.origin[0] ? comm->links.sink.origin : comm->links.sink.msg);
  weft_p2p_fail_all(comm, l->failed);
}

static weft_status lane_pass(weft_core *comm) {
  weft_p2p_lane *l = comm->engine->lane;
  /* Every drive round of the communicator's collectives comes here: with
   * no message outstanding (posted ones count) there is nothing to take,
   * and the queue lock is not taken either. */
  if (atomic_load(&l->outstanding) == 0) return WEFT_OK;
  WEFT_CHECK(take_posted(comm));
  if (atomic_load(&l->outstanding) == 0) return WEFT_OK;
  l->waiting_peer = -1;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank) continue;
    p2p_peer *pp = &l->peers[p];
    if (pp->sends) {
      weft_status st = push_sends(comm, p);
      if (st < 0) return st;
      if (st == WEFT_AGAIN && l->waiting_peer < 0) {
        l->waiting_peer = p;
        l->waiting_for = "room to send to";
      }
    }
    if (pp->in_busy || pp->recvs) {
      weft_status st = pull_recvs(comm, p);
      if (st < 0) return st;
      if (st == WEFT_AGAIN && l->waiting_peer < 0) {
        l->waiting_peer = p;
        l->waiting_for = "a message from";
      }
    }
  }
  return WEFT_OK;
}

void weft_p2p_pass(weft_core *comm) {
  weft_p2p_lane *l = comm->engine->lane;
  if (l->failed) { /* what was posted since fails at once */
    if (atomic_load(&l->outstanding) > 0) weft_p2p_fail_all(comm, l->failed);
    return;
  }
  weft_status st = lane_pass(comm);
  if (st < 0) lane_failed(comm, st);
}

double weft_p2p_clock(weft_core *comm, double now) {
  weft_p2p_lane *l = comm->engine->lane;
  /* outstanding counts what is posted too, and is atomic: a poster on
   * another thread may be adding to it. Read before `restart`: a poster
   * sets restart before it counts its request, so a count seen here has its
   * restart seen below. The other order let a reading fall between a post's
   * count and its restart and measure the wait from the lane's last activity
   * (a new lane's is 0): a child communicator's first receive failed at once
   * with "no progress for 300.0 s" (split7 over tcp, 1 run in about 20). */
  int busy = atomic_load(&l->outstanding);
  if (atomic_exchange(&l->restart, false) || l->events != l->events_seen) {
    l->events_seen = l->events;
    l->last_moved = now;
  }
  if (busy == 0) return 1e9;
  double left = comm->fail.timeout_s - (now - l->last_moved);
  if (left > 0) return left;
  int peer = l->waiting_peer;
  if (peer < 0) /* only receives from this rank itself */
    lane_fail(comm, WEFT_ERR_TIMEOUT, "weft_send/weft_recv",
              "no progress for %.1f s: a receive from this rank itself found no matching send",
              comm->fail.timeout_s);
  else
    lane_fail(comm, WEFT_ERR_TIMEOUT, "weft_send/weft_recv",
              "no progress for %.1f s while waiting for %s peer %d; is peer %d alive and does it "
              "send/receive the matching message?",
              comm->fail.timeout_s, l->waiting_for ? l->waiting_for : "", peer, peer);
  weft_p2p_fail_all(comm, WEFT_ERR_TIMEOUT);
  return 1e9;
}

bool weft_p2p_busy(weft_core *comm) {
  return comm->engine->lane->posted || atomic_load(&comm->engine->lane->outstanding) > 0;
}

int weft_p2p_waiting_peer(weft_core *comm, const char **what) {
  if (what) *what = comm->engine->lane->waiting_for;
  return comm->engine->lane->waiting_peer;
}

static void fail_list(weft_core *comm, weft_request *r, weft_status st) {
  while (r) {
    weft_request *next = r->next;
    complete(comm, r, st);
    r = next;
  }
}

void weft_p2p_fail_all(weft_core *comm, weft_status st) {
  weft_p2p_lane *l = comm->engine->lane;
  pthread_mutex_lock(&comm->engine->q_lock);
  weft_request *posted = l->posted;
  l->posted = l->posted_tail = NULL;
  pthread_mutex_unlock(&comm->engine->q_lock);
  fail_list(comm, posted, st);
  for (int p = 0; p < comm->size; p++) {
    p2p_peer *pp = &l->peers[p];
    fail_list(comm, pp->sends, st);
    fail_list(comm, pp->recvs, st);
    if (pp->in_req) complete(comm, pp->in_req, st);
    for (weft_p2p_unexpected *u = pp->ux; u; u = u->next)
      if (u->taker) complete(comm, u->taker, st);
    ux_free_list(pp->ux);
    /* the message numbers stay: a failed lane takes no more messages, and
     * a communicator that failed none either */
    uint32_t sent = pp->sent_msgs, recvd = pp->recvd_msgs;
    memset(pp, 0, sizeof *pp);
    pp->sent_msgs = sent;
    pp->recvd_msgs = recvd;
  }
}

void weft_p2p_post(weft_request *req) {
  weft_p2p_lane *l = req->comm->engine->lane;
  /* restart before the count (weft_p2p_clock says why); a spare restart
   * from two posters at once only starts the clock again */
  if (atomic_load(&l->outstanding) == 0) atomic_store(&l->restart, true);
  atomic_fetch_add(&l->outstanding, 1);
  req->next = NULL;
  if (l->posted_tail)
    l->posted_tail->next = req;
  else
    l->posted = req;
  l->posted_tail = req;
}

/* ---- a new message ------------------------------------------------------------ */

weft_status weft_p2p_setup(weft_request *r, weft_core *comm, const char *call, bool is_send,
                           const void *buf, size_t count, weft_dtype dtype, int peer, int tag) {
  int stopped = atomic_load(&comm->fail.aborted);
  if (stopped)
    return weft_core_error(comm, weft_fail_stopped(stopped), call, "%s",
                           weft_fail_stopped_words(stopped));
  /* its connections were aborted with it: the first cause is in last_error */
  if (comm->fail.failed) return comm->fail.failed;
  weft_p2p_lane *l = comm->engine->lane;
  if (l && l->failed) {
    memcpy(comm->fail.last_error, l->last_error, sizeof comm->fail.last_error);
    return l->failed;
  }
  if (peer < 0 || peer >= comm->size)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "peer %d is out of range (size %d)", peer,
                           comm->size);
  if (tag < 0 || tag > 0xFFFFFF)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "tag %d is not in 0 .. %d", tag, 0xFFFFFF);
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "unknown dtype %d", (int)dtype);
  size_t elem = weft_dtype_size(dtype);
  if (count > SIZE_MAX / 2 / elem)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "count %zu is too large", count);
  if (count && !buf)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "buf is NULL but count is %zu", count);
  if (!l)
    return weft_core_error(comm, WEFT_ERR_INTERNAL, call, "this communicator has no p2p lane");
  *r = (weft_request){.comm = comm, .kind = is_send ? WEFT_REQ_SEND : WEFT_REQ_RECV};
  weft_p2p_op *o = &r->p2p;
  *o = (weft_p2p_op){.call = call,
                     .peer = peer,
                     .tag = tag,
                     .dtype = dtype,
                     .count = count,
                     .bytes = count * elem};
  if (is_send) {
    o->send_buf = buf;
    uint32_t magic = HEADER_MAGIC, word = (uint32_t)tag | (uint32_t)dtype << 24;
    uint64_t bytes = o->bytes;
    memcpy(o->header, &magic, 4);
    memcpy(o->header + 4, &word, 4);
    memcpy(o->header + 8, &bytes, 8);
  } else {
    o->recv_buf = (void *)buf;
  }
  /* a device buffer: staged through pinned host memory, in the order of the
   * communicator's stream (a send to this rank itself is matched at once,
   * so its copy to the host is waited for here) */
  if (count && weft_mem_kind_of(buf, NULL) == WEFT_MEMORY_DEVICE) {
    /* within a host a large send lends its buffer over CUDA IPC instead
     * (coll_device.h); where its descriptor cannot be made, it is staged */
    bool lend = is_send && weft_coll_device_msg_lendable(comm, peer, buf, o->bytes);
    for (;;) {
      weft_status st = weft_coll_device_msg_begin(comm, call, buf, o->bytes, is_send,
                                                  is_send && peer == comm->rank, lend, &o->dev);
      if (!st && lend && !weft_coll_device_msg_describe(o->dev, &o->desc)) st = WEFT_AGAIN;
      if (st == WEFT_AGAIN) { /* no IPC handle after all: staged */
        weft_coll_device_msg_end(comm, o->dev);
        o->dev = NULL;
        lend = false;
        continue;
      }
      if (st) {
        weft_coll_device_msg_end(comm, o->dev);
        o->dev = NULL;
        return st;
      }
      break;
    }
    if (lend) {
      o->lent = true;
      uint32_t magic = HEADER_MAGIC_LENT;
      memcpy(o->header, &magic, 4);
      o->moved = o->bytes; /* no data chunks: the descriptor stands for them */
    } else if (is_send) {
      o->send_buf = weft_coll_device_msg_host(o->dev);
    } else {
      o->recv_buf = weft_coll_device_msg_host(o->dev);
    }
  }
  return WEFT_OK;
}
