/* shm_transport.c - the shared-memory transport's table, per-communicator
 * state, reachability (same host, same /dev/shm, same pid namespace, and
 * room in /dev/shm for every pair of local ranks), sleeping and aborting.
 * The data path is in shm_conn.c, single copy's policy in shm_cma.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "transports/shm/shm_settings.h"
#include "src/base/status.h"

#define SHM_ADDR_MAGIC 0x5745534au
#define SHM_WAIT_SLICE_MS 5      /* bounds abort latency and dead-peer notice */
#define SHM_LIVENESS_PERIOD 0.01 /* seconds between pidfd checks while busy */
#define SHM_CLOCK_ROUNDS 32      /* progress calls between looks at the clock */

/* Free bytes of /dev/shm, 0 when it is not there or not usable. */
static uint64_t shm_dev_free(void) {
  struct statvfs vfs;
  return statvfs("/dev/shm", &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : 0;
}

static weft_status shm_probe(char *why, size_t why_len) {
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs)) {
    snprintf(why, why_len, "/dev/shm: %s", strerror(errno));
    return WEFT_ERR_UNSUPPORTED;
  }
  uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  uint64_t size = (uint64_t)vfs.f_blocks * vfs.f_frsize;
  if (access("/dev/shm", W_OK | X_OK)) {
    snprintf(why, why_len, "/dev/shm is not writable here: %s", strerror(errno));
    return WEFT_ERR_UNSUPPORTED;
  }
  long long slots = shm_settings()->slots;
  int at = snprintf(why, why_len,
                    "/dev/shm %llu MiB, %llu MiB free; WEFT_SHM_SLOTS=%lld; WEFT_SHM_CMA=%s",
                    (unsigned long long)(size >> 20), (unsigned long long)(free_bytes >> 20),
                    slots, shm_setting_str(SHM_SETTING_SHM_CMA));
  /* what auto will decide, for weft-info (timed here: a probe has no context) */
  shm_cma_timing timing = {0};
  double ratio = shm_settings()->cma == WEFT_SHM_CMA_AUTO ? shm_cma_cost_ratio(&timing) : 0;
  if (ratio > 0 && at > 0 && (size_t)at < why_len)
    snprintf(why + at, why_len - (size_t)at, " (process_vm_readv costs %.1fx a memcpy here: %s)",
             ratio, shm_cma_ratio_pays(ratio) ? "single copy" : "two copies");
  if (free_bytes == 0) return WEFT_ERR_UNSUPPORTED;
  return WEFT_OK;
}

static weft_status shm_init(const weft_transport_init_args *args, weft_tp_ctx **out,
                            void *addr, size_t *addr_len) {
  if (!args->place) {
    weft_error_sink_set(args->errors, "shm: no place information");
    return WEFT_ERR_UNSUPPORTED;
  }
  shm_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return WEFT_ERR_NOMEM;
  ctx->conns = calloc((size_t)args->size * WEFT_TP_CHANNELS, sizeof *ctx->conns);
  ctx->reachable = calloc((size_t)args->size, sizeof *ctx->reachable);
  if (!ctx->conns || !ctx->reachable) {
    free(ctx->conns);
    free(ctx->reachable);
    free(ctx);
    return WEFT_ERR_NOMEM;
  }
  ctx->args = args;
  long long slots = shm_settings()->slots;
  ctx->nslots = slots < 2 ? 2 : slots > SHM_MAX_SLOTS ? SHM_MAX_SLOTS : (int)slots;
  ctx->cma_mode = shm_settings()->cma;
  ctx->cma_min_bytes = shm_settings()->cma_min_bytes;
  /* Only where the sender's core is free to copy (shm_stream_through_slots):
   * where ranks outnumber the cores and single copy pays, it is also the
   * one that costs less CPU. */
  bool streams_split = ctx->cma_mode == WEFT_SHM_CMA_AUTO && !shm_ranks_outnumber_cores(args, NULL);
  ctx->cma_stream_bytes = streams_split ? shm_settings()->cma_stream_bytes : 0;
  if (ctx->cma_mode != WEFT_SHM_CMA_OFF) shm_cma_allow_readers();
  ctx->self.magic = SHM_ADDR_MAGIC;
  ctx->self.pid = (uint32_t)getpid();
  ctx->self.place = *args->place;
  ctx->self.shm_free = shm_dev_free();
  if (ctx->self.shm_free == 0) ctx->self.place.shm_ns = 0; /* no usable /dev/shm */
  memcpy(addr, &ctx->self, sizeof ctx->self);
  *addr_len = sizeof ctx->self;
  *out = (weft_tp_ctx *)ctx;
  return WEFT_OK;
}

/* Cells, not slots: a chunk by address or inline takes no slot (shm.h). */
static int shm_send_depth(const weft_tp_ctx *ctx) {
  (void)ctx;
  return SHM_CELLS;
}

/* Peers' addresses arrive packed at any alignment: copy before reading. */
weft_status shm_addr_parse(const uint8_t *buf, size_t len, shm_addr *out) {
  if (len != sizeof *out) return WEFT_ERR_PROTOCOL;
  memcpy(out, buf, sizeof *out);
  return out->magic == SHM_ADDR_MAGIC ? WEFT_OK : WEFT_ERR_PROTOCOL;
}

static bool shm_addr_read(const void *blob, size_t len, shm_addr *out) {
  return shm_addr_parse(blob, len, out) == WEFT_OK;
}

static bool shm_can_reach(weft_tp_ctx *tctx, int peer, const void *peer_addr, size_t addr_len,
                          char *why, size_t why_len) {
  shm_ctx *ctx = shm_ctx_of(tctx);
  shm_addr peer_copy;
  const shm_addr *pa = &peer_copy;
  if (!shm_addr_read(peer_addr, addr_len, &peer_copy)) {
    snprintf(why, why_len, "shm: the peer published no shared-memory address");
    return false;
  }
  if (!weft_select_shm_reaches(&ctx->self.place, &pa->place, why, why_len)) return false;
  /* Room for every pair of ranks on this host, judged from what both ranks
   * published, so both ends of a pair decide alike. Counted for every
   * channel: a pair's second segment (p2p) is made when a message first
   * goes between them, and the room for it must be there then too. */
  uint64_t pairs = (uint64_t)ctx->args->local_size * (uint64_t)(ctx->args->local_size - 1) / 2;
  uint64_t need =
      pairs * WEFT_TP_HOST_CHANNELS * shm_segment_bytes(ctx->nslots, ctx->args->chunk_bytes);
  uint64_t have = ctx->self.shm_free < pa->shm_free ? ctx->self.shm_free : pa->shm_free;
  if (have < need + need / 16) {
    snprintf(why, why_len,
             "same host, but /dev/shm has %llu MiB free and %llu ranks here need %llu MiB: "
             "using the next transport (enlarge /dev/shm, or lower WEFT_SHM_SLOTS or "
             "WEFT_CHUNK_BYTES)",
             (unsigned long long)(have >> 20), (unsigned long long)ctx->args->local_size,
             (unsigned long long)(need >> 20));
    /* once per process: every communicator decides alike */
    static atomic_bool warned;
    if (!atomic_exchange(&warned, true)) WEFT_WARN(WEFT_SUBSYS_INIT, "shm: %s", why);
    return false;
  }
  size_t used = strlen(why);
  snprintf(why + used, why_len - used, "; %d slots of %zu KiB each way", ctx->nslots,
           ctx->args->chunk_bytes >> 10);
  if (peer >= 0 && peer < ctx->args->size) ctx->reachable[peer] = true;
  return true;
}

static weft_status shm_connect(weft_tp_ctx *tctx, int peer, int channel, const void *peer_addr,
                               size_t addr_len, weft_tp_conn **conn) {
  shm_ctx *ctx = shm_ctx_of(tctx);
  shm_addr peer_copy;
  const shm_addr *pa = &peer_copy;
  if (!shm_addr_read(peer_addr, addr_len, &peer_copy) || peer < 0 || peer >= ctx->args->size ||
      peer == ctx->args->rank || channel < 0 || channel >= WEFT_TP_CHANNELS)
    return WEFT_ERR_INVALID;
  shm_conn **slot = &ctx->conns[shm_conn_index(peer, channel)];
  if (!*slot) WEFT_CHECK(shm_conn_create(ctx, peer, channel, pa, slot));
  *conn = (weft_tp_conn *)*slot;
  return WEFT_OK;
}

/* The peers' processes (every SHM_LIVENESS_PERIOD) and their notices
 * (when the period passed, or at once with notices_now). */
static weft_status shm_look(shm_ctx *ctx, bool notices_now) {
  double now = weft_now();
  if (now < ctx->next_liveness_check && !notices_now) return WEFT_OK;
  if (now >= ctx->next_liveness_check) { /* a system call per peer: not more often */
    ctx->next_liveness_check = now + SHM_LIVENESS_PERIOD;
    for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++)
      if (ctx->conns[p]) shm_conn_check_peer(ctx->conns[p]);
  }
  /* a notice on a pair the call does not read, or after ours */
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++) {
    weft_status st = ctx->conns[p] ? shm_conn_take_notice(ctx->conns[p]) : WEFT_OK;
    if (st < 0) {
      ctx->next_liveness_check = 0; /* the next call looks at the others */
      return st;
    }
  }
  return WEFT_OK;
}

static weft_status shm_progress(weft_tp_ctx *tctx, bool *progressed) {
  shm_ctx *ctx = shm_ctx_of(tctx);
  *progressed = false;
  /* A waiting driver calls this every round, well under a microsecond
   * apart, and a clock read is a fair share of that (docs/tuning.md, "Clock
   * reads on a small call's path"): look at the clock every SHM_CLOCK_ROUNDS
   * calls (and at once after a sleep, which zeroes next_liveness_check). */
  if (++ctx->progress_calls % SHM_CLOCK_ROUNDS != 0 && ctx->next_liveness_check != 0)
    return WEFT_OK;
  return shm_look(ctx, false);
}

static weft_status shm_wait(weft_tp_ctx *tctx, int timeout_ms) {
  shm_ctx *ctx = shm_ctx_of(tctx);
  int ms = timeout_ms < SHM_WAIT_SLICE_MS ? timeout_ms : SHM_WAIT_SLICE_MS;
  shm_conn *c = ctx->want_conn;
  if (ms <= 0) return shm_look(ctx, true); /* no sleep; what a data call waits for stays */
  if (c && c->state == SHM_CONN_UP && ctx->want == SHM_WANT_RECV) {
    atomic_store(&c->rx->recv_sleeping, 1);
    if (atomic_load(&c->rx->head) == c->rx_tail && !atomic_load(&c->rx->aborted))
      shm_futex_wait(&c->rx->head, c->rx_tail, ms);
    atomic_store(&c->rx->recv_sleeping, 0);
  } else if (c && c->state == SHM_CONN_UP && ctx->want == SHM_WANT_SEND) {
    /* no room at the tail shm_ready read last (a cell, or a slot) */
    uint32_t full_tail = c->tx_tail_seen;
    atomic_store(&c->tx->send_sleeping, 1);
    if (atomic_load(&c->tx->tail) == full_tail && !atomic_load(&c->rx->aborted))
      shm_futex_wait(&c->tx->tail, full_tail, ms);
    atomic_store(&c->tx->send_sleeping, 0);
  } else if (c && c->state == SHM_CONN_UP && ctx->want == SHM_WANT_IDLE) {
    /* a descriptor waits for the peer to copy it and release its cell */
    atomic_store(&c->tx->send_sleeping, 1);
    uint32_t tail = atomic_load(&c->tx->tail);
    if (c->tx_copy_pending && (int32_t)(tail - c->tx_copy_until) < 0 &&
        !atomic_load(&c->rx->aborted))
      shm_futex_wait(&c->tx->tail, tail, ms);
    atomic_store(&c->tx->send_sleeping, 0);
  } else {
    struct timespec pause = {0, (ms < 1 ? ms : 1) * 1000000L};
    nanosleep(&pause, NULL);
  }
  ctx->want = SHM_WANT_NONE;
  ctx->next_liveness_check = 0; /* after sleeping, look at the peers at once */
  bool ignored;
  return shm_progress(tctx, &ignored);
}

static void shm_abort_all(weft_tp_ctx *tctx, const char *reason) {
  shm_ctx *ctx = shm_ctx_of(tctx);
  for (int peer = 0; peer < ctx->args->size; peer++)
    for (int ch = 0; ch < WEFT_TP_CHANNELS; ch++) {
      shm_conn *c = ctx->conns[shm_conn_index(peer, ch)];
      if (c && (c->creator || c->state != SHM_CONN_OPENING))
        shm_conn_notify_abort(c, reason);
      else if (peer < ctx->args->rank && ctx->reachable[peer])
        shm_notice_unopened(ctx, peer, ch, reason);
    }
}

/* A lower peer may have made a pair's segment this rank never connected
 * to: this rank gives up on it now, so its name goes (shm_conn.c says why
 * that is safe); the peer then learns of our end through our pidfd. */
static void shm_unlink_unopened(shm_ctx *ctx) {
  for (int peer = 0; peer < ctx->args->rank; peer++) {
    if (!ctx->reachable[peer]) continue;
    for (int ch = 0; ch < WEFT_TP_CHANNELS; ch++) {
      if (ctx->conns[shm_conn_index(peer, ch)]) continue; /* its destroy decides */
      char name[64];
      shm_pair_name(name, sizeof name, ctx->args->comm_id, ctx->args->rank, peer, ch);
      shm_unlink(name);
    }
  }
}

static void shm_fini(weft_tp_ctx *tctx) {
  shm_ctx *ctx = shm_ctx_of(tctx);
  if (!ctx) return;
  shm_unlink_unopened(ctx);
  for (int p = 0; p < ctx->args->size * WEFT_TP_CHANNELS; p++)
    if (ctx->conns[p]) shm_conn_destroy(ctx->conns[p]);
  free(ctx->conns);
  free(ctx->reachable);
  free(ctx);
}

const weft_transport weft_transport_shm = {
    .abi_version = WEFT_TRANSPORT_ABI,
    .name = "shm",
    .caps = {.send_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             .recv_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_HOST) | WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED),
             /* DEVICE through the memory table (CUDA IPC), where it has one */
             .map_kinds = WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED) | WEFT_MEMORY_BIT(WEFT_MEMORY_DEVICE),
             .sends_are_stores = true},
    .probe = shm_probe,
    .init = shm_init,
    .send_depth = shm_send_depth,
    .can_reach = shm_can_reach,
    .publishes_device_channel = weft_tp_no_device_channel,
    .connect = shm_connect,
    .send_ready = shm_send_ready,
    .send = shm_send,
    .send_idle = shm_send_idle,
    .send_released = shm_send_released,
    .recv_peek = shm_recv_peek,
    .recv_release = shm_recv_release,
    .recv = shm_recv,
    .register_mem = shm_register_mem,
    .deregister_mem = shm_deregister_mem,
    .map_peer_mem = shm_map_peer_mem,
    .release_peer_mem = shm_release_peer_mem,
    .progress = shm_progress,
    .wait = shm_wait,
    .abort_all = shm_abort_all,
    .fini = shm_fini,
};
