/* tree_broadcast.c - pipelined broadcast down a k-ary tree rooted at `root`
 * (fan-out 1 is a chain, the bandwidth-optimal shape for large buffers; 2 a
 * binary tree for small ones). The buffer moves in chunks: a rank forwards
 * chunk i to its children while chunk i+1 is still arriving. */
#include "src/algo/algo.h"

typedef struct tree_state {
  int fanout;
  size_t chunk_elems;
  size_t nchunks;
  size_t chunk;      /* next chunk to handle */
  bool got;          /* current chunk received (non-root) */
  int children_sent; /* current chunk sent to this many children */
} tree_state;
_Static_assert(sizeof(tree_state) <= WEFT_ALGO_STATE_BYTES, "tree_state fits weft_coll.algo_state");

static weft_status tree_advance(weft_coll *coll) {
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
      WEFT_STEP(weft_link_recv_into(coll, t.parent, bytes, dst));
      ts->got = true;
    }
    while (ts->children_sent < t.nchildren) {
      int child = weft_tree_child(coll, &t, ts->children_sent);
      WEFT_STEP(weft_step_send(coll, child, src, bytes));
      ts->children_sent++;
    }
    ts->chunk++;
    ts->got = false;
    ts->children_sent = 0;
  }
  return WEFT_OK;
}

weft_status weft_tree_broadcast_start(weft_coll *coll, int fanout) {
  tree_state *ts = WEFT_ALGO_STATE(coll, tree_state);
  ts->fanout = weft_tree_shape_of(coll, fanout).fanout;
  ts->chunk_elems = weft_chunk_elems(coll);
  ts->nchunks = (coll->count + ts->chunk_elems - 1) / ts->chunk_elems;
  ts->chunk = 0;
  ts->got = false;
  ts->children_sent = 0;
  if (coll->rank == coll->root && coll->sendbuf != coll->recvbuf)
    coll->mem->copy(coll->recvbuf, coll->sendbuf, coll->count * coll->elem);
  coll->algo = ts->fanout == 1 ? "chain" : "tree";
  coll->advance = tree_advance;
  return WEFT_OK;
}
