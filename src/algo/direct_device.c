/* direct_device.c - broadcast, reduce, allgather, reduce-scatter, gather,
 * scatter and alltoall on device buffers of ranks on one host, over CUDA IPC
 * (issue 37): the direct allreduce's rounds (direct_allreduce.c: the
 * messages, the verdict, the done round, the fall-back), with this file's
 * plans saying what each rank reads.
 *
 * Every rank pulls: it maps the peers' sendbufs it needs and queues copies
 * (and for the reductions, kernels) into its own recvbuf on its own stream.
 * Nobody writes a peer's memory, so the only order to keep is "a sendbuf is
 * read only while its owner is in the call": the first round is sent once
 * the owner's earlier work on it is done, and the done round holds every
 * rank until all have finished reading. Pulling also spreads the work: each
 * GPU's copy engine fetches its own data at once, where a root pushing to
 * every peer would queue all copies on one stream.
 *
 * In place is safe for each: no rank writes what another reads (a rank's
 * writes go to its own recvbuf, and where that overlaps its sendbuf, only to
 * the part it alone reads). The reductions sum in a fixed member order, as
 * the host forms do, into device scratch, then copy into recvbuf: every
 * member's input is read in full before the result lands on any of it. */
#include "src/algo/direct.h"

/* ---- what each member's sendbuf holds ---------------------------------------- */

static size_t one_block(const weft_coll *coll, int member) {
  (void)member;
  return coll->count * coll->elem;
}
static size_t all_blocks(const weft_coll *coll, int member) {
  (void)member;
  return (size_t)coll->size * coll->count * coll->elem;
}
static size_t root_one_block(const weft_coll *coll, int member) {
  return member == coll->root ? coll->count * coll->elem : 0;
}
static size_t root_all_blocks(const weft_coll *coll, int member) {
  return member == coll->root ? (size_t)coll->size * coll->count * coll->elem : 0;
}

/* ---- whom each rank reads -------------------------------------------------------- */

static bool reads_root(const weft_coll *coll, int member) {
  return member == coll->root;
}
static bool root_reads_all(const weft_coll *coll, int member) {
  (void)member;
  return coll->rank == coll->root;
}
static bool reads_all(const weft_coll *coll, int member) {
  (void)coll, (void)member;
  return true;
}

/* ---- the work ---------------------------------------------------------------------- */

/* dst <- src unless they are the same bytes (in place) */
static weft_status copy(weft_coll *coll, void *dst, const void *src, size_t bytes, uint64_t *last) {
  if (dst == src || !bytes) return WEFT_OK;
  return coll->mem->copy_async(dst, src, bytes, coll->stream, last);
}

/* recvbuf <- the reduction of every member's block at `at` bytes, in member
 * order, through scratch */
static weft_status reduce_all(weft_coll *coll, char *const *ins, size_t at, uint64_t *last) {
  size_t cnt = coll->count;
  int n = coll->size;
  void *acc = coll->device_scratch;
  if (!acc) return WEFT_ERR_INTERNAL;
  WEFT_CHECK(coll->mem->reduce_async(acc, ins[0] + at, ins[1] + at, cnt, coll->dtype, coll->op,
                                     n == 2 ? coll->avg_div : 1, coll->stream, last));
  for (int p = 2; p < n; p++)
    WEFT_CHECK(coll->mem->reduce_async(acc, acc, ins[p] + at, cnt, coll->dtype, coll->op,
                                       p == n - 1 ? coll->avg_div : 1, coll->stream, last));
  return coll->mem->copy_async(coll->recvbuf, acc, cnt * coll->elem, coll->stream, last);
}

static weft_status broadcast_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  return copy(coll, coll->recvbuf, ins[coll->root], coll->count * coll->elem, last);
}

static weft_status reduce_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  if (coll->rank != coll->root) return WEFT_OK; /* the root reads its input */
  return reduce_all(coll, ins, 0, last);
}

static weft_status reduce_scatter_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  return reduce_all(coll, ins, (size_t)coll->rank * coll->count * coll->elem, last);
}

/* recvbuf's block p <- member p's block `from` (0: its whole sendbuf of one block) */
static weft_status gather_blocks(weft_coll *coll, char *const *ins, bool pick_mine,
                                 uint64_t *last) {
  size_t b = coll->count * coll->elem;
  size_t from = pick_mine ? (size_t)coll->rank * b : 0;
  for (int p = 0; p < coll->size; p++)
    WEFT_CHECK(copy(coll, (char *)coll->recvbuf + (size_t)p * b, ins[p] + from, b, last));
  return WEFT_OK;
}

static weft_status allgather_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  return gather_blocks(coll, ins, false, last);
}

static weft_status gather_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  if (coll->rank != coll->root) return WEFT_OK;
  return gather_blocks(coll, ins, false, last);
}

static weft_status alltoall_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  return gather_blocks(coll, ins, true, last);
}

static weft_status scatter_work(weft_coll *coll, char *const *ins, uint64_t *last) {
  size_t b = coll->count * coll->elem;
  return copy(coll, coll->recvbuf, ins[coll->root] + (size_t)coll->rank * b, b, last);
}

/* ---- the plans ------------------------------------------------------------------------ */

/* the root sums every member's block; the others send only */
static bool root_sums(const weft_coll *coll) {
  return coll->rank == coll->root && coll->count;
}
static bool every_rank_sums(const weft_coll *coll) {
  return coll->count != 0;
}

static const weft_direct_plan broadcast_plan = {
    "direct, cuda ipc", root_one_block, reads_root, broadcast_work, NULL};
static const weft_direct_plan reduce_plan = {
    "direct, cuda ipc", one_block, root_reads_all, reduce_work, root_sums};
static const weft_direct_plan allgather_plan = {
    "direct, cuda ipc", one_block, reads_all, allgather_work, NULL};
static const weft_direct_plan reduce_scatter_plan = {
    "direct, cuda ipc", all_blocks, reads_all, reduce_scatter_work, every_rank_sums};
static const weft_direct_plan gather_plan = {
    "direct, cuda ipc", one_block, root_reads_all, gather_work, NULL};
static const weft_direct_plan scatter_plan = {
    "direct, cuda ipc", root_all_blocks, reads_root, scatter_work, NULL};
static const weft_direct_plan alltoall_plan = {
    "direct, cuda ipc", all_blocks, reads_all, alltoall_work, NULL};

weft_status weft_direct_broadcast_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &broadcast_plan);
}
weft_status weft_direct_reduce_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &reduce_plan);
}
weft_status weft_direct_allgather_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &allgather_plan);
}
weft_status weft_direct_reduce_scatter_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &reduce_scatter_plan);
}
weft_status weft_direct_gather_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &gather_plan);
}
weft_status weft_direct_scatter_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &scatter_plan);
}
weft_status weft_direct_alltoall_start(weft_coll *coll) {
  return weft_direct_plan_start(coll, &alltoall_plan);
}
