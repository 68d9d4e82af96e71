/* tree_reduce.c - pipelined reduce up a k-ary tree towards `root`, the mirror
 * of tree_broadcast.c: fan-out 1 (a chain) for large buffers, 2 (a binary
 * tree) for small ones. A rank folds its children's chunk i into its own and
 * sends the partial sum up while chunk i+1 is still coming.
 *
 * Why a chain, and not ring reduce-scatter + gather to root: the root's
 * incoming link bounds a reduce. A chain brings the buffer into the root
 * once; reduce-scatter + gather brings (n-1)/n of it twice (once in each
 * phase), and adds a phase. Every rank reduces one buffer's worth either way,
 * overlapped with the transfer. The chain's cost is n-1 hops of latency,
 * which is why small buffers take the binary tree (log2 n hops; the root's
 * link carries two buffers, cheap at that size).
 *
 * Inner ranks keep the partial sum in one chunk of scratch and wait for its
 * previous send to complete before refilling it; the root sums straight into
 * recvbuf and divides for avg with its last child. */
#include "src/algo/algo.h"

typedef struct tree_reduce_state {
  int fanout;
  size_t chunk_elems;
  size_t nchunks;
  size_t chunk;      /* next chunk to handle */
  int children_done; /* current chunk: this many children folded in */
  void *partial;     /* one chunk of scratch: the partial sum (inner ranks) */
} tree_reduce_state;
_Static_assert(sizeof(tree_reduce_state) <= WEFT_ALGO_STATE_BYTES,
               "tree_reduce_state fits weft_coll.algo_state");

static weft_status treer_advance(weft_coll *coll) {
  tree_reduce_state *ts = WEFT_ALGO_STATE(coll, tree_reduce_state);
  weft_tree_shape t = weft_tree_shape_of(coll, ts->fanout);
  bool is_root = t.parent < 0;
  while (ts->chunk < ts->nchunks) {
    size_t off, cnt;
    weft_chunk_range(ts->chunk, ts->chunk_elems, coll->count, &off, &cnt);
    const char *own = (const char *)coll->sendbuf + off * coll->elem;
    if (t.nchildren == 0) WEFT_STEP(weft_step_send(coll, t.parent, own, cnt * coll->elem, 0));
    void *acc = is_root ? (char *)coll->recvbuf + off * coll->elem : ts->partial;
    while (ts->children_done < t.nchildren) {
      bool first = ts->children_done == 0, last = ts->children_done == t.nchildren - 1;
      int child = weft_tree_child(coll, &t, ts->children_done);
      /* the last child's fold goes up (or, at the root, is final: divided
       * for avg); before the first refills the scratch, its last send must
       * be out */
      WEFT_STEP(weft_step_recv_reduce(coll, child, last ? t.parent : -1, acc, first ? own : acc,
                                      cnt, last && is_root ? coll->avg_div : 1,
                                      first && !is_root ? t.parent : -1));
      ts->children_done++;
    }
    ts->chunk++;
    ts->children_done = 0;
  }
  return WEFT_OK;
}

weft_status weft_tree_reduce_start(weft_coll *coll, int fanout) {
  tree_reduce_state *ts = WEFT_ALGO_STATE(coll, tree_reduce_state);
  weft_tree_shape t = weft_tree_shape_of(coll, fanout);
  *ts = (tree_reduce_state){.fanout = t.fanout, .chunk_elems = weft_chunk_elems(coll)};
  ts->nchunks = (coll->count + ts->chunk_elems - 1) / ts->chunk_elems;
  size_t chunk = coll->count < ts->chunk_elems ? coll->count : ts->chunk_elems;
  if (t.parent >= 0 && t.nchildren > 0) /* an inner rank */
    WEFT_CHECK(weft_coll_scratch(coll, chunk * coll->elem, &ts->partial));
  coll->algo = ts->fanout == 1 ? "chain" : "tree";
  coll->advance = treer_advance;
  return WEFT_OK;
}
