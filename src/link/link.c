/* link.c - a group's links (link.h): a subgroup's member numbers mapped
 * onto those of another link, so a phase runs on any table, the
 * communicator's or a test's fake. */
#include "src/link/link.h"

static inline const weft_group_links *group_of(void *ctx) {
  return (const weft_group_links *)ctx;
}

static weft_status group_send_ready(void *ctx, int member) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->send_ready(g->over.ctx, g->members[member]);
}

static weft_status group_send(void *ctx, int member, const void *src, size_t bytes, weft_tag tag,
                              const weft_mem_ops *mem, unsigned flags) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->send(g->over.ctx, g->members[member], src, bytes, tag, mem, flags);
}

static weft_status group_send_idle(void *ctx, int member) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->send_idle(g->over.ctx, g->members[member]);
}

static weft_status group_recv_peek(void *ctx, int member, weft_tag tag, size_t bytes,
                                   const void **data) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->recv_peek(g->over.ctx, g->members[member], tag, bytes, data);
}

static weft_status group_recv_release(void *ctx, int member) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->recv_release(g->over.ctx, g->members[member]);
}

static weft_status group_recv(void *ctx, int member, weft_tag tag, size_t chunk_bytes, size_t bytes,
                              void *dst, const weft_mem_ops *mem, size_t *chunks) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->recv(g->over.ctx, g->members[member], tag, chunk_bytes, bytes, dst, mem,
                           chunks);
}

static weft_status group_map_peer_mem(void *ctx, int member, const weft_mem_desc *desc,
                                      void **local) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->map_peer_mem(g->over.ctx, g->members[member], desc, local);
}

static void group_release_peer_mem(void *ctx, int member) {
  const weft_group_links *g = group_of(ctx);
  g->over.ops->release_peer_mem(g->over.ctx, g->members[member]);
}

static void group_progressed(void *ctx) {
  const weft_group_links *g = group_of(ctx);
  g->over.ops->progressed(g->over.ctx);
}

static int group_rank_of(void *ctx, int member) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->rank_of(g->over.ctx, g->members[member]);
}

static const char *group_last_error(void *ctx) {
  const weft_group_links *g = group_of(ctx);
  return g->over.ops->last_error(g->over.ctx);
}

static void group_set_error(void *ctx, const char *sentence) {
  const weft_group_links *g = group_of(ctx);
  g->over.ops->set_error(g->over.ctx, sentence);
}

const weft_link_ops weft_group_links_ops = {
    .send_ready = group_send_ready,
    .send = group_send,
    .send_idle = group_send_idle,
    .recv_peek = group_recv_peek,
    .recv_release = group_recv_release,
    .recv = group_recv,
    .map_peer_mem = group_map_peer_mem,
    .release_peer_mem = group_release_peer_mem,
    .progressed = group_progressed,
    .rank_of = group_rank_of,
    .last_error = group_last_error,
    .set_error = group_set_error,
};
