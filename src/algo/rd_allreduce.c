/* rd_allreduce.c - latency-optimal allreduce for small buffers: recursive
 * doubling, log2(size) exchanges of the whole buffer. For a size that is not
 * a power of two, the first 2*rem ranks pair up first (the even one hands its
 * data to the odd one and sits out), and get the result back at the end.
 * Partners combine the same two values in the same order, the lower
 * member's first: sum/prod/min/max commute in value, but not in the bits
 * of a NaN (x86 keeps the first operand's), so "own op received" on both
 * sides would leave partners with other NaN signs. Works in place on
 * recvbuf; an out-of-place call sends sendbuf and combines it with the
 * first value it receives straight into recvbuf instead of copying it there
 * first, so no peer waits for that copy (docs/tuning.md, "An out-of-place
 * call's own copy does not go first"). Needs the whole buffer to fit one chunk.
 *
 * With a wire dtype (algo.h) a rank rounds its own value before it sends it
 * and combines it rounded, so both partners add the same two values; the
 * result is rounded once more at the end, before the fold-out sends it.
 *
 * The same rounds make the small reduce-scatter: every member's whole input
 * (size blocks) allreduced in a scratch copy, each keeping its own block; a
 * folded-out member gets only its block back. log2(size) rounds of a small
 * message beat the ring's size-1 steps where latency rules. */
#include "src/algo/algo.h"

typedef struct rd_state {
  int phase; /* -1 own copy (a wire dtype, out of place), 0 fold-in, 1 doubling rounds,
                2 fold-out, 3 done */
  int mask;
  bool sent;   /* this round's send is posted */
  int newrank; /* rank among the power-of-two group, -1 if folded out */
  void *buf;   /* what the rounds combine in place: recvbuf, or the reduce-scatter's scratch */
  /* this member's value until the first combine writes buf: sendbuf, which
   * an out-of-place call then never copies (rd_combine reads it, rd_send
   * sends it); buf from then on, and from the start with a wire dtype */
  const void *own;
  size_t count;
  /* reduce-scatter: this member's block of buf ends here (recvbuf, count
   * elements); NULL for the allreduce */
  void *block_out;
} rd_state;
_Static_assert(sizeof(rd_state) <= WEFT_ALGO_STATE_BYTES, "rd_state fits weft_coll.algo_state");

static int pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/* Real rank of a rank of the power-of-two group. */
static int rd_real_rank(int newrank, int rem) {
  return newrank < rem ? newrank * 2 + 1 : newrank + rem;
}

/* buf = (the lower member's value) op (the higher one's), `slot` holding
 * the peer's: the same operands in the same order on both sides. */
static void rd_combine(weft_coll *coll, int peer, const void *slot) {
  rd_state *rd = WEFT_ALGO_STATE(coll, rd_state);
  if (peer < coll->rank)
    coll->mem->reduce(rd->buf, slot, rd->own, rd->count, coll->dtype, coll->op, 1);
  else
    coll->mem->reduce(rd->buf, rd->own, slot, rd->count, coll->dtype, coll->op, 1);
  rd->own = rd->buf;
}

/* buf rounded to the wire dtype in place, the narrowed copy in the stage
 * (whose last send is complete: every exchange waits for it). */
static void rd_round(weft_coll *coll) {
  rd_state *rd = WEFT_ALGO_STATE(coll, rd_state);
  coll->mem->narrow(coll->wire_stage, rd->buf, rd->count, coll->wire);
  coll->mem->widen(rd->buf, coll->wire_stage, rd->count, coll->wire);
}

/* Sends buf to peer once it may (narrowed from the stage with a wire dtype;
 * `round_own`: rounded in buf too, as the partner will see it). */
static weft_status rd_send(weft_coll *coll, int peer, size_t bytes, bool round_own) {
  rd_state *rd = WEFT_ALGO_STATE(coll, rd_state);
  if (weft_wire_on(coll)) { /* a phase before this one (hier) may have sent from it last */
    void *stage;
    WEFT_STEP(weft_wire_stage_take(coll, &stage));
  }
  WEFT_STEP(weft_link_send_ready(coll, peer));
  if (!weft_wire_on(coll)) return weft_link_send(coll, peer, rd->own, bytes, 0);
  if (round_own)
    rd_round(coll);
  else
    coll->mem->narrow(coll->wire_stage, rd->buf, rd->count, coll->wire);
  return weft_wire_send(coll, peer, rd->count, 0);
}

/* The peer's buffer as f32: the slot itself, or widened into the stage. */
static const void *rd_peer_value(weft_coll *coll, const void *slot) {
  rd_state *rd = WEFT_ALGO_STATE(coll, rd_state);
  if (!weft_wire_on(coll)) return slot;
  void *wide = weft_wire_stage_wide(coll, rd->count);
  coll->mem->widen(wide, slot, rd->count, coll->wire);
  return wide;
}

/* The bytes of the whole buffer on the link. */
static size_t rd_link_bytes(const weft_coll *coll) {
  const rd_state *rd = (const rd_state *)(const void *)coll->algo_state;
  return weft_wire_on(coll) ? weft_wire_bytes(rd->count) : rd->count * coll->elem;
}

/* Sends our buffer to peer and folds the peer's into ours. */
static weft_status rd_exchange(weft_coll *coll, int peer, size_t bytes) {
  rd_state *rd = WEFT_ALGO_STATE(coll, rd_state);
  if (!rd->sent) {
    WEFT_STEP(rd_send(coll, peer, bytes, true));
    rd->sent = true;
  }
  const void *slot;
  WEFT_STEP(weft_link_recv_peek(coll, peer, rd_link_bytes(coll), &slot));
  WEFT_STEP(weft_link_send_idle(coll, peer)); /* recvbuf (or the stage) is about to change */
  rd_combine(coll, peer, rd_peer_value(coll, slot));
  rd->sent = false;
  return weft_link_recv_release(coll, peer);
}

static weft_status rd_advance(weft_coll *coll) {
  rd_state *rd = WEFT_ALGO_STATE(coll, rd_state);
  int n = coll->size, r = coll->rank;
  int p2 = pow2_floor(n), rem = n - p2;
  size_t bytes = rd->count * coll->elem;
  if (rd->phase == -1) {
    /* a wire dtype rounds buf in place before the first send (rd_round):
     * the input goes there first. In the first advance, not at the start:
     * staged or device buffers are not there yet when the call starts (a
     * staged input is copied in up to the first advance) */
    coll->mem->copy(coll->recvbuf, coll->sendbuf, coll->count * coll->elem);
    rd->phase = 0;
  }
  if (rd->phase == 0) { /* fold in */
    if (r < 2 * rem && r % 2 == 0) {
      if (!rd->sent) {
        WEFT_STEP(rd_send(coll, r + 1, bytes, false));
        rd->sent = true;
      }
      WEFT_STEP(weft_link_send_idle(coll, r + 1)); /* the result lands in recvbuf */
      rd->sent = false;
      rd->newrank = -1;
    } else if (r < 2 * rem) {
      const void *slot;
      WEFT_STEP(weft_link_recv_peek(coll, r - 1, rd_link_bytes(coll), &slot));
      rd_combine(coll, r - 1, rd_peer_value(coll, slot));
      WEFT_STEP(weft_link_recv_release(coll, r - 1));
      rd->newrank = r / 2;
    } else {
      rd->newrank = r - rem;
    }
    rd->phase = 1;
    rd->mask = 1;
  }
  if (rd->phase == 1) { /* doubling rounds */
    while (rd->newrank >= 0 && rd->mask < p2) {
      WEFT_STEP(rd_exchange(coll, rd_real_rank(rd->newrank ^ rd->mask, rem), bytes));
      rd->mask <<= 1;
    }
    if (rd->newrank >= 0) {
      coll->mem->finish(rd->buf, rd->buf, rd->count, coll->dtype, coll->op, coll->avg_div);
      /* the result as the fold-out sends it, on every rank alike */
      if (weft_wire_on(coll)) rd_round(coll);
    }
    rd->phase = 2;
  }
  if (rd->phase == 2 && rd->block_out) { /* reduce-scatter: each member's block only */
    size_t block = coll->count * coll->elem;
    char *blocks = rd->buf;
    if (r < 2 * rem && r % 2 == 1) {
      if (!rd->sent) {
        WEFT_STEP(weft_step_send(coll, r - 1, blocks + (size_t)(r - 1) * block, block,
                                 WEFT_SEND_FOR_COPY));
        rd->sent = true;
      }
      WEFT_STEP(weft_link_send_idle(coll, r - 1)); /* the scratch is freed when the call ends */
    }
    if (r < 2 * rem && r % 2 == 0)
      WEFT_STEP(weft_link_recv(coll, r + 1, block, rd->block_out));
    else
      coll->mem->copy(rd->block_out, blocks + (size_t)r * block, block);
    rd->phase = 3;
  }
  if (rd->phase == 2) { /* fold out: the odd partner returns the result */
    if (r < 2 * rem && r % 2 == 1) {
      WEFT_STEP(rd_send(coll, r - 1, bytes, false)); /* the stage holds the rounded result */
    } else if (r < 2 * rem && weft_wire_on(coll)) {
      const void *slot;
      WEFT_STEP(weft_link_recv_peek(coll, r + 1, rd_link_bytes(coll), &slot));
      coll->mem->widen(coll->recvbuf, slot, coll->count, coll->wire);
      WEFT_STEP(weft_link_recv_release(coll, r + 1));
    } else if (r < 2 * rem) {
      WEFT_STEP(weft_link_recv(coll, r + 1, bytes, coll->recvbuf));
    }
    rd->phase = 3;
  }
  return WEFT_OK;
}

weft_status weft_rd_allreduce_start(weft_coll *coll) {
  if (coll->count * coll->elem > coll->chunk_bytes) return WEFT_ERR_INTERNAL;
  /* a wire dtype rounds buf in place before the first send (rd_round):
   * the input is copied there first (phase -1) */
  bool wire = weft_wire_on(coll);
  *WEFT_ALGO_STATE(coll, rd_state) = (rd_state){.phase = wire && coll->sendbuf != coll->recvbuf ? -1 : 0,
                                                .mask = 1,
                                                .sent = false,
                                                .newrank = -1,
                                                .buf = coll->recvbuf,
                                                .own = wire ? coll->recvbuf : coll->sendbuf,
                                                .count = coll->count};
  coll->algo = "recursive doubling";
  coll->advance = rd_advance;
  return WEFT_OK;
}

weft_status weft_rd_reduce_scatter_start(weft_coll *coll) {
  size_t whole = (size_t)coll->size * coll->count;
  /* the wire stage holds one block's chunk, not the whole input: the ring carries those */
  if (whole * coll->elem > coll->chunk_bytes || weft_wire_on(coll)) return WEFT_ERR_INTERNAL;
  coll->algo = "recursive doubling";
  coll->advance = weft_step_nothing;
  if (whole == 0) return WEFT_OK;
  void *scratch;
  WEFT_CHECK(weft_coll_scratch(coll, whole * coll->elem, &scratch));
  *WEFT_ALGO_STATE(coll, rd_state) = (rd_state){.phase = 0,
                                                .mask = 1,
                                                .sent = false,
                                                .newrank = -1,
                                                .buf = scratch,
                                                .own = coll->sendbuf,
                                                .count = whole,
                                                .block_out = coll->recvbuf};
  coll->algo = "recursive doubling";
  coll->advance = rd_advance;
  return WEFT_OK;
}
