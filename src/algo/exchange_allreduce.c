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
 * round sit on different cores: 4 ranks pinned 2 per core took 10.6 us for
 * 8 bytes when one round's partners shared a core and 20 us when none did,
 * and an unpinned run lands on either (or worse) by chance.
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
 * keeps the same verdict (comm->exchange_verdict), which coll.c consults when
 * later calls start. */
#include <string.h>

#include "algo.h"

enum { EXCHANGE_SEND, EXCHANGE_FOLD, EXCHANGE_DRAIN, EXCHANGE_DONE };

static weft_status exchange_advance(weft_coll *coll) {
  weft_exchange_state *x = &coll->st.exchange;
  int n = coll->size, r = coll->rank;
  size_t bytes = coll->count * coll->elem;
  if (x->phase == EXCHANGE_SEND) {
    /* starting after ourselves spreads the first messages over the peers */
    while (x->next < n - 1) {
      int peer = (r + 1 + x->next) % n;
      if (x->asking && !x->word_sent) {
        WEFT_STEP(weft_step_send(coll, peer, &x->word, sizeof x->word));
        x->word_sent = true;
      }
      WEFT_STEP(weft_link_send_ready(coll, peer));
      WEFT_STEP(weft_link_send(coll, peer, x->own, bytes));
      x->word_sent = false;
      x->next++;
    }
    x->phase = EXCHANGE_FOLD;
    x->next = 0;
  }
  if (x->phase == EXCHANGE_FOLD) {
    while (x->next < n) {
      int m = x->next;
      const void *value = x->own;
      if (m != r && x->asking && !x->word_got) {
        WEFT_STEP(weft_link_recv_peek(coll, m, sizeof x->word, &value));
        uint32_t word;
        memcpy(&word, value, sizeof word);
        x->all_stores &= word == 1;
        x->word_got = true;
        WEFT_STEP(weft_link_recv_release(coll, m));
      }
      if (!x->folded) {
        if (m != r) WEFT_STEP(weft_link_recv_peek(coll, m, bytes, &value));
        if (m == 0)
          coll->mem->copy(coll->recvbuf, value, bytes);
        else
          coll->mem->reduce(coll->recvbuf, coll->recvbuf, value, coll->count, coll->dtype,
                            coll->op, 1);
        x->folded = true;
      }
      if (m != r) WEFT_STEP(weft_link_recv_release(coll, m));
      x->next++;
      x->word_got = x->folded = false;
    }
    coll->mem->finish(coll->recvbuf, coll->recvbuf, coll->count, coll->dtype, coll->op,
                      coll->avg_div);
    if (x->asking) coll->comm->exchange_verdict = x->all_stores ? 1 : -1;
    x->phase = EXCHANGE_DRAIN;
    x->next = 0;
  }
  if (x->phase == EXCHANGE_DRAIN) {
    /* x->own (the caller's sendbuf, or our scratch) must outlive every send */
    while (x->next < n - 1) {
      WEFT_STEP(weft_link_send_idle(coll, (r + 1 + x->next) % n));
      x->next++;
    }
    x->phase = EXCHANGE_DONE;
  }
  return WEFT_OK;
}

weft_status weft_exchange_allreduce_start(weft_coll *coll, bool asking) {
  size_t bytes = coll->count * coll->elem;
  if (bytes > coll->comm->chunk_bytes) return WEFT_ERR_INTERNAL;
  const void *own = coll->sendbuf;
  if (coll->sendbuf == coll->recvbuf) {
    /* in place: recvbuf takes partial results while the sends may still
     * read their source, and before our own turn in the fold comes */
    void *copy;
    WEFT_CHECK(weft_coll_scratch(coll, bytes, &copy));
    coll->mem->copy(copy, coll->sendbuf, bytes);
    own = copy;
  }
  bool mine = coll->comm->sends_are_stores;
  coll->st.exchange = (weft_exchange_state){.phase = EXCHANGE_SEND,
                                            .own = own,
                                            .asking = asking,
                                            .word = mine ? 1 : 0,
                                            .all_stores = mine};
  coll->algo = "exchange";
  coll->advance = exchange_advance;
  return WEFT_OK;
}
