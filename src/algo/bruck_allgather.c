/* bruck_allgather.c - latency-optimal allgather for small outputs (Bruck et
 * al.): ceil(log2 size) rounds for any group size, where the ring needs
 * size-1 serial steps. Each member gathers blocks in a scratch buffer of
 * size blocks, in its own order: slot i holds member (rank+i)'s block. In
 * the round of distance k (1, 2, 4, ..) it holds k blocks, sends the first
 * min(k, size-k) to member rank-k and appends as many from member rank+k
 * (whose slot i is our slot k+i). At the end each slot is copied to its
 * member's place in recvbuf. The sends read the scratch, which is freed when
 * the call ends: the last step waits until every send has left it. Needs the
 * whole output to fit one chunk, so every message is one send. */
#include "src/algo/algo.h"

typedef struct bruck_state {
  char *held;      /* scratch, size blocks in this member's order */
  size_t block;    /* bytes per member's block */
  int dist;        /* this round's distance k; >= size: every round done */
  bool copied_own; /* slot 0 holds this member's block */
  bool sent, got;  /* this round's send is posted, its blocks are in */
  int idle_round;  /* the final wait: rounds whose send is known complete */
} bruck_state;
_Static_assert(sizeof(bruck_state) <= WEFT_ALGO_STATE_BYTES,
               "bruck_state fits weft_coll.algo_state");

static int bruck_round_blocks(int dist, int n) {
  return dist < n - dist ? dist : n - dist;
}

/* One round: the send and the receive go whichever can, neither waits for
 * the other (the partners of a round are distinct members). */
static weft_status bruck_round(weft_coll *coll, bruck_state *bs) {
  int n = coll->size, k = bs->dist;
  size_t bytes = (size_t)bruck_round_blocks(k, n) * bs->block;
  for (;;) {
    bool moved = false;
    weft_status st;
    if (!bs->sent) {
      st = weft_step_send(coll, weft_mod(coll->rank - k, n), bs->held, bytes, WEFT_SEND_FOR_COPY);
      WEFT_CHECK(st);
      bs->sent = st == WEFT_OK;
      moved |= bs->sent;
    }
    if (!bs->got) {
      char *dst = bs->held + (size_t)k * bs->block;
      st = weft_link_recv(coll, (coll->rank + k) % n, bytes, dst);
      WEFT_CHECK(st);
      bs->got = st == WEFT_OK;
      moved |= bs->got;
    }
    if (bs->sent && bs->got) return WEFT_OK;
    if (!moved) return WEFT_AGAIN;
  }
}

static weft_status bruck_advance(weft_coll *coll) {
  bruck_state *bs = WEFT_ALGO_STATE(coll, bruck_state);
  int n = coll->size, r = coll->rank;
  /* read now, not at issue: an earlier call may still be writing sendbuf */
  if (!bs->copied_own) {
    coll->mem->copy(bs->held, coll->sendbuf, bs->block);
    bs->copied_own = true;
  }
  while (bs->dist < n) {
    WEFT_STEP(bruck_round(coll, bs));
    bs->sent = bs->got = false;
    bs->dist *= 2;
  }
  /* every send read the scratch: it must have left before the call frees it */
  for (; (1 << bs->idle_round) < n; bs->idle_round++)
    WEFT_STEP(weft_link_send_idle(coll, weft_mod(r - (1 << bs->idle_round), n)));
  for (int i = 0; i < n; i++) {
    char *place = (char *)coll->recvbuf + (size_t)((r + i) % n) * bs->block;
    coll->mem->copy(place, bs->held + (size_t)i * bs->block, bs->block);
  }
  return WEFT_OK;
}

weft_status weft_bruck_allgather_start(weft_coll *coll) {
  bruck_state *bs = WEFT_ALGO_STATE(coll, bruck_state);
  size_t block = coll->count * coll->elem;
  if (block * (size_t)coll->size > coll->chunk_bytes) return WEFT_ERR_INTERNAL;
  *bs = (bruck_state){.block = block, .dist = 1};
  coll->algo = "bruck";
  coll->advance = weft_step_nothing;
  if (block == 0) return WEFT_OK;
  void *held;
  WEFT_CHECK(weft_coll_scratch(coll, block * (size_t)coll->size, &held));
  bs->held = held;
  coll->advance = bruck_advance;
  return WEFT_OK;
}
