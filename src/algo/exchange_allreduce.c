/* exchange_allreduce.c - allreduce of a small buffer in one round: every
 * member sends its whole buffer to every other member, then folds all of them
 * in member order.
 *
 * Why, beside recursive doubling: on one host with more ranks than cores,
 * what a small allreduce costs is the number of times the kernel has to
 * switch ranks on a core, not bytes. Here a rank that has sent everything
 * needs nothing more from its core-mate but its message, so each core runs
 * each of its ranks once to send and once to fold, however the kernel placed
 * them. Recursive doubling needs a third switch when both partners of every
 * round sit on different cores, and an unpinned run lands on either placement
 * (or worse) by chance (docs/tuning.md, "More ranks than cores").
 *
 * Every member folds the same values in the same order with the same
 * function, so the results are the same bits on every rank without relying
 * on the operation being commutative.
 *
 * Asking: the exchange pays only where every send is a store (transport.h,
 * sends_are_stores), and whether that holds for every pair of ranks is known
 * to each rank for its own pairs only. So the first exchange of a
 * communicator sends, before the data, a word saying whether all of this
 * rank's peers are reached with stores; every rank folds the same words and
 * reaches the same verdict, which the call reports (outcome.exchange_verdict)
 * and coll.c keeps for later calls to choose by. */
#include "src/algo/algo.h"

typedef struct exchange_state {
  int phase;
  int next;        /* peers (send, drain) or members (fold) done in this phase */
  const void *own; /* what we send: sendbuf, or a copy of it when in place */
  bool folded;     /* the current member's data is folded, its release may be pending */
  uint32_t word;   /* asking: 1 when all of this rank's peers are reached with stores */
  uint32_t *words; /* asking: scratch, every member's word; NULL when not asking */
} exchange_state;
_Static_assert(sizeof(exchange_state) <= WEFT_ALGO_STATE_BYTES,
               "exchange_state fits weft_coll.algo_state");

enum {
  EXCHANGE_COPY, /* in place: the input into the scratch first */
  EXCHANGE_SEND_WORD,
  EXCHANGE_RECV_WORDS,
  EXCHANGE_SEND,
  EXCHANGE_FOLD,
  EXCHANGE_DRAIN
};

static weft_status exchange_advance(weft_coll *coll) {
  exchange_state *x = WEFT_ALGO_STATE(coll, exchange_state);
  int n = coll->size, r = coll->rank;
  size_t bytes = coll->count * coll->elem;
  switch (x->phase) {
    case EXCHANGE_COPY:
      /* in the first advance, not at the start: staged or device buffers
       * are not there yet when the call starts */
      coll->mem->copy((void *)x->own, coll->sendbuf, bytes);
      x->phase = x->words ? EXCHANGE_SEND_WORD : EXCHANGE_SEND;
      return exchange_advance(coll);
    case EXCHANGE_SEND_WORD: /* asking only: the word goes before the data */
      WEFT_STEP(weft_step_send_all(coll, &x->next, &x->word, sizeof x->word));
      x->phase++;
      /* fall through */
    case EXCHANGE_RECV_WORDS: {
      WEFT_STEP(weft_step_recv_all(coll, &x->next, x->words, sizeof x->word));
      bool all = x->word == 1;
      for (int m = 0; m < n; m++) all &= m == r || x->words[m] == 1;
      coll->outcome.exchange_verdict = all ? 1 : -1;
      x->phase++;
    }
      /* fall through */
    case EXCHANGE_SEND:
      WEFT_STEP(weft_step_send_all(coll, &x->next, x->own, bytes));
      x->phase++;
      /* fall through */
    case EXCHANGE_FOLD:
      for (; x->next < n; x->next++, x->folded = false) {
        int m = x->next;
        if (!x->folded) {
          const void *value = x->own;
          if (m != r) WEFT_STEP(weft_link_recv_peek(coll, m, bytes, &value));
          if (m == 0)
            coll->mem->copy(coll->recvbuf, value, bytes);
          else
            coll->mem->reduce(coll->recvbuf, coll->recvbuf, value, coll->count, coll->dtype,
                              coll->op, 1);
          x->folded = true;
        }
        if (m != r) WEFT_STEP(weft_link_recv_release(coll, m));
      }
      coll->mem->finish(coll->recvbuf, coll->recvbuf, coll->count, coll->dtype, coll->op,
                        coll->avg_div);
      x->next = 0;
      x->phase++;
      /* fall through */
    case EXCHANGE_DRAIN:
      /* x->own (the caller's sendbuf, or our scratch) must outlive every send */
      for (; x->next < n - 1; x->next++)
        WEFT_STEP(weft_link_send_idle(coll, (r + 1 + x->next) % n));
      x->phase++;
  }
  return WEFT_OK;
}

weft_status weft_exchange_allreduce_start(weft_coll *coll, bool asking) {
  size_t bytes = coll->count * coll->elem;
  if (bytes > coll->chunk_bytes) return WEFT_ERR_INTERNAL;
  /* f32 on the wire: one round of small messages costs latency, not bytes;
   * every rank folds the exact values (docs/tuning.md) */
  coll->wire = WEFT_F32;
  /* one scratch: a copy of the input when in place (recvbuf takes partial
   * results while the sends may still read their source, and before our own
   * turn in the fold comes), then every member's word when asking */
  bool in_place = coll->sendbuf == coll->recvbuf;
  size_t copy_bytes = in_place ? (bytes + 7) / 8 * 8 : 0;
  size_t word_bytes = asking ? sizeof(uint32_t) * (size_t)coll->size : 0;
  char *scratch = NULL;
  if (copy_bytes + word_bytes)
    WEFT_CHECK(weft_coll_scratch(coll, copy_bytes + word_bytes, (void **)&scratch));
  const void *own = in_place ? scratch : coll->sendbuf; /* copied in EXCHANGE_COPY */
  *WEFT_ALGO_STATE(coll, exchange_state) =
      (exchange_state){.phase = in_place ? EXCHANGE_COPY
                                : asking ? EXCHANGE_SEND_WORD
                                         : EXCHANGE_SEND,
                       .own = own,
                       .word = coll->hint.sends_are_stores ? 1 : 0,
                       .words = asking ? (uint32_t *)(scratch + copy_bytes) : NULL};
  coll->algo = "exchange";
  coll->advance = exchange_advance;
  return WEFT_OK;
}
