/* test_allreduce_broadcast.c - allreduce and broadcast as real processes, 1..8
 * ranks, every dtype x op, counts 0, 1, size-1, primes and several MiB, in
 * place and out of place, against a serial reference in double or wide
 * integers on fresh random data. Also checks that every rank ends with the
 * same bits. Variants force the ring with tiny chunks (many loops, empty
 * chunks), recursive doubling on non-powers of two (and on 4 ranks, where
 * auto now picks the one-round exchange for small counts), the exchange at
 * every count that fits a chunk, wider trees, and a
 * 32-rank stress group (small counts) on this 2-core machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

static uint64_t base_seed;

typedef struct group {
  int big;          /* include the multi-MiB cases */
  int all_small;    /* every dtype x op at the small counts */
  int hosts;        /* 0: one host; 1: uneven hosts {0,1,2} {3,4} {5..}; 2: rank % 3; 3: rank % 2 */
  int sparse;       /* small counts: every 17th combination only (still every dtype x op pair,
                       both in-place forms, every count) */
  int few_roots;    /* broadcasts from roots 0, 1, n/2+1 and n-1 only */
} group;

static int report(int rank, const char *what, size_t count, weft_dtype dt, weft_op op, int in_place,
                  size_t i, double got, double want) {
  fprintf(stderr,
          "rank %d: %s count=%zu %s %s %s: element %zu is %.17g, reference %.17g (seed %llu)\n",
          rank, what, count, weft_dtype_name(dt), weft_op_name(op), in_place ? "in-place" : "out-of-place",
          i, got, want, (unsigned long long)base_seed);
  return 1;
}

static int check_allreduce(weft_comm *comm, int rank, int n, size_t count, weft_dtype dt, weft_op op,
                           int in_place, int tag, uint64_t *hash) {
  size_t esz = weft_dtype_size(dt);
  unsigned char *in = malloc(count * esz + 8), *out = malloc(count * esz + 8), *tmp = malloc(count * esz + 8);
  double *acc = malloc(sizeof(double) * (count + 1)), *mag = malloc(sizeof(double) * (count + 1));
  uint64_t *iacc = malloc(sizeof(uint64_t) * (count + 1));
  int bad = 0;
  harness_fill(in, count, dt, op, harness_seed(base_seed, rank, tag));
  memset(out, 0xA5, count * esz);
  weft_status st = weft_allreduce(comm, in, in_place ? (void *)in : out, count, dt, op);
  if (st) {
    fprintf(stderr, "rank %d: allreduce count=%zu %s %s failed: %s\n", rank, count, weft_dtype_name(dt),
            weft_op_name(op), weft_last_error(comm));
    bad = 1;
    goto done;
  }
  const unsigned char *res = in_place ? in : out;
  for (int q = 0; q < n; q++) {
    harness_fill(tmp, count, dt, op, harness_seed(base_seed, q, tag));
    harness_ref_fold(acc, mag, iacc, tmp, count, dt, op, q == 0);
  }
  for (size_t i = 0; i < count && bad < 3; i++) {
    if (harness_is_float(dt)) {
      double want = op == WEFT_AVG ? acc[i] / n : acc[i];
      double got = harness_get(res, i, dt), eps = harness_eps(dt);
      /* each of the n-1 roundings can be off by eps of the partial result */
      double tol = op == WEFT_MIN || op == WEFT_MAX ? 0
                   : op == WEFT_PROD ? (n + 1) * eps * fabs(want)
                                     : (n + 1) * eps * (op == WEFT_AVG ? mag[i] / n : mag[i]) + eps * fabs(want);
      if (!(fabs(got - want) <= tol))
        bad += report(rank, "allreduce", count, dt, op, in_place, i, got, want);
    } else {
      int64_t want = harness_wrap(iacc[i], dt);
      /* avg sums i8, u8 and i32 in 64 bits (no wrap for n <= 64 ranks), i64 in
       * 64 bits (may wrap); C division truncates toward zero, as documented */
      if (op == WEFT_AVG) want = (dt == WEFT_I64 ? want : (int64_t)iacc[i]) / n;
      int64_t got = harness_get_int(res, i, dt);
      if (got != want) bad += report(rank, "allreduce", count, dt, op, in_place, i, (double)got, (double)want);
    }
  }
  *hash = harness_hash(*hash, res, count * esz);
done:
  free(in); free(out); free(tmp); free(acc); free(mag); free(iacc);
  return bad != 0;
}

static int check_broadcast(weft_comm *comm, int rank, int n, size_t count, weft_dtype dt, int root,
                           int in_place, int tag) {
  size_t esz = weft_dtype_size(dt);
  unsigned char *send = malloc(count * esz + 8), *recv = malloc(count * esz + 8), *want = malloc(count * esz + 8);
  int bad = 0;
  harness_fill(want, count, dt, WEFT_SUM, harness_seed(base_seed, root, tag));
  if (rank == root) memcpy(send, want, count * esz);
  memset(recv, 0x5A, count * esz);
  void *dst = rank == root && in_place ? (void *)send : recv;
  weft_status st = weft_broadcast(comm, rank == root ? send : NULL, dst, count, dt, root);
  if (st) {
    fprintf(stderr, "rank %d: broadcast count=%zu root=%d failed: %s\n", rank, count, root, weft_last_error(comm));
    bad = 1;
  } else if (count && memcmp(dst, want, count * esz)) {
    size_t i = 0;
    while (((unsigned char *)dst)[i] == want[i]) i++;
    fprintf(stderr, "rank %d: broadcast n=%d count=%zu %s root=%d: byte %zu differs (seed %llu)\n", rank, n,
            count, weft_dtype_name(dt), root, i, (unsigned long long)base_seed);
    bad = 1;
  }
  free(send); free(recv); free(want);
  return bad;
}

static int rank_main(int rank, int n, const weft_unique_id *id, void *arg) {
  const group *g = arg;
  if (g->hosts) {
    /* pretend hosts: the hierarchical allreduce runs (shm within a pretend
     * host, tcp across; or tcp throughout when the suite forces tcp) */
    char host[32];
    snprintf(host, sizeof host, "pretend-host-%d",
             g->hosts == 1   ? (rank < 3 ? 0 : rank < 5 ? 1 : 2)
             : g->hosts == 2 ? rank % 3
                             : rank % 2);
    setenv("WEFT_HOST_ID", host, 1);
    const char *tp = getenv("WEFT_TRANSPORT");
    if (tp && !strcmp(tp, "shm")) unsetenv("WEFT_TRANSPORT");
  }
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0, tag = 0, combo = 0;
  uint64_t hash = 1469598103934665603ULL;
  size_t small[] = {0, 1, (size_t)(n > 1 ? n - 1 : 2), 2, 7, 13, 31, 127, 1021, 4099, 65537};
  for (size_t c = 0; c < sizeof small / sizeof small[0]; c++)
    for (int dt = 0; dt < WEFT_DTYPE_COUNT; dt++)
      for (int op = 0; op < WEFT_OP_COUNT; op++)
        for (int ip = 0; ip < 2; ip++) {
          if (g->sparse ? combo++ % 17 : !g->all_small && (dt + op + ip + (int)c) % 4) continue;
          bad += check_allreduce(comm, rank, n, small[c], (weft_dtype)dt, (weft_op)op, ip, ++tag, &hash);
        }
  if (g->big) {
    static const struct { weft_dtype dt; weft_op op; int ip; } big[] = {
        {WEFT_F32, WEFT_SUM, 0}, {WEFT_F32, WEFT_AVG, 1}, {WEFT_BF16, WEFT_SUM, 1}, {WEFT_F16, WEFT_MAX, 0},
        {WEFT_I32, WEFT_SUM, 0}, {WEFT_F64, WEFT_PROD, 1}, {WEFT_I8, WEFT_MIN, 0}, {WEFT_U8, WEFT_SUM, 1},
        {WEFT_I64, WEFT_AVG, 0}};
    for (size_t b = 0; b < sizeof big / sizeof big[0]; b++)
      bad += check_allreduce(comm, rank, n, 786433, big[b].dt, big[b].op, big[b].ip, ++tag, &hash);
  }
  size_t bc[] = {0, 1, (size_t)(n > 1 ? n - 1 : 2), 13, 4099, 65537};
  for (int root = 0; root < n; root++) {
    if (g->few_roots && root > 1 && root != n / 2 + 1 && root != n - 1) continue;
    for (size_t c = 0; c < sizeof bc / sizeof bc[0]; c++)
      bad += check_broadcast(comm, rank, n, bc[c], (weft_dtype)((root + (int)c) % WEFT_DTYPE_COUNT), root,
                             (int)(c % 2), ++tag);
  }
  if (g->big) bad += check_broadcast(comm, rank, n, 786433 * 2, WEFT_F32, n - 1, 0, ++tag);
  if (weft_barrier(comm)) {
    fprintf(stderr, "rank %d: barrier failed: %s\n", rank, weft_last_error(comm));
    bad++;
  }
  harness_shm->word[rank] = hash;
  weft_comm_destroy(comm);
  return bad != 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED_BUILD 1
#endif
#endif
#ifndef SANITIZED_BUILD
#define SANITIZED_BUILD 0
#endif

static void run_group(int n, const char *const *env, int big, int all_small, int hosts) {
  /* WEFT_TEST_QUICK (the sanitizer pass): the same shapes, fewer combinations */
  int quick = getenv("WEFT_TEST_QUICK") != NULL;
  if (quick && n >= 5) big = all_small = 0;
  /* every dtype x op x in-place x count ran in the optimized pass; in a
   * sanitizer build, every 4th of them (still every dtype, op and count) */
  if (SANITIZED_BUILD) all_small = 0;
  /* 32 ranks took 40 of the sanitizer pass's 94 s over shm. What 32 ranks
   * adds is the group's shape (ring and tree depth, fold-free powers of
   * two); every dtype x op x count runs at 1..8 ranks. So there, under
   * WEFT_TEST_QUICK: every 17th combination (still every dtype x op pair)
   * and four roots. */
  /* WEFT_TEST_SPARSE (the tcp and verbs runs): that sparse matrix at every
   * size. A transport moves bytes: what it sees of a combination is the
   * count, the dtype's size and in place or not, and the reductions are the
   * same code over every transport (the shm run keeps the full matrix). */
  int sparse = (quick && n >= 16) || getenv("WEFT_TEST_SPARSE") != NULL;
  group g = {big, all_small, hosts, sparse, quick && n >= 16};
  harness_init();
  int failed = harness_run(n, env, 240, rank_main, &g);
  assert_int_equal(failed, 0);
  for (int r = 1; r < n; r++)
    if (harness_shm->word[r] != harness_shm->word[0]) {
      fprintf(stderr, "rank %d's results differ bitwise from rank 0's\n", r);
      fail();
    }
}

#define GROUP_TEST(name, n, env, big, all)                   \
  static void name(void **state) {                           \
    (void)state;                                             \
    static const char *const vars[] = env;                   \
    run_group(n, vars, big, all, 0);                         \
  }
#define HOSTS_TEST(name, n, env, big, all, hosts) \
  static void name(void **state) {                \
    (void)state;                                  \
    static const char *const vars[] = env;        \
    run_group(n, vars, big, all, hosts);          \
  }
#define NO_ENV {NULL}
#define RING_TINY {"WEFT_ALGO=ring", "WEFT_CHUNK_BYTES=4096", NULL}
#define RD_ONLY {"WEFT_ALGO=rd", NULL}
#define EXCHANGE_ONLY {"WEFT_ALGO=exchange", NULL}
#define WIDE_TREE {"WEFT_BCAST_FANOUT=3", "WEFT_BCAST_CHAIN_BYTES=1000000000", NULL}

GROUP_TEST(ranks1, 1, NO_ENV, 1, 1)
GROUP_TEST(ranks2, 2, NO_ENV, 1, 1)
GROUP_TEST(ranks3, 3, NO_ENV, 1, 1)
GROUP_TEST(ranks4, 4, NO_ENV, 1, 1)
GROUP_TEST(ranks5, 5, NO_ENV, 1, 0)
GROUP_TEST(ranks6, 6, NO_ENV, 1, 0)
GROUP_TEST(ranks7, 7, NO_ENV, 1, 0)
GROUP_TEST(ranks8, 8, NO_ENV, 1, 0)
/* the stress case: 32 ranks on this machine's 2 cores, small counts */
GROUP_TEST(ranks32, 32, NO_ENV, 0, 0)
GROUP_TEST(ring_tiny_chunks3, 3, RING_TINY, 0, 1)
GROUP_TEST(ring_tiny_chunks5, 5, RING_TINY, 0, 0)
GROUP_TEST(ring_tiny_chunks8, 8, RING_TINY, 0, 0)
GROUP_TEST(rd_non_power_of_two3, 3, RD_ONLY, 0, 1)
GROUP_TEST(rd_non_power_of_two6, 6, RD_ONLY, 0, 0)
GROUP_TEST(rd_power_of_two4, 4, RD_ONLY, 0, 0)
/* the one-round exchange at every count that fits a chunk (auto stops at 16 KiB) */
GROUP_TEST(exchange_forced3, 3, EXCHANGE_ONLY, 0, 1)
GROUP_TEST(tree_fanout3, 7, WIDE_TREE, 0, 0)
/* hierarchical allreduce: one host (reduce, divide, broadcast), uneven and
 * interleaved pretend hosts, tiny chunks so every phase runs many chunks */
#define HIER {"WEFT_ALGO=hier", NULL}
#define HIER_TINY {"WEFT_CHUNK_BYTES=4096", NULL}
GROUP_TEST(hier_one_host5, 5, HIER, 0, 1)
HOSTS_TEST(hier_uneven_hosts6, 6, NO_ENV, 1, 0, 1)
HOSTS_TEST(hier_interleaved_hosts8, 8, HIER_TINY, 0, 0, 2)
/* hosts of equal sizes, interleaved: the split form (every rank crosses the
 * network with its share, segments pipelined), 2 hosts x 2 with the large
 * counts, 3 hosts x 2 with tiny chunks (many segments, odd tails) */
HOSTS_TEST(hier_split_hosts4, 4, NO_ENV, 1, 0, 3)
HOSTS_TEST(hier_split_hosts6, 6, HIER_TINY, 0, 1, 2)

int main(void) {
  const char *fixed = getenv("WEFT_TEST_SEED");
  base_seed = fixed ? strtoull(fixed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  printf("# seed %llu (set WEFT_TEST_SEED to repeat)\n", (unsigned long long)base_seed);
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ranks1), cmocka_unit_test(ranks2), cmocka_unit_test(ranks3),
      cmocka_unit_test(ranks4), cmocka_unit_test(ranks5), cmocka_unit_test(ranks6),
      cmocka_unit_test(ranks7), cmocka_unit_test(ranks8), cmocka_unit_test(ranks32),
      cmocka_unit_test(ring_tiny_chunks3),
      cmocka_unit_test(ring_tiny_chunks5), cmocka_unit_test(ring_tiny_chunks8),
      cmocka_unit_test(rd_non_power_of_two3), cmocka_unit_test(rd_non_power_of_two6),
      cmocka_unit_test(rd_power_of_two4), cmocka_unit_test(exchange_forced3),
      cmocka_unit_test(tree_fanout3), cmocka_unit_test(hier_one_host5),
      cmocka_unit_test(hier_uneven_hosts6), cmocka_unit_test(hier_interleaved_hosts8),
      cmocka_unit_test(hier_split_hosts4), cmocka_unit_test(hier_split_hosts6),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
