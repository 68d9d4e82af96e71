/* test_ibv.c - the verbs transport's own cases, over the in-tree emulator
 * (WEFT_IB_LIBRARY, set by meson): graceful absence (library missing, no
 * device, a kernel without RDMA), WEFT_IB_HCA and GID rules, InfiniBand LIDs
 * with ports of different MTUs, several queue pairs with reordering, credits
 * under a slow receiver (never more chunks in flight than slots), an injected
 * error completion that must reach every rank as WEFT_ERR_PEER_LOST, and the
 * host cost per chunk of the data path without the emulator's share. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "ibv_emu/ibv_emu.h"
#include "src/auth.h"
#include "src/comm.h"
#include "src/mem.h"
#include "src/net.h"
#include "src/select.h"
#include "src/settings.h"
#include "src/status.h"
#include "transports/ibv/ibv.h"

static const char *emu_path;

static ibv_emu_stats_fn emu_stats(void) {
  void *h = dlopen(emu_path, RTLD_NOW | RTLD_NOLOAD);
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
  union ibv_gid none = {{0}}, ll = {{0xfe, 0x80, [15] = 1}}, v4 = {{[10] = 0xff, [11] = 0xff, 10, 0, 0, 1}},
                v6 = {{0x20, 0x01, 0x0d, 0xb8, [15] = 1}};
  assert_int_equal(ibv_gid_score(&none, 2), 0);
  /* RoCE v2 first, then IPv4-mapped over global IPv6 over link-local */
  assert_true(ibv_gid_score(&ll, 2) > ibv_gid_score(&v4, 1));
  assert_true(ibv_gid_score(&v4, 2) > ibv_gid_score(&v6, 2));
  assert_true(ibv_gid_score(&v6, 2) > ibv_gid_score(&ll, 2));
}

/* ---- absence and configuration, as real processes ----------------------------------- */

typedef struct expect {
  weft_status status;   /* of weft_comm_init_rank */
  const char *message;  /* in the error or in the peer transport's reason */
  const char *transport;
} expect;

static int expect_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const expect *e = arg;
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_rank(&comm, id, rank, size);
  const char *text = st ? weft_last_error(NULL) : "";
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s", text);
  if (st != e->status) {
    fprintf(stderr, "rank %d: init gave %s, expected %s: %s\n", rank, weft_status_name(st),
            weft_status_name(e->status), text);
    return 1;
  }
  if (st) return strstr(text, e->message) ? 0 : (fprintf(stderr, "rank %d: '%s' lacks '%s'\n", rank, text, e->message), 1);
  const char *tp, *why;
  weft_comm_peer_transport(comm, 1 - rank, &tp, &why);
  int bad = strcmp(tp, e->transport) || (e->message && !strstr(why, e->message));
  if (bad) fprintf(stderr, "rank %d: transport %s (%s), expected %s (%s)\n", rank, tp, why, e->transport, e->message);
  int one = 1, sum = 0;
  if (weft_allreduce(comm, &one, &sum, 1, WEFT_I32, WEFT_SUM) || sum != size) bad = 1;
  weft_comm_destroy(comm);
  return bad;
}

static void run_expect(const char *const *env, expect e) {
  harness_init();
  assert_int_equal(harness_run(2, env, 60, expect_rank, &e), 0);
}

static void library_missing(void **state) {
  (void)state;
  static const char *const forced[] = {"WEFT_IB_LIBRARY=/nonexistent/libibverbs.so.1",
                                       "WEFT_TRANSPORT=ibv", NULL};
  run_expect(forced, (expect){WEFT_ERR_UNSUPPORTED, "cannot load /nonexistent/libibverbs.so.1", NULL});
  /* not forced: the job runs on the other transports */
  static const char *const chosen[] = {"WEFT_IB_LIBRARY=/nonexistent/libibverbs.so.1", NULL};
  run_expect(chosen, (expect){WEFT_OK, NULL, "shm"});
}

static void no_device_or_no_kernel_support(void **state) {
  (void)state;
  static const char *const none[] = {"IBV_EMU_CONFIG=devices=0", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(none, (expect){WEFT_ERR_UNSUPPORTED, "no RDMA device found", NULL});
  static const char *const enosys[] = {"IBV_EMU_CONFIG=enosys", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(enosys, (expect){WEFT_ERR_UNSUPPORTED, "no RDMA support in this kernel", NULL});
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
  run_expect(second, (expect){WEFT_OK, "emu1 port 1", "ibv"});
  static const char *const port[] = {"IBV_EMU_CONFIG=devices=2", "WEFT_IB_HCA=emu0:1",
                                     "WEFT_TRANSPORT=ibv", NULL};
  run_expect(port, (expect){WEFT_OK, "emu0 port 1", "ibv"});
  static const char *const excluded[] = {"IBV_EMU_CONFIG=devices=2", "WEFT_IB_HCA=^emu",
                                         "WEFT_TRANSPORT=ibv", NULL};
  run_expect(excluded, (expect){WEFT_ERR_UNSUPPORTED, "WEFT_IB_HCA=^emu", NULL});
  static const char *const gid[] = {"WEFT_IB_GID_INDEX=9", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(gid, (expect){WEFT_ERR_INVALID, "WEFT_IB_GID_INDEX=9 does not exist", NULL});
  static const char *const gid1[] = {"WEFT_IB_GID_INDEX=1", "WEFT_TRANSPORT=ibv", NULL};
  run_expect(gid1, (expect){WEFT_OK, "emu0", "ibv"});
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
    for (size_t i = 0; i < j->count; i++) in[i] = (int32_t)((i * 2654435761u) ^ (uint32_t)(rank * 40503 + round));
    if (weft_allreduce(comm, in, out, j->count, WEFT_I32, WEFT_SUM)) {
      fprintf(stderr, "rank %d: %s\n", rank, weft_last_error(comm));
      bad = 1;
      break;
    }
    for (size_t i = 0; i < j->count && !bad; i++) {
      uint32_t want = 0;
      for (int q = 0; q < size; q++) want += (uint32_t)((i * 2654435761u) ^ (uint32_t)(q * 40503 + round));
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
}

/* ---- flow control: a slow receiver ---------------------------------------------------- */

static int slow_receiver_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  size_t n = 1 << 18; /* 1 MiB of f32 in 4 KiB chunks: 256 chunks, 8 slots */
  float *buf = malloc(n * 4);
  uint64_t s = harness_seed(7, 0, 1);
  if (rank == 0) harness_fill(buf, n, WEFT_F32, WEFT_SUM, s);
  else memset(buf, 0, n * 4);
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
  printf("# slow receiver: at most %llu chunks in flight to it (8 slots); %llu receiver-not-ready "
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
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s", weft_last_error(comm));
  free(buf);
  weft_comm_destroy(comm);
  return 0;
}

static void injected_error_is_peer_lost_everywhere(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TRANSPORT=ibv", "WEFT_CHUNK_BYTES=4096", "WEFT_TIMEOUT=8", NULL};
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

/* ---- the data path's own cost ----------------------------------------------------------- */

/* Two transport contexts in one process, connected through the emulator:
 * every chunk is posted, lands, is peeked and released with no waiting, so
 * (time - the emulator's time) / chunks is the transport's host cost. */
static void data_path_cost_per_chunk(void **state) {
  (void)state;
  setenv("WEFT_TRANSPORT", "ibv", 1);
  weft_settings_reload();
  weft_place place;
  weft_place_here(NULL, &place);
  weft_auth_key key;
  weft_auth_key_for_job(NULL, 0, &key);
  weft_error_sink sink[2];
  weft_transport_init_args args[2];
  weft_transport_ctx *ctx[2];
  uint8_t addr[2][WEFT_TRANSPORT_ADDR_MAX];
  size_t alen[2];
  for (int r = 0; r < 2; r++) {
    memset(&sink[r], 0, sizeof sink[r]);
    args[r] = (weft_transport_init_args){.rank = r, .size = 2, .comm_id = 0x1234, .chunk_bytes = 65536,
                                         .send_depth = 8, .timeout_s = 5, .wake_fd = -1,
                                         .errors = &sink[r], .place = &place, .auth = &key,
                                         .local_size = 2};
    struct sockaddr_in *lo = (struct sockaddr_in *)&args[r].local_addr;
    lo->sin_family = AF_INET;
    lo->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    args[r].local_addr_len = sizeof *lo;
    assert_int_equal(weft_transport_ibv.init(&args[r], &ctx[r], addr[r], &alen[r]), WEFT_OK);
  }
  weft_conn *c01, *c10;
  assert_int_equal(weft_transport_ibv.connect(ctx[1], 0, addr[0], alen[0], &c10), WEFT_OK);
  assert_int_equal(weft_transport_ibv.connect(ctx[0], 1, addr[1], alen[1], &c01), WEFT_OK);
  double deadline = harness_now() + 5;
  while (weft_transport_ibv.send_ready(c01) == WEFT_AGAIN && harness_now() < deadline) {
    bool moved;
    weft_transport_ibv.progress(ctx[1], &moved);
    weft_transport_ibv.progress(ctx[0], &moved);
  }
  assert_int_equal(weft_transport_ibv.send_ready(c01), WEFT_OK);
  ibv_emu_stats_fn stats = emu_stats();
  assert_non_null(stats);
  size_t sizes[] = {64, 65536};
  for (size_t z = 0; z < 2; z++) {
    size_t bytes = sizes[z];
    int n = bytes < 4096 ? 200000 : 20000;
    char *src = malloc(bytes);
    memset(src, 0, bytes);
    ibv_emu_counters e0, e1;
    stats(&e0);
    double t0 = harness_now();
    for (int i = 0; i < n; i++) {
      memcpy(src, &i, sizeof i);
      if (weft_transport_ibv.send_ready(c01) != WEFT_OK ||
          weft_transport_ibv.send(c01, src, bytes, (uint32_t)i, &weft_mem_host) != WEFT_OK)
        fail_msg("send %d: %s", i, sink[0].msg);
      const void *data;
      if (weft_transport_ibv.recv_peek(c10, (uint32_t)i, bytes, &data) != WEFT_OK)
        fail_msg("recv %d: %s", i, sink[1].msg);
      int got;
      memcpy(&got, data, sizeof got);
      assert_int_equal(got, i);
      assert_int_equal(weft_transport_ibv.recv_release(c10), WEFT_OK);
    }
    double total = harness_now() - t0;
    stats(&e1);
    double emu_s = (double)(e1.emu_ns - e0.emu_ns) * 1e-9;
    printf("# %zu-byte chunks: %.0f ns per chunk in all, %.0f ns in the emulator, %.0f ns in the "
           "transport (send + receive sides, bounce copy included)\n",
           bytes, total / n * 1e9, emu_s / n * 1e9, (total - emu_s) / n * 1e9);
    free(src);
  }
  weft_transport_ibv.fini(ctx[0]);
  weft_transport_ibv.fini(ctx[1]);
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
      cmocka_unit_test(hca_and_gid_settings),
      cmocka_unit_test(infiniband_lids_and_mixed_mtu),
      cmocka_unit_test(several_qps_reordered),
      cmocka_unit_test(credits_under_a_slow_receiver),
      cmocka_unit_test(injected_error_is_peer_lost_everywhere),
      cmocka_unit_test(data_path_cost_per_chunk),
  };
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
