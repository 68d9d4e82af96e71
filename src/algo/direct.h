/* direct.h - the direct algorithm's rounds (direct_allreduce.c) for other
 * collectives: what a collective reads of its peers' buffers and the work it
 * queues on them (direct_device.c). Private to src/algo. */
#ifndef WEFT_ALGO_DIRECT_H
#define WEFT_ALGO_DIRECT_H

#include "src/algo/algo.h"

/* One collective's direct form on device buffers. Every member describes
 * its sendbuf (where it has one) in the first round; each maps of every
 * peer only what it reads, so a member never writes a peer's buffer and the
 * rounds' "done" means "I have finished reading yours". */
typedef struct weft_direct_plan {
  const char *algo; /* for messages and logs */
  /* the bytes of `member`'s sendbuf (0: it has none), alike on every rank */
  size_t (*input_bytes)(const weft_coll *coll, int member);
  /* whether this rank reads `member`'s sendbuf (member != coll->rank) */
  bool (*reads)(const weft_coll *coll, int member);
  /* queues this rank's copies and kernels on coll->stream: ins[p] is member
   * p's sendbuf as mapped here (NULL where not read), coll->recvbuf this
   * rank's output, coll->device_scratch the caller's (as much as the
   * collective's setup asked for); *last is the token of the last work
   * queued (0: none) */
  weft_status (*work)(weft_coll *coll, char *const *ins, uint64_t *last);
  /* whether this rank's work sums through coll->device_scratch (asked of
   * the caller first: WEFT_ALGO_NEED_SCRATCH); NULL: it only copies */
  bool (*sums)(const weft_coll *coll);
} weft_direct_plan;

/* Starts the rounds for `plan` on device buffers (coll->mem the device
 * table, coll->stream and coll->ready set by the caller). */
weft_status weft_direct_plan_start(weft_coll *coll, const weft_direct_plan *plan);

#endif
