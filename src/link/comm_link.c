/* comm_link.c - a communicator's links (comm_link.h): rank -> transport
 * connection of the peer table on the collectives' channel (opened on first use, put on the list of
 * peers the call touched), progress counted for the engine's timeout, what
 * the call waits for recorded in the call's fields. */
#include "src/link/comm_link.h"

#include <stdio.h>

static inline weft_call_links *cl_of(void *ctx) {
  return (weft_call_links *)ctx;
}

static inline const weft_transport *peer_ops(const weft_peer_table *l, int peer) {
  return l->tps[l->peers[peer].tp].ops;
}

/* What the call waits for: for the engine's sleep and for the timeout's
 * sentence. Peers here are communicator ranks. */
static weft_status link_result(weft_call_links *cl, int peer, weft_status st,
                               const char *waiting_for) {
  if (st == WEFT_AGAIN) *cl->waiting_for = waiting_for;
  if (st) *cl->waiting_peer = peer;
  if (st < 0) *cl->fail_peer = peer;
  return st;
}

static weft_status link_conn(weft_call_links *cl, int peer, weft_tp_conn **out) {
  weft_peer_table *l = cl->links;
  weft_peer_route *p = &l->peers[peer];
  int channel = cl->device && peer_ops(l, peer)->caps.device_channel ? WEFT_TP_CHANNEL_DEVICE
                                                                     : WEFT_TP_CHANNEL_COLL;
  if (!p->conn[channel]) {
    weft_status st = weft_peer_table_conn(l, peer, channel, out);
    if (st < 0) return link_result(cl, peer, st, "a connection to");
  }
  if (!p->is_active) {
    p->is_active = true;
    l->active[l->nactive++] = peer;
  }
  *out = p->conn[channel];
  return WEFT_OK;
}

static weft_status cl_send_ready(void *ctx, int peer) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  WEFT_CHECK(link_conn(cl, peer, &c));
  return link_result(cl, peer, peer_ops(cl->links, peer)->send_ready(c), "room to send to");
}

static weft_status cl_send(void *ctx, int peer, const void *src, size_t bytes, weft_tag tag,
                           const weft_mem_ops *mem, unsigned flags) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  WEFT_CHECK(link_conn(cl, peer, &c));
  weft_status st = peer_ops(cl->links, peer)->send(c, src, bytes, tag, mem, flags);
  if (st == WEFT_OK) {
    cl->links->events++;
    cl->links->peers[peer].last_send_seq = weft_tag_seq(tag);
  }
  return link_result(cl, peer, st, "room to send to");
}

static weft_status cl_send_idle(void *ctx, int peer) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  WEFT_CHECK(link_conn(cl, peer, &c));
  return link_result(cl, peer, peer_ops(cl->links, peer)->send_idle(c), "a send to complete to");
}

static weft_status cl_recv_peek(void *ctx, int peer, weft_tag tag, size_t bytes,
                                const void **data) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  WEFT_CHECK(link_conn(cl, peer, &c));
  return link_result(cl, peer, peer_ops(cl->links, peer)->recv_peek(c, tag, bytes, data),
                     "data from");
}

static weft_status cl_recv_release(void *ctx, int peer) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  WEFT_CHECK(link_conn(cl, peer, &c));
  weft_status st = peer_ops(cl->links, peer)->recv_release(c);
  if (st == WEFT_OK) cl->links->events++;
  return link_result(cl, peer, st, "data from");
}

static weft_status cl_recv(void *ctx, int peer, weft_tag tag, size_t chunk_bytes, size_t bytes,
                           void *dst, const weft_mem_ops *mem, size_t *chunks) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  *chunks = 0;
  WEFT_CHECK(link_conn(cl, peer, &c));
  weft_status st = peer_ops(cl->links, peer)->recv(c, tag, chunk_bytes, bytes, dst, mem, chunks);
  if (st == WEFT_OK) cl->links->events++;
  return link_result(cl, peer, st, "data from");
}

static weft_status cl_map_peer_mem(void *ctx, int peer, const weft_mem_desc *desc, void **local) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c;
  WEFT_CHECK(link_conn(cl, peer, &c));
  return peer_ops(cl->links, peer)->map_peer_mem(c, desc, local);
}

static void cl_release_peer_mem(void *ctx, int peer) {
  weft_call_links *cl = cl_of(ctx);
  weft_tp_conn *c = cl->links->peers[peer].conn[WEFT_TP_CHANNEL_COLL];
  if (c) peer_ops(cl->links, peer)->release_peer_mem(c, false);
}

static void cl_progressed(void *ctx) {
  cl_of(ctx)->links->events++;
}

static int cl_rank_of(void *ctx, int member) {
  (void)ctx;
  return member;
}

static const char *cl_last_error(void *ctx) {
  return cl_of(ctx)->links->sink.msg;
}

static void cl_set_error(void *ctx, const char *sentence) {
  weft_peer_table *l = cl_of(ctx)->links;
  char copy[sizeof l->sink.msg]; /* the sentence may quote the sink itself */
  snprintf(copy, sizeof copy, "%s", sentence);
  weft_error_sink_set(&l->sink, "%s", copy);
}

const weft_link_ops weft_call_links_ops = {
    .send_ready = cl_send_ready,
    .send = cl_send,
    .send_idle = cl_send_idle,
    .recv_peek = cl_recv_peek,
    .recv_release = cl_recv_release,
    .recv = cl_recv,
    .map_peer_mem = cl_map_peer_mem,
    .release_peer_mem = cl_release_peer_mem,
    .progressed = cl_progressed,
    .rank_of = cl_rank_of,
    .last_error = cl_last_error,
    .set_error = cl_set_error,
};
