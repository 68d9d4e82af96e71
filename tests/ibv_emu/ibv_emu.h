/* ibv_emu.h - what the in-tree verbs emulator (libweft_ibv_emu.so, tests
 * only) reports about this process, for tests that check flow control and
 * measure the transport's own cost. Look it up with dlsym("ibv_emu_stats")
 * in the library WEFT_IB_LIBRARY names.
 *
 * GPUDirect RDMA (ibv_reg_dmabuf_mr): the emulator keeps the rule real
 * hardware has, that what the NIC writes into GPU memory is not guaranteed
 * visible to the GPU until a flush. An RDMA write or a send that lands in a
 * dma-buf MR goes to a pending buffer of that MR, not into the dma-buf's
 * memory; an RDMA READ whose target (rkey) is that MR first applies all of
 * its pending bytes (the flush NCCL posts on a loopback QP), as does any
 * other use of the MR by the NIC (source of a write, destination of a read)
 * and its deregistration. Bytes may become visible early (a full list of
 * pending ranges applies its oldest), never stay stale after a flush. With
 * IBV_EMU_CONFIG=no_dmabuf, ibv_reg_dmabuf_mr fails with EOPNOTSUPP. */
#ifndef WEFT_IBV_EMU_H
#define WEFT_IBV_EMU_H

#include <stdint.h>

typedef struct ibv_emu_stats {
  uint64_t send_wrs;          /* work requests executed by this process's queue pairs */
  uint64_t rnr_naks;          /* writes that found no posted receive (receiver not ready) */
  uint64_t recv_landed;       /* writes with immediate that landed in this process */
  uint32_t max_rq_deficit;    /* most receives of one QP consumed and not yet re-posted */
  uint64_t emu_ns;            /* time spent inside the emulator's data-path calls */
  uint64_t data_calls;        /* post_send + post_recv + poll_cq calls */
  uint64_t mrs_live;          /* this process's MRs registered and not deregistered, all kinds */
  uint64_t dmabuf_mrs_live;   /* of which dma-buf MRs */
  uint64_t dmabuf_registered; /* dma-buf MRs ever registered by this process */
  uint64_t flushes;           /* RDMA reads this process executed that applied pending bytes */
  uint64_t pending_applied_bytes; /* pending bytes this process made visible, for any reason */
} ibv_emu_counters;

typedef void (*ibv_emu_stats_fn)(ibv_emu_counters *out);

#endif
