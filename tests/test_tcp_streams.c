/* test_tcp_streams.c - several TCP streams per peer and the helper threads
 * that drive them (WEFT_TCP_STREAMS, WEFT_TCP_THREADS): allreduce,
 * broadcast, allgather and alltoall right at 2..4 ranks for 1..4 streams
 * and 0..3 threads, against a serial reference in double, also between ranks
 * that ask for different numbers (each pair takes the smaller); and a stream cut
 * in the middle of a call (shutdown of its socket) fails every rank, naming
 * a peer, within the timeout: never a hang, never a wrong result. And the
 * congestion control each data socket gets (WEFT_TCP_CONGESTION). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "src/comm/comm.h"
#include "transports/tcp/tcp.h"

/* Values k/8 with |k| < 8192: any sum of 4 is exact in float, so the
 * reference (double) and the result must agree bit for bit. */
static float value(uint64_t *rng) {
  return (float)((int)(harness_rng(rng) % 16384) - 8192) / 8.0f;
}
static void fill(float *v, size_t n, int rank, int tag) {
  uint64_t rng = harness_seed(0x5eed5, rank, tag);
  for (size_t i = 0; i < n; i++) v[i] = value(&rng);
}

static int bad(int rank, const char *what, size_t i, double got, double want) {
  fprintf(stderr, "rank %d: %s [%zu] = %g, expected %g\n", rank, what, i, got, want);
  return 1;
}

/* Allreduce (a count one stream carries alone, one cut over every stream,
 * one of odd length), broadcast, allgather, alltoall. */
static int run_collectives(weft_comm *comm, int rank, int size) {
  static const size_t counts[] = {1000, 300007, 65536 * 3 + 5};
  for (int c = 0; c < 3; c++) {
    size_t n = counts[c];
    float *v = malloc(n * sizeof *v), *in = malloc(n * sizeof *in);
    double *ref = calloc(n, sizeof *ref);
    for (int r = 0; r < size; r++) {
      fill(in, n, r, c);
      for (size_t i = 0; i < n; i++) ref[i] += in[i];
    }
    fill(v, n, rank, c);
    if (weft_allreduce(comm, v, v, n, WEFT_F32, WEFT_SUM)) {
      fprintf(stderr, "rank %d: allreduce: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    for (size_t i = 0; i < n; i++)
      if ((double)v[i] != ref[i]) return bad(rank, "allreduce", i, v[i], ref[i]);
    free(v);
    free(in);
    free(ref);
  }
  size_t n = 500003;
  int root = size - 1;
  float *b = malloc(n * sizeof *b), *want = malloc(n * sizeof *want);
  fill(want, n, root, 10);
  if (rank == root)
    memcpy(b, want, n * sizeof *b);
  else
    memset(b, 0, n * sizeof *b);
  if (weft_broadcast(comm, b, b, n, WEFT_F32, root)) {
    fprintf(stderr, "rank %d: broadcast: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    if (b[i] != want[i]) return bad(rank, "broadcast", i, b[i], want[i]);
  free(b);
  free(want);

  size_t per = 70001;
  float *mine = malloc(per * sizeof *mine), *all = malloc(per * (size_t)size * sizeof *all);
  float *theirs = malloc(per * (size_t)size * sizeof *theirs);
  fill(mine, per, rank, 20);
  if (weft_allgather(comm, mine, all, per, WEFT_F32)) {
    fprintf(stderr, "rank %d: allgather: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  for (int r = 0; r < size; r++) {
    fill(theirs, per, r, 20);
    for (size_t i = 0; i < per; i++)
      if (all[(size_t)r * per + i] != theirs[i])
        return bad(rank, "allgather", (size_t)r * per + i, all[(size_t)r * per + i], theirs[i]);
  }
  /* alltoall: block r of rank q's input is fill(q, 30 + r); rank r gets
   * block q from every q */
  float *send = malloc(per * (size_t)size * sizeof *send);
  for (int r = 0; r < size; r++) fill(send + (size_t)r * per, per, rank, 30 + r);
  if (weft_alltoall(comm, send, all, per, WEFT_F32)) {
    fprintf(stderr, "rank %d: alltoall: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  for (int q = 0; q < size; q++) {
    fill(theirs, per, q, 30 + rank);
    for (size_t i = 0; i < per; i++)
      if (all[(size_t)q * per + i] != theirs[i])
        return bad(rank, "alltoall", (size_t)q * per + i, all[(size_t)q * per + i], theirs[i]);
  }
  free(mine);
  free(all);
  free(theirs);
  free(send);
  return 0;
}

typedef struct streams_case {
  int streams, threads;
} streams_case;

static int collectives_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const streams_case *k = arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  /* the report names the streams (and helpers) a pair uses */
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    const char *tp, *why;
    weft_comm_peer_transport(comm, p, &tp, &why);
    char want[64];
    if (k->streams > 1)
      snprintf(want, sizeof want, "tcp x%d streams", k->streams);
    else
      snprintf(want, sizeof want, "tcp to ");
    if (strcmp(tp, "tcp") || strncmp(why, want, strlen(want)) ||
        (k->streams > 1 && k->threads > 0 && !strstr(why, "helper thread")) ||
        (k->threads == 0 && strstr(why, "helper thread"))) {
      fprintf(stderr, "rank %d: peer %d: %s (%s), expected \"%s...\"\n", rank, p, tp, why, want);
      return 1;
    }
  }
  int rc = run_collectives(comm, rank, size);
  /* twice: the second runs on connections that are already up */
  if (!rc) rc = run_collectives(comm, rank, size);
  weft_comm_destroy(comm);
  return rc;
}

static void test_streams_threads_collectives(void **state) {
  (void)state;
  harness_init();
  int failed = 0;
  for (int s = 1; s <= 4; s++)
    for (int t = 0; t <= 3; t++) {
      streams_case k = {s, t};
      int ranks = 2 + (s + t) % 3;
      char es[32], et[32];
      snprintf(es, sizeof es, "WEFT_TCP_STREAMS=%d", s);
      snprintf(et, sizeof et, "WEFT_TCP_THREADS=%d", t);
      const char *env[] = {"WEFT_TRANSPORT=tcp", es, et, "WEFT_TIMEOUT=60", NULL};
      fprintf(stderr, "  %d streams, %d threads, %d ranks\n", s, t, ranks);
      int f = harness_run(ranks, env, 120, collectives_rank, &k);
      if (f) fprintf(stderr, "  -> %d ranks failed\n", f);
      failed += f;
    }
  assert_int_equal(failed, 0);
}

/* Ranks that ask for different numbers (hosts of different sizes): each
 * pair takes the smaller, both ends agree, and the results are right. */
static int uneven_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  char n[16];
  snprintf(n, sizeof n, "%d", 1 + rank);
  setenv("WEFT_TCP_STREAMS", n, 1);
  setenv("WEFT_TCP_THREADS", rank % 2 ? "1" : "0", 1);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    const char *tp, *why;
    weft_comm_peer_transport(comm, p, &tp, &why);
    int pair = 1 + (rank < p ? rank : p);
    char want[64];
    if (pair > 1)
      snprintf(want, sizeof want, "tcp x%d streams", pair);
    else
      snprintf(want, sizeof want, "tcp to ");
    if (strncmp(why, want, strlen(want))) {
      fprintf(stderr, "rank %d: peer %d: %s, expected \"%s...\"\n", rank, p, why, want);
      return 1;
    }
  }
  int rc = run_collectives(comm, rank, size);
  weft_comm_destroy(comm);
  return rc;
}

static void test_uneven_stream_counts(void **state) {
  (void)state;
  harness_init();
  const char *env[] = {"WEFT_TRANSPORT=tcp", "WEFT_TIMEOUT=60", NULL};
  assert_int_equal(harness_run(4, env, 120, uneven_rank, NULL), 0);
}

/* ---- a stream cut in the middle of a call ------------------------------ */

#define CUT_TIMEOUT "5"
#define CUT_FAIL_WITHIN_S 15.0

static atomic_int calls_done;
static weft_comm *cut_comm;

/* Rank 0 cuts stream 1 of its collectives connection to rank 1 while the
 * ranks run allreduces back to back, so a call is (almost surely) under
 * way; reading the connection table from here is a test's liberty. */
static void *cutter(void *arg) {
  (void)arg;
  while (atomic_load(&calls_done) < 3) usleep(1000);
  usleep(2000);
  weft_peer_table *l = &cut_comm->core.links;
  for (int t = 0; t < l->ntps; t++) {
    if (l->tps[t].ops != &weft_transport_tcp) continue;
    tcp_ctx *ctx = tcp_ctx_of(l->tps[t].ctx);
    tcp_conn *c = ctx->conns[tcp_conn_index(1, WEFT_TP_CHANNEL_COLL)];
    if (c && c->nstreams > 1) {
      fprintf(stderr, "  rank 0 cuts stream 1 of %d to rank 1 after %d calls\n", c->nstreams,
              atomic_load(&calls_done));
      shutdown(c->streams[1].fd, SHUT_RDWR);
      return NULL;
    }
  }
  fprintf(stderr, "  rank 0 found no stream to cut\n");
  return NULL;
}

static int cut_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  cut_comm = comm;
  pthread_t th;
  if (rank == 0 && pthread_create(&th, NULL, cutter, NULL)) return 1;
  enum { N = 1 << 20 };
  float *v = malloc(N * sizeof *v);
  weft_status st = WEFT_OK;
  double t0 = 0;
  for (int i = 0; i < 400 && st == WEFT_OK; i++) {
    for (size_t j = 0; j < N; j++) v[j] = 1.0f;
    if (i == 3) t0 = harness_now(); /* about when the cut comes */
    st = weft_allreduce(comm, v, v, N, WEFT_F32, WEFT_SUM);
    if (st == WEFT_OK && v[N - 1] != (float)size) {
      fprintf(stderr, "rank %d: call %d gave %g, expected %d\n", rank, i, v[N - 1], size);
      st = WEFT_ERR_INTERNAL;
    }
    atomic_fetch_add(&calls_done, 1);
  }
  harness_record(rank, st, t0, comm);
  if (rank == 0) pthread_join(th, NULL);
  weft_comm_destroy(comm);
  free(v);
  return 0;
}

static void cut_case(int ranks, int threads) {
  harness_init();
  char et[32];
  snprintf(et, sizeof et, "WEFT_TCP_THREADS=%d", threads);
  const char *env[] = {"WEFT_TRANSPORT=tcp", "WEFT_TCP_STREAMS=3", et,
                       "WEFT_TIMEOUT=" CUT_TIMEOUT, NULL};
  fprintf(stderr, "  %d ranks, 3 streams, %d threads\n", ranks, threads);
  assert_int_equal(harness_run(ranks, env, 60, cut_rank, NULL), 0);
  /* Every rank fails of the cut itself, not at its timeout, and its
   * sentence names a peer and the stream (the first cause, passed on). */
  for (int r = 0; r < ranks; r++) {
    assert_true(harness_shm->status[r] < 0);
    assert_int_not_equal(harness_shm->status[r], WEFT_ERR_TIMEOUT);
    assert_true(harness_shm->seconds[r] < CUT_FAIL_WITHIN_S);
    assert_non_null(strstr(harness_shm->message[r], "peer"));
    assert_non_null(strstr(harness_shm->message[r], "stream 1 of 3"));
  }
}

static void test_stream_cut_caller_driven(void **state) {
  (void)state;
  cut_case(3, 0);
}

static void test_stream_cut_helper_driven(void **state) {
  (void)state;
  cut_case(3, 2);
}

/* ---- congestion control (WEFT_TCP_CONGESTION) -------------------------- */

/* What a fresh socket gets (the system's default), and whether `name` may be set. */
static void cc_default(char name[NET_CC_NAME]) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  net_get_congestion(fd, name);
  close(fd);
}
static bool cc_allowed(const char *name) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  bool ok = net_set_congestion(fd, name) == 0;
  close(fd);
  return ok;
}

/* Every stream of every collectives connection has `want` at both ends (the
 * dialing end sets it before connecting, the accepting one inherits it from
 * its listener), and an allreduce is right over them. */
static int congestion_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const char *want = arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  enum { N = 300007 };
  float *v = malloc(N * sizeof *v), *in = malloc(N * sizeof *in);
  double *ref = calloc(N, sizeof *ref);
  for (int r = 0; r < size; r++) {
    fill(in, N, r, 40);
    for (size_t i = 0; i < N; i++) ref[i] += in[i];
  }
  fill(v, N, rank, 40);
  int rc = 0;
  if (weft_allreduce(comm, v, v, N, WEFT_F32, WEFT_SUM)) {
    fprintf(stderr, "rank %d: allreduce: %s\n", rank, weft_last_error(comm));
    rc = 1;
  }
  for (size_t i = 0; !rc && i < N; i++)
    if ((double)v[i] != ref[i]) rc = bad(rank, "allreduce", i, v[i], ref[i]);
  int seen = 0;
  weft_peer_table *l = &comm->core.links;
  for (int t = 0; !rc && t < l->ntps; t++) {
    if (l->tps[t].ops != &weft_transport_tcp) continue;
    tcp_ctx *ctx = tcp_ctx_of(l->tps[t].ctx);
    for (int p = 0; p < size; p++) {
      tcp_conn *c = p == rank ? NULL : ctx->conns[tcp_conn_index(p, WEFT_TP_CHANNEL_COLL)];
      for (int i = 0; c && i < c->nstreams; i++) {
        char got[NET_CC_NAME];
        net_get_congestion(c->streams[i].fd, got);
        seen++;
        if (strcmp(got, want)) {
          fprintf(stderr, "rank %d: stream %d to peer %d has %s, expected %s\n", rank, i, p, got,
                  want);
          rc = 1;
        }
      }
    }
    /* the route test itself: loopback and the listener's own address are
     * this host's, an address of TEST-NET-3 (RFC 5737) is not */
    struct sockaddr_storage a;
    socklen_t alen;
    weft_error_sink err;
    if (net_resolve("127.0.0.1", 1, 4, &a, &alen, &err) || !net_addr_is_local(&a, alen) ||
        !net_addr_is_local(&ctx->addr, ctx->addr_len) ||
        net_resolve("203.0.113.9", 1, 4, &a, &alen, &err) || net_addr_is_local(&a, alen)) {
      fprintf(stderr, "rank %d: net_addr_is_local is wrong\n", rank);
      rc = 1;
    }
  }
  /* weft-info says the same (tcp_congestion_describe decides as init does) */
  char desc[200];
  tcp_congestion_describe(desc, sizeof desc);
  if (!rc && !strstr(desc, want)) {
    fprintf(stderr, "rank %d: weft-info says \"%s\", expected %s in it\n", rank, desc, want);
    rc = 1;
  }
  if (!rc && seen < 2 * (size - 1)) {
    fprintf(stderr, "rank %d: %d streams seen, expected %d\n", rank, seen, 2 * (size - 1));
    rc = 1;
  }
  free(v);
  free(in);
  free(ref);
  weft_comm_destroy(comm);
  return rc;
}

static int congestion_refused_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_rank(&comm, id, rank, size);
  const char *msg = weft_last_error(NULL);
  if (st != WEFT_ERR_INVALID || !strstr(msg, "WEFT_TCP_CONGESTION=no-such-control") ||
      !strstr(msg, "refuses")) {
    fprintf(stderr, "rank %d: init said %s: %s\n", rank, weft_status_name(st), msg);
    if (comm) weft_comm_destroy(comm);
    return 1;
  }
  return 0;
}

/* auto: connections over loopback use cubic (reno where cubic is not
 * allowed) where the system's default paces, else keep it; system: the
 * default; a name: that one; a name the kernel refuses: init fails with
 * WEFT_ERR_INVALID and a sentence naming the setting, on every rank. */
static void test_congestion_control(void **state) {
  (void)state;
  harness_init();
  char dflt[NET_CC_NAME], calm[NET_CC_NAME];
  cc_default(dflt);
  if (!dflt[0]) skip(); /* a kernel that does not say */
  bool paces = strcmp(dflt, "cubic") && strcmp(dflt, "reno");
  snprintf(calm, sizeof calm, "%s", !paces ? dflt : cc_allowed("cubic") ? "cubic" : "reno");
  /* a named one that differs from the default where one can: reno is in every kernel,
   * but only the default and what net.ipv4.tcp_allowed_congestion_control lists may be set */
  const char *named = cc_allowed("reno") && strcmp(dflt, "reno") ? "reno" : dflt;
  fprintf(stderr, "  system default %s: auto expects %s, WEFT_TCP_CONGESTION=%s\n", dflt, calm,
          named);
  struct {
    const char *setting, *want;
  } cases[] = {
      {"WEFT_TCP_CONGESTION=auto", calm}, {"WEFT_TCP_CONGESTION=system", dflt}, {NULL, named}};
  char named_env[64];
  snprintf(named_env, sizeof named_env, "WEFT_TCP_CONGESTION=%s", named);
  cases[2].setting = named_env;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const char *env[] = {"WEFT_TRANSPORT=tcp", "WEFT_TCP_STREAMS=2", cases[k].setting,
                         "WEFT_TIMEOUT=60", NULL};
    fprintf(stderr, "  %s\n", cases[k].setting);
    assert_int_equal(harness_run(3, env, 120, congestion_rank, (void *)cases[k].want), 0);
  }
  const char *env[] = {"WEFT_TRANSPORT=tcp", "WEFT_TCP_CONGESTION=no-such-control",
                       "WEFT_TIMEOUT=20", NULL};
  assert_int_equal(harness_run(2, env, 60, congestion_refused_rank, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_streams_threads_collectives),
      cmocka_unit_test(test_uneven_stream_counts),
      cmocka_unit_test(test_stream_cut_caller_driven),
      cmocka_unit_test(test_stream_cut_helper_driven),
      cmocka_unit_test(test_congestion_control),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
