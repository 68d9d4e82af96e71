/* test_stall_probe.c - the stall probe (WEFT_STALL_PROBE, src/comm/probe.c):
 * ranks that wait on each other in different calls, where no chunk ever
 * crosses to show it, fail every rank within 2 s (not at WEFT_TIMEOUT, 30
 * here) with WEFT_ERR_MISMATCH naming both calls, or WEFT_ERR_PEER_LOST
 * quoting it; a rank that is only late is waited for, and no probe turns
 * it into an error. Over shm and tcp. With the probe off, the same
 * disagreement waits for the timeout: the probe is what finds it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define FOUND_WITHIN_S 2.0

typedef enum disagreement {
  ROOTS_DIFFER,  /* rank r's broadcast names root (r + 1) % n: every rank waits */
  SKIPPED_CALL,  /* rank 1 skips the broadcast it roots, and waits in the next
                    one for rank 0, which waits for rank 1's data */
  COUNTS_DIFFER, /* rank 2 wants two chunks of rank 0's broadcast, which sends
                    one; the others go on to a broadcast rank 2 roots */
  LATE_RANK      /* no disagreement: rank 1 computes 3 s before the call */
} disagreement;

static const char *const transports[] = {"WEFT_TRANSPORT=shm", "WEFT_TRANSPORT=tcp"};

static int stall_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const disagreement *d = arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  enum { COUNT = 1000, CHUNK = 262144 / 4 }; /* CHUNK: WEFT_CHUNK_BYTES' default */
  static float buf[2 * CHUNK];
  for (int i = 0; i < 2 * COUNT; i++) buf[i] = (float)rank;
  weft_status st = weft_allreduce(comm, buf, buf, COUNT, WEFT_F32, WEFT_SUM); /* all connected */
  double t0 = harness_now();
  if (!st) switch (*d) {
      case ROOTS_DIFFER:
        st = weft_broadcast(comm, buf, buf, COUNT, WEFT_F32, (rank + 1) % size);
        break;
      case SKIPPED_CALL:
        if (rank != 1) st = weft_broadcast(comm, buf, buf, COUNT, WEFT_F32, 1);
        if (!st) st = weft_broadcast(comm, buf, buf, COUNT, WEFT_F32, 0);
        break;
      case COUNTS_DIFFER:
        st = weft_broadcast(comm, buf, buf, rank == 2 ? 2 * CHUNK : CHUNK, WEFT_F32, 0);
        if (!st) st = weft_broadcast(comm, buf, buf, COUNT, WEFT_F32, 2);
        break;
      case LATE_RANK:
        if (rank == 1) sleep(3);
        st = weft_allreduce(comm, buf, buf, COUNT, WEFT_F32, WEFT_SUM);
        if (!st && buf[0] != (float)(size * (size - 1) / 2) * (float)size)
          st = WEFT_ERR_INTERNAL; /* every rank held sum(r) after the first call */
        break;
    }
  harness_record(rank, st, t0, comm);
  weft_comm_destroy(comm);
  return 0;
}

static void run(disagreement d, const char *what, bool probe_on) {
  for (int t = 0; t < 2; t++) {
    const char *env[] = {transports[t], "WEFT_TIMEOUT=30",
                         probe_on ? "WEFT_STALL_PROBE=1" : "WEFT_STALL_PROBE=0", NULL};
    if (!probe_on) env[1] = "WEFT_TIMEOUT=4";
    harness_init();
    assert_int_equal(harness_run(4, env, 90, stall_rank, &d), 0);
    int mismatches = 0;
    double worst = 0;
    for (int r = 0; r < 4; r++) {
      int st = harness_shm->status[r];
      const char *m = harness_shm->message[r];
      if (harness_shm->seconds[r] > worst) worst = harness_shm->seconds[r];
      if (d == LATE_RANK) {
        if (st != WEFT_OK) print_message("%s over %s: rank %d: %s\n", what, transports[t] + 15, r, m);
        assert_int_equal(st, WEFT_OK);
        continue;
      }
      /* both calls: its own, and the other one ("call #" each) */
      const char *second = strstr(m, "call #");
      bool named = second && strstr(second + 1, "call #");
      if (!(st == WEFT_ERR_MISMATCH || st == WEFT_ERR_PEER_LOST) || !named)
        print_message("%s over %s: rank %d: %s\n", what, transports[t] + 15, r, m);
      assert_true(st == WEFT_ERR_MISMATCH || st == WEFT_ERR_PEER_LOST);
      assert_true(named);
      mismatches += st == WEFT_ERR_MISMATCH;
    }
    print_message("%s over %s, probe %s: every rank ended in %.2f s\n", what, transports[t] + 15,
                  probe_on ? "on" : "off", worst);
    if (d == LATE_RANK) continue;
    assert_true(mismatches >= 1);
    if (probe_on)
      assert_true(worst < FOUND_WITHIN_S);
    else
      assert_true(worst >= 4.0); /* found only at the timeout */
  }
}

static void roots_differ(void **state) {
  (void)state;
  run(ROOTS_DIFFER, "broadcast roots that differ", true);
}
static void skipped_call(void **state) {
  (void)state;
  run(SKIPPED_CALL, "a call rank 1 skipped", true);
}
static void counts_differ(void **state) {
  (void)state;
  run(COUNTS_DIFFER, "a count that differs", true);
}
static void late_rank_is_waited_for(void **state) {
  (void)state;
  run(LATE_RANK, "rank 1 3 s late, same call", true);
}
static void without_the_probe_only_the_timeout_finds_it(void **state) {
  (void)state;
  run(ROOTS_DIFFER, "broadcast roots that differ", false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(roots_differ),
      cmocka_unit_test(skipped_call),
      cmocka_unit_test(counts_differ),
      cmocka_unit_test(late_rank_is_waited_for),
      cmocka_unit_test(without_the_probe_only_the_timeout_finds_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
