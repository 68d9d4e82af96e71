/* test_harness_crash.c - a rank that crashes inside a CMocka test (the
 * harness forks ranks from the test runner) ends there, is reported as one
 * failed rank with its signal, and fails its test in seconds: the other
 * ranks end by the library's dead-peer detection, or the harness kills them
 * HARNESS_CRASH_GRACE_S after the crash. Before the harness reset the crash
 * signals in each rank, CMocka's handler, inherited across fork, sent the
 * crashed rank back into the test loop to run the rest of the suite while
 * its peers waited for it (a 935 s timeout instead of a failure). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define RANKS 3
#define CRASHING_RANK 1
/* The run's own bound: far above what a crash may take (the grace), far
 * below a collective's timeout, so an old harness fails here, not hangs. */
#define RUN_TIMEOUT_S 60
#define FAST_S 20

/* Rank CRASHING_RANK crashes (raise, or a faulting store) after one allreduce, so every
 * rank is connected to it; the others wait for it in a second allreduce. */
static int crash_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const char *how = arg;
  if (rank == CRASHING_RANK && !strcmp(how, "raise before joining")) raise(SIGSEGV);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  float x = 1;
  weft_status st = weft_allreduce(comm, &x, &x, 1, WEFT_F32, WEFT_SUM);
  if (st) fprintf(stderr, "rank %d: the first allreduce failed: %s\n", rank, weft_last_error(comm));
  if (rank == CRASHING_RANK) {
    if (!strcmp(how, "raise")) {
      raise(SIGSEGV);
    } else { /* a real fault: a store to a page that allows none (a store to
              * address 0 does not fault on every host this suite runs on) */
      int *volatile guarded = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (guarded != MAP_FAILED) *guarded = 1;
    }
    fprintf(stderr, "rank %d: still running after its crash\n", rank);
    return 0; /* the parent must see the signal, not this */
  }
  double t0 = harness_now();
  st = weft_allreduce(comm, &x, &x, 1, WEFT_F32, WEFT_SUM);
  harness_record(rank, st, t0, comm);
  weft_comm_destroy(comm);
  return st == WEFT_OK ? 0 : 1;
}

static void crash_fails_fast(const char *how) {
  harness_init();
  double t0 = harness_now();
  int failed = harness_run(RANKS, NULL, RUN_TIMEOUT_S, crash_rank, (void *)how);
  double took = harness_now() - t0;
  fprintf(stderr, "  %s: %d of %d ranks failed in %.2f s\n", how, failed, RANKS, took);
  if (harness_shm->ended_by[CRASHING_RANK] != SIGSEGV)
    fail_msg("rank %d was not ended by SIGSEGV (ended by signal %d)", CRASHING_RANK,
             harness_shm->ended_by[CRASHING_RANK]);
  /* every rank fails: the crashed one, and the others, which lost a peer */
  assert_int_equal(failed, RANKS);
  if (took >= FAST_S) fail_msg("a crash took %.1f s to fail its test (at most %d)", took, FAST_S);
  for (int r = 0; r < RANKS; r++) {
    if (r == CRASHING_RANK) continue;
    if (harness_shm->ended_by[r] == SIGKILL) { /* the harness's grace ran out */
      fprintf(stderr, "  rank %d killed by the harness after the crash\n", r);
      continue;
    }
    assert_int_equal(harness_shm->ended_by[r], 0);
    assert_int_not_equal(harness_shm->status[r], WEFT_OK);
  }
}

static void raised_sigsegv_fails_fast(void **state) {
  (void)state;
  crash_fails_fast("raise");
}

/* The others wait for it at the rendezvous, where no peer's death shows
 * before the timeout: the harness kills them after the grace. */
static void crash_before_joining_fails_fast(void **state) {
  (void)state;
  crash_fails_fast("raise before joining");
}

static void faulting_store_fails_fast(void **state) {
  (void)state;
  crash_fails_fast("store to a PROT_NONE page");
}

/* Exit statuses still count as before: a rank that returns 1 is one failed
 * rank, not a signal. */
static int one_rank_fails(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)size;
  (void)id;
  (void)arg;
  return rank == 1;
}

static void failing_rank_counts_once(void **state) {
  (void)state;
  harness_init();
  assert_int_equal(harness_run(2, NULL, 30, one_rank_fails, NULL), 1);
  assert_int_equal(harness_shm->ended_by[1], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(raised_sigsegv_fails_fast),
      cmocka_unit_test(faulting_store_fails_fast),
      cmocka_unit_test(crash_before_joining_fails_fast),
      cmocka_unit_test(failing_rank_counts_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
