/* coll_device.c - collectives on device buffers, staged through pinned host
 * memory (coll_device.h says what and why). The communicator keeps one
 * stream on the device its calls use and a small pool of pinned buffers, so
 * no call allocates pinned memory once the pool has grown to its sizes. */
#include "src/coll/coll_device.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/coll/core.h"
#include "src/mem/mem.h"

#ifdef WEFT_HAVE_CUDA

#include "src/cuda/cuda_mem.h"

/* Pinned buffers a communicator keeps: one per call in flight, and a
 * gradient step issues one call per tensor at once (ResNet-50: 161), each
 * staged when issued. Past the pool a call allocates its own, which costs a
 * pinned allocation per call. */
#define STAGE_POOL 256
#define STAGE_MIN_BYTES (64u << 10) /* small calls share one size, so blocks are reused */

typedef struct stage_block {
  void *ptr;
  size_t bytes;
  bool shared; /* weft_cuda_alloc_shared_pinned's, else alloc_slots' (the bounce pool: device memory) */
  bool busy;
  /* a call that failed left work on it: free once these are done */
  weft_mem_token until_in, until_out; /* tokens of until_in_on and of `stream` */
  struct weft_mem_stream *until_in_on;
} stage_block;

/* A communicator's device state (weft_core.device). */
struct weft_coll_device {
  int ordinal; /* the device its calls run on */
  /* stage in pinned memory the peers can map: every rank on this host and
   * linked by a transport that maps shared buffers (shm), so a staged
   * allreduce may be the direct one, reading the peers' staged copies
   * where they lie, with no copy through the transport's slots */
  bool shared_stage;
  /* Two streams, so that no call's GPU work waits behind the user's work
   * of calls issued after it (head-of-line). `in` takes what is queued at
   * issue, in issue order: the wait for the user's earlier work, the copies
   * of the inputs to the host, the token saying the input is ready. `stream`
   * takes what is queued when the call runs, one call at a time: kernels,
   * the copies of results back, and the signal the user's stream waits on.
   * A call's run-time work follows its input because the host polled the
   * input's token before queuing it, never by a wait on `stream`. */
  weft_mem_stream *in;
  weft_mem_stream *stream;
  /* the pool and the signal count: issue (the user's thread) and the end
   * of a call (the driver's, maybe the progress thread) both reach them */
  pthread_mutex_t lock;
  uint32_t issued;   /* non-blocking calls issued: the value each one's signal carries */
  uint32_t signaled; /* the latest value queued to `stream`'s signal */
  stage_block pool[STAGE_POOL];
  /* device scratch of the calls worked on in place (the direct rounds'
   * sums), grown as needed and kept: a cuMemAlloc and a cuMemFree per call
   * would cost more than the kernels. Taken by a call only when it queues
   * its kernels (weft_coll_device_scratch): calls run one at a time. */
  void *scratch;
  size_t scratch_bytes;
  /* device memory peers can map (cuMemAlloc's), for the calls whose buffers
   * they cannot (cuMemCreate's: no legacy IPC handle): such a call works on
   * a copy here, in place over IPC, and its result is copied back (bounced,
   * device to device at the GPU's own speed) instead of being staged
   * through host memory. One block per call in flight, as the pinned pool. */
  stage_block bounce[STAGE_POOL];
};

/* A staged call's part (weft_coll_task.staged). */
struct weft_coll_staged {
  void *user_recv;   /* the device buffer the result goes back to (NULL: none here) */
  void *host_recv;   /* where the algorithm writes it (bounced: device memory) */
  /* bounced: the copy is in the device bounce pool, not pinned host memory,
   * and the call runs in place over IPC on it; user_send: the input it was
   * copied from, for a fall-back to staging */
  bool bounced;
  const void *user_send;
  size_t recv_bytes;
  int block;         /* index in the pool, or -1: a buffer of its own */
  void *own;         /* that buffer */
  size_t own_bytes;
  weft_mem_token in, out;
  /* the stream of `in` and slice_in: the device state's `in`, or its run
   * stream for a call staged after all as it runs: `in` may hold the waits
   * of calls issued later for the user's stream, which wait for this call */
  struct weft_mem_stream *in_on;
  bool out_queued;
  weft_status (*then)(weft_coll *coll); /* the algorithm's advance, once the input is here */
  /* in slices (stage_slices): slice k's copy to the host completes with
   * slice_in[k]; the algorithm runs on one slice at a time (running: its
   * advance is inner), and each slice's result is copied back as soon as
   * it is done, so copies both ways overlap the algorithm's other slices */
  int nslices, next;
  size_t slice_elems, count; /* count: the whole call's (coll->count is the slice's) */
  weft_mem_token *slice_in;
  char *host_send; /* the whole call's (coll->sendbuf is the slice's) */
  bool running;
  weft_status (*inner)(weft_coll *coll);
  /* the finished slices' algorithm scratch: a transport may still read a
   * slice's last sends from it (tcp, a full socket) until the call ends */
  void **spent;
  int nspent;
};

static weft_status staged_fail(weft_coll_task *task, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static weft_status staged_fail(weft_coll_task *task, weft_status st, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return weft_core_error(task->comm, st, task->coll.call, "%s", what);
}

/* Every rank of `comm` on this host, several of them, and every peer over a
 * transport that maps a peer's memory of `kind` (shm): alike on every rank. */
static bool one_host_mapping(const weft_core *comm, weft_memory kind) {
  if (comm->size < 2 || comm->hosts.nhosts != 1) return false;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank) continue;
    int tp = comm->links.peers[p].tp;
    if (tp < 0 || !(comm->links.tps[tp].ops->caps.map_kinds & WEFT_MEMORY_BIT(kind))) return false;
  }
  return true;
}

static weft_status device_state_of(weft_core *core, const char *call, int ordinal,
                                   struct weft_coll_device **out) {
  struct weft_coll_device *d = core->device;
  if (!d) {
    if (!(d = calloc(1, sizeof *d))) return weft_core_error(core, WEFT_ERR_NOMEM, call, "no memory");
    d->ordinal = ordinal;
    d->shared_stage = one_host_mapping(core, WEFT_MEMORY_SHARED);
    pthread_mutex_init(&d->lock, NULL);
    weft_status st = weft_cuda_stream_create(ordinal, &d->in, &core->links.sink);
    if (!st) st = weft_cuda_stream_create(ordinal, &d->stream, &core->links.sink);
    if (st) {
      weft_cuda_stream_destroy(d->in);
      pthread_mutex_destroy(&d->lock);
      free(d);
      return weft_core_error(core, st, call, "%s", core->links.sink.msg);
    }
    core->device = d;
  }
  if (d->ordinal != ordinal)
    return weft_core_error(core, WEFT_ERR_INVALID, call,
                           "this communicator's device buffers are on GPU %d; this one is on GPU %d "
                           "(one device per communicator, as NCCL: split one per device)",
                           d->ordinal, ordinal);
  *out = d;
  return WEFT_OK;
}

static weft_status device_state(weft_coll_task *task, int ordinal, struct weft_coll_device **out) {
  return device_state_of(task->comm, task->coll.call, ordinal, out);
}

static void stage_block_free(stage_block *b) {
  if (b->ptr && b->shared) weft_cuda_free_shared_pinned(b->ptr);
  else if (b->ptr) weft_mem_device.free_slots(b->ptr, b->bytes);
  b->ptr = NULL;
  b->bytes = 0;
  b->shared = false;
}

/* The blocks of `pool` a taker of `bytes` may use: the smallest free one
 * that fits, an empty slot, and the smallest free one that does not fit;
 * -1 where there is none. A block a failed call left work on is free once
 * that work is done. Caller holds d->lock. */
typedef struct pool_pick {
  int fit, empty, smallest;
} pool_pick;

static pool_pick pool_pick_locked(struct weft_coll_device *d, stage_block *pool, size_t bytes) {
  pool_pick k = {-1, -1, -1};
  for (int i = 0; i < STAGE_POOL; i++) {
    stage_block *b = &pool[i];
    if (b->busy) continue;
    if (b->until_in || b->until_out) {
      if ((b->until_in && weft_mem_device.poll(b->until_in_on, b->until_in) != WEFT_OK) ||
          (b->until_out && weft_mem_device.poll(d->stream, b->until_out) != WEFT_OK))
        continue;
      b->until_in = b->until_out = 0;
    }
    if (!b->ptr) {
      if (k.empty < 0) k.empty = i;
    } else if (b->bytes >= bytes) {
      if (k.fit < 0 || b->bytes < pool[k.fit].bytes) k.fit = i;
    } else if (k.smallest < 0 || b->bytes < pool[k.smallest].bytes) {
      k.smallest = i;
    }
  }
  return k;
}

/* A pinned buffer of at least `bytes` from the pool: the smallest free
 * block that fits; else an empty slot gets a new block, else the smallest
 * free block is replaced by a larger one. Steps that issue the same calls
 * settle on the same blocks after the first. Caller holds d->lock. */
static void *stage_take_locked(struct weft_coll_device *d, size_t bytes, int *block) {
  pool_pick k = pool_pick_locked(d, d->pool, bytes);
  int fit = k.fit, empty = k.empty, smallest = k.smallest;
  *block = fit;
  if (fit >= 0) {
    d->pool[fit].busy = true;
    return d->pool[fit].ptr;
  }
  int at = empty >= 0 ? empty : smallest;
  if (at < 0) return weft_mem_device.alloc_slots(bytes); /* every block busy: one of its own */
  stage_block *b = &d->pool[at];
  stage_block_free(b);
  size_t grown = bytes < STAGE_MIN_BYTES ? STAGE_MIN_BYTES : bytes;
  /* shared where the peers can map it; ordinary pinned memory if that fails
   * (a full /dev/shm): the call is staged either way */
  b->ptr = d->shared_stage ? weft_cuda_alloc_shared_pinned(grown) : NULL;
  b->shared = b->ptr != NULL;
  if (!b->ptr) b->ptr = weft_mem_device.alloc_slots(grown);
  b->bytes = b->ptr ? grown : 0;
  if (!b->ptr) return NULL;
  b->busy = true;
  *block = at;
  return b->ptr;
}

static void *stage_take(struct weft_coll_device *d, size_t bytes, int *block) {
  pthread_mutex_lock(&d->lock);
  void *p = stage_take_locked(d, bytes, block);
  pthread_mutex_unlock(&d->lock);
  return p;
}

static void bounce_block_free(stage_block *b) {
  if (b->ptr) weft_mem_device.free_scratch(b->ptr);
  b->ptr = NULL;
  b->bytes = 0;
}

/* A block of the bounce pool of at least `bytes`, chosen as stage_take
 * chooses; -1 in *block: one of its own (every block busy). */
static void *bounce_take(struct weft_coll_device *d, size_t bytes, int *block) {
  pthread_mutex_lock(&d->lock);
  pool_pick k = pool_pick_locked(d, d->bounce, bytes);
  int fit = k.fit, at = fit >= 0 ? fit : k.empty >= 0 ? k.empty : k.smallest;
  *block = at;
  void *p = NULL;
  if (at < 0) {
    p = weft_cuda_alloc_on(d->ordinal, bytes);
  } else {
    stage_block *b = &d->bounce[at];
    if (fit < 0) { /* a new block, or a larger one in place of the smallest free */
      bounce_block_free(b);
      size_t grown = bytes < STAGE_MIN_BYTES ? STAGE_MIN_BYTES : bytes;
      b->ptr = weft_cuda_alloc_on(d->ordinal, grown);
      b->bytes = b->ptr ? grown : 0;
    }
    p = b->ptr;
    b->busy = p != NULL;
  }
  pthread_mutex_unlock(&d->lock);
  return p;
}

/* Polls `stream` until `token` completed, at most the communicator's
 * timeout: WEFT_AGAIN when that ran out (0: nothing to wait). */
static weft_status token_wait(const weft_core *comm, weft_mem_stream *stream, weft_mem_token token) {
  double deadline = weft_now() + comm->fail.timeout_s;
  weft_status st = WEFT_OK;
  while (token && (st = weft_mem_device.poll(stream, token)) == WEFT_AGAIN && weft_now() < deadline) {
  }
  return st;
}

static weft_status stage_wait(weft_coll_task *task, weft_mem_stream *stream, weft_mem_token token) {
  weft_status st = token_wait(task->comm, stream, token);
  if (st == WEFT_AGAIN)
    return staged_fail(task, WEFT_ERR_TIMEOUT,
                       "the copy of the device buffer did not complete in %.1f s (WEFT_TIMEOUT): "
                       "is the GPU stuck on earlier work of the user's stream?",
                       task->comm->fail.timeout_s);
  if (st < 0) return weft_core_error(task->comm, st, task->coll.call, "%s", task->comm->links.sink.msg);
  return WEFT_OK;
}

/* Device buffers worked on where they lie (the direct allreduce over CUDA
 * IPC) rather than staged: every rank decides alike from what all share (the
 * setting, the build's kernels, one host, shm to every peer), so they take the same algorithm;
 * whether every buffer can be mapped is the algorithm's first question,
 * and a no stages them after all (weft_coll_device_restage). */
static bool device_in_place_ok(const weft_coll_task *task) {
  return task->may_map_device && weft_settings()->cuda_ipc && weft_cuda_has_kernels() &&
         one_host_mapping(task->comm, WEFT_MEMORY_DEVICE);
}

/* Device buffers where they lie, over the device channel (verbs with
 * GPUDirect RDMA: coll.h, WEFT_ROUTE_DEVICE_CHANNEL): every rank decides alike
 * from what all published (core.h, device_channel_all), the build's
 * kernels, and the call's dtype and op (an integer avg sums in 64 bits on
 * the host: staged). */
static bool device_channel_ok(const weft_coll_task *task) {
  const weft_coll *coll = &task->coll;
  bool int_avg = coll->op == WEFT_AVG && coll->dtype != WEFT_F32 && coll->dtype != WEFT_F64 &&
                 coll->dtype != WEFT_F16 && coll->dtype != WEFT_BF16;
  bool hier = task->comm->device_channel_hier && (task->allreduce || task->broadcast) &&
              weft_settings()->cuda_ipc;
  return (task->comm->device_channel_all || hier) && weft_cuda_has_kernels() && !int_avg &&
         !task->device_restaging;
}

/* The route's setup: the algorithm (the host one, on the links of the
 * device channel) starts once the user's work queued on the buffers before
 * this call is done (the token on `in`, which device_channel_step polls
 * first); its copies and kernels then run on the communicator's stream, each
 * waited for before the next step (weft_cuda_sync_begin), and the
 * transport's copies too (the init args' device_stream). A `staged` record
 * with no host copy carries the token and the end's signal. */
static weft_status bounce_in(weft_coll_task *task, struct weft_coll_device *d, const weft_coll_span *span,
                             const void *send, void *recv);

static weft_status device_channel_in(weft_coll_task *task, struct weft_coll_device *d,
                                     const weft_coll_span *span, const void *send, void *recv) {
  weft_coll *coll = &task->coll;
  weft_status rc = weft_mem_device.stream_after_user(d->in, task->user_stream);
  if (rc) return weft_core_error(task->comm, rc, coll->call, "%s", task->comm->links.sink.msg);
  if (task->comm->device_channel_hier &&
      ((send && !weft_cuda_ipc_exportable(send)) || (recv && !weft_cuda_ipc_exportable(recv)))) {
    /* the hierarchical form maps the buffers within a host over CUDA IPC:
     * buffers without a legacy handle are bounced, as in place */
    rc = bounce_in(task, d, span, send, recv);
    if (rc) return weft_core_error(task->comm, rc, coll->call, "%s", task->comm->links.sink.msg);
  } else {
    struct weft_coll_staged *st = calloc(1, sizeof *st);
    if (!st) return staged_fail(task, WEFT_ERR_NOMEM, "no memory for a device call's record");
    st->block = -1;
    st->in_on = d->in;
    rc = weft_mem_device.record(d->in, &st->in);
    if (rc) {
      free(st);
      return weft_core_error(task->comm, rc, coll->call, "%s", task->comm->links.sink.msg);
    }
    task->staged = st;
    coll->ready = st->in;
  }
  weft_transport_init_args *a = task->comm->tp_args;
  if (a && !__atomic_load_n(&a->device_stream, __ATOMIC_ACQUIRE)) {
    /* before the channel's first connection; a peer's hello that came
     * earlier waits for it on the progress thread (transport.h) */
    a->device = d->ordinal;
    __atomic_store_n(&a->device_stream, d->stream, __ATOMIC_RELEASE);
  }
  coll->mem = &weft_mem_device;
  coll->scratch_mem = &weft_mem_device;
  coll->stream = d->stream;
  coll->ready_stream = d->in;
  ((weft_call_links *)(void *)task->link_ctx)->device = true;
  task->route = WEFT_ROUTE_DEVICE_CHANNEL;
  return WEFT_OK;
}

/* The communicator's device scratch for the call whose kernels are about to
 * be queued, grown when it needs more (WEFT_ALGO_NEED_SCRATCH). Taken then, by
 * the driver at the head of the queue, never at issue: calls run one at a
 * time and the direct rounds wait for their kernels before they end, so
 * only a failed call's work may still use the old block, and the growth
 * waits for everything queued before it frees it. (Taken at issue, a
 * pointer held by a call in flight was freed by a larger call issued after
 * it: gpu_check.sh's ResNet stage found it on the stand-in.) */
weft_status weft_coll_device_scratch(weft_coll_task *task) {
  weft_coll *coll = &task->coll;
  struct weft_coll_device *d = task->comm->device;
  size_t need = task->device_scratch_bytes;
  char why[256];
  if (!need) return WEFT_ERR_INTERNAL; /* asked by a call whose setup said it sums nothing */
  if (d->scratch_bytes < need || !d->scratch) { /* grown once for a step's largest call */
    weft_mem_token all = 0;
    weft_status st = weft_mem_device.record(d->stream, &all);
    if (!st) st = token_wait(task->comm, d->stream, all); /* nothing queued may still use the old block */
    if (st == WEFT_AGAIN) {
      snprintf(why, sizeof why,
               "earlier work on the communicator's stream did not complete in %.1f s "
               "(WEFT_TIMEOUT), so its device scratch could not be grown",
               task->comm->fail.timeout_s);
      coll->link.ops->set_error(coll->link.ctx, why);
      return WEFT_ERR_TIMEOUT;
    }
    if (st) {
      coll->link.ops->set_error(coll->link.ctx, task->comm->links.sink.msg);
      return st;
    }
    weft_mem_device.free_scratch(d->scratch);
    size_t grown = need < 4096 ? 4096 : need;
    d->scratch = weft_mem_device.alloc_scratch(grown);
    d->scratch_bytes = d->scratch ? grown : 0;
    if (!d->scratch) {
      snprintf(why, sizeof why, "no device memory for %zu bytes of scratch", grown);
      coll->link.ops->set_error(coll->link.ctx, why);
      return WEFT_ERR_NOMEM;
    }
  }
  coll->device_scratch = d->scratch;
  return WEFT_OK;
}

/* The direct algorithm found a buffer some rank cannot map: this rank's go
 * through host memory after all (every rank does the same), waited for
 * here, and the host algorithm runs on them (coll.c, direct_guard). */
weft_status weft_coll_device_restage(weft_coll_task *task) {
  weft_coll *coll = &task->coll;
  struct weft_coll_staged *st = task->staged;
  if (st && st->bounced) {
    /* staged from the user's own buffers, not from the bounce copy (whose
     * copy in is done: the rounds polled it before they began) */
    if (st->user_send) coll->sendbuf = st->user_send;
    if (st->user_recv) coll->recvbuf = st->user_recv;
    weft_coll_stage_release_copy(task);
  }
  task->may_map_device = false;
  task->route = WEFT_ROUTE_STAGED; /* set again by the staging below */
  task->device_restaging = true;   /* the input is ready: polled before the fall-back */
  coll->stream = coll->ready_stream = NULL;
  coll->ready = 0;
  coll->device_scratch = NULL;
  WEFT_INFO(WEFT_SUBSYS_COLL, "%s #%u: device buffers staged after all: a rank cannot map them",
            coll->call, coll->seq);
  return weft_coll_stage_in(task, &task->span, true);
}

static const char *kind_words(weft_memory kind) {
  return kind == WEFT_MEMORY_DEVICE ? "device memory" : "host memory";
}

/* The region a call's staged or bounced copy holds: in place, the spans
 * overlap and one region covering both keeps the offset between them; else
 * the two one after the other (the recv part at a 64-byte boundary). */
typedef struct stage_layout {
  size_t whole, send_at, recv_at;
  bool joined;
} stage_layout;

static stage_layout layout_of(const void *send, size_t send_bytes, const void *recv, size_t recv_bytes) {
  uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
  bool joined = send && recv && s < r + recv_bytes && r < s + send_bytes;
  stage_layout l = {.joined = joined};
  if (joined) {
    uintptr_t base = s < r ? s : r;
    l.whole = (s + send_bytes > r + recv_bytes ? s + send_bytes : r + recv_bytes) - base;
    l.send_at = s - base;
    l.recv_at = r - base;
  } else {
    l.send_at = 0;
    l.recv_at = (send_bytes + 63) & ~(size_t)63;
    l.whole = l.recv_at + recv_bytes;
  }
  return l;
}

/* The call's buffers have no legacy IPC handle (cuMemCreate's): its input
 * is copied, device to device on `in` after the user's earlier work, into
 * a block of the bounce pool, which peers can map; the call runs in place
 * over IPC on that block, and stage_queue_out copies the result back to
 * the user's buffer on the run stream. coll->ready is the copy's token. */
static weft_status bounce_in(weft_coll_task *task, struct weft_coll_device *d, const weft_coll_span *span,
                             const void *send, void *recv) {
  weft_coll *coll = &task->coll;
  size_t send_bytes = span->send_elems * coll->elem, recv_bytes = span->recv_elems * coll->elem;
  stage_layout l = layout_of(send, send_bytes, recv, recv_bytes);
  struct weft_coll_staged *st = calloc(1, sizeof *st);
  int block = -1;
  char *copy = st ? bounce_take(d, l.whole, &block) : NULL;
  if (!copy) {
    free(st);
    return staged_fail(task, WEFT_ERR_NOMEM, "no device memory for a %zu-byte copy of buffers without a legacy "
                       "IPC handle", l.whole);
  }
  {
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
      WEFT_INFO(WEFT_SUBSYS_COLL, "%s #%u: device buffers without a legacy IPC handle (cuMemCreate memory: "
                "PyTorch's expandable segments, cudaMallocAsync pools) are copied into device memory "
                "the peers can map, worked on there, and copied back (said once)", coll->call, coll->seq);
  }
  st->bounced = true;
  st->block = block;
  if (block < 0) {
    st->own = copy;
    st->own_bytes = l.whole;
  }
  st->user_send = send;
  st->user_recv = recv;
  st->host_recv = recv ? copy + l.recv_at : NULL;
  st->recv_bytes = recv_bytes;
  st->in_on = d->in;
  task->staged = st;
  weft_status rc = send ? weft_mem_device.copy_async(copy + l.send_at, send, send_bytes, d->in, &st->in)
                        : WEFT_OK;
  if (!rc && !st->in) rc = weft_mem_device.record(d->in, &st->in);
  if (rc) {
    weft_coll_stage_release_copy(task);
    return rc;
  }
  coll->ready = st->in;
  if (send) coll->sendbuf = copy + l.send_at;
  if (recv) coll->recvbuf = copy + l.recv_at;
  return WEFT_OK;
}

weft_status weft_coll_stage_in(weft_coll_task *task, const weft_coll_span *span, bool now) {
  weft_coll *coll = &task->coll;
  if (coll->count == 0) return WEFT_OK;
  const void *send = span->send_elems ? coll->sendbuf : NULL;
  void *recv = span->recv_elems ? coll->recvbuf : NULL;
  int send_dev = -1, recv_dev = -1;
  weft_memory sk = send ? weft_mem_kind_of(send, &send_dev) : WEFT_MEMORY_COUNT;
  weft_memory rk = recv ? weft_mem_kind_of(recv, &recv_dev) : WEFT_MEMORY_COUNT;
  if (sk != WEFT_MEMORY_DEVICE && rk != WEFT_MEMORY_DEVICE) return WEFT_OK;
  if (send && recv && sk != rk)
    return staged_fail(task, WEFT_ERR_INVALID,
                       "sendbuf is %s and recvbuf %s: pass both in device memory or both in host "
                       "memory",
                       kind_words(sk), kind_words(rk));
  if (send && recv && send_dev != recv_dev)
    return staged_fail(task, WEFT_ERR_INVALID, "sendbuf is on GPU %d and recvbuf on GPU %d",
                       send_dev, recv_dev);
  int ordinal = send ? send_dev : recv_dev;
  /* weft.h: a NULL stream is the legacy stream of the device's primary
   * context; in a context of the caller's own it would be another stream,
   * which nothing here orders the call after (checked only then: a stream
   * of such a context is refused by the driver when weft records on it) */
  if (!task->user_stream && weft_cuda_caller_context_foreign(ordinal))
    return staged_fail(task, WEFT_ERR_INVALID,
                       "the calling thread's current CUDA context is no device's primary context "
                       "(one made with cuCtxCreate?) and the communicator's stream is NULL: weft orders "
                       "its work after the legacy stream of GPU %d's primary context (the runtime API's, "
                       "PyTorch's); make a primary context current (cuDevicePrimaryCtxRetain, "
                       "cuCtxSetCurrent), or pass a stream of GPU %d's with weft_comm_set_stream",
                       ordinal, ordinal);
  struct weft_coll_device *d = NULL;
  WEFT_CHECK(device_state(task, ordinal, &d));
  if (!now && device_channel_ok(task)) return device_channel_in(task, d, span, send, recv);
  if (!now && device_in_place_ok(task)) {
    /* the buffers stay where they are; the algorithm starts once the
     * user's work queued on them before this call is done (the token on
     * `in`, polled by the direct rounds before anything else); buffers the
     * peers cannot map are bounced: the call works on a copy they can */
    weft_status rc = weft_mem_device.stream_after_user(d->in, task->user_stream);
    if (!rc && ((send && !weft_cuda_ipc_exportable(send)) || (recv && !weft_cuda_ipc_exportable(recv))))
      rc = bounce_in(task, d, span, send, recv);
    else if (!rc)
      rc = weft_mem_device.record(d->in, &coll->ready);
    if (rc) return weft_core_error(task->comm, rc, coll->call, "%s", task->comm->links.sink.msg);
    coll->device_scratch = NULL; /* taken when its kernels are queued (weft_coll_device_scratch) */
    coll->mem = &weft_mem_device;
    coll->ready_stream = d->in;
    coll->stream = d->stream;
    task->route = WEFT_ROUTE_IN_PLACE;
    return WEFT_OK;
  }
  size_t send_bytes = span->send_elems * coll->elem, recv_bytes = span->recv_elems * coll->elem;
  stage_layout l = layout_of(send, send_bytes, recv, recv_bytes);
  size_t whole = l.whole;
  struct weft_coll_staged *st = calloc(1, sizeof *st);
  int block = -1;
  void *host = st ? stage_take(d, whole, &block) : NULL;
  if (!host) {
    free(st);
    return staged_fail(task, WEFT_ERR_NOMEM,
                       "no pinned host memory for staging %zu bytes of device buffers", whole);
  }
  st->block = block;
  if (block < 0) {
    st->own = host;
    st->own_bytes = whole;
  }
  char *host_send = (char *)host + l.send_at;
  char *host_recv = (char *)host + l.recv_at;
  st->user_recv = recv;
  st->host_recv = recv ? host_recv : NULL;
  st->recv_bytes = recv_bytes;
  task->staged = st;
  st->in_on = task->device_restaging ? d->stream : d->in;
  /* a call staged after all, as it runs, waited for the user's work already
   * (its input token); waiting again would take in the user's work queued
   * since, which may wait for this very call's signal */
  weft_status rc = task->device_restaging
                       ? WEFT_OK
                       : weft_mem_device.stream_after_user(d->in, task->user_stream);
  size_t slice = weft_settings()->device_slice_bytes;
  /* slices: a collective whose buffers each hold count elements on every
   * rank where it has them (allreduce, broadcast, reduce: the setup says
   * so with slice_start), so every rank cuts alike from the count alone */
  if (!rc && !now && task->slice_start && (!l.joined || l.send_at == l.recv_at) && slice &&
      coll->count * coll->elem >= 2 * slice) {
    /* at most 64 slices, each a whole number of elements */
    size_t elems = coll->count, per = (slice + coll->elem - 1) / coll->elem;
    if ((elems + per - 1) / per > 64) per = (elems + 63) / 64;
    st->nslices = (int)((elems + per - 1) / per);
    st->slice_elems = per;
    st->count = coll->count;
    st->host_send = send ? host_send : NULL;
    st->slice_in = calloc((size_t)st->nslices, sizeof *st->slice_in);
    st->spent = calloc(3 * (size_t)st->nslices, sizeof *st->spent);
    if (!st->slice_in || !st->spent) rc = WEFT_ERR_NOMEM;
    for (int k = 0; !rc && send && k < st->nslices; k++) {
      size_t off = (size_t)k * per, n = elems - off < per ? elems - off : per;
      rc = weft_mem_device.copy_to_host(host_send + off * coll->elem, (const char *)send + off * coll->elem,
                                        n * coll->elem, st->in_on, &st->slice_in[k]);
    }
    st->in = st->nslices ? st->slice_in[st->nslices - 1] : 0;
  } else if (!rc && send) {
    rc = weft_mem_device.copy_to_host(host_send, send, send_bytes, st->in_on, &st->in);
  }
  /* no input to copy (a broadcast's non-root): the token still marks the
   * user's earlier work done, which the copy back of the result, queued on
   * the other stream, must follow (the user may have written or read the
   * buffer just before) */
  if (!rc && !st->in) rc = weft_mem_device.record(st->in_on, &st->in);
  if (rc) {
    weft_coll_stage_release(task);
    return weft_core_error(task->comm, rc, coll->call, "%s", task->comm->links.sink.msg);
  }
  if (send) coll->sendbuf = host_send;
  if (recv) coll->recvbuf = host_recv;
  coll->mem = &weft_mem_host;
  task->route = st->nslices ? WEFT_ROUTE_SLICED : WEFT_ROUTE_STAGED;
  if (now) {
    rc = stage_wait(task, st->in_on, st->in);
    if (rc) weft_coll_stage_release(task);
  }
  return rc;
}

/* ---- the user's stream and the end of a call ---------------------------------- */

/* Queued on `stream` once the call's last work is: the signal the user's
 * stream waits on (weft_coll_device_issue) reaches this call's value. Once
 * per call, on success and on failure alike (a stream left waiting would
 * hang the user's GPU work for good); never backwards, so a later call's
 * value, already written, stands. */
static weft_status device_signal_end(weft_coll_task *task) {
  uint32_t v = task->device_signal;
  if (!v) return WEFT_OK; /* first: a p2p request's task has no communicator set */
  struct weft_coll_device *d = task->comm->device;
  task->device_signal = 0;
  weft_status rc = WEFT_OK;
  pthread_mutex_lock(&d->lock);
  if ((int32_t)(v - d->signaled) > 0) {
    rc = weft_mem_device.signal(d->stream, v);
    if (!rc) d->signaled = v;
  }
  pthread_mutex_unlock(&d->lock);
  return rc;
}

weft_status weft_coll_device_issue(weft_coll_task *task) {
  struct weft_coll_device *d = task->comm->device;
  if (!d || task->route == WEFT_ROUTE_HOST) return WEFT_OK;
  pthread_mutex_lock(&d->lock);
  uint32_t v = ++d->issued;
  if (!v) v = ++d->issued; /* 0 means "none" in a task */
  /* deferred (a gradient set's bucket): the user's stream waits later, at
   * the set's wait, for this value or a later one; the word must exist
   * before this call's signal is queued, or the signal writes nothing */
  weft_status rc = task->defer_user_link ? weft_cuda_signal_prepare(d->stream)
                                         : weft_mem_device.user_wait_signal(task->user_stream, d->stream, v);
  pthread_mutex_unlock(&d->lock);
  if (rc) return weft_core_error(task->comm, rc, task->coll.call, "%s", task->comm->links.sink.msg);
  task->device_signal = v;
  return WEFT_OK;
}

weft_status weft_coll_device_stream_wait(weft_core *core, void *stream, uint32_t signal) {
  struct weft_coll_device *d = core->device;
  if (!d || !signal) return WEFT_OK; /* no device call issued: nothing to wait for */
  pthread_mutex_lock(&d->lock);
  weft_status rc = weft_mem_device.user_wait_signal(stream, d->stream, signal);
  pthread_mutex_unlock(&d->lock);
  if (rc) return weft_core_error(core, rc, "a stream's wait for device calls", "%s", core->links.sink.msg);
  return WEFT_OK;
}

/* ---- a message's device buffer (p2p.c) ------------------------------------------ */

/* A send's or receive's device buffer, staged through a block of the
 * communicator's pinned pool (coll_device.h). */
struct weft_device_msg {
  void *user;     /* the device buffer */
  void *host;     /* its staged copy (NULL: a send lent over IPC, never staged) */
  size_t bytes;
  bool is_send;
  bool direct;    /* a receive whose data came straight from the peer's buffer (IPC) */
  int block;      /* in the pool, or -1: `own` */
  void *own;
  weft_mem_token in, out;
  bool out_queued;
};

weft_status weft_coll_device_msg_begin(weft_core *core, const char *call, const void *buf, size_t bytes,
                                       bool is_send, bool now, bool lend, weft_device_msg **out) {
  *out = NULL;
  int ordinal = 0;
  weft_mem_kind_of(buf, &ordinal);
  if (!core->user_stream && weft_cuda_caller_context_foreign(ordinal))
    return weft_core_error(core, WEFT_ERR_INVALID, call,
                           "the calling thread's current CUDA context is no device's primary context and "
                           "the communicator's stream is NULL: weft orders its work after the legacy "
                           "stream of GPU %d's primary context (weft_comm_set_stream)",
                           ordinal);
  struct weft_coll_device *d;
  WEFT_CHECK(device_state_of(core, call, ordinal, &d));
  weft_device_msg *m = calloc(1, sizeof *m);
  if (!m) return weft_core_error(core, WEFT_ERR_NOMEM, call, "no memory");
  *m = (weft_device_msg){.user = (void *)buf, .bytes = bytes, .is_send = is_send, .block = -1};
  m->host = lend ? NULL : stage_take(d, bytes, &m->block); /* a lent send is never staged */
  if (!m->host && !lend) {
    free(m);
    return weft_core_error(core, WEFT_ERR_NOMEM, call, "no pinned host memory for staging %zu bytes of a "
                           "device buffer", bytes);
  }
  if (m->block < 0) m->own = m->host;
  /* after the work queued on the stream so far: a send copies the buffer
   * out then; a receive writes it back only after it (the token) */
  weft_status rc = weft_mem_device.stream_after_user(d->in, core->user_stream);
  if (!rc && is_send && !lend) rc = weft_mem_device.copy_to_host(m->host, buf, bytes, d->in, &m->in);
  if (!rc && !m->in) rc = weft_mem_device.record(d->in, &m->in);
  if (!rc && now && (rc = token_wait(core, d->in, m->in)) == WEFT_AGAIN)
    rc = WEFT_ERR_TIMEOUT;
  *out = m; /* weft_coll_device_msg_end gives it back, failed or not */
  if (rc == WEFT_ERR_TIMEOUT)
    return weft_core_error(core, rc, call, "the stream's earlier work did not complete in %.1f s (WEFT_TIMEOUT)",
                           core->fail.timeout_s);
  if (rc) return weft_core_error(core, rc, call, "%s", core->links.sink.msg);
  return WEFT_OK;
}

void *weft_coll_device_msg_host(const weft_device_msg *m) {
  return m->host;
}

weft_status weft_coll_device_msg_ready(weft_core *core, weft_device_msg *m) {
  return weft_mem_device.poll(core->device->in, m->in);
}

bool weft_coll_device_msg_lendable(const weft_core *core, int peer, const void *buf, size_t bytes) {
  /* a transport that maps a peer's device memory joins ranks of one host
   * only (shm); it must also say when the peer released a chunk */
  if (!weft_settings()->cuda_ipc || peer == core->rank || bytes < WEFT_DEVICE_MSG_LEND_CHUNKS * core->chunk_bytes)
    return false;
  int tp = core->links.peers[peer].tp;
  if (tp < 0) return false;
  const weft_transport *ops = core->links.tps[tp].ops;
  return (ops->caps.map_kinds & WEFT_MEMORY_BIT(WEFT_MEMORY_DEVICE)) && ops->send_released &&
         weft_cuda_ipc_exportable(buf);
}

bool weft_coll_device_msg_describe(const weft_device_msg *m, weft_mem_desc *desc) {
  return weft_mem_device.describe(m->user, m->bytes, desc);
}

weft_status weft_coll_device_msg_take(weft_core *core, const char *call, weft_device_msg *m, void *dst,
                                      const void *peer_buf, size_t bytes) {
  int ordinal = 0;
  weft_mem_kind_of(peer_buf, &ordinal);
  struct weft_coll_device *d;
  WEFT_CHECK(device_state_of(core, call, ordinal, &d));
  weft_mem_token t = 0;
  weft_status rc = WEFT_OK;
  if (m) {
    /* into the receive's device buffer, after the stream's earlier work on it */
    rc = token_wait(core, d->in, m->in);
    if (!rc) rc = weft_mem_device.copy_async(m->user, peer_buf, bytes, d->stream, &t);
  } else { /* into host memory: an unexpected message's buffer, a host receive */
    rc = weft_mem_device.copy_to_host(dst, peer_buf, bytes, d->stream, &t);
  }
  if (!rc) rc = token_wait(core, d->stream, t);
  if (!rc && m) m->direct = true;
  if (rc == WEFT_AGAIN)
    return weft_core_error(core, WEFT_ERR_TIMEOUT, call,
                           "the copy out of the peer's device buffer did not complete in %.1f s (WEFT_TIMEOUT)",
                           core->fail.timeout_s);
  if (rc) return weft_core_error(core, rc, call, "%s", core->links.sink.msg);
  return WEFT_OK;
}

weft_status weft_coll_device_msg_finish(weft_core *core, const char *call, weft_device_msg *m) {
  struct weft_coll_device *d = core->device;
  if (m->is_send || m->direct) return WEFT_OK; /* a direct receive's data is in place already */
  /* the stream's earlier work first (the buffer may be read there), then
   * the copy back, waited for: the receive completes with it in place */
  weft_status rc = token_wait(core, d->in, m->in);
  if (!rc && !m->out_queued) {
    rc = weft_mem_device.copy_from_host(m->user, m->host, m->bytes, d->stream, &m->out);
    m->out_queued = rc == WEFT_OK;
  }
  if (!rc) rc = token_wait(core, d->stream, m->out);
  if (rc == WEFT_AGAIN)
    return weft_core_error(core, WEFT_ERR_TIMEOUT, call,
                           "the copy of the message into the device buffer did not complete in %.1f s "
                           "(WEFT_TIMEOUT)",
                           core->fail.timeout_s);
  if (rc) return weft_core_error(core, rc, call, "%s", core->links.sink.msg);
  return WEFT_OK;
}

void weft_coll_device_msg_end(weft_core *core, weft_device_msg *m) {
  if (!m) return;
  struct weft_coll_device *d = core->device;
  weft_mem_token in = m->in, out = m->out_queued ? m->out : 0;
  if (in && weft_mem_device.poll(d->in, in) == WEFT_OK) in = 0;
  if (out && weft_mem_device.poll(d->stream, out) == WEFT_OK) out = 0;
  if (m->block >= 0) {
    pthread_mutex_lock(&d->lock);
    d->pool[m->block].until_in = in;
    d->pool[m->block].until_in_on = d->in;
    d->pool[m->block].until_out = out;
    d->pool[m->block].busy = false;
    pthread_mutex_unlock(&d->lock);
  } else if (m->own) {
    token_wait(core, d->in, in);
    token_wait(core, d->stream, out);
    weft_mem_device.free_slots(m->own, m->bytes);
  }
  free(m);
}

/* ---- in slices ---------------------------------------------------------------- */

/* The call's advance while it runs in slices: slice k starts once its copy
 * to the host is done, its result is copied back once its algorithm is,
 * then slice k + 1. Every rank cuts alike (the count, the dtype and the
 * setting agree), and chunks of one connection stay in order, so each
 * slice's algorithm takes exactly its own chunks although all share the
 * call's tag. */
static weft_status sliced_advance(weft_coll *coll) {
  weft_coll_task *task = weft_coll_task_of(coll);
  struct weft_coll_staged *st = task->staged;
  weft_mem_stream *s = task->comm->device->stream;
  for (;;) {
    if (!st->running) {
      if (st->next == st->nslices) {
        /* the whole call again, for its sentences and the recorder; the
         * results are on their way back: stage_out waits for the last */
        coll->count = st->count;
        coll->sendbuf = st->host_send;
        coll->recvbuf = (char *)st->host_recv;
        WEFT_CHECK(device_signal_end(task));
        st->out_queued = true;
        return WEFT_OK;
      }
      weft_mem_token input = st->host_send ? st->slice_in[st->next] : st->in;
      WEFT_STEP(weft_mem_device.poll(st->in_on, input));
      size_t off = (size_t)st->next * st->slice_elems;
      coll->count = st->count - off < st->slice_elems ? st->count - off : st->slice_elems;
      /* a buffer this rank does not have stays NULL (a broadcast's
       * non-root sends nothing, a reduce's non-root receives nothing) */
      coll->sendbuf = st->host_send ? st->host_send + off * coll->elem : NULL;
      coll->recvbuf = st->host_recv ? (char *)st->host_recv + off * coll->elem : NULL;
      /* what the last slice's algorithm held; its scratch is kept until
       * the call ends (spent) */
      if (coll->cleanup) coll->cleanup(coll);
      coll->cleanup = NULL;
      void *held[3] = {coll->scratch, coll->handed_over_scratch[0], coll->handed_over_scratch[1]};
      for (int i = 0; i < 3; i++)
        if (held[i]) st->spent[st->nspent++] = held[i];
      coll->scratch = coll->handed_over_scratch[0] = coll->handed_over_scratch[1] = NULL;
      WEFT_CHECK(task->slice_start(coll));
      st->inner = coll->advance;
      coll->advance = sliced_advance;
      st->running = true;
    }
    weft_status rc = st->inner(coll);
    if (coll->advance != sliced_advance) { /* the algorithm handed over (direct to ring) */
      st->inner = coll->advance;
      coll->advance = sliced_advance;
    }
    if (rc != WEFT_OK) return rc;
    size_t off = (size_t)st->next * st->slice_elems;
    if (st->user_recv)
      WEFT_CHECK(weft_mem_device.copy_from_host((char *)st->user_recv + off * coll->elem,
                                                (char *)st->host_recv + off * coll->elem,
                                                coll->count * coll->elem, s, &st->out));
    st->running = false;
    st->next++;
  }
}

weft_status weft_coll_stage_slices_start(weft_coll_task *task) {
  task->coll.advance = sliced_advance;
  task->coll.algo = "in slices";
  return WEFT_OK;
}

static weft_status staged_first_step(weft_coll *coll) {
  weft_coll_task *task = weft_coll_task_of(coll);
  WEFT_STEP(weft_mem_device.poll(task->staged->in_on, task->staged->in));
  coll->advance = task->staged->then;
  return coll->advance(coll);
}

/* The device channel's steps: the user's earlier work first, then the
 * algorithm with the device table's synchronous members on the
 * communicator's stream; an error of theirs fails the call. An algorithm
 * that hands over to another advance (the direct rounds' fall-back) is
 * followed. */
static weft_status device_channel_step(weft_coll *coll) {
  weft_coll_task *task = weft_coll_task_of(coll);
  struct weft_coll_staged *st = task->staged;
  if (st->in) {
    WEFT_STEP(weft_mem_device.poll(st->in_on, st->in));
    st->in = 0;
  }
  weft_cuda_sync_begin(task->comm->device->stream);
  weft_status rc = st->then(coll);
  weft_status sync = weft_cuda_sync_end();
  if (coll->advance != device_channel_step) {
    st->then = coll->advance;
    coll->advance = device_channel_step;
  }
  if (sync < 0) {
    coll->link.ops->set_error(coll->link.ctx, task->comm->links.sink.msg);
    return sync;
  }
  return rc;
}

void weft_coll_stage_wrap(weft_coll_task *task) {
  if (!task->staged || task->staged->nslices) return; /* in slices: each waits for its own */
  task->staged->then = task->coll.advance;
  task->coll.advance =
      task->route == WEFT_ROUTE_DEVICE_CHANNEL ? device_channel_step : staged_first_step;
}

static weft_status stage_queue_out(weft_coll_task *task) {
  struct weft_coll_staged *st = task->staged;
  weft_mem_stream *s = task->comm->device->stream;
  if (st->out_queued) return WEFT_OK;
  weft_status rc = WEFT_OK;
  if (st->user_recv && st->bounced)
    rc = weft_mem_device.copy_async(st->user_recv, st->host_recv, st->recv_bytes, s, &st->out);
  else if (st->user_recv)
    rc = weft_mem_device.copy_from_host(st->user_recv, st->host_recv, st->recv_bytes, s, &st->out);
  if (!rc) rc = device_signal_end(task);
  if (rc) return rc;
  st->out_queued = true;
  return WEFT_OK;
}

weft_status weft_coll_stage_out(weft_coll_task *task) {
  if (!task->staged) return WEFT_OK;
  WEFT_CHECK(stage_queue_out(task));
  return weft_mem_device.poll(task->comm->device->stream, task->staged->out);
}

weft_status weft_coll_stage_out_now(weft_coll_task *task) {
  if (!task->staged) return WEFT_OK;
  weft_status rc = stage_queue_out(task);
  if (rc) return weft_core_error(task->comm, rc, task->coll.call, "%s", task->comm->links.sink.msg);
  return stage_wait(task, task->comm->device->stream, task->staged->out);
}

void weft_coll_stage_release(weft_coll_task *task) {
  device_signal_end(task); /* a call that failed: the user's stream goes on */
  /* a call over IPC that failed part-way may still map the peers' lent
   * buffers (the done round closes them on success): closed here, as the
   * call ends, not at the next call or the destroy */
  if (task->route == WEFT_ROUTE_IN_PLACE || task->route == WEFT_ROUTE_DEVICE_CHANNEL)
    weft_peer_table_release_mem(&task->comm->links, task->comm->size, false);
  weft_coll_stage_release_copy(task);
}

void weft_coll_stage_release_copy(weft_coll_task *task) {
  struct weft_coll_staged *st = task->staged;
  if (!st) return;
  struct weft_coll_device *d = task->comm->device;
  stage_block *pool = st->bounced ? d->bounce : d->pool;
  /* a call that failed may leave a copy in flight on the buffer (to the
   * host on `in`, back on `stream`): the pool hands it out again only once
   * both are done */
  weft_mem_token in = st->in, out = st->out_queued ? st->out : 0;
  if (in && weft_mem_device.poll(st->in_on, in) == WEFT_OK) in = 0;
  if (out && weft_mem_device.poll(d->stream, out) == WEFT_OK) out = 0;
  if (st->block >= 0) {
    pthread_mutex_lock(&d->lock);
    pool[st->block].until_in = in;
    pool[st->block].until_in_on = st->in_on;
    pool[st->block].until_out = out;
    pool[st->block].busy = false; /* last: a taker reads the tokens after it */
    pthread_mutex_unlock(&d->lock);
  } else if (st->own) {
    token_wait(task->comm, st->in_on, in);
    token_wait(task->comm, d->stream, out);
    if (st->bounced)
      weft_mem_device.free_scratch(st->own);
    else
      weft_mem_device.free_slots(st->own, st->own_bytes);
  }
  if (task->route == WEFT_ROUTE_DEVICE_CHANNEL && !st->bounced) {
    /* a call that failed may leave the transport's copy into the user's
     * buffer queued: done before the buffer is the user's again */
    weft_mem_token all = 0;
    if (!weft_mem_device.record(d->stream, &all)) token_wait(task->comm, d->stream, all);
  }
  for (int i = 0; i < st->nspent; i++) weft_coll_scratch_free(&task->coll, st->spent[i]);
  free(st->spent);
  free(st->slice_in);
  free(st);
  task->staged = NULL;
}

void weft_coll_device_free(weft_core *core) {
  struct weft_coll_device *d = core->device;
  if (!d) return;
  /* every call ended: a user's stream still waiting on a value (a call
   * whose end signalled nothing, were there one) goes on */
  if (d->signaled != d->issued) weft_mem_device.signal(d->stream, d->issued);
  /* the buffers go while the streams still hold the device's context, once
   * nothing queued uses them; where the GPU does not finish that within the
   * timeout they stay (freed memory under a running copy is worse) */
  weft_mem_token in_done = 0, run_done = 0;
  bool idle = !weft_mem_device.record(d->in, &in_done) && !weft_mem_device.record(d->stream, &run_done) &&
              token_wait(core, d->in, in_done) == WEFT_OK && token_wait(core, d->stream, run_done) == WEFT_OK;
  if (idle) {
    weft_mem_device.free_scratch(d->scratch);
    for (int i = 0; i < STAGE_POOL; i++) stage_block_free(&d->pool[i]);
    for (int i = 0; i < STAGE_POOL; i++) bounce_block_free(&d->bounce[i]);
  } else {
    WEFT_WARN(WEFT_SUBSYS_COLL, "device work of the communicator did not finish within %.1f s at its "
              "destroy: its staging and scratch buffers stay allocated", core->fail.timeout_s);
  }
  weft_cuda_stream_destroy(d->in);     /* each waits for what it queued; */
  weft_cuda_stream_destroy(d->stream); /* this one frees the signal once the user's passed it */
  pthread_mutex_destroy(&d->lock);
  free(d);
  core->device = NULL;
}

#else /* no CUDA in this build: every buffer is host memory */

weft_status weft_coll_stage_in(weft_coll_task *task, const weft_coll_span *span, bool now) {
  (void)task, (void)span, (void)now;
  return WEFT_OK;
}
void weft_coll_stage_wrap(weft_coll_task *task) {
  (void)task;
}
weft_status weft_coll_stage_out(weft_coll_task *task) {
  (void)task;
  return WEFT_OK;
}
weft_status weft_coll_stage_out_now(weft_coll_task *task) {
  (void)task;
  return WEFT_OK;
}
weft_status weft_coll_device_issue(weft_coll_task *task) {
  (void)task;
  return WEFT_OK;
}
void weft_coll_stage_release(weft_coll_task *task) {
  (void)task;
}
void weft_coll_stage_release_copy(weft_coll_task *task) {
  (void)task;
}
weft_status weft_coll_device_scratch(weft_coll_task *task) {
  (void)task;
  return WEFT_ERR_INTERNAL;
}
weft_status weft_coll_device_restage(weft_coll_task *task) {
  (void)task;
  return WEFT_ERR_INTERNAL;
}
weft_status weft_coll_stage_slices_start(weft_coll_task *task) {
  (void)task;
  return WEFT_ERR_INTERNAL;
}
void weft_coll_device_free(weft_core *core) {
  (void)core;
}
weft_status weft_coll_device_stream_wait(weft_core *core, void *stream, uint32_t signal) {
  (void)core, (void)stream, (void)signal;
  return WEFT_OK;
}
weft_status weft_coll_device_msg_begin(weft_core *core, const char *call, const void *buf, size_t bytes,
                                       bool is_send, bool now, bool lend, weft_device_msg **out) {
  (void)buf, (void)bytes, (void)is_send, (void)now, (void)lend;
  *out = NULL;
  return weft_core_error(core, WEFT_ERR_INTERNAL, call, "device memory in a build without CUDA");
}
void *weft_coll_device_msg_host(const weft_device_msg *m) {
  (void)m;
  return NULL;
}
weft_status weft_coll_device_msg_ready(weft_core *core, weft_device_msg *m) {
  (void)core, (void)m;
  return WEFT_OK;
}
weft_status weft_coll_device_msg_finish(weft_core *core, const char *call, weft_device_msg *m) {
  (void)core, (void)call, (void)m;
  return WEFT_OK;
}
void weft_coll_device_msg_end(weft_core *core, weft_device_msg *m) {
  (void)core, (void)m;
}
bool weft_coll_device_msg_lendable(const weft_core *core, int peer, const void *buf, size_t bytes) {
  (void)core, (void)peer, (void)buf, (void)bytes;
  return false;
}
bool weft_coll_device_msg_describe(const weft_device_msg *m, weft_mem_desc *desc) {
  (void)m, (void)desc;
  return false;
}
weft_status weft_coll_device_msg_take(weft_core *core, const char *call, weft_device_msg *m, void *dst,
                                      const void *peer_buf, size_t bytes) {
  (void)m, (void)dst, (void)peer_buf, (void)bytes;
  return weft_core_error(core, WEFT_ERR_INTERNAL, call, "device memory in a build without CUDA");
}

#endif
