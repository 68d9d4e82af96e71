/* steps.c - what the chunked algorithms share: cutting a block into chunks
 * the same way on both ends of a link (a receiver names the exact size it
 * expects), the shape of a tree around its root, the send /
 * receive-reduce-send / receive-forward moves that rings, chains and trees
 * are made of, and the one message to or from every member that the
 * one-round algorithms (direct, exchange) are made of. */
#include <stdlib.h>

#include "src/algo/algo.h"

size_t weft_chunk_elems(const weft_coll *coll) {
  size_t ce = coll->chunk_bytes / coll->elem;
  return ce ? ce : 1;
}

/* Host memory: what algorithms keep here is read by the processor (every
 * member's message, pointers, a piece of a running sum). An algorithm that
 * works on device buffers in place takes its device scratch from
 * coll->mem->alloc_scratch itself (the direct allreduce). Over the device
 * channel the caller says device memory (algo.h, scratch_mem). */
static const weft_mem_ops *scratch_mem(const weft_coll *coll) {
  return coll->scratch_mem ? coll->scratch_mem : &weft_mem_host;
}

weft_status weft_coll_scratch(weft_coll *coll, size_t bytes, void **out) {
  if (coll->scratch) return WEFT_ERR_INTERNAL; /* one allocation per call */
  coll->scratch = scratch_mem(coll)->alloc_scratch(bytes);
  if (!coll->scratch) return WEFT_ERR_NOMEM;
  *out = coll->scratch;
  return WEFT_OK;
}

weft_coll *weft_coll_phase(weft_coll *inner, const weft_coll *outer, weft_group_links *links,
                           const int *group, int rank, int size, const void *src, void *dst,
                           size_t count, int avg_div) {
  *inner = (weft_coll){.link = weft_group_links_init(links, outer->link, group),
                       .call = outer->call,
                       .rank = rank,
                       .size = size,
                       .avg_div = avg_div,
                       .sendbuf = src,
                       .recvbuf = dst,
                       .count = count,
                       .dtype = outer->dtype,
                       .op = outer->op,
                       .root = 0,
                       .elem = outer->elem,
                       .chunk_bytes = outer->chunk_bytes,
                       .mem = outer->mem,
                       .stream = outer->stream,
                       .ready_stream = outer->ready_stream,
                       .ready = outer->ready,
                       .seq = outer->seq,
                       .sig = outer->sig,
                       .fail_peer = -1};
  return inner;
}

void weft_coll_scratch_free(weft_coll *coll, void *scratch) {
  scratch_mem(coll)->free_scratch(scratch);
}

void weft_coll_scratch_release(weft_coll *coll) {
  weft_coll_scratch_free(coll, coll->scratch);
  coll->scratch = NULL;
  for (int i = 0; i < 2; i++) {
    weft_coll_scratch_free(coll, coll->handed_over_scratch[i]);
    coll->handed_over_scratch[i] = NULL;
  }
}

void weft_chunk_range(size_t k, size_t chunk_elems, size_t count, size_t *off, size_t *cnt) {
  size_t start = k * chunk_elems < count ? k * chunk_elems : count;
  *off = start;
  *cnt = count - start < chunk_elems ? count - start : chunk_elems;
}

weft_tree_shape weft_tree_shape_of(const weft_coll *coll, int fanout) {
  int n = coll->size;
  int k = fanout < 1 ? 1 : fanout > n - 1 ? (n > 1 ? n - 1 : 1) : fanout;
  int v = weft_mod(coll->rank - coll->root, n); /* virtual rank: root is 0 */
  int first = v * k + 1;
  return (weft_tree_shape){.fanout = k,
                           .parent = v == 0 ? -1 : (coll->root + (v - 1) / k) % n,
                           .first_child = first,
                           .nchildren = first >= n ? 0 : (n - first < k ? n - first : k)};
}

/* ---- f32 on the wire as bf16 / f16 (algo.h, weft_coll.wire) ---------------
 * One stage per call: every algorithm that carries a wire dtype sends to
 * one member per step, and a step refills the stage only once the send
 * that read it last is complete (a copy into the socket buffer on tcp, at
 * once on shm), after its own receive, as weft_step_recv_reduce waits. */

size_t weft_wire_stage_bytes(const weft_coll *coll) {
  size_t chunk = weft_chunk_elems(coll);
  size_t cnt = coll->count < chunk ? coll->count : chunk;
  return ((weft_wire_bytes(cnt) + 63) & ~(size_t)63) + cnt * sizeof(float);
}

weft_status weft_wire_stage_take(weft_coll *coll, void **stage) {
  if (!coll->wire_stage) return WEFT_ERR_INTERNAL; /* the caller allocates it with the call */
  if (coll->wire_sent_to) {
    WEFT_STEP(weft_link_send_idle(coll, coll->wire_sent_to - 1));
    coll->wire_sent_to = 0;
  }
  *stage = coll->wire_stage;
  return WEFT_OK;
}

weft_status weft_wire_send(weft_coll *coll, int peer, size_t cnt, unsigned flags) {
  coll->wire_sent_to = peer + 1;
  return weft_link_send(coll, peer, coll->wire_stage, weft_wire_bytes(cnt),
                        flags & ~(unsigned)WEFT_SEND_FOR_COPY);
}

/* The wire forms of the three steps below: the same moves, in the same
 * order, on narrowed chunks. */
static weft_status wire_step_send(weft_coll *coll, int peer, const void *src, size_t cnt,
                                  unsigned flags) {
  void *stage;
  WEFT_STEP(weft_wire_stage_take(coll, &stage));
  WEFT_STEP(weft_link_send_ready(coll, peer));
  coll->mem->narrow(stage, src, cnt, coll->wire);
  return weft_wire_send(coll, peer, cnt, flags);
}

/* A partial sum that goes on is rounded once, and dst keeps the rounded
 * value: the owner of a final chunk ends with the bits it sends. */
static weft_status wire_step_recv_reduce(weft_coll *coll, int from, int to, void *dst,
                                         const void *own, size_t cnt, int postdiv, int wait_peer) {
  const void *slot;
  void *stage = NULL;
  WEFT_STEP(weft_link_recv_peek(coll, from, weft_wire_bytes(cnt), &slot));
  if (wait_peer >= 0) WEFT_STEP(weft_link_send_idle(coll, wait_peer));
  if (to >= 0) {
    WEFT_STEP(weft_wire_stage_take(coll, &stage));
    WEFT_STEP(weft_link_send_ready(coll, to));
  }
  coll->mem->reduce_wire(dst, own, slot, cnt, coll->wire, coll->op, postdiv, stage);
  if (to >= 0) WEFT_STEP(weft_wire_send(coll, to, cnt, WEFT_SEND_NOW));
  return weft_link_recv_release(coll, from);
}

/* A final chunk is passed on as it came: narrowing what was widened gives
 * the same bits back (no second rounding), and reads the call's memory
 * only, where a copy of the slot would read host memory into another kind. */
static weft_status wire_step_recv_forward(weft_coll *coll, int from, int to, void *dst,
                                          size_t cnt) {
  const void *slot;
  void *stage = NULL;
  WEFT_STEP(weft_link_recv_peek(coll, from, weft_wire_bytes(cnt), &slot));
  if (to >= 0) {
    WEFT_STEP(weft_wire_stage_take(coll, &stage));
    WEFT_STEP(weft_link_send_ready(coll, to));
  }
  coll->mem->widen(dst, slot, cnt, coll->wire);
  if (to >= 0) {
    coll->mem->narrow(stage, dst, cnt, coll->wire);
    WEFT_STEP(weft_wire_send(coll, to, cnt, WEFT_SEND_NOW));
  }
  return weft_link_recv_release(coll, from);
}

weft_status weft_step_send(weft_coll *coll, int peer, const void *src, size_t bytes,
                           unsigned flags) {
  if (weft_wire_on(coll)) return wire_step_send(coll, peer, src, bytes / coll->elem, flags);
  WEFT_STEP(weft_link_send_ready(coll, peer));
  return weft_link_send(coll, peer, src, bytes, flags);
}

/* The reduced chunk goes on at once: the next member waits for it. */
static weft_status recv_reduce_send(weft_coll *coll, int from, int to, void *dst, const void *own,
                                    size_t cnt, int postdiv, int wait_peer, unsigned flags) {
  if (weft_wire_on(coll))
    return wire_step_recv_reduce(coll, from, to, dst, own, cnt, postdiv, wait_peer);
  const void *slot;
  WEFT_STEP(weft_link_recv_peek(coll, from, cnt * coll->elem, &slot));
  /* Only after the peek: the peer drains our last send by peeking it, so
   * waiting for that send before taking our own data could close a cycle of
   * waits around a ring once a chunk is larger than what the link buffers. */
  if (wait_peer >= 0) WEFT_STEP(weft_link_send_idle(coll, wait_peer));
  if (to >= 0) WEFT_STEP(weft_link_send_ready(coll, to));
  coll->mem->reduce(dst, own, slot, cnt, coll->dtype, coll->op, postdiv);
  if (to >= 0) WEFT_STEP(weft_link_send(coll, to, dst, cnt * coll->elem, flags | WEFT_SEND_NOW));
  return weft_link_recv_release(coll, from);
}

weft_status weft_step_recv_reduce(weft_coll *coll, int from, int to, void *dst, const void *own,
                                  size_t cnt, int postdiv, int wait_peer) {
  return recv_reduce_send(coll, from, to, dst, own, cnt, postdiv, wait_peer, 0);
}

weft_status weft_step_recv_reduce_final(weft_coll *coll, int from, int to, void *dst,
                                        const void *own, size_t cnt, int postdiv) {
  return recv_reduce_send(coll, from, to, dst, own, cnt, postdiv, -1, WEFT_SEND_FOR_COPY);
}

weft_status weft_step_recv_forward(weft_coll *coll, int from, int to, void *dst, size_t bytes,
                                   bool *got) {
  if (weft_wire_on(coll)) return wire_step_recv_forward(coll, from, to, dst, bytes / coll->elem);
  if (!*got) {
    WEFT_STEP(weft_link_recv(coll, from, bytes, dst));
    *got = true;
  }
  if (to < 0) return WEFT_OK;
  return weft_step_send(coll, to, dst, bytes, WEFT_SEND_FOR_COPY | WEFT_SEND_NOW);
}

weft_status weft_step_send_all(weft_coll *coll, int *next, const void *src, size_t bytes) {
  int n = coll->size;
  while (*next < n - 1) {
    int peer = (coll->rank + 1 + *next) % n;
    WEFT_STEP(weft_step_send(coll, peer, src, bytes, 0));
    (*next)++;
  }
  *next = 0;
  return WEFT_OK;
}

weft_status weft_step_recv_all(weft_coll *coll, int *next, void *base, size_t bytes) {
  int n = coll->size;
  while (*next < n - 1) {
    int peer = (coll->rank + n - 1 - *next) % n;
    WEFT_STEP(weft_link_recv(coll, peer, bytes, (char *)base + (size_t)peer * bytes));
    (*next)++;
  }
  *next = 0;
  return WEFT_OK;
}

weft_status weft_step_nothing(weft_coll *coll) {
  (void)coll;
  return WEFT_OK;
}

/* A piece small enough that data or room arriving meanwhile waits little
 * for it (64 KiB: a few microseconds), large enough that the tries of
 * `move` between pieces cost nothing beside it; never more than a chunk
 * (so the tests' tiny chunks cut the copy into many pieces). */
#define LOCAL_COPY_PIECE (64u << 10)

weft_status weft_step_with_local_copy(weft_coll *coll, weft_status (*move)(weft_coll *coll),
                                      void *dst, const void *src, size_t bytes, size_t *done) {
  for (;;) {
    weft_status st = move(coll);
    size_t left = bytes - *done;
    if (st == WEFT_AGAIN && left) {
      size_t piece = coll->chunk_bytes < LOCAL_COPY_PIECE ? coll->chunk_bytes : LOCAL_COPY_PIECE;
      if (piece > left || piece == 0) piece = left;
      coll->mem->copy((char *)dst + *done, (const char *)src + *done, piece);
      *done += piece;
      continue;
    }
    if (st == WEFT_OK && left) {
      coll->mem->copy((char *)dst + *done, (const char *)src + *done, left);
      *done = bytes;
    }
    return st;
  }
}
