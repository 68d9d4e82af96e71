/* halving_reduce_scatter.c - reduce-scatter by recursive halving, for a
 * power-of-two group whose whole input fits two chunks. Member r starts
 * responsible for all size blocks; in the round of distance d (size/2,
 * size/4, .., 1) it gives the half of its blocks that member r^d keeps (the
 * upper half if bit d of r is clear, else the lower) and reduces the half it
 * keeps with what r^d gives it. After log2(size) rounds it holds block r.
 * Each member sends (size-1)/size of the input in all, as the ring does,
 * in log2(size) messages instead of size-1 steps; recursive doubling sends
 * the whole input every round.
 *
 * Blocks keep their place: a member's working copy is a scratch of size
 * blocks indexed as the input, written only in the halves it keeps, so what
 * it gave away is never overwritten while a send may still read it. The
 * first round reads sendbuf directly; the last one writes the result into
 * recvbuf, divided for avg. Partners combine in rank order (the lower
 * member's operand first), as recursive doubling does. */
#include "src/algo/algo.h"

typedef struct halving_state {
  char *work;      /* scratch: size blocks, placed as in sendbuf */
  size_t block;    /* bytes per block */
  int dist;        /* this round's distance d; 0: every round done */
  int lo;          /* first block this member is responsible for */
  bool sent;       /* this round's half is posted */
  int idle_round;  /* the final wait: partners whose send is known complete */
} halving_state;
_Static_assert(sizeof(halving_state) <= WEFT_ALGO_STATE_BYTES,
               "halving_state fits weft_coll.algo_state");

/* The current values of blocks [b, ..): sendbuf before the first round
 * reduced them, the working copy after. */
static const char *halving_held(const weft_coll *coll, const halving_state *hs, int b) {
  const char *base = hs->dist == coll->size / 2 ? (const char *)coll->sendbuf : hs->work;
  return base + (size_t)b * hs->block;
}

static weft_status halving_round(weft_coll *coll, halving_state *hs) {
  int d = hs->dist, r = coll->rank, partner = r ^ d;
  bool keep_upper = (r & d) != 0;
  int keep = keep_upper ? hs->lo + d : hs->lo, give = keep_upper ? hs->lo : hs->lo + d;
  size_t bytes = (size_t)d * hs->block, count = (size_t)d * coll->count;
  if (!hs->sent) {
    WEFT_STEP(weft_step_send(coll, partner, halving_held(coll, hs, give), bytes, 0));
    hs->sent = true;
  }
  const void *theirs;
  WEFT_STEP(weft_link_recv_peek(coll, partner, bytes, &theirs));
  const void *mine = halving_held(coll, hs, keep);
  bool last = d == 1;
  void *dst = last ? coll->recvbuf : hs->work + (size_t)keep * hs->block;
  int postdiv = last ? coll->avg_div : 1;
  if (partner < r)
    coll->mem->reduce(dst, theirs, mine, count, coll->dtype, coll->op, postdiv);
  else
    coll->mem->reduce(dst, mine, theirs, count, coll->dtype, coll->op, postdiv);
  WEFT_CHECK(weft_link_recv_release(coll, partner));
  hs->lo = keep;
  hs->sent = false;
  return WEFT_OK;
}

static weft_status halving_advance(weft_coll *coll) {
  halving_state *hs = WEFT_ALGO_STATE(coll, halving_state);
  for (; hs->dist >= 1; hs->dist /= 2) WEFT_STEP(halving_round(coll, hs));
  /* sendbuf and the working copy stay readable until every send is out */
  for (int d = coll->size / 2 >> hs->idle_round; d >= 1; d /= 2, hs->idle_round++)
    WEFT_STEP(weft_link_send_idle(coll, coll->rank ^ d));
  return WEFT_OK;
}

weft_status weft_halving_reduce_scatter_start(weft_coll *coll) {
  halving_state *hs = WEFT_ALGO_STATE(coll, halving_state);
  int n = coll->size;
  size_t block = coll->count * coll->elem;
  /* a power of two, and the first round's half fits one message */
  if (n < 2 || (n & (n - 1)) || block * (size_t)(n / 2) > coll->chunk_bytes)
    return WEFT_ERR_INTERNAL;
  *hs = (halving_state){.block = block, .dist = n / 2};
  coll->algo = "recursive halving";
  coll->advance = weft_step_nothing;
  if (block == 0) return WEFT_OK;
  void *work;
  WEFT_CHECK(weft_coll_scratch(coll, block * (size_t)n, &work));
  hs->work = work;
  coll->advance = halving_advance;
  return WEFT_OK;
}
