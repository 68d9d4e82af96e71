/* test_shm_cma.c - single copy in the shared-memory transport: a chunk sent
 * for copy is read by the receiver straight from the sender's memory
 * (process_vm_readv), only where the probe at connection said the kernel
 * allows it, and is complete for the sender only once the receiver copied
 * it. Three levels:
 *  - a pair of contexts in this process: which chunks go by single copy
 *    (the connection's counter; sizes around WEFT_SHM_CMA_MIN_BYTES), that
 *    send_idle waits for the receiver, that a peek still gets the bytes,
 *    and the fallbacks (WEFT_SHM_CMA=0, a probe that fails);
 *  - two processes: a sender that ends after posting leaves its receiver a
 *    PEER_LOST naming it, at once, not a crash or a hang;
 *  - allgather, alltoall, broadcast, gather and scatter over shm at 2 and 3
 *    ranks on random data around the threshold, against a reference each
 *    rank computes from every rank's seed, with the single copies counted
 *    from the WEFT_DEBUG lines each rank logs. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <cmocka.h>

#include "harness.h"
#include "src/base/auth.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "src/topo/select.h"
#include "transports/shm/shm.h"
#include "transports/transport.h"

#define CHUNK 65536
#define MIN_BYTES 16384 /* WEFT_SHM_CMA_MIN_BYTES in these tests */

static const weft_transport *shm = &weft_transport_shm;

/* ---- a pair of contexts in this process ------------------------------------ */

typedef struct pair {
  weft_place place;
  weft_auth_key key;
  weft_error_sink sink[2];
  weft_transport_init_args args[2];
  uint8_t addr[2][WEFT_TRANSPORT_ADDR_MAX];
  size_t alen[2];
  weft_tp_ctx *ctx[2];
  weft_tp_conn *tx, *rx; /* rank 0 -> 1 on the collectives' channel */
} pair;

static void drive(pair *p) {
  bool moved;
  shm->progress(p->ctx[0], &moved);
  shm->progress(p->ctx[1], &moved);
}

/* `cma`: WEFT_SHM_CMA for both ranks; `local_size`: ranks of the host they
 * say (auto keeps single copy where ranks outnumber cores). */
static void pair_open_local(pair *p, const char *cma, int local_size) {
  memset(p, 0, sizeof *p);
  setenv("WEFT_SHM_CMA", cma, 1);
  setenv("WEFT_SHM_CMA_MIN_BYTES", "16384", 1);
  weft_settings_reload();
  weft_place_here(NULL, &p->place);
  weft_auth_key_for_job(NULL, 0, &p->key);
  static uint64_t pairs_made;
  uint64_t comm_id = ((uint64_t)getpid() << 24) ^ (0xc3a0 + ++pairs_made);
  for (int r = 0; r < 2; r++) {
    p->args[r] = (weft_transport_init_args){.rank = r,
                                            .size = 2,
                                            .comm_id = comm_id,
                                            .chunk_bytes = CHUNK,
                                            .timeout_s = 5,
                                            .wake_fd = -1,
                                            .errors = &p->sink[r],
                                            .place = &p->place,
                                            .auth = &p->key,
                                            .local_size = local_size};
    if (shm->init(&p->args[r], &p->ctx[r], p->addr[r], &p->alen[r]))
      fail_msg("shm init rank %d: %s", r, p->sink[r].msg);
  }
  assert_int_equal(shm->connect(p->ctx[1], 0, 0, p->addr[0], p->alen[0], &p->rx), WEFT_OK);
  assert_int_equal(shm->connect(p->ctx[0], 1, 0, p->addr[1], p->alen[1], &p->tx), WEFT_OK);
  double deadline = harness_now() + 5;
  while (shm->send_ready(p->tx) == WEFT_AGAIN && harness_now() < deadline) drive(p);
  assert_int_equal(shm->send_ready(p->tx), WEFT_OK);
}

static void pair_open(pair *p, const char *cma) {
  pair_open_local(p, cma, 2);
}

static void pair_close(pair *p) {
  shm->fini(p->ctx[0]);
  shm->fini(p->ctx[1]);
  unsetenv("WEFT_SHM_CMA");
  unsetenv("WEFT_SHM_CMA_MIN_BYTES");
  unsetenv("WEFT_SHM_CMA_STREAM_BYTES");
  weft_settings_reload();
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void fill_random(unsigned char *buf, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(rng_next(&s) >> 24);
}

static void post(pair *p, const void *src, size_t bytes, uint32_t seq) {
  double deadline = harness_now() + 5;
  weft_status st;
  while ((st = shm->send_ready(p->tx)) == WEFT_AGAIN && harness_now() < deadline) drive(p);
  if (st || shm->send(p->tx, src, bytes, seq, &weft_mem_host, WEFT_SEND_FOR_COPY))
    fail_msg("send_for_copy #%u of %zu bytes: %s", seq, bytes, p->sink[0].msg);
}

/* Takes the next chunk into dst, with recv_into or by a peek. */
static void take(pair *p, void *dst, size_t bytes, uint32_t seq, bool peek) {
  double deadline = harness_now() + 5;
  weft_status st;
  const void *data = NULL;
  do {
    st = peek ? shm->recv_peek(p->rx, seq, bytes, &data)
              : shm->recv(p->rx, seq, bytes, bytes, dst, &weft_mem_host, &(size_t){0});
    if (st == WEFT_AGAIN) drive(p);
  } while (st == WEFT_AGAIN && harness_now() < deadline);
  if (st) fail_msg("receive #%u of %zu bytes: %s", seq, bytes, p->sink[1].msg);
  if (peek) {
    memcpy(dst, data, bytes);
    assert_int_equal(shm->recv_release(p->rx), WEFT_OK);
  }
}

/* The receiver decides on its first look at the FIFO: one small chunk
 * each way of the pair's direction settles the verdict before the sizes
 * that matter are sent. */
static void settle(pair *p) {
  unsigned char b = 7, got = 0;
  post(p, &b, 1, 1);
  take(p, &got, 1, 1, false);
  assert_int_equal(got, 7);
}

/* Whether single copy pays on an auto pair, judged here from what its two
 * contexts timed (each times its own at its first connection): the mean of
 * the receiver's ratio and the one the sender published, under 2 memcpy;
 * untimed on both ends, the probe decides. */
static bool pair_auto_pays(pair *p) {
  double own = shm_ctx_of(p->ctx[1])->cma_timing.ratio;
  double peer = ((shm_conn *)p->tx)->tx->cma_cost_milli / 1000.0;
  printf("# process_vm_readv costs %.2fx and %.2fx a memcpy here (the two ranks' timings)\n",
         peer, own);
  assert_true(own >= 0 && peer >= 0);
  if (own == 0 && peer == 0) return true;
  double ratio = own == 0 ? peer : peer == 0 ? own : (own + peer) / 2;
  return ratio < 2.0;
}

/* Chunk sizes around the threshold and the inline limit, each sent for
 * copy and taken with recv_into (and some with a peek). `single`: whether
 * the pair uses single copy at all; `pays`: only where it pays (auto). */
static void sizes_around_threshold_of(const char *cma, bool single, int local_size, bool pays) {
  pair p;
  pair_open_local(&p, cma, local_size);
  if (pays) single = pair_auto_pays(&p);
  settle(&p);
  shm_conn *rx = (shm_conn *)p.rx;
  static const size_t sizes[] = {100,       112,           113,   4096,      MIN_BYTES - 1,
                                 MIN_BYTES, MIN_BYTES + 1, 40000, CHUNK - 1, CHUNK};
  static unsigned char src[CHUNK], dst[CHUNK], want[CHUNK];
  uint32_t seq = 2;
  for (int peek = 0; peek < 2; peek++) {
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++, seq++) {
      size_t bytes = sizes[i];
      fill_random(src, bytes, seq);
      memcpy(want, src, bytes);
      uint64_t before = rx->cma_chunks;
      post(&p, src, bytes, seq);
      bool by_address = single && bytes >= MIN_BYTES;
      /* a descriptor is complete only once the receiver copied it */
      weft_status idle = shm->send_idle(p.tx);
      /* auto where single copy does not pay is the verdict MIXED: while the
       * sender's copies into the slots run slower than a read (a loaded
       * machine), every other large chunk goes by address after all
       * (mixed_every_other_chunk_while_slots_are_slow forces that case).
       * Which one did shows here; the rest must agree with it. */
      if (pays && !single && bytes >= MIN_BYTES) by_address = idle == WEFT_AGAIN;
      assert_int_equal(idle, by_address ? WEFT_AGAIN : WEFT_OK);
      memset(dst, 0, bytes);
      take(&p, dst, bytes, seq, peek);
      if (memcmp(dst, want, bytes))
        fail_msg("%s #%u, %zu bytes (%s): other bytes arrived", cma, seq, bytes,
                 peek ? "peek" : "recv_into");
      assert_int_equal(rx->cma_chunks - before, by_address ? 1 : 0);
      double deadline = harness_now() + 5;
      while (shm->send_idle(p.tx) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
      assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
    }
  }
  pair_close(&p);
}

static void sizes_around_threshold(const char *cma, bool single) {
  sizes_around_threshold_of(cma, single, 2, false);
}

static void single_copy_used_around_threshold(void **state) {
  (void)state;
  sizes_around_threshold("on", true);
}

/* auto: single copy only where it pays. Here that is decided from this
 * machine's own timing, which the test reads from the pair's contexts and
 * judges independently: the pair keeps the slots when process_vm_readv cost
 * at least 2 memcpy of the same bytes, whether each rank has a core or the
 * ranks outnumber them (which once kept single copy: on this VM it costs
 * more CPU). */
static void auto_single_copy_where_it_pays(void **state) {
  (void)state;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("# %ld cores\n", cores);
  sizes_around_threshold_of("auto", false, 2, true);
  sizes_around_threshold_of("auto", false, (int)cores + 1, true);
}

/* The pair decides from the mean of both ends' timings, so its two
 * directions agree where the ends' own timings fall on either side of the
 * bar (16 cores: 1.8 against 2.2). A peer's published timing that moves the
 * mean across the bar moves this end's verdict with it. */
static void pair_decides_from_both_timings(void **state) {
  (void)state;
  pair p;
  pair_open(&p, "auto");
  double own = shm_cma_cost_ratio(&shm_ctx_of(p.ctx[1])->cma_timing); /* the receiver's */
  if (own <= 0) { /* untimed: the mean does not enter */
    pair_close(&p);
    skip();
  }
  /* across the bar from own where it can be: a mean of 2.5, or own / 2 */
  double peer = shm_cma_ratio_pays(own) ? 5.0 - own : 0.001;
  bool want = shm_cma_ratio_pays((own + peer) / 2);
  printf("# own %.2fx, the peer's set to %.3fx: single copy %s\n", own, peer,
         want ? "yes" : "no");
  /* the sender published its own timing when it connected; the receiver
   * reads it on its first look at the FIFO (settle) */
  ((shm_conn *)p.tx)->tx->cma_cost_milli = (uint32_t)(peer * 1000 + 0.5);
  settle(&p);
  shm_conn *rx = (shm_conn *)p.rx;
  static unsigned char src[CHUNK], dst[CHUNK];
  fill_random(src, CHUNK, 99);
  uint64_t before = rx->cma_chunks;
  post(&p, src, CHUNK, 2);
  take(&p, dst, CHUNK, 2, false);
  assert_memory_equal(dst, src, CHUNK);
  assert_int_equal(rx->cma_chunks - before, want ? 1 : 0);
  double deadline = harness_now() + 5;
  while (shm->send_idle(p.tx) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
  pair_close(&p);
}

/* One chunk of `bytes` from `from` (a connection of ctx[from_rank]) to
 * `to`, taken with recv_into and checked; returns 1 when it came by single
 * copy (the receiving connection's counter). */
static int move_chunk(pair *p, int from_rank, weft_tp_conn *from, weft_tp_conn *to, size_t bytes,
                      uint32_t seq) {
  static unsigned char src[CHUNK], dst[CHUNK];
  fill_random(src, bytes, seq * 131 + bytes);
  shm_conn *rx = (shm_conn *)to;
  uint64_t before = rx->cma_chunks;
  double deadline = harness_now() + 5;
  weft_status st;
  while ((st = shm->send_ready(from)) == WEFT_AGAIN && harness_now() < deadline) drive(p);
  if (st || shm->send(from, src, bytes, seq, &weft_mem_host, WEFT_SEND_FOR_COPY))
    fail_msg("send_for_copy #%u of %zu bytes: %s", seq, bytes, p->sink[from_rank].msg);
  memset(dst, 0, bytes);
  while ((st = shm->recv(to, seq, bytes, bytes, dst, &weft_mem_host, &(size_t){0})) == WEFT_AGAIN &&
         harness_now() < deadline)
    drive(p);
  if (st) fail_msg("receive #%u of %zu bytes: %s", seq, bytes, p->sink[1 - from_rank].msg);
  assert_memory_equal(dst, src, bytes);
  while (shm->send_idle(from) == WEFT_AGAIN && harness_now() < deadline) drive(p);
  assert_int_equal(shm->send_idle(from), WEFT_OK);
  return (int)(rx->cma_chunks - before);
}

/* A pair with the verdict MIXED: auto where single copy did not pay when
 * timed (a 2-vCPU guest). Elsewhere the test is skipped. */
static void mixed_pair_open(pair *p) {
  pair_open(p, "auto");
  if (pair_auto_pays(p)) { /* the verdict is yes */
    pair_close(p);
    skip();
  }
  settle(p);
}

/* auto where single copy did not pay when timed (a 2-vCPU guest) gives the
 * verdict MIXED: the sender takes single copy for every other chunk of
 * one-way traffic while its copies into the slots cost more than a read,
 * for none while they are fast; while large chunks come the other way
 * (also when a call of small chunks, a barrier, came between), for none
 * until they cost 1.3 reads, then for all but one in 16. The average of its
 * copies is set here, not timed: each phase forgets what the slots held, so
 * its copies are first touches, which are not folded in. */
static void mixed_every_other_chunk_while_slots_are_slow(void **state) {
  (void)state;
  pair p;
  mixed_pair_open(&p);
  shm_conn *tx = (shm_conn *)p.tx, *rx = (shm_conn *)p.rx;
  static unsigned char src[CHUNK], dst[CHUNK], back[CHUNK];
  double read = shm_mix_readv_ns_kib(&tx->ctx->cma_timing); /* the bars are multiples of it */
  static const struct {
    double reads;   /* the sender's copies into slots, in reads of the same bytes */
    bool two_way;   /* a large chunk comes back first, in the call of the first two sent */
    bool barrier;   /* then a call of small chunks both ways, and all 4 in the call after */
    int by_address; /* of 4 sent: the first of each phase is a 16th, through the slots */
  } phase[] = {{0.5, false, false, 0}, {1.2, false, false, 2}, {1.2, true, false, 0},
               {1e3, false, false, 2}, {1e3, true, false, 3},  {1e3, true, true, 3},
               {1e3, false, false, 2}, {1.2, true, true, 0},   {0.5, false, false, 0}};
  uint32_t seq = 2;
  for (size_t ph = 0; ph < sizeof phase / sizeof *phase; ph++, seq += 8) {
    tx->tx_in_ns_kib = phase[ph].reads * read;
    memset(tx->tx_slot_touched, 0, sizeof tx->tx_slot_touched);
    tx->tx_mix_turn = 0;
    uint64_t before = rx->cma_chunks;
    if (phase[ph].two_way) { /* rank 1 sends, rank 0 takes, on the same pair */
      fill_random(back, CHUNK, seq + 1000);
      double deadline = harness_now() + 5;
      while (shm->send_ready(p.rx) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
      assert_int_equal(shm->send(p.rx, back, CHUNK, seq, &weft_mem_host, WEFT_SEND_FOR_COPY),
                       WEFT_OK);
      weft_status st;
      while ((st = shm->recv(p.tx, seq, CHUNK, CHUNK, dst, &weft_mem_host, &(size_t){0})) ==
                 WEFT_AGAIN &&
             harness_now() < deadline)
        drive(&p);
      assert_int_equal(st, WEFT_OK);
      assert_memory_equal(dst, back, CHUNK);
      while (shm->send_idle(p.rx) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
    }
    if (phase[ph].barrier) {
      move_chunk(&p, 0, p.tx, p.rx, 8, seq + 1);
      move_chunk(&p, 1, p.rx, p.tx, 8, seq + 1);
    }
    /* two-way: two chunks in the call that took one back, two in the next,
     * posted back to back as a call's sends are */
    for (int i = 0; i < 4; i++) {
      uint32_t s = phase[ph].barrier ? seq + 2 : seq + (uint32_t)(phase[ph].two_way ? i / 2 : i);
      fill_random(src, CHUNK, s * 4 + (uint32_t)i);
      post(&p, src, CHUNK, s);
      memset(dst, 0, CHUNK);
      take(&p, dst, CHUNK, s, i % 2);
      assert_memory_equal(dst, src, CHUNK);
      double deadline = harness_now() + 5;
      while (shm->send_idle(p.tx) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
      assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
    }
    assert_int_equal(tx->tx_cma, SHM_CMA_MIXED);
    printf("# phase %zu: %llu of 4 by single copy\n", ph,
           (unsigned long long)(rx->cma_chunks - before));
    if (rx->cma_chunks - before != (uint64_t)phase[ph].by_address)
      fail_msg("phase %zu (%.1f reads, %s): %llu of 4 chunks by single copy, want %d", ph,
               phase[ph].reads, phase[ph].two_way ? "two-way" : "one-way",
               (unsigned long long)(rx->cma_chunks - before), phase[ph].by_address);
  }
  pair_close(&p);
}

/* The verdict MIXED times the sender's copies into the slots, but not those
 * that write past what a slot held before: their pages meet first-touch
 * faults, and a sweep to larger chunks folded those in, crossed the bar, and
 * sent 15 of 16 chunks by address for good. Folded or not is seen on the
 * average, kept far below every bar (no chunk goes by address here). */
static void mixed_leaves_first_touch_copies_out(void **state) {
  (void)state;
  pair p;
  mixed_pair_open(&p);
  shm_conn *tx = (shm_conn *)p.tx;
  int nslots = tx->ctx->nslots;
  static unsigned char src[CHUNK], dst[CHUNK];
  const double tiny = 1e-3; /* ns per KiB: no copy takes that little */
  uint32_t seq = 2;
  /* sizes in turn, and whether the copy is folded in: each slot's first
   * half-chunk is a first touch, its second is not, a whole chunk is again,
   * and then the slots hold whole chunks, so every size folds */
  static const struct {
    size_t bytes;
    int rounds; /* of nslots chunks */
    bool folded;
  } step[] = {{CHUNK / 2, 1, false}, {CHUNK / 2, 2, true}, {CHUNK / 4, 1, true},
              {CHUNK, 1, false},     {CHUNK, 1, true},     {CHUNK / 2, 1, true}};
  for (size_t s = 0; s < sizeof step / sizeof *step; s++)
    for (int i = 0; i < step[s].rounds * nslots; i++, seq++) {
      fill_random(src, step[s].bytes, seq);
      tx->tx_in_ns_kib = tiny;
      post(&p, src, step[s].bytes, seq);
      bool folded = tx->tx_in_ns_kib != tiny;
      memset(dst, 0, step[s].bytes);
      take(&p, dst, step[s].bytes, seq, i % 2);
      assert_memory_equal(dst, src, step[s].bytes);
      double deadline = harness_now() + 5;
      while (shm->send_idle(p.tx) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
      assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
      if (folded != step[s].folded)
        fail_msg("step %zu, chunk %d of %zu bytes (slot %d): %s, want %s", s, i, step[s].bytes,
                 i % nslots, folded ? "folded in" : "left out",
                 step[s].folded ? "folded in" : "left out");
    }
  assert_int_equal(tx->tx_cma, SHM_CMA_MIXED);
  assert_int_equal(((shm_conn *)p.rx)->cma_chunks, 0);
  pair_close(&p);
}

/* A pair that reads by single copy (auto, a core per rank): a rank whose
 * only large traffic in a call is one stream sends the part past
 * WEFT_SHM_CMA_STREAM_BYTES through the slots, in every call; not while it
 * takes large chunks on another connection (a chain's middle rank), nor
 * while it sends them on two (a scatter's root); and "on" reads them all.
 * The verdict is set to yes here: this machine's timing may say mixed. */
static void one_way_stream_past_the_limit_goes_through_the_slots(void **state) {
  (void)state;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 2) skip(); /* ranks outnumber cores: single copy throughout */
  for (int on = 0; on < 2; on++) {
    char limit[32];
    snprintf(limit, sizeof limit, "%d", 3 * CHUNK);
    setenv("WEFT_SHM_CMA_STREAM_BYTES", limit, 1);
    pair p;
    pair_open(&p, on ? "on" : "auto");
    settle(&p);
    /* a second connection between the same ranks (channel 1), used both ways */
    weft_tp_conn *other0 = NULL, *other1 = NULL; /* rank 0's end, rank 1's end */
    assert_int_equal(shm->connect(p.ctx[1], 0, 1, p.addr[0], p.alen[0], &other1), WEFT_OK);
    assert_int_equal(shm->connect(p.ctx[0], 1, 1, p.addr[1], p.alen[1], &other0), WEFT_OK);
    ((shm_conn *)p.tx)->tx_cma = SHM_CMA_YES;
    /* before: 1: rank 0 takes a large chunk on channel 1 in the same call;
     * 2: it sends one there; 3: a call of small chunks comes first (a
     * barrier: the rule looks back at the last call that moved large ones) */
    static const struct {
      const char *what;
      int before;
      int by_address; /* of 6 sent on channel 0 */
    } call[] = {{"one way", 0, 3},
                {"the next call", 0, 3},
                {"taking meanwhile", 1, 6},
                {"the call after taking", 0, 6},
                {"the one after that", 0, 3},
                {"sending on two", 2, 6},
                {"the call after sending on two", 0, 6},
                {"the one after that", 0, 3},
                {"taking meanwhile", 1, 6},
                {"a barrier, then one way", 3, 6},
                {"a barrier, then one way again", 3, 3}};
    uint32_t seq = 10;
    for (size_t i = 0; i < sizeof call / sizeof *call; i++, seq++) {
      if (call[i].before == 1) move_chunk(&p, 1, other1, other0, CHUNK, seq);
      if (call[i].before == 2) move_chunk(&p, 0, other0, other1, CHUNK, seq);
      if (call[i].before == 3) {
        move_chunk(&p, 0, other0, other1, 8, seq);
        move_chunk(&p, 1, other1, other0, 8, seq++);
      }
      int got = 0;
      for (int k = 0; k < 6; k++) got += move_chunk(&p, 0, p.tx, p.rx, CHUNK, seq);
      int want = on ? 6 : call[i].by_address;
      printf("# %s, call %u (%s): %d of 6 by single copy\n", on ? "on" : "auto", seq, call[i].what,
             got);
      if (got != want)
        fail_msg("WEFT_SHM_CMA=%s, call %u (%s): %d of 6 chunks by single copy, want %d",
                 on ? "on" : "auto", seq, call[i].what, got, want);
    }
    pair_close(&p);
  }
}

static void cma_off_copies_twice(void **state) {
  (void)state;
  sizes_around_threshold("0", false);
}

static void refused_probe_copies_twice(void **state) {
  (void)state;
  sizes_around_threshold("test-refused", false);
}

/* Cells and slots are counted apart (WEFT_SHM_SLOTS=2 here): chunks through
 * the slots stop the sender at two, while descriptors run on to the 64
 * cells; the slots are taken in order by the chunks that use one, so a slot
 * chunk posted after descriptors lands where the receiver looks. Every
 * chunk is checked against its random source, some taken by a peek (a
 * descriptor's then goes through a buffer of the receiver's own). */
static void descriptors_run_past_the_slots(void **state) {
  (void)state;
  setenv("WEFT_SHM_SLOTS", "2", 1);
  pair p;
  pair_open(&p, "on");
  unsetenv("WEFT_SHM_SLOTS");
  settle(&p);
  int cells = shm->send_depth(p.ctx[0]);
  assert_true(cells > 8);
  size_t small = 4096; /* above inline, below MIN_BYTES: through a slot */
  unsigned char *src = malloc((size_t)(cells + 1) * CHUNK), *dst = malloc(CHUNK);
  uint32_t seq = 10;
  /* two slot chunks fill the slots */
  for (int i = 0; i < 2; i++) {
    fill_random(src + (size_t)i * CHUNK, small, seq + (uint32_t)i);
    post(&p, src + (size_t)i * CHUNK, small, seq + (uint32_t)i);
  }
  assert_int_equal(shm->send_ready(p.tx), WEFT_AGAIN);
  take(&p, dst, small, seq, true);
  assert_memory_equal(dst, src, small);
  /* one slot chunk in flight: descriptors up to the cells */
  for (int i = 2; i < cells + 1; i++) {
    fill_random(src + (size_t)i * CHUNK, CHUNK, seq + (uint32_t)i);
    assert_int_equal(shm->send_ready(p.tx), WEFT_OK);
    assert_int_equal(shm->send(p.tx, src + (size_t)i * CHUNK, CHUNK, seq + (uint32_t)i,
                               &weft_mem_host, WEFT_SEND_FOR_COPY),
                     WEFT_OK);
  }
  assert_int_equal(shm->send_ready(p.tx), WEFT_AGAIN);
  take(&p, dst, small, seq + 1, false);
  assert_memory_equal(dst, src + CHUNK, small);
  for (int i = 2; i < cells + 1; i++) {
    take(&p, dst, CHUNK, seq + (uint32_t)i, i % 5 == 0);
    assert_memory_equal(dst, src + (size_t)i * CHUNK, CHUNK);
  }
  assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
  /* slot, descriptor, slot: full; the first slot back, a third slot chunk
   * reuses it while the second still waits in the other */
  seq = 200;
  size_t sizes[4] = {small, CHUNK, small + 8, small + 16};
  for (int i = 0; i < 3; i++) {
    fill_random(src + (size_t)i * CHUNK, sizes[i], seq + (uint32_t)i);
    post(&p, src + (size_t)i * CHUNK, sizes[i], seq + (uint32_t)i);
  }
  assert_int_equal(shm->send_ready(p.tx), WEFT_AGAIN);
  take(&p, dst, sizes[0], seq, false);
  fill_random(src + 3 * (size_t)CHUNK, sizes[3], seq + 3);
  post(&p, src + 3 * (size_t)CHUNK, sizes[3], seq + 3);
  for (int i = 1; i < 4; i++) {
    take(&p, dst, sizes[i], seq + (uint32_t)i, i == 2);
    assert_memory_equal(dst, src + (size_t)i * CHUNK, sizes[i]);
  }
  assert_true(((shm_conn *)p.rx)->cma_chunks >= (uint64_t)cells);
  free(src);
  free(dst);
  pair_close(&p);
}

/* recv_run until it takes something; returns how many chunks. */
static size_t take_run(pair *p, void *dst, size_t chunk, size_t bytes, uint32_t seq,
                       weft_status *status) {
  double deadline = harness_now() + 5;
  size_t n = 0;
  weft_status st;
  while ((st = shm->recv(p->rx, seq, chunk, bytes, dst, &weft_mem_host, &n)) == WEFT_AGAIN &&
         harness_now() < deadline)
    drive(p);
  if (status)
    *status = st;
  else if (st)
    fail_msg("run #%u of %zu bytes: %s", seq, bytes, p->sink[1].msg);
  return n;
}

/* A run of descriptors is read with one process_vm_readv: as many chunks
 * as have come (a whole 64-cell ring of them, across its wrap), up to a
 * chunk that is not a descriptor of the run (through a slot, another
 * call's, another length), which the next receive takes or reports. */
static void runs_of_descriptors_read_at_once(void **state) {
  (void)state;
  pair p;
  pair_open(&p, "on");
  settle(&p);
  shm_conn *rx = (shm_conn *)p.rx;
  int cells = shm->send_depth(p.ctx[0]);
  size_t whole = (size_t)cells * CHUNK;
  unsigned char *src = malloc(whole), *dst = malloc(whole);
  /* four descriptors and a short last chunk through a slot */
  size_t run = 4 * (size_t)CHUNK + 1000;
  fill_random(src, run, 31);
  for (size_t at = 0; at < run; at += CHUNK)
    post(&p, src + at, run - at < CHUNK ? run - at : CHUNK, 300);
  uint64_t reads = rx->cma_reads, chunks = rx->cma_chunks;
  memset(dst, 0, run);
  assert_int_equal(take_run(&p, dst, CHUNK, run, 300, NULL), 4);
  assert_int_equal(rx->cma_reads - reads, 1);
  assert_int_equal(rx->cma_chunks - chunks, 4);
  assert_int_equal(take_run(&p, dst + 4 * CHUNK, CHUNK, 1000, 300, NULL), 1);
  assert_memory_equal(dst, src, run);
  assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
  /* what has come so far, then the rest */
  fill_random(src, 6 * (size_t)CHUNK, 32);
  for (int i = 0; i < 3; i++) post(&p, src + (size_t)i * CHUNK, CHUNK, 301);
  assert_int_equal(take_run(&p, dst, CHUNK, 6 * (size_t)CHUNK, 301, NULL), 3);
  assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
  for (int i = 3; i < 6; i++) post(&p, src + (size_t)i * CHUNK, CHUNK, 301);
  assert_int_equal(take_run(&p, dst + 3 * CHUNK, CHUNK, 3 * (size_t)CHUNK, 301, NULL), 3);
  assert_memory_equal(dst, src, 6 * (size_t)CHUNK);
  /* two whole rings of cells, each in one read; they start where the ring
   * left off, so the second wraps */
  for (int ring = 0; ring < 2; ring++) {
    fill_random(src, whole, 40 + (uint64_t)ring);
    for (int i = 0; i < cells; i++) post(&p, src + (size_t)i * CHUNK, CHUNK, 302 + (uint32_t)ring);
    assert_int_equal(shm->send_ready(p.tx), WEFT_AGAIN);
    reads = rx->cma_reads;
    memset(dst, 0, whole);
    assert_int_equal(take_run(&p, dst, CHUNK, whole, 302 + (uint32_t)ring, NULL), (size_t)cells);
    assert_int_equal(rx->cma_reads - reads, 1);
    assert_memory_equal(dst, src, whole);
    assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
  }
  /* a run whose first chunk went through a slot takes that one alone */
  fill_random(src, 2 * (size_t)CHUNK, 33);
  post(&p, src, 4096, 304);
  post(&p, src + 4096, CHUNK, 304);
  assert_int_equal(take_run(&p, dst, 4096, 4096 + (size_t)CHUNK, 304, NULL), 1);
  assert_int_equal(take_run(&p, dst + 4096, CHUNK, CHUNK, 304, NULL), 1);
  assert_memory_equal(dst, src, 4096 + (size_t)CHUNK);
  /* another call's chunk ends the run; the next receive reports it */
  fill_random(src, 3 * (size_t)CHUNK, 34);
  for (int i = 0; i < 3; i++) post(&p, src + (size_t)i * CHUNK, CHUNK, i < 2 ? 305 : 306);
  assert_int_equal(take_run(&p, dst, CHUNK, 3 * (size_t)CHUNK, 305, NULL), 2);
  assert_memory_equal(dst, src, 2 * (size_t)CHUNK);
  weft_status st;
  assert_int_equal(take_run(&p, dst, CHUNK, CHUNK, 305, &st), 0);
  assert_int_equal(st, WEFT_ERR_MISMATCH);
  assert_non_null(strstr(p.sink[1].msg, "306"));
  free(src);
  free(dst);
  pair_close(&p);
}

/* Descriptors in flight fill the cells: the sender gets its credits
 * back only as the receiver copies, and send_idle waits for the last. */
static void credits_return_as_the_receiver_copies(void **state) {
  (void)state;
  pair p;
  pair_open(&p, "on");
  settle(&p);
  int depth = shm->send_depth(p.ctx[0]);
  unsigned char *src = malloc((size_t)depth * CHUNK), *dst = malloc(CHUNK);
  for (int i = 0; i < depth; i++) {
    fill_random(src + (size_t)i * CHUNK, CHUNK, 100 + i);
    post(&p, src + (size_t)i * CHUNK, CHUNK, 100 + i);
  }
  for (int i = 0; i < 10; i++) drive(&p);
  assert_int_equal(shm->send_ready(p.tx), WEFT_AGAIN);
  for (int i = 0; i < depth; i++) {
    assert_int_equal(shm->send_idle(p.tx), WEFT_AGAIN);
    take(&p, dst, CHUNK, 100 + i, false);
    assert_memory_equal(dst, src + (size_t)i * CHUNK, CHUNK);
    assert_int_equal(shm->send_ready(p.tx), WEFT_OK);
  }
  assert_int_equal(shm->send_idle(p.tx), WEFT_OK);
  assert_int_equal(((shm_conn *)p.rx)->cma_chunks, (uint64_t)depth);
  free(src);
  free(dst);
  pair_close(&p);
}

/* ---- a sender that ends after posting (two processes) -------------------- */

enum { W_ALEN = 0, W_POSTED = 2, W_PID = 3 };

static bool word_wait(int i, double seconds) {
  double until = harness_now() + seconds;
  while (!__atomic_load_n(&harness_shm->word[i], __ATOMIC_ACQUIRE)) {
    if (harness_now() > until) return false;
    usleep(1000);
  }
  return true;
}

/* Rank 1 posts a chunk for copy and ends without waiting for it to
 * complete; rank 0 then takes it. */
static int dead_sender_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)size;
  (void)id;
  const char *cma = arg;
  setenv("WEFT_SHM_CMA", cma, 1);
  setenv("WEFT_SHM_CMA_MIN_BYTES", "16384", 1);
  weft_settings_reload();
  weft_place place;
  weft_auth_key key;
  weft_error_sink sink = {0};
  weft_place_here(NULL, &place);
  weft_auth_key_for_job(NULL, 0, &key);
  weft_transport_init_args args = {.rank = rank,
                                   .size = 2,
                                   .comm_id = ((uint64_t)getppid() << 24) ^ 0xdead,
                                   .chunk_bytes = CHUNK,
                                   .timeout_s = 5,
                                   .wake_fd = -1,
                                   .errors = &sink,
                                   .place = &place,
                                   .auth = &key,
                                   .local_size = 2};
  weft_tp_ctx *ctx;
  uint8_t addr[WEFT_TRANSPORT_ADDR_MAX], peer_addr[WEFT_TRANSPORT_ADDR_MAX];
  size_t alen;
  if (shm->init(&args, &ctx, addr, &alen)) return 1;
  memcpy(harness_shm->message[rank], addr, alen);
  __atomic_store_n(&harness_shm->word[W_ALEN + rank], alen, __ATOMIC_RELEASE);
  if (!word_wait(W_ALEN + !rank, 10)) return 2;
  memcpy(peer_addr, harness_shm->message[!rank], harness_shm->word[W_ALEN + !rank]);
  char why[256];
  if (!shm->can_reach(ctx, !rank, peer_addr, harness_shm->word[W_ALEN + !rank], why, sizeof why))
    return 3;
  weft_tp_conn *conn;
  if (shm->connect(ctx, !rank, 0, peer_addr, harness_shm->word[W_ALEN + !rank], &conn)) return 4;
  double deadline = harness_now() + 10;
  bool moved;
  if (rank == 1) {
    static unsigned char src[CHUNK];
    unsigned char one = 1;
    while (shm->send_ready(conn) == WEFT_AGAIN && harness_now() < deadline) shm->wait(ctx, 1);
    if (shm->send(conn, &one, 1, 1, &weft_mem_host, WEFT_SEND_FOR_COPY)) return 5;
    /* the receiver's verdict, once it has taken the first chunk (with
     * WEFT_SHM_CMA=0 there is none to wait for: the wait ran to the
     * deadline, and under ASan the receiver's own wait ran out first) */
    while (strcmp(cma, "0") && ((shm_conn *)conn)->tx->cma_verdict == SHM_CMA_UNDECIDED &&
           harness_now() < deadline)
      usleep(1000);
    while (shm->send_ready(conn) == WEFT_AGAIN && harness_now() < deadline) shm->wait(ctx, 1);
    fill_random(src, CHUNK, 2);
    if (shm->send(conn, src, CHUNK, 2, &weft_mem_host, WEFT_SEND_FOR_COPY)) return 6;
    __atomic_store_n(&harness_shm->word[W_PID], (uint64_t)getpid(), __ATOMIC_RELEASE);
    __atomic_store_n(&harness_shm->word[W_POSTED], 1, __ATOMIC_RELEASE);
    _exit(0); /* gone before its chunk was copied: no fini, as in a crash */
  }
  unsigned char got = 0;
  weft_status st;
  while ((st = shm->recv(conn, 1, 1, 1, &got, &weft_mem_host, &(size_t){0})) == WEFT_AGAIN &&
         harness_now() < deadline)
    shm->progress(ctx, &moved);
  if (st || got != 1) return 7;
  if (!word_wait(W_POSTED, 10)) return 8;
  /* the sender is gone (reaped or not) before this rank looks */
  pid_t pid = (pid_t)harness_shm->word[W_PID];
  while (kill(pid, 0) == 0 && harness_now() < deadline) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) break;
    struct pollfd pf = {fd, POLLIN, 0};
    int ended = poll(&pf, 1, 100);
    close(fd);
    if (ended == 1) break;
  }
  static unsigned char dst[CHUNK];
  double t0 = harness_now();
  while ((st = shm->recv(conn, 2, CHUNK, CHUNK, dst, &weft_mem_host, &(size_t){0})) == WEFT_AGAIN &&
         harness_now() < deadline)
    shm->wait(ctx, 1);
  harness_shm->status[0] = st;
  harness_shm->seconds[0] = harness_now() - t0;
  snprintf(harness_shm->message[2], sizeof harness_shm->message[2], "%s", sink.msg);
  unsigned char want[CHUNK];
  fill_random(want, CHUNK, 2);
  harness_shm->word[10] = st == WEFT_OK && !memcmp(dst, want, CHUNK);
  shm->fini(ctx);
  return 0;
}

static void dead_sender_fails_its_receiver(void **state) {
  (void)state;
  harness_init();
  assert_int_equal(harness_run(2, NULL, 30, dead_sender_rank, "on"), 0);
  printf("# single copy: %s after %.3f s: %s\n", weft_status_name(harness_shm->status[0]),
         harness_shm->seconds[0], harness_shm->message[2]);
  assert_int_equal(harness_shm->status[0], WEFT_ERR_PEER_LOST);
  assert_non_null(strstr(harness_shm->message[2], "peer 1"));
  assert_non_null(strstr(harness_shm->message[2], "single copy"));
  assert_true(harness_shm->seconds[0] < 2);
  /* two copies: the chunk was in the slot, so it still arrives whole */
  harness_init();
  assert_int_equal(harness_run(2, NULL, 30, dead_sender_rank, "0"), 0);
  assert_int_equal(harness_shm->status[0], WEFT_OK);
  assert_int_equal(harness_shm->word[10], 1);
}

/* ---- collectives over shm, results and single copies counted ------------ */

typedef struct coll_case {
  const char *cma;  /* WEFT_SHM_CMA */
  size_t counts[6]; /* elements (int32) per block, 0 ends */
} coll_case;

/* Element i of rank r's data in call `call`: every rank can compute every
 * other rank's, so the reference needs no exchange. */
static int32_t elem(uint64_t seed, int call, int r, size_t i) {
  uint64_t s = seed ^ ((uint64_t)call << 40) ^ ((uint64_t)r << 32) ^ i;
  s = (s ^ (s >> 31)) * 0x7fb5d329728ea185ull;
  s = (s ^ (s >> 27)) * 0x81dadef4bc2a1a15ull;
  return (int32_t)(s ^ (s >> 33));
}

/* Single copies this rank made, from its WEFT_DEBUG lines ("took N chunks"). */
static uint64_t chunks_logged(const char *path, bool *refused) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[1024];
  uint64_t total = 0;
  while (fgets(line, sizeof line, f)) {
    const char *t = strstr(line, " took ");
    unsigned long long n;
    if (t && strstr(line, "by single copy") && sscanf(t, " took %llu chunks", &n) == 1) total += n;
    if (strstr(line, "cannot read peer")) *refused = true;
  }
  fclose(f);
  return total;
}

static int coll_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const coll_case *cc = arg;
  char path[128];
  snprintf(path, sizeof path, "/tmp/weft-test-cma-%d-%d.log", (int)getppid(), rank);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0 || dup2(fd, 2) < 0) return 1;
  close(fd);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 2;
  uint64_t seed = harness_shm->word[HARNESS_MAX_RANKS - 1];
  int bad = 0, call = 0;
  for (int k = 0; k < 6 && cc->counts[k] && !bad; k++) {
    size_t n = cc->counts[k], all = n * (size_t)size;
    int32_t *send = malloc(all * sizeof *send), *recv = malloc(all * sizeof *recv);
    for (int what = 0; what < 5 && !bad; what++, call++) {
      int root = call % size;
      /* the sender's buffer is its own from the call's return: fill it anew
       * at once, so a peer still reading it would see other bytes */
      for (size_t i = 0; i < all; i++) send[i] = elem(seed, call, rank, i);
      memset(recv, 0x5a, all * sizeof *recv);
      weft_status st;
      const char *name[] = {"allgather", "alltoall", "broadcast", "gather", "scatter"};
      switch (what) {
        case 0: st = weft_allgather(comm, send, recv, n, WEFT_I32); break;
        case 1: st = weft_alltoall(comm, send, recv, n, WEFT_I32); break;
        case 2: st = weft_broadcast(comm, send, recv, all, WEFT_I32, root); break;
        case 3: st = weft_gather(comm, send, recv, n, WEFT_I32, root); break;
        default: st = weft_scatter(comm, send, recv, n, WEFT_I32, root); break;
      }
      for (size_t i = 0; i < all; i++) send[i] = ~send[i];
      if (st) {
        fprintf(stdout, "rank %d: %s of %zu: %s\n", rank, name[what], n, weft_last_error(comm));
        bad = 1;
        break;
      }
      size_t check = what == 4 ? n : what == 3 && rank != root ? 0 : all;
      for (size_t i = 0; i < check && !bad; i++) {
        int32_t want;
        size_t b = i / n, j = i % n;
        switch (what) {
          case 0: /* block b is rank b's sendbuf */
          case 3: want = elem(seed, call, (int)b, j); break;
          case 1: /* block b comes from rank b, its block `rank` */
            want = elem(seed, call, (int)b, (size_t)rank * n + j);
            break;
          case 2: want = elem(seed, call, root, i); break;
          default: want = elem(seed, call, root, (size_t)rank * n + i); break;
        }
        if (recv[i] != want) {
          fprintf(stdout, "rank %d: %s of %zu ints at %d ranks: element %zu is %d, not %d\n", rank,
                  name[what], n, size, i, recv[i], want);
          bad = 1;
        }
      }
    }
    free(send);
    free(recv);
  }
  if (weft_comm_destroy(comm)) bad = 1;
  fflush(stderr);
  bool refused = false;
  harness_shm->word[rank] = chunks_logged(path, &refused);
  harness_shm->status[rank] = refused;
  unlink(path);
  return bad;
}

static void collectives_on(const char *cma, int n) {
  static coll_case cc;
  /* 4-byte elements: blocks from below the threshold to several chunks,
   * with chunks just under, at and just over MIN_BYTES */
  cc = (coll_case){.cma = cma,
                   .counts = {MIN_BYTES / 4 - 1, MIN_BYTES / 4, MIN_BYTES / 4 + 1, 40000,
                              CHUNK / 4 * 2 + MIN_BYTES / 4 + 3, 0}};
  char env_cma[64];
  snprintf(env_cma, sizeof env_cma, "WEFT_SHM_CMA=%s", cma);
  const char *env[] = {"WEFT_TRANSPORT=shm",
                       "WEFT_CHUNK_BYTES=65536",
                       "WEFT_SHM_CMA_MIN_BYTES=16384",
                       "WEFT_DEBUG=INFO",
                       "WEFT_DEBUG_SUBSYS=NET",
                       "WEFT_TIMEOUT=30",
                       env_cma,
                       NULL};
  harness_init();
  const char *fixed = getenv("WEFT_TEST_SEED");
  uint64_t seed = fixed ? strtoull(fixed, NULL, 0)
                        : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20) ^ (uint64_t)n;
  harness_shm->word[HARNESS_MAX_RANKS - 1] = seed;
  printf("# %s, %d ranks, seed %llu (WEFT_TEST_SEED repeats it)\n", cma, n,
         (unsigned long long)seed);
  assert_int_equal(harness_run(n, env, 120, coll_rank, &cc), 0);
  for (int r = 0; r < n; r++) {
    printf("#   rank %d: %llu chunks by single copy%s\n", r,
           (unsigned long long)harness_shm->word[r],
           harness_shm->status[r] ? ", the probe refused" : "");
    if (!strcmp(cma, "on")) {
      assert_true(harness_shm->word[r] > 0);
    } else {
      assert_int_equal(harness_shm->word[r], 0);
      if (!strcmp(cma, "test-refused")) assert_true(harness_shm->status[r]);
    }
  }
}

static void collectives_single_copy_2_ranks(void **state) {
  (void)state;
  collectives_on("on", 2);
}
static void collectives_single_copy_3_ranks(void **state) {
  (void)state;
  collectives_on("on", 3);
}
static void collectives_refused_probe_3_ranks(void **state) {
  (void)state;
  collectives_on("test-refused", 3);
}
static void collectives_cma_off_2_ranks(void **state) {
  (void)state;
  collectives_on("0", 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(single_copy_used_around_threshold),
      cmocka_unit_test(auto_single_copy_where_it_pays),
      cmocka_unit_test(mixed_every_other_chunk_while_slots_are_slow),
      cmocka_unit_test(mixed_leaves_first_touch_copies_out),
      cmocka_unit_test(pair_decides_from_both_timings),
      cmocka_unit_test(one_way_stream_past_the_limit_goes_through_the_slots),
      cmocka_unit_test(cma_off_copies_twice),
      cmocka_unit_test(refused_probe_copies_twice),
      cmocka_unit_test(credits_return_as_the_receiver_copies),
      cmocka_unit_test(descriptors_run_past_the_slots),
      cmocka_unit_test(runs_of_descriptors_read_at_once),
      cmocka_unit_test(dead_sender_fails_its_receiver),
      cmocka_unit_test(collectives_single_copy_2_ranks),
      cmocka_unit_test(collectives_single_copy_3_ranks),
      cmocka_unit_test(collectives_refused_probe_3_ranks),
      cmocka_unit_test(collectives_cma_off_2_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
