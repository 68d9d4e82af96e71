/* hier_allreduce.c - allreduce for ranks spread over several hosts: reduce
 * within each host to its leader (its lowest rank) over the fast local
 * transport, allreduce among the leaders across hosts, broadcast within
 * each host. Only one rank per host sends across hosts, so the network
 * carries 2(h-1)/h of the buffer per host instead of per rank.
 *
 * Each phase is an ordinary algorithm (tree reduce, ring or recursive
 * doubling, tree broadcast) run on a group: the host's members or the
 * leaders. Phases share the call's sequence tag; a link carries one phase
 * after another in FIFO order, so their chunks cannot mix. Avg sums in the
 * first phase and divides once, by the whole communicator's size, in the
 * leaders' allreduce. A wire dtype (algo.h) is the leaders' phase's only:
 * within a host the data moves in f32, and the leaders' result, rounded the
 * same on every leader, is what the broadcast copies. */
#include <stdlib.h>
#include <string.h>

#include "src/algo/algo.h"

/* The phase running: an ordinary weft_coll in scratch (its own state in
 * its own algo_state), on the links of its group. */
typedef struct hier_state {
  int phase;    /* 0 reduce within the host, 1 leaders, 2 broadcast within the host */
  bool running; /* `inner` holds the phase in progress */
  struct weft_coll *inner;
  weft_link_group group; /* the phase's links: its group's members on the call's links */
  void *spent[3];        /* finished phases' scratch: their last sends may still read it */
} hier_state;
_Static_assert(sizeof(hier_state) <= WEFT_ALGO_STATE_BYTES, "hier_state fits weft_coll.algo_state");

/* The phases' scratch is freed by the cleanup hook whether the call
 * completes or fails: only then, after the call's flush, are the sends
 * that read it complete. (A phase ends when its last send is posted, and a
 * transport may read the source until the send completes: TCP writes from
 * it later when the socket is full. Freed at the next phase's start, a tree
 * reduce's partial sum went out as garbage; test_algo_fake found it.) */
static void hier_cleanup(weft_coll *coll) {
  hier_state *hs = WEFT_ALGO_STATE(coll, hier_state);
  for (int p = 0; p < 3; p++) {
    weft_coll_scratch_free(coll, hs->spent[p]);
    hs->spent[p] = NULL;
  }
  if (!hs->inner) return;
  weft_coll_scratch_free(hs->inner, hs->inner->scratch);
  hs->inner->scratch = NULL;
}

/* Sets `inner` up as a phase of `coll` on the ranks `group` (this rank is
 * `rank` of `size`), reading `src` and writing `dst`. */
static void phase_init(weft_coll *coll, const int *group, int rank, int size, const void *src,
                       void *dst, int avg_div, bool across_hosts) {
  hier_state *hs = WEFT_ALGO_STATE(coll, hier_state);
  weft_coll *inner = hs->inner;
  *inner = (weft_coll){.link = weft_link_group_init(&hs->group, coll->link, group),
                       .call = coll->call,
                       .kind = coll->kind,
                       .rank = rank,
                       .size = size,
                       .avg_div = avg_div,
                       .sendbuf = src,
                       .recvbuf = dst,
                       .count = coll->count,
                       .dtype = coll->dtype,
                       .op = coll->op,
                       .root = 0,
                       .elem = coll->elem,
                       .chunk_bytes = coll->chunk_bytes,
                       .mem = coll->mem,
                       .seq = coll->seq,
                       .waiting_peer = -1,
                       .fail_peer = -1};
  if (across_hosts) { /* the call's stage: it lives until the call's flush */
    inner->wire = coll->wire;
    inner->wire_stage = coll->wire_stage;
  }
}

static weft_status hier_advance(weft_coll *coll) {
  hier_state *hs = WEFT_ALGO_STATE(coll, hier_state);
  const weft_hosts *h = &coll->hosts;
  size_t bytes = coll->count * coll->elem;
  int fanout = bytes >= coll->hint.bcast_chain_bytes ? 1 : 2;
  for (;;) {
    if (hs->running) {
      WEFT_STEP(hs->inner->advance(hs->inner));
      hs->spent[hs->phase] = hs->inner->scratch;
      hs->inner->scratch = NULL;
      hs->running = false;
      hs->phase++;
    }
    switch (hs->phase) {
      case 0: /* reduce to the leader */
        if (h->local_size > 1) {
          phase_init(coll, h->host_members, h->host_index, h->local_size, coll->sendbuf,
                     coll->recvbuf, 1, false);
          WEFT_CHECK(weft_tree_reduce_start(hs->inner, fanout));
          hs->running = true;
          continue;
        }
        if (coll->recvbuf != coll->sendbuf) coll->mem->copy(coll->recvbuf, coll->sendbuf, bytes);
        hs->phase++;
        continue;
      case 1: /* allreduce among the leaders, in place; avg divides by the call's */
        if (h->host_index == 0 && h->nhosts > 1) {
          phase_init(coll, h->leaders, h->leader_index, h->nhosts, coll->recvbuf, coll->recvbuf,
                     coll->avg_div, true);
          bool rd = bytes <= coll->chunk_bytes && bytes <= coll->hint.rd_max_bytes;
          WEFT_CHECK(rd ? weft_rd_allreduce_start(hs->inner)
                        : weft_ring_allreduce_start(hs->inner));
          hs->running = true;
          continue;
        }
        if (h->host_index == 0) /* one host: the leader divides for avg */
          coll->mem->finish(coll->recvbuf, coll->recvbuf, coll->count, coll->dtype, coll->op,
                            coll->avg_div);
        hs->phase++;
        continue;
      case 2: /* broadcast from the leader */
        if (h->local_size > 1) {
          phase_init(coll, h->host_members, h->host_index, h->local_size, coll->recvbuf,
                     coll->recvbuf, 1, false);
          WEFT_CHECK(weft_tree_broadcast_start(hs->inner, fanout));
          hs->running = true;
          continue;
        }
        hs->phase++;
        continue;
      default: return WEFT_OK;
    }
  }
}

weft_status weft_hier_allreduce_start(weft_coll *coll) {
  hier_state *hs = WEFT_ALGO_STATE(coll, hier_state);
  void *inner;
  WEFT_CHECK(weft_coll_scratch(coll, sizeof(weft_coll), &inner));
  memset(inner, 0, sizeof(weft_coll));
  *hs = (hier_state){.phase = 0, .running = false, .inner = inner};
  coll->algo = "hier";
  coll->cleanup = hier_cleanup;
  coll->advance = hier_advance;
  return WEFT_OK;
}
