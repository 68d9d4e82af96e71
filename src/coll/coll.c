/* coll.c - setting up one collective call: argument checks with a sentence
 * for every refusal, the sequence number, the algorithm's start (choose.c
 * picks it), WEFT_CHECK's fingerprints in front of it, and what the engine
 * asks of a running call (flush, end, the sentence for a failure). */
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/coll/coll.h"

#include "src/algo/algo.h"
#include "src/coll/choose.h"
#include "src/coll/coll_device.h"
#include "src/coll/core.h"
#include "src/link/comm_link.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "src/mem/reduce.h"

/* The call an algorithm's weft_coll belongs to (coll.h): coll.c's own
 * advance functions get the algorithm's view and reach the rest here. */
#define TASK(coll) weft_coll_task_of(coll)

/* ---- errors ------------------------------------------------------------- */

/* What each call takes, for its checks and its messages. */
typedef struct coll_kind {
  const char *call;
  const char *count_name; /* "count", "sendcount", "recvcount"; NULL: none (barrier) */
  bool has_op, has_root;
  bool blocks; /* the buffers hold one block per rank */
} coll_kind;

/* Indexes in coll_kinds: each setup names its own, so no call pays for a
 * string lookup (weft_coll.kind). */
enum coll_kind_id {
  KIND_BARRIER,
  KIND_ALLREDUCE,
  KIND_BROADCAST,
  KIND_REDUCE,
  KIND_ALLGATHER,
  KIND_REDUCE_SCATTER,
  KIND_GATHER,
  KIND_SCATTER,
  KIND_ALLTOALL,
};
/* coll_sign names a call's kind in its signature by this order */
_Static_assert(WEFT_SIG_BARRIER + KIND_ALLREDUCE == WEFT_SIG_ALLREDUCE &&
                   WEFT_SIG_BARRIER + KIND_BROADCAST == WEFT_SIG_BROADCAST &&
                   WEFT_SIG_BARRIER + KIND_REDUCE == WEFT_SIG_REDUCE &&
                   WEFT_SIG_BARRIER + KIND_ALLGATHER == WEFT_SIG_ALLGATHER &&
                   WEFT_SIG_BARRIER + KIND_REDUCE_SCATTER == WEFT_SIG_REDUCE_SCATTER &&
                   WEFT_SIG_BARRIER + KIND_GATHER == WEFT_SIG_GATHER &&
                   WEFT_SIG_BARRIER + KIND_SCATTER == WEFT_SIG_SCATTER &&
                   WEFT_SIG_BARRIER + KIND_ALLTOALL == WEFT_SIG_ALLTOALL,
               "the call kinds in the order of call_tag.h's");

static const coll_kind coll_kinds[] = {
    {"weft_barrier", NULL, false, false, false},
    {"weft_allreduce", "count", true, false, false},
    {"weft_broadcast", "count", false, true, false},
    {"weft_reduce", "count", true, true, false},
    {"weft_allgather", "sendcount", false, false, true},
    {"weft_reduce_scatter", "recvcount", true, false, true},
    {"weft_gather", "sendcount", false, true, true},
    {"weft_scatter", "recvcount", false, true, true},
    {"weft_alltoall", "count", false, false, true},
};

/* The rules of the call `coll` belongs to; the non-blocking form "weft_iNAME"
 * has those of "weft_NAME". */
static const coll_kind *coll_kind_of(const weft_coll *coll) {
  return &coll_kinds[TASK(coll)->kind < sizeof coll_kinds / sizeof coll_kinds[0] ? TASK(coll)->kind
                                                                                 : 0];
}

static weft_dtype coll_user_dtype(const weft_coll *coll);

/* "weft_reduce(count=4, f32, sum, root=1) call #7": what the user called. */
static void coll_describe(const weft_coll *coll, char *buf, size_t len) {
  const coll_kind *k = coll_kind_of(coll);
  char op[48] = "", root[32] = "";
  if (!k->count_name) {
    snprintf(buf, len, "%s() call #%u", coll->call, coll->seq);
    return;
  }
  if (k->has_op)
    snprintf(op, sizeof op, ", %s%s%s", weft_op_name(coll->op), weft_wire_on(coll) ? ", wire " : "",
             weft_wire_on(coll) ? weft_dtype_name(coll->wire) : "");
  if (k->has_root) snprintf(root, sizeof root, ", root=%d", coll->root);
  snprintf(buf, len, "%s(%s=%zu, %s%s%s) call #%u", coll->call, k->count_name, coll->count,
           weft_dtype_name(coll_user_dtype(coll)), op, root, coll->seq);
}

/* Makes the failure sticky, tells the peers, and writes the user's sentence. */
static weft_status coll_fail(weft_coll *coll, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static weft_status coll_fail(weft_coll *coll, weft_status st, const char *fmt, ...) {
  weft_core *comm = TASK(coll)->comm;
  char what[384], desc[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  st = weft_status_revoked_or(st, what);
  coll_describe(coll, desc, sizeof desc);
  weft_core_error(comm, st, desc, "%s", what);
  comm->fail.failed = st;
  if (TASK(coll)->quiet_failure) return st; /* every rank saw it itself */
  char reason[600];
  if (comm->links.sink.origin[0])
    snprintf(reason, sizeof reason, "%s", comm->links.sink.origin);
  else
    snprintf(reason, sizeof reason, "rank %d failed in %s: %s", comm->rank, desc, what);
  weft_peer_table_abort_all(&comm->links, reason);
  return st;
}

/* ---- what call setup keeps besides the algorithm's scratch --------------- */

struct coll_check;

/* Held in weft_coll.check (NULL when a call needs neither): WEFT_CHECK's
 * fingerprint phase, and the 64-bit buffer of an integer avg (avg_widen). */
typedef struct coll_extra {
  struct coll_check *check; /* NULL when off or passed */
  /* integer avg: the call runs as an i64 avg on `wide`, and the result is
   * narrowed into the user's buffer when the algorithm is done */
  bool widened, ran, narrowed;
  weft_dtype user_dtype;
  const void *user_send;
  void *user_recv; /* NULL: no result on this rank (weft_reduce off the root) */
  int64_t *wide;   /* wide_elems of them, from the call's memory table */
  size_t wide_elems;
  size_t result_at; /* the result's first element in wide */
  size_t result_elems;
  weft_status (*then)(weft_coll *coll); /* the algorithm, started after the widening */
} coll_extra;

static coll_extra *coll_extra_get(weft_coll *coll) {
  if (!TASK(coll)->check) TASK(coll)->check = calloc(1, sizeof(coll_extra));
  return TASK(coll)->check;
}

/* The dtype the user passed: an integer avg runs in i64 (avg_widen), but its
 * sentences and its fingerprint name what the user called. */
static weft_dtype coll_user_dtype(const weft_coll *coll) {
  const coll_extra *x = TASK(coll)->check;
  return x && x->widened ? x->user_dtype : coll->dtype;
}

/* The call's signature (call_tag.h), carried with its number in every chunk:
 * what every rank must agree on that no byte count shows. A gradient set's
 * bucket carries its step where an allreduce has no root. */
static void coll_sign(weft_coll *coll) {
  const coll_kind *k = coll_kind_of(coll);
  uint64_t step = TASK(coll)->step_plus1;
  bool bucket = step && TASK(coll)->kind == KIND_ALLREDUCE;
  weft_call_sig s = {.kind = bucket ? WEFT_SIG_GRAD_BUCKET
                                    : (enum weft_sig_kind)(WEFT_SIG_BARRIER + TASK(coll)->kind),
                     .dtype = k->count_name ? (int)coll_user_dtype(coll) : -1,
                     .op = k->has_op ? (int)coll->op : -1,
                     .wire = weft_wire_on(coll) ? (int)coll->wire : -1,
                     .root = bucket ? (uint32_t)(step - 1) : k->has_root ? (uint32_t)coll->root : 0,
                     .in_place_device = TASK(coll)->route == WEFT_ROUTE_IN_PLACE};
  coll->sig = weft_sig_pack(s);
}

/* An integer avg summed in i64 is exact for i8, u8 and i32 over any
 * number of ranks (2^31 ranks of 2^31 fit in 2^62), and the mean of values
 * in the dtype's range is in that range: narrowing it back never wraps. */
static bool avg_is_widened(weft_dtype dtype, weft_op op) {
  return op == WEFT_AVG && (dtype == WEFT_I8 || dtype == WEFT_U8 || dtype == WEFT_I32);
}

/* Makes the call an i64 avg over a buffer of `elems` (the user's sendbuf,
 * widened when the call starts), whose elements [result_at, +result_elems)
 * are the result for the user's recvbuf (NULL: none on this rank). The
 * algorithm runs in place on it; avg_narrow copies the result back. */
static weft_status avg_widen(weft_coll *coll, size_t elems, size_t result_at, size_t result_elems,
                             bool gets_result) {
  coll_extra *x = coll_extra_get(coll);
  int64_t *wide = x && elems <= SIZE_MAX / 2 / sizeof(int64_t)
                      ? coll->mem->alloc_scratch(elems * sizeof(int64_t))
                      : NULL;
  if (!wide) {
    weft_coll_release(TASK(coll));
    return coll_fail(coll, WEFT_ERR_NOMEM,
                     "no memory for the 64-bit sums of an integer avg (%zu elements of 8 bytes)",
                     elems);
  }
  *x = (coll_extra){.widened = true,
                    .user_dtype = coll->dtype,
                    .user_send = coll->sendbuf,
                    .user_recv = gets_result ? coll->recvbuf : NULL,
                    .wide = wide,
                    .wide_elems = elems,
                    .result_at = result_at,
                    .result_elems = result_elems};
  coll->dtype = WEFT_I64;
  coll->elem = sizeof(int64_t);
  coll->sendbuf = wide;
  coll->recvbuf = gets_result ? wide + result_at : NULL;
  return WEFT_OK;
}

/* The call's first step: the user's data into the wide buffer now, not at
 * issue, as the algorithm would read it (an earlier call may still be
 * writing it), then the algorithm. */
static weft_status avg_widen_first(weft_coll *coll) {
  coll_extra *x = TASK(coll)->check;
  weft_widen_i64(x->wide, x->user_send, x->wide_elems, x->user_dtype);
  x->ran = true;
  coll->advance = x->then;
  return coll->advance(coll);
}

/* Once the algorithm is done: the mean, truncated toward zero, into the
 * user's recvbuf. */
static void avg_narrow(weft_coll *coll) {
  coll_extra *x = TASK(coll)->check;
  if (!x->widened || !x->ran || x->narrowed) return;
  x->narrowed = true;
  if (x->user_recv)
    weft_narrow_i64(x->user_recv, x->wide + x->result_at, x->result_elems, x->user_dtype);
}

/* ---- what the engine asks of a collective ------------------------------- */

weft_status weft_coll_flush(weft_coll_task *task) {
  weft_coll *coll = &task->coll;
  weft_core *comm = TASK(coll)->comm;
  if (TASK(coll)->check) avg_narrow(coll); /* the engine flushes once the algorithm is done */
  for (int i = 0; i < comm->links.nactive; i++) {
    int peer = comm->links.active[i];
    if (comm->links.peers[peer].last_send_seq != coll->seq) continue;
    /* the caller may reuse its buffer once the call completes: every chunk must be out */
    weft_status st = weft_link_send_idle(coll, peer);
    if (st != WEFT_OK) return st;
  }
  return weft_coll_stage_out(task); /* device buffers: the result back to the user's */
}

/* What the call found out, kept for later calls to choose by (algo.h,
 * weft_algo_outcome): algorithms report, the communicator remembers. */
void weft_coll_end(weft_coll_task *task) {
  weft_coll *coll = &task->coll;
  weft_core *comm = TASK(coll)->comm;
  weft_choice_keep(&comm->choice, coll);
  for (int i = 0; i < comm->links.nactive; i++)
    comm->links.peers[comm->links.active[i]].is_active = false;
  comm->links.nactive = 0;
}

/* The sentence for a failure the engine saw while driving this collective. */
weft_status weft_coll_failed(weft_coll_task *task, weft_status st) {
  weft_coll *coll = &task->coll;
  weft_core *comm = TASK(coll)->comm;
  int peer = TASK(coll)->waiting_peer;
  switch (st) {
    case WEFT_ERR_ABORTED:
      comm->links.sink.origin[0] = 0;
      weft_recorder_update(&comm->recorder, task, WEFT_REC_FAILED, st, 0);
      weft_recorder_dump(&comm->recorder, comm->rank, comm->size, "aborted");
      return coll_fail(coll, st, "weft_comm_abort was called");
    case WEFT_ERR_REVOKED: /* this rank revoked it: its peers hear these words */
      comm->links.sink.origin[0] = 0;
      weft_recorder_update(&comm->recorder, task, WEFT_REC_FAILED, st, 0);
      return coll_fail(coll, st, "rank %d %s", comm->rank, WEFT_REVOKED_WORDS);
    case WEFT_ERR_TIMEOUT:
      comm->links.sink.origin[0] = 0;
      weft_recorder_update(&comm->recorder, task, WEFT_REC_FAILED, st, 0);
      weft_recorder_dump(&comm->recorder, comm->rank, comm->size, "timeout");
      return coll_fail(coll, st,
                       "no progress for %.1f s while waiting for %s peer %d (%s algorithm); is "
                       "peer %d alive and in the same call?",
                       comm->fail.timeout_s, TASK(coll)->waiting_for ? TASK(coll)->waiting_for : "",
                       peer, coll->algo, peer);
    default:
      if (comm->fail.failed) return comm->fail.failed; /* the algorithm worded it (coll_fail) */
      if (comm->links.sink.origin[0]) return coll_fail(coll, st, "%s", comm->links.sink.msg);
      if (coll->fail_peer >= 0)
        return coll_fail(coll, st, "peer %d: %s", coll->fail_peer, comm->links.sink.msg);
      return coll_fail(coll, st, "%s", comm->links.sink.msg);
  }
}

weft_status weft_coll_timed_out(weft_coll_task *task, weft_status st, const char *verdict) {
  weft_coll *coll = &task->coll;
  weft_core *comm = TASK(coll)->comm;
  int peer = TASK(coll)->waiting_peer;
  comm->links.sink.origin[0] = 0; /* this rank's own words: every rank reached the same */
  weft_recorder_update(&comm->recorder, task, WEFT_REC_FAILED, st, 0);
  weft_recorder_dump(&comm->recorder, comm->rank, comm->size, "timeout");
  return coll_fail(coll, st,
                   "no progress for %.1f s while waiting for %s peer %d (%s algorithm); %s",
                   comm->fail.timeout_s, TASK(coll)->waiting_for ? TASK(coll)->waiting_for : "",
                   peer, coll->algo, verdict);
}

/* ---- WEFT_CHECK: fingerprints before every collective ----------------------- */

/* What every rank must agree on. Fields a call does not use are zero. */
typedef struct coll_print {
  uint32_t seq;
  int32_t kind; /* index in coll_kinds */
  int32_t dtype, op, root;
  int32_t wire; /* the wire dtype when on (algo.h), else 0 */
  uint64_t count;
} coll_print;

/* The fingerprint phase: a ring allgather of every rank's print, then the
 * algorithm itself. Every rank makes the same exchange whatever its
 * arguments, so a disagreement is seen by all and never leaves one waiting. */
typedef struct coll_check {
  weft_coll inner;
  coll_print mine;
  weft_status (*then)(weft_coll *coll);
  coll_print prints[];
} coll_check;

static coll_print print_of(const weft_coll *coll) {
  const coll_kind *k = coll_kind_of(coll);
  return (coll_print){.seq = coll->seq,
                      .kind = (int32_t)(k - coll_kinds),
                      .dtype = k->count_name ? (int32_t)coll_user_dtype(coll) : 0,
                      .op = k->has_op ? (int32_t)coll->op : 0,
                      .root = k->has_root ? coll->root : 0,
                      .wire = weft_wire_on(coll) ? (int32_t)coll->wire : 0,
                      .count = k->count_name ? coll->count : 0};
}

static void print_describe(const coll_print *p, char *buf, size_t len) {
  const coll_kind *k =
      &coll_kinds[p->kind >= 0 && (size_t)p->kind < sizeof coll_kinds / sizeof coll_kinds[0]
                      ? p->kind
                      : 0];
  char op[48] = "", root[32] = "";
  if (k->has_op)
    snprintf(op, sizeof op, ", %s%s%s", weft_op_name((weft_op)p->op), p->wire ? ", wire " : "",
             p->wire ? weft_dtype_name((weft_dtype)p->wire) : "");
  if (k->has_root) snprintf(root, sizeof root, ", root=%d", p->root);
  if (!k->count_name)
    snprintf(buf, len, "%s()", k->call);
  else
    snprintf(buf, len, "%s(%s=%llu, %s%s%s)", k->call, k->count_name, (unsigned long long)p->count,
             weft_dtype_name((weft_dtype)p->dtype), op, root);
}

static void check_cleanup_free(weft_coll *coll);
void weft_coll_release(weft_coll_task *task) {
  weft_coll *coll = &task->coll;
  weft_coll_stage_release(task);
  if (coll->wire_stage) { /* after the flush: no send reads it any more */
    coll->mem->free_scratch(coll->wire_stage);
    coll->wire_stage = NULL;
  }
  coll_extra *x = TASK(coll)->check;
  if (!x) return;
  check_cleanup_free(coll);
  if (x->wide) coll->mem->free_scratch(x->wide);
  if (x->widened) { /* the call as the user made it again: no pointer into freed memory */
    coll->dtype = x->user_dtype;
    coll->elem = weft_dtype_size(x->user_dtype);
    coll->sendbuf = x->user_send;
    coll->recvbuf = x->user_recv;
  }
  free(x);
  TASK(coll)->check = NULL;
}

static void check_cleanup_free(weft_coll *coll) {
  coll_extra *x = TASK(coll)->check;
  coll_check *ck = x ? x->check : NULL;
  if (!ck) return;
  weft_coll_scratch_free(&ck->inner, ck->inner.scratch);
  free(ck);
  x->check = NULL;
}

static weft_status check_advance(weft_coll *coll) {
  coll_check *ck = ((coll_extra *)TASK(coll)->check)->check;
  WEFT_STEP(ck->inner.advance(&ck->inner));
  int n = TASK(coll)->comm->size;
  for (int r = 0; r < n; r++) {
    if (!memcmp(&ck->prints[r], &ck->prints[0], sizeof(coll_print))) continue;
    /* Every rank holds the same table and fails the same way by itself:
     * deliver our part first (a peer may still be reading it), and send
     * no failure notice that could overtake it. */
    WEFT_STEP(weft_coll_flush(TASK(coll)));
    TASK(coll)->quiet_failure = true;
    char a[160], b[160];
    print_describe(&ck->prints[0], a, sizeof a);
    print_describe(&ck->prints[r], b, sizeof b);
    TASK(coll)->comm->links.sink.origin[0] = 0;
    return coll_fail(coll, WEFT_ERR_MISMATCH,
                     "WEFT_CHECK: ranks disagree on call #%u: rank 0 called %s, rank %d called %s",
                     coll->seq, a, r, b);
  }
  coll->advance = ck->then;
  check_cleanup_free(coll);
  return coll->advance(coll);
}

/* Puts the fingerprint phase in front of the algorithm `coll` was started with. */
static weft_status check_start(weft_coll *coll) {
  int n = TASK(coll)->comm->size;
  coll_extra *x = coll_extra_get(coll);
  coll_check *ck = x ? calloc(1, sizeof *ck + sizeof(coll_print) * (size_t)n) : NULL;
  if (!ck) {
    weft_coll_release(TASK(coll));
    return coll_fail(coll, WEFT_ERR_NOMEM, "no memory for the WEFT_CHECK fingerprints");
  }
  ck->mine = print_of(coll);
  ck->then = coll->advance;
  ck->inner = (weft_coll){.link = coll->link,
                          .chunk_bytes = coll->chunk_bytes,
                          .call = coll->call,
                          .rank = coll->rank,
                          .size = coll->size,
                          .avg_div = 1,
                          .sendbuf = &ck->mine,
                          .recvbuf = ck->prints,
                          .count = sizeof(coll_print),
                          .dtype = WEFT_U8,
                          .elem = 1,
                          .mem = &weft_mem_host,
                          .seq = coll->seq,
                          .sig = weft_sig_pack((weft_call_sig){.kind = WEFT_SIG_CHECK,
                                                               .dtype = -1,
                                                               .op = -1,
                                                               .wire = -1}),
                          .fail_peer = -1};
  x->check = ck;
  weft_status st = weft_ring_allgather_start(&ck->inner);
  if (st < 0) {
    weft_coll_release(TASK(coll));
    return coll_fail(coll, st, "could not start the WEFT_CHECK exchange");
  }
  coll->advance = check_advance;
  return WEFT_OK;
}

/* What the algorithm's start function said. A start that failed fails the
 * call and tells the peers, which would otherwise wait for this rank until
 * their timeout. */
static weft_status coll_start_failed(weft_coll *coll, weft_status started) {
  weft_coll_scratch_release(coll);
  weft_coll_release(TASK(coll));
  return coll_fail(coll, started, "could not start the algorithm: %s", weft_strerror(started));
}

static weft_status coll_start(weft_coll *coll, weft_status started) {
  if (started < 0) return coll_start_failed(coll, started);
  WEFT_TRACE(WEFT_SUBSYS_COLL, "%s #%u: %zu bytes (per block), %s algorithm", coll->call, coll->seq,
             coll->count * coll->elem, coll->algo);
  /* the recorder names what the user called: a widened avg's dtype too */
  weft_dtype runs_as = coll->dtype;
  coll->dtype = coll_user_dtype(coll);
  weft_recorder_issue(&TASK(coll)->comm->recorder, TASK(coll)); /* the engine adds the time */
  coll->dtype = runs_as;
  coll_extra *x = TASK(coll)->check;
  if (x && x->widened) {
    x->then = coll->advance;
    coll->advance = avg_widen_first;
  }
  weft_status st = TASK(coll)->comm->check_calls ? check_start(coll) : WEFT_OK;
  if (st == WEFT_OK) weft_coll_stage_wrap(TASK(coll)); /* device buffers: their copy comes first */
  return st;
}

/* ---- entry points --------------------------------------------------------- */

/* A staged call (device buffers) that completed in its setup copies its
 * result back before it returns; one that failed gives its staging back. */
static weft_status coll_setup_ended(weft_coll_task *task, weft_status st) {
  if (!task->staged) return st;
  if (st == WEFT_COLL_DONE) {
    weft_status out = weft_coll_stage_out_now(task);
    weft_coll_stage_release(task);
    return out ? out : st;
  }
  if (st < 0) weft_coll_stage_release(task);
  return st;
}

/* Common checks of a live communicator's call; fills coll. Returns an error
 * with the message set. */
static weft_status coll_begin(weft_core *comm, weft_coll_task *task, const char *call,
                              enum coll_kind_id kind, const void *sendbuf, void *recvbuf,
                              size_t count, weft_dtype dtype, weft_op op, int root) {
  *task = (weft_coll_task){.coll = {.call = call,
                                    .sendbuf = sendbuf,
                                    .recvbuf = recvbuf,
                                    .count = count,
                                    .dtype = dtype,
                                    .op = op,
                                    .root = root,
                                    .fail_peer = -1},
                           .comm = comm,
                           .kind = (uint8_t)kind,
                           .allreduce = kind == KIND_ALLREDUCE,
                           .broadcast = kind == KIND_BROADCAST,
                           .waiting_peer = -1,
                           .wire_dtype = -1,
                           .user_stream = comm->user_stream};
  weft_coll *coll = &task->coll;
  /* the public entry point checked that the handle is live (src/api) */
  coll->rank = comm->rank;
  coll->link = weft_call_links_init((weft_call_links *)(void *)task->link_ctx, &comm->links,
                                    &task->waiting_peer, &coll->fail_peer, &task->waiting_for);
  coll->chunk_bytes = comm->chunk_bytes;
  coll->size = coll->avg_div = comm->size;
  int stopped = atomic_load(&comm->fail.aborted);
  if (stopped && !comm->fail.failed)
    return weft_core_error(comm, weft_fail_stopped(stopped), call, "%s",
                           weft_fail_stopped_words(stopped));
  if (comm->fail.failed) return comm->fail.failed; /* last_error keeps the first cause */
  const coll_kind *k = coll_kind_of(coll);
  if (k->has_root && (root < 0 || root >= comm->size))
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "root %d is out of range (size %d)", root,
                           comm->size);
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "unknown dtype %d", (int)dtype);
  if (k->has_op && (unsigned)op >= WEFT_OP_COUNT)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "unknown op %d", (int)op);
  coll->elem = weft_dtype_size(dtype);
  size_t blocks = k->blocks ? (size_t)comm->size : 1;
  if (count > SIZE_MAX / 2 / coll->elem / blocks)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "%s %zu is too large%s",
                           k->count_name ? k->count_name : "count", count,
                           k->blocks ? " (one block per rank overflows the address space)" : "");
  return WEFT_OK;
}

#define SAME_POINTER "in place needs the same pointer"

static weft_status check_buffers(weft_coll *coll, weft_coll_span sp) {
  weft_core *comm = TASK(coll)->comm;
  TASK(coll)->span = sp;
  const char *call = coll->call, *what = coll_kind_of(coll)->count_name;
  if (coll->count == 0) return WEFT_OK;
  if (sp.send_elems && !coll->sendbuf)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "sendbuf is NULL but %s is %zu", what,
                           coll->count);
  if (sp.recv_elems && !coll->recvbuf)
    return weft_core_error(comm, WEFT_ERR_INVALID, call, "recvbuf is NULL but %s is %zu", what,
                           coll->count);
  if (!sp.send_elems || !sp.recv_elems) return WEFT_OK;
  uintptr_t s = (uintptr_t)coll->sendbuf, r = (uintptr_t)coll->recvbuf;
  bool overlap = s < r + sp.recv_elems * coll->elem && r < s + sp.send_elems * coll->elem;
  bool in_place = sp.in_place_rule && s + sp.send_at * coll->elem == r + sp.recv_at * coll->elem;
  if (overlap && !in_place)
    return weft_core_error(comm, WEFT_ERR_INVALID, call,
                           "sendbuf and recvbuf overlap without being in place (%s)",
                           sp.in_place_rule ? sp.in_place_rule : "this call never runs in place");
  return WEFT_OK;
}

/* Every rank takes the next sequence number for every call that passed its
 * checks, before any early return (count 0, one rank): chunks carry it, so a
 * rank that skipped or added a call is caught by the next chunk it moves. */
static weft_status coll_take_seq(weft_coll *coll) {
  weft_coll_task *task = TASK(coll);
  coll->mem = &weft_mem_host;
  /* device buffers: the algorithm runs on pinned host copies (coll_device.h);
   * one rank completes in its setup, so it waits for its copy here. Before
   * the number: buffers of two kinds are refused like any bad argument. */
  WEFT_CHECK(weft_coll_stage_in(task, &task->span, task->comm->size == 1));
  coll->seq = ++task->comm->seq;
  coll_sign(coll);
  return WEFT_OK;
}

/* A call of count 0 moves no data, so without WEFT_CHECK it ends here on
 * every rank (weft.h says what a rank that disagrees on the count meets).
 * With WEFT_CHECK it still compares its fingerprint with every rank's: a
 * count 0 where the others pass 10 is a mismatch like any other. */
static weft_status coll_empty(weft_coll *coll) {
  if (!TASK(coll)->comm->check_calls || TASK(coll)->comm->size == 1) return WEFT_COLL_DONE;
  coll->algo = "none (count 0)";
  coll->advance = weft_step_nothing;
  return coll_start(coll, WEFT_OK);
}

/* An f32 sum or avg that crosses hosts travels as the communicator's wire
 * dtype (weft_comm_set_wire_dtype, WEFT_WIRE_DTYPE), with the stage the
 * steps narrow into (algo.h). Ignored for other dtypes and ops (their
 * results stay exact), and on one host, where a link is a memory copy and
 * half the bytes would buy nothing but the rounding (docs/tuning.md).
 * Every rank decides alike: the same call, the same hosts, the same
 * attribute (weft.h asks every rank to set it alike; WEFT_CHECK compares it). */
static weft_status coll_wire(weft_coll *coll) {
  weft_core *comm = TASK(coll)->comm;
  /* the call's own (a gradient set's option), else the communicator's */
  weft_dtype wire = TASK(coll)->wire_dtype >= 0 ? (weft_dtype)TASK(coll)->wire_dtype : comm->wire;
  if ((wire != WEFT_BF16 && wire != WEFT_F16) || coll->dtype != WEFT_F32 ||
      (coll->op != WEFT_SUM && coll->op != WEFT_AVG) || comm->hosts.nhosts < 2)
    return WEFT_OK;
  coll->wire = wire;
  coll_sign(coll); /* the wire dtype is part of it */
  size_t bytes = weft_wire_stage_bytes(coll);
  coll->wire_stage = coll->mem->alloc_scratch(bytes);
  if (coll->wire_stage) return WEFT_OK;
  return coll_fail(coll, WEFT_ERR_NOMEM, "no memory for the %s wire stage (%zu bytes)",
                   weft_dtype_name(coll->wire), bytes);
}

/* The own block's local copy for one rank; nothing when in place. */
static weft_status coll_copy_alone(weft_coll *coll) {
  if (coll->recvbuf != coll->sendbuf)
    coll->mem->copy(coll->recvbuf, coll->sendbuf, coll->count * coll->elem);
  return WEFT_COLL_DONE;
}

/* The direct rounds' answers (algo.h), acted on here so that no algorithm
 * calls up into its caller: device scratch taken right before their
 * kernels are queued, then on at the same point; a fall-back (some rank
 * cannot map a buffer: every rank answers so at the same round) runs the
 * collective's host algorithm in the same call, on staged copies where the
 * buffers are device memory. That host algorithm may be the direct one
 * again (staged copies in shared memory), guarded in turn, and falls back
 * to the ring. */
static weft_status direct_guard(weft_coll *coll) {
  weft_coll_task *task = TASK(coll);
  for (;;) {
    weft_status st = task->direct_advance(coll);
    if (st == WEFT_ALGO_NEED_SCRATCH) {
      WEFT_CHECK(weft_coll_device_scratch(task));
      continue;
    }
    if (st != WEFT_ALGO_FALL_BACK) return st;
    weft_status (*host)(weft_coll *) = task->direct_host_start;
    task->direct_host_start = NULL;
    task->direct_advance = NULL;
    if (task->route == WEFT_ROUTE_IN_PLACE) WEFT_CHECK(weft_coll_device_restage(task));
    WEFT_CHECK(host ? host(coll) : weft_ring_allreduce_start(coll));
    return coll->advance(coll);
  }
}

/* The direct rounds just started on `coll` run guarded from now on;
 * `host_start` is the collective's host algorithm (NULL: the ring allreduce). */
static void guard_direct(weft_coll *coll, weft_status (*host_start)(weft_coll *coll)) {
  TASK(coll)->direct_advance = coll->advance;
  TASK(coll)->direct_host_start = host_start;
  coll->advance = direct_guard;
}

/* What a choice of the allreduce's algorithm started: the direct rounds on
 * shared host buffers (or staged copies) run guarded, falling back to the ring. */
static weft_status guard_if_direct(weft_coll *coll, weft_status st) {
  if (st == WEFT_OK && weft_direct_running(coll)) guard_direct(coll, NULL);
  return st;
}

/* The call's algorithm, chosen now that it reaches the head of the queue
 * (choose.c says why then). */
static weft_status allreduce_start_late(weft_coll *coll) {
  weft_status st = guard_if_direct(
      coll, weft_choose_late(&TASK(coll)->comm->choice, coll, TASK(coll)->kind != KIND_ALLREDUCE));
  if (st < 0) return coll_start_failed(coll, st);
  WEFT_TRACE(WEFT_SUBSYS_COLL, "%s #%u: %s algorithm, chosen at its start", coll->call, coll->seq,
             coll->algo);
  return coll->advance(coll);
}

/* An allreduce's host algorithm on device buffers staged after all (the
 * direct rounds' fall-back) or on one slice of them (coll_device.c):
 * chosen for the size, as a whole call would be, at the head of the queue
 * (the direct allreduce too, where the staged copies are shared memory). */
static weft_status allreduce_host_start(weft_coll *coll) {
  weft_choice_state *c = &TASK(coll)->comm->choice;
  weft_status st = weft_choose_allreduce(c, coll);
  if (st == WEFT_CHOICE_LATE) st = weft_choose_late(c, coll, false);
  return guard_if_direct(coll, st);
}

/* A call whose algorithm is chosen when it starts (allreduce_start_late). */
static weft_status coll_start_late(weft_coll *coll) {
  coll->algo = "chosen at start";
  coll->advance = allreduce_start_late;
  return coll_start(coll, WEFT_OK);
}

/* Device buffers of ranks on one host may be worked on where they lie (CUDA
 * IPC, coll_device.c decides): the direct form needs this much device
 * scratch. Not an integer avg, which sums in a 64-bit host buffer
 * (avg_widen). */
static void may_map_device(weft_coll_task *task, size_t scratch_elems) {
  if (avg_is_widened(task->coll.dtype, task->coll.op)) return;
  task->may_map_device = true;
  task->device_scratch_bytes = scratch_elems * task->coll.elem;
}

/* The direct form over CUDA IPC; `host` starts the collective's host
 * algorithm should a rank be unable to map a buffer (the buffers are then
 * staged, and every rank does the same). */
static weft_status coll_start_direct(weft_coll *coll, weft_status (*direct)(weft_coll *coll),
                                     weft_status (*host)(weft_coll *coll)) {
  weft_status st = weft_choose_direct_device(&TASK(coll)->comm->choice, coll, direct);
  if (st == WEFT_OK) guard_direct(coll, host);
  return coll_start(coll, st);
}

static weft_status broadcast_host_start(weft_coll *coll) {
  weft_choice_state *c = &TASK(coll)->comm->choice;
  int fanout = weft_choose_bcast_fanout(c, coll->count * coll->elem, coll->size, coll->chunk_bytes);
  coll->hint.sends_are_stores = c->sends_are_stores; /* how the binomial tree packs */
  if (!c->bcast_confirm) return weft_tree_broadcast_start(coll, fanout);
  return weft_confirmed_broadcast_start(coll, fanout);
}

static weft_status reduce_host_start(weft_coll *coll) {
  int fanout = weft_choose_reduce_fanout(&TASK(coll)->comm->choice, coll->count * coll->elem);
  return weft_tree_reduce_start(coll, fanout);
}

static weft_status allgather_host_start(weft_coll *coll) {
  return weft_choose_allgather(&TASK(coll)->comm->choice, coll);
}

static weft_status reduce_scatter_host_start(weft_coll *coll) {
  return weft_choose_reduce_scatter(&TASK(coll)->comm->choice, coll);
}

/* ---- one setup for the eight collectives, driven by a table ----------------
 *
 * Every collective is set up in the same steps (coll_setup): the common
 * checks, its span, the sequence number, the route of its buffers, which
 * the memory classification decides once (weft_coll_stage_in: host, staged,
 * in slices, or in place over CUDA IPC), then the start that route takes.
 * What differs between collectives is data, one row each of coll_descs. */

/* What one call asks, as its entry point passed it. */
typedef struct coll_args {
  const void *sendbuf;
  void *recvbuf;
  size_t count; /* the kind's count_name: count, sendcount or recvcount */
  weft_dtype dtype;
  weft_op op;
  int root;
  int wire;            /* this call's wire dtype (a gradient set's own); -1: the communicator's */
  uint64_t step_plus1; /* a gradient set's bucket: its step + 1; 0: an ordinary call */
  /* a gradient set's bucket on device memory: the set's stream instead of
   * the communicator's, and that stream not made to wait for the result at
   * issue (weft_coll_bucket_allreduce_setup) */
  bool own_stream;
  void *stream;
  bool defer_user_link;
} coll_args;

/* Where an integer avg's 64-bit sums live for one call (avg_widen). */
typedef struct coll_wide {
  size_t elems, result_at, result_elems;
  bool gets_result;
} coll_wide;

typedef enum { ALONE_FINISH, ALONE_COPY, ALONE_COPY_BLOCK } coll_alone;

typedef struct coll_desc {
  /* what the call touches on this rank: n ranks, this one r */
  weft_coll_span (*span)(size_t count, size_t n, size_t r, bool at_root);
  /* elements of device scratch the direct form's reductions need (0: copies only) */
  size_t (*device_scratch)(size_t count, size_t n, bool at_root);
  /* an integer avg's sums (NULL: the collective has no op) */
  coll_wide (*wide)(size_t count, size_t n, size_t r, bool at_root);
  /* staged device buffers may run in slices: each buffer holds count elements */
  bool sliceable;
  /* f32 sum and avg may travel as bf16/f16 between hosts (weft_comm_set_wire_dtype) */
  bool wire;
  /* the algorithm may be chosen when the call starts, with the hosts known (allreduce) */
  bool late;
  coll_alone alone; /* what one rank does: finish (its avg), copy the buffer, copy its block */
  weft_status (*host_start)(weft_coll *coll);
  weft_status (*direct_start)(weft_coll *coll);
} coll_desc;

#define IN_PLACE_BLOCK(who) "in place needs sendbuf == recvbuf + " who " elements"

static weft_coll_span span_allreduce(size_t c, size_t n, size_t r, bool at_root) {
  (void)n, (void)r, (void)at_root;
  return (weft_coll_span){c, c, 0, 0, SAME_POINTER};
}
static weft_coll_span span_broadcast(size_t c, size_t n, size_t r, bool at_root) {
  (void)n, (void)r;
  return (weft_coll_span){at_root ? c : 0, c, 0, 0, SAME_POINTER};
}
static weft_coll_span span_reduce(size_t c, size_t n, size_t r, bool at_root) {
  (void)n, (void)r;
  return (weft_coll_span){c, at_root ? c : 0, 0, 0, SAME_POINTER};
}
static weft_coll_span span_allgather(size_t c, size_t n, size_t r, bool at_root) {
  (void)at_root;
  return (weft_coll_span){c, n * c, 0, r * c, IN_PLACE_BLOCK("rank*sendcount")};
}
static weft_coll_span span_reduce_scatter(size_t c, size_t n, size_t r, bool at_root) {
  (void)at_root;
  return (weft_coll_span){n * c, c, r * c, 0,
                          "in place needs recvbuf == sendbuf + rank*recvcount elements"};
}
/* gather and scatter: `r` is the root, whose block in place puts it */
static weft_coll_span span_gather(size_t c, size_t n, size_t root, bool at_root) {
  return (weft_coll_span){c, at_root ? n * c : 0, 0, root * c, IN_PLACE_BLOCK("root*sendcount")};
}
static weft_coll_span span_scatter(size_t c, size_t n, size_t root, bool at_root) {
  return (weft_coll_span){at_root ? n * c : 0, c, root * c, 0,
                          "in place needs recvbuf == sendbuf + root*recvcount elements"};
}
static weft_coll_span span_alltoall(size_t c, size_t n, size_t r, bool at_root) {
  (void)r, (void)at_root;
  return (weft_coll_span){n * c, n * c, 0, 0, NULL};
}

static size_t scratch_none(size_t c, size_t n, bool at_root) {
  (void)c, (void)n, (void)at_root;
  return 0;
}
static size_t scratch_allreduce(size_t c, size_t n, bool at_root) { /* a slice, and room */
  (void)at_root;
  return (c + n - 1) / n + 64;
}
static size_t scratch_reduce(size_t c, size_t n, bool at_root) {
  (void)n;
  return at_root ? c : 0;
}
static size_t scratch_reduce_scatter(size_t c, size_t n, bool at_root) {
  (void)n, (void)at_root;
  return c;
}

static coll_wide wide_whole(size_t c, size_t n, size_t r, bool at_root) {
  (void)n, (void)r, (void)at_root;
  return (coll_wide){c, 0, c, true};
}
static coll_wide wide_reduce(size_t c, size_t n, size_t r, bool at_root) {
  (void)n, (void)r;
  return (coll_wide){c, 0, c, at_root};
}
static coll_wide wide_reduce_scatter(size_t c, size_t n, size_t r, bool at_root) {
  (void)at_root;
  return (coll_wide){n * c, r * c, c, true};
}

static const coll_desc coll_descs[] = {
    [KIND_ALLREDUCE] = {span_allreduce, scratch_allreduce, wide_whole, true, true, true,
                        ALONE_FINISH, allreduce_host_start, weft_direct_allreduce_start},
    [KIND_BROADCAST] = {span_broadcast, scratch_none, NULL, true, false, false, ALONE_COPY,
                        broadcast_host_start, weft_direct_broadcast_start},
    [KIND_REDUCE] = {span_reduce, scratch_reduce, wide_reduce, true, true, false, ALONE_FINISH,
                     reduce_host_start, weft_direct_reduce_start},
    [KIND_ALLGATHER] = {span_allgather, scratch_none, NULL, false, false, false, ALONE_COPY_BLOCK,
                        allgather_host_start, weft_direct_allgather_start},
    [KIND_REDUCE_SCATTER] = {span_reduce_scatter, scratch_reduce_scatter, wide_reduce_scatter,
                             false, true, false, ALONE_FINISH, reduce_scatter_host_start,
                             weft_direct_reduce_scatter_start},
    [KIND_GATHER] = {span_gather, scratch_none, NULL, false, false, false, ALONE_COPY_BLOCK,
                     weft_flat_gather_start, weft_direct_gather_start},
    [KIND_SCATTER] = {span_scatter, scratch_none, NULL, false, false, false, ALONE_COPY_BLOCK,
                      weft_flat_scatter_start, weft_direct_scatter_start},
    [KIND_ALLTOALL] = {span_alltoall, scratch_none, NULL, false, false, false, ALONE_COPY_BLOCK,
                       weft_pairwise_alltoall_start, weft_direct_alltoall_start},
};

static weft_status coll_setup(weft_coll_task *task, const char *call, weft_core *comm,
                              enum coll_kind_id kind, const coll_args *a) {
  const coll_desc *d = &coll_descs[kind];
  weft_coll *coll = &task->coll;
  WEFT_CHECK(coll_begin(comm, task, call, kind, a->sendbuf, a->recvbuf, a->count, a->dtype, a->op,
                        a->root));
  task->wire_dtype = a->wire; /* before the sequence number: the signature carries both */
  task->step_plus1 = a->step_plus1;
  if (a->own_stream) task->user_stream = a->stream;
  task->defer_user_link = a->defer_user_link;
  if (kind == KIND_ALLTOALL && a->count && a->sendbuf && a->sendbuf == a->recvbuf)
    return weft_core_error(comm, WEFT_ERR_INVALID, call,
                           "sendbuf == recvbuf, but alltoall cannot run in place (a block would be "
                           "overwritten before it is sent); pass two separate buffers");
  size_t n = (size_t)comm->size, r = (size_t)comm->rank, count = a->count;
  bool at_root = comm->rank == a->root;
  /* the block in place takes: the root's for gather and scatter, else this rank's */
  size_t block = kind == KIND_GATHER || kind == KIND_SCATTER ? (size_t)a->root : r;
  WEFT_CHECK(check_buffers(coll, d->span(count, n, block, at_root)));
  /* device buffers may be worked on where they lie (CUDA IPC), or staged
   * in slices when large (coll_device.c); not an integer avg, which sums
   * in a 64-bit host buffer (avg_widen) */
  may_map_device(task, d->device_scratch(count, n, at_root));
  bool widened = d->wide && avg_is_widened(a->dtype, a->op);
  if (d->sliceable && !widened) task->slice_start = d->host_start;
  WEFT_CHECK(coll_take_seq(coll)); /* classifies the buffers: the route is decided here */
  if (count == 0) return coll_empty(coll);
  if (n == 1) {
    if (d->alone == ALONE_COPY_BLOCK) return coll_copy_alone(coll);
    if (d->alone == ALONE_COPY)
      coll->mem->copy(coll->recvbuf, coll->sendbuf, count * coll->elem);
    else
      coll->mem->finish(coll->recvbuf, coll->sendbuf, count, a->dtype, a->op, 1);
    return WEFT_COLL_DONE;
  }
  if (task->route == WEFT_ROUTE_IN_PLACE)
    return coll_start_direct(coll, d->direct_start, d->host_start);
  if (widened) {
    coll_wide w = d->wide(count, n, r, at_root);
    WEFT_CHECK(avg_widen(coll, w.elems, w.result_at, w.result_elems, w.gets_result));
  }
  if (d->wire) WEFT_CHECK(coll_wire(coll));
  /* the hosts, should the choice take the hierarchical algorithm (for the
   * whole call, or for each slice) */
  if (d->late) coll->hosts = comm->hosts;
  if (task->route == WEFT_ROUTE_DEVICE_CHANNEL && comm->device_channel_hier) {
    /* several hosts, some with several ranks: CUDA IPC within, the device
     * channel across (coll_device.c took only allreduces and broadcasts) */
    coll->hosts = comm->hosts;
    coll->hint.rd_max_bytes = comm->choice.rd_max_bytes;
    coll->hint.bcast_chain_bytes = comm->choice.bcast_chain_bytes;
    return coll_start(coll, task->broadcast ? weft_hier_device_broadcast_start(coll)
                                            : weft_hier_device_allreduce_start(coll));
  }
  if (task->route == WEFT_ROUTE_SLICED) return coll_start(coll, weft_coll_stage_slices_start(task));
  if (!d->late) return coll_start(coll, d->host_start(coll));
  weft_status st = guard_if_direct(coll, weft_choose_allreduce(&comm->choice, coll));
  return st == WEFT_CHOICE_LATE ? coll_start_late(coll) : coll_start(coll, st);
}

static weft_status barrier_setup(weft_coll_task *task, const char *call, weft_core *comm) {
  weft_coll *coll = &task->coll;
  /* a one-byte max-allreduce: nobody leaves before everybody contributed */
  WEFT_CHECK(coll_begin(comm, task, call, KIND_BARRIER, NULL, NULL, 1, WEFT_U8, WEFT_MAX, 0));
  TASK(coll)->token = 0;
  coll->sendbuf = coll->recvbuf = &TASK(coll)->token;
  coll->mem = &weft_mem_host;
  coll->seq = ++comm->seq;
  coll_sign(coll);
  if (comm->size == 1) return WEFT_COLL_DONE;
  weft_status st = weft_choose_barrier(&comm->choice, coll);
  return st == WEFT_CHOICE_LATE ? coll_start_late(coll) : coll_start(coll, st);
}

/* ---- what the public setups return ----------------------------------------- */

/* an ordinary call: the communicator's wire dtype, no step */
#define COLL_ARGS(...) (&(coll_args){__VA_ARGS__, -1, 0, false, NULL, false})

weft_status weft_coll_allreduce_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      weft_dtype dtype, weft_op op) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_ALLREDUCE,
                                           COLL_ARGS(sendbuf, recvbuf, count, dtype, op, 0)));
}

weft_status weft_coll_bucket_allreduce_setup(weft_coll_task *task, const char *call,
                                             weft_core *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, weft_dtype dtype, weft_op op, int wire,
                                             uint64_t step, bool own_stream, void *stream) {
  coll_args a = {sendbuf, recvbuf, count, dtype, op, 0, wire, step + 1, own_stream, stream, own_stream};
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_ALLREDUCE, &a));
}

weft_status weft_coll_broadcast_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      weft_dtype dtype, int root) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_BROADCAST,
                                           COLL_ARGS(sendbuf, recvbuf, count, dtype, WEFT_SUM, root)));
}

weft_status weft_coll_reduce_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                   const void *sendbuf, void *recvbuf, size_t count,
                                   weft_dtype dtype, weft_op op, int root) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_REDUCE,
                                           COLL_ARGS(sendbuf, recvbuf, count, dtype, op, root)));
}

weft_status weft_coll_allgather_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t sendcount,
                                      weft_dtype dtype) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_ALLGATHER,
                                           COLL_ARGS(sendbuf, recvbuf, sendcount, dtype, WEFT_SUM, 0)));
}

weft_status weft_coll_reduce_scatter_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                           const void *sendbuf, void *recvbuf, size_t recvcount,
                                           weft_dtype dtype, weft_op op) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_REDUCE_SCATTER,
                                           COLL_ARGS(sendbuf, recvbuf, recvcount, dtype, op, 0)));
}

weft_status weft_coll_gather_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                   const void *sendbuf, void *recvbuf, size_t sendcount,
                                   weft_dtype dtype, int root) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_GATHER,
                                           COLL_ARGS(sendbuf, recvbuf, sendcount, dtype, WEFT_SUM, root)));
}

weft_status weft_coll_scatter_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                    const void *sendbuf, void *recvbuf, size_t recvcount,
                                    weft_dtype dtype, int root) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_SCATTER,
                                           COLL_ARGS(sendbuf, recvbuf, recvcount, dtype, WEFT_SUM, root)));
}

weft_status weft_coll_alltoall_setup(weft_coll_task *task, const char *call, weft_core *comm,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     weft_dtype dtype) {
  return coll_setup_ended(task, coll_setup(task, call, comm, KIND_ALLTOALL,
                                           COLL_ARGS(sendbuf, recvbuf, count, dtype, WEFT_SUM, 0)));
}

weft_status weft_coll_barrier_setup(weft_coll_task *task, const char *call, weft_core *comm) {
  return coll_setup_ended(task, barrier_setup(task, call, comm));
}
