/* test_elastic.c - surviving a lost rank (issue 48): weft_comm_revoke,
 * weft_comm_agree and weft_comm_shrink, with ranks killed (SIGKILL) the way
 * production loses them: during a collective, between collectives, rank 0,
 * two at once, and during the recovery itself. Every survivor must end with
 * a communicator of exactly the ranks alive, numbered densely in the old
 * order, whose allreduce matches a serial reduction over the survivors'
 * data (i64, exact); the agreement must give every survivor the same
 * answer. Each case runs over shm and over tcp. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <sys/wait.h>

#include "harness.h"

enum { N = 1 << 16 };           /* elements per allreduce: several chunks in flight */
#define RECOVER_WITHIN_S 5.0 /* far above the targets; a miss means a wait on a timeout */

typedef enum kill_when {
  KILL_NONE,
  KILL_IN_CALL,    /* at a random moment of an allreduce */
  KILL_BETWEEN,    /* before its next call */
  KILL_IN_SHRINK,  /* a second victim, at a random moment of the shrink */
  KILL_IN_AGREE    /* at a random moment of weft_comm_agree */
} kill_when;

typedef struct scenario {
  int victim[2];
  int nvictims;
  kill_when when[2];
  uint64_t seed;
} scenario;

static const char *const transports[] = {"WEFT_TRANSPORT=shm", "WEFT_TRANSPORT=tcp"};

/* The moment a victim dies, for the survivors' recovery times. */
static volatile sig_atomic_t victim_slot = -1;
static void die_now(int sig) {
  (void)sig;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
  if (victim_slot >= 0 && harness_shm) memcpy(&harness_shm->word[victim_slot], &t, sizeof t);
  raise(SIGKILL);
}
/* SIGKILL after a random 0.1..3 ms: whatever weft is doing then. */
static void die_soon(int rank, uint64_t *rng) {
  victim_slot = rank;
  signal(SIGALRM, die_now);
  ualarm((useconds_t)(100 + harness_rng(rng) % 2900), 0);
}

static int victim_index(const scenario *s, int rank) {
  for (int v = 0; v < s->nvictims; v++)
    if (s->victim[v] == rank) return v;
  return -1;
}

/* Contribution of old rank `q` to allreduce `round`. */
typedef struct contrib {
  uint64_t seed;
  int round;
  const int *old_rank; /* by new rank */
} contrib;
static void fill_contrib(void *buf, size_t count, int i, void *ctx) {
  const contrib *c = ctx;
  harness_fill(buf, count, WEFT_I64, WEFT_SUM, harness_seed(c->seed + (uint64_t)c->round,
                                                             c->old_rank[i], 0));
}

/* An allreduce of this round's data, checked against the serial sum over
 * the members (old ranks, by new rank). 0 when right. */
static int checked_allreduce(weft_comm *comm, uint64_t seed, int round, int old_rank,
                             const int *members, int64_t *buf) {
  contrib c = {seed, round, members};
  harness_fill(buf, N, WEFT_I64, WEFT_SUM, harness_seed(seed + (uint64_t)round, old_rank, 0));
  weft_status st = weft_allreduce(comm, buf, buf, N, WEFT_I64, WEFT_SUM);
  if (st) {
    fprintf(stderr, "rank %d: allreduce after recovery: %s\n", old_rank, weft_last_error(comm));
    return 1;
  }
  return harness_check_reduced(buf, N, WEFT_I64, WEFT_SUM, weft_comm_size(comm), fill_contrib,
                               &c, "after shrink");
}

/* A rank: allreduces until one fails (a victim dies as its scenario says),
 * then shrinks and checks the new communicator. Records the seconds from
 * the (first) death to the first right allreduce on the new one. */
static int elastic_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const scenario *s = arg;
  uint64_t rng = harness_seed(s->seed, rank, 7);
  int v = victim_index(s, rank);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  int64_t *buf = malloc(sizeof(int64_t) * N);
  int members[HARNESS_MAX_RANKS];
  for (int p = 0; p < size; p++) members[p] = p;
  weft_status st = WEFT_OK;
  int round = 0;
  for (; round < 1000 && !st; round++) {
    if (v >= 0 && round == 3 && s->when[v] == KILL_BETWEEN) {
      victim_slot = rank;
      die_now(0);
    }
    if (v >= 0 && round == 3 && s->when[v] == KILL_IN_CALL) die_soon(rank, &rng);
    harness_fill(buf, N, WEFT_I64, WEFT_SUM, harness_seed(s->seed + (uint64_t)round, rank, 0));
    st = weft_allreduce(comm, buf, buf, N, WEFT_I64, WEFT_SUM);
    if (!st && round < 3) {
      contrib c = {s->seed, round, members};
      if (harness_check_reduced(buf, N, WEFT_I64, WEFT_SUM, size, fill_contrib, &c, "before"))
        return 1;
    }
    if (round >= 5 && s->nvictims == 0) break; /* nobody dies: a revoke-free shrink */
  }
  if (s->nvictims && !st) {
    fprintf(stderr, "rank %d: 1000 allreduces and no failure\n", rank);
    return 1;
  }
  if (v >= 0 && s->when[v] == KILL_IN_SHRINK) die_soon(rank, &rng);
  /* who is left in the end: the ranks that do not die (the victims all do) */
  int n = 0, my_new = -1;
  for (int p = 0; p < size; p++)
    if (victim_index(s, p) < 0) {
      if (p == rank) my_new = n;
      members[n++] = p;
    }
  /* A victim killed during the shrink may die after it returned: then the
   * new communicator still holds it, its first call fails, and the
   * survivors shrink once more. */
  weft_comm *shrunk = NULL, *from = comm;
  for (int attempt = 0;; attempt++) {
    st = weft_comm_shrink(from, &shrunk);
    if (st) {
      fprintf(stderr, "rank %d: shrink #%d: %s\n", rank, attempt, weft_last_error(from));
      harness_record(rank, st, harness_now(), from);
      return 1;
    }
    if (v >= 0) pause(); /* a victim that outlived the shrink dies here */
    if (from != comm) weft_comm_destroy(from);
    from = shrunk;
    if (weft_comm_size(shrunk) == n || attempt == 3) break;
    harness_fill(buf, N, WEFT_I64, WEFT_SUM, 1);
    if (!weft_allreduce(shrunk, buf, buf, N, WEFT_I64, WEFT_SUM)) {
      fprintf(stderr, "rank %d: an allreduce with a rank gone succeeded\n", rank);
      return 1;
    }
  }
  int bad = 0;
  if (weft_comm_size(shrunk) != n || weft_comm_rank(shrunk) != my_new) {
    fprintf(stderr, "rank %d: shrunk to rank %d of %d, want %d of %d\n", rank,
            weft_comm_rank(shrunk), weft_comm_size(shrunk), my_new, n);
    bad = 1;
  }
  for (int k = 0; k < 3 && !bad; k++) {
    bad |= checked_allreduce(shrunk, s->seed, 100 + k, rank, members, buf);
    if (k == 0) {
      double died = 0;
      for (int w = 0; w < s->nvictims; w++) {
        double t;
        memcpy(&t, &harness_shm->word[s->victim[w]], sizeof t);
        if (t > 0 && (died == 0 || t < died)) died = t;
      }
      harness_shm->seconds[rank] = died > 0 ? harness_now() - died : 0;
    }
  }
  harness_shm->status[rank] = bad ? WEFT_ERR_INTERNAL : WEFT_OK;
  weft_comm_destroy(shrunk);
  weft_comm_destroy(comm);
  free(buf);
  return bad;
}

static void run_scenario(int n, scenario s, const char *what) {
  for (int t = 0; t < 2; t++) {
    const char *env[] = {transports[t], "WEFT_TIMEOUT=30", NULL};
    harness_init();
    s.seed = (uint64_t)time(NULL) * 2654435761u + (uint64_t)t;
    int failed = harness_run(n, env, 90, elastic_rank, &s);
    double worst = 0;
    for (int r = 0; r < n; r++) {
      if (victim_index(&s, r) >= 0) continue;
      if (harness_shm->status[r] != WEFT_OK)
        print_message("%s over %s: rank %d: %s\n", what, transports[t] + 15,
                      r, harness_shm->message[r]);
      assert_int_equal(harness_shm->status[r], WEFT_OK);
      if (harness_shm->seconds[r] > worst) worst = harness_shm->seconds[r];
    }
    print_message("%s over %s: %d of %d ranks recovered, %.3f s from the death to the first "
                  "right allreduce (worst rank)\n",
                  what, transports[t] + 15, n - s.nvictims, n, worst);
    assert_int_equal(failed, s.nvictims); /* the victims, by SIGKILL */
    for (int v = 0; v < s.nvictims; v++)
      assert_int_equal(harness_shm->ended_by[s.victim[v]], SIGKILL);
    assert_true(worst < RECOVER_WITHIN_S);
  }
}

static void one_killed_during_a_collective(void **state) {
  (void)state;
  run_scenario(4, (scenario){{1}, 1, {KILL_IN_CALL}, 0}, "rank 1 of 4 killed in an allreduce");
}

static void rank0_killed_between_calls(void **state) {
  (void)state;
  run_scenario(4, (scenario){{0}, 1, {KILL_BETWEEN}, 0}, "rank 0 of 4 killed between calls");
}

static void two_killed(void **state) {
  (void)state;
  run_scenario(6, (scenario){{0, 3}, 2, {KILL_IN_CALL, KILL_IN_CALL}, 0},
               "ranks 0 and 3 of 6 killed in an allreduce");
}

static void killed_during_shrink(void **state) {
  (void)state;
  /* rank 0 coordinates the agreements: it dies in the middle of them */
  run_scenario(5, (scenario){{2, 0}, 2, {KILL_IN_CALL, KILL_IN_SHRINK}, 0},
               "rank 2 of 5 killed in an allreduce, rank 0 in the shrink");
}

static void nobody_lost(void **state) {
  (void)state;
  run_scenario(3, (scenario){{0}, 0, {KILL_NONE}, 0}, "no rank lost (a shrink of a live job)");
}

/* ---- agree ------------------------------------------------------------------- */

typedef struct agree_case {
  int victim; /* -1: none; else killed at a random moment of the agreement */
} agree_case;

/* word[r]: this survivor's outcome, (flags << 32) | the lost ranks' mask */
static int agree_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const agree_case *a = arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  uint64_t rng = harness_seed((uint64_t)time(NULL), rank, 3);
  if (rank == a->victim) die_soon(rank, &rng);
  uint32_t flags = 1u << rank;
  int failed[HARNESS_MAX_RANKS], nfailed = -1;
  weft_status st = weft_comm_agree(comm, &flags, failed, &nfailed);
  harness_record(rank, st, harness_now(), comm);
  if (rank == a->victim) pause(); /* it dies here if not before */
  uint64_t mask = 0;
  for (int i = 0; i < nfailed; i++) mask |= 1ull << failed[i];
  harness_shm->word[rank] = ((uint64_t)flags << 32) | mask;
  /* a second agreement, which must see the victim lost */
  flags = 0;
  st = weft_comm_agree(comm, &flags, failed, &nfailed);
  if (st || (a->victim >= 0 && (nfailed != 1 || failed[0] != a->victim))) {
    fprintf(stderr, "rank %d: second agreement: %s, %d lost\n", rank, weft_status_name(st),
            nfailed);
    return 1;
  }
  weft_comm_destroy(comm);
  return 0;
}

static void agree_gives_every_rank_the_same(void **state) {
  (void)state;
  for (int t = 0; t < 2; t++)
    for (int victim = -1; victim < 4; victim++) {
      const char *env[] = {transports[t], "WEFT_TIMEOUT=30", NULL};
      agree_case a = {victim};
      harness_init();
      int failed = harness_run(4, env, 60, agree_rank, &a);
      assert_int_equal(failed, victim >= 0 ? 1 : 0);
      uint64_t first = 0;
      bool have = false;
      for (int r = 0; r < 4; r++) {
        if (r == victim) continue;
        assert_int_equal(harness_shm->status[r], WEFT_OK);
        uint64_t w = harness_shm->word[r];
        if (!have) first = w;
        have = true;
        if (w != first)
          print_message("over %s, victim %d: rank %d agreed 0x%llx, another 0x%llx\n",
                        transports[t] + 15, victim, r, (unsigned long long)w,
                        (unsigned long long)first);
        assert_true(w == first);
        /* every survivor's flag is in; the victim's is there only if it
         * was not counted lost */
        uint32_t flags = (uint32_t)(w >> 32), lost = (uint32_t)w;
        for (int q = 0; q < 4; q++)
          if (q != victim) assert_true(flags & (1u << q));
        if (victim >= 0) assert_true(((flags >> victim) & 1u) != ((lost >> victim) & 1u));
        else assert_int_equal(lost, 0);
      }
    }
}

/* ---- revoke ------------------------------------------------------------------ */

/* One rank revokes, before its first call, while the others wait in an
 * allreduce: all fail with WEFT_ERR_REVOKED, then all shrink (nobody lost)
 * and go on. Rank 0 as the revoker is the hard case on shm: the others wait
 * for pairs that only it makes. */
static int revoke_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  const int revoker = *(const int *)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  static int64_t buf[1024];
  double t0 = harness_now();
  weft_status st;
  if (rank == revoker) {
    usleep(200000);
    t0 = harness_now();
    if (weft_comm_revoke(comm)) return 1;
    st = weft_allreduce(comm, buf, buf, 1024, WEFT_I64, WEFT_SUM); /* later calls fail too */
  } else {
    st = weft_allreduce(comm, buf, buf, 1024, WEFT_I64, WEFT_SUM);
  }
  harness_record(rank, st, t0, comm);
  weft_comm *shrunk = NULL;
  if (weft_comm_shrink(comm, &shrunk)) {
    fprintf(stderr, "rank %d: shrink: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  int members[HARNESS_MAX_RANKS];
  for (int p = 0; p < size; p++) members[p] = p;
  int bad = weft_comm_size(shrunk) != size || weft_comm_rank(shrunk) != rank;
  static int64_t big[N];
  bad |= checked_allreduce(shrunk, 42, 1, rank, members, big);
  weft_comm_destroy(shrunk);
  weft_comm_destroy(comm);
  return bad;
}

static void revoke_fails_every_rank(void **state) {
  (void)state;
  for (int t = 0; t < 4; t++) {
    const char *env[] = {transports[t % 2], "WEFT_TIMEOUT=30", NULL};
    int revoker = t < 2 ? 2 : 0;
    harness_init();
    assert_int_equal(harness_run(4, env, 60, revoke_rank, &revoker), 0);
    for (int r = 0; r < 4; r++) {
      if (harness_shm->status[r] != WEFT_ERR_REVOKED)
        print_message("over %s, rank %d revoking: rank %d: %s\n", transports[t % 2] + 15,
                      revoker, r, harness_shm->message[r]);
      assert_int_equal(harness_shm->status[r], WEFT_ERR_REVOKED);
      assert_true(harness_shm->seconds[r] < 2.0);
    }
  }
}


/* ---- a gradient set survives a shrink ---------------------------------------- */

enum { GRAD_STEPS = 8, GRAD_VICTIM = 2, GRAD_KILL_STEP = 3, T0 = 3000, T1 = 70000 };

/* Rank r's gradient element i in step s: small integers, exact in f32 sums. */
static float grad_value(int step, int r, int t, size_t i) {
  return (float)((step * 7 + r * 13 + t * 5 + (int)(i % 97)) % 64);
}

/* Every rank: a set of two tensors (copy mode) averaged over the ranks;
 * rank 2 dies in step 3, with its first bucket in flight (SIGKILL right
 * after it marked tensor 1 ready). The survivors shrink, move the set onto the new
 * communicator (weft_grad_rebind), redo step 3 and go on: each step's
 * result is the mean over the ranks of that step, no step lost. */
static int grad_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  static float t0[T0], t1[T1];
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.op = WEFT_AVG;
  o.bucket_cap_bytes = 64 << 10;
  weft_grad *g;
  weft_tensor ts[2] = {{t0, T0, WEFT_F32, WEFT_MEMORY_HOST}, {t1, T1, WEFT_F32, WEFT_MEMORY_HOST}};
  if (weft_grad_create(comm, &o, &g) || weft_grad_register(g, &ts[0], NULL) ||
      weft_grad_register(g, &ts[1], NULL) || weft_grad_finalize(g))
    return 1;
  int members[HARNESS_MAX_RANKS], n = size;
  for (int p = 0; p < size; p++) members[p] = p;
  int recoveries = 0;
  for (int step = 0; step < GRAD_STEPS;) {
    for (size_t i = 0; i < T0; i++) t0[i] = grad_value(step, rank, 0, i);
    for (size_t i = 0; i < T1; i++) t1[i] = grad_value(step, rank, 1, i);
    weft_status st = weft_grad_ready(g, 1); /* backward: the last layer first */
    if (rank == GRAD_VICTIM && step == GRAD_KILL_STEP) raise(SIGKILL);
    if (!st) st = weft_grad_ready(g, 0);
    if (!st) st = weft_grad_wait(g);
    if (st) {
      weft_comm *smaller;
      if (weft_comm_shrink(comm, &smaller) || weft_grad_rebind(g, smaller)) {
        fprintf(stderr, "rank %d: recovery: %s\n", rank, weft_last_error(comm));
        return 1;
      }
      weft_comm_destroy(comm);
      comm = smaller;
      n = 0;
      for (int p = 0; p < size; p++)
        if (p != GRAD_VICTIM) members[n++] = p;
      recoveries++;
      continue; /* redo the step */
    }
    if (weft_comm_size(comm) != n) {
      fprintf(stderr, "rank %d: step %d on %d ranks, want %d\n", rank, step, weft_comm_size(comm), n);
      return 1;
    }
    for (int t = 0; t < 2; t++) {
      const float *got = t ? t1 : t0;
      size_t cnt = t ? T1 : T0;
      for (size_t i = 0; i < cnt; i++) {
        double want = 0;
        for (int k = 0; k < n; k++) want += grad_value(step, members[k], t, i);
        want /= n;
        if (fabs(got[i] - want) > 1e-5 * (1 + fabs(want))) {
          fprintf(stderr, "rank %d step %d tensor %d [%zu]: %g, want %g over %d ranks\n", rank,
                  step, t, i, got[i], want, n);
          return 1;
        }
      }
    }
    step++;
  }
  harness_shm->word[rank] = (uint64_t)recoveries;
  weft_grad_destroy(g);
  weft_comm_destroy(comm);
  return 0;
}

static void grad_set_survives_a_shrink(void **state) {
  (void)state;
  for (int t = 0; t < 2; t++) {
    const char *env[] = {transports[t], "WEFT_TIMEOUT=30", NULL};
    harness_init();
    int failed = harness_run(4, env, 90, grad_rank, NULL);
    assert_int_equal(failed, 1);
    assert_int_equal(harness_shm->ended_by[GRAD_VICTIM], SIGKILL);
    for (int r = 0; r < 4; r++)
      if (r != GRAD_VICTIM) assert_int_equal(harness_shm->word[r], 1);
    print_message("gradient set over %s: rank %d killed in step %d, %d steps done on the "
                  "survivors, each the mean over its ranks\n",
                  transports[t] + 15, GRAD_VICTIM, GRAD_KILL_STEP, GRAD_STEPS);
  }
}

/* ---- grow ---------------------------------------------------------------------- */

/* Ranks 0..3 make a communicator of 4; rank 1 dies; the 3 survivors shrink
 * and grow back to 4 with process 4, a replacement that joins with the id
 * rank 0 of the survivors writes (to the shared page). Every allreduce
 * after is checked against the members' data (the newcomer's as launch
 * rank 4). word[4] = 1 once the id is in message[4]. */
enum { GROW_VICTIM = 1 };

static int grow_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  (void)size;
  static int64_t buf[N];
  int members[HARNESS_MAX_RANKS] = {0, 2, 3, 4};
  weft_comm *comm = NULL;
  double t0;
  if (rank == 4) { /* the replacement: waits for the id, then joins */
    while (!__atomic_load_n(&harness_shm->word[4], __ATOMIC_ACQUIRE)) usleep(1000);
    weft_unique_id gid;
    memcpy(&gid, harness_shm->message[4], sizeof gid);
    t0 = harness_now();
    weft_status st = weft_comm_join(&gid, &comm);
    if (st) {
      fprintf(stderr, "rank 4: join: %s\n", weft_last_error(NULL));
      return 1;
    }
    harness_shm->seconds[4] = harness_now() - t0;
  } else {
    if (weft_comm_init_rank(&comm, id, rank, 4)) return 1;
    if (rank == GROW_VICTIM) {
      usleep(20000);
      raise(SIGKILL);
    }
    weft_status st = WEFT_OK;
    for (int k = 0; k < 1000 && !st; k++)
      st = weft_allreduce(comm, buf, buf, 1024, WEFT_I64, WEFT_SUM);
    weft_comm *shrunk, *grown;
    if (weft_comm_shrink(comm, &shrunk)) {
      fprintf(stderr, "rank %d: shrink: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    weft_comm_destroy(comm);
    if (weft_comm_rank(shrunk) == 0) {
      weft_unique_id gid;
      if (weft_comm_grow_id(shrunk, &gid)) return 1;
      memcpy(harness_shm->message[4], &gid, sizeof gid);
      __atomic_store_n(&harness_shm->word[4], 1, __ATOMIC_RELEASE);
    }
    t0 = harness_now();
    st = weft_comm_grow(shrunk, 1, &grown);
    if (st) {
      fprintf(stderr, "rank %d: grow: %s\n", rank, weft_last_error(shrunk));
      return 1;
    }
    harness_shm->seconds[rank] = harness_now() - t0;
    weft_comm_destroy(shrunk);
    comm = grown;
  }
  int want_rank = rank == 4 ? 3 : (rank == 0 ? 0 : rank - 1);
  if (weft_comm_size(comm) != 4 || weft_comm_rank(comm) != want_rank) {
    fprintf(stderr, "launch rank %d: rank %d of %d after the grow, want %d of 4\n", rank,
            weft_comm_rank(comm), weft_comm_size(comm), want_rank);
    return 1;
  }
  int bad = 0;
  for (int k = 0; k < 3 && !bad; k++) bad = checked_allreduce(comm, 77, k, rank, members, buf);
  weft_comm_destroy(comm);
  return bad;
}

static void shrink_then_grow_back(void **state) {
  (void)state;
  for (int t = 0; t < 2; t++) {
    const char *env[] = {transports[t], "WEFT_TIMEOUT=30", NULL};
    harness_init();
    int failed = harness_run(5, env, 90, grow_rank, NULL);
    assert_int_equal(failed, 1);
    assert_int_equal(harness_shm->ended_by[GROW_VICTIM], SIGKILL);
    print_message("over %s: shrunk to 3, grown back to 4 by a replacement: grow %.1f ms, join "
                  "%.1f ms (from the id's write)\n",
                  transports[t] + 15, harness_shm->seconds[0] * 1e3, harness_shm->seconds[4] * 1e3);
  }
}

/* ---- cycles: kill, shrink, grow, again ------------------------------------------ */

/* Ranks 0..2 stay; the fourth member is a process rank 0 starts (this
 * test binary again, with --join), which joins, takes part in allreduces
 * and is SIGKILLed at a random moment of one; the three shrink, start the
 * next and grow back. Rank 0 counts its open fds and its RSS after cycle 20
 * and after the last: the fds must be equal, the RSS grown by less than
 * 4 MiB. */
/* Under the sanitizers fewer cycles, and no RSS bound: ASan's quarantine
 * holds freed memory on purpose (LeakSanitizer checks for leaks there). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
enum { CYCLES = 40, RSS_BOUND_KIB = 0 };
#else
enum { CYCLES = 200, RSS_BOUND_KIB = 4096 };
#endif

static const char *self_exe;

static int count_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n - 1; /* the directory's own */
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
  if (f) fclose(f);
  return kib;
}

/* Each member's data in cycle c: by its rank in the communicator. */
static int cycle_allreduces(weft_comm *comm, int cycle, int64_t *buf, int times) {
  static const int identity[4] = {0, 1, 2, 3};
  for (int k = 0; k < times; k++) {
    weft_status st;
    contrib c = {1000 + (uint64_t)cycle, k, identity};
    harness_fill(buf, 4096, WEFT_I64, WEFT_SUM,
                 harness_seed(c.seed + (uint64_t)k, weft_comm_rank(comm), 0));
    st = weft_allreduce(comm, buf, buf, 4096, WEFT_I64, WEFT_SUM);
    if (st) return st;
    if (harness_check_reduced(buf, 4096, WEFT_I64, WEFT_SUM, weft_comm_size(comm), fill_contrib,
                              &c, "cycle"))
      return WEFT_ERR_INTERNAL;
  }
  return WEFT_OK;
}

/* The newcomer (the test binary run with --join HEX CYCLE): joins, then
 * runs allreduces until it dies (a random moment: die_soon). */
static int joiner_main(const char *hex, int cycle) {
  weft_unique_id gid;
  for (size_t i = 0; i < sizeof gid.bytes; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&gid.bytes[i]);
  weft_comm *comm;
  if (weft_comm_join(&gid, &comm)) {
    fprintf(stderr, "joiner of cycle %d: %s\n", cycle, weft_last_error(NULL));
    return 1;
  }
  static int64_t buf[4096];
  uint64_t rng = harness_seed((uint64_t)getpid(), cycle, 9);
  if (cycle_allreduces(comm, cycle, buf, 2)) return 1;
  die_soon(3, &rng);
  for (;;)
    if (cycle_allreduces(comm, cycle, buf, 1)) pause();
}

static pid_t start_joiner(weft_comm *comm, int cycle) {
  weft_unique_id gid;
  if (weft_comm_grow_id(comm, &gid)) return -1;
  char hex[2 * sizeof gid.bytes + 1], num[16];
  for (size_t i = 0; i < sizeof gid.bytes; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)gid.bytes[i]);
  snprintf(num, sizeof num, "%d", cycle);
  pid_t pid = fork();
  if (pid == 0) {
    execl(self_exe, self_exe, "--join", hex, num, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int cycles_rank(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  (void)size;
  static int64_t buf[4096];
  weft_comm *comm;
  if (weft_comm_init_rank(&comm, id, rank, 3)) return 1;
  int fds_early = 0;
  long rss_early = 0;
  double t0 = harness_now();
  for (int cycle = 0; cycle < CYCLES; cycle++) {
    pid_t child = rank == 0 ? start_joiner(comm, cycle) : 0;
    weft_comm *grown;
    if (child < 0 || weft_comm_grow(comm, 1, &grown)) {
      fprintf(stderr, "rank %d cycle %d: grow: %s\n", rank, cycle, weft_last_error(comm));
      return 1;
    }
    weft_comm_destroy(comm);
    /* the newcomer's first two calls, before it may die: right */
    weft_status st = cycle_allreduces(grown, cycle, buf, 2);
    if (st) {
      fprintf(stderr, "rank %d cycle %d: the first allreduces of 4: %s\n", rank, cycle,
              weft_status_name(st));
      return 1;
    }
    for (int k = 0; k < 100000 && !st; k++) {
      st = cycle_allreduces(grown, cycle, buf, 1);
      if (st == WEFT_ERR_INTERNAL) return 1; /* a wrong result */
    }
    if (weft_comm_shrink(grown, &comm)) {
      fprintf(stderr, "rank %d cycle %d: shrink: %s\n", rank, cycle, weft_last_error(grown));
      return 1;
    }
    weft_comm_destroy(grown);
    if (weft_comm_size(comm) != 3 || weft_comm_rank(comm) != rank) {
      fprintf(stderr, "rank %d cycle %d: rank %d of %d after the shrink\n", rank, cycle,
              weft_comm_rank(comm), weft_comm_size(comm));
      return 1;
    }
    if (rank == 0) {
      int status = 0;
      waitpid(child, &status, 0);
      if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
        fprintf(stderr, "cycle %d: the newcomer ended with status %d, not by its SIGKILL\n",
                cycle, status);
        return 1;
      }
    }
    /* both counts at the same point of a cycle: right after its shrink */
    if (cycle == 19) {
      fds_early = count_fds();
      rss_early = rss_kib();
    }
  }
  harness_shm->seconds[rank] = harness_now() - t0;
  harness_shm->word[rank] = ((uint64_t)(uint32_t)(count_fds() - fds_early) << 32) |
                            (uint32_t)(rss_kib() - rss_early);
  if (cycle_allreduces(comm, CYCLES, buf, 3)) return 1;
  weft_comm_destroy(comm);
  return 0;
}

static void kill_shrink_grow_cycles(void **state) {
  (void)state;
  for (int t = 0; t < 2; t++) {
    const char *env[] = {transports[t], "WEFT_TIMEOUT=30", NULL};
    harness_init();
    assert_int_equal(harness_run(3, env, 600, cycles_rank, NULL), 0);
    int fds = (int)(int32_t)(harness_shm->word[0] >> 32);
    int rss = (int)(int32_t)(uint32_t)harness_shm->word[0];
    print_message("over %s: %d kill/shrink/grow cycles in %.1f s; rank 0 after cycle 20 and at "
                  "the end: %+d fds, %+d KiB RSS\n",
                  transports[t] + 15, CYCLES, harness_shm->seconds[0], fds, rss);
    assert_int_equal(fds, 0);
    if (RSS_BOUND_KIB) assert_true(rss < RSS_BOUND_KIB);
  }
}

int main(int argc, char **argv) {
  self_exe = "/proc/self/exe";
  if (argc == 4 && !strcmp(argv[1], "--join")) return joiner_main(argv[2], atoi(argv[3]));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(revoke_fails_every_rank),
      cmocka_unit_test(nobody_lost),
      cmocka_unit_test(agree_gives_every_rank_the_same),
      cmocka_unit_test(one_killed_during_a_collective),
      cmocka_unit_test(rank0_killed_between_calls),
      cmocka_unit_test(two_killed),
      cmocka_unit_test(killed_during_shrink),
      cmocka_unit_test(grad_set_survives_a_shrink),
      cmocka_unit_test(shrink_then_grow_back),
      cmocka_unit_test(kill_shrink_grow_cycles),
  };
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
