/* choose.c - the whole algorithm policy (choose.h): WEFT_ALGO, the size
 * thresholds, and what earlier calls found out. */
#include "src/coll/choose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "src/algo/algo.h"
#include "src/base/error_sink.h"
#include "src/base/log.h"
#include "src/base/settings.h"

/* ---- settings ------------------------------------------------------------------ */

void weft_choice_init(weft_choice_state *c, int rank, int size) {
  *c = (weft_choice_state){0};
  (void)rank; /* a bad WEFT_ALGO is refused when the communicator is created */
  const weft_settings_values *set = weft_settings();
  c->algo_forced = (enum weft_algo_choice)set->algo;
  c->rd_max_bytes = set->rd_max_bytes;
  c->exchange_max_bytes = set->exchange_max_bytes;
  c->direct_min_bytes = set->direct_min_bytes;
  c->bcast_chain_bytes = set->bcast_chain_bytes;
  c->bcast_fanout = set->bcast_fanout < size ? (int)set->bcast_fanout : 0;
  c->bcast_confirm = set->bcast_confirm;
  c->bcast_flat_min_bytes = set->bcast_flat_min_bytes;
  c->bcast_flat_max_bytes = set->bcast_flat_max_bytes;
  c->allgather_pairwise_bytes = set->allgather_pairwise_bytes;
  c->allgather_bruck_max_bytes = set->allgather_bruck_max_bytes;
  c->allgather_bruck_shm_max_bytes = set->allgather_bruck_shm_max_bytes;
  c->reduce_scatter_rd_max_bytes = set->reduce_scatter_rd_max_bytes;
  c->reduce_scatter_rd_shm_max_bytes = set->reduce_scatter_rd_shm_max_bytes;
  c->reduce_scatter_halving_max_bytes = set->reduce_scatter_halving_max_bytes;
  c->reduce_scatter_halving_shm_max_bytes = set->reduce_scatter_halving_shm_max_bytes;
}

void weft_choice_learn(weft_choice_state *c, int size, int nhosts, size_t chunk_bytes) {
  c->size = size;
  c->nhosts = nhosts;
  c->chunk_bytes = chunk_bytes;
  /* The host's online CPUs, not this process's affinity: a bound rank may
   * use one CPU, and every rank of the host must answer alike (the shm
   * transport's single-copy rule counts the same way). */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c->core_per_rank = nhosts == 1 && cpus >= size;
}

void weft_choice_free(weft_choice_state *c) {
  free(c->direct_agreed);
  free(c->direct_memo);
  c->direct_agreed = NULL;
  c->direct_memo = NULL;
}

/* ---- the direct allreduce's memory of call shapes --------------------------------- */

/* The question costs a round of small messages, which 4 ranks on 2 cores
 * feel at 1 MiB (+40% measured with ordinary buffers). So each communicator
 * remembers, per call shape (count, dtype), when the last question found
 * ordinary buffers, and asks again for that shape only every
 * DIRECT_ASK_EVERY calls; the shape and the outcomes are the same on every
 * rank, so every rank asks or skips alike. */
#define DIRECT_MEMO_SHAPES 16 /* shapes remembered (a model has a few bucket sizes) */
#define DIRECT_ASK_EVERY 16   /* an ordinary-buffer shape is asked again this often */

struct weft_direct_memo {
  size_t count;
  weft_dtype dtype;
  int skips;     /* calls sent to the ring since the question found ordinary buffers */
  uint64_t used; /* for replacing the least recently used shape */
};

struct weft_direct_memo_table {
  struct weft_direct_memo shape[DIRECT_MEMO_SHAPES];
  int n;
  uint64_t clock;
};

static struct weft_direct_memo *memo_find(weft_choice_state *c, size_t count, weft_dtype dtype) {
  struct weft_direct_memo_table *t = c->direct_memo;
  if (!t) return NULL;
  for (int i = 0; i < t->n; i++)
    if (t->shape[i].count == count && t->shape[i].dtype == dtype) {
      t->shape[i].used = ++t->clock;
      return &t->shape[i];
    }
  return NULL;
}

/* Whether an allreduce of this shape should ask the direct question, or go
 * straight to the ring because the same shape found ordinary buffers
 * lately. Counts the skip. */
static bool direct_worth_asking(weft_choice_state *c, size_t count, weft_dtype dtype) {
  struct weft_direct_memo *m = memo_find(c, count, dtype);
  if (!m || m->skips >= DIRECT_ASK_EVERY - 1) return true;
  m->skips++;
  return false;
}

void weft_choice_direct_note(weft_choice_state *c, size_t count, weft_dtype dtype,
                             bool all_shared) {
  struct weft_direct_memo *m = memo_find(c, count, dtype);
  struct weft_direct_memo_table *t = c->direct_memo;
  if (all_shared) {
    if (m) *m = t->shape[--t->n]; /* forgotten: the last entry takes its place */
    return;
  }
  if (!t && !(t = c->direct_memo = calloc(1, sizeof *c->direct_memo))) return;
  if (!m) {
    m = &t->shape[0];
    if (t->n < DIRECT_MEMO_SHAPES)
      m = &t->shape[t->n++];
    else
      for (int i = 1; i < t->n; i++)
        if (t->shape[i].used < m->used) m = &t->shape[i];
  }
  *m = (struct weft_direct_memo){count, dtype, 0, ++t->clock};
}

/* ---- choosing ---------------------------------------------------------------------- */

/* The one-round exchange has every rank send size-1 copies and poll size-1
 * peers. With more ranks than cores it won at every size tried (8 bytes on
 * 2 cores: 6.5 against 11.5 us at 3 ranks, 40 against 65 at 8, 90 against
 * 180 at 16), so it stays with groups of up to 8 there. With a core per
 * rank a round of recursive doubling is a cache line away, and its
 * log2(size) rounds won from 4 ranks on, at every size up to 16 KiB (16
 * cores, shm, 2 interleaved runs each, rd against the exchange: 4 ranks 8 B
 * 0.9-1.0 / 1.1 us, 16 KiB 7.4-7.6 / 9.2-10.0; 8 ranks 8 B 1.0-1.2 /
 * 1.6-1.9, 16 KiB 10-13 / 26-29; 16 ranks 8 B 1.4-1.5 / 3.2-4.5); at 3
 * ranks the exchange still won (8 B 0.8-0.9 / 0.9-1.0 us, 16 KiB 6.2-6.4 /
 * 10.5-11.1). */
#define EXCHANGE_MAX_RANKS 8
#define EXCHANGE_MAX_RANKS_CORED 3

/* Whether the direct question applies (one host, large or forced), and
 * whether the one-round exchange may (small, one host, few ranks, or
 * forced). Static facts and settings only: every rank answers alike. */
static bool direct_candidate(const weft_choice_state *c, size_t bytes) {
  return c->nhosts == 1 && (c->algo_forced == WEFT_ALGO_DIRECT ||
                            (c->algo_forced == WEFT_ALGO_AUTO && c->direct_min_bytes &&
                             bytes >= c->direct_min_bytes));
}

static bool exchange_candidate(const weft_choice_state *c, size_t bytes) {
  if (bytes > c->chunk_bytes) return false;
  return c->algo_forced == WEFT_ALGO_EXCHANGE ||
         (c->algo_forced == WEFT_ALGO_AUTO && c->nhosts == 1 &&
          c->size <= (c->core_per_rank ? EXCHANGE_MAX_RANKS_CORED : EXCHANGE_MAX_RANKS) &&
          bytes <= c->exchange_max_bytes);
}

/* Where links are stores and every rank has a core, the ring's steps run
 * on every core at once and overtake recursive doubling (log2(size) whole
 * buffers per rank) sooner as the group grows (16 cores, shm, 2 interleaved
 * runs each, rd against ring: 4 ranks 64 KiB 17-28 / 24-27 us, 128 KiB
 * 33-60 / 29-34; 8 ranks 64 KiB 29-31 / 35-37, 128 KiB 53-58 / 55-61, 256
 * KiB 108-117 / 89-94; 16 ranks 32 KiB 27-42 / 32, 64 KiB 55-74 / 45-52):
 * about 192 KiB / log2(size). Over sockets a ring step costs a system call
 * and a wake-up, and recursive doubling stayed ahead (16 cores, tcp, 16
 * ranks: 64 KiB 120-141 / 306-330 us, 256 KiB level), as it does where ranks
 * outnumber cores (2 vCPUs, shm, 4 ranks: 256 KiB 223-234 / 283-300 us):
 * there it keeps WEFT_RD_MAX_BYTES. */
#define RD_CORED_BYTES_LOG2 (192u << 10) /* the bytes limit times log2(size) */

static size_t rd_max_for(const weft_choice_state *c) {
  if (!c->core_per_rank || !c->sends_are_stores || c->size <= 2) return c->rd_max_bytes;
  int rounds = 0;
  while ((1 << rounds) < c->size) rounds++;
  size_t cored = RD_CORED_BYTES_LOG2 / (size_t)rounds;
  return cored < c->rd_max_bytes ? cored : c->rd_max_bytes;
}

/* Recursive doubling while the buffer fits one chunk and the limit above
 * (latency), the ring beyond (bandwidth). */
static weft_status rd_or_ring_start(const weft_choice_state *c, weft_coll *coll) {
  size_t bytes = coll->count * coll->elem;
  bool use_rd =
      bytes <= c->chunk_bytes && (c->algo_forced == WEFT_ALGO_RD ||
                                  (c->algo_forced == WEFT_ALGO_AUTO && bytes <= rd_max_for(c)));
  return use_rd ? weft_rd_allreduce_start(coll) : weft_ring_allreduce_start(coll);
}

/* The exchange when the verdict allows (or asking for it, the first time),
 * else what rd_or_ring_start picks. */
static weft_status small_start(const weft_choice_state *c, weft_coll *coll) {
  coll->hint.sends_are_stores = c->sends_are_stores; /* what an asking exchange says */
  if (c->algo_forced == WEFT_ALGO_EXCHANGE) return weft_exchange_allreduce_start(coll, false);
  if (c->exchange_verdict >= 0)
    return weft_exchange_allreduce_start(coll, c->exchange_verdict == 0);
  return rd_or_ring_start(c, coll);
}

weft_status weft_choose_allreduce(weft_choice_state *c, weft_coll *coll) {
  /* Ranks sharing hosts, on several hosts: only leaders cross the network. */
  bool hier = c->algo_forced == WEFT_ALGO_HIER ||
              (c->algo_forced == WEFT_ALGO_AUTO && c->nhosts > 1 && c->size > c->nhosts);
  if (hier) {
    coll->hint.rd_max_bytes = c->rd_max_bytes;
    coll->hint.bcast_chain_bytes = c->bcast_chain_bytes;
    return weft_hier_allreduce_start(coll); /* the caller filled coll->hosts */
  }
  size_t bytes = coll->count * coll->elem;
  /* One host, large: whether every rank's buffers are shared (the direct
   * allreduce). One host, small: the one-round exchange. Both depend on
   * what earlier calls found. */
  if (direct_candidate(c, bytes) || exchange_candidate(c, bytes)) return WEFT_CHOICE_LATE;
  return rd_or_ring_start(c, coll);
}

weft_status weft_choose_barrier(weft_choice_state *c, weft_coll *coll) {
  /* one byte: the exchange where allreduce would take it (never direct) */
  if (exchange_candidate(c, 1)) return WEFT_CHOICE_LATE;
  return weft_rd_allreduce_start(coll);
}

/* Some choices depend on what earlier calls found out: the direct
 * question's memory and the exchange verdict. They are made when the call
 * reaches the head of the queue, not when it is issued: calls run one after
 * another, so by then every earlier call is complete on this rank, and
 * every rank chooses from the same outcomes. Chosen at issue, a rank that
 * waited for call k before issuing call k+1 and a rank that issued both at
 * once could choose differently, and their messages would not match. */
weft_status weft_choose_late(weft_choice_state *c, weft_coll *coll, bool barrier) {
  size_t bytes = coll->count * coll->elem;
  /* the barrier comes here for the exchange only, never the direct question */
  if (!barrier && direct_candidate(c, bytes) &&
      (c->algo_forced == WEFT_ALGO_DIRECT || direct_worth_asking(c, coll->count, coll->dtype))) {
    coll->hint.direct_agreed = c->direct_agreed;
    return weft_direct_allreduce_start(coll);
  }
  if (exchange_candidate(c, bytes)) return small_start(c, coll);
  return rd_or_ring_start(c, coll);
}

/* A flat tree where every link is a store: with single copy each rank
 * copies straight from the root's buffer, all at the same time, one hop
 * and no forwarding. A binomial tree or a chain makes ranks copy one after
 * another from ranks that copied before; at 4 ranks on this machine's 2
 * vCPUs (weft-bench --peers -c bcast, interleaved runs, time us) flat took
 * 12-13 / 23-33 / 85-126 at 32 / 128 / 512 KiB against 15-16 / 33-37 /
 * 127-138 for the binomial tree and chain, and Open MPI's 12-13 / 26-32 /
 * 109-131 (its linear broadcast, the same shape); at 3 ranks 8 / 19
 * against 17 / 35 at 32 / 128 KiB. Below 16 KiB chunks
 * go through the slots (the root would copy once per rank); at 8 ranks
 * the runs were mixed (256 KiB: 139 against 106), so up to 4 ranks. On 16
 * cores 8 ranks won with it where the pairs read by single copy (16 KiB
 * 5.8-7.4 against 9.4-15.4 us) and not where they kept the slots (the root
 * then copies once per rank: 16 KiB 8.7-10.2 against 10.1-10.3, 64 KiB
 * 26-31 against 25-26); which a pair does is the transport's, so 8 ranks
 * keep the trees. */
#define BCAST_FLAT_MAX_RANKS 4
static bool bcast_flat(const weft_choice_state *c, size_t bytes, int size) {
  return c->sends_are_stores && size > 2 && size <= BCAST_FLAT_MAX_RANKS &&
         c->bcast_flat_min_bytes && bytes >= c->bcast_flat_min_bytes &&
         bytes <= c->bcast_flat_max_bytes;
}

int weft_choose_bcast_fanout(const weft_choice_state *c, size_t bytes, int size,
                             size_t chunk_bytes) {
  if (c->bcast_fanout > 0) return c->bcast_fanout;
  if (bcast_flat(c, bytes, size)) return size - 1;
  if (c->bcast_confirm && (size == 2 || bytes <= chunk_bytes)) return 0;
  return bytes >= c->bcast_chain_bytes ? 1 : 2;
}

int weft_choose_reduce_fanout(const weft_choice_state *c, size_t bytes) {
  /* the mirror of a broadcast: a chain from the size where broadcasts take one */
  return bytes >= c->bcast_chain_bytes ? 1 : 2;
}

/* Whether a small call's whole buffer (every rank's block: allgather's
 * output, reduce_scatter's input) takes log2(size) rounds of one message
 * instead of the ring's size-1 serial steps: among 3 or more ranks (between
 * 2 both are one exchange), up to one chunk and the limit for the links:
 * `shm_max` where every link is a store, `max` elsewhere.
 * Measured (weft-bench --peers, whole buffer 32 B .. 256 KiB, each limit 0
 * against 256 KiB or more interleaved; time old / new, >1 the new one wins):
 * - allgather, links not stores: won at every size up to a chunk. 2 vCPUs,
 *   tcp: 4 ranks 1.04-1.92, 8 ranks 1.34-2.46. 16 cores, tcp: 8 ranks
 *   56-64 against 23-24 us at 32 B, 103-112 against 87-93 at 256 KiB; 16
 *   ranks 133-140 against 36-38 at 128 B, 198-204 against 123-127 at 256
 *   KiB. So 256 KiB (the default chunk).
 * - allgather, shm: 2 vCPUs, 4 ranks 0.88-1.16 at 8 KiB, 0.57 at 16, 0.32
 *   at 32 (where pairwise's single copy takes over); 8 ranks 1.22 at 16
 *   KiB, 0.50-0.92 at 32. 16 cores: 8 ranks 5.6 against 4.2-4.4 us at 8
 *   KiB, mixed at 32 KiB; 16 ranks ahead to 32 KiB, behind at 128. So 8 KiB.
 * - reduce_scatter, links not stores: 2 vCPUs, tcp 4 ranks 1.09 at 16 KiB,
 *   0.89-0.94 at 32; 8 ranks 1.46-1.57 at 32 KiB, 0.73 at 128. 16 cores,
 *   tcp: 8 ranks 63-65 against 44-46 us at 32 KiB, 84-86 against 138-142 at
 *   128; 16 ranks 132-164 against 67-68 at 32 KiB. So 32 KiB.
 * - reduce_scatter, shm: the whole input reduced at every round costs what
 *   the ring's cheap steps do not. 16 cores: 8 ranks 2.9-3.2 against
 *   1.9-2.0 us at 512 B, 3.2-3.4 against 3.4-3.6 at 2 KiB, 5.4-5.5 against
 *   8.0-8.6 at 8 KiB; 16 ranks 6.6-6.8 against 5.0 at 2 KiB, 8.0-8.1
 *   against 10.4-11.1 at 8. 2 vCPUs: ahead up to 4 KiB at 4 and 8 ranks.
 *   So 2 KiB. */
/* Whether the whole buffer fits `cap` and the limit for these links. */
static bool whole_within(const weft_choice_state *c, const weft_coll *coll, size_t max_bytes,
                         size_t shm_max_bytes, size_t cap) {
  size_t whole = (size_t)c->size * coll->count * coll->elem;
  size_t limit = c->sends_are_stores ? shm_max_bytes : max_bytes;
  return whole <= cap && whole <= limit;
}

static bool whole_is_small(const weft_choice_state *c, const weft_coll *coll, size_t max_bytes,
                           size_t shm_max_bytes) {
  return c->size > 2 && whole_within(c, coll, max_bytes, shm_max_bytes, c->chunk_bytes);
}

weft_status weft_choose_allgather(const weft_choice_state *c, weft_coll *coll) {
  if (whole_is_small(c, coll, c->allgather_bruck_max_bytes, c->allgather_bruck_shm_max_bytes))
    return weft_bruck_allgather_start(coll);
  /* A ring's block waits at every rank for the one before it to forward
   * it; pairwise, every block comes from its owner. Where links are stores
   * that wins from a size on, and single copy reads each block once. Over
   * sockets the ring's one neighbour per rank stays (a socket per pair
   * active at once gains nothing on one NIC). */
  size_t block = coll->count * coll->elem;
  /* Between two ranks both are one exchange, but the ring sends chunk k+1
   * only once chunk k came in, and over sockets that lockstep idled the
   * link: pairwise lets each direction run ahead (2 ranks over tcp, 8 /
   * 32 MiB, three runs each: 5.3-7.9 / 13-30 ms against 8.2-12.4 / 32-49).
   * Over shm a send is a store into a free slot and the ring stays. */
  if (c->size == 2 && !c->sends_are_stores) return weft_pairwise_allgather_start(coll);
  if (c->sends_are_stores && c->size > 2 && c->allgather_pairwise_bytes &&
      block >= c->allgather_pairwise_bytes)
    return weft_pairwise_allgather_start(coll);
  return weft_ring_allgather_start(coll);
}

/* Recursive halving sends what the ring sends, (size-1)/size of the input,
 * in log2(size) messages: among a power of two of 4 or more ranks it beat
 * both recursive doubling and the ring (2 vCPUs, whole input 2 KiB .. 512
 * KiB, 3 interleaved runs, us, halving / ring / rd): tcp 4 ranks 32 KiB
 * 62-114 / 88-129 / 77-135, 128 KiB 117-173 / 125-197, 512 KiB 284-398 /
 * 290-554; tcp 8 ranks 32 KiB 240-274 / 316-545 / 309-335, 512 KiB 794-907
 * / 920-1500 (at 2 KiB recursive doubling was level, 181-250 / 239-254);
 * shm 4 ranks ahead or level at every size (512 KiB 62-132 / 74-212), shm
 * 8 ranks ahead to 32 KiB (49-54 / 54-104) and mixed from 128 KiB (89-95 /
 * 75-223), where 8 ranks share 2 vCPUs. Its first message is half the
 * input, so two chunks at most. */
static bool halving_fits(const weft_choice_state *c, const weft_coll *coll) {
  int n = c->size;
  return n >= 4 && !(n & (n - 1)) &&
         whole_within(c, coll, c->reduce_scatter_halving_max_bytes,
                      c->reduce_scatter_halving_shm_max_bytes, 2 * c->chunk_bytes);
}

weft_status weft_choose_reduce_scatter(const weft_choice_state *c, weft_coll *coll) {
  /* With a wire dtype the ring stays: the stage holds one block's chunk,
   * not the whole input that recursive halving or doubling sends. */
  if (!weft_wire_on(coll) && halving_fits(c, coll))
    return weft_halving_reduce_scatter_start(coll);
  if (!weft_wire_on(coll) && whole_is_small(c, coll, c->reduce_scatter_rd_max_bytes,
                                            c->reduce_scatter_rd_shm_max_bytes))
    return weft_rd_reduce_scatter_start(coll);
  return weft_ring_reduce_scatter_start(coll);
}

void weft_choice_keep(weft_choice_state *c, const weft_coll *coll) {
  const weft_algo_outcome *o = &coll->outcome;
  if (o->exchange_verdict) c->exchange_verdict = o->exchange_verdict;
  if (o->direct_shared) weft_choice_direct_note(c, coll->count, coll->dtype, o->direct_shared > 0);
  if (o->direct_agreed) {
    free(c->direct_agreed);
    c->direct_agreed = NULL;
  }
  if (o->direct_agreed > 0 && (c->direct_agreed = malloc(o->direct_msgs_bytes)))
    memcpy(c->direct_agreed, o->direct_msgs, o->direct_msgs_bytes);
}

/* ---- the policy in words (weft-info) ---------------------------------------------- */

static void bytes_words(size_t b, char *out, size_t len) {
  if (b >= 1048576 && b % 1048576 == 0)
    snprintf(out, len, "%zu MiB", b / 1048576);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, len, "%zu KiB", b / 1024);
  else
    snprintf(out, len, "%zu B", b);
}

/* A pair of limits (other links, shm) in words, each capped at `cap` (what
 * the algorithm can take at most); 32 bytes each. */
static void limit_words(size_t other, size_t shm, size_t cap, char *other_out, char *shm_out) {
  bytes_words(other < cap ? other : cap, other_out, 32);
  bytes_words(shm < cap ? shm : cap, shm_out, 32);
}

void weft_choice_describe(const weft_choice_state *c, size_t chunk_bytes, char *out, size_t len) {
  char chunk[32], rd[32], ex[32], direct[32], chain[32];
  bytes_words(chunk_bytes, chunk, sizeof chunk);
  bytes_words(c->rd_max_bytes < chunk_bytes ? c->rd_max_bytes : chunk_bytes, rd, sizeof rd);
  bytes_words(c->exchange_max_bytes < chunk_bytes ? c->exchange_max_bytes : chunk_bytes, ex,
              sizeof ex);
  bytes_words(c->direct_min_bytes, direct, sizeof direct);
  bytes_words(c->bcast_chain_bytes, chain, sizeof chain);
  size_t at = 0;
  if (out && len) out[0] = 0;
#define ALGO_WORD_(name, word) word,
  static const char *const forced[] = {WEFT_ALGO_WORDS(ALGO_WORD_)};
#undef ALGO_WORD_
  if (c->algo_forced != WEFT_ALGO_AUTO && (size_t)c->algo_forced < sizeof forced / sizeof *forced)
    weft_appendf(out, len, &at, "allreduce: %s for every size (WEFT_ALGO)\n",
                 forced[c->algo_forced]);
  else {
    weft_appendf(
        out, len, &at,
        "allreduce, one host: the one-round exchange up to %s at %d ranks or fewer (%d where "
        "every rank has a CPU of its own) once every link is a store (shm); ",
        ex, EXCHANGE_MAX_RANKS, EXCHANGE_MAX_RANKS_CORED);
    if (c->direct_min_bytes)
      weft_appendf(out, len, &at,
                   "direct (one pass through shared buffers) from %s when every rank's "
                   "buffers come from weft_mem_alloc; ",
                   direct);
    weft_appendf(out, len, &at,
                 "else recursive doubling up to %s (on shm with a CPU per rank and 3 or more "
                 "ranks, up to 192 KiB / log2(ranks) when that is less), the ring above (two "
                 "ranks, f32 as itself: its chunks as two streams each way)\n",
                 rd);
    weft_appendf(
        out, len, &at,
        "allreduce, several hosts (ranks sharing them): hierarchical; every rank's share crosses "
        "the network, in segments pipelined with the host's reduce-scatter and allgather, when "
        "hosts hold equal numbers of ranks and the buffer is at least a chunk (%s) per rank of "
        "a host; else reduce to a leader per host, the leaders' allreduce, broadcast\n",
        chunk);
  }
  if (c->bcast_fanout <= 0 && c->bcast_flat_min_bytes &&
      c->bcast_flat_min_bytes <= c->bcast_flat_max_bytes) {
    char lo[32], hi[32];
    bytes_words(c->bcast_flat_min_bytes, lo, sizeof lo);
    bytes_words(c->bcast_flat_max_bytes, hi, sizeof hi);
    weft_appendf(out, len, &at,
                 "broadcast among 3 or %d ranks all on shm: a flat tree from %s to %s (every "
                 "rank copies straight from the root); elsewhere as below\n",
                 BCAST_FLAT_MAX_RANKS, lo, hi);
  }
  if (c->bcast_fanout > 0)
    weft_appendf(out, len, &at, "broadcast: a tree of fan-out %d (WEFT_BCAST_FANOUT)",
                 c->bcast_fanout);
  else if (c->bcast_confirm && c->bcast_chain_bytes <= chunk_bytes)
    weft_appendf(
        out, len, &at,
        "broadcast: a binomial tree up to one chunk (%s) and between 2 ranks, a pipelined chain "
        "above",
        chunk);
  else if (c->bcast_confirm)
    weft_appendf(
        out, len, &at,
        "broadcast: a binomial tree up to one chunk (%s) and between 2 ranks; above, a binary "
        "tree below %s, a pipelined chain from there",
        chunk, chain);
  else
    weft_appendf(out, len, &at, "broadcast: a pipelined chain from %s, a binary tree below", chain);
  weft_appendf(out, len, &at,
               c->bcast_confirm ? "; counts confirmed on every rank\n"
                                : "; counts not confirmed (WEFT_BCAST_CONFIRM=0)\n");
  weft_appendf(out, len, &at, "reduce: a pipelined chain from %s, a binary tree below\n", chain);
  weft_appendf(out, len, &at, "reduce_scatter: ");
  char lim[32], lim_shm[32];
  if (c->reduce_scatter_halving_max_bytes || c->reduce_scatter_halving_shm_max_bytes) {
    limit_words(c->reduce_scatter_halving_max_bytes, c->reduce_scatter_halving_shm_max_bytes,
                2 * chunk_bytes, lim, lim_shm);
    weft_appendf(out, len, &at,
                 "among 4, 8, 16 .. ranks recursive halving up to %s of input in all, %s on "
                 "shm; ",
                 lim, lim_shm);
  }
  if (c->reduce_scatter_rd_max_bytes || c->reduce_scatter_rd_shm_max_bytes) {
    limit_words(c->reduce_scatter_rd_max_bytes, c->reduce_scatter_rd_shm_max_bytes, chunk_bytes,
                lim, lim_shm);
    weft_appendf(out, len, &at,
                 "at 3 or more ranks, recursive doubling on the whole input (every rank's "
                 "blocks) up to %s in all, %s on shm; ",
                 lim, lim_shm);
  }
  weft_appendf(out, len, &at,
               "else (and where f32 crosses hosts as bf16/f16) the ring, in chunks of %s (two "
               "ranks, f32 as itself: a stream each way)\n",
               chunk);
  weft_appendf(out, len, &at, "allgather: ");
  if (c->allgather_bruck_max_bytes || c->allgather_bruck_shm_max_bytes) {
    limit_words(c->allgather_bruck_max_bytes, c->allgather_bruck_shm_max_bytes, chunk_bytes, lim,
                lim_shm);
    weft_appendf(out, len, &at,
                 "Bruck (log2(ranks) rounds) at 3 or more ranks up to %s of output in all, %s on "
                 "shm; ",
                 lim, lim_shm);
  }
  if (c->allgather_pairwise_bytes) {
    char pw[32];
    bytes_words(c->allgather_pairwise_bytes, pw, sizeof pw);
    weft_appendf(out, len, &at,
                 "pairwise (every block straight from its owner) from %s per rank at 3 or "
                 "more ranks on shared memory, and between 2 ranks over sockets; else the ring\n",
                 pw);
  } else
    weft_appendf(out, len, &at, "pairwise between 2 ranks over sockets, else the ring\n");
  weft_appendf(out, len, &at,
               "alltoall: pairwise, each rank sends to rank+k and receives from rank-k\n");
  weft_appendf(out, len, &at, "gather, scatter: the root and every rank directly\n");
}
