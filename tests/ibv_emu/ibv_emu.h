/* ibv_emu.h - what the in-tree verbs emulator (libweft_ibv_emu.so, tests
 * only) reports about this process, for tests that check flow control and
 * measure the transport's own cost. Look it up with dlsym("ibv_emu_stats")
 * in the library WEFT_IB_LIBRARY names. */
#ifndef WEFT_IBV_EMU_H
#define WEFT_IBV_EMU_H

#include <stdint.h>

typedef struct ibv_emu_stats {
  uint64_t send_wrs;       /* work requests executed by this process's queue pairs */
  uint64_t rnr_naks;       /* writes that found no posted receive (receiver not ready) */
  uint64_t recv_landed;    /* writes with immediate that landed in this process */
  uint32_t max_rq_deficit; /* most receives of one QP consumed and not yet re-posted */
  uint64_t emu_ns;         /* time spent inside the emulator's data-path calls */
  uint64_t data_calls;     /* post_send + post_recv + poll_cq calls */
} ibv_emu_counters;

typedef void (*ibv_emu_stats_fn)(ibv_emu_counters *out);

#endif
