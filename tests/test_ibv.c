/* test_ibv.c - the verbs transport's own cases, over the in-tree emulator
 * (WEFT_IB_LIBRARY, set by meson): graceful absence (library missing, no
 * device, a kernel without RDMA), WEFT_IB_HCA and GID rules, InfiniBand LIDs
 * with ports of different MTUs, several queue pairs with reordering, credits
 * under a slow receiver (never more chunks in flight than slots), an injected
 * error completion that must reach every rank as WEFT_ERR_PEER_LOST, the
 * host cost per chunk of the data path without the emulator's share, and a
 * side socket that stops answering, which no member may wait for. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "ibv_emu/ibv_emu.h"
#include "src/base/auth.h"
#include "src/comm/comm.h"
#include "src/mem/mem.h"
#include "src/base/net.h"
#include "src/topo/select.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "transports/ibv/ibv.h"

static const char *emu_path;

static ibv_emu_stats_fn emu_stats(void) {
  void *h = dlopen(emu_path, RTLD_NOW); /* the same instance weft loads */
  return h ? (ibv_emu_stats_fn)dlsym(h, "ibv_emu_stats") : NULL;
}

/* ---- rules as pure functions --------------------------------------------------------- */

static void hca_rules_and_gid_order(void **state) {
  (void)state;
  assert_true(ibv_hca_match("", "mlx5_0", 1));
  assert_true(ibv_hca_match("mlx5", "mlx5_1", 1));
  assert_false(ibv_hca_match("=mlx5", "mlx5_1", 1));
  assert_true(ibv_hca_match("=mlx5_1", "mlx5_1", 2));
  assert_true(ibv_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_1", 2));
  assert_false(ibv_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_1", 1));
  assert_false(ibv_hca_match("^mlx5_0", "mlx5_0", 1));
  assert_true(ibv_hca_match("^mlx5_0", "mlx5_1", 1));
  assert_false(ibv_hca_match("^mlx5_0:1", "mlx5_0", 1));
  assert_true(ibv_hca_match("^mlx5_0:1", "mlx5_0", 2));
  union ibv_gid none = {{0}}, ll = {{0xfe, 0x80, [15] = 1}},
                v4 = {{[10] = 0xff, [11] = 0xff, 10, 0, 0, 1}},
                v6 = {{0x20, 0x01, 0x0d, 0xb8, [15] = 1}};
  assert_int_equal(ibv_gid_score(&none, 2), 0);
  /* RoCE v2 first, then IPv4-mapped over global IPv6 over link-local */
  assert_true(ibv_gid_score(&ll, 2) > ibv_gid_score(&v4, 1));
  assert_true(ibv_gid_score(&v4, 2) > ibv_gid_score(&v6, 2));
  assert_true(ibv_gid_score(&v6, 2) > ibv_gid_score(&ll, 2));
}

/* ---- absence and configuration, as real processes ----------------------------------- */

typedef struct expect {
  weft_status status;  /* of weft_comm_init_rank */
  const char *message; /* in the error or in the peer transport's reason */
  const char *transport;
  int low_memlock; /* run as an unprivileged process would: 64 KiB, no CAP_IPC_LOCK */
} expect;

/* Drops CAP_IPC_LOCK (root ignores the memlock limit with it) and sets a small limit. */
static void expect_low_memlock(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &hdr, data) == 0) {
    data[0].effective &= ~(1u << CAP_IPC_LOCK);
    data[0].permitted &= ~(1u << CAP_IPC_LOCK);
    syscall(SYS_capset, &hdr, data);
  }
  struct rlimit rl = {65536, 65536};
  setrlimit(RLIMIT_MEMLOCK, &rl);
}

static int expect_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const expect *e = arg;
  if (e->low_memlock) expect_low_memlock();
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_rank(&comm, id, rank, size);
  const char *text = st ? weft_last_error(NULL) : "";
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s", text);
  if (st != e->status) {
    fprintf(stderr, "rank %d: init gave %s, expected %s: %s\n", rank, weft_status_name(st),
            weft_status_name(e->status), text);
    return 1;
  }
  if (st)
    return strstr(text, e->message)
               ? 0
               : (fprintf(stderr, "rank %d: '%s' lacks '%s'\n", rank, text, e->message), 1);
  const char *tp, *why;
  weft_comm_peer_transport(comm, 1 - rank, &tp, &why);
  int bad = strcmp(tp, e->transport) || (e->message && !strstr(why, e->message));
  if (bad)
    fprintf(stderr, "rank %d: transport %s (%s), expected %s (%s)\n", rank, tp, why, e->transport,
            e->message);
  int one = 1, sum = 0;
  if (weft_allreduce(comm, &one, &sum, 1, WEFT_I32, WEFT_SUM) || sum != size) bad = 1;
  weft_comm_destroy(comm);
  return bad;
}

static void run_expect(const char *const *env, expect e) {
  /* which settings a hang or a failure below belongs to */
  printf("# case:");
  for (int i = 0; env[i]; i++) printf(" %s", env[i]);
  printf("\n");
  fflush(stdout);
  harness_init();
  assert_int_equal(harness_run(2, env, 60, expect_rank, &e), 0);
}

static void library_missing(void **state) {
  (void)state;
  static const char *const forced[] = {"WEFT_IB_LIBRARY=/nonexistent/libibverbs.so.1",
                                       "WEFT_TRANSPORT=ibv", NULL};
  run_expect(forced,
             (expect){WEFT_ERR_UNSUPPORTED, "cannot load /nonexistent/libibverbs.so.1", NULL, 0});
  /* not forced: the job runs on the other transports */
  static const char *const chosen[] = {"WEFT_IB_LIBRARY=/nonexistent/libibverbs.so.1", NULL};
  run_expect(chosen, (expect){WEFT_OK, NULL, "shm", 0});
}

static void memlock_limit_says_how_to_raise_it(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TRANSPORT=ibv", NULL};
  run_expect(env, (expect){WEFT_ERR_UNSUPPORTED, "raise it with `ulimit -l unlimited`", NULL, 1});
}

static void no_device_or_no_kernel_support(void **state) {
  (void)state;
  static const char *const none[] = {"IBV_EMU_CONFIG=devices=0", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(none, (expect){WEFT_ERR_UNSUPPORTED, "no RDMA device found", NULL, 0});
  static const char *const enosys[] = {"IBV_EMU_CONFIG=enosys", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(enosys, (expect){WEFT_ERR_UNSUPPORTED, "no RDMA support in this kernel", NULL, 0});
  /* the real library on this machine: usable or a clear refusal, never a crash */
  char line[1024];
  unsetenv("WEFT_IB_LIBRARY");
  weft_settings_reload();
  weft_transports_describe(line, sizeof line);
  setenv("WEFT_IB_LIBRARY", emu_path, 1);
  weft_settings_reload();
  printf("# real libibverbs here: %s\n", strstr(line, "ibv (") ? strstr(line, "ibv (") : line);
  assert_non_null(strstr(line, "ibv (built, "));
}

static void hca_and_gid_settings(void **state) {
  (void)state;
  static const char *const second[] = {"IBV_EMU_CONFIG=devices=2", "WEFT_IB_HCA==emu1",
                                       "WEFT_TRANSPORT=ibv", NULL};
  run_expect(second, (expect){WEFT_OK, "emu1 port 1", "ibv", 0});
  static const char *const port[] = {"IBV_EMU_CONFIG=devices=2", "WEFT_IB_HCA=emu0:1",
                                     "WEFT_TRANSPORT=ibv", NULL};
  run_expect(port, (expect){WEFT_OK, "emu0 port 1", "ibv", 0});
  static const char *const excluded[] = {"IBV_EMU_CONFIG=devices=2", "WEFT_IB_HCA=^emu",
                                         "WEFT_TRANSPORT=ibv", NULL};
  run_expect(excluded, (expect){WEFT_ERR_UNSUPPORTED, "WEFT_IB_HCA=^emu", NULL, 0});
  static const char *const gid[] = {"WEFT_IB_GID_INDEX=9", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(gid, (expect){WEFT_ERR_INVALID, "WEFT_IB_GID_INDEX=9 does not exist", NULL, 0});
  static const char *const gid1[] = {"WEFT_IB_GID_INDEX=1", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(gid1, (expect){WEFT_OK, "emu0", "ibv", 0});
}

/* ---- data over unusual fabrics ------------------------------------------------------ */

typedef struct sum_job {
  size_t count;
  int odd_rank_config; /* odd ranks get a 1024-byte MTU */
  const char *config;
} sum_job;

/* allreduce of int32 against a sum computed here from every rank's seed */
static int sum_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const sum_job *j = arg;
  char cfg[128];
  snprintf(cfg, sizeof cfg, "%s%s", j->config, j->odd_rank_config && rank % 2 ? ",mtu=1024" : "");
  setenv("IBV_EMU_CONFIG", cfg, 1);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  int32_t *in = malloc(j->count * 4), *out = malloc(j->count * 4);
  int bad = 0;
  for (int round = 0; round < 3 && !bad; round++) {
    for (size_t i = 0; i < j->count; i++)
      in[i] = (int32_t)((i * 2654435761u) ^ (uint32_t)(rank * 40503 + round));
    if (weft_allreduce(comm, in, out, j->count, WEFT_I32, WEFT_SUM)) {
      fprintf(stderr, "rank %d: %s\n", rank, weft_last_error(comm));
      bad = 1;
      break;
    }
    for (size_t i = 0; i < j->count && !bad; i++) {
      uint32_t want = 0;
      for (int q = 0; q < size; q++)
        want += (uint32_t)((i * 2654435761u) ^ (uint32_t)(q * 40503 + round));
      if ((uint32_t)out[i] != want) {
        fprintf(stderr, "rank %d: element %zu is %d, want %d\n", rank, i, out[i], (int32_t)want);
        bad = 1;
      }
    }
  }
  free(in);
  free(out);
  weft_comm_destroy(comm);
  return bad;
}

static void infiniband_lids_and_mixed_mtu(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TRANSPORT=ibv", "WEFT_CHUNK_BYTES=8192", NULL};
  sum_job j = {100003, 1, "link=ib"};
  harness_init();
  assert_int_equal(harness_run(3, env, 60, sum_rank, &j), 0);
}

static void several_qps_reordered(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TRANSPORT=ibv", "WEFT_CHUNK_BYTES=4096",
                                    "WEFT_IB_QPS_PER_PEER=3", NULL};
  sum_job j = {60013, 0, "delay_us=100,reorder"};
  harness_init();
  assert_int_equal(harness_run(3, env, 60, sum_rank, &j), 0);
  /* the same with chunks sent from the user's buffers (registration cache) */
  static const char *const zcopy[] = {"WEFT_TRANSPORT=ibv", "WEFT_CHUNK_BYTES=4096",
                                      "WEFT_IB_QPS_PER_PEER=3", "WEFT_IB_ZCOPY_BYTES=1024", NULL};
  harness_init();
  assert_int_equal(harness_run(3, zcopy, 60, sum_rank, &j), 0);
}

/* ---- flow control: a slow receiver ---------------------------------------------------- */

static int slow_receiver_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  size_t n = 1 << 18; /* 1 MiB of f32 in 4 KiB chunks: 256 chunks, 8 slots */
  float *buf = malloc(n * 4);
  uint64_t s = harness_seed(7, 0, 1);
  if (rank == 0)
    harness_fill(buf, n, WEFT_F32, WEFT_SUM, s);
  else
    memset(buf, 0, n * 4);
  if (rank == 1) usleep(300000); /* the sender fills every slot and must stop */
  int bad = weft_broadcast(comm, rank == 0 ? buf : NULL, buf, n, WEFT_F32, 0) != WEFT_OK;
  if (rank == 1 && !bad) {
    float *want = malloc(n * 4);
    harness_fill(want, n, WEFT_F32, WEFT_SUM, s);
    bad = memcmp(want, buf, n * 4) != 0;
    free(want);
  }
  ibv_emu_counters c = {0};
  ibv_emu_stats_fn f = emu_stats();
  if (f) f(&c);
  harness_shm->word[rank] = rank == 0 ? c.rnr_naks : c.max_rq_deficit;
  free(buf);
  weft_comm_destroy(comm);
  return bad || !f;
}

static void credits_under_a_slow_receiver(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TRANSPORT=ibv", "WEFT_CHUNK_BYTES=4096", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, slow_receiver_rank, NULL), 0);
  printf(
      "# slow receiver: at most %llu chunks in flight to it (8 slots); %llu receiver-not-ready "
      "retries at the sender\n",
      (unsigned long long)harness_shm->word[1], (unsigned long long)harness_shm->word[0]);
  assert_int_equal(harness_shm->word[0], 0); /* credits kept a receive posted for every write */
  assert_int_equal(harness_shm->word[1], 8); /* the window was used, never exceeded */
}

/* ---- an error completion reaches everyone -------------------------------------------- */

static int injected_error_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  if (rank == 1) setenv("IBV_EMU_CONFIG", "fail_wr=40", 1);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  size_t n = 50000;
  float *buf = calloc(n, 4);
  weft_status st = WEFT_OK;
  double t0 = harness_now();
  for (int i = 0; i < 100 && !st; i++) st = weft_allreduce(comm, buf, buf, n, WEFT_F32, WEFT_SUM);
  harness_shm->status[rank] = st;
  harness_shm->seconds[rank] = harness_now() - t0;
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s",
           weft_last_error(comm));
  free(buf);
  weft_comm_destroy(comm);
  return 0;
}

static void injected_error_is_peer_lost_everywhere(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TRANSPORT=ibv", "WEFT_CHUNK_BYTES=4096", "WEFT_TIMEOUT=8",
                                    NULL};
  harness_init();
  assert_int_equal(harness_run(4, env, 60, injected_error_rank, NULL), 0);
  for (int r = 0; r < 4; r++) {
    printf("# rank %d: %s after %.2f s: %s\n", r, weft_status_name(harness_shm->status[r]),
           harness_shm->seconds[r], harness_shm->message[r]);
    assert_int_equal(harness_shm->status[r], WEFT_ERR_PEER_LOST);
    assert_true(harness_shm->seconds[r] < 20); /* told, not timed out */
  }
  assert_non_null(strstr(harness_shm->message[1], "transport retry counter exceeded"));
}

/* ---- two transport contexts in one process ------------------------------------------ */

typedef struct loop_pair {
  weft_place place;
  weft_auth_key key;
  weft_error_sink sink[2];
  weft_transport_init_args args[2];
  weft_tp_ctx *ctx[2];
  weft_tp_conn *c01, *c10;
  uint8_t addr1[WEFT_TRANSPORT_ADDR_MAX]; /* rank 1's published address */
  size_t alen1;
} loop_pair;

static void loop_dial(loop_pair *lp) {
  assert_int_equal(weft_transport_ibv.connect(lp->ctx[0], 1, 0, lp->addr1, lp->alen1, &lp->c01),
                   WEFT_OK);
}

static void loop_drive(loop_pair *lp) {
  bool moved;
  weft_transport_ibv.progress(lp->ctx[1], &moved);
  weft_transport_ibv.progress(lp->ctx[0], &moved);
}

/* Ranks 0 and 1 of one communicator, connected through the emulator, driven
 * by one thread: nothing waits, so every call's cost is the call's own.
 * loop_start makes both contexts and the acceptor's connection, and with
 * `dial` the dialer's (rank 0, which starts the handshake); loop_open
 * drives the handshake to its end. */
static void loop_start(loop_pair *lp, size_t chunk_bytes, bool dial) {
  setenv("WEFT_TRANSPORT", "ibv", 1);
  weft_settings_reload();
  memset(lp, 0, sizeof *lp);
  weft_place_here(NULL, &lp->place);
  weft_auth_key_for_job(NULL, 0, &lp->key);
  uint8_t addr[2][WEFT_TRANSPORT_ADDR_MAX];
  size_t alen[2];
  for (int r = 0; r < 2; r++) {
    lp->args[r] = (weft_transport_init_args){.rank = r,
                                             .size = 2,
                                             .comm_id = 0x1234,
                                             .chunk_bytes = chunk_bytes,
                                             .timeout_s = 5,
                                             .wake_fd = -1,
                                             .errors = &lp->sink[r],
                                             .place = &lp->place,
                                             .auth = &lp->key,
                                             .local_size = 2};
    struct sockaddr_in *lo = (struct sockaddr_in *)&lp->args[r].local_addr;
    lo->sin_family = AF_INET;
    lo->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lp->args[r].local_addr_len = sizeof *lo;
    assert_int_equal(weft_transport_ibv.init(&lp->args[r], &lp->ctx[r], addr[r], &alen[r]),
                     WEFT_OK);
  }
  assert_int_equal(weft_transport_ibv.connect(lp->ctx[1], 0, 0, addr[0], alen[0], &lp->c10), WEFT_OK);
  memcpy(lp->addr1, addr[1], alen[1]);
  lp->alen1 = alen[1];
  if (dial) loop_dial(lp);
}

static void loop_open(loop_pair *lp, size_t chunk_bytes) {
  loop_start(lp, chunk_bytes, true);
  double deadline = harness_now() + 5;
  while (weft_transport_ibv.send_ready(lp->c01) == WEFT_AGAIN && harness_now() < deadline)
    loop_drive(lp);
  assert_int_equal(weft_transport_ibv.send_ready(lp->c01), WEFT_OK);
}

static void loop_close(loop_pair *lp) {
  weft_transport_ibv.fini(lp->ctx[0]);
  weft_transport_ibv.fini(lp->ctx[1]);
  unsetenv("WEFT_IB_ZCOPY_BYTES");
  weft_settings_reload();
}

/* One chunk from `src` to the peer, checked byte for byte on arrival. */
static void loop_chunk(loop_pair *lp, const void *src, size_t bytes, uint32_t seq) {
  if (weft_transport_ibv.send_ready(lp->c01) != WEFT_OK ||
      weft_transport_ibv.send(lp->c01, src, bytes, seq, &weft_mem_host, 0) != WEFT_OK)
    fail_msg("send %u: %s", seq, lp->sink[0].msg);
  const void *data;
  if (weft_transport_ibv.recv_peek(lp->c10, seq, bytes, &data) != WEFT_OK)
    fail_msg("recv %u: %s", seq, lp->sink[1].msg);
  assert_memory_equal(data, src, bytes);
  assert_int_equal(weft_transport_ibv.recv_release(lp->c10), WEFT_OK);
}

static void registration_cache(void **state) {
  (void)state;
  setenv("WEFT_IB_ZCOPY_BYTES", "8192", 1);
  loop_pair lp;
  loop_open(&lp, 65536);
  ibv_mr_cache *cache = &ibv_ctx_of(lp.ctx[0])->mr;
  size_t len = 1 << 20;
  unsigned char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(a != MAP_FAILED);
  uint64_t seed = harness_seed(11, 0, 0);
  harness_fill(a, len / 4, WEFT_I32, WEFT_SUM, seed);
  uint32_t seq = 0;
  /* 15 chunks of 64 KiB at odd offsets, twice: one region straddles the middle */
  for (int round = 0; round < 2; round++)
    for (size_t off = 32768; off + 65536 <= len; off += 65536)
      loop_chunk(&lp, a + off, 65536, seq++);
  loop_chunk(&lp, a, 100, seq++); /* short: copied, not registered */
  printf("# 30 zero-copy chunks from one buffer: %llu registrations, %llu cache hits\n",
         (unsigned long long)cache->misses, (unsigned long long)cache->hits);
  assert_int_equal(cache->misses, 15);
  assert_int_equal(cache->hits, 15);
  for (int i = 0; i < 100 && weft_transport_ibv.send_idle(lp.c01) == WEFT_AGAIN; i++) {
    bool moved;
    weft_transport_ibv.progress(lp.ctx[0], &moved);
  }
  assert_int_equal(weft_transport_ibv.send_idle(lp.c01), WEFT_OK);
  for (int i = 0; i < IBV_MR_MAX_ENTRIES; i++) assert_int_equal(cache->e[i].refs, 0);
  /* the buffer goes away; a new one takes the upper half of its addresses:
   * the region that straddled the middle now covers unmapped pages and must
   * not be used for a chunk at the new buffer's start (the emulator would
   * refuse the write: a NIC would read the old, pinned pages) */
  assert_int_equal(munmap(a, len), 0);
  unsigned char *b = mmap(a + len / 2, len / 2, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  assert_true(b == a + len / 2);
  harness_fill(b, len / 8, WEFT_I32, WEFT_SUM, seed + 1);
  uint64_t before = cache->misses, hits = cache->hits;
  loop_chunk(&lp, b, 16384, seq++);
  loop_chunk(&lp, b, 16384, seq++);
  assert_int_equal(cache->invalidations, 1);
  assert_int_equal(cache->misses - before, 1); /* a fresh registration for b's first pages */
  assert_int_equal(cache->hits - hits, 1);     /* which the second chunk found */
  printf("# after munmap: %llu region invalidated, %llu new registration\n",
         (unsigned long long)cache->invalidations, (unsigned long long)(cache->misses - before));
  munmap(b, len / 2);
  loop_close(&lp);
}

/* (time - the emulator's time) / chunks is the transport's host cost. */
static void data_path_cost_per_chunk(void **state) {
  (void)state;
  ibv_emu_stats_fn stats = emu_stats();
  assert_non_null(stats);
  size_t sizes[] = {64, 65536, 65536};
  for (size_t z = 0; z < 3; z++) {
    if (z == 2) setenv("WEFT_IB_ZCOPY_BYTES", "8192", 1);
    loop_pair lp;
    loop_open(&lp, 65536);
    size_t bytes = sizes[z];
    int n = bytes < 4096 ? 200000 : 20000;
    char *src = calloc(1, bytes);
    ibv_emu_counters e0, e1;
    stats(&e0);
    double t0 = harness_now();
    for (int i = 0; i < n; i++) {
      memcpy(src, &i, sizeof i);
      if (weft_transport_ibv.send_ready(lp.c01) != WEFT_OK ||
          weft_transport_ibv.send(lp.c01, src, bytes, (uint32_t)i, &weft_mem_host, 0) != WEFT_OK)
        fail_msg("send %d: %s", i, lp.sink[0].msg);
      const void *data;
      if (weft_transport_ibv.recv_peek(lp.c10, (uint32_t)i, bytes, &data) != WEFT_OK)
        fail_msg("recv %d: %s", i, lp.sink[1].msg);
      int got;
      memcpy(&got, data, sizeof got);
      assert_int_equal(got, i);
      assert_int_equal(weft_transport_ibv.recv_release(lp.c10), WEFT_OK);
    }
    double total = harness_now() - t0;
    stats(&e1);
    double emu_s = (double)(e1.emu_ns - e0.emu_ns) * 1e-9;
    printf(
        "# %zu-byte chunks%s: %.0f ns per chunk in all, %.0f ns in the emulator, %.0f ns in "
        "the transport (both sides)\n",
        bytes, z == 2 ? " from user memory (zero-copy)" : " (bounce copy)", total / n * 1e9,
        emu_s / n * 1e9, (total - emu_s) / n * 1e9);
    free(src);
    loop_close(&lp);
  }
}

/* ---- the side socket never makes a member wait (transport.h) ------------------------ */

/* A connection to the listener that sends part of a hello and then nothing:
 * progress must not wait for the rest (it once waited up to 2 s per such
 * socket), a real peer's handshake goes through beside it, and it is
 * refused (closed) once its time is up. */
static void silent_dialer_does_not_hold_progress(void **state) {
  (void)state;
  loop_pair lp;
  loop_start(&lp, 4096, false);
  ibv_ctx *acceptor = ibv_ctx_of(lp.ctx[1]);
  int s = socket(acceptor->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(s >= 0);
  assert_int_equal(connect(s, (struct sockaddr *)&acceptor->addr, acceptor->addr_len), 0);
  static const uint8_t part[10];
  assert_int_equal(send(s, part, sizeof part, MSG_NOSIGNAL), (ssize_t)sizeof part);
  bool moved;
  double slowest = 0;
  for (int i = 0; i < 20; i++) {
    double t0 = harness_now();
    weft_transport_ibv.progress(lp.ctx[1], &moved);
    if (harness_now() - t0 > slowest) slowest = harness_now() - t0;
  }
  printf("# a silent dialer: the slowest of 20 progress calls took %.3f s\n", slowest);
  assert_true(slowest < 0.5);
  /* the real dialer's handshake beside it */
  loop_dial(&lp);
  double deadline = harness_now() + 5;
  while (weft_transport_ibv.send_ready(lp.c01) == WEFT_AGAIN && harness_now() < deadline)
    loop_drive(&lp);
  assert_int_equal(weft_transport_ibv.send_ready(lp.c01), WEFT_OK);
  static const uint8_t chunk[100] = {1, 2, 3};
  loop_chunk(&lp, chunk, sizeof chunk, 1);
  /* the silent one is refused in progress once its hello is overdue */
  uint8_t b;
  ssize_t r = -1;
  deadline = harness_now() + 10;
  while (harness_now() < deadline && (r = recv(s, &b, 1, MSG_DONTWAIT)) < 0 &&
         errno == EAGAIN)
    loop_drive(&lp);
  assert_int_equal(r, 0);
  close(s);
  loop_close(&lp);
}

/* A peer whose side socket takes nothing more (its buffers full, it does
 * not read): the dialer's last handshake message cannot go, and the data
 * call that read the peer's queue pairs must answer at once, not wait in
 * the send (it once waited 5 s and failed). The message goes in later
 * calls, once the peer reads again, and the pair works. */
static void full_side_socket_does_not_hold_send_ready(void **state) {
  (void)state;
  loop_pair lp;
  loop_start(&lp, 4096, true);
  double deadline = harness_now() + 5;
  bool moved;
  ibv_conn *acceptor = ibv_conn_of(lp.c10);
  /* the acceptor takes the hello and answers with its queue pairs */
  while (acceptor->state != IBV_CONN_AWAIT_READY && harness_now() < deadline)
    weft_transport_ibv.progress(lp.ctx[1], &moved);
  assert_int_equal(acceptor->state, IBV_CONN_AWAIT_READY);
  /* from now on it reads nothing: fill the way to it */
  int fd = ibv_conn_of(lp.c01)->fd;
  static uint8_t junk[65536];
  size_t filled = 0;
  for (;;) {
    ssize_t n = send(fd, junk, sizeof junk, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;
    filled += (size_t)n;
  }
  assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
  weft_status st = WEFT_OK;
  double slowest = 0;
  for (int i = 0; i < 5 && st >= 0; i++) {
    double t0 = harness_now();
    st = weft_transport_ibv.send_ready(lp.c01);
    if (harness_now() - t0 > slowest) slowest = harness_now() - t0;
  }
  printf("# %zu bytes fill the side socket: send_ready %s, the slowest of 5 took %.3f s\n",
         filled, weft_status_name(st), slowest);
  if (st < 0) fail_msg("send_ready: %s", lp.sink[0].msg);
  assert_true(slowest < 0.5);
  assert_true(ibv_side_owes(ibv_conn_of(lp.c01))); /* READY waits for room */
  /* the peer reads again: the junk here, the rest in its progress */
  size_t drained = 0;
  static uint8_t sink[65536];
  int afd = acceptor->fd;
  deadline = harness_now() + 10;
  while (drained < filled && harness_now() < deadline) {
    size_t want = filled - drained < sizeof sink ? filled - drained : sizeof sink;
    ssize_t n = recv(afd, sink, want, MSG_DONTWAIT);
    if (n > 0) drained += (size_t)n;
    weft_transport_ibv.progress(lp.ctx[0], &moved); /* sends what it still owes */
  }
  assert_int_equal(drained, filled);
  while (weft_transport_ibv.send_ready(lp.c10) == WEFT_AGAIN && harness_now() < deadline)
    loop_drive(&lp);
  assert_int_equal(weft_transport_ibv.send_ready(lp.c10), WEFT_OK);
  static const uint8_t chunk[100] = {4, 5, 6};
  loop_chunk(&lp, chunk, sizeof chunk, 1);
  loop_close(&lp);
}

int main(void) {
  emu_path = getenv("WEFT_IB_LIBRARY");
  if (!emu_path) {
    fprintf(stderr, "WEFT_IB_LIBRARY must name the emulator\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hca_rules_and_gid_order),
      cmocka_unit_test(library_missing),
      cmocka_unit_test(no_device_or_no_kernel_support),
      cmocka_unit_test(memlock_limit_says_how_to_raise_it),
      cmocka_unit_test(hca_and_gid_settings),
      cmocka_unit_test(infiniband_lids_and_mixed_mtu),
      cmocka_unit_test(several_qps_reordered),
      cmocka_unit_test(credits_under_a_slow_receiver),
      cmocka_unit_test(injected_error_is_peer_lost_everywhere),
      cmocka_unit_test(registration_cache),
      cmocka_unit_test(data_path_cost_per_chunk),
      cmocka_unit_test(silent_dialer_does_not_hold_progress),
      cmocka_unit_test(full_side_socket_does_not_hold_send_ready),
  };
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
