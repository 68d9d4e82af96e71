/* ring_allreduce.c - bandwidth-optimal allreduce: reduce-scatter then
 * allgather around the ring, chunked so that every link carries a chunk
 * while every rank reduces the previous one. The buffer is cut into loops of
 * size*chunk elements; in each loop rank r walks 2(size-1)+1 steps:
 *   step 0          send its own chunk r to the right
 *   steps 1..n-2    receive chunk (r-s) from the left, add its own, send on
 *   step n-1        the same, now complete (divided for avg): it is final
 *   steps n..2n-3   receive a final chunk into the output, send it on
 *   step 2n-2       receive the last final chunk
 * Final values are computed on one rank and copied, so every rank ends with
 * the same bits. Between two ranks the same chunks move as two streams each
 * way instead of a round trip per loop (pair_advance, below). */
#include "src/algo/algo.h"

typedef struct ring_state {
  size_t loop_elems; /* elements per loop: size * chunk_elems */
  size_t chunk_elems;
  size_t loops;
  size_t loop;
  int step;   /* 0 .. 2*(size-1) */
  bool got;   /* this step's chunk is received */
  bool ahead; /* the next loop's step 0 went out during this loop's last step */
  /* two ranks (pair_advance): loops done so far in each of the four streams */
  size_t sent_own, reduced, sent_final, got_final;
} ring_state;
_Static_assert(sizeof(ring_state) <= WEFT_ALGO_STATE_BYTES, "ring_state fits weft_coll.algo_state");

static size_t min_sz(size_t a, size_t b) {
  return a < b ? a : b;
}

/* Element range of chunk c in loop `loop`. The last loop may be short:
 * it is split evenly, so some chunks can be empty (both ends agree). */
static void ring_chunk_of(const weft_coll *coll, size_t loop, int c, size_t *off, size_t *cnt) {
  const ring_state *rs = WEFT_ALGO_STATE(coll, const ring_state);
  size_t base = loop * rs->loop_elems;
  size_t rem = min_sz(rs->loop_elems, coll->count - base);
  size_t n = (size_t)coll->size;
  size_t cs = rem == rs->loop_elems ? rs->chunk_elems : (rem + n - 1) / n;
  size_t start = min_sz((size_t)c * cs, rem);
  *off = base + start;
  *cnt = min_sz(cs, rem - start);
}

static void ring_chunk(const weft_coll *coll, int c, size_t *off, size_t *cnt) {
  ring_chunk_of(coll, WEFT_ALGO_STATE(coll, const ring_state)->loop, c, off, cnt);
}

/* A loop's last step only receives; the next loop's step 0 only sends this
 * rank's own chunk, which nothing in this loop writes. So it goes first,
 * when there is room: the link to the right carries the same chunks in the
 * same order either way (it is the next send to the right in any case), but
 * need not idle while this receive waits. On a link bounded by its rate or
 * its latency (tbf between namespaces, 4 ranks sharing 2 cores) that gap
 * was a round trip per loop. OK also when there is no room now: the
 * receive goes on, and step 0 is done in its turn. */
static weft_status ring_send_ahead(weft_coll *coll) {
  ring_state *rs = WEFT_ALGO_STATE(coll, ring_state);
  if (rs->ahead || rs->loop + 1 >= rs->loops) return WEFT_OK;
  int r = coll->rank;
  size_t off, cnt;
  ring_chunk_of(coll, rs->loop + 1, r, &off, &cnt);
  weft_status st = WEFT_OK;
  int right = weft_mod(r + 1, coll->size);
  if (cnt) /* the point is to be early: it moves now */
    st = weft_step_send(coll, right, (const char *)coll->sendbuf + off * coll->elem,
                        cnt * coll->elem, WEFT_SEND_NOW);
  if (st == WEFT_OK) rs->ahead = true;
  return st < 0 ? st : WEFT_OK;
}

/* One step; OK when done, AGAIN when waiting (re-entered later). */
static weft_status ring_step(weft_coll *coll) {
  ring_state *rs = WEFT_ALGO_STATE(coll, ring_state);
  int n = coll->size, r = coll->rank, s = rs->step;
  int left = weft_mod(r - 1, n), right = weft_mod(r + 1, n);
  int c = weft_mod(r - s, n);
  size_t off, cnt;
  ring_chunk(coll, c, &off, &cnt);
  if (cnt == 0) return WEFT_OK;
  size_t bytes = cnt * coll->elem;
  char *out = (char *)coll->recvbuf + off * coll->elem;
  const char *in = (const char *)coll->sendbuf + off * coll->elem;

  /* Every send of an allreduce is on the ring's path: the right neighbour
   * reduces it and passes it on (docs/tuning.md, "Sends on a pipeline's
   * path"). */
  if (s == 0) return weft_step_send(coll, right, in, bytes, WEFT_SEND_NOW);
  /* reduce-scatter: receive, add own, pass on */
  if (s < n - 1) return weft_step_recv_reduce(coll, left, right, out, in, cnt, 1, -1);
  /* at n-1 final (divided for avg): the right takes it into its output (a
   * forward step), so it goes for copy */
  if (s == n - 1)
    return weft_step_recv_reduce_final(coll, left, right, out, in, cnt, coll->avg_div);
  /* allgather: the chunk lands straight in the output, then moves on */
  return weft_step_recv_forward(coll, left, s == 2 * n - 2 ? -1 : right, out, bytes, &rs->got);
}

static weft_status ring_advance(weft_coll *coll) {
  ring_state *rs = WEFT_ALGO_STATE(coll, ring_state);
  int last_step = 2 * (coll->size - 1);
  while (rs->loop < rs->loops) {
    if (rs->step == last_step) WEFT_CHECK(ring_send_ahead(coll));
    WEFT_STEP(ring_step(coll));
    rs->got = false;
    if (++rs->step > last_step) {
      rs->step = rs->ahead ? 1 : 0;
      rs->ahead = false;
      rs->loop++;
    }
  }
  return WEFT_OK;
}

/* ---- two ranks: two streams each way, not a round trip per loop ----
 *
 * Between two ranks each loop of the ring is a round trip; instead the same
 * chunks move as two streams each way: every loop's own chunk r (the peer
 * finalizes it) goes out as fast as the link takes it, up to
 * WEFT_PAIR_LEAD_LOOPS ahead of the finals; the peer's chunks come in, in
 * order, and are reduced into the output, final, and the finals follow on
 * the same link. Each link carries own chunks 0 .. lead-1, then final l and
 * own chunk l + lead in turn, then the last finals: on both ranks in the
 * same order (the lead is a constant for that), so the receiver always
 * knows which it is reading. The bound keeps the finals in the cache
 * (docs/tuning.md, "Two ranks: streams instead of a ring"). In place, the
 * final chunk r that lands where own chunk r was sent from comes only after
 * the peer has taken all of it. A wire dtype keeps the ring (its single
 * stage rounds what it sends and keeps). */
static weft_status pair_advance(weft_coll *coll) {
  ring_state *rs = WEFT_ALGO_STATE(coll, ring_state);
  int r = coll->rank, p = 1 - r;
  size_t lead = WEFT_PAIR_LEAD_LOOPS, loops = rs->loops;
  for (;;) {
    bool moved = false;
    weft_status st = WEFT_OK;
    size_t off, cnt;
    /* own chunk l goes after final l - lead (the first `lead` go at once) */
    while (rs->sent_own < loops && rs->sent_own < rs->sent_final + lead) {
      ring_chunk_of(coll, rs->sent_own, r, &off, &cnt);
      if (cnt) {
        st = weft_step_send(coll, p, (const char *)coll->sendbuf + off * coll->elem,
                            cnt * coll->elem, WEFT_SEND_NOW);
        if (st == WEFT_AGAIN) break;
        WEFT_CHECK(st);
      }
      rs->sent_own++;
    }
    /* the peer's own chunk l comes after its final l - lead */
    while (rs->reduced < loops && rs->reduced < rs->got_final + lead) {
      ring_chunk_of(coll, rs->reduced, p, &off, &cnt);
      if (cnt) {
        st = weft_step_recv_reduce(coll, p, -1, (char *)coll->recvbuf + off * coll->elem,
                                   (const char *)coll->sendbuf + off * coll->elem, cnt,
                                   coll->avg_div, -1);
        if (st == WEFT_AGAIN) break;
        WEFT_CHECK(st);
        moved = true;
      }
      rs->reduced++;
    }
    /* final l goes after own chunk l + lead - 1 (or the last one) */
    while (rs->sent_final < rs->reduced && rs->sent_own >= min_sz(rs->sent_final + lead, loops)) {
      ring_chunk_of(coll, rs->sent_final, p, &off, &cnt);
      if (cnt) {
        st = weft_step_send(coll, p, (const char *)coll->recvbuf + off * coll->elem,
                            cnt * coll->elem, WEFT_SEND_FOR_COPY | WEFT_SEND_NOW);
        if (st == WEFT_AGAIN) break;
        WEFT_CHECK(st);
      }
      rs->sent_final++;
      moved = true; /* it may let the next own chunk go */
    }
    /* the peer's final l comes after its own chunk l + lead - 1 */
    while (rs->got_final < loops && rs->reduced >= min_sz(rs->got_final + lead, loops)) {
      ring_chunk_of(coll, rs->got_final, r, &off, &cnt);
      if (cnt) {
        st = weft_link_recv(coll, p, cnt * coll->elem, (char *)coll->recvbuf + off * coll->elem);
        if (st == WEFT_AGAIN) break;
        WEFT_CHECK(st);
        moved = true;
      }
      rs->got_final++;
    }
    if (rs->got_final == loops && rs->sent_final == loops) return WEFT_OK;
    if (!moved) return WEFT_AGAIN;
  }
}

weft_status weft_ring_allreduce_start(weft_coll *coll) {
  ring_state *rs = WEFT_ALGO_STATE(coll, ring_state);
  size_t n = (size_t)coll->size;
  rs->chunk_elems = weft_chunk_elems(coll);
  rs->loop_elems = n * rs->chunk_elems;
  rs->loops = (coll->count + rs->loop_elems - 1) / rs->loop_elems;
  rs->loop = 0;
  rs->step = 0;
  rs->got = false;
  rs->ahead = false;
  rs->sent_own = rs->reduced = rs->sent_final = rs->got_final = 0;
  coll->algo = "ring";
  coll->advance = ring_advance;
  if (n == 2 && !weft_wire_on(coll)) coll->advance = pair_advance;
  return WEFT_OK;
}
