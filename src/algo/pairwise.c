/* pairwise.c - alltoall and allgather in size-1 rounds: in round k rank r
 * sends to rank (r+k)%n and receives from rank (r-k)%n; alltoall sends that
 * rank's block, allgather its own block every time. Each directed link
 * carries exactly one round's data, every rank sends and receives one block
 * per round (no hot spot), and within a round sends and receives are
 * interleaved chunk by chunk, whichever can move, so neither direction
 * waits for the other. The own block is a local copy.
 *
 * For allgather this is the alternative to the ring where links are stores
 * (shm): every block comes from its owner, so no rank waits for another to
 * forward it, and with single copy (transport.h, send_for_copy) each is
 * read once, straight from the owner's buffer into the receiver's. */
#include "src/algo/algo.h"

typedef struct a2a_state {
  size_t chunk_elems;
  size_t nchunks;     /* chunks per block */
  int round;          /* 1 .. size-1 */
  size_t sent, recvd; /* chunks of this round sent and received */
  bool own_block;     /* allgather: every round sends this rank's own block */
} a2a_state;
_Static_assert(sizeof(a2a_state) <= WEFT_ALGO_STATE_BYTES, "a2a_state fits weft_coll.algo_state");

static weft_status a2a_round(weft_coll *coll, int to, int from) {
  a2a_state *fs = WEFT_ALGO_STATE(coll, a2a_state);
  for (;;) {
    bool moved = false;
    weft_status st;
    size_t off, cnt;
    if (fs->sent < fs->nchunks) {
      weft_chunk_range(fs->sent, fs->chunk_elems, coll->count, &off, &cnt);
      size_t block = fs->own_block ? 0 : (size_t)to * coll->count;
      const char *src = (const char *)coll->sendbuf + (block + off) * coll->elem;
      st = weft_step_send_for_copy(coll, to, src, cnt * coll->elem);
      WEFT_CHECK(st);
      if (st == WEFT_OK) fs->sent++, moved = true;
    }
    /* receives last: when both wait, the driver sleeps on the data to come */
    if (fs->recvd < fs->nchunks) {
      weft_chunk_range(fs->recvd, fs->chunk_elems, coll->count, &off, &cnt);
      char *dst = (char *)coll->recvbuf + ((size_t)from * coll->count + off) * coll->elem;
      st = weft_link_recv_into(coll, from, cnt * coll->elem, dst);
      WEFT_CHECK(st);
      if (st == WEFT_OK) fs->recvd++, moved = true;
    }
    if (fs->sent == fs->nchunks && fs->recvd == fs->nchunks) return WEFT_OK;
    if (!moved) return WEFT_AGAIN;
  }
}

static weft_status a2a_advance(weft_coll *coll) {
  a2a_state *fs = WEFT_ALGO_STATE(coll, a2a_state);
  int n = coll->size, r = coll->rank;
  while (fs->round < n) {
    WEFT_STEP(a2a_round(coll, (r + fs->round) % n, weft_mod(r - fs->round, n)));
    fs->round++;
    fs->sent = fs->recvd = 0;
  }
  return WEFT_OK;
}

static void pairwise_start(weft_coll *coll, bool own_block) {
  a2a_state *fs = WEFT_ALGO_STATE(coll, a2a_state);
  *fs = (a2a_state){.chunk_elems = weft_chunk_elems(coll), .round = 1, .own_block = own_block};
  fs->nchunks = (coll->count + fs->chunk_elems - 1) / fs->chunk_elems;
  size_t block = coll->count * coll->elem, mine = (size_t)coll->rank * block;
  const char *src = (const char *)coll->sendbuf + (own_block ? 0 : mine);
  char *dst = (char *)coll->recvbuf + mine;
  if (dst != src) coll->mem->copy(dst, src, block);
  coll->algo = "pairwise";
  coll->advance = a2a_advance;
}

weft_status weft_pairwise_alltoall_start(weft_coll *coll) {
  pairwise_start(coll, false);
  return WEFT_OK;
}

weft_status weft_pairwise_allgather_start(weft_coll *coll) {
  pairwise_start(coll, true);
  return WEFT_OK;
}
