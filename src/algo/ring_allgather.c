/* ring_allgather.c - bandwidth-optimal allgather: the second half of
 * ring_allreduce.c. Each block travels size-1 hops around the ring, landing
 * in every rank's recvbuf and sent on from there (final bytes, never written
 * again, so no scratch). Loop l moves chunk l of every block; rank r walks:
 *   step 0          send chunk l of its own block (from sendbuf) to the right
 *   steps 1..n-1    receive block r-s from the left into recvbuf, send it on
 *                   (the last one stays)
 * Its own block is copied into recvbuf (unless in place) while the ring
 * waits for room or data (weft_step_with_local_copy), not before step 0. */
#include "src/algo/algo.h"

/* Loop l moves chunk l of every block. */
typedef struct ring_block_state {
  size_t chunk_elems;
  size_t loops; /* chunks per block */
  size_t loop;
  int step; /* 0 .. size-1 */
  bool got; /* this step's chunk is received */
  size_t own_copied; /* bytes of the own block copied into recvbuf */
} ring_block_state;
_Static_assert(sizeof(ring_block_state) <= WEFT_ALGO_STATE_BYTES,
               "ring_block_state fits weft_coll.algo_state");

static weft_status ag_step(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  int n = coll->size, r = coll->rank, s = rb->step;
  int left = weft_mod(r - 1, n), right = weft_mod(r + 1, n);
  size_t off, cnt;
  weft_chunk_range(rb->loop, rb->chunk_elems, coll->count, &off, &cnt);
  size_t bytes = cnt * coll->elem;
  if (s == 0)
    return weft_step_send(coll, right, (const char *)coll->sendbuf + off * coll->elem, bytes,
                          WEFT_SEND_FOR_COPY);
  size_t b = (size_t)weft_mod(r - s, n);
  char *out = (char *)coll->recvbuf + (b * coll->count + off) * coll->elem;
  return weft_step_recv_forward(coll, left, s == n - 1 ? -1 : right, out, bytes, &rb->got);
}

static weft_status ag_move(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  while (rb->loop < rb->loops) {
    WEFT_STEP(ag_step(coll));
    rb->got = false;
    if (++rb->step == coll->size) {
      rb->step = 0;
      rb->loop++;
    }
  }
  return WEFT_OK;
}

static weft_status ag_advance(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  size_t block = coll->count * coll->elem;
  char *mine = (char *)coll->recvbuf + (size_t)coll->rank * block;
  return weft_step_with_local_copy(coll, ag_move, mine, coll->sendbuf,
                                   mine == coll->sendbuf ? 0 : block, &rb->own_copied);
}

weft_status weft_ring_allgather_start(weft_coll *coll) {
  ring_block_state *rb = WEFT_ALGO_STATE(coll, ring_block_state);
  *rb = (ring_block_state){.chunk_elems = weft_chunk_elems(coll)};
  rb->loops = (coll->count + rb->chunk_elems - 1) / rb->chunk_elems;
  coll->algo = "ring";
  coll->advance = ag_advance;
  return WEFT_OK;
}
