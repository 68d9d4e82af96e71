/* coll.c - the public collectives: argument checks with a sentence for every
 * refusal, algorithm choice by size, the link functions algorithms use, and
 * the driver loop that advances an algorithm, spins briefly, then sleeps in
 * the transport's wait, and never waits longer than the timeout without
 * progress. */
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
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

static void coll_describe(const weft_coll *coll, char *buf, size_t len) {
  if (!strcmp(coll->call, "weft_broadcast"))
    snprintf(buf, len, "%s(count=%zu, %s, root=%d) call #%u", coll->call, coll->count,
             weft_dtype_name(coll->dtype), coll->root, coll->seq);
  else if (!strcmp(coll->call, "weft_barrier"))
    snprintf(buf, len, "%s() call #%u", coll->call, coll->seq);
  else
    snprintf(buf, len, "%s(count=%zu, %s, %s) call #%u", coll->call, coll->count,
             weft_dtype_name(coll->dtype), weft_op_name(coll->op), coll->seq);
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
  return WEFT_OK;
}

static bool ranges_overlap(const void *a, const void *b, size_t bytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return bytes && x != y && x < y + bytes && y < x + bytes;
}

static weft_status check_buffers(weft_coll *coll, const void *sendbuf, const void *recvbuf,
                                 bool send_needed) {
  weft_comm *comm = coll->comm;
  const char *call = coll->call;
  if ((unsigned)coll->dtype >= WEFT_DTYPE_COUNT)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "unknown dtype %d", (int)coll->dtype);
  if ((unsigned)coll->op >= WEFT_OP_COUNT)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "unknown op %d", (int)coll->op);
  coll->elem = weft_dtype_size(coll->dtype);
  if (coll->count > SIZE_MAX / 2 / coll->elem)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "count %zu is too large", coll->count);
  if (coll->count == 0) return WEFT_OK;
  if (send_needed && !sendbuf)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "sendbuf is NULL but count is %zu",
                           coll->count);
  if (!recvbuf)
    return weft_comm_error(comm, WEFT_ERR_INVALID, call, "recvbuf is NULL but count is %zu",
                           coll->count);
  if (send_needed && ranges_overlap(sendbuf, recvbuf, coll->count * coll->elem))
    return weft_comm_error(comm, WEFT_ERR_INVALID, call,
                           "sendbuf and recvbuf overlap without being equal (in place needs the "
                           "same pointer)");
  return WEFT_OK;
}

WEFT_API weft_status weft_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_op op) {
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_allreduce", sendbuf, recvbuf, count, dtype, op, 0));
  WEFT_CHECK(check_buffers(&coll, sendbuf, recvbuf, true));
  coll.mem = weft_mem_for(recvbuf);
  coll.seq = ++comm->seq;
  if (count == 0) return WEFT_OK;
  if (comm->size == 1) {
    coll.mem->finish(recvbuf, sendbuf, count, dtype, op, 1);
    return WEFT_OK;
  }
  size_t bytes = count * coll.elem;
  bool use_rd = bytes <= comm->chunk_bytes &&
                (comm->algo_forced == 2 || (comm->algo_forced == 0 && bytes <= comm->rd_max_bytes));
  WEFT_CHECK(use_rd ? weft_rd_allreduce_start(&coll) : weft_ring_allreduce_start(&coll));
  WEFT_TRACE(WEFT_SUBSYS_COLL, "allreduce #%u: %zu bytes, %s", coll.seq, bytes, coll.algo);
  return coll_run(&coll);
}

WEFT_API weft_status weft_broadcast(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, int root) {
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_broadcast", sendbuf, recvbuf, count, dtype, WEFT_SUM, root));
  if (root < 0 || root >= comm->size)
    return weft_comm_error(comm, WEFT_ERR_INVALID, "weft_broadcast",
                           "root %d is out of range (size %d)", root, comm->size);
  WEFT_CHECK(check_buffers(&coll, sendbuf, recvbuf, comm->rank == root));
  coll.mem = weft_mem_for(recvbuf);
  coll.seq = ++comm->seq;
  if (count == 0) return WEFT_OK;
  if (comm->size == 1) {
    coll.mem->copy(recvbuf, sendbuf, count * coll.elem);
    return WEFT_OK;
  }
  size_t bytes = count * coll.elem;
  int fanout = comm->bcast_fanout > 0 ? comm->bcast_fanout : bytes >= comm->bcast_chain_bytes ? 1 : 2;
  WEFT_CHECK(weft_tree_broadcast_start(&coll, fanout));
  WEFT_TRACE(WEFT_SUBSYS_COLL, "broadcast #%u: %zu bytes from %d, %s", coll.seq, bytes, root,
             coll.algo);
  return coll_run(&coll);
}

WEFT_API weft_status weft_barrier(weft_comm *comm) {
  /* a one-byte max-allreduce: nobody leaves before everybody contributed */
  uint8_t token = 0;
  weft_coll coll;
  WEFT_CHECK(coll_begin(comm, &coll, "weft_barrier", &token, &token, 1, WEFT_U8, WEFT_MAX, 0));
  coll.elem = 1;
  coll.mem = &weft_mem_host;
  coll.seq = ++comm->seq;
  if (comm->size == 1) return WEFT_OK;
  WEFT_CHECK(weft_rd_allreduce_start(&coll));
  return coll_run(&coll);
}
