/* test_shared_buffers.c - weft_mem_alloc buffers and the direct allreduce,
 * as real processes, against a serial reference on fresh random data:
 *  - every dtype and op, in place and not, counts from 0 to ~70000 with the
 *    direct path forced (WEFT_ALGO=direct), and sizes above
 *    WEFT_DIRECT_MIN_BYTES chosen by auto, on 2, 3 and 4 ranks; every rank
 *    must end with the same bits, and the flight recorder must say the
 *    direct path ran (a silent fall-back to the ring would pass otherwise);
 *  - the same buffers call after call (the verdict round skipped);
 *  - a call shape that found ordinary buffers skips the question for a while;
 *  - the ring in the same call when one rank's buffer is ordinary memory,
 *    and when the transport cannot map (tcp);
 *  - free and allocate again between calls (descriptor numbers reused);
 *  - non-blocking calls outstanding together; a rank that dies in the call;
 *  - weft_mem_alloc / weft_mem_free refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "src/api/support.h"
#include "src/base/call_tag.h"
#include "harness_recorder.h"

static uint64_t base_seed;

typedef struct call_of {
  weft_dtype dt;
  weft_op op;
  int tag;
} call_of;

static void fill_rank(void *buf, size_t count, int q, void *ctx) {
  const call_of *k = ctx;
  harness_fill(buf, count, k->dt, k->op, harness_seed(base_seed, q, k->tag));
}

static int report(weft_comm *comm, int rank, const char *what, weft_status st) {
  fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, weft_status_name(st), weft_last_error(comm));
  return 1;
}

/* One allreduce of `count` elements; in place or not; checks the result,
 * the algorithm, and stores a hash for the cross-rank comparison. */
static int one_call(weft_comm *comm, int rank, int n, void *in, void *out, size_t count,
                    call_of k, int in_place, const char *want_algo) {
  size_t bytes = count * weft_dtype_size(k.dt);
  fill_rank(in, count, rank, &k);
  if (!in_place) memset(out, 0xa5, bytes ? bytes : 1);
  void *res = in_place ? in : out;
  weft_status st = weft_allreduce(comm, in, res, count, k.dt, k.op);
  char what[160];
  snprintf(what, sizeof what, "allreduce #%d count=%zu %s %s %s", k.tag, count,
           weft_dtype_name(k.dt), weft_op_name(k.op), in_place ? "in place" : "out of place");
  if (st) return report(comm, rank, what, st);
  int bad = 0;
  /* an i8, u8 or i32 avg sums in a 64-bit copy of ordinary memory (weft.h):
   * never the direct allreduce, whatever the buffers */
  if (k.op == WEFT_AVG && (k.dt == WEFT_I8 || k.dt == WEFT_U8 || k.dt == WEFT_I32) && want_algo &&
      !strcmp(want_algo, "direct"))
    want_algo = NULL;
  if (count && want_algo && strcmp(harness_last_algo(comm), want_algo)) {
    fprintf(stderr, "rank %d: %s ran %s, expected %s\n", rank, what, harness_last_algo(comm), want_algo);
    bad = 1;
  }
  char label[220];
  snprintf(label, sizeof label, "rank %d: %s (seed %llu):", rank, what,
           (unsigned long long)base_seed);
  bad |= harness_check_reduced(res, count, k.dt, k.op, n, fill_rank, &k, label);
  harness_shm->word[rank] = harness_hash(harness_shm->word[rank], res, bytes);
  return bad;
}

/* Every rank's running hash must be the same: identical bits everywhere. */
static int same_bits_everywhere(weft_comm *comm, int rank, int n) {
  uint64_t mine = harness_shm->word[rank];
  uint64_t *all = calloc((size_t)n, sizeof *all);
  int bad = weft_allgather(comm, &mine, all, 1, WEFT_I64) != WEFT_OK;
  for (int q = 0; q < n && !bad; q++)
    if (all[q] != mine) {
      fprintf(stderr, "rank %d: results differ in bits from rank %d's\n", rank, q);
      bad = 1;
    }
  free(all);
  return bad;
}

static const weft_dtype dtypes[] = {WEFT_F32, WEFT_F64,  WEFT_F16, WEFT_BF16,
                                    WEFT_I8,  WEFT_U8,  WEFT_I32, WEFT_I64};
static const weft_op ops[] = {WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX, WEFT_AVG};

/* A rank's communicator and a shared input and output of `bytes` each. */
typedef struct rank_setup {
  weft_comm *comm;
  void *in, *out;
} rank_setup;

static int setup_open(int rank, int n, const weft_unique_id *id, size_t bytes, rank_setup *r) {
  *r = (rank_setup){0};
  if (!(r->comm = harness_comm(rank, n, id))) return 1;
  if (weft_mem_alloc(bytes, &r->in) || weft_mem_alloc(bytes, &r->out))
    return report(r->comm, rank, "weft_mem_alloc", WEFT_ERR_NOMEM);
  return 0;
}

static int setup_close(rank_setup *r, int bad) {
  weft_mem_free(r->in);
  weft_mem_free(r->out);
  weft_comm_destroy(r->comm);
  return bad;
}

/* env: WEFT_ALGO=direct. Every dtype and op, random counts. */
static int forced_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  rank_setup r;
  if (setup_open(rank, n, id, 70000 * 8 + 64, &r)) return 1;
  weft_comm *comm = r.comm;
  void *in = r.in, *out = r.out;
  uint64_t s = harness_seed(base_seed, 1000, 0); /* the same counts on every rank */
  int bad = 0, tag = 0;
  const size_t fixed[] = {0, 1, (size_t)n - 1, 7, 64, 65};
  for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
    for (size_t oi = 0; oi < sizeof ops / sizeof *ops; oi++) {
      size_t count = tag < 6 ? fixed[tag] : harness_rng(&s) % 70000;
      call_of k = {dtypes[di], ops[oi], tag};
      bad |= one_call(comm, rank, n, in, out, count, k, tag % 2, "direct");
      tag++;
    }
  bad |= same_bits_everywhere(comm, rank, n);
  return setup_close(&r, bad);
}

/* auto: sizes around WEFT_DIRECT_MIN_BYTES (1 MiB): below it the ring. */
static int auto_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  rank_setup r;
  if (setup_open(rank, n, id, 3u << 20, &r)) return 1;
  weft_comm *comm = r.comm;
  void *in = r.in, *out = r.out;
  int bad = 0;
  bad |= one_call(comm, rank, n, in, out, (1u << 20) / 4 - 1, (call_of){WEFT_F32, WEFT_SUM, 1}, 0,
                  "ring");
  bad |= one_call(comm, rank, n, in, out, (1u << 20) / 4, (call_of){WEFT_F32, WEFT_SUM, 2}, 0,
                  "direct");
  bad |= one_call(comm, rank, n, in, out, 700001, (call_of){WEFT_BF16, WEFT_AVG, 3}, 1, "direct");
  bad |= one_call(comm, rank, n, in, out, 300007, (call_of){WEFT_I64, WEFT_MAX, 4}, 0, "direct");
  /* the same buffers again and again, as a training loop: after the first,
   * the verdict round is skipped (remembered agreement), fresh data each time */
  for (int again = 0; again < 4; again++)
    bad |= one_call(comm, rank, n, in, out, 400000, (call_of){WEFT_F32, WEFT_AVG, 5 + again}, 0,
                    "direct");
  if (!comm->core.choice.direct_agreed[WEFT_SIG_ALLREDUCE]) {
    fprintf(stderr, "rank %d: repeated direct calls left no remembered agreement\n", rank);
    bad = 1;
  }
  /* a gradient set's bucket, step after step on the same buffers: its
   * signature carries the step, which the rounds' messages leave out, so
   * from the second step on every rank skips the verdict round (the
   * agreement is remembered for the bucket's calls, not the plain ones) */
  for (uint64_t step = 0; step < 3; step++) {
    weft_request *req = NULL;
    fill_rank(in, 400000, rank, &(call_of){WEFT_F32, WEFT_SUM, 20 + (int)step});
    weft_status st = weft_api_ibucket_allreduce(comm, in, in, 400000, WEFT_F32, WEFT_SUM, -1, step, NULL,
                                                &req);
    if (!st) st = weft_wait(&req);
    if (st) return setup_close(&r, report(comm, rank, "bucket allreduce", st));
    char label[96];
    snprintf(label, sizeof label, "rank %d: bucket step %llu:", rank, (unsigned long long)step);
    bad |= harness_check_reduced(in, 400000, WEFT_F32, WEFT_SUM, n, fill_rank,
                                 &(call_of){WEFT_F32, WEFT_SUM, 20 + (int)step}, label);
    if (strcmp(harness_last_algo(comm), "direct")) {
      fprintf(stderr, "rank %d: bucket step %llu ran %s, expected direct\n", rank,
              (unsigned long long)step, harness_last_algo(comm));
      bad = 1;
    }
  }
  if (!comm->core.choice.direct_agreed[WEFT_SIG_GRAD_BUCKET]) {
    fprintf(stderr, "rank %d: a bucket's steps left no remembered agreement\n", rank);
    bad = 1;
  }
  bad |= same_bits_everywhere(comm, rank, n);
  return setup_close(&r, bad);
}

/* One rank's buffers are ordinary memory (its input, then its output):
 * every rank runs the ring in that call, then direct again. */
static int mixed_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  size_t count = 50000, bytes = count * 4;
  rank_setup r;
  if (setup_open(rank, n, id, bytes, &r)) return 1;
  weft_comm *comm = r.comm;
  void *in = r.in, *out = r.out;
  void *plain_in = malloc(bytes), *plain_out = malloc(bytes);
  int odd = n - 1; /* the rank with an ordinary buffer */
  call_of k = {WEFT_F32, WEFT_SUM, 10};
  int bad = one_call(comm, rank, n, rank == odd ? plain_in : in, out, count, k, 0, "ring");
  k.tag++;
  bad |= one_call(comm, rank, n, in, rank == odd ? plain_out : out, count, k, 0, "ring");
  k.tag++;
  bad |= one_call(comm, rank, n, in, out, count, k, 0, "direct");
  bad |= same_bits_everywhere(comm, rank, n);
  free(plain_in);
  free(plain_out);
  return setup_close(&r, bad);
}

/* auto: a shape that found ordinary buffers skips the question for the
 * next 15 calls of that shape (ring), then asks again and goes direct;
 * another shape is not affected. All ranks must skip alike, or the call
 * would fail (one rank asking while another runs the ring). */
static int memo_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  size_t count = (1u << 20) / 4 + 16, bytes = count * 4;
  rank_setup r;
  if (setup_open(rank, n, id, bytes, &r)) return 1;
  weft_comm *comm = r.comm;
  void *in = r.in, *out = r.out, *plain = malloc(bytes);
  call_of k = {WEFT_F32, WEFT_SUM, 50};
  int bad = one_call(comm, rank, n, rank == 1 ? plain : in, out, count, k, 0, "ring");
  for (int i = 0; i < 15; i++) {
    k.tag++;
    bad |= one_call(comm, rank, n, in, out, count, k, 0, "ring"); /* not asked */
    if (i == 7) /* another shape asks at once */
      bad |= one_call(comm, rank, n, in, out, count - 16, (call_of){WEFT_F32, WEFT_MAX, 99}, 1,
                      "direct");
  }
  k.tag++;
  bad |= one_call(comm, rank, n, in, out, count, k, 0, "direct"); /* asked again */
  k.tag++;
  bad |= one_call(comm, rank, n, in, out, count, k, 1, "direct");
  bad |= same_bits_everywhere(comm, rank, n);
  free(plain);
  return setup_close(&r, bad);
}

/* env: WEFT_TRANSPORT=tcp. Shared buffers, but no transport that maps. */
static int tcp_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  size_t count = 30001;
  rank_setup r;
  if (setup_open(rank, n, id, count * 8, &r)) return 1;
  weft_comm *comm = r.comm;
  void *in = r.in, *out = r.out;
  int bad = one_call(comm, rank, n, in, out, count, (call_of){WEFT_F64, WEFT_SUM, 20}, 0, "ring");
  bad |= one_call(comm, rank, n, in, out, count, (call_of){WEFT_I32, WEFT_MIN, 21}, 1, "ring");
  return setup_close(&r, bad);
}

/* Free and allocate between calls, sizes changing: a descriptor number the
 * peers mapped before now names other memory. */
static int realloc_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  for (int round = 0; round < 6 && !bad; round++) {
    size_t count = 1000 + (size_t)round * 7919;
    void *in = NULL, *out = NULL;
    if (weft_mem_alloc(count * 4, &in) || weft_mem_alloc(count * 4, &out))
      return report(comm, rank, "alloc", 1);
    bad |= one_call(comm, rank, n, in, out, count, (call_of){WEFT_I32, WEFT_SUM, 30 + round},
                    round % 2, "direct");
    weft_mem_free(round % 2 ? out : in); /* keep one across rounds now and then */
    if (round % 2) weft_mem_free(in);
    else weft_mem_free(out);
  }
  weft_comm_destroy(comm);
  return bad;
}

/* Three direct calls and a broadcast outstanding at once. */
static int nonblocking_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  size_t count = 40000;
  void *buf[3];
  weft_request *req[4] = {0};
  int bad = 0;
  for (int i = 0; i < 3; i++) {
    if (weft_mem_alloc(count * 4, &buf[i])) return report(comm, rank, "alloc", 1);
    fill_rank(buf[i], count, rank, &(call_of){WEFT_F32, WEFT_SUM, 40 + i});
    if (weft_iallreduce(comm, buf[i], buf[i], count, WEFT_F32, WEFT_SUM, &req[i]))
      bad |= report(comm, rank, "iallreduce", 1);
  }
  int32_t word = rank == 0 ? 12345 : 0;
  if (weft_ibroadcast(comm, &word, &word, 1, WEFT_I32, 0, &req[3]))
    bad |= report(comm, rank, "ibroadcast", 1);
  weft_status st = weft_wait_all(req, 4);
  if (st) return report(comm, rank, "wait_all", st);
  for (int i = 0; i < 3; i++) {
    call_of k = {WEFT_F32, WEFT_SUM, 40 + i};
    bad |= harness_check_reduced(buf[i], count, WEFT_F32, WEFT_SUM, n, fill_rank, &k,
                                 "iallreduce on shared buffers:");
    weft_mem_free(buf[i]);
  }
  if (word != 12345) bad |= report(comm, rank, "broadcast between direct calls", 1);
  weft_comm_destroy(comm);
  return bad;
}

/* The last rank ends inside a direct call: the others fail, naming it. */
static int dies_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  size_t count = 1u << 20;
  void *in = NULL;
  if (weft_mem_alloc(count * 4, &in)) return report(comm, rank, "alloc", 1);
  if (rank == n - 1) {
    weft_request *req = NULL;
    weft_iallreduce(comm, in, in, count, WEFT_F32, WEFT_SUM, &req);
    kill(getpid(), SIGKILL); /* gone with the call outstanding (no exit handlers:
                                a sanitizer's would let the progress thread finish) */
  }
  /* enter late: the dying rank's progress thread must not be able to
   * finish the call before it ends (it could under a slow sanitizer) */
  struct timespec late = {0, 300000000};
  nanosleep(&late, NULL);
  double t0 = harness_now();
  weft_status st = weft_allreduce(comm, in, in, count, WEFT_F32, WEFT_SUM);
  double took = harness_now() - t0;
  int bad = 0;
  if (st == WEFT_OK || took > 8) {
    fprintf(stderr, "rank %d: a peer died in a direct allreduce: got %s after %.1f s\n", rank,
            weft_status_name(st), took);
    bad = 1;
  }
  weft_comm_destroy(comm);
  weft_mem_free(in);
  return bad;
}

static void alloc_refusals(void **state) {
  (void)state;
  void *p = (void *)1;
  assert_int_equal(weft_mem_alloc(0, &p), WEFT_ERR_INVALID);
  assert_null(p);
  assert_int_equal(weft_mem_alloc(16, NULL), WEFT_ERR_INVALID);
  assert_int_equal(weft_mem_free(NULL), WEFT_OK);
  int local = 0;
  assert_int_equal(weft_mem_free(&local), WEFT_ERR_INVALID);
  assert_int_equal(weft_mem_alloc(10, &p), WEFT_OK);
  assert_non_null(p);
  assert_int_equal(((unsigned char *)p)[9], 0); /* zero-filled */
  assert_int_equal(weft_mem_free((char *)p + 1), WEFT_ERR_INVALID); /* not its start */
  assert_int_equal(weft_mem_free(p), WEFT_OK);
  assert_int_equal(weft_mem_free(p), WEFT_ERR_INVALID); /* twice */
}

static void run(int n, const char *const *env, harness_rank_fn fn) {
  harness_init();
  assert_int_equal(harness_run(n, env, 240, fn, NULL), 0);
}

/* The flight recorder is on in every case: the tests read which algorithm ran. */
static const char *const env_auto[] = {"WEFT_RECORDER=64", NULL};
static const char *const env_forced[] = {"WEFT_ALGO=direct", "WEFT_RECORDER=64", NULL};
static const char *const env_tcp[] = {"WEFT_TRANSPORT=tcp", "WEFT_ALGO=direct", "WEFT_RECORDER=64",
                                      NULL};
static const char *const env_dies[] = {"WEFT_TIMEOUT=20", NULL};

#define RANKS_TEST(name, fn, n, env) \
  static void name(void **state) {   \
    (void)state;                     \
    run(n, env, fn);                 \
  }

RANKS_TEST(forced2, forced_rank, 2, env_forced)
RANKS_TEST(forced3, forced_rank, 3, env_forced)
RANKS_TEST(forced4, forced_rank, 4, env_forced)
RANKS_TEST(auto2, auto_rank, 2, env_auto)
RANKS_TEST(auto3, auto_rank, 3, env_auto)
RANKS_TEST(mixed3, mixed_rank, 3, env_forced)
RANKS_TEST(memo3, memo_rank, 3, env_auto)
RANKS_TEST(tcp2, tcp_rank, 2, env_tcp)
RANKS_TEST(realloc2, realloc_rank, 2, env_forced)
RANKS_TEST(realloc3, realloc_rank, 3, env_forced)
RANKS_TEST(nonblocking3, nonblocking_rank, 3, env_forced)
/* the killed rank counts as failed; the other two must pass */
static void dies3(void **state) {
  (void)state;
  harness_init();
  assert_int_equal(harness_run(3, env_dies, 240, dies_rank, NULL), 1);
}

int main(void) {
  const char *seed = getenv("WEFT_TEST_SEED");
  base_seed = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("# seed %llu (WEFT_TEST_SEED reproduces)\n", (unsigned long long)base_seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(alloc_refusals), cmocka_unit_test(forced2),  cmocka_unit_test(forced3),
      cmocka_unit_test(forced4),        cmocka_unit_test(auto2),    cmocka_unit_test(auto3),
      cmocka_unit_test(mixed3),         cmocka_unit_test(memo3),         cmocka_unit_test(tcp2),     cmocka_unit_test(realloc2),
      cmocka_unit_test(realloc3),       cmocka_unit_test(nonblocking3), cmocka_unit_test(dies3),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
