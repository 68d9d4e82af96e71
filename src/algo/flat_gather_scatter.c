/* flat_gather_scatter.c - gather to and scatter from `root`: the root
 * exchanges each rank's block with that rank directly, chunk by chunk, taking
 * chunk i of every rank in turn so that no link idles while another one
 * finishes. The root's link carries (n-1)/n of the buffer, the least either
 * call can do; a tree would only save latency for small blocks (later, if it
 * matters). The root's own block is a local copy, skipped in place and made
 * while the root waits for room or data (weft_step_with_local_copy). */
#include "src/algo/algo.h"

typedef struct flat_state {
  size_t chunk_elems;
  size_t nchunks; /* chunks per block */
  bool to_root;   /* gather (else scatter) */
  size_t chunk;   /* chunk being moved */
  int peer;       /* its peer (root's side) */
  size_t own_copied; /* the root: bytes of its own block copied */
} flat_state;
_Static_assert(sizeof(flat_state) <= WEFT_ALGO_STATE_BYTES, "flat_state fits weft_coll.algo_state");

static weft_status flat_move(weft_coll *coll) {
  flat_state *fs = WEFT_ALGO_STATE(coll, flat_state);
  int n = coll->size, root = coll->root;
  bool is_root = coll->rank == root;
  while (fs->chunk < fs->nchunks) {
    size_t off, cnt;
    weft_chunk_range(fs->chunk, fs->chunk_elems, coll->count, &off, &cnt);
    size_t bytes = cnt * coll->elem;
    if (!is_root && fs->to_root)
      WEFT_STEP(weft_step_send(coll, root, (const char *)coll->sendbuf + off * coll->elem, bytes,
                               WEFT_SEND_FOR_COPY));
    if (!is_root && !fs->to_root)
      WEFT_STEP(weft_link_recv(coll, root, bytes, (char *)coll->recvbuf + off * coll->elem));
    for (; is_root && fs->peer < n; fs->peer++) {
      if (fs->peer == root) continue;
      size_t at = ((size_t)fs->peer * coll->count + off) * coll->elem;
      if (fs->to_root)
        WEFT_STEP(weft_link_recv(coll, fs->peer, bytes, (char *)coll->recvbuf + at));
      else
        WEFT_STEP(weft_step_send(coll, fs->peer, (const char *)coll->sendbuf + at, bytes,
                                 WEFT_SEND_FOR_COPY));
    }
    fs->peer = 0;
    fs->chunk++;
  }
  return WEFT_OK;
}

static weft_status flat_advance(weft_coll *coll) {
  flat_state *fs = WEFT_ALGO_STATE(coll, flat_state);
  if (coll->rank != coll->root) return flat_move(coll);
  size_t block = coll->count * coll->elem, mine = (size_t)coll->root * block;
  char *dst = fs->to_root ? (char *)coll->recvbuf + mine : coll->recvbuf;
  const char *src = fs->to_root ? coll->sendbuf : (const char *)coll->sendbuf + mine;
  return weft_step_with_local_copy(coll, flat_move, dst, src, dst == src ? 0 : block,
                                   &fs->own_copied);
}

static weft_status flat_start(weft_coll *coll, bool to_root) {
  flat_state *fs = WEFT_ALGO_STATE(coll, flat_state);
  *fs = (flat_state){.chunk_elems = weft_chunk_elems(coll), .to_root = to_root};
  fs->nchunks = (coll->count + fs->chunk_elems - 1) / fs->chunk_elems;
  coll->algo = "flat";
  coll->advance = flat_advance;
  return WEFT_OK;
}

weft_status weft_flat_gather_start(weft_coll *coll) {
  return flat_start(coll, true);
}
weft_status weft_flat_scatter_start(weft_coll *coll) {
  return flat_start(coll, false);
}
