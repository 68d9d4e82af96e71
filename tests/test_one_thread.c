/* test_one_thread.c - weft.h's rule "a communicator is used by one thread
 * at a time", broken as a metrics or logging thread breaks it: two threads
 * per rank, 2 ranks, each thread running allreduces of its own data on the
 * shared communicator. Before the check every call returned OK and about
 * half the results were wrong (each rank paired the calls in whatever order
 * its threads entered). Now the calls that meet another thread inside fail
 * with WEFT_ERR_INVALID naming the rule, and no thread hangs: the ranks'
 * calls no longer match once one failed, so the rest end at the (short)
 * timeout. Over shm and tcp. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define CALLS 200

typedef struct worker {
  weft_comm *comm;
  int rank, thread;
  int ok, invalid, other;
  char why[512];
} worker;

static void *work(void *arg) {
  worker *w = arg;
  float x[64];
  for (int i = 0; i < CALLS; i++) {
    for (int k = 0; k < 64; k++) x[k] = (float)(w->thread + 1);
    weft_status st = weft_allreduce(w->comm, x, x, 64, WEFT_F32, WEFT_SUM);
    if (st == WEFT_OK) {
      w->ok++;
      continue;
    }
    if (st == WEFT_ERR_INVALID) {
      w->invalid++;
      snprintf(w->why, sizeof w->why, "%s", weft_last_error(w->comm));
    } else {
      w->other++;
    }
    break; /* the ranks' calls no longer match: stop here */
  }
  return NULL;
}

static int two_threads_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  worker w[2] = {{comm, rank, 0, 0, 0, 0, ""}, {comm, rank, 1, 0, 0, 0, ""}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, &w[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  int invalid = w[0].invalid + w[1].invalid;
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s",
           w[0].why[0] ? w[0].why : w[1].why);
  harness_shm->word[rank] = (uint64_t)invalid;
  weft_comm_destroy(comm);
  return 0;
}

static void run(const char *transport) {
  char tp[64];
  snprintf(tp, sizeof tp, "WEFT_TRANSPORT=%s", transport);
  const char *env[] = {tp, "WEFT_TIMEOUT=3", NULL};
  double t0 = harness_now();
  int failed = harness_run(2, env, 60, two_threads_rank, NULL);
  double took = harness_now() - t0;
  assert_int_equal(failed, 0);
  assert_true(took < 40); /* bounded: no thread waits past the short timeout for long */
  uint64_t invalid = harness_shm->word[0] + harness_shm->word[1];
  if (!invalid) fail_msg("%s: 2 threads x %d calls on one communicator, no call refused", transport, CALLS);
  const char *why = harness_shm->message[0][0] ? harness_shm->message[0] : harness_shm->message[1];
  if (!strstr(why, "one thread at a time")) fail_msg("%s: the sentence does not name the rule: %s", transport, why);
}

static void two_threads_shm(void **state) {
  (void)state;
  run("shm");
}

static void two_threads_tcp(void **state) {
  (void)state;
  run("tcp");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(two_threads_shm),
      cmocka_unit_test(two_threads_tcp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
