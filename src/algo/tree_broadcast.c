/* tree_broadcast.c - pipelined broadcast down a k-ary tree rooted at `root`
 * (fan-out 1 is a chain, the bandwidth-optimal shape for large buffers; 2 a
 * binary tree for small ones). The buffer moves in chunks: a rank forwards
 * chunk i to its children while chunk i+1 is still arriving. */
#include "algo.h"

static int tree_real(const weft_coll *coll, int v) { return (v + coll->root) % coll->comm->size; }

static weft_status tree_advance(weft_coll *coll) {
  weft_tree_state *ts = &coll->st.tree;
  int n = coll->comm->size, k = ts->fanout;
  int v = (coll->comm->rank - coll->root + n) % n; /* virtual rank: root is 0 */
  bool is_root = v == 0;
  int first_child = v * k + 1;
  int nchildren = first_child >= n ? 0 : (n - first_child < k ? n - first_child : k);
  while (ts->chunk < ts->nchunks) {
    size_t off = ts->chunk * ts->chunk_elems;
    size_t cnt = coll->count - off < ts->chunk_elems ? coll->count - off : ts->chunk_elems;
    size_t bytes = cnt * coll->elem;
    char *dst = (char *)coll->recvbuf + off * coll->elem;
    const char *src = is_root ? (const char *)coll->sendbuf + off * coll->elem : dst;
    if (!is_root && !ts->got) {
      WEFT_STEP(weft_link_recv_into(coll, tree_real(coll, (v - 1) / k), bytes, dst));
      ts->got = true;
    }
    while (ts->children_sent < nchildren) {
      int child = tree_real(coll, first_child + ts->children_sent);
      WEFT_STEP(weft_link_send_ready(coll, child));
      WEFT_STEP(weft_link_send(coll, child, src, bytes));
      ts->children_sent++;
    }
    ts->chunk++;
    ts->got = false;
    ts->children_sent = 0;
  }
  return WEFT_OK;
}

weft_status weft_tree_broadcast_start(weft_coll *coll, int fanout) {
  weft_tree_state *ts = &coll->st.tree;
  int n = coll->comm->size;
  ts->fanout = fanout < 1 ? 1 : fanout > n - 1 ? (n > 1 ? n - 1 : 1) : fanout;
  ts->chunk_elems = coll->comm->chunk_bytes / coll->elem;
  if (ts->chunk_elems == 0) ts->chunk_elems = 1;
  ts->nchunks = (coll->count + ts->chunk_elems - 1) / ts->chunk_elems;
  ts->chunk = 0;
  ts->got = false;
  ts->children_sent = 0;
  if (coll->comm->rank == coll->root && coll->sendbuf != coll->recvbuf)
    coll->mem->copy(coll->recvbuf, coll->sendbuf, coll->count * coll->elem);
  coll->algo = ts->fanout == 1 ? "chain" : "tree";
  coll->advance = tree_advance;
  return WEFT_OK;
}
