/* algo.h - what an algorithm sees: one collective call in progress and the
 * links to its peers (send, peek/release or receive-into, reduce through the
 * memory table). Algorithms are state machines: `advance` does all it can
 * and returns WEFT_AGAIN when it waits, WEFT_OK when its last step is done.
 * They never see a transport, a socket or a host-memory assumption. */
#ifndef WEFT_ALGO_H
#define WEFT_ALGO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/comm/comm.h"
#include "src/mem/mem.h"
#include "src/base/status.h"

typedef struct weft_coll weft_coll;

/* In algorithms: stop this advance on anything but OK - an error, or
 * WEFT_AGAIN (the state is kept and the step re-entered later). */
#define WEFT_STEP(expr)                               \
  do {                                                \
    weft_status step_status_ = (expr);                \
    if (step_status_ != WEFT_OK) {                    \
      if (step_status_ < 0) WEFT_CHECK(step_status_); \
      return step_status_;                            \
    }                                                 \
  } while (0)

typedef struct weft_ring_state {
  size_t loop_elems; /* elements per loop: size * chunk_elems */
  size_t chunk_elems;
  size_t loops;
  size_t loop;
  int step; /* 0 .. 2*(size-1) */
  bool got; /* this step's chunk is received */
} weft_ring_state;

/* Ring reduce-scatter and allgather: loop l moves chunk l of every block. */
typedef struct weft_ring_block_state {
  size_t chunk_elems;
  size_t loops; /* chunks per block */
  size_t loop;
  int step;      /* 0 .. size-1 */
  bool got;      /* this step's chunk is received (allgather) */
  void *partial; /* one chunk of scratch: the partial sum on its way (reduce-scatter) */
} weft_ring_block_state;

typedef struct weft_rd_state {
  int phase; /* 0 fold-in, 1 doubling rounds, 2 fold-out, 3 done */
  int mask;
  bool sent;   /* this round's send is posted */
  int newrank; /* rank among the power-of-two group, -1 if folded out */
} weft_rd_state;

typedef struct weft_tree_state {
  int fanout;
  size_t chunk_elems;
  size_t nchunks;
  size_t chunk;      /* next chunk to handle */
  bool got;          /* current chunk received (non-root) */
  int children_sent; /* current chunk sent to this many children */
} weft_tree_state;

typedef struct weft_tree_reduce_state {
  int fanout;
  size_t chunk_elems;
  size_t nchunks;
  size_t chunk;      /* next chunk to handle */
  int children_done; /* current chunk: this many children folded in */
  void *partial;     /* one chunk of scratch: the partial sum (inner ranks) */
} weft_tree_reduce_state;

/* Flat gather/scatter (root and one peer at a time) and pairwise alltoall. */
typedef struct weft_flat_state {
  size_t chunk_elems;
  size_t nchunks;     /* chunks per block */
  bool to_root;       /* gather (else scatter) */
  size_t chunk;       /* gather/scatter: chunk being moved */
  int peer;           /* gather/scatter: its peer (root's side) */
  int round;          /* alltoall: 1 .. size-1 */
  size_t sent, recvd; /* alltoall: chunks of this round sent and received */
} weft_flat_state;

/* Direct allreduce over shared buffers (direct_allreduce.c). */
typedef struct weft_direct_state {
  int phase;  /* see direct_allreduce.c */
  int next;   /* the next member to send to / receive from in this phase */
  bool usable; /* this rank could map every member's buffers */
  struct weft_direct_msg *msgs; /* scratch: every member's message (own at coll->rank) */
  char **ins, **outs;           /* scratch: every member's buffers, as mapped here */
  void *acc;                    /* scratch: one piece of the running sum */
  uint32_t verdict, token;      /* what this rank sends in the verdict and done rounds */
  uint32_t *verdicts;           /* scratch: what every member sent */
} weft_direct_state;

/* One-round exchange allreduce (exchange_allreduce.c). */
typedef struct weft_exchange_state {
  int phase;
  int next;        /* peers (send, drain) or members (fold) done in this phase */
  const void *own; /* what we send: sendbuf, or a copy of it when in place */
  bool folded;     /* the current member's data is folded, its release may be pending */
  uint32_t word;   /* asking: 1 when all of this rank's peers are reached with stores */
  uint32_t *words; /* asking: scratch, every member's word; NULL when not asking */
} weft_exchange_state;

/* Hierarchical allreduce: the phase running (its state in `inner`). */
typedef struct weft_hier_state {
  int phase;    /* 0 reduce within the host, 1 leaders, 2 broadcast within the host */
  bool running; /* `inner` holds the phase in progress */
  struct weft_coll *inner;
} weft_hier_state;

struct weft_coll {
  weft_comm *comm;
  /* The ranks the algorithm runs among: members 0 .. size-1 of a group,
   * this rank being member `rank`; group[i] is member i's rank in comm
   * (NULL: the whole communicator). Algorithms only see members; the link
   * functions map them. A hierarchical algorithm runs its phases on groups. */
  int rank, size;
  const int *group;
  int avg_div;      /* what avg divides by once the sum is complete: the
                       communicator's size, or 1 in a phase that only sums */
  const char *call; /* "weft_allreduce": the name the user called */
  uint8_t kind;     /* which call it is, for its checks and messages (coll.c) */
  const char *algo; /* "ring", "rd", "tree": for messages and logs */
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  weft_dtype dtype;
  weft_op op;
  int root;
  size_t elem; /* bytes per element */
  const weft_mem_ops *mem;
  uint32_t seq;
  double issued;     /* weft_now() when issued (engine.c): the recorder's and the timeout's start */
  uint32_t rec_slot; /* its flight recorder entry (recorder.c) */
  int waiting_peer; /* peer of the last WEFT_AGAIN, for timeout messages */
  int fail_peer;    /* peer whose link failed, -1 if the failure was elsewhere */
  void *scratch;    /* weft_coll_scratch's memory, freed when the call ends */
  const char *waiting_for;
  uint8_t token; /* weft_barrier's one byte */
  weft_status (*advance)(weft_coll *coll);
  struct weft_coll *outer;          /* a phase: the call it belongs to (NULL for a call) */
  void (*cleanup)(weft_coll *coll); /* releases what the algorithm holds besides scratch */
  bool quiet_failure;  /* its failure is seen by every rank: no notice to peers */
  void *check;         /* WEFT_CHECK's fingerprint phase (coll.c), NULL when off or done */
  union {
    weft_ring_state ring;
    weft_rd_state rd;
    weft_tree_state tree;
    weft_ring_block_state ringb;
    weft_tree_reduce_state treer;
    weft_flat_state flat;
    weft_hier_state hier;
    weft_direct_state direct;
    weft_exchange_state exchange;
  } st;
};

/* Link operations (coll.c). WEFT_AGAIN when not possible now. */
weft_status weft_link_send_ready(weft_coll *coll, int peer);
weft_status weft_link_send(weft_coll *coll, int peer, const void *src, size_t bytes);
weft_status weft_link_send_idle(weft_coll *coll, int peer);
weft_status weft_link_recv_peek(weft_coll *coll, int peer, size_t bytes, const void **data);
weft_status weft_link_recv_release(weft_coll *coll, int peer);
weft_status weft_link_recv_into(weft_coll *coll, int peer, size_t bytes, void *dst);

/* Maps the buffer member `peer` described in `key` (weft_mem_alloc memory)
 * into this process. A failure is not a link failure (the connection stays
 * up, the sentence is in the communicator's sink): the caller falls back. */
weft_status weft_link_map(weft_coll *coll, int peer, const weft_mem_key *key, void **local);

/* Scratch memory of the call's memory kind (coll.c), `bytes` long, freed when
 * the call ends; one allocation per call. WEFT_ERR_NOMEM if none. */
weft_status weft_coll_scratch(weft_coll *coll, size_t bytes, void **out);

static inline int weft_mod(int a, int n) {
  return ((a % n) + n) % n;
}

/* Steps that several algorithms share (steps.c). Each is re-entrant: after
 * WEFT_AGAIN, call it again with the same arguments. */
/* Elements per chunk: the communicator's chunk size, at least one element. */
size_t weft_chunk_elems(const weft_coll *coll);
/* Element range [*off, *off + *cnt) of chunk `k` of a block of `count`. */
void weft_chunk_range(size_t k, size_t chunk_elems, size_t count, size_t *off, size_t *cnt);
/* The k-ary tree around coll->root (fan-out clamped to 1 .. size-1) as this
 * rank sees it: its parent's rank (-1 at the root) and its children, the
 * ranks weft_tree_child(coll, &shape, 0 .. nchildren-1). */
typedef struct weft_tree_shape {
  int fanout;
  int parent;
  int first_child; /* virtual rank (the root's is 0) */
  int nchildren;
} weft_tree_shape;
weft_tree_shape weft_tree_shape_of(const weft_coll *coll, int fanout);
/* Members, like everything inside an algorithm: wrapped by the group's size
 * (coll->size), as weft_tree_shape_of wraps the parent, never by the
 * communicator's. */
static inline int weft_tree_child(const weft_coll *coll, const weft_tree_shape *t, int i) {
  return (coll->root + t->first_child + i) % coll->size;
}
/* Sends `bytes` from `src` to `peer` once there is room. */
weft_status weft_step_send(weft_coll *coll, int peer, const void *src, size_t bytes);
/* Receives `cnt` elements from `from`, writes dst = own op them (divided by
 * postdiv for avg) and, when to >= 0, sends dst on to `to`. It reduces only
 * once the send can go, so a re-entered step never reduces twice.
 * wait_peer >= 0: dst is scratch that an earlier send to wait_peer may still
 * be reading; the step waits for that send to complete before writing it. */
weft_status weft_step_recv_reduce(weft_coll *coll, int from, int to, void *dst, const void *own,
                                  size_t cnt, int postdiv, int wait_peer);
/* Receives `bytes` from `from` into dst (once: *got), then, when to >= 0,
 * sends dst on to `to`. */
weft_status weft_step_recv_forward(weft_coll *coll, int from, int to, void *dst, size_t bytes,
                                   bool *got);
/* Sends `bytes` at `src` to every other member, in rank order from the next
 * one (so members do not all start with the same peer). *next counts the
 * peers done (0 at the start) and is 0 again when all are. */
weft_status weft_step_send_all(weft_coll *coll, int *next, const void *src, size_t bytes);
/* Receives one `bytes` message from every other member into slot [member]
 * of `base` (`size` slots of `bytes`); *next as for weft_step_send_all. */
weft_status weft_step_recv_all(weft_coll *coll, int *next, void *base, size_t bytes);

/* Algorithm entry points: set coll->advance and the state. */
weft_status weft_ring_allreduce_start(weft_coll *coll);
weft_status weft_rd_allreduce_start(weft_coll *coll);
/* asking: the communicator's first exchange, which settles whether later
 * ones may use it (exchange_allreduce.c). */
weft_status weft_exchange_allreduce_start(weft_coll *coll, bool asking);
weft_status weft_tree_broadcast_start(weft_coll *coll, int fanout);
weft_status weft_tree_reduce_start(weft_coll *coll, int fanout);
weft_status weft_ring_reduce_scatter_start(weft_coll *coll);
weft_status weft_ring_allgather_start(weft_coll *coll);
weft_status weft_flat_gather_start(weft_coll *coll);
weft_status weft_flat_scatter_start(weft_coll *coll);
weft_status weft_pairwise_alltoall_start(weft_coll *coll);
weft_status weft_hier_allreduce_start(weft_coll *coll);
weft_status weft_direct_allreduce_start(weft_coll *coll);
/* Whether an allreduce of this shape should ask the direct question, or go
 * straight to the ring because the same shape found ordinary buffers lately.
 * Every rank answers alike: it depends on the calls so far and their shared
 * outcomes only. Counts the skip. */
bool weft_direct_allreduce_worth_asking(weft_comm *comm, size_t count, weft_dtype dtype);

#endif
