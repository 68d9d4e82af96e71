/* choose.c - the whole algorithm policy (choose.h): WEFT_ALGO, the size
 * thresholds, and what earlier calls found out. */
#include "src/coll/choose.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "src/algo/algo.h"
#include "src/base/call_tag.h"
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
  c->bcast_confirm = set->check; /* WEFT_CHECK: every rank fails in the call that disagrees */
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
  for (int k = 0; k < 16; k++) free(c->direct_agreed[k]), c->direct_agreed[k] = NULL;
  free(c->direct_memo);
  c->direct_memo = NULL;
}

/* ---- the direct allreduce's memory of call shapes --------------------------------- */

/* The direct question costs a round of small messages, so each
 * communicator remembers, per call shape (count, dtype), when the last
 * question found ordinary buffers, and asks again for that shape only every
 * DIRECT_ASK_EVERY calls; the shape and the outcomes are the same on every
 * rank, so every rank asks or skips alike (docs/tuning.md, "The direct
 * allreduce's memory of call shapes"). */
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

/* ---- the rules ---------------------------------------------------------------------
 *
 * Each collective's policy is a list of rules, first match wins: an
 * algorithm and the facts and sizes it needs. The choice walks the list,
 * weft-info prints it (weft_choice_describe), so the words cannot drift from
 * what runs. Where each limit comes from is in docs/tuning.md, in the
 * section a rule names. */

enum rule_hosts { ANY_HOSTS, ONE_HOST, SHARED_HOSTS /* several, ranks sharing them */ };
enum rule_links { ANY_LINKS, STORES /* every link a store: shm */, SOCKETS /* some not */ };
/* What a rule's byte limits measure: the call's buffer (an allreduce's, a
 * broadcast's), or every rank's block together (an allgather's output, a
 * reduce-scatter's input), or one rank's block. */
enum rule_measure { BUFFER, WHOLE_OUTPUT, WHOLE_INPUT, BLOCK };
/* What holds only at the head of the queue, from earlier calls' outcomes. */
enum rule_late { NOT_LATE, LATE_DIRECT_MEMO, LATE_EXCHANGE_VERDICT };

/* A setting of weft_choice_state, by offset (0: none). */
#define SETTING(field) (offsetof(weft_choice_state, field) + 1)

typedef struct choice_rule {
  const char *algo;             /* "recursive doubling" */
  const char *how;              /* what it does, in a few words, or NULL */
  enum weft_algo_choice forced; /* the WEFT_ALGO that forces it (allreduce); AUTO: none */
  /* What must hold, forced or not. */
  bool needs_one_host; /* it maps every rank's memory */
  int cap_chunks;      /* the buffer (measure) fits this many chunks; 0: any */
  bool no_wire;        /* not where f32 crosses hosts as bf16/f16 */
  bool confirmed;      /* only for a broadcast whose counts are confirmed */
  /* What must hold unless forced. */
  enum rule_hosts hosts;
  enum rule_links links;
  int min_ranks, max_ranks; /* 0: unbounded */
  int max_ranks_cored;      /* the same where every rank has a CPU of its own; 0: max_ranks */
  bool pow2;                /* a power of two of ranks */
  enum rule_measure measure;
  size_t min_at;     /* SETTING: from this many bytes */
  bool min_zero_off; /* a minimum of 0 turns the rule off */
  size_t max_at;     /* SETTING: up to this many bytes */
  size_t max_shm_at; /* SETTING: the same where every link is a store (0: max_at) */
  bool rd_cored;     /* where every rank has a CPU and every link is a store, at 3+ ranks,
                        the limit is also RD_CORED_BYTES_LOG2 / log2(ranks) */
  enum rule_late late;
  /* What runs: a start, or a broadcast's or reduce's tree fan-out. */
  weft_status (*start)(const weft_choice_state *c, weft_coll *coll);
  int fanout;      /* FANOUT_ALL_BUT_ROOT, FANOUT_SETTING or the fan-out (0: binomial) */
  const char *why; /* the docs/tuning.md section with the measurements */
} choice_rule;

#define FANOUT_ALL_BUT_ROOT (-1) /* a flat tree: the root sends to every rank */
#define FANOUT_SETTING (-2)      /* WEFT_BCAST_FANOUT */

/* Where every rank has a CPU and links are stores, recursive doubling's
 * limit falls as the group grows (docs/tuning.md, "Recursive doubling
 * against the ring"). */
#define RD_CORED_BYTES_LOG2 (192u << 10) /* the bytes limit times log2(size) */

/* What a call brings to the rules. The rules read the choice state's
 * settings and facts, fixed after creation, never what later calls change
 * (another thread writes that at a call's end, choose.h). */
typedef struct choice_call {
  int size;
  size_t buffer, block, whole; /* bytes (algo.h: count * elem; whole = size * block) */
  bool wire;
  size_t chunk_bytes; /* the chunk the caller cuts with */
  bool by_size;       /* WEFT_ALGO is the allreduce's: other collectives ignore it */
} choice_call;

static size_t setting_at(const weft_choice_state *c, size_t at) {
  return *(const size_t *)(const void *)((const char *)c + at - 1);
}

static size_t measured(const choice_rule *r, const choice_call *k) {
  switch (r->measure) {
    case WHOLE_OUTPUT:
    case WHOLE_INPUT: return k->whole;
    case BLOCK: return k->block;
    default: return k->buffer;
  }
}

static int log2_ceil(int n) {
  int rounds = 0;
  while ((1 << rounds) < n) rounds++;
  return rounds;
}

/* The byte limit of `r` here (SIZE_MAX: none). */
static size_t rule_max(const choice_rule *r, const weft_choice_state *c, int size) {
  if (!r->max_at) return SIZE_MAX;
  size_t max = setting_at(c, c->sends_are_stores && r->max_shm_at ? r->max_shm_at : r->max_at);
  if (r->rd_cored && c->core_per_rank && c->sends_are_stores && size > 2) {
    size_t cored = RD_CORED_BYTES_LOG2 / (size_t)log2_ceil(size);
    if (cored < max) max = cored;
  }
  return max;
}

static bool rule_holds(const choice_rule *r, const weft_choice_state *c, const choice_call *k,
                       bool auto_choice) {
  size_t bytes = measured(r, k);
  if (r->needs_one_host && (c->nhosts != 1 || c->no_shared_maps)) return false;
  if (r->cap_chunks && bytes > (size_t)r->cap_chunks * k->chunk_bytes) return false;
  if (r->no_wire && k->wire) return false;
  if (r->confirmed && !c->bcast_confirm) return false;
  if (!auto_choice) return true;
  if (r->hosts == ONE_HOST && c->nhosts != 1) return false;
  if (r->hosts == SHARED_HOSTS && !(c->nhosts > 1 && c->size > c->nhosts)) return false;
  if (r->links == STORES && !c->sends_are_stores) return false;
  if (r->links == SOCKETS && c->sends_are_stores) return false;
  int max_ranks = c->core_per_rank && r->max_ranks_cored ? r->max_ranks_cored : r->max_ranks;
  if (k->size < r->min_ranks || (max_ranks && k->size > max_ranks)) return false;
  if (r->pow2 && (k->size & (k->size - 1))) return false;
  if (r->min_at) {
    size_t min = setting_at(c, r->min_at);
    if ((r->min_zero_off && !min) || bytes < min) return false;
  }
  return bytes <= rule_max(r, c, k->size);
}

/* Whether `r` runs this call. With WEFT_ALGO naming an algorithm, only its
 * rule applies (the caller falls back to the last), and only what the
 * algorithm itself needs is asked. */
static bool rule_applies(const choice_rule *r, const weft_choice_state *c, const choice_call *k) {
  bool auto_choice =
      k->by_size || c->algo_forced == WEFT_ALGO_AUTO || r->forced == WEFT_ALGO_AUTO;
  if (!auto_choice && r->forced != c->algo_forced) return false;
  return rule_holds(r, c, k, auto_choice);
}

/* The first rule of `rules`, from `from` (NULL: the first), that applies;
 * the last one always does. */
static const choice_rule *rule_pick(const choice_rule *rules, size_t n, const weft_choice_state *c,
                                    const choice_call *k, const choice_rule *from) {
  for (const choice_rule *r = from ? from : rules; r < rules + n - 1; r++)
    if (rule_applies(r, c, k)) return r;
  return &rules[n - 1];
}

/* ---- allreduce ---------------------------------------------------------------------- */

static weft_status start_hier(const weft_choice_state *c, weft_coll *coll) {
  coll->hint.rd_max_bytes = c->rd_max_bytes;
  coll->hint.bcast_chain_bytes = c->bcast_chain_bytes;
  return weft_hier_allreduce_start(coll); /* the caller filled coll->hosts */
}
/* Which of direct_agreed a call's rounds compare with: its collective. */
static int agreed_slot(const weft_coll *coll) {
  return (int)weft_sig_unpack(coll->sig).kind & 15;
}

static weft_status start_direct(const weft_choice_state *c, weft_coll *coll) {
  coll->hint.direct_agreed = &c->direct_agreed[agreed_slot(coll)];
  return weft_direct_allreduce_start(coll);
}

weft_status weft_choose_direct_device(const weft_choice_state *c, weft_coll *coll,
                                      weft_status (*start)(weft_coll *coll)) {
  coll->hint.direct_agreed = &c->direct_agreed[agreed_slot(coll)];
  return start(coll);
}
/* The first exchange asks whether every rank's sends are stores; later ones
 * run on its verdict. */
static weft_status start_exchange(const weft_choice_state *c, weft_coll *coll) {
  coll->hint.sends_are_stores = c->sends_are_stores; /* what an asking exchange says */
  bool asking = c->algo_forced != WEFT_ALGO_EXCHANGE && c->exchange_verdict == 0;
  return weft_exchange_allreduce_start(coll, asking);
}
static weft_status start_rd(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_rd_allreduce_start(coll);
}
static weft_status start_ring(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_ring_allreduce_start(coll);
}

/* The exchange costs size-1 sends a rank, recursive doubling log2(size)
 * rounds: with more ranks than cores the exchange won up to 8 ranks, with a
 * CPU per rank up to 3 (docs/tuning.md, "The one-round exchange"). */
#define EXCHANGE_MAX_RANKS 8
#define EXCHANGE_MAX_RANKS_CORED 3

static const choice_rule allreduce_rules[] = {
    {.algo = "hierarchical",
     .how = "every rank's share crosses the network, in segments pipelined with the host's "
            "reduce-scatter and allgather, when hosts hold equal numbers of ranks and the buffer "
            "is at least a chunk per rank of a host; else reduce to a leader per host, the "
            "leaders' allreduce, broadcast",
     .forced = WEFT_ALGO_HIER,
     .hosts = SHARED_HOSTS,
     .start = start_hier,
     .why = "Hierarchical allreduce"},
    {.algo = "direct",
     .how = "one pass through shared buffers, when every rank's buffers come from "
            "weft_mem_alloc",
     .forced = WEFT_ALGO_DIRECT,
     .needs_one_host = true,
     .min_at = SETTING(direct_min_bytes),
     .min_zero_off = true,
     .late = LATE_DIRECT_MEMO,
     .start = start_direct,
     .why = "Shared buffers: one pass instead of a ring"},
    {.algo = "the one-round exchange",
     .how = "once every link is a store",
     .forced = WEFT_ALGO_EXCHANGE,
     .cap_chunks = 1,
     .hosts = ONE_HOST,
     .max_ranks = EXCHANGE_MAX_RANKS,
     .max_ranks_cored = EXCHANGE_MAX_RANKS_CORED,
     .max_at = SETTING(exchange_max_bytes),
     .late = LATE_EXCHANGE_VERDICT,
     .start = start_exchange,
     .why = "The one-round exchange"},
    {.algo = "recursive doubling",
     .forced = WEFT_ALGO_RD,
     .cap_chunks = 1,
     .max_at = SETTING(rd_max_bytes),
     .rd_cored = true,
     .start = start_rd,
     .why = "Recursive doubling against the ring"},
    {.algo = "the ring",
     .how = "two ranks, f32 as itself: its chunks as two streams each way",
     .forced = WEFT_ALGO_RING,
     .start = start_ring,
     .why = "Two ranks: streams instead of a ring"},
};
#define NRULES(rules) (sizeof rules / sizeof rules[0])

static choice_call call_of(const weft_choice_state *c, const weft_coll *coll) {
  size_t block = coll->count * coll->elem;
  return (choice_call){.size = c->size,
                       .buffer = block,
                       .block = block,
                       .whole = (size_t)c->size * block,
                       .wire = weft_wire_on(coll),
                       .chunk_bytes = c->chunk_bytes};
}

weft_status weft_choose_allreduce(weft_choice_state *c, weft_coll *coll) {
  choice_call k = call_of(c, coll);
  const choice_rule *r = rule_pick(allreduce_rules, NRULES(allreduce_rules), c, &k, NULL);
  /* a choice that depends on earlier calls waits for the head of the queue */
  if (r->late) return WEFT_CHOICE_LATE;
  return r->start(c, coll);
}

static const choice_rule *exchange_rule = &allreduce_rules[2];

weft_status weft_choose_barrier(weft_choice_state *c, weft_coll *coll) {
  /* one byte: the exchange where allreduce would take it (never direct) */
  choice_call k = {.size = c->size,
                   .buffer = 1,
                   .block = 1,
                   .whole = (size_t)c->size,
                   .chunk_bytes = c->chunk_bytes};
  if (rule_applies(exchange_rule, c, &k)) return WEFT_CHOICE_LATE;
  return weft_rd_allreduce_start(coll);
}

/* What earlier calls found, for a rule that depends on it. */
static bool late_holds(const choice_rule *r, weft_choice_state *c, const weft_coll *coll) {
  switch (r->late) {
    case LATE_DIRECT_MEMO: /* asked again for a shape only now and then (direct_worth_asking) */
      return c->algo_forced == WEFT_ALGO_DIRECT || direct_worth_asking(c, coll->count, coll->dtype);
    case LATE_EXCHANGE_VERDICT: /* not once an exchange found links that are not stores */
      return c->algo_forced == WEFT_ALGO_EXCHANGE || c->exchange_verdict >= 0;
    default: return true;
  }
}

/* Some choices depend on what earlier calls found out: the direct
 * question's memory and the exchange verdict. They are made when the call
 * reaches the head of the queue, not when it is issued: calls run one after
 * another, so by then every earlier call is complete on this rank, and
 * every rank chooses from the same outcomes. Chosen at issue, a rank that
 * waited for call k before issuing call k+1 and a rank that issued both at
 * once could choose differently, and their messages would not match. */
weft_status weft_choose_late(weft_choice_state *c, weft_coll *coll, bool barrier) {
  choice_call k = call_of(c, coll);
  size_t n = NRULES(allreduce_rules);
  /* the rules above the first late one were ruled out at issue */
  const choice_rule *first_late = allreduce_rules;
  while (!first_late->late) first_late++;
  for (const choice_rule *r = rule_pick(allreduce_rules, n, c, &k, first_late);;
       r = rule_pick(allreduce_rules, n, c, &k, r + 1)) {
    /* the barrier comes here for the exchange only, never the direct question */
    if ((barrier && r->start == start_direct) || !late_holds(r, c, coll)) continue;
    return r->start(c, coll);
  }
}

/* ---- broadcast and reduce: trees ---------------------------------------------------- */

/* A flat tree where every link is a store lets each rank copy straight from
 * the root's buffer, all at once (docs/tuning.md, "The flat broadcast"). */
#define BCAST_FLAT_MAX_RANKS 4

static const choice_rule bcast_rules[] = {
    {.algo = "a tree of fan-out WEFT_BCAST_FANOUT", .fanout = FANOUT_SETTING},
    {.algo = "a flat tree",
     .how = "every rank copies straight from the root",
     .links = STORES,
     .min_ranks = 3,
     .max_ranks = BCAST_FLAT_MAX_RANKS,
     .min_at = SETTING(bcast_flat_min_bytes),
     .min_zero_off = true,
     .max_at = SETTING(bcast_flat_max_bytes),
     .fanout = FANOUT_ALL_BUT_ROOT,
     .why = "The flat broadcast"},
    {.algo = "a binomial tree", .confirmed = true, .max_ranks = 2, .fanout = 0},
    {.algo = "a binomial tree",
     .how = "its confirming edges carry the data",
     .confirmed = true,
     .cap_chunks = 1,
     .fanout = 0},
    {.algo = "a pipelined chain", .min_at = SETTING(bcast_chain_bytes), .fanout = 1},
    {.algo = "a binary tree", .fanout = 2},
};

static const choice_rule reduce_rules[] = {
    {.algo = "a pipelined chain", .min_at = SETTING(bcast_chain_bytes), .fanout = 1},
    {.algo = "a binary tree", .fanout = 2},
};

static int tree_fanout(const choice_rule *rules, size_t n, const weft_choice_state *c, size_t bytes,
                       int size, size_t chunk_bytes) {
  choice_call k = {.size = size,
                   .buffer = bytes,
                   .block = bytes,
                   .whole = bytes,
                   .chunk_bytes = chunk_bytes,
                   .by_size = true};
  const choice_rule *r = rules;
  /* the setting's rule holds when it names a fan-out, whatever the size */
  if (r->fanout == FANOUT_SETTING) {
    if (c->bcast_fanout > 0) return c->bcast_fanout;
    r++;
  }
  r = rule_pick(rules, n, c, &k, r);
  return r->fanout == FANOUT_ALL_BUT_ROOT ? size - 1 : r->fanout;
}

int weft_choose_bcast_fanout(const weft_choice_state *c, size_t bytes, int size,
                             size_t chunk_bytes) {
  return tree_fanout(bcast_rules, NRULES(bcast_rules), c, bytes, size, chunk_bytes);
}

int weft_choose_reduce_fanout(const weft_choice_state *c, size_t bytes) {
  return tree_fanout(reduce_rules, NRULES(reduce_rules), c, bytes, c->size, c->chunk_bytes);
}

/* ---- allgather and reduce-scatter ------------------------------------------------------ */

static weft_status start_bruck(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_bruck_allgather_start(coll);
}
static weft_status start_pairwise_allgather(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_pairwise_allgather_start(coll);
}
static weft_status start_ring_allgather(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_ring_allgather_start(coll);
}
static weft_status start_halving(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_halving_reduce_scatter_start(coll);
}
static weft_status start_rd_reduce_scatter(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_rd_reduce_scatter_start(coll);
}
static weft_status start_ring_reduce_scatter(const weft_choice_state *c, weft_coll *coll) {
  (void)c;
  return weft_ring_reduce_scatter_start(coll);
}

static const choice_rule allgather_rules[] = {
    {.algo = "Bruck",
     .how = "log2(ranks) rounds",
     .cap_chunks = 1,
     .min_ranks = 3,
     .measure = WHOLE_OUTPUT,
     .max_at = SETTING(allgather_bruck_max_bytes),
     .max_shm_at = SETTING(allgather_bruck_shm_max_bytes),
     .start = start_bruck,
     .why = "Small allgather and reduce-scatter in log2(ranks) rounds"},
    {.algo = "pairwise",
     .how = "each direction runs ahead",
     .links = SOCKETS,
     .min_ranks = 2,
     .max_ranks = 2,
     .start = start_pairwise_allgather,
     .why = "Pairwise allgather"},
    {.algo = "pairwise",
     .how = "every block straight from its owner",
     .links = STORES,
     .min_ranks = 3,
     .measure = BLOCK,
     .min_at = SETTING(allgather_pairwise_bytes),
     .min_zero_off = true,
     .start = start_pairwise_allgather,
     .why = "Pairwise allgather"},
    {.algo = "the ring", .start = start_ring_allgather},
};

static const choice_rule reduce_scatter_rules[] = {
    {.algo = "recursive halving",
     .cap_chunks = 2, /* its first message is half the input */
     .no_wire = true, /* the wire stage holds one block's chunk, not the whole input */
     .min_ranks = 4,
     .pow2 = true,
     .measure = WHOLE_INPUT,
     .max_at = SETTING(reduce_scatter_halving_max_bytes),
     .max_shm_at = SETTING(reduce_scatter_halving_shm_max_bytes),
     .start = start_halving,
     .why = "Recursive halving"},
    {.algo = "recursive doubling",
     .how = "on the whole input",
     .cap_chunks = 1,
     .no_wire = true,
     .min_ranks = 3,
     .measure = WHOLE_INPUT,
     .max_at = SETTING(reduce_scatter_rd_max_bytes),
     .max_shm_at = SETTING(reduce_scatter_rd_shm_max_bytes),
     .start = start_rd_reduce_scatter,
     .why = "Small allgather and reduce-scatter in log2(ranks) rounds"},
    {.algo = "the ring",
     .how = "two ranks, f32 as itself: a stream each way",
     .start = start_ring_reduce_scatter,
     .why = "Two ranks: streams instead of a ring"},
};

/* WEFT_ALGO is the allreduce's: these collectives choose by size alone. */
static weft_status choose_by_size(const choice_rule *rules, size_t n, const weft_choice_state *c,
                                  weft_coll *coll) {
  choice_call k = call_of(c, coll);
  k.by_size = true;
  return rule_pick(rules, n, c, &k, NULL)->start(c, coll);
}

weft_status weft_choose_allgather(const weft_choice_state *c, weft_coll *coll) {
  return choose_by_size(allgather_rules, NRULES(allgather_rules), c, coll);
}

weft_status weft_choose_reduce_scatter(const weft_choice_state *c, weft_coll *coll) {
  return choose_by_size(reduce_scatter_rules, NRULES(reduce_scatter_rules), c, coll);
}

void weft_choice_keep(weft_choice_state *c, const weft_coll *coll) {
  const weft_algo_outcome *o = &coll->outcome;
  if (o->exchange_verdict) c->exchange_verdict = o->exchange_verdict;
  if (o->direct_shared) weft_choice_direct_note(c, coll->count, coll->dtype, o->direct_shared > 0);
  void **agreed = &c->direct_agreed[agreed_slot(coll)];
  if (o->direct_agreed) {
    free(*agreed);
    *agreed = NULL;
  }
  if (o->direct_agreed > 0 && (*agreed = malloc(o->direct_msgs_bytes)))
    memcpy(*agreed, o->direct_msgs, o->direct_msgs_bytes);
}

/* ---- the policy in words (weft-info), from the same rules ------------------------ */

static void bytes_words(size_t b, char *out, size_t len) {
  if (b >= 1048576 && b % 1048576 == 0)
    snprintf(out, len, "%zu MiB", b / 1048576);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, len, "%zu KiB", b / 1024);
  else
    snprintf(out, len, "%zu B", b);
}

static const char *measure_words(enum rule_measure m) {
  switch (m) {
    case WHOLE_OUTPUT: return " of output in all";
    case WHOLE_INPUT: return " of input in all";
    case BLOCK: return " per rank";
    default: return "";
  }
}

/* Whether a rule can hold at all with these settings (a limit of 0 turns
 * it off), so that weft-info leaves it out. */
static bool rule_possible(const choice_rule *r, const weft_choice_state *c) {
  if (r->confirmed && !c->bcast_confirm) return false;
  if (r->min_at && r->min_zero_off && !setting_at(c, r->min_at)) return false;
  if (r->max_at && !setting_at(c, r->max_at) && (!r->max_shm_at || !setting_at(c, r->max_shm_at)))
    return false;
  if (r->min_at && r->max_at && setting_at(c, r->min_at) > setting_at(c, r->max_at)) return false;
  return true;
}

/* One rule in words: "recursive doubling up to 256 KiB (...)". */
static void rule_words(const choice_rule *r, const weft_choice_state *c, size_t chunk_bytes,
                       char *out, size_t len, size_t *at) {
  size_t cap = r->cap_chunks ? (size_t)r->cap_chunks * chunk_bytes : SIZE_MAX;
  char lo[32], hi[32], hi_shm[32];
  weft_appendf(out, len, at, "%s", r->algo);
  if (r->how) weft_appendf(out, len, at, " (%s)", r->how);
  if (r->hosts == ONE_HOST || r->needs_one_host) weft_appendf(out, len, at, " on one host");
  if (r->hosts == SHARED_HOSTS) weft_appendf(out, len, at, " on several hosts that ranks share");
  if (r->links == STORES) weft_appendf(out, len, at, " where every link is a store (shm)");
  if (r->links == SOCKETS) weft_appendf(out, len, at, " over sockets");
  if (r->pow2)
    weft_appendf(out, len, at, " among %d, %d, %d .. ranks", r->min_ranks, 2 * r->min_ranks,
                 4 * r->min_ranks);
  else if (r->min_ranks && r->min_ranks == r->max_ranks)
    weft_appendf(out, len, at, " between %d ranks", r->min_ranks);
  else if (r->min_ranks && r->max_ranks)
    weft_appendf(out, len, at, " among %d to %d ranks", r->min_ranks, r->max_ranks);
  else if (r->min_ranks > 1)
    weft_appendf(out, len, at, " at %d or more ranks", r->min_ranks);
  else if (r->max_ranks && r->max_ranks_cored)
    weft_appendf(out, len, at, " at %d ranks or fewer (%d where every rank has a CPU of its own)",
                 r->max_ranks, r->max_ranks_cored);
  else if (r->max_ranks)
    weft_appendf(out, len, at, " between %d ranks", r->max_ranks);
  if (r->confirmed) weft_appendf(out, len, at, ", counts confirmed");
  if (r->min_at) {
    bytes_words(setting_at(c, r->min_at), lo, sizeof lo);
    weft_appendf(out, len, at, " from %s%s", lo, measure_words(r->measure));
  }
  if (r->max_at) {
    size_t max = setting_at(c, r->max_at),
           max_shm = r->max_shm_at ? setting_at(c, r->max_shm_at) : 0;
    bytes_words(max < cap ? max : cap, hi, sizeof hi);
    weft_appendf(out, len, at, " up to %s%s", hi, measure_words(r->measure));
    if (r->max_shm_at) {
      bytes_words(max_shm < cap ? max_shm : cap, hi_shm, sizeof hi_shm);
      weft_appendf(out, len, at, ", %s on shm", hi_shm);
    }
  } else if (r->cap_chunks) {
    bytes_words(cap, hi, sizeof hi);
    weft_appendf(out, len, at, " up to %s (%d chunk%s)", hi, r->cap_chunks,
                 r->cap_chunks > 1 ? "s" : "");
  }
  if (r->rd_cored)
    weft_appendf(out, len, at,
                 " (on shm with a CPU per rank and 3 or more ranks, up to %u KiB / log2(ranks) "
                 "when that is less)",
                 RD_CORED_BYTES_LOG2 >> 10);
  if (r->no_wire) weft_appendf(out, len, at, ", not where f32 crosses hosts as bf16/f16");
  if (r->late) weft_appendf(out, len, at, ", chosen when the call starts");
}

/* A collective's rules in one line (no newline): each that can hold, then
 * "; else" the last. */
static void rules_words(const char *name, const choice_rule *rules, size_t n,
                        const weft_choice_state *c, size_t chunk_bytes, char *out, size_t len,
                        size_t *at) {
  weft_appendf(out, len, at, "%s: ", name);
  bool first = true;
  for (size_t i = 0; i < n; i++) {
    const choice_rule *r = &rules[i];
    bool last = i == n - 1;
    if (r->fanout == FANOUT_SETTING) {
      if (c->bcast_fanout <= 0) continue;
      weft_appendf(out, len, at, "a tree of fan-out %d (WEFT_BCAST_FANOUT)", c->bcast_fanout);
      return;
    }
    if (!last && !rule_possible(r, c)) continue;
    if (!first) weft_appendf(out, len, at, last ? "; else " : "; ");
    rule_words(r, c, chunk_bytes, out, len, at);
    first = false;
  }
}

void weft_choice_describe(const weft_choice_state *c, size_t chunk_bytes, char *out, size_t len) {
  size_t at = 0;
  if (out && len) out[0] = 0;
  weft_choice_state cs = *c;
  cs.chunk_bytes = chunk_bytes;
#define ALGO_WORD_(name, word) word,
  static const char *const forced[] = {WEFT_ALGO_WORDS(ALGO_WORD_)};
#undef ALGO_WORD_
  if (c->algo_forced == WEFT_ALGO_RING)
    weft_appendf(out, len, &at, "allreduce: ring for every size (WEFT_ALGO)");
  else if (c->algo_forced != WEFT_ALGO_AUTO &&
           (size_t)c->algo_forced < sizeof forced / sizeof *forced)
    weft_appendf(out, len, &at, "allreduce: %s wherever it can run (WEFT_ALGO), else the ring",
                 forced[c->algo_forced]);
  else
    rules_words("allreduce", allreduce_rules, NRULES(allreduce_rules), &cs, chunk_bytes, out, len,
                &at);
  weft_appendf(out, len, &at, "\n");
  rules_words("broadcast", bcast_rules, NRULES(bcast_rules), &cs, chunk_bytes, out, len, &at);
  weft_appendf(out, len, &at,
               c->bcast_confirm ? "\n" : "; counts not confirmed (WEFT_CHECK=1 confirms them)\n");
  rules_words("reduce", reduce_rules, NRULES(reduce_rules), &cs, chunk_bytes, out, len, &at);
  weft_appendf(out, len, &at, "\n");
  rules_words("reduce_scatter", reduce_scatter_rules, NRULES(reduce_scatter_rules), &cs,
              chunk_bytes, out, len, &at);
  weft_appendf(out, len, &at, "\n");
  rules_words("allgather", allgather_rules, NRULES(allgather_rules), &cs, chunk_bytes, out, len,
              &at);
  weft_appendf(out, len, &at, "\n");
  weft_appendf(out, len, &at,
               "alltoall: pairwise, each rank sends to rank+k and receives from rank-k\n");
  weft_appendf(out, len, &at, "gather, scatter: the root and every rank directly\n");
}
