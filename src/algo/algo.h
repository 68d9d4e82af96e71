/* algo.h - what an algorithm sees: one collective call in progress, the
 * links to the other members of its group (src/link/link.h: send,
 * peek/release or receive-into) and the memory table (reduce, copy).
 * Algorithms are state machines: `advance` does all it can and returns
 * WEFT_AGAIN when it waits, WEFT_OK when its last step is done. They never
 * see a communicator, a transport, a socket or a host-memory assumption:
 * what they need from the caller comes in the call (chunk_bytes, hint,
 * hosts), what later calls need goes back in it (outcome), so they run on
 * fake links as well (tests/test_algo_fake.c). Member numbers everywhere,
 * wrapped by coll->size. */
#ifndef WEFT_ALGO_H
#define WEFT_ALGO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/status.h"
#include "src/link/link.h"
#include "src/mem/mem.h"

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

/* Algorithm state lives in the call (weft_coll.algo_state), opaque here:
 * each algorithm defines its own struct in its own file and checks there
 * that it fits. */
#define WEFT_ALGO_STATE_BYTES 96
#define WEFT_ALGO_STATE(coll, type) ((type *)(void *)(coll)->algo_state)

/* Two-rank rings (ring_allreduce.c, ring_reduce_scatter.c) stream their
 * chunks: how many loops a rank's own chunks may run ahead. For the
 * allreduce it fixes the order on the link, so both ranks use this one. */
#define WEFT_PAIR_LEAD_LOOPS 16

/* The hierarchical allreduce's view of the hosts (set by the caller):
 * ranks in ascending order. */
typedef struct weft_hosts {
  int nhosts;
  const int *host_members; /* the ranks on this rank's host (local_size of them) */
  int local_size;
  int host_index;     /* this rank's index there; 0: the host's leader */
  const int *leaders; /* the lowest rank of every host (nhosts of them) */
  int leader_index;   /* this host's index among the leaders */
  /* When every host holds local_size ranks: the rank of index host_index
   * on every host, in the leaders' order (this rank is leader_index
   * there); NULL otherwise. */
  const int *index_peers;
  /* every rank's host: its index among the leaders (size of them) */
  const int *host_of;
} weft_hosts;

/* What the caller knows that an algorithm may use: settings and what
 * earlier calls found (the same on every rank). */
typedef struct weft_algo_hint {
  bool sends_are_stores;     /* exchange, broadcast: every link of this rank is a store (transport.h) */
  /* direct: where the caller keeps every member's message in the last call
   * that all could map (size of them; NULL: none). Read when the call runs,
   * not when it is set up: calls that end before it may change it, and at
   * the head of the queue every rank has ended the same calls. */
  void *const *direct_agreed;
  size_t rd_max_bytes;       /* hier: recursive doubling among the leaders up to this size */
  size_t bcast_chain_bytes;  /* hier: chains (fan-out 1) from this size, binary trees below */
} weft_algo_hint;

/* An algorithm's answers besides OK, WEFT_AGAIN and errors, which its
 * caller acts on and then advances it again; an algorithm never calls up
 * into its caller (the caller's part: src/coll/coll.c, direct_guard).
 *  - WEFT_ALGO_NEED_SCRATCH: the direct rounds on device buffers are about
 *    to queue kernels that sum through coll->device_scratch, which is NULL:
 *    the caller sets it (taken only now: taking it may grow it, which waits
 *    for everything queued) and advances again, at the same point.
 *  - WEFT_ALGO_FALL_BACK: the direct rounds found a buffer some member
 *    cannot map; every member answers so at the same round, having closed
 *    what it mapped and handed over its scratch. The caller runs the
 *    collective's host algorithm in the same call (on staged copies of
 *    device buffers), which advances from its start. */
#define WEFT_ALGO_NEED_SCRATCH ((weft_status)4)
#define WEFT_ALGO_FALL_BACK ((weft_status)5)

/* What a call found out that later calls choose by. Algorithms write it,
 * never the communicator; the caller keeps it when the call ends (coll.c). */
typedef struct weft_algo_outcome {
  int exchange_verdict;    /* an asking exchange: 1 every rank's sends are stores, -1 not, 0 none */
  int direct_shared;       /* the direct question: 1 every buffer shared and mapped, -1 ordinary
                              (or unmappable) somewhere, 0 not asked */
  int direct_agreed;       /* 1: remember direct_msgs as the agreed messages, -1: forget the last
                              ones, 0: keep */
  const void *direct_msgs; /* (scratch, valid until the call ends) */
  size_t direct_msgs_bytes;
} weft_algo_outcome;

/* One collective call as its algorithm sees it: the inputs, the links,
 * the algorithm's own state and what it reports back. The caller holds it
 * inside its own record of the call (src/coll/coll.h, weft_coll_task),
 * whose other fields an algorithm never sees. */
struct weft_coll {
  /* The members the algorithm runs among: 0 .. size-1, this rank being
   * member `rank`. Algorithms only see members, through `link`; a
   * hierarchical algorithm runs its phases on groups' links. */
  int rank, size;
  weft_link link;
  int avg_div;      /* what avg divides by once the sum is complete: the
                       communicator's size, or 1 in a phase that only sums */
  const char *call; /* "weft_allreduce": the name the user called, for messages */
  const char *algo; /* "ring", "rd", "tree": for messages and logs */
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  weft_dtype dtype;
  weft_op op;
  int root;
  size_t elem;        /* bytes per element */
  size_t chunk_bytes; /* pipelines cut buffers into chunks of this size */
  /* f32 sum/avg data travels between members as this (WEFT_BF16 or
   * WEFT_F16), half the bytes; anything else (WEFT_F32, zero) is off. The
   * caller sets it (coll.c: when the call crosses hosts) with wire_stage;
   * the steps below and rd_allreduce.c honour it. Each hop adds the
   * arriving value to the local one in f32 and rounds the sum once to send
   * it on; what a member sends on it keeps, so a result that reaches every
   * member is the same bits everywhere (docs/tuning.md, the error bound). */
  weft_dtype wire;
  void *wire_stage; /* the caller's, weft_wire_stage_bytes: chunks narrowed for sending */
  int wire_sent_to; /* 1 + the member the stage last went to (its send may still read it); 0 none */
  const weft_mem_ops *mem;
  /* device buffers the algorithm works on in place (the direct allreduce
   * over CUDA IPC): the stream its work is queued on, and the token (of
   * ready_stream, another) of the point where the user's earlier work on
   * the buffers is done */
  struct weft_mem_stream *stream;
  struct weft_mem_stream *ready_stream;
  uint64_t ready;
  /* the caller's device scratch (the direct rounds' sums: allreduce,
   * ((count + size - 1) / size + 64) elements; reduce, count at the root;
   * reduce-scatter, count), set by the caller when the rounds ask for it
   * (WEFT_ALGO_NEED_SCRATCH) right before their kernels are queued */
  void *device_scratch;
  uint32_t seq; /* the call's number on its communicator */
  uint32_t sig; /* the call's signature (call_tag.h): with seq, every chunk's tag */
  weft_algo_hint hint;
  weft_hosts hosts; /* the hierarchical allreduce only */
  weft_algo_outcome outcome;
  /* The rank (communicator ranks) whose link failed or whose message was
   * wrong, -1 if the failure was elsewhere: written by the communicator's
   * links (comm_link.c) and by an algorithm that finds a peer's message
   * wrong; a phase's links write its call's, so a phase's stays unused. */
  int fail_peer;
  void *scratch; /* weft_coll_scratch's memory, freed when the call ends */
  /* where weft_coll_scratch takes it from: NULL, host memory (what the
   * processor reads: messages, words); the device table where the
   * algorithm runs on device buffers over the device channel, whose
   * scratch only ever holds data (partial sums, gathered blocks) */
  const weft_mem_ops *scratch_mem;
  /* scratch an algorithm handed over with the call (the direct rounds to
   * their fall-back: sends from it may still be in flight, and the new
   * algorithm may take scratch of its own), freed when the call ends; two:
   * device buffers' rounds may fall back to a staged allreduce whose own
   * direct question falls back to the ring */
  void *handed_over_scratch[2];
  weft_status (*advance)(weft_coll *coll);
  void (*cleanup)(weft_coll *coll); /* releases what the algorithm holds besides scratch */
  _Alignas(max_align_t) unsigned char algo_state[WEFT_ALGO_STATE_BYTES];
};

/* What each of the call's chunks is tagged with (call_tag.h): its number and
 * signature, so a peer in another call, or in this call with another op,
 * dtype or root, fails the receiver instead of being reduced with it. */
static inline weft_tag weft_coll_tag(const weft_coll *coll) {
  return weft_tag_make(coll->seq, coll->sig);
}

/* The call's links, as the algorithms use them (link.h says the rules): one
 * indirect call per chunk. WEFT_AGAIN when not possible now. */
static inline weft_status weft_link_send_ready(weft_coll *coll, int peer) {
  return coll->link.ops->send_ready(coll->link.ctx, peer);
}
/* `flags` say what the chunk is for (transport.h): WEFT_SEND_FOR_COPY, `peer`
 * takes it with weft_link_recv (never a peek), so shm may copy it once,
 * straight from src; WEFT_SEND_NOW, it passes on what this rank just
 * received (a ring's or a chain's next hop) and starts moving now. */
static inline weft_status weft_link_send(weft_coll *coll, int peer, const void *src, size_t bytes,
                                         unsigned flags) {
  return coll->link.ops->send(coll->link.ctx, peer, src, bytes, weft_coll_tag(coll), coll->mem, flags);
}
static inline weft_status weft_link_send_idle(weft_coll *coll, int peer) {
  return coll->link.ops->send_idle(coll->link.ctx, peer);
}
static inline weft_status weft_link_recv_peek(weft_coll *coll, int peer, size_t bytes,
                                              const void **data) {
  return coll->link.ops->recv_peek(coll->link.ctx, peer, weft_coll_tag(coll), bytes, data);
}
static inline weft_status weft_link_recv_release(weft_coll *coll, int peer) {
  return coll->link.ops->recv_release(coll->link.ctx, peer);
}
/* The next chunk from `peer`, `bytes` long, copied into dst. */
static inline weft_status weft_link_recv(weft_coll *coll, int peer, size_t bytes, void *dst) {
  size_t chunks;
  return coll->link.ops->recv(coll->link.ctx, peer, weft_coll_tag(coll), bytes, bytes, dst, coll->mem,
                              &chunks);
}
/* The next chunks of a run of `bytes` from `peer` that it sent in chunks of
 * `chunk_bytes` (each for copy), placed one after another from dst: as many
 * as have come, at least one, *chunks says how many. A run of descriptors
 * is then one read (shm: one process_vm_readv for a whole block, as Open
 * MPI's single copy does). */
static inline weft_status weft_link_recv_run(weft_coll *coll, int peer, size_t chunk_bytes,
                                             size_t bytes, void *dst, size_t *chunks) {
  return coll->link.ops->recv(coll->link.ctx, peer, weft_coll_tag(coll), chunk_bytes, bytes, dst, coll->mem,
                              chunks);
}
/* Maps the buffer member `peer` described in `key` (weft_mem_alloc memory)
 * into this process. A failure is not a link failure (the connection stays
 * up, the sentence is in the link's sink): the caller falls back. */
static inline weft_status weft_link_map(weft_coll *coll, int peer, const weft_mem_desc *desc,
                                        void **local) {
  return coll->link.ops->map_peer_mem(coll->link.ctx, peer, desc, local);
}

/* Closes the mappings of device memory member `peer` lent for this call
 * (descriptors without WEFT_MEM_DESC_KEEP), once this rank's work on them
 * is done and before it tells `peer` so: the peer may free them then. */
static inline void weft_link_release(weft_coll *coll, int peer) {
  coll->link.ops->release_peer_mem(coll->link.ctx, peer);
}

/* Scratch memory of the call's memory kind (steps.c), `bytes` long, freed
 * when the call ends; one allocation per call. WEFT_ERR_NOMEM if none. */
weft_status weft_coll_scratch(weft_coll *coll, size_t bytes, void **out);

/* A phase of `outer` (the hierarchical forms): `inner` set up as a
 * `size`-member run on the members `group` of outer's links (this rank
 * `rank`), `count` elements from src into dst, avg divided by avg_div, root
 * member 0, the call's tag, memory table and stream; the caller starts an
 * algorithm on it. `links` is the caller's storage for the group's links. */
weft_coll *weft_coll_phase(weft_coll *inner, const weft_coll *outer, weft_group_links *links,
                           const int *group, int rank, int size, const void *src, void *dst,
                           size_t count, int avg_div);
/* Frees memory weft_coll_scratch gave `coll` (NULL is a no-op), through
 * the same table: the caller clears coll->scratch. */
void weft_coll_scratch_free(weft_coll *coll, void *scratch);
/* Frees coll->scratch and coll->handed_over_scratch: the call has ended. */
void weft_coll_scratch_release(weft_coll *coll);

/* Whether the call carries its f32 data as wire (above), and the bytes
 * of `cnt` elements there. */
static inline bool weft_wire_on(const weft_coll *coll) {
  return coll->wire == WEFT_BF16 || coll->wire == WEFT_F16;
}
static inline size_t weft_wire_bytes(size_t cnt) {
  return cnt * 2;
}
/* The stage a call with wire on needs (the caller allocates it with the
 * call's memory table): one chunk narrowed, then, 64-byte aligned, one
 * chunk widened (recursive doubling's received buffer). */
size_t weft_wire_stage_bytes(const weft_coll *coll);
/* The stage's widened part. */
static inline void *weft_wire_stage_wide(const weft_coll *coll, size_t cnt) {
  return (char *)coll->wire_stage + ((weft_wire_bytes(cnt) + 63) & ~(size_t)63);
}
/* The stage, free to be written: the send that last read it is complete
 * (WEFT_AGAIN until then). */
weft_status weft_wire_stage_take(weft_coll *coll, void **stage);
/* Sends `cnt` narrowed elements from the stage to `peer` (after
 * weft_link_send_ready said OK, with weft_link_send's flags but
 * WEFT_SEND_FOR_COPY), remembering that the send reads it. */
weft_status weft_wire_send(weft_coll *coll, int peer, size_t cnt, unsigned flags);

static inline int weft_mod(int a, int n) {
  return ((a % n) + n) % n;
}

/* Steps that several algorithms share (steps.c). Each is re-entrant: after
 * WEFT_AGAIN, call it again with the same arguments. */
/* Elements per chunk: the call's chunk size, at least one element. */
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
/* Sends `bytes` from `src` to `peer` once there is room, with weft_link_send's
 * flags. With wire on, WEFT_SEND_FOR_COPY is dropped: the receiver's
 * forward step peeks the narrowed chunk. */
weft_status weft_step_send(weft_coll *coll, int peer, const void *src, size_t bytes,
                           unsigned flags);
/* Receives `cnt` elements from `from`, writes dst = own op them (divided by
 * postdiv for avg) and, when to >= 0, sends dst on to `to`. It reduces only
 * once the send can go, so a re-entered step never reduces twice.
 * wait_peer >= 0: dst is scratch that an earlier send to wait_peer may still
 * be reading; the step waits for that send to complete before writing it. */
weft_status weft_step_recv_reduce(weft_coll *coll, int from, int to, void *dst, const void *own,
                                  size_t cnt, int postdiv, int wait_peer);
/* The same, with wait_peer -1, where dst is final and `to` takes it with
 * weft_step_recv_forward (the ring allreduce's last reduction): sent for
 * copy. */
weft_status weft_step_recv_reduce_final(weft_coll *coll, int from, int to, void *dst,
                                        const void *own, size_t cnt, int postdiv);
/* Receives `bytes` from `from` into dst (once: *got), then, when to >= 0,
 * sends dst on to `to` for copy (`to` takes it with this same step). */
weft_status weft_step_recv_forward(weft_coll *coll, int from, int to, void *dst, size_t bytes,
                                   bool *got);
/* Sends `bytes` at `src` to every other member, in rank order from the next
 * one (so members do not all start with the same peer). *next counts the
 * peers done (0 at the start) and is 0 again when all are. */
weft_status weft_step_send_all(weft_coll *coll, int *next, const void *src, size_t bytes);
/* Receives one `bytes` message from every other member into slot [member]
 * of `base` (`size` slots of `bytes`); *next as for weft_step_send_all. */
weft_status weft_step_recv_all(weft_coll *coll, int *next, void *base, size_t bytes);
/* The advance of a call with nothing to move (a zero count): done at once. */
weft_status weft_step_nothing(weft_coll *coll);

/* A copy within this rank's own buffers that no peer waits for (an
 * out-of-place call's own block, a root's own result): made while the call
 * waits, not before its first send. `move` is the algorithm's advance
 * without it; each time that returns WEFT_AGAIN one piece of the copy is
 * made and `move` tried again, and once it returns OK the rest is. *done
 * counts the bytes copied (0 at the start). */
weft_status weft_step_with_local_copy(weft_coll *coll, weft_status (*move)(weft_coll *coll),
                                      void *dst, const void *src, size_t bytes, size_t *done);

/* Algorithm entry points: set coll->advance and the state. */
weft_status weft_ring_allreduce_start(weft_coll *coll);
weft_status weft_rd_allreduce_start(weft_coll *coll);
/* Reduce-scatter as recursive doubling over a scratch copy of the whole
 * input (size blocks), each member keeping its block; the whole input must
 * fit one chunk, and no wire dtype (rd_allreduce.c). */
weft_status weft_rd_reduce_scatter_start(weft_coll *coll);
/* asking: the communicator's first exchange, which settles whether later
 * ones may use it (exchange_allreduce.c). */
weft_status weft_exchange_allreduce_start(weft_coll *coll, bool asking);
weft_status weft_tree_broadcast_start(weft_coll *coll, int fanout);
/* A user's broadcast: the tree (fanout >= 1) or the binomial tree
 * (fanout 0), with every member's descriptor confirmed on every rank. */
weft_status weft_confirmed_broadcast_start(weft_coll *coll, int fanout);
weft_status weft_tree_reduce_start(weft_coll *coll, int fanout);
weft_status weft_ring_reduce_scatter_start(weft_coll *coll);
/* A power-of-two group whose whole input fits two chunks (halving_reduce_scatter.c). */
weft_status weft_halving_reduce_scatter_start(weft_coll *coll);
weft_status weft_ring_allgather_start(weft_coll *coll);
/* Bruck's allgather: ceil(log2 size) rounds; the whole output must fit one
 * chunk (bruck_allgather.c). */
weft_status weft_bruck_allgather_start(weft_coll *coll);
weft_status weft_flat_gather_start(weft_coll *coll);
weft_status weft_flat_scatter_start(weft_coll *coll);
weft_status weft_pairwise_alltoall_start(weft_coll *coll);
weft_status weft_pairwise_allgather_start(weft_coll *coll);
weft_status weft_hier_allreduce_start(weft_coll *coll);
/* Device buffers over several hosts: the host's sum to its leader over CUDA
 * IPC (the direct rounds), the leaders' allreduce over the device channel,
 * the result back over IPC (hier_device.c). coll->hosts set, nhosts >= 2. */
weft_status weft_hier_device_allreduce_start(weft_coll *coll);
/* The same hosts' broadcast: within the root's host over CUDA IPC, among
 * the leaders over the device channel, within the other hosts over IPC. */
weft_status weft_hier_device_broadcast_start(weft_coll *coll);
weft_status weft_direct_allreduce_start(weft_coll *coll);
/* Whether the algorithm running on `coll` is the direct rounds (a choice
 * may have started them): their caller then acts on their answers. */
bool weft_direct_running(const weft_coll *coll);
/* The other collectives on device buffers of ranks on one host, over CUDA
 * IPC (direct_device.c): the direct allreduce's rounds, each rank reading
 * straight from its peers' sendbufs what its recvbuf needs. Where a rank
 * cannot map a buffer, every rank answers WEFT_ALGO_FALL_BACK and its
 * caller runs the collective's host algorithm on staged copies, in the same
 * call. coll->device_scratch (asked by WEFT_ALGO_NEED_SCRATCH): reduce,
 * count elements at the root; reduce-scatter, count; none for the others. */
weft_status weft_direct_broadcast_start(weft_coll *coll);
weft_status weft_direct_reduce_start(weft_coll *coll);
weft_status weft_direct_allgather_start(weft_coll *coll);
weft_status weft_direct_reduce_scatter_start(weft_coll *coll);
weft_status weft_direct_gather_start(weft_coll *coll);
weft_status weft_direct_scatter_start(weft_coll *coll);
weft_status weft_direct_alltoall_start(weft_coll *coll);

#endif
