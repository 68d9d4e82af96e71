/* hier_device.c - allreduce and broadcast on device buffers of ranks spread
 * over several hosts with several ranks on some (issue 47): CUDA IPC within
 * a host, the device channel (verbs, GPUDirect RDMA) between hosts. The
 * allreduce is the leader form of hier_allreduce.c with phases that work on
 * the buffers where they lie:
 *   1. the host's sum into its leader's recvbuf: the direct rounds' reduce
 *      (direct_device.c), the leader reading every member's sendbuf over
 *      CUDA IPC and summing in member order with kernels;
 *   2. the leaders' allreduce of that sum, in place, over the device
 *      channel (recursive doubling for one chunk, else the ring: the same
 *      choice as the host form), divided there for avg by the call's size;
 *   3. the result from the leader to its host: the direct rounds'
 *      broadcast, every member copying the leader's recvbuf over IPC.
 * The broadcast: the root's host from the root (IPC), the leaders from the
 * root's host's leader (the pipelined tree over the device channel), each
 * other host from its leader (IPC).
 * The links know which channel each peer takes (comm_link.c: the device
 * channel to another host, the collectives' to this one, which carries
 * the direct rounds' descriptors). A phase that finds a buffer some member
 * of its host cannot map (GPUs without peer access) fails the call on every
 * rank, saying so: staging it after all would need every host to agree
 * (WEFT_CUDA_IPC=0 stages every call). */
#include <stdlib.h>

#include "src/algo/algo.h"

typedef struct hdev_ctl {
  weft_coll inner;        /* the phase in progress */
  weft_group_links group; /* its links: its group's members on the call's links */
  bool running;
  int next;       /* the phase: 0 reduce, 1 the leaders' allreduce, 2 broadcast, 3 done */
  void *sum;      /* the leader's device scratch for phase 1's sum (count elements) */
  /* finished phases' scratch (their last sends may read it), with the
   * table it came from: a phase within a host takes host memory, the
   * leaders' phase device memory (algo.h, scratch_mem) */
  void *spent[3];
  const weft_mem_ops *spent_mem[3];
  int nspent;
} hdev_ctl;

typedef struct hdev_state {
  hdev_ctl *ctl;
} hdev_state;
_Static_assert(sizeof(hdev_state) <= WEFT_ALGO_STATE_BYTES, "hdev_state fits weft_coll.algo_state");

static void hdev_cleanup(weft_coll *coll) {
  hdev_ctl *ctl = WEFT_ALGO_STATE(coll, hdev_state)->ctl;
  if (!ctl) return;
  if (ctl->running && ctl->inner.cleanup) ctl->inner.cleanup(&ctl->inner);
  for (int i = 0; i < ctl->nspent; i++)
    (ctl->spent_mem[i] ? ctl->spent_mem[i] : &weft_mem_host)->free_scratch(ctl->spent[i]);
  /* the phase in progress's, and what its direct rounds handed over as
   * they fell back (algo.h) */
  weft_coll_scratch_release(&ctl->inner);
  /* at the call's end: the direct rounds end only once their kernels ran */
  if (ctl->sum) coll->mem->free_scratch(ctl->sum);
  free(ctl);
  WEFT_ALGO_STATE(coll, hdev_state)->ctl = NULL;
}

/* Phase `next` as a `size`-member run on `group` (this rank `rank`). */
static weft_coll *phase_init(weft_coll *coll, hdev_ctl *ctl, const int *group, int rank,
                             int size, const void *src, void *dst, int avg_div, bool across) {
  weft_coll *in = weft_coll_phase(&ctl->inner, coll, &ctl->group, group, rank, size, src, dst,
                                  coll->count, avg_div);
  if (across) {
    /* the network phase: its scratch is device memory (what it holds is
     * data), and the call's wire dtype is its own */
    in->scratch_mem = coll->scratch_mem;
    in->wire = coll->wire;
    in->wire_stage = coll->wire_stage;
  }
  ctl->running = true;
  return in;
}

/* Advances the phase in progress: OK once it is done, AGAIN, or an error.
 * The direct rounds' questions are answered here (algo.h). */
static weft_status phase_step(weft_coll *coll, hdev_ctl *ctl) {
  weft_coll *in = &ctl->inner;
  for (;;) {
    weft_status st = in->advance(in);
    if (st == WEFT_ALGO_NEED_SCRATCH) {
      if (!ctl->sum) ctl->sum = coll->mem->alloc_scratch(coll->count * coll->elem + 64);
      if (!ctl->sum) {
        coll->link.ops->set_error(coll->link.ctx, "no device memory for the host's sum");
        return WEFT_ERR_NOMEM;
      }
      in->device_scratch = ctl->sum;
      continue;
    }
    if (st == WEFT_ALGO_FALL_BACK) {
      coll->link.ops->set_error(
          coll->link.ctx,
          "a device buffer of this host's ranks cannot be mapped over CUDA IPC (GPUs without peer "
          "access?): the hierarchical allreduce over the device channel needs it; set "
          "WEFT_CUDA_IPC=0 on every rank to stage such calls through host memory");
      return WEFT_ERR_UNSUPPORTED;
    }
    if (st != WEFT_OK) return st;
    if (in->cleanup) in->cleanup(in);
    if (in->scratch) {
      if (ctl->nspent == (int)(sizeof ctl->spent / sizeof *ctl->spent)) return WEFT_ERR_INTERNAL;
      ctl->spent_mem[ctl->nspent] = in->scratch_mem;
      ctl->spent[ctl->nspent++] = in->scratch;
      in->scratch = NULL;
    }
    ctl->running = false;
    return WEFT_OK;
  }
}

/* The last phase of both forms: the leader's recvbuf to its host's ranks,
 * each copying it over CUDA IPC (the direct rounds' broadcast). */
static weft_status from_leader_start(weft_coll *coll, hdev_ctl *ctl) {
  const weft_hosts *h = &coll->hosts;
  return weft_direct_broadcast_start(phase_init(coll, ctl, h->host_members, h->host_index,
                                                h->local_size, coll->recvbuf, coll->recvbuf, 1,
                                                false));
}

static weft_status hdev_advance(weft_coll *coll) {
  hdev_ctl *ctl = WEFT_ALGO_STATE(coll, hdev_state)->ctl;
  const weft_hosts *h = &coll->hosts;
  for (;;) {
    if (ctl->running) {
      WEFT_STEP(phase_step(coll, ctl));
      ctl->next++;
    }
    switch (ctl->next) {
      case 0: /* the host's sum into its leader's recvbuf */
        if (h->local_size > 1) {
          WEFT_CHECK(weft_direct_reduce_start(phase_init(coll, ctl, h->host_members, h->host_index,
                                                         h->local_size, coll->sendbuf,
                                                         coll->recvbuf, 1, false)));
          continue;
        }
        ctl->next++;
        continue;
      case 1: /* the leaders' allreduce, in place; avg divides by the call's size */
        if (h->host_index == 0) {
          const void *from = h->local_size > 1 ? coll->recvbuf : coll->sendbuf;
          weft_coll *in = phase_init(coll, ctl, h->leaders, h->leader_index, h->nhosts, from,
                                     coll->recvbuf, coll->avg_div, true);
          size_t bytes = coll->count * coll->elem;
          bool rd = bytes <= coll->chunk_bytes && bytes <= coll->hint.rd_max_bytes;
          WEFT_CHECK(rd ? weft_rd_allreduce_start(in) : weft_ring_allreduce_start(in));
          continue;
        }
        ctl->next++;
        continue;
      case 2: /* the result to the host */
        if (h->local_size > 1) {
          WEFT_CHECK(from_leader_start(coll, ctl));
          continue;
        }
        ctl->next++;
        continue;
      default:
        return WEFT_OK;
    }
  }
}

/* The broadcast: the root's host first (every member of it, its leader
 * included, has the data after), then the leaders (the root's host's
 * leader the root of that phase), then the other hosts from their leader. */
static weft_status hdev_bcast_advance(weft_coll *coll) {
  hdev_ctl *ctl = WEFT_ALGO_STATE(coll, hdev_state)->ctl;
  const weft_hosts *h = &coll->hosts;
  int root_host = h->host_of[coll->root];
  bool mine = root_host == h->leader_index; /* the root is on this host */
  for (;;) {
    if (ctl->running) {
      WEFT_STEP(phase_step(coll, ctl));
      ctl->next++;
    }
    switch (ctl->next) {
      case 0: /* within the root's host, from the root */
        if (mine && h->local_size > 1) {
          int root_index = 0;
          while (h->host_members[root_index] != coll->root) root_index++;
          weft_coll *in = phase_init(coll, ctl, h->host_members, h->host_index, h->local_size,
                                     coll->sendbuf, coll->recvbuf, 1, false);
          in->root = root_index;
          WEFT_CHECK(weft_direct_broadcast_start(in));
          continue;
        }
        ctl->next++;
        continue;
      case 1: /* among the leaders, from the root's host's */
        if (h->host_index == 0) {
          /* the root's host's leader has the data in recvbuf after phase 0,
           * or in sendbuf where it is the root alone on its host */
          bool alone_root = mine && h->local_size == 1;
          weft_coll *in = phase_init(coll, ctl, h->leaders, h->leader_index, h->nhosts,
                                     alone_root ? coll->sendbuf : coll->recvbuf, coll->recvbuf, 1,
                                     true);
          in->root = root_host;
          size_t bytes = coll->count * coll->elem;
          WEFT_CHECK(weft_tree_broadcast_start(in, bytes >= coll->hint.bcast_chain_bytes ? 1 : 2));
          continue;
        }
        ctl->next++;
        continue;
      case 2: /* within the other hosts, from their leader */
        if (!mine && h->local_size > 1) {
          WEFT_CHECK(from_leader_start(coll, ctl));
          continue;
        }
        ctl->next++;
        continue;
      default:
        return WEFT_OK;
    }
  }
}

/* Either form's start: several hosts (the caller's rule), the control
 * state, then `advance`. */
static weft_status hdev_start(weft_coll *coll, weft_status (*advance)(weft_coll *)) {
  if (coll->hosts.nhosts < 2 || !coll->hosts.host_of) return WEFT_ERR_INTERNAL;
  hdev_ctl *ctl = calloc(1, sizeof *ctl);
  if (!ctl) return WEFT_ERR_NOMEM;
  WEFT_ALGO_STATE(coll, hdev_state)->ctl = ctl;
  coll->algo = "hier, cuda ipc and the device channel";
  coll->cleanup = hdev_cleanup;
  coll->advance = advance;
  return WEFT_OK;
}

weft_status weft_hier_device_broadcast_start(weft_coll *coll) {
  return hdev_start(coll, hdev_bcast_advance);
}

weft_status weft_hier_device_allreduce_start(weft_coll *coll) {
  return hdev_start(coll, hdev_advance);
}
