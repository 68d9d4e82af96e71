/* test_soak.c - 100 000 small allreduces (8..64 bytes) between 2 ranks as
 * processes, over the transport WEFT_TRANSPORT names: fresh random data each
 * call, checked against a serial reference every SOAK_CHECK_EVERY calls, and
 * resident memory (VmRSS) after 100 000 calls within a small bound of what
 * it was after 10 000 (no per-call growth: leaks, queues, counters that
 * index memory). Under the sanitizers (WEFT_TEST_QUICK) fewer calls and no
 * RSS bound: ASan's quarantine grows on purpose, and its leak check at
 * exit takes over. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define SOAK_CALLS 100000
#define SOAK_CHECK_EVERY 7      /* prime: checks land on every dtype and count */
#define SOAK_RSS_BOUND_KIB 1024 /* 10 bytes a call over 90 000 calls would exceed it */

static uint64_t base_seed;

typedef struct soak_args {
  long calls;
} soak_args;

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[128];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
  if (f) fclose(f);
  return kib;
}

static int soak_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const soak_args *a = arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  uint64_t buf[8], tmp[8], iacc[8];
  double acc[16], mag[16];
  long rss_early = 0;
  double t0 = harness_now();
  int bad = 0;
  for (long it = 0; it < a->calls && !bad; it++) {
    /* alternately 1..8 i64 and 2..16 f32: 8..64 bytes */
    weft_dtype dt = it % 2 ? WEFT_F32 : WEFT_I64;
    size_t count = dt == WEFT_I64 ? 1 + (size_t)(it / 2 % 8) : 2 + 2 * (size_t)(it / 2 % 8);
    harness_fill(buf, count, dt, WEFT_SUM, harness_seed(base_seed, rank, (int)it));
    weft_status st = weft_allreduce(comm, buf, buf, count, dt, WEFT_SUM);
    if (st) {
      fprintf(stderr, "rank %d: call %ld (%zu x %s) failed: %s\n", rank, it, count,
              weft_dtype_name(dt), weft_last_error(comm));
      bad = 1;
      break;
    }
    if (it % SOAK_CHECK_EVERY == 0) {
      for (int q = 0; q < size; q++) {
        harness_fill(tmp, count, dt, WEFT_SUM, harness_seed(base_seed, q, (int)it));
        harness_ref_fold(acc, mag, iacc, tmp, count, dt, WEFT_SUM, q == 0);
      }
      for (size_t i = 0; i < count && !bad; i++) {
        /* multiples of 1/64 summed over 2 ranks are exact in f32 */
        bool ok = dt == WEFT_F32 ? harness_get(buf, i, dt) == acc[i]
                                 : harness_get_int(buf, i, dt) == (int64_t)iacc[i];
        if (!ok) {
          fprintf(stderr, "rank %d: call %ld element %zu differs from the reference (seed %llu)\n",
                  rank, it, i, (unsigned long long)base_seed);
          bad = 1;
        }
      }
    }
    if (it + 1 == a->calls / 10) rss_early = rss_kib();
  }
  long rss_late = rss_kib();
  harness_shm->seconds[rank] = harness_now() - t0;
  harness_shm->word[rank] = (uint64_t)(rss_late - rss_early);
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank],
           "VmRSS %ld KiB after %ld calls, %ld KiB after %ld", rss_early, a->calls / 10, rss_late,
           a->calls);
  weft_comm_destroy(comm);
  return bad;
}

static void soak_small_allreduces(void **state) {
  (void)state;
  bool quick = getenv("WEFT_TEST_QUICK") != NULL;
  soak_args a = {.calls = quick ? SOAK_CALLS / 10 : SOAK_CALLS};
  harness_init();
  double t0 = harness_now();
  int failed = harness_run(2, NULL, 120, soak_rank, &a);
  const char *tp = getenv("WEFT_TRANSPORT");
  for (int r = 0; r < 2; r++)
    printf("soak over %s, rank %d: %ld calls in %.1f s; %s (growth %lld KiB)\n", tp ? tp : "auto",
           r, a.calls, harness_shm->seconds[r], harness_shm->message[r],
           (long long)(int64_t)harness_shm->word[r]);
  printf("soak: %.1f s in all\n", harness_now() - t0);
  assert_int_equal(failed, 0);
  if (!quick)
    for (int r = 0; r < 2; r++) assert_true((int64_t)harness_shm->word[r] <= SOAK_RSS_BOUND_KIB);
}

int main(void) {
  base_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("soak seed %llu\n", (unsigned long long)base_seed);
  const struct CMUnitTest tests[] = {cmocka_unit_test(soak_small_allreduces)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
