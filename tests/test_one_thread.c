/* test_one_thread.c - weft.h's rule "a communicator is used by one thread
 * at a time", broken as a metrics or logging thread breaks it: two threads
 * of rank 0 call weft_allreduce on the shared communicator. Before the check
 * every call returned OK and about half the results were wrong (each rank
 * paired the calls in whatever order its threads entered).
 *
 * The overlap is made certain, not left to the scheduler: rank 1 joins only
 * after rank 0 has refused a call, so whichever of rank 0's threads entered
 * first is held inside its call (its peer has not come) while the other
 * calls. The one that came second must fail at once with WEFT_ERR_INVALID
 * naming the rule; the one held inside must fail too when it ends (its
 * result cannot be trusted); rank 1's call, which met only the held one,
 * gets the right sum; and the communicator goes on working. Over shm and
 * tcp. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#define COUNT 64
/* harness_shm->word[] slots (2 ranks use none of them as their own words) */
#define SLOT_REFUSED 2 /* rank 0: 1 + the thread refused, once it was */
#define SLOT_STATUS0 3 /* rank 0's two threads' statuses, as (uint32_t) */
#define SLOT_STATUS1 4
#define SLOT_AFTER 5 /* per rank bit: the allreduce after the clash was right */
#define SLOT_RANK1 6 /* rank 1's status */

typedef struct worker {
  weft_comm *comm;
  int thread;
  weft_status st;
  char why[512];
} worker;

static void *work(void *arg) {
  worker *w = arg;
  float x[COUNT];
  for (int k = 0; k < COUNT; k++) x[k] = (float)(w->thread + 1);
  w->st = weft_allreduce(w->comm, x, x, COUNT, WEFT_F32, WEFT_SUM);
  snprintf(w->why, sizeof w->why, "%s", w->st ? weft_last_error(w->comm) : "");
  /* the held call ends only after rank 1 came, which waits for this mark:
   * the first to return is the refused one */
  uint64_t none = 0;
  __atomic_compare_exchange_n(&harness_shm->word[SLOT_REFUSED], &none, (uint64_t)w->thread + 1, false,
                              __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return NULL;
}

/* Waits (bounded) until rank 0 has refused a call. */
static int wait_refused(void) {
  double end = harness_now() + 20;
  while (!__atomic_load_n(&harness_shm->word[SLOT_REFUSED], __ATOMIC_SEQ_CST)) {
    if (harness_now() > end) return -1;
    usleep(1000);
  }
  return 0;
}

/* One more allreduce on both ranks: the clash must leave the communicator
 * usable. 1 when its result is right. */
static int allreduce_after(weft_comm *comm, int rank) {
  float y[COUNT];
  for (int k = 0; k < COUNT; k++) y[k] = (float)(rank + 1) * (float)(k + 1);
  if (weft_allreduce(comm, y, y, COUNT, WEFT_F32, WEFT_SUM)) {
    fprintf(stderr, "rank %d: the allreduce after the clash failed: %s\n", rank, weft_last_error(comm));
    return 0;
  }
  for (int k = 0; k < COUNT; k++)
    if (y[k] != 3.0f * (float)(k + 1)) return 0;
  return 1;
}

static int two_threads_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  if (rank == 0) {
    worker w[2] = {{comm, 0, WEFT_OK, ""}, {comm, 1, WEFT_OK, ""}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    int refused = (int)harness_shm->word[SLOT_REFUSED] - 1;
    harness_shm->word[SLOT_STATUS0] = (uint32_t)w[refused].st;
    harness_shm->word[SLOT_STATUS1] = (uint32_t)w[1 - refused].st;
    snprintf(harness_shm->message[0], sizeof harness_shm->message[0], "%s", w[refused].why);
    snprintf(harness_shm->message[1], sizeof harness_shm->message[1], "%s", w[1 - refused].why);
  } else {
    if (wait_refused()) {
      fprintf(stderr, "rank 1: rank 0 refused no call in 20 s\n");
      weft_comm_destroy(comm);
      return 1;
    }
    float x[COUNT];
    for (int k = 0; k < COUNT; k++) x[k] = 10.0f;
    weft_status st = weft_allreduce(comm, x, x, COUNT, WEFT_F32, WEFT_SUM);
    /* rank 0's held thread (the one not refused) brought its value */
    float want = 10.0f + (float)(2 - (int)harness_shm->word[SLOT_REFUSED] + 1);
    for (int k = 0; k < COUNT && st == WEFT_OK; k++)
      if (x[k] != want) {
        fprintf(stderr, "rank 1: element %d is %g, not %g\n", k, (double)x[k], (double)want);
        st = WEFT_ERR_INTERNAL;
      }
    harness_shm->word[SLOT_RANK1] = (uint32_t)st;
  }
  if (allreduce_after(comm, rank)) __atomic_fetch_or(&harness_shm->word[SLOT_AFTER], 1u << rank, __ATOMIC_SEQ_CST);
  weft_comm_destroy(comm);
  return 0;
}

static void run(const char *transport) {
  char tp[64];
  snprintf(tp, sizeof tp, "WEFT_TRANSPORT=%s", transport);
  const char *env[] = {tp, "WEFT_TIMEOUT=10", NULL};
  harness_init(); /* the slots start at 0 for each transport */
  int failed = harness_run(2, env, 60, two_threads_rank, NULL);
  assert_int_equal(failed, 0);
  weft_status refused = (weft_status)(int32_t)harness_shm->word[SLOT_STATUS0];
  weft_status held = (weft_status)(int32_t)harness_shm->word[SLOT_STATUS1];
  if (refused != WEFT_ERR_INVALID || !strstr(harness_shm->message[0], "one thread at a time"))
    fail_msg("%s: the call that met another thread inside gave %s, not WEFT_ERR_INVALID naming the rule: %s",
             transport, weft_status_name(refused), harness_shm->message[0]);
  if (held != WEFT_ERR_INVALID || !strstr(harness_shm->message[1], "during this call"))
    fail_msg("%s: the call another thread entered during gave %s, not WEFT_ERR_INVALID saying so: %s", transport,
             weft_status_name(held), harness_shm->message[1]);
  weft_status rank1 = (weft_status)(int32_t)harness_shm->word[SLOT_RANK1];
  if (rank1 != WEFT_OK) fail_msg("%s: rank 1's call, which met only one thread, gave %s", transport, weft_status_name(rank1));
  if (harness_shm->word[SLOT_AFTER] != 3)
    fail_msg("%s: the allreduce after the clash was wrong or failed (ranks ok: mask %llu)", transport,
             (unsigned long long)harness_shm->word[SLOT_AFTER]);
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
