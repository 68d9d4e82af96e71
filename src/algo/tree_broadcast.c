/* tree_broadcast.c - pipelined broadcast down a k-ary tree rooted at `root`
 * (fan-out 1 is a chain, the bandwidth-optimal shape for large buffers; 2 a
 * binary tree for small ones). The buffer moves in chunks: a rank forwards
 * chunk i to its children while chunk i+1 is still arriving. */
#include <stdio.h>
#include <string.h>

#include "src/algo/algo.h"

typedef struct tree_state {
  int fanout;
  size_t chunk_elems;
  size_t nchunks;
  size_t chunk;      /* next chunk to handle */
  bool got;          /* current chunk received (non-root) */
  int children_sent; /* current chunk sent to this many children */
  size_t root_copied; /* an out-of-place root: bytes of sendbuf copied into its recvbuf */
} tree_state;
_Static_assert(sizeof(tree_state) <= WEFT_ALGO_STATE_BYTES, "tree_state fits weft_coll.algo_state");

static weft_status tree_move(weft_coll *coll) {
  tree_state *ts = WEFT_ALGO_STATE(coll, tree_state);
  weft_tree_shape t = weft_tree_shape_of(coll, ts->fanout);
  bool is_root = t.parent < 0;
  while (ts->chunk < ts->nchunks) {
    size_t off, cnt;
    weft_chunk_range(ts->chunk, ts->chunk_elems, coll->count, &off, &cnt);
    size_t bytes = cnt * coll->elem;
    char *dst = (char *)coll->recvbuf + off * coll->elem;
    const char *src = is_root ? (const char *)coll->sendbuf + off * coll->elem : dst;
    if (!is_root && !ts->got) {
      WEFT_STEP(weft_link_recv(coll, t.parent, bytes, dst));
      ts->got = true;
    }
    while (ts->children_sent < t.nchildren) {
      int child = weft_tree_child(coll, &t, ts->children_sent);
      /* a chunk passed on moves now: the child's subtree waits for it (the
       * root's own chunks may go out together at the next progress) */
      WEFT_STEP(weft_step_send(coll, child, src, bytes,
                               WEFT_SEND_FOR_COPY | (is_root ? 0u : (unsigned)WEFT_SEND_NOW)));
      ts->children_sent++;
    }
    ts->chunk++;
    ts->got = false;
    ts->children_sent = 0;
  }
  return WEFT_OK;
}

/* An out-of-place root keeps the data too. It sends from sendbuf and
 * copies it into its own recvbuf while it waits for room, not before the
 * first chunk leaves, so no member waits for that copy (docs/tuning.md,
 * "An out-of-place call's own copy does not go first"). */
static size_t root_copy_bytes(const weft_coll *coll) {
  bool copies = coll->rank == coll->root && coll->sendbuf != coll->recvbuf;
  return copies ? coll->count * coll->elem : 0;
}

static weft_status tree_advance(weft_coll *coll) {
  tree_state *ts = WEFT_ALGO_STATE(coll, tree_state);
  return weft_step_with_local_copy(coll, tree_move, coll->recvbuf, coll->sendbuf,
                                   root_copy_bytes(coll), &ts->root_copied);
}

weft_status weft_tree_broadcast_start(weft_coll *coll, int fanout) {
  tree_state *ts = WEFT_ALGO_STATE(coll, tree_state);
  ts->fanout = weft_tree_shape_of(coll, fanout).fanout;
  ts->chunk_elems = weft_chunk_elems(coll);
  ts->nchunks = (coll->count + ts->chunk_elems - 1) / ts->chunk_elems;
  ts->chunk = 0;
  ts->got = false;
  ts->children_sent = 0;
  ts->root_copied = 0;
  coll->algo = ts->fanout == 1 ? "chain" : "tree";
  coll->advance = tree_advance;
  return WEFT_OK;
}

/* ---- the user's broadcast: every rank fails in a call that disagrees ----
 *
 * In a plain tree the root and the ranks above a disagreeing one have sent
 * or received all they expect and would return OK, learning of it only in
 * their next call. So a user's broadcast also moves every member's
 * descriptor (count, dtype, root) over the edges of a hypercube, against the
 * data: an edge's two ends compare them, and a member sends nothing on an
 * edge before it has checked all it received on earlier ones. Each message
 * then vouches for every member it depends on, and as in recursive
 * doubling every member's last receipt depends on all the others: a rank
 * that finds a disagreement fails, its failure notice replaces the message
 * its partners wait for, and no rank returns OK.
 *
 * Small buffers (and any buffer between two ranks) move on the same edges:
 * a binomial tree in which the lower end of an edge sends its descriptor
 * and the data (one message while the data is small), and the higher end,
 * which holds none yet, sends its descriptor the other way at once. That
 * costs one or two small messages per edge beside the data and no round
 * trip, so a small broadcast takes as many hops as the plain tree.
 * Large buffers keep the pipelined chain or tree, and the descriptors go
 * over the hypercube after it (log2(size) small messages late, a few
 * microseconds beside milliseconds of data).
 *
 * For a size that is not a power of two, member p2+i folds into member
 * p2-1-i (never the root) before the rounds and gets the data (or the
 * host's descriptor) from it after them. Virtual members: the root is 0.
 *
 * A flat tree (the root sends to every member itself: where links are
 * stores, each member then copies straight from the root's buffer, all at
 * once, one hop) needs no rounds: every member sends its descriptor to the
 * root as it enters, the root sends the data, then checks every descriptor
 * and only then sends each member its own as the verdict. A member returns
 * after the verdict, so a disagreement leaves every member waiting on the
 * root, which fails and passes that on. The descriptors travel while the
 * data is copied: the root waiting for them before it sent the data cost
 * a hop (docs/tuning.md, "The flat broadcast's descriptors travel with the
 * data"). */

/* Up to this many bytes the binomial tree's data rides in one message
 * behind the giver's descriptor, through a staging copy. Where links are
 * stores (shm) chunks from 16 KiB go by single copy, which packing would
 * lose. Over sockets a second message costs more than the copy of a small
 * buffer and less than that of a large one (docs/tuning.md, "A small
 * broadcast rides behind its descriptor"). */
#define BC_PACK_STORES_MAX_BYTES 8192
#define BC_PACK_SOCKETS_MAX_BYTES 65536

typedef struct bcast_desc {
  uint64_t count;
  int32_t dtype, root;
} bcast_desc;

enum { BC_ENTER, BC_TREE, BC_GATHER, BC_VERDICT, BC_FOLD_IN, BC_ROUNDS, BC_FOLD_OUT, BC_DONE };

typedef struct bcast_state {
  tree_state tree; /* first: tree_advance reads it as its own */
  bcast_desc mine;
  uint8_t phase;
  bool with_data; /* the hypercube's edges carry the data, else descriptors only */
  bool flat;      /* a flat tree, the descriptors through the root: no rounds */
  bool sent;      /* the fold's message from us is out */
  uint8_t edge;   /* a round's edge: how far (bc_edge) */
  bool packed;    /* the rounds' data rides behind the giver's descriptor, one message */
  int mask;       /* the round: partner = v ^ mask */
  size_t chunk;   /* data chunks moved on this edge */
} bcast_state;
_Static_assert(sizeof(bcast_state) <= WEFT_ALGO_STATE_BYTES, "bcast_state fits algo_state");

static int pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

static int bc_member(const weft_coll *coll, int v) {
  return (v + coll->root) % coll->size;
}

/* Descriptors are host memory whatever the buffers' kind. */
static weft_status bc_send_desc(weft_coll *coll, int v) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  int peer = bc_member(coll, v);
  WEFT_STEP(weft_link_send_ready(coll, peer));
  return coll->link.ops->send(coll->link.ctx, peer, &bs->mine, sizeof bs->mine, weft_coll_tag(coll),
                              &weft_mem_host, 0);
}

/* The descriptor at `slot`, from member `peer`, against ours. */
static weft_status bc_check_desc(weft_coll *coll, int peer, const void *slot) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  bcast_desc theirs;
  memcpy(&theirs, slot, sizeof theirs);
  if (memcmp(&theirs, &bs->mine, sizeof theirs)) {
    char why[384];
    int prank = coll->link.ops->rank_of(coll->link.ctx, peer);
    snprintf(why, sizeof why,
             "ranks disagree on %s call #%u: peer %d passes count=%llu, %s, root=%d; this rank "
             "passes count=%llu, %s, root=%d",
             coll->call, coll->seq, prank, (unsigned long long)theirs.count,
             weft_dtype_name((weft_dtype)theirs.dtype), theirs.root,
             (unsigned long long)bs->mine.count, weft_dtype_name((weft_dtype)bs->mine.dtype),
             bs->mine.root);
    coll->link.ops->set_error(coll->link.ctx, why);
    coll->fail_peer = prank;
    return WEFT_ERR_MISMATCH;
  }
  return WEFT_OK;
}

static weft_status bc_recv_desc(weft_coll *coll, int v) {
  int peer = bc_member(coll, v);
  const void *slot;
  WEFT_STEP(weft_link_recv_peek(coll, peer, sizeof(bcast_desc), &slot));
  WEFT_CHECK(bc_check_desc(coll, peer, slot));
  return weft_link_recv_release(coll, peer);
}

/* What a giver sends from: the root its sendbuf (tree_advance's
 * root_copy_bytes), every other member what it took. */
static const void *bc_source(const weft_coll *coll) {
  return coll->rank == coll->root ? coll->sendbuf : coll->recvbuf;
}

/* A small buffer goes in one message behind the giver's descriptor
 * (bcast_state.packed): a second message per edge was a large part of a
 * small broadcast (docs/tuning.md, "A small broadcast rides behind its
 * descriptor"). The staging holds the same bytes for every member this one
 * gives to, so it is written once per call. */
static weft_status bc_send_packed(weft_coll *coll, int v) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  size_t bytes = coll->count * coll->elem;
  if (!coll->scratch) {
    void *stage;
    WEFT_CHECK(weft_coll_scratch(coll, sizeof(bcast_desc) + bytes, &stage));
    memcpy(stage, &bs->mine, sizeof bs->mine);
    memcpy((char *)stage + sizeof(bcast_desc), bc_source(coll), bytes);
  }
  int peer = bc_member(coll, v);
  WEFT_STEP(weft_link_send_ready(coll, peer));
  return weft_link_send(coll, peer, coll->scratch, sizeof(bcast_desc) + bytes, 0);
}

static weft_status bc_recv_packed(weft_coll *coll, int v) {
  int peer = bc_member(coll, v);
  size_t bytes = coll->count * coll->elem;
  const void *slot;
  WEFT_STEP(weft_link_recv_peek(coll, peer, sizeof(bcast_desc) + bytes, &slot));
  WEFT_CHECK(bc_check_desc(coll, peer, slot));
  memcpy(coll->recvbuf, (const char *)slot + sizeof(bcast_desc), bytes);
  return weft_link_recv_release(coll, peer);
}

/* The whole buffer to or from virtual member v, a chunk at a time. */
static weft_status bc_send_data(weft_coll *coll, int v) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  size_t ce = weft_chunk_elems(coll), off, cnt;
  for (; bs->chunk * ce < coll->count; bs->chunk++) {
    weft_chunk_range(bs->chunk, ce, coll->count, &off, &cnt);
    WEFT_STEP(weft_step_send(coll, bc_member(coll, v),
                             (const char *)bc_source(coll) + off * coll->elem, cnt * coll->elem,
                             WEFT_SEND_FOR_COPY));
  }
  bs->chunk = 0;
  return WEFT_OK;
}

static weft_status bc_recv_data(weft_coll *coll, int v) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  size_t ce = weft_chunk_elems(coll), off, cnt;
  for (; bs->chunk * ce < coll->count; bs->chunk++) {
    weft_chunk_range(bs->chunk, ce, coll->count, &off, &cnt);
    WEFT_STEP(weft_link_recv(coll, bc_member(coll, v), cnt * coll->elem,
                             (char *)coll->recvbuf + off * coll->elem));
  }
  bs->chunk = 0;
  return WEFT_OK;
}

/* One edge: both ends send their descriptor and check the other's; `give`:
 * we then send the data, `take`: we take it once the giver's descriptor
 * agreed. The giver sends its data before it has the taker's descriptor
 * (no round trip), so the taker must check the giver's itself: with the
 * data alone, a taker whose dtype or root differed from the giver's at the
 * same byte count took the bytes and returned OK while the giver failed.
 * The giver's first message is its descriptor (16 bytes) or the packed
 * one (longer): ends that disagree on packing never take one for the
 * other, where data first could have the length of a packed message. */
enum { EDGE_SEND_DESC, EDGE_SEND_DATA, EDGE_RECV_DESC, EDGE_RECV_DATA };

static weft_status bc_edge(weft_coll *coll, int v, bool give, bool take) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  if (bs->edge == EDGE_SEND_DESC) { /* packed, the giver's goes with the data */
    if (!(give && bs->packed)) WEFT_STEP(bc_send_desc(coll, v));
    bs->edge = EDGE_SEND_DATA;
  }
  if (bs->edge == EDGE_SEND_DATA) {
    if (give) WEFT_STEP(bs->packed ? bc_send_packed(coll, v) : bc_send_data(coll, v));
    bs->edge = EDGE_RECV_DESC;
  }
  if (bs->edge == EDGE_RECV_DESC) {
    if (!(take && bs->packed)) WEFT_STEP(bc_recv_desc(coll, v));
    bs->edge = EDGE_RECV_DATA;
  }
  if (take) WEFT_STEP(bs->packed ? bc_recv_packed(coll, v) : bc_recv_data(coll, v));
  bs->edge = EDGE_SEND_DESC;
  return WEFT_OK;
}

static weft_status bcast_move(weft_coll *coll) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  int n = coll->size, v = weft_mod(coll->rank - coll->root, n);
  int p2 = pow2_floor(n), rem = n - p2;
  bool data = bs->with_data;
  if (bs->phase == BC_ENTER) { /* flat: a member's descriptor goes to the root first */
    if (v != 0) WEFT_STEP(bc_send_desc(coll, 0));
    bs->phase = BC_TREE;
  }
  if (bs->phase == BC_TREE) {
    WEFT_STEP(tree_move(coll));
    bs->phase = bs->flat ? BC_GATHER : BC_FOLD_IN;
  }
  if (bs->phase == BC_GATHER) { /* the root checks them all, every member hears it */
    if (v == 0) {
      for (; bs->mask < n; bs->mask++) WEFT_STEP(bc_recv_desc(coll, bs->mask));
      bs->mask = 1;
      bs->phase = BC_VERDICT;
    } else {
      WEFT_STEP(bc_recv_desc(coll, 0));
      bs->phase = BC_DONE;
    }
  }
  if (bs->phase == BC_VERDICT) {
    for (; bs->mask < n; bs->mask++) WEFT_STEP(bc_send_desc(coll, bs->mask));
    bs->phase = BC_DONE;
  }
  if (bs->phase == BC_FOLD_IN) {
    if (v >= p2) { /* folds into its host, and waits there for the end */
      if (!bs->sent) {
        WEFT_STEP(bc_send_desc(coll, p2 - 1 - (v - p2)));
        bs->sent = true;
      }
      bs->phase = BC_FOLD_OUT;
    } else {
      if (v >= p2 - rem) WEFT_STEP(bc_recv_desc(coll, p2 + (p2 - 1 - v)));
      bs->phase = BC_ROUNDS;
      bs->mask = 1;
    }
  }
  if (bs->phase == BC_ROUNDS) {
    for (; bs->mask < p2; bs->mask <<= 1) {
      int partner = v ^ bs->mask;
      /* before this round only members below `mask` hold the data */
      WEFT_STEP(bc_edge(coll, partner, data && v < bs->mask, data && partner < bs->mask));
    }
    bs->phase = BC_FOLD_OUT;
  }
  if (bs->phase == BC_FOLD_OUT) {
    if (v >= p2) {
      WEFT_STEP(data ? bc_recv_data(coll, p2 - 1 - (v - p2)) : bc_recv_desc(coll, p2 - 1 - (v - p2)));
    } else if (v >= p2 - rem) {
      int extra = p2 + (p2 - 1 - v);
      WEFT_STEP(data ? bc_send_data(coll, extra) : bc_send_desc(coll, extra));
    }
    bs->sent = false;
    bs->phase = BC_DONE;
  }
  return WEFT_OK;
}

static weft_status bcast_advance(weft_coll *coll) {
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  return weft_step_with_local_copy(coll, bcast_move, coll->recvbuf, coll->sendbuf,
                                   root_copy_bytes(coll), &bs->tree.root_copied);
}

weft_status weft_confirmed_broadcast_start(weft_coll *coll, int fanout) {
  bool binomial = fanout <= 0;
  WEFT_CHECK(weft_tree_broadcast_start(coll, binomial ? 1 : fanout));
  bcast_state *bs = WEFT_ALGO_STATE(coll, bcast_state);
  bs->mine = (bcast_desc){.count = coll->count, .dtype = (int32_t)coll->dtype, .root = coll->root};
  bs->with_data = binomial;
  bs->flat = !binomial && coll->size > 2 && bs->tree.fanout == coll->size - 1;
  bs->phase = binomial ? BC_FOLD_IN : bs->flat ? BC_ENTER : BC_TREE;
  bs->sent = false;
  bs->edge = 0;
  /* Ranks whose counts differ may disagree on packing too: their first
   * message on the edge then has a length the other does not expect, and
   * both fail as for any other disagreement. */
  size_t bytes = coll->count * coll->elem;
  size_t pack_max =
      coll->hint.sends_are_stores ? BC_PACK_STORES_MAX_BYTES : BC_PACK_SOCKETS_MAX_BYTES;
  bs->packed = binomial && bytes <= pack_max &&
               sizeof(bcast_desc) + bytes <= coll->chunk_bytes && !weft_wire_on(coll) &&
               (coll->mem->kind == WEFT_MEMORY_HOST || coll->mem->kind == WEFT_MEMORY_SHARED);
  bs->mask = 1;
  bs->chunk = 0;
  coll->algo = binomial    ? "binomial"
               : bs->flat  ? "flat, confirmed"
               : bs->tree.fanout == 1 ? "chain, confirmed"
                                      : "tree, confirmed";
  coll->advance = bcast_advance;
  return WEFT_OK;
}
