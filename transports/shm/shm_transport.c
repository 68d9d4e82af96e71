/* shm_transport.c - the shared-memory transport's table, per-communicator
 * state, reachability (same host, same /dev/shm, same pid namespace, and
 * room in /dev/shm for every pair of local ranks), sleeping and aborting.
 * The data path is in shm_conn.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/base/status.h"

#define SHM_ADDR_MAGIC 0x5745534au
#define SHM_WAIT_SLICE_MS 5      /* bounds abort latency and dead-peer notice */
#define SHM_LIVENESS_PERIOD 0.01 /* seconds between pidfd checks while busy */
#define SHM_CLOCK_ROUNDS 32      /* progress calls between looks at the clock */

static weft_status shm_init(const weft_transport_init_args *args, weft_transport_ctx **out,
                            void *addr, size_t *addr_len) {
  if (!args->place) {
    weft_error_sink_set(args->errors, "shm: no place information");
    return WEFT_ERR_UNSUPPORTED;
  }
  weft_transport_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return WEFT_ERR_NOMEM;
  ctx->conns = calloc((size_t)args->size, sizeof *ctx->conns);
  if (!ctx->conns) {
    free(ctx);
    return WEFT_ERR_NOMEM;
  }
  ctx->args = args;
  long long slots = weft_settings()->shm.slots;
  ctx->nslots = slots < 2 ? 2 : slots > SHM_MAX_SLOTS ? SHM_MAX_SLOTS : (int)slots;
  ctx->self.magic = SHM_ADDR_MAGIC;
  ctx->self.pid = (uint32_t)getpid();
  ctx->self.place = *args->place;
  struct statvfs vfs;
  ctx->self.shm_free = statvfs("/dev/shm", &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : 0;
  if (ctx->self.shm_free == 0) ctx->self.place.shm_ns = 0; /* no usable /dev/shm */
  memcpy(addr, &ctx->self, sizeof ctx->self);
  *addr_len = sizeof ctx->self;
  *out = ctx;
  return WEFT_OK;
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

static bool shm_can_reach(weft_transport_ctx *ctx, int peer, const void *peer_addr, size_t addr_len,
                          char *why, size_t why_len) {
  shm_addr peer_copy;
  const shm_addr *pa = &peer_copy;
  (void)peer;
  if (!shm_addr_read(peer_addr, addr_len, &peer_copy)) {
    snprintf(why, why_len, "shm: the peer published no shared-memory address");
    return false;
  }
  if (!weft_select_shm_reaches(&ctx->self.place, &pa->place, why, why_len)) return false;
  /* Room for every pair of ranks on this host, judged from what both ranks
   * published, so both ends of a pair decide alike. */
  uint64_t pairs = (uint64_t)ctx->args->local_size * (uint64_t)(ctx->args->local_size - 1) / 2;
  uint64_t need = pairs * shm_segment_bytes(ctx->nslots, ctx->args->chunk_bytes);
  uint64_t have = ctx->self.shm_free < pa->shm_free ? ctx->self.shm_free : pa->shm_free;
  if (have < need + need / 16) {
    snprintf(why, why_len,
             "same host, but /dev/shm has %llu MiB free and %llu ranks here need %llu MiB: "
             "using the next transport (enlarge /dev/shm, or lower WEFT_SHM_SLOTS or "
             "WEFT_CHUNK_BYTES)",
             (unsigned long long)(have >> 20), (unsigned long long)ctx->args->local_size,
             (unsigned long long)(need >> 20));
    /* once per process: every communicator (and its p2p lane) decides alike */
    static atomic_bool warned;
    if (!atomic_exchange(&warned, true)) WEFT_WARN(WEFT_SUBSYS_INIT, "shm: %s", why);
    return false;
  }
  size_t used = strlen(why);
  snprintf(why + used, why_len - used, "; %d slots of %zu KiB each way", ctx->nslots,
           ctx->args->chunk_bytes >> 10);
  return true;
}

static weft_status shm_connect(weft_transport_ctx *ctx, int peer, const void *peer_addr,
                               size_t addr_len, weft_conn **conn) {
  shm_addr peer_copy;
  const shm_addr *pa = &peer_copy;
  if (!shm_addr_read(peer_addr, addr_len, &peer_copy) || peer < 0 || peer >= ctx->args->size ||
      peer == ctx->args->rank)
    return WEFT_ERR_INVALID;
  if (!ctx->conns[peer]) WEFT_CHECK(shm_conn_create(ctx, peer, pa, &ctx->conns[peer]));
  *conn = ctx->conns[peer];
  return WEFT_OK;
}

static weft_status shm_progress(weft_transport_ctx *ctx, bool *progressed) {
  *progressed = false;
  /* A waiting driver calls this every round, well under a microsecond
   * apart, and a clock read costs ~35 ns here: look at the clock every
   * SHM_CLOCK_ROUNDS calls (and at once after a sleep, which zeroes
   * next_liveness_check). */
  if (++ctx->progress_calls % SHM_CLOCK_ROUNDS != 0 && ctx->next_liveness_check != 0)
    return WEFT_OK;
  double now = weft_now();
  if (now < ctx->next_liveness_check) return WEFT_OK;
  ctx->next_liveness_check = now + SHM_LIVENESS_PERIOD;
  for (int p = 0; p < ctx->args->size; p++)
    if (ctx->conns[p]) shm_conn_check_peer(ctx->conns[p]);
  return WEFT_OK;
}

static weft_status shm_wait(weft_transport_ctx *ctx, int timeout_ms) {
  int ms = timeout_ms < SHM_WAIT_SLICE_MS ? timeout_ms : SHM_WAIT_SLICE_MS;
  struct weft_conn *c = ctx->want_conn;
  if (c && c->state == SHM_CONN_UP && ctx->want == SHM_WANT_RECV) {
    atomic_store(&c->rx->recv_sleeping, 1);
    if (atomic_load(&c->rx->head) == c->rx_tail && !atomic_load(&c->rx->aborted))
      shm_futex_wait(&c->rx->head, c->rx_tail, ms);
    atomic_store(&c->rx->recv_sleeping, 0);
  } else if (c && c->state == SHM_CONN_UP && ctx->want == SHM_WANT_SEND) {
    uint32_t full_tail = c->tx_head - (uint32_t)ctx->nslots;
    atomic_store(&c->tx->send_sleeping, 1);
    if (atomic_load(&c->tx->tail) == full_tail && !atomic_load(&c->rx->aborted))
      shm_futex_wait(&c->tx->tail, full_tail, ms);
    atomic_store(&c->tx->send_sleeping, 0);
  } else {
    struct timespec pause = {0, (ms < 1 ? ms : 1) * 1000000L};
    nanosleep(&pause, NULL);
  }
  ctx->want = SHM_WANT_NONE;
  ctx->next_liveness_check = 0; /* after sleeping, look at the peers at once */
  bool ignored;
  return shm_progress(ctx, &ignored);
}

static void shm_abort_all(weft_transport_ctx *ctx, const char *reason) {
  for (int p = 0; p < ctx->args->size; p++)
    if (ctx->conns[p]) shm_conn_notify_abort(ctx->conns[p], reason);
}

static void shm_fini(weft_transport_ctx *ctx) {
  if (!ctx) return;
  for (int p = 0; p < ctx->args->size; p++)
    if (ctx->conns[p]) shm_conn_destroy(ctx->conns[p]);
  free(ctx->conns);
  free(ctx);
}

const weft_transport weft_transport_shm = {
    .abi_version = WEFT_TRANSPORT_ABI,
    .name = "shm",
    .sends_are_stores = true,
    .init = shm_init,
    .can_reach = shm_can_reach,
    .connect = shm_connect,
    .send_ready = shm_send_ready,
    .send = shm_send,
    .send_idle = shm_send_idle,
    .recv_peek = shm_recv_peek,
    .recv_release = shm_recv_release,
    .recv_into = shm_recv_into,
    .map_peer_mem = shm_map_peer_mem,
    .progress = shm_progress,
    .wait = shm_wait,
    .abort_all = shm_abort_all,
    .fini = shm_fini,
};
