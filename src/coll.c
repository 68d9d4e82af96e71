/* coll.c - the public collectives: argument checks with a sentence for every
 * refusal, algorithm choice by size, the link functions algorithms use, and
 * the driver loop that advances an algorithm, spins briefly, then sleeps in
 * the transport's wait, and never waits longer than the timeout without
 * progress. */
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "algo/algo.h"
#include "comm.h"
#include "log.h"
#include "net.h"
#include "settings.h"
#include "status.h"

/* ---- links ---------------------------------------------------------------- */

static inline const weft_transport *peer_ops(const weft_comm *comm, int peer) {
  return comm->tps[comm->peers[peer].tp].ops;
}

static inline int peer_tp_index(const weft_comm *comm, int peer) {
  return peer >= 0 && peer != comm->rank ? comm->peers[peer].tp : 0;
}

static weft_status link_conn(weft_coll *coll, int peer, weft_conn **out) {
  weft_comm *comm = coll->comm;
  weft_peer *p = &comm->peers[peer];
  if (!p->conn) {
    const weft_comm_transport *t = &comm->tps[p->tp];
    const void *addr;
    size_t len;
    weft_comm_peer_address(comm, peer, t->builtin, &addr, &len);
    weft_status st = t->ops->connect(t->ctx, peer, addr, len, &p->conn);
    if (st < 0) {
      coll->waiting_peer = coll->fail_peer = peer;
      return st;
    }
  }
  if (!p->is_active) {
    p->is_active = true;
    comm->active[comm->nactive++] = peer;
  }
  *out = p->conn;
  return WEFT_OK;
}

static weft_status link_result(weft_coll *coll, int peer, weft_status st, const char *waiting_for) {
  if (st == WEFT_AGAIN) coll->waiting_for = waiting_for;
  if (st) coll->waiting_peer = peer;
  if (st < 0) coll->fail_peer = peer;
  return st;
}

weft_status weft_link_send_ready(weft_coll *coll, int peer) {
  weft_conn *c;
  WEFT_CHECK(link_conn(coll, peer, &c));
  return link_result(coll, peer, peer_ops(coll->comm, peer)->send_ready(c), "room to send to");
}

weft_status weft_link_send(weft_coll *coll, int peer, const void *src, size_t bytes) {
  weft_conn *c;
  WEFT_CHECK(link_conn(coll, peer, &c));
  weft_status st = peer_ops(coll->comm, peer)->send(c, src, bytes, coll->seq, coll->mem);
  if (st == WEFT_OK) {
    coll->events++;
    coll->comm->peers[peer].last_send_seq = coll->seq;
  }
  return link_result(coll, peer, st, "room to send to");
}

weft_status weft_link_send_idle(weft_coll *coll, int peer) {
  weft_conn *c;
  WEFT_CHECK(link_conn(coll, peer, &c));
  return link_result(coll, peer, peer_ops(coll->comm, peer)->send_idle(c), "a send to complete to");
}

weft_status weft_link_recv_peek(weft_coll *coll, int peer, size_t bytes, const void **data) {
  weft_conn *c;
  WEFT_CHECK(link_conn(coll, peer, &c));
  return link_result(coll, peer, peer_ops(coll->comm, peer)->recv_peek(c, coll->seq, bytes, data), "data from");
}

weft_status weft_link_recv_release(weft_coll *coll, int peer) {
  weft_conn *c;
  WEFT_CHECK(link_conn(coll, peer, &c));
  weft_status st = peer_ops(coll->comm, peer)->recv_release(c);
  if (st == WEFT_OK) coll->events++;
  return link_result(coll, peer, st, "data from");
}

weft_status weft_link_recv_into(weft_coll *coll, int peer, size_t bytes, void *dst) {
  weft_conn *c;
  WEFT_CHECK(link_conn(coll, peer, &c));
  weft_status st = peer_ops(coll->comm, peer)->recv_into(c, coll->seq, bytes, dst, coll->mem);
  if (st == WEFT_OK) coll->events++;
  return link_result(coll, peer, st, "data from");
}

/* ---- errors ------------------------------------------------------------- */

/* What each call takes, for its checks and its messages. */
typedef struct coll_kind {
  const char *call;
  const char *count_name; /* "count", "sendcount", "recvcount"; NULL: none (barrier) */
  bool has_op, has_root;
  bool blocks; /* the buffers hold one block per rank */
} coll_kind;

static const coll_kind coll_kinds[] = {
    {"weft_barrier", NULL, false, false, false}, /* first: the fallback */
    {"weft_allreduce", "count", true, false, false},
    {"weft_broadcast", "count", false, true, false},
    {"weft_reduce", "count", true, true, false},
    {"weft_allgather", "sendcount", false, false, true},
    {"weft_reduce_scatter", "recvcount", true, false, true},
    {"weft_gather", "sendcount", false, true, true},
    {"weft_scatter", "recvcount", false, true, true},
    {"weft_alltoall", "count", false, false, true},
};

static const coll_kind *coll_kind_of(const char *call) {
  for (size_t i = 1; i < sizeof coll_kinds / sizeof coll_kinds[0]; i++)
    if (!strcmp(coll_kinds[i].call, call)) return &coll_kinds[i];
  return &coll_kinds[0];
}

/* "weft_reduce(count=4, f32, sum, root=1) call #7": what the user called. */
static void coll_describe(const weft_coll *coll, char *buf, size_t len) {
  const coll_kind *k = coll_kind_of(coll->call);
  char op[32] = "", root[32] = "";
  if (!k->count_name) {
    snprintf(buf, len, "%s() call #%u", coll->call, coll->seq);
    return;
  }
  if (k->has_op) snprintf(op, sizeof op, ", %s", weft_op_name(coll->op));
  if (k->has_root) snprintf(root, sizeof root, ", root=%d", coll->root);
  snprintf(buf, len, "%s(%s=%zu, %s%s%s) call #%u", coll->call, k->count_name, coll->count,
           weft_dtype_name(coll->dtype), op, root, coll->seq);
}

/* Makes the failure sticky, tells the peers, and writes the user's sentence. */
static weft_status coll_fail(weft_coll *coll, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static weft_status coll_fail(weft_coll *coll, weft_status st, const char *fmt, ...) {
  weft_comm *comm = coll->comm;
  char what[384], desc[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  coll_describe(coll, desc, sizeof desc);
  weft_comm_error(comm, st, desc, "%s", what);
  comm->failed = st;
  char reason[600];
  if (comm->sink.origin[0])
    snprintf(reason, sizeof reason, "%s", comm->sink.origin);
  else
    snprintf(reason, sizeof reason, "rank %d failed in %s: %s", comm->rank, desc, what);
  for (int t = 0; t < comm->ntps; t++) comm->tps[t].ops->abort_all(comm->tps[t].ctx, reason);
  return st;
}

/* ---- driver --------------------------------------------------------------- */

static weft_status coll_flush(weft_coll *coll) {
  weft_comm *comm = coll->comm;
  for (int i = 0; i < comm->nactive; i++) {
    int peer = comm->active[i];
    if (comm->peers[peer].last_send_seq != coll->seq) continue;
    /* the caller may reuse its buffer once we return: every chunk must be out */
    weft_status st = weft_link_send_idle(coll, peer);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

static void coll_end(weft_coll *coll) {
  weft_comm *comm = coll->comm;
  for (int i = 0; i < comm->nactive; i++) comm->peers[comm->active[i]].is_active = false;
  comm->nactive = 0;
}

static weft_status coll_run_locked(weft_coll *coll);

/* The lock lets weft_comm_abort tell peers itself when no call is running. */
static weft_status coll_run(weft_coll *coll) {
  pthread_mutex_lock(&coll->comm->call_lock);
  weft_status st = coll_run_locked(coll);
  coll_end(coll);
  pthread_mutex_unlock(&coll->comm->call_lock);
  return st;
}

/* Host memory for now: the memory table has no allocator yet. When a CUDA
 * table arrives, this asks coll->mem for memory of the buffers' kind. */
weft_status weft_coll_scratch(weft_coll *coll, size_t bytes, void **out) {
  if (coll->scratch) return WEFT_ERR_INTERNAL; /* one allocation per call */
  coll->scratch = malloc(bytes ? bytes : 1);
  if (!coll->scratch) return WEFT_ERR_NOMEM;
  *out = coll->scratch;
  return WEFT_OK;
}

/* Runs the algorithm that `started` (its start function's status) set up.
 * A start that failed here fails the call and tells the peers, which would
 * otherwise wait for this rank until their timeout. */
static weft_status coll_go(weft_coll *coll, weft_status started) {
  weft_status st = started;
  if (st < 0) {
    st = coll_fail(coll, st, "could not start the algorithm: %s", weft_strerror(st));
  } else {
    WEFT_TRACE(WEFT_SUBSYS_COLL, "%s #%u: %zu bytes (per block), %s algorithm", coll->call,
               coll->seq, coll->count * coll->elem, coll->algo);
    st = coll_run(coll);
  }
  free(coll->scratch);
  coll->scratch = NULL;
  return st;
}

static weft_status coll_run_locked(weft_coll *coll) {
  weft_comm *comm = coll->comm;
  double last = weft_now();
  uint64_t seen = coll->events;
  bool algo_done = false;
  weft_status st;
  for (;;) {
    st = algo_done ? WEFT_OK : coll->advance(coll);
    if (st == WEFT_OK) {
      algo_done = true;
      st = coll_flush(coll);
      if (st == WEFT_OK) return WEFT_OK;
    }
    if (st < 0) break;
    bool moved = false;
    for (int t = 0; t < comm->ntps && st >= 0; t++) {
      bool this_moved = false;
      st = comm->tps[t].ops->progress(comm->tps[t].ctx, &this_moved);
      moved |= this_moved;
    }
    if (st < 0) break;
    double now = weft_now();
    if (moved || coll->events != seen) {
      seen = coll->events;
      last = now;
      continue;
    }
    if (atomic_load_explicit(&comm->aborted, memory_order_relaxed)) {
      st = WEFT_ERR_ABORTED;
      break;
    }
    double idle = now - last;
    if (idle >= comm->timeout_s) {
      st = WEFT_ERR_TIMEOUT;
      break;
    }
    if (idle * 1e6 < comm->spin_us) continue;
    if (idle * 1e6 < comm->spin_us + comm->yield_us) {
      sched_yield();
      continue;
    }
    double left_ms = (comm->timeout_s - idle) * 1000;
    /* sleep on what the algorithm waits for; other transports are polled
     * every round and their waits are bounded slices */
    const weft_comm_transport *t = &comm->tps[peer_tp_index(comm, coll->waiting_peer)];
    st = t->ops->wait(t->ctx, left_ms < 100 ? (int)left_ms + 1 : 100);
    if (st < 0) break;
  }
  int peer = coll->waiting_peer;
  switch (st) {
    case WEFT_ERR_ABORTED:
      comm->sink.origin[0] = 0;
      return coll_fail(coll, st, "weft_comm_abort was called");
    case WEFT_ERR_TIMEOUT:
      comm->sink.origin[0] = 0;
      return coll_fail(coll, st,
                       "no progress for %.1f s while waiting for %s peer %d (%s algorithm); is "
                       "peer %d alive and in the same call?",
                       comm->timeout_s, coll->waiting_for ? coll->waiting_for : "", peer,
                       coll->algo, peer);
    default:
      if (comm->sink.origin[0]) return coll_fail(coll, st, "%s", comm->sink.msg);
      if (coll->fail_peer >= 0)
        return coll_fail(coll, st, "peer %d: %s", coll->fail_peer, comm->sink.msg);
      return coll_fail(coll, st, "%s", comm->sink.msg);
  }
}

/* ---- entry points --------------------------------------------------------- */

/* Common checks; fills coll. Returns an error with the message set. */
static weft_status coll_begin(weft_comm *comm, weft_coll *coll, const char *call,
                              const void *sendbuf, void *recvbuf, size_t count, weft_dtype dtype,
                              weft_op op, int root) {
  *coll = (weft_coll){.comm = comm, .call = call, .sendbuf = sendbuf, .recvbuf = recvbuf,
                      .count = count, .dtype = dtype, .op = op, .root = root, .waiting_peer = -1,
                      .fail_peer = -1};
  if (!weft_comm_is_live(comm))
    return weft_init_error(WEFT_ERR_INVALID, -1, call,
                           "the communicator handle is not a live communicator (NULL, destroyed, "
                           "or never created)");
  if (atomic_load(&comm->aborted) && !comm->failed)
    return weft_comm_error(comm, WEFT_ERR_ABORTED, call, "the communicator was aborted");
  if (comm->failed)
    return comm->failed; /* last_error keeps the first cause */
  const coll_kind *k = coll_kind_of(call);
  if (k->has_root && (root < 0 || root >= comm->size))
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "root %d is out of range (size %d)", root,
                           comm->size);
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "unknown dtype %d", (int)dtype);
  if (k->has_op && (unsigned)op >= WEFT_OP_COUNT)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "unknown op %d", (int)op);
  coll->elem = weft_dtype_size(dtype);
  size_t blocks = k->blocks ? (size_t)comm->size : 1;
  if (count > SIZE_MAX / 2 / coll->elem / blocks)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "%s %zu is too large%s",
                           k->count_name ? k->count_name : "count", count,
                           k->blocks ? " (one block per rank overflows the address space)" : "");
  return WEFT_OK;
}

/* The buffers a call touches on this rank, in elements: read from sendbuf,
 * written to recvbuf (0: not touched on this rank, may be NULL). The one
 * overlap allowed is in place: sendbuf + send_at == recvbuf + recv_at, as
 * in_place_rule says in words (NULL: the call never runs in place). */
typedef struct coll_span {
  size_t send_elems, recv_elems;
  size_t send_at, recv_at;
  const char *in_place_rule;
} coll_span;

#define SAME_POINTER "in place needs the same pointer"

static weft_status check_buffers(weft_coll *coll, coll_span sp) {
  weft_comm *comm = coll->comm;
  const char *call = coll->call, *what = coll_kind_of(call)->count_name;
  if (coll->count == 0) return WEFT_OK;
  if (sp.send_elems && !coll->sendbuf)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "sendbuf is NULL but %s is %zu", what,
                           coll->count);
  if (sp.recv_elems && !coll->recvbuf)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "recvbuf is NULL but %s is %zu", what,
                           coll->count);
  if (!sp.send_elems || !sp.recv_elems) return WEFT_OK;
  uintptr_t s = (uintptr_t)coll->sendbuf, r = (uintptr_t)coll->recvbuf;
  bool overlap = s < r + sp.recv_elems * coll->elem && r < s + sp.send_elems * coll->elem;
  bool in_place = sp.in_place_rule && s + sp.send_at * coll->elem == r + sp.recv_at * coll->elem;
  if (overlap && !in_place)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call,
                           "sendbuf and recvbuf overlap without being in place (%s)",
                           sp.in_place_rule ? sp.in_place_rule : "this call never runs in place");
  return WEFT_OK;
}

/* Every rank takes the next sequence number for every call that passed its
 * checks, before any early return (count 0, one rank): chunks carry it, so a
 * rank that skipped or added a call is caught by the next chunk it moves. */
static void coll_take_seq(weft_coll *coll) {
  coll->mem = weft_mem_for(coll->recvbuf ? coll->recvbuf : coll->sendbuf);
  coll->seq = ++coll->comm->seq;
}

WEFT_API weft_status weft_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_op op) {
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_allreduce", sendbuf, recvbuf, count, dtype, op, 0));
  WEFT_CHECK(check_buffers(&coll, (coll_span){count, count, 0, 0, SAME_POINTER}));
  coll_take_seq(&coll);
  if (count == 0) return WEFT_OK;
  if (comm->size == 1) {
    coll.mem->finish(recvbuf, sendbuf, count, dtype, op, 1);
    return WEFT_OK;
  }
  size_t bytes = count * coll.elem;
  bool use_rd = bytes <= comm->chunk_bytes &&
                (comm->algo_forced == 2 || (comm->algo_forced == 0 && bytes <= comm->rd_max_bytes));
  return coll_go(&coll, use_rd ? weft_rd_allreduce_start(&coll) : weft_ring_allreduce_start(&coll));
}

WEFT_API weft_status weft_broadcast(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, int root) {
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_broadcast", sendbuf, recvbuf, count, dtype, WEFT_SUM, root));
  bool at_root = comm->rank == root;
  WEFT_CHECK(check_buffers(&coll, (coll_span){at_root ? count : 0, count, 0, 0, SAME_POINTER}));
  coll_take_seq(&coll);
  if (count == 0) return WEFT_OK;
  if (comm->size == 1) {
    coll.mem->copy(recvbuf, sendbuf, count * coll.elem);
    return WEFT_OK;
  }
  size_t bytes = count * coll.elem;
  int fanout = comm->bcast_fanout > 0 ? comm->bcast_fanout : bytes >= comm->bcast_chain_bytes ? 1 : 2;
  return coll_go(&coll, weft_tree_broadcast_start(&coll, fanout));
}

WEFT_API weft_status weft_reduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, weft_dtype dtype, weft_op op, int root) {
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_reduce", sendbuf, recvbuf, count, dtype, op, root));
  bool at_root = comm->rank == root;
  WEFT_CHECK(check_buffers(&coll, (coll_span){count, at_root ? count : 0, 0, 0, SAME_POINTER}));
  coll_take_seq(&coll);
  if (count == 0) return WEFT_OK;
  if (comm->size == 1) {
    coll.mem->finish(recvbuf, sendbuf, count, dtype, op, 1);
    return WEFT_OK;
  }
  /* the mirror of a broadcast: a chain from the size where broadcasts take one */
  int fanout = count * coll.elem >= comm->bcast_chain_bytes ? 1 : 2;
  return coll_go(&coll, weft_tree_reduce_start(&coll, fanout));
}

/* The own block's local copy for one rank; nothing when in place. */
static weft_status coll_copy_alone(weft_coll *coll) {
  if (coll->recvbuf != coll->sendbuf)
    coll->mem->copy(coll->recvbuf, coll->sendbuf, coll->count * coll->elem);
  return WEFT_OK;
}

WEFT_API weft_status weft_allgather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t sendcount, weft_dtype dtype) {
  weft_coll coll;
  WEFT_CHECK(
      coll_begin(comm, &coll, "weft_allgather", sendbuf, recvbuf, sendcount, dtype, WEFT_SUM, 0));
  size_t n = (size_t)comm->size, r = (size_t)comm->rank;
  WEFT_CHECK(check_buffers(
      &coll, (coll_span){sendcount, n * sendcount, 0, r * sendcount,
                         "in place needs sendbuf == recvbuf + rank*sendcount elements"}));
  coll_take_seq(&coll);
  if (sendcount == 0) return WEFT_OK;
  if (n == 1) return coll_copy_alone(&coll);
  return coll_go(&coll, weft_ring_allgather_start(&coll));
}

WEFT_API weft_status weft_reduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t recvcount, weft_dtype dtype, weft_op op) {
  weft_coll coll;
  WEFT_CHECK(
      coll_begin(comm, &coll, "weft_reduce_scatter", sendbuf, recvbuf, recvcount, dtype, op, 0));
  size_t n = (size_t)comm->size, r = (size_t)comm->rank;
  WEFT_CHECK(check_buffers(
      &coll, (coll_span){n * recvcount, recvcount, r * recvcount, 0,
                         "in place needs recvbuf == sendbuf + rank*recvcount elements"}));
  coll_take_seq(&coll);
  if (recvcount == 0) return WEFT_OK;
  if (n == 1) {
    coll.mem->finish(recvbuf, sendbuf, recvcount, dtype, op, 1);
    return WEFT_OK;
  }
  return coll_go(&coll, weft_ring_reduce_scatter_start(&coll));
}

WEFT_API weft_status weft_gather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t sendcount, weft_dtype dtype, int root) {
  weft_coll coll;
  WEFT_CHECK(
      coll_begin(comm, &coll, "weft_gather", sendbuf, recvbuf, sendcount, dtype, WEFT_SUM, root));
  size_t n = (size_t)comm->size;
  bool at_root = comm->rank == root;
  WEFT_CHECK(check_buffers(
      &coll, (coll_span){sendcount, at_root ? n * sendcount : 0, 0, (size_t)root * sendcount,
                         "in place needs sendbuf == recvbuf + root*sendcount elements"}));
  coll_take_seq(&coll);
  if (sendcount == 0) return WEFT_OK;
  if (n == 1) return coll_copy_alone(&coll);
  return coll_go(&coll, weft_flat_gather_start(&coll));
}

WEFT_API weft_status weft_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t recvcount, weft_dtype dtype, int root) {
  weft_coll coll;
  WEFT_CHECK(
      coll_begin(comm, &coll, "weft_scatter", sendbuf, recvbuf, recvcount, dtype, WEFT_SUM, root));
  size_t n = (size_t)comm->size;
  bool at_root = comm->rank == root;
  WEFT_CHECK(check_buffers(
      &coll, (coll_span){at_root ? n * recvcount : 0, recvcount, (size_t)root * recvcount, 0,
                         "in place needs recvbuf == sendbuf + root*recvcount elements"}));
  coll_take_seq(&coll);
  if (recvcount == 0) return WEFT_OK;
  if (n == 1) return coll_copy_alone(&coll);
  return coll_go(&coll, weft_flat_scatter_start(&coll));
}

WEFT_API weft_status weft_alltoall(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, weft_dtype dtype) {
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_alltoall", sendbuf, recvbuf, count, dtype, WEFT_SUM, 0));
  if (count && sendbuf && sendbuf == recvbuf)
    return weft_comm_error(comm, WEFT_ERR_INVALID, "weft_alltoall",
                           "sendbuf == recvbuf, but alltoall cannot run in place (a block would be "
                           "overwritten before it is sent); pass two separate buffers");
  size_t n = (size_t)comm->size;
  WEFT_CHECK(check_buffers(&coll, (coll_span){n * count, n * count, 0, 0, NULL}));
  coll_take_seq(&coll);
  if (count == 0) return WEFT_OK;
  if (n == 1) return coll_copy_alone(&coll);
  return coll_go(&coll, weft_pairwise_alltoall_start(&coll));
}

WEFT_API weft_status weft_barrier(weft_comm *comm) {
  /* a one-byte max-allreduce: nobody leaves before everybody contributed */
  uint8_t token = 0;
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_barrier", &token, &token, 1, WEFT_U8, WEFT_MAX, 0));
  coll.mem = &weft_mem_host;
  coll.seq = ++comm->seq;
  if (comm->size == 1) return WEFT_OK;
  return coll_go(&coll, weft_rd_allreduce_start(&coll));
}
