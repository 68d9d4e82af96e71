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

#include "src/comm.h"
#include "src/mem.h"
#include "src/status.h"

typedef struct weft_coll weft_coll;

/* In algorithms: stop this advance on anything but OK - an error, or
 * WEFT_AGAIN (the state is kept and the step re-entered later). */
#define WEFT_STEP(expr)                      \
  do {                                       \
    weft_status step_status_ = (expr);       \
    if (step_status_ != WEFT_OK) {           \
      if (step_status_ < 0) WEFT_CHECK(step_status_); \
      return step_status_;                   \
    }                                        \
  } while (0)

typedef struct weft_ring_state {
  size_t loop_elems;   /* elements per loop: size * chunk_elems */
  size_t chunk_elems;
  size_t loops;
  size_t loop;
  int step;            /* 0 .. 2*(size-1) */
  bool got;            /* this step's chunk is received */
} weft_ring_state;

typedef struct weft_rd_state {
  int phase;           /* 0 fold-in, 1 doubling rounds, 2 fold-out, 3 done */
  int mask;
  bool sent;           /* this round's send is posted */
  int newrank;         /* rank among the power-of-two group, -1 if folded out */
} weft_rd_state;

typedef struct weft_tree_state {
  int fanout;
  size_t chunk_elems;
  size_t nchunks;
  size_t chunk;        /* next chunk to handle */
  bool got;            /* current chunk received (non-root) */
  int children_sent;   /* current chunk sent to this many children */
} weft_tree_state;

struct weft_coll {
  weft_comm *comm;
  const char *call;    /* "weft_allreduce": the name the user called */
  const char *algo;    /* "ring", "rd", "tree": for messages and logs */
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  weft_dtype dtype;
  weft_op op;
  int root;
  size_t elem;         /* bytes per element */
  const weft_mem_ops *mem;
  uint32_t seq;
  uint64_t events;     /* bumped on every completed send/receive: progress */
  int waiting_peer;    /* peer of the last WEFT_AGAIN, for timeout messages */
  int fail_peer;       /* peer whose link failed, -1 if the failure was elsewhere */
  const char *waiting_for;
  weft_status (*advance)(weft_coll *coll);
  union {
    weft_ring_state ring;
    weft_rd_state rd;
    weft_tree_state tree;
  } st;
};

/* Link operations (coll.c). WEFT_AGAIN when not possible now. */
weft_status weft_link_send_ready(weft_coll *coll, int peer);
weft_status weft_link_send(weft_coll *coll, int peer, const void *src, size_t bytes);
weft_status weft_link_send_idle(weft_coll *coll, int peer);
weft_status weft_link_recv_peek(weft_coll *coll, int peer, size_t bytes, const void **data);
weft_status weft_link_recv_release(weft_coll *coll, int peer);
weft_status weft_link_recv_into(weft_coll *coll, int peer, size_t bytes, void *dst);

/* Algorithm entry points: set coll->advance and the state. */
weft_status weft_ring_allreduce_start(weft_coll *coll);
weft_status weft_rd_allreduce_start(weft_coll *coll);
weft_status weft_tree_broadcast_start(weft_coll *coll, int fanout);

#endif
