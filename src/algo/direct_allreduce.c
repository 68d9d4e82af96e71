/* direct_allreduce.c - allreduce among ranks of one host whose buffers all
 * lie in shareable memory (weft_mem_alloc). Each rank maps every peer's
 * input and output; member r sums slice r of all inputs in a small piece of
 * scratch and stores the result straight into every member's output. Every
 * byte is read once and written once per output, with no slots between:
 * where the ring moves 2(n-1)/n of the buffer through shared slots per rank,
 * this moves nothing but the data itself, and no rank waits for another
 * between the rounds, which matters when ranks outnumber cores.
 *
 * Rounds (tiny chunks over the ordinary links):
 *   0,1  every member sends every other its message: whether its buffers are
 *        shared and where (a weft_mem_desc each). Arriving also says "my
 *        buffers are ready". If any member's are not shared, every rank sees
 *        it in the messages and all run the ring instead, in this same call.
 *   2,3  each sends whether it could map everything; all must have, or the
 *        ring again (nobody has written anything yet). Skipped when every
 *        message is the same as in the last call that all could map (a
 *        training loop's buffers): every rank sees the same messages and
 *        remembers the same last agreement, so all skip it together.
 *   4    sum own slice, store it into every output.
 *   5,6  each tells every other it is done; a rank returns only when all
 *        are, so nobody still reads its input or writes its output.
 * The question costs a round of small messages, which ranks that outnumber
 * their cores feel even at 1 MiB (docs/tuning.md, "The direct allreduce's
 * memory of call shapes"). So each communicator remembers, per call shape
 * (count, dtype), when the last question found ordinary buffers, and asks
 * again for that shape only every DIRECT_ASK_EVERY calls; the shape and the
 * outcomes are the same on every rank, so every rank asks or skips alike.
 * The call reports its outcomes (weft_coll.outcome) and the choice keeps
 * them (src/coll/choose.c): the per-shape memory and the agreed messages,
 * which the next call reads as coll->hint.direct_agreed.
 *
 * Final values are computed once and copied, so every rank ends with the
 * same bits. In place is safe: slice r of any buffer is read and written by
 * member r alone, each piece read in full before it is written.
 *
 * Device buffers (CUDA IPC, issue 37): the same rounds over the same links,
 * with the buffers described and mapped through the memory table (an IPC
 * handle each) and the sum made by kernels queued on the call's stream: the
 * slice summed into device scratch in the same fixed order, then copied
 * into every member's output. The first round waits for the user's earlier
 * work on the buffers (coll->ready), the done round for the kernels, so a
 * member's buffers are neither read before they hold the input nor left
 * while a peer's kernel may still write them; and a peer's buffers it did
 * not register (weft_comm_register) are closed here before the done round,
 * since the peer may free them once its call ends. When not every member can map
 * every buffer (GPUs that cannot reach each other, a buffer without an IPC
 * handle), every rank answers WEFT_ALGO_FALL_BACK (algo.h) and its caller
 * stages the buffers through host memory and runs the host algorithm in
 * the same call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/algo/algo.h"
#include "src/algo/direct.h"
#include "src/base/log.h"
#include "src/mem/shared_mem.h"

#define DIRECT_MSG_MAGIC 0x57444952u /* "WDIR" */
#define DIRECT_PIECE_BYTES 16384     /* the running sum stays in L1 */

struct weft_direct_msg {
  uint32_t magic;
  uint32_t shared; /* 1: both buffers lie in weft_mem_alloc memory (or device memory with an IPC
                      handle); a plan's: the sendbuf, where this member has one */
  uint32_t sig;    /* the call's signature (less a bucket's step): messages alike are the same
                      call's on the same buffers (direct_agreed) */
  uint32_t unused;
  weft_mem_desc in, out; /* kind WEFT_MEMORY_SHARED or DEVICE (mem.h); a plan's: `in` only */
};

/* The question's outcome, for the caller to keep when the call ends. */
static void memo_note(weft_coll *coll, bool all_shared) {
  coll->outcome.direct_shared = all_shared ? 1 : -1;
}

typedef struct direct_state {
  int phase;                    /* see the enum above direct_advance */
  int next;                     /* the next member to send to / receive from in this phase */
  struct weft_direct_msg *msgs; /* scratch: every member's message (own at coll->rank) */
  char **ins, **outs;           /* scratch: every member's buffers, as mapped here */
  void *acc;                    /* scratch: one piece of the running sum */
  uint32_t token;               /* what this rank sends in the done round */
  /* scratch: what every member sent in the verdict round, this rank's own
   * at coll->rank. Its own is sent from here, not from this state: when the
   * ring takes over in the same call, its state overwrites this one while
   * the verdict's sends may still read their source. */
  uint32_t *verdicts;
  void *dev_acc;          /* device buffers: the slice's sum (coll->device_scratch, once taken) */
  uint64_t reduced;       /* device buffers: the token of the last kernel or copy */
  const weft_direct_plan *plan; /* another collective's form (direct.h); NULL: the allreduce */
} direct_state;
_Static_assert(sizeof(direct_state) <= WEFT_ALGO_STATE_BYTES,
               "direct_state fits weft_coll.algo_state");

enum {
  SEND_KEYS,
  RECV_KEYS,
  SEND_VERDICT,
  RECV_VERDICT,
  REDUCE,
  REDUCE_WAIT, /* device buffers: the kernels done */
  SEND_DONE,
  RECV_DONE,
  FINISHED,
  INPUT_WAIT, /* device buffers, first: the user's work on them done */
};

/* Maps every other member's buffers; false (with the reason logged) when
 * one cannot be: not shared memory this transport reaches, or a length
 * that is not this call's (counts differ: the ring will say so). */
static bool map_all(weft_coll *coll) {
  direct_state *ds = WEFT_ALGO_STATE(coll, direct_state);
  size_t bytes = coll->count * coll->elem;
  for (int p = 0; p < coll->size; p++) {
    if (p == coll->rank) continue;
    const struct weft_direct_msg *m = &ds->msgs[p];
    /* what this rank reads of p's input; the allreduce also writes p's output */
    if (ds->plan && !ds->plan->reads(coll, p)) continue;
    size_t reads = ds->plan ? ds->plan->input_bytes(coll, p) : bytes;
    void *in = NULL, *out = NULL;
    weft_status st = WEFT_ERR_MISMATCH;
    if (m->in.len == reads && (ds->plan || m->out.len == bytes)) {
      st = weft_link_map(coll, p, &m->in, &in);
      if (st == WEFT_OK && !ds->plan) st = weft_link_map(coll, p, &m->out, &out);
    }
    if (st != WEFT_OK) {
      WEFT_INFO(
          WEFT_SUBSYS_COLL, "rank %d: %s #%u: not direct, peer %d's buffers: %s (%s)",
          coll->link.ops->rank_of(coll->link.ctx, coll->rank), coll->call, coll->seq, p,
          weft_status_name(st),
          st == WEFT_ERR_MISMATCH ? "lengths differ" : coll->link.ops->last_error(coll->link.ctx));
      return false;
    }
    ds->ins[p] = in;
    ds->outs[p] = out;
  }
  return true;
}

/* This member's slice: whole cache lines, so no two members store into
 * one line of an output. */
static void direct_slice(const weft_coll *coll, size_t *lo, size_t *hi) {
  size_t n = (size_t)coll->size, line = 64 / coll->elem;
  size_t per = (coll->count + n - 1) / n;
  per = (per + line - 1) / line * line;
  size_t start = (size_t)coll->rank * per;
  *lo = start < coll->count ? start : coll->count;
  *hi = start + per < coll->count ? start + per : coll->count;
}

static void direct_reduce(weft_coll *coll) {
  direct_state *ds = WEFT_ALGO_STATE(coll, direct_state);
  const weft_mem_ops *mem = coll->mem;
  size_t e = coll->elem, piece = DIRECT_PIECE_BYTES / e, lo, hi;
  int n = coll->size;
  direct_slice(coll, &lo, &hi);
  for (size_t off = lo; off < hi; off += piece) {
    size_t cnt = hi - off < piece ? hi - off : piece;
    size_t at = off * e;
    /* a fixed order (member 0, 1, ...) whoever computes: deterministic */
    mem->reduce(ds->acc, ds->ins[0] + at, ds->ins[1] + at, cnt, coll->dtype, coll->op,
                n == 2 ? coll->avg_div : 1);
    for (int p = 2; p < n; p++)
      mem->reduce(ds->acc, ds->acc, ds->ins[p] + at, cnt, coll->dtype, coll->op,
                  p == n - 1 ? coll->avg_div : 1);
    for (int p = 0; p < n; p++) mem->copy(ds->outs[p] + at, ds->acc, cnt * e);
  }
  coll->link.ops->progressed(coll->link.ctx); /* for the engine's timeout */
}

/* The caller's device scratch for this call's kernels, asked for right
 * before they are queued (WEFT_ALGO_NEED_SCRATCH: the caller sets it and
 * advances again, at the same point); only where a form sums through it,
 * as taking it may grow it, waiting for everything queued. */
static weft_status take_device_scratch(weft_coll *coll, direct_state *ds) {
  if (!coll->device_scratch) return WEFT_ALGO_NEED_SCRATCH;
  ds->dev_acc = coll->device_scratch;
  return WEFT_OK;
}

/* The device form: kernels queued on the call's stream, the slice summed
 * in the same fixed order as the host form, then stored into every
 * member's output; ds->reduced completes when all are done. */
static weft_status direct_reduce_device(weft_coll *coll) {
  direct_state *ds = WEFT_ALGO_STATE(coll, direct_state);
  const weft_mem_ops *mem = coll->mem;
  size_t e = coll->elem, lo, hi;
  int n = coll->size;
  direct_slice(coll, &lo, &hi);
  size_t cnt = hi - lo, at = lo * e;
  uint64_t t = 0;
  if (cnt && n <= 8) {
    /* one pass: each input read once, the result stored into every output
     * (2n slices of memory traffic, not 5n - 3 through the scratch) */
    void *outs[8];
    const void *ins[8];
    for (int p = 0; p < n; p++) outs[p] = ds->outs[p] + at, ins[p] = ds->ins[p] + at;
    weft_status st = mem->reduce_all_async(outs, ins, n, cnt, coll->dtype, coll->op,
                                           coll->avg_div, coll->stream, &t);
    if (st != WEFT_ERR_UNSUPPORTED) {
      ds->reduced = t;
      return st;
    }
  }
  if (cnt) {
    /* past 8 members: the sum goes through it (asked for before anything
     * is queued, so the call comes back here) */
    WEFT_STEP(take_device_scratch(coll, ds));
    WEFT_CHECK(mem->reduce_async(ds->dev_acc, ds->ins[0] + at, ds->ins[1] + at, cnt, coll->dtype,
                                 coll->op, n == 2 ? coll->avg_div : 1, coll->stream, &t));
    for (int p = 2; p < n; p++)
      WEFT_CHECK(mem->reduce_async(ds->dev_acc, ds->dev_acc, ds->ins[p] + at, cnt, coll->dtype,
                                   coll->op, p == n - 1 ? coll->avg_div : 1, coll->stream, &t));
    for (int p = 0; p < n; p++)
      WEFT_CHECK(mem->copy_async(ds->outs[p] + at, ds->dev_acc, cnt * e, coll->stream, &t));
  }
  ds->reduced = t;
  return WEFT_OK;
}

/* Device buffers the peers lent for this call (no WEFT_MEM_DESC_KEEP: not
 * registered) are closed once this rank's kernels on them are done and
 * before the done round, after which a peer may free them. */
static void release_lent(weft_coll *coll) {
  if (coll->mem->kind != WEFT_MEMORY_DEVICE) return;
  for (int p = 0; p < coll->size; p++)
    if (p != coll->rank) weft_link_release(coll, p);
}

/* Not every rank can go direct: every rank answers WEFT_ALGO_FALL_BACK at
 * this same round, and its caller runs the host algorithm in this same call
 * (device buffers: on host copies of them). */
static weft_status direct_fall_back(weft_coll *coll) {
  release_lent(coll); /* what map_all opened before a verdict said no */
  /* the host algorithm may take scratch of its own (one per call); the
   * rounds' last sends may still read this one until the call ends */
  int slot = coll->handed_over_scratch[0] ? 1 : 0;
  if (coll->handed_over_scratch[slot]) return WEFT_ERR_INTERNAL; /* at most two fall-backs */
  coll->handed_over_scratch[slot] = coll->scratch;
  coll->scratch = NULL;
  return WEFT_ALGO_FALL_BACK;
}

/* The rounds' messages lie in host scratch whatever the buffers are (device
 * buffers: coll->mem is the device table), so they move as host memory. */
static weft_status msgs_send_all(weft_coll *coll, int *next, const void *src, size_t bytes) {
  const weft_mem_ops *buffers = coll->mem;
  coll->mem = &weft_mem_host;
  weft_status st = weft_step_send_all(coll, next, src, bytes);
  coll->mem = buffers;
  return st;
}

static weft_status msgs_recv_all(weft_coll *coll, int *next, void *base, size_t bytes) {
  const weft_mem_ops *buffers = coll->mem;
  coll->mem = &weft_mem_host;
  weft_status st = weft_step_recv_all(coll, next, base, bytes);
  coll->mem = buffers;
  return st;
}

static weft_status direct_advance(weft_coll *coll) {
  direct_state *ds = WEFT_ALGO_STATE(coll, direct_state);
  size_t msg = sizeof(struct weft_direct_msg);
  switch (ds->phase) {
    case INPUT_WAIT:
      WEFT_STEP(coll->mem->poll(coll->ready_stream, coll->ready));
      ds->phase = SEND_KEYS;
      /* fall through */
    case SEND_KEYS:
      WEFT_STEP(msgs_send_all(coll, &ds->next, &ds->msgs[coll->rank], msg));
      ds->phase = RECV_KEYS;
      /* fall through */
    case RECV_KEYS: {
      WEFT_STEP(msgs_recv_all(coll, &ds->next, ds->msgs, msg));
      bool all_shared = true;
      for (int p = 0; p < coll->size; p++)
        all_shared = all_shared && ds->msgs[p].magic == DIRECT_MSG_MAGIC && ds->msgs[p].shared;
      /* every rank read the same messages: all fall back together */
      if (!ds->plan) memo_note(coll, all_shared);
      if (!all_shared) return direct_fall_back(coll);
      size_t all = (size_t)coll->size * msg;
      const void *agreed = coll->hint.direct_agreed ? *coll->hint.direct_agreed : NULL;
      if (agreed && !memcmp(agreed, ds->msgs, all)) {
        /* mapped before, and the mappings are cached: only a kernel refusal
         * now (memory pressure) fails here; the peers then see our failure */
        if (!map_all(coll)) {
          char why[512];
          snprintf(why, sizeof why,
                   "could not map again the shared buffers every rank mapped in the last call: %s",
                   coll->link.ops->last_error(coll->link.ctx));
          coll->link.ops->set_error(coll->link.ctx, why);
          return WEFT_ERR_SYSTEM; /* worded in the sink; the engine tells the peers */
        }
        ds->phase = REDUCE;
        goto reduce;
      }
      if (agreed) coll->outcome.direct_agreed = -1; /* forgotten, unless this call agrees */
      ds->verdicts[coll->rank] = map_all(coll);
      ds->phase = SEND_VERDICT;
    }
      /* fall through */
    case SEND_VERDICT:
      WEFT_STEP(
          msgs_send_all(coll, &ds->next, &ds->verdicts[coll->rank], sizeof *ds->verdicts));
      ds->phase = RECV_VERDICT;
      /* fall through */
    case RECV_VERDICT: {
      WEFT_STEP(msgs_recv_all(coll, &ds->next, ds->verdicts, sizeof *ds->verdicts));
      for (int p = 0; p < coll->size; p++)
        if (!ds->verdicts[p]) {
          if (!ds->plan) memo_note(coll, false); /* someone cannot map: as good as ordinary memory */
          return direct_fall_back(coll);
        }
      coll->outcome.direct_agreed = 1;
      coll->outcome.direct_msgs = ds->msgs;
      coll->outcome.direct_msgs_bytes = (size_t)coll->size * msg;
      ds->phase = REDUCE;
    }
      /* fall through */
    case REDUCE:
    reduce:
      /* a plan's reductions sum through device scratch; the allreduce's one
       * pass needs none (direct_reduce_device takes it past 8 members) */
      if (coll->mem->kind == WEFT_MEMORY_DEVICE && ds->plan && ds->plan->sums && ds->plan->sums(coll))
        WEFT_STEP(take_device_scratch(coll, ds));
      if (ds->plan) {
        ds->reduced = 0;
        WEFT_CHECK(ds->plan->work(coll, ds->ins, &ds->reduced));
      } else if (coll->mem->kind == WEFT_MEMORY_DEVICE) {
        WEFT_STEP(direct_reduce_device(coll)); /* may ask for scratch first */
      } else {
        direct_reduce(coll);
      }
      ds->phase = REDUCE_WAIT;
      /* fall through */
    case REDUCE_WAIT:
      if (coll->mem->kind == WEFT_MEMORY_DEVICE) {
        WEFT_STEP(coll->mem->poll(coll->stream, ds->reduced));
        coll->link.ops->progressed(coll->link.ctx); /* for the engine's timeout */
        release_lent(coll);
      }
      ds->phase = SEND_DONE;
      /* fall through */
    case SEND_DONE:
      WEFT_STEP(msgs_send_all(coll, &ds->next, &ds->token, sizeof ds->token));
      ds->phase = RECV_DONE;
      /* fall through */
    case RECV_DONE:
      WEFT_STEP(msgs_recv_all(coll, &ds->next, ds->verdicts, sizeof *ds->verdicts));
      ds->phase = FINISHED;
      /* fall through */
    default: return WEFT_OK;
  }
}

/* The rounds' state and this rank's message; `plan` NULL: the allreduce. */
static weft_status direct_begin(weft_coll *coll, const weft_direct_plan *plan) {
  direct_state *ds = WEFT_ALGO_STATE(coll, direct_state);
  size_t n = (size_t)coll->size, bytes = coll->count * coll->elem;
  size_t need = n * sizeof *ds->msgs + 2 * n * sizeof(char *) + n * sizeof *ds->verdicts +
                DIRECT_PIECE_BYTES + 64;
  char *s;
  WEFT_CHECK(weft_coll_scratch(coll, need, (void **)&s));
  memset(ds, 0, sizeof *ds);
  ds->plan = plan;
  ds->msgs = (struct weft_direct_msg *)s;
  ds->ins = (char **)(ds->msgs + n);
  ds->outs = ds->ins + n;
  ds->verdicts = (uint32_t *)(ds->outs + n);
  ds->acc = (void *)(((uintptr_t)(ds->verdicts + n) + 63) & ~(uintptr_t)63);
  memset(ds->msgs, 0, n * sizeof *ds->msgs);
  memset(ds->ins, 0, 2 * n * sizeof(char *));
  struct weft_direct_msg *mine = &ds->msgs[coll->rank];
  mine->magic = DIRECT_MSG_MAGIC;
  mine->sig = weft_sig_shape(coll->sig); /* a gradient bucket's step is not part of it */
  if (plan) {
    /* a sendbuf of this member's (the plan's peers read nothing where it
     * has none: a broadcast's non-root) */
    size_t in_bytes = plan->input_bytes(coll, coll->rank);
    mine->shared = !in_bytes || coll->mem->describe(coll->sendbuf, in_bytes, &mine->in);
  } else {
    mine->shared = coll->mem->describe(coll->sendbuf, bytes, &mine->in) &&
                   coll->mem->describe(coll->recvbuf, bytes, &mine->out);
    ds->outs[coll->rank] = coll->recvbuf;
  }
  ds->ins[coll->rank] = (char *)coll->sendbuf;
  ds->token = 1;
  coll->advance = direct_advance;
  return WEFT_OK;
}

bool weft_direct_running(const weft_coll *coll) {
  return coll->advance == direct_advance;
}

weft_status weft_direct_allreduce_start(weft_coll *coll) {
  direct_state *ds = WEFT_ALGO_STATE(coll, direct_state);
  WEFT_CHECK(direct_begin(coll, NULL));
  coll->algo = "direct";
  if (coll->mem->kind == WEFT_MEMORY_DEVICE) {
    coll->algo = "direct, cuda ipc";
    ds->phase = INPUT_WAIT;
  }
  return WEFT_OK;
}

weft_status weft_direct_plan_start(weft_coll *coll, const weft_direct_plan *plan) {
  if (coll->mem->kind != WEFT_MEMORY_DEVICE) return WEFT_ERR_INTERNAL; /* device buffers only */
  WEFT_CHECK(direct_begin(coll, plan));
  coll->algo = plan->algo;
  WEFT_ALGO_STATE(coll, direct_state)->phase = INPUT_WAIT;
  return WEFT_OK;
}
