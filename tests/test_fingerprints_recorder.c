/* test_fingerprints_recorder.c - WEFT_CHECK=1 and the flight recorder, as real processes.
 * Ranks that disagree on a collective in a way the chunk tags cannot see
 * (another op, another dtype of the same size, another root, another
 * collective) would get silently wrong data or hang; with WEFT_CHECK every
 * rank fails with WEFT_ERR_MISMATCH naming both sides, within seconds.
 * Agreeing calls still give the reference result. A timeout prints the
 * flight recorder with the stuck call, its state and the peer it waits for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

static uint64_t base_seed;

typedef enum disagreement {
  OP, DTYPE, ROOT, KIND, COUNT, ZERO_COUNT, BCAST_COUNT, NONE
} disagreement;

/* Rank 2 is the odd one out (3 ranks). */
static int disagreeing_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  disagreement d = *(const disagreement *)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  size_t count = 1000;
  float *in = malloc(count * 4 * (size_t)n), *out = malloc(count * 4 * (size_t)n);
  harness_fill(in, count * (size_t)n, WEFT_F32, WEFT_SUM, harness_seed(base_seed, rank, (int)d));
  bool odd = rank == 2;
  double t0 = harness_now();
  weft_status st;
  switch (d) {
    case OP: st = weft_allreduce(comm, in, out, count, WEFT_F32, odd ? WEFT_MAX : WEFT_SUM); break;
    case DTYPE: st = weft_allreduce(comm, in, out, count, odd ? WEFT_I32 : WEFT_F32, WEFT_SUM); break;
    case ROOT: st = weft_broadcast(comm, in, out, count, WEFT_F32, odd ? 1 : 0); break;
    case KIND:
      st = odd ? weft_alltoall(comm, in, out, count, WEFT_F32)
               : weft_allgather(comm, in, out, count, WEFT_F32);
      break;
    case COUNT: st = weft_allreduce(comm, in, out, odd ? count - 1 : count, WEFT_F32, WEFT_SUM); break;
    /* a count-0 call moves nothing, but its fingerprint still takes part */
    case ZERO_COUNT: st = weft_allreduce(comm, in, out, odd ? 0 : 10, WEFT_F32, WEFT_SUM); break;
    /* the last rank of the tree wants one element more: every rank fails in this call */
    case BCAST_COUNT: st = weft_broadcast(comm, in, out, odd ? 301 : 300, WEFT_F32, 0); break;
    default: st = weft_allreduce(comm, in, out, count, WEFT_F32, WEFT_SUM); break;
  }
  int bad = 0;
  double took = harness_now() - t0;
  if (d == NONE) {
    /* the reference: a serial sum in double over every rank's data */
    float *tmp = malloc(count * 4 * (size_t)n);
    for (size_t i = 0; i < count && !st; i++) {
      double want = 0, mag = 0;
      for (int q = 0; q < n; q++) {
        harness_fill(tmp, count * (size_t)n, WEFT_F32, WEFT_SUM, harness_seed(base_seed, q, (int)d));
        want += tmp[i];
        mag += fabs(tmp[i]);
      }
      if (fabs(out[i] - want) > (n + 1) * 1.2e-7 * mag + 1e-6) {
        fprintf(stderr, "rank %d: element %zu is %g, reference %g (seed %llu)\n", rank, i, out[i],
                want, (unsigned long long)base_seed);
        bad = 1;
        break;
      }
    }
    free(tmp);
    if (st) {
      fprintf(stderr, "rank %d: agreeing call failed: %s\n", rank, weft_last_error(comm));
      bad = 1;
    }
  } else {
    const char *msg = weft_last_error(comm);
    if (st != WEFT_ERR_MISMATCH) {
      fprintf(stderr, "rank %d: disagreement %d gave %s (%s), expected WEFT_ERR_MISMATCH\n", rank,
              (int)d, weft_status_name(st), msg);
      bad = 1;
    } else if (d != COUNT && !strstr(msg, "rank 2 called")) {
      fprintf(stderr, "rank %d: the message does not name the odd rank: %s\n", rank, msg);
      bad = 1;
    }
    const char *sides[2][2] = {{"count=0", "count=10"}, {"count=301", "count=300"}};
    if (d == ZERO_COUNT || d == BCAST_COUNT)
      for (int i = 0; i < 2; i++)
        if (st == WEFT_ERR_MISMATCH && !strstr(msg, sides[d == BCAST_COUNT][i])) {
          fprintf(stderr, "rank %d: the message does not name %s: %s\n", rank,
                  sides[d == BCAST_COUNT][i], msg);
          bad = 1;
        }
    if (took > 20) {
      fprintf(stderr, "rank %d: detection took %.1f s\n", rank, took);
      bad = 1;
    }
  }
  free(in);
  free(out);
  weft_comm_destroy(comm);
  return bad;
}

static void run_disagreement(disagreement d) {
  static const char *const env[] = {"WEFT_CHECK=1", "WEFT_TIMEOUT=30", NULL};
  harness_init();
  assert_int_equal(harness_run(3, env, 60, disagreeing_rank, &d), 0);
}

static void ops_differ(void **state) { (void)state; run_disagreement(OP); }
static void dtypes_of_one_size_differ(void **state) { (void)state; run_disagreement(DTYPE); }
static void roots_differ(void **state) { (void)state; run_disagreement(ROOT); }
static void collectives_differ(void **state) { (void)state; run_disagreement(KIND); }
static void counts_differ(void **state) { (void)state; run_disagreement(COUNT); }
static void count_zero_differs(void **state) { (void)state; run_disagreement(ZERO_COUNT); }
static void broadcast_counts_differ(void **state) { (void)state; run_disagreement(BCAST_COUNT); }
static void agreeing_calls_are_correct(void **state) { (void)state; run_disagreement(NONE); }

/* Rank 1 never makes the call: rank 0 times out and prints its recorder. */
static int stuck_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  float v[4] = {1, 2, 3, 4};
  if (weft_allreduce(comm, v, v, 4, WEFT_F32, WEFT_SUM)) bad = 1; /* one call that completes */
  if (rank == 0) {
    char path[] = "/tmp/weft-recorder-XXXXXX";
    int fd = mkstemp(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    weft_status st = weft_allreduce(comm, v, v, 4, WEFT_F32, WEFT_SUM);
    fflush(stderr);
    dup2(saved, 2);
    char text[8192] = "";
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = 0;
    close(fd);
    unlink(path);
    if (st != WEFT_ERR_TIMEOUT || !strstr(text, "flight recorder (timeout)") ||
        !strstr(text, "#1 weft_allreduce") || !strstr(text, ": done") ||
        !strstr(text, "#2 weft_allreduce") || !strstr(text, "waiting for")) {
      fprintf(stderr, "rank 0: status %s; recorder output:\n%s\n", weft_status_name(st), text);
      bad = 1;
    }
  } else {
    struct timespec pause = {4, 0}; /* outlives rank 0's timeout, then leaves */
    nanosleep(&pause, NULL);
  }
  weft_comm_destroy(comm);
  return bad;
}

static void timeout_prints_the_recorder(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=1.5", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, stuck_rank, NULL), 0);
}

int main(void) {
  const char *seed = getenv("WEFT_TEST_SEED");
  base_seed = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("# seed %llu (WEFT_TEST_SEED reproduces)\n", (unsigned long long)base_seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ops_differ),         cmocka_unit_test(dtypes_of_one_size_differ),
      cmocka_unit_test(roots_differ),       cmocka_unit_test(collectives_differ),
      cmocka_unit_test(counts_differ),      cmocka_unit_test(count_zero_differs),
      cmocka_unit_test(broadcast_counts_differ), cmocka_unit_test(agreeing_calls_are_correct),
      cmocka_unit_test(timeout_prints_the_recorder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
