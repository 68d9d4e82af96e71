/* ring_reduce_scatter.c - bandwidth-optimal reduce-scatter: the first half of
 * ring_allreduce.c on the blocks the caller chose. Block b of every rank's
 * sendbuf is summed on its way around the ring and ends, final, on rank b.
 * Loop l moves chunk l of every block; in it rank r walks size steps:
 *   step 0          send chunk l of its block r-1 to the right
 *   steps 1..n-2    receive the partial of block r-1-s from the left, add its
 *                   own, send it on
 *   step n-1        receive the partial of block r, add its own: final
 *                   (divided for avg), straight into recvbuf
 * Unlike the allreduce, the partials have no place in recvbuf (it holds one
 * block), so they live in one chunk of scratch; a step waits for the previous
 * send from it to complete before overwriting it (at once on shm, a copy into
 * the socket buffer on tcp; a transport whose completion is a round trip
 * would want a few scratch chunks in turn). Between two ranks the chunks
 * stream instead (rs_pair_advance, below). */
#include "src/algo/algo.h"

/* Loop l moves chunk l of every block. */
typedef struct ring_block_state {
  size_t chunk_elems;
  size_t loops; /* chunks per block */
  size_t loop;
  int step;      /* 0 .. size-1 */
  void *partial; /* one chunk of scratch: the partial sum on its way */
  size_t sent;   /* two ranks (rs_pair_advance): chunks of the peer's block posted */
} ring_block_state;
_Static_assert(sizeof(ring_block_state) <= WEFT_ALGO_STATE_BYTES,
               "ring_block_state fits weft_coll.algo_state");

static weft_status rs_step(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  int n = coll->size, r = coll->rank, s = rb->step;
  int left = weft_mod(r - 1, n), right = weft_mod(r + 1, n);
  int b = weft_mod(r - 1 - s, n);
  size_t off, cnt;
  weft_chunk_range(rb->loop, rb->chunk_elems, coll->count, &off, &cnt);
  const char *own = (const char *)coll->sendbuf + ((size_t)b * coll->count + off) * coll->elem;
  if (s == 0) return weft_step_send(coll, right, own, cnt * coll->elem, 0);
  if (s < n - 1) return weft_step_recv_reduce(coll, left, right, rb->partial, own, cnt, 1, right);
  char *out = (char *)coll->recvbuf + off * coll->elem;
  return weft_step_recv_reduce(coll, left, -1, out, own, cnt, coll->avg_div, -1);
}

static weft_status rs_advance(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  while (rb->loop < rb->loops) {
    WEFT_STEP(rs_step(coll));
    if (++rb->step == coll->size) {
      rb->step = 0;
      rb->loop++;
    }
  }
  return WEFT_OK;
}

/* Two ranks: nothing is passed on, so the link carries only each loop's
 * step 0, the peer's block, in loop order. Those go out as fast as the link
 * takes them while the peer's come in and are reduced, instead of one loop
 * at a time (a round trip each; see pair_advance in ring_allreduce.c), at
 * most WEFT_PAIR_LEAD_LOOPS ahead of what has been reduced, so the peer
 * reads them from the cache (docs/tuning.md, "Two ranks: streams instead of
 * a ring"). */
static weft_status rs_pair_advance(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  int r = coll->rank, p = 1 - r;
  for (;;) {
    bool moved = false;
    size_t off, cnt;
    while (rb->sent < rb->loops && rb->sent < rb->loop + WEFT_PAIR_LEAD_LOOPS) {
      weft_chunk_range(rb->sent, rb->chunk_elems, coll->count, &off, &cnt);
      const char *theirs =
          (const char *)coll->sendbuf + ((size_t)p * coll->count + off) * coll->elem;
      weft_status st = weft_step_send(coll, p, theirs, cnt * coll->elem, WEFT_SEND_NOW);
      if (st == WEFT_AGAIN) break;
      WEFT_CHECK(st);
      rb->sent++;
    }
    while (rb->loop < rb->loops) {
      weft_chunk_range(rb->loop, rb->chunk_elems, coll->count, &off, &cnt);
      const char *own = (const char *)coll->sendbuf + ((size_t)r * coll->count + off) * coll->elem;
      char *out = (char *)coll->recvbuf + off * coll->elem;
      weft_status st = weft_step_recv_reduce(coll, p, -1, out, own, cnt, coll->avg_div, -1);
      if (st == WEFT_AGAIN) break;
      WEFT_CHECK(st);
      moved = true;
      rb->loop++;
    }
    if (rb->loop == rb->loops && rb->sent == rb->loops) return WEFT_OK;
    if (!moved) return WEFT_AGAIN;
  }
}

weft_status weft_ring_reduce_scatter_start(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  *rb = (ring_block_state){.chunk_elems = weft_chunk_elems(coll)};
  rb->loops = (coll->count + rb->chunk_elems - 1) / rb->chunk_elems;
  size_t chunk = coll->count < rb->chunk_elems ? coll->count : rb->chunk_elems;
  if (coll->size > 2) WEFT_CHECK(weft_coll_scratch(coll, chunk * coll->elem, &rb->partial));
  coll->algo = "ring";
  coll->advance = rs_advance;
  if (coll->size == 2 && !weft_wire_on(coll)) coll->advance = rs_pair_advance;
  return WEFT_OK;
}
