/* link.h - what an algorithm sees of its peers: chunks to and from members
 * 0 .. size-1 of the group it runs on, through one `const` table of
 * operations and its context. A communicator's links (comm_link.c) map
 * members to ranks and ranks to transport connections; a group's links
 * (below) map a subgroup's members to those of another link, so a phase of
 * the hierarchical allreduce runs on the same table; a test provides a fake
 * (tests/test_algo_fake.c). Below the algorithms, above the transports. */
#ifndef WEFT_LINK_H
#define WEFT_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/status.h"
#include "src/mem/mem.h"
#include "transports/transport.h" /* weft_mem_desc */

/* Every member is called with the table's `ctx` and a member of the group
 * (never the caller's own). Returns WEFT_AGAIN when the operation cannot
 * happen now (nothing changed: call again later), an error when the link
 * failed (the sentence is in the context's sink, see last_error). No member
 * blocks. One call of one member per chunk: the algorithms' hot path pays
 * one indirect call per chunk, never per byte. */
typedef struct weft_link_ops {
  /* OK when one more chunk to `member` may be sent now. */
  weft_status (*send_ready)(void *ctx, int member);
  /* Sends the chunk src[0 .. bytes) tagged with the call's `tag` (number and signature), read with
   * `mem`'s kind; only after send_ready said OK. `flags` say what it is for
   * (transport.h: WEFT_SEND_FOR_COPY, the member takes it with recv, never
   * recv_peek; WEFT_SEND_NOW, on a pipeline's path). src stays unchanged
   * until send_idle says OK. */
  weft_status (*send)(void *ctx, int member, const void *src, size_t bytes, weft_tag tag,
                      const weft_mem_ops *mem, unsigned flags);
  /* OK once every chunk sent to `member` has left its source. */
  weft_status (*send_idle)(void *ctx, int member);
  /* The next chunk from `member`, where it landed, once it has: it must
   * carry `tag` and be exactly `bytes` long (else WEFT_ERR_MISMATCH). *data
   * stays valid and unchanged until recv_release. */
  weft_status (*recv_peek)(void *ctx, int member, weft_tag tag, size_t bytes, const void **data);
  /* Gives back the chunk recv_peek showed: its slot takes the next one. */
  weft_status (*recv_release)(void *ctx, int member);
  /* The next chunks of a run of `bytes` that `member` sent in chunks of
   * `chunk_bytes` (one chunk: chunk_bytes == bytes), copied one after
   * another from dst: at least one, at most as many as have arrived whole;
   * *chunks says how many (transport.h, recv). */
  weft_status (*recv)(void *ctx, int member, weft_tag tag, size_t chunk_bytes, size_t bytes,
                      void *dst, const weft_mem_ops *mem, size_t *chunks);
  /* Maps the buffer `member` described in `key` (weft_mem_alloc memory) into
   * this process. A failure is not a link failure (the connection stays up,
   * the sentence is in the sink): the caller falls back. */
  weft_status (*map_peer_mem)(void *ctx, int member, const weft_mem_desc *desc, void **local);
  /* Closes the mappings of device memory `member` lent for this call
   * (transport.h, release_peer_mem); before the done round that lets the
   * member's call end. */
  void (*release_peer_mem)(void *ctx, int member);
  /* Work that no chunk shows moved (stores into peers' mapped buffers):
   * progress, so that a timeout does not count it as a wait. */
  void (*progressed)(void *ctx);
  /* The member's rank in its communicator, for messages. */
  int (*rank_of)(void *ctx, int member);
  /* The sentence of the last failure a link reported, and its rewrite when
   * the algorithm knows better what it meant (never NULL). */
  const char *(*last_error)(void *ctx);
  void (*set_error)(void *ctx, const char *sentence);
} weft_link_ops;

/* The links of one algorithm run: a table and its context (the caller's). */
#define WEFT_LINK_CTX_BYTES 40 /* room a call keeps for its links' context (weft_coll) */
typedef struct weft_link {
  const weft_link_ops *ops;
  void *ctx;
} weft_link;

/* A group's links: member m of the group is member members[m] of `over`
 * (a hierarchical phase on a host's ranks or on the leaders). Lives as long
 * as the phase; `members` as long as the call. */
typedef struct weft_group_links {
  weft_link over;
  const int *members;
} weft_group_links;

extern const weft_link_ops weft_group_links_ops;

static inline weft_link weft_group_links_init(weft_group_links *g, weft_link over,
                                              const int *members) {
  g->over = over;
  g->members = members;
  return (weft_link){.ops = &weft_group_links_ops, .ctx = g};
}

#endif
