/* choose.h - which algorithm runs a call, and everything that choice
 * remembers (choose.c): the settings it reads once per communicator, the
 * direct allreduce's per-shape memory and last agreed messages, and the
 * exchange verdict. Algorithms report what they found; only this file
 * decides what later calls do with it. Every rank decides alike: from
 * settings, static facts and outcomes every rank shares. */
#ifndef WEFT_CHOOSE_H
#define WEFT_CHOOSE_H

#include <stdbool.h>
#include <stddef.h>

#include "src/base/settings.h"
#include "weft.h"

typedef struct weft_coll weft_coll;
struct weft_direct_memo_table;

typedef struct weft_choice_state {
  /* settings, read once at creation (weft_choice_init), not per call */
  enum weft_algo_choice algo_forced; /* WEFT_ALGO (settings.h) */
  size_t rd_max_bytes;       /* recursive doubling up to this size */
  size_t exchange_max_bytes; /* one host, few ranks: the one-round exchange up to this size */
  size_t direct_min_bytes;   /* one host: try shared buffers from this size (0 never) */
  int bcast_fanout;          /* 0 = by size */
  bool bcast_confirm;        /* WEFT_CHECK: the user's broadcasts confirm descriptors */
  size_t bcast_chain_bytes;  /* broadcasts and reduces take a chain from this size */
  size_t bcast_flat_min_bytes, bcast_flat_max_bytes; /* one host, 3-4 ranks: a flat tree (0 never) */
  size_t allgather_pairwise_bytes; /* links all stores, 3+ ranks: pairwise from this block size */
  /* 3+ ranks: Bruck up to this whole output, recursive doubling up to this
   * whole input (0 never); over links not all stores, and all stores (shm) */
  size_t allgather_bruck_max_bytes, allgather_bruck_shm_max_bytes;
  size_t reduce_scatter_rd_max_bytes, reduce_scatter_rd_shm_max_bytes;
  /* power-of-two groups of 4+: recursive halving up to this whole input */
  size_t reduce_scatter_halving_max_bytes, reduce_scatter_halving_shm_max_bytes;
  /* facts of the communicator, told by it (weft_choice_learn, transports) */
  int size;              /* ranks */
  int nhosts;            /* hosts they run on */
  size_t chunk_bytes;    /* the largest chunk a link carries */
  bool sends_are_stores; /* every peer's transport says so (transport.h) */
  /* every pair of ranks over verbs with the device channel on (core.h,
   * device_channel_all): no transport maps a peer's memory, so the direct
   * rounds never find shared buffers to be worth their question, and on
   * device buffers their messages (host memory they read) could not live
   * in the device scratch those calls take */
  bool no_shared_maps;
  bool core_per_rank;    /* one host, with an online CPU for every rank: the steps of a
                            ring run at once, and a round's wait is a cache line, not a
                            turn of the scheduler (weft_choice_learn) */
  /* what earlier calls found, the same on every rank */
  int exchange_verdict; /* 0 not asked yet, 1 every rank's sends are stores, -1 not */
  struct weft_direct_memo_table *direct_memo; /* per call shape: whether the last question
                                                 found ordinary buffers */
  /* the direct rounds' messages of the last call every rank could map, per
   * collective (its signature's kind: a training step's allreduces and
   * broadcasts do not evict each other), or NULL: the same again skips the
   * verdict round (direct_allreduce.c) */
  void *direct_agreed[16];
} weft_choice_state;

/* Reads the settings (the only place the choice does); `size`: the
 * communicator's, `rank`: who warns about a bad WEFT_ALGO. */
void weft_choice_init(weft_choice_state *c, int rank, int size);
void weft_choice_free(weft_choice_state *c);
/* The communicator's shape, once its ranks are known. */
void weft_choice_learn(weft_choice_state *c, int size, int nhosts, size_t chunk_bytes);

/* A setup's answer from weft_choose_allreduce / _barrier besides a started
 * algorithm and errors: the choice waits for the call to reach the head of
 * the queue (weft_choose_late), as it depends on earlier calls' outcomes. */
#define WEFT_CHOICE_LATE ((weft_status)3)

/* Starts the algorithm of an allreduce (or returns WEFT_CHOICE_LATE). */
weft_status weft_choose_allreduce(weft_choice_state *c, weft_coll *coll);
/* The same for a barrier (a one-byte max-allreduce, never direct). */
weft_status weft_choose_barrier(weft_choice_state *c, weft_coll *coll);
/* At the head of the queue: starts what the outcomes so far pick; `barrier`
 * never takes the direct question. */
weft_status weft_choose_late(weft_choice_state *c, weft_coll *coll, bool barrier);
/* The tree fan-out of a broadcast and of a reduce of `bytes`; for a
 * broadcast 0 is the binomial tree that carries the data on its confirming
 * edges (tree_broadcast.c): between two ranks, and for a buffer of one
 * chunk unless WEFT_BCAST_FANOUT names a fan-out. */
int weft_choose_bcast_fanout(const weft_choice_state *c, size_t bytes, int size,
                             size_t chunk_bytes);
int weft_choose_reduce_fanout(const weft_choice_state *c, size_t bytes);
/* Starts an allgather: Bruck while the whole output is small, pairwise
 * where every link is a store and the block is large enough, else the ring. */
weft_status weft_choose_allgather(const weft_choice_state *c, weft_coll *coll);
/* Starts a reduce-scatter: recursive halving among a power of two of 4+
 * ranks while the input is small enough, recursive doubling on the whole
 * input while it is smaller still, else the ring. */
weft_status weft_choose_reduce_scatter(const weft_choice_state *c, weft_coll *coll);

/* The direct question's outcome for an allreduce of (count, dtype):
 * ordinary buffers somewhere (remembered, so the next calls of that shape
 * skip it), or all shared (forgotten). */
void weft_choice_direct_note(weft_choice_state *c, size_t count, weft_dtype dtype, bool all_shared);

/* When a call ends: keeps what its algorithm found (weft_coll.outcome: the
 * exchange verdict, the direct question's answer and agreed messages), the
 * same on every rank, for later calls to choose by. */
void weft_choice_keep(weft_choice_state *c, const weft_coll *coll);

/* The policy in words, a line per collective, from the settings `c` read
 * and the chunk size (weft-info prints it). */
void weft_choice_describe(const weft_choice_state *c, size_t chunk_bytes, char *out, size_t len);

/* A collective on device buffers worked on where they lie (coll_device.c
 * decided, alike on every rank): the direct algorithm over CUDA IPC that
 * `start` starts (weft_direct_allreduce_start, weft_direct_broadcast_start,
 * ...), with where the messages every rank agreed on last time are kept
 * (the same memory as the host allreduce's; a message names its call, so
 * only the same call on the same buffers skips the verdict). Set up at
 * issue, so the call reads them only when it runs (hint.direct_agreed). */
weft_status weft_choose_direct_device(const weft_choice_state *c, weft_coll *coll,
                                      weft_status (*start)(weft_coll *coll));

#endif
