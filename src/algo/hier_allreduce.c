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
 * leaders' allreduce. */
#include <stdlib.h>
#include <string.h>

#include "src/algo/algo.h"

/* The phase's own algorithm state lives in scratch, freed by the cleanup
 * hook whether the call completes or fails. */
static void hier_cleanup(weft_coll *coll) {
  weft_coll *inner = coll->st.hier.inner;
  if (!inner) return;
  free(inner->scratch);
  inner->scratch = NULL;
}

/* Sets `inner` up as a phase of `coll` on `group` (this rank is `rank` of
 * `size`), reading `src` and writing `dst`. */
static void phase_init(weft_coll *coll, const int *group, int rank, int size, const void *src,
                       void *dst, int avg_div) {
  weft_coll *inner = coll->st.hier.inner;
  free(inner->scratch);
  *inner = (weft_coll){.comm = coll->comm,
                       .call = coll->call,
                       .kind = coll->kind,
                       .rank = rank,
                       .size = size,
                       .group = group,
                       .avg_div = avg_div,
                       .sendbuf = src,
                       .recvbuf = dst,
                       .count = coll->count,
                       .dtype = coll->dtype,
                       .op = coll->op,
                       .root = 0,
                       .elem = coll->elem,
                       .mem = coll->mem,
                       .seq = coll->seq,
                       .waiting_peer = -1,
                       .fail_peer = -1,
                       .outer = coll};
}

static weft_status hier_advance(weft_coll *coll) {
  weft_hier_state *hs = &coll->st.hier;
  weft_comm *comm = coll->comm;
  size_t bytes = coll->count * coll->elem;
  int fanout = bytes >= comm->choice.bcast_chain_bytes ? 1 : 2;
  for (;;) {
    if (hs->running) {
      WEFT_STEP(hs->inner->advance(hs->inner));
      hs->running = false;
      hs->phase++;
    }
    switch (hs->phase) {
      case 0: /* reduce to the leader */
        if (comm->local_size > 1) {
          phase_init(coll, comm->host_members, comm->host_index, comm->local_size, coll->sendbuf,
                     coll->recvbuf, 1);
          WEFT_CHECK(weft_tree_reduce_start(hs->inner, fanout));
          hs->running = true;
          continue;
        }
        if (coll->recvbuf != coll->sendbuf) coll->mem->copy(coll->recvbuf, coll->sendbuf, bytes);
        hs->phase++;
        continue;
      case 1: /* allreduce among the leaders, in place */
        if (comm->host_index == 0 && comm->nhosts > 1) {
          phase_init(coll, comm->leaders, comm->leader_index, comm->nhosts, coll->recvbuf,
                     coll->recvbuf, comm->size);
          bool rd = bytes <= comm->chunk_bytes && bytes <= comm->choice.rd_max_bytes;
          WEFT_CHECK(rd ? weft_rd_allreduce_start(hs->inner)
                        : weft_ring_allreduce_start(hs->inner));
          hs->running = true;
          continue;
        }
        if (comm->host_index == 0) /* one host: the leader divides for avg */
          coll->mem->finish(coll->recvbuf, coll->recvbuf, coll->count, coll->dtype, coll->op,
                            comm->size);
        hs->phase++;
        continue;
      case 2: /* broadcast from the leader */
        if (comm->local_size > 1) {
          phase_init(coll, comm->host_members, comm->host_index, comm->local_size, coll->recvbuf,
                     coll->recvbuf, 1);
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
  weft_hier_state *hs = &coll->st.hier;
  void *inner;
  WEFT_CHECK(weft_coll_scratch(coll, sizeof(weft_coll), &inner));
  memset(inner, 0, sizeof(weft_coll));
  *hs = (weft_hier_state){.phase = 0, .running = false, .inner = inner};
  coll->algo = "hier";
  coll->cleanup = hier_cleanup;
  coll->advance = hier_advance;
  return WEFT_OK;
}
