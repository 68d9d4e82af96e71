/* pairwise.c - alltoall and allgather in size-1 rounds: in round k rank r
 * sends to rank (r+k)%n and receives from rank (r-k)%n; alltoall sends that
 * rank's block, allgather its own block every time. Each directed link
 * carries exactly one round's data, every rank sends and receives one block
 * per round (no hot spot). Sends and receives walk the rounds on cursors of
 * their own, whichever can move (a receive takes the run of a block's
 * chunks that has come, link.h recv_run; the sends keep pace): neither
 * direction waits for the other, and a rank whose sends of round k are
 * posted goes on to round k+1's while round k's data is still coming in
 * (every round is a link of its own, so nothing on a link changes order;
 * over sockets the old barrier between rounds idled every link once per
 * round). It cannot deadlock: round 1's sends come first on every rank
 * and its receives first on every receiver, so round 1 always completes,
 * and then round 2, and so on. The own block is a local copy, made while
 * the call waits for room or data (weft_step_with_local_copy), not before
 * its first send.
 *
 * For allgather this is the alternative to the ring where links are stores
 * (shm): every block comes from its owner, so no rank waits for another to
 * forward it, and with single copy (transport.h, send_for_copy) each is
 * read once, straight from the owner's buffer into the receiver's. */
#include "src/algo/algo.h"

typedef struct a2a_state {
  size_t chunk_elems;
  size_t nchunks;          /* chunks per block */
  int send_round;          /* 1 .. size-1; size: every send posted */
  int recv_round;          /* the same for receives */
  size_t sent, recvd;      /* chunks of those rounds sent and received */
  bool own_block;          /* allgather: every round sends this rank's own block */
  size_t own_copied;       /* bytes of the own block copied into recvbuf */
  size_t pace;             /* sends per turn: as many chunks as the last receive took */
} a2a_state;
_Static_assert(sizeof(a2a_state) <= WEFT_ALGO_STATE_BYTES, "a2a_state fits weft_coll.algo_state");

/* One chunk of the send cursor's round to its peer; OK when it went. */
static weft_status a2a_send_one(weft_coll *coll, a2a_state *fs) {
  int to = (coll->rank + fs->send_round) % coll->size;
  size_t off, cnt;
  weft_chunk_range(fs->sent, fs->chunk_elems, coll->count, &off, &cnt);
  size_t block = fs->own_block ? 0 : (size_t)to * coll->count;
  const char *src = (const char *)coll->sendbuf + (block + off) * coll->elem;
  weft_status st = weft_step_send(coll, to, src, cnt * coll->elem, WEFT_SEND_FOR_COPY);
  if (st == WEFT_OK && ++fs->sent == fs->nchunks) fs->send_round++, fs->sent = 0;
  return st;
}

/* The round's chunks that have come (one read for a run of descriptors). */
static weft_status a2a_recv_some(weft_coll *coll, a2a_state *fs) {
  int from = weft_mod(coll->rank - fs->recv_round, coll->size);
  size_t off = fs->recvd * fs->chunk_elems, taken = 0;
  char *dst = (char *)coll->recvbuf + ((size_t)from * coll->count + off) * coll->elem;
  weft_status st = weft_link_recv_run(coll, from, fs->chunk_elems * coll->elem,
                                      (coll->count - off) * coll->elem, dst, &taken);
  if (st != WEFT_OK) return st;
  fs->pace = taken;
  if ((fs->recvd += taken) == fs->nchunks) fs->recv_round++, fs->recvd = 0;
  return WEFT_OK;
}

static weft_status a2a_move(weft_coll *coll) {
  a2a_state *fs = WEFT_ALGO_STATE(coll, a2a_state);
  int n = coll->size;
  for (;;) {
    bool moved = false;
    weft_status st;
    /* The sends keep pace with the receives: where a receive reads a run
     * of descriptors at once, as many chunks go out, so that the peers find
     * runs too; else one send per receive, as before runs (over tcp and
     * through the slots, posting further ahead measured no better). The
     * first turn posts what it can of the block. */
    for (size_t k = 0; k < fs->pace && fs->send_round < n; k++) {
      st = a2a_send_one(coll, fs);
      WEFT_CHECK(st);
      moved |= st == WEFT_OK;
      if (st != WEFT_OK) break;
    }
    /* receives last: when both wait, the driver sleeps on the data to come */
    if (fs->recv_round < n) {
      st = a2a_recv_some(coll, fs);
      WEFT_CHECK(st);
      moved |= st == WEFT_OK;
    }
    if (fs->send_round == n && fs->recv_round == n) return WEFT_OK;
    if (!moved) return WEFT_AGAIN;
  }
}

static weft_status a2a_advance(weft_coll *coll) {
  a2a_state *fs = WEFT_ALGO_STATE(coll, a2a_state);
  size_t block = coll->count * coll->elem, mine = (size_t)coll->rank * block;
  const char *src = (const char *)coll->sendbuf + (fs->own_block ? 0 : mine);
  char *dst = (char *)coll->recvbuf + mine;
  return weft_step_with_local_copy(coll, a2a_move, dst, src, dst == src ? 0 : block,
                                   &fs->own_copied);
}

static void pairwise_start(weft_coll *coll, bool own_block) {
  a2a_state *fs = WEFT_ALGO_STATE(coll, a2a_state);
  *fs = (a2a_state){.chunk_elems = weft_chunk_elems(coll),
                     .send_round = 1,
                     .recv_round = 1,
                     .own_block = own_block};
  fs->nchunks = (coll->count + fs->chunk_elems - 1) / fs->chunk_elems;
  fs->pace = fs->nchunks;
  if (fs->nchunks == 0) fs->send_round = fs->recv_round = coll->size; /* nothing to move */
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
