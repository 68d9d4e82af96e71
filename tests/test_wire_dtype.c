/* test_wire_dtype.c - f32 data on the wire as bf16 or f16 (WEFT_WIRE_DTYPE,
 * weft_comm_set_wire_dtype, weft_grad_options.wire_dtype), ranks as
 * processes, 1..4, over the transport the suite names (shm: shm within a
 * pretend host, tcp across; tcp: tcp throughout). Every algorithm forced.
 * Checked against a float64 reference of the exact sum:
 *  - the error stays within the bound docs/tuning.md derives, n * u * (the
 *    sum of |x| over ranks) plus f32's own, u = 2^-8 (bf16) or 2^-11 (f16);
 *  - an allreduce's result is the same bits on every rank and a value of
 *    the wire dtype (rounded once at the end);
 *  - the errors are unbiased: round to nearest even, not truncation (which
 *    stays within the bound, so only this catches it);
 *  - where the wire dtype is ignored (one host, f64, max, the one-round
 *    exchange) the result is the exact f32 one, to f32's own bound;
 *  - ranks that disagree on it fail (never hang), and WEFT_CHECK names it;
 *  - a peer that dies in the middle of such a call is named by the others;
 *  - WEFT_WIRE_DTYPE=fp8 is refused when the communicator is created;
 *  - a gradient set with its own wire_dtype. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>

#include "harness.h"

typedef struct wire_group {
  const char *algo;  /* WEFT_ALGO */
  const char *hosts; /* "apart": a host per rank; "pairs": ranks 2k and 2k+1 share one; "one" */
  weft_dtype wire;
  int via_api; /* weft_comm_set_wire_dtype instead of WEFT_WIRE_DTYPE */
} wire_group;

/* What one rank found: errors and the bias statistics. */
typedef struct tally {
  int bad;
  double bias_sum; /* sum of (got - want) * sign(want) / (u * mag) */
  size_t bias_n;
  double max_err, sq_err; /* |got - want| / (u * mag): the largest, and the sum of squares */
  uint64_t hash;          /* of every allreduce result */
} tally;

static uint64_t base_seed = 0x5eed0f3172e5ULL;

/* Random f32 values that bf16 and f16 cannot hold exactly: 11 random bits
 * of mantissa, sign, exponents 2^-3 .. 2^3 (sums stay far inside f16's
 * range, and far above its subnormals). */
static void fill(float *buf, size_t count, uint64_t seed) {
  uint64_t s = seed;
  for (size_t i = 0; i < count; i++) {
    uint64_t r = harness_rng(&s);
    double m = 1.0 + (double)(r & 0x7ff) / 2048.0;
    int e = (int)((r >> 11) % 7) - 3;
    buf[i] = (float)ldexp((r >> 20) & 1 ? -m : m, e);
  }
}

static int nhosts_of(const wire_group *g, int n) {
  if (!strcmp(g->hosts, "apart")) return n;
  if (!strcmp(g->hosts, "pairs")) return (n + 1) / 2;
  return 1;
}

static double unit_roundoff(weft_dtype wire) {
  return wire == WEFT_BF16 ? ldexp(1, -8) : ldexp(1, -11);
}

/* A value of the wire dtype, by its definition: bf16 is the top half of an
 * f32; an f16 normal has 11 significant bits and at most 65504. */
static int representable(float v, weft_dtype wire) {
  if (wire == WEFT_BF16) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return (bits & 0xffff) == 0;
  }
  double a = fabs((double)v);
  if (a == 0) return 1;
  if (a > 65504) return 0;
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  if (e - 1 < -14) e = -13; /* subnormals: multiples of 2^-24 */
  double units = ldexp(a, 11 - e);
  return units == floor(units);
}

static int report(tally *t, int rank, const char *what, size_t count, size_t i, double got,
                  double want, double tol) {
  if (t->bad++ < 4)
    fprintf(stderr, "rank %d: %s count=%zu: element %zu is %.9g, reference %.9g, bound %.3g\n",
            rank, what, count, i, got, want, tol);
  return 1;
}

/* res[i] against the exact sum (or mean) of every rank's fill(seed(q)),
 * q in `ranks`: within the wire bound when `wire` applies (and counted
 * for the bias), else within f32's. */
static void check_sum(tally *t, int rank, int n, const char *what, const float *res, size_t count,
                      size_t offset, weft_op op, weft_dtype wire, int tag, int rounded) {
  float *x = malloc(sizeof(float) * (count + offset + 1));
  double *want = calloc(count + 1, sizeof(double)), *mag = calloc(count + 1, sizeof(double));
  for (int q = 0; q < n; q++) {
    fill(x, count + offset, harness_seed(base_seed, q, tag));
    for (size_t i = 0; i < count; i++) {
      want[i] += x[offset + i];
      mag[i] += fabs((double)x[offset + i]);
    }
  }
  double u = wire == WEFT_F32 ? 0 : unit_roundoff(wire);
  for (size_t i = 0; i < count; i++) {
    double w = op == WEFT_AVG ? want[i] / n : want[i], m = op == WEFT_AVG ? mag[i] / n : mag[i];
    /* n roundings of partial sums, each within u of a value below m
     * (second order: the (1 + n u)), and f32's own n + 1 */
    double tol = (n * u * (1 + n * u) + (n + 2) * ldexp(1, -24)) * m;
    double got = res[i];
    if (!(fabs(got - w) <= tol)) report(t, rank, what, count, i, got, w, tol);
    if (wire != WEFT_F32 && rounded && !representable(res[i], wire))
      report(t, rank, "(not a wire value)", count, i, got, w, 0);
    if (wire != WEFT_F32 && m > 0 && w != 0) {
      double e = (got - w) / (u * m);
      t->bias_sum += e * (w > 0 ? 1 : -1);
      t->bias_n++;
      t->max_err = fabs(e) > t->max_err ? fabs(e) : t->max_err;
      t->sq_err += e * e;
    }
  }
  free(x);
  free(want);
  free(mag);
}

/* Whether a call of `count` f32 elements runs with the wire dtype here. */
static weft_dtype wire_of_call(const wire_group *g, int n, size_t count) {
  if (n < 2 || nhosts_of(g, n) < 2) return WEFT_F32;
  /* the exchange takes what fits a chunk (262144 bytes by default) exact */
  if (!strcmp(g->algo, "exchange") && count * 4 <= 262144) return WEFT_F32;
  return g->wire;
}

static void allreduce_case(weft_comm *comm, const wire_group *g, tally *t, int rank, int n,
                           size_t count, weft_op op, int in_place, int tag) {
  float *in = malloc(sizeof(float) * (count + 1)), *out = malloc(sizeof(float) * (count + 1));
  fill(in, count, harness_seed(base_seed, rank, tag));
  float *res = in_place ? in : out;
  weft_status st = weft_allreduce(comm, in, res, count, WEFT_F32, op);
  if (st) {
    fprintf(stderr, "rank %d: allreduce count=%zu failed: %s\n", rank, count, weft_last_error(comm));
    t->bad++;
  } else {
    check_sum(t, rank, n, op == WEFT_AVG ? "allreduce avg" : "allreduce sum", res, count, 0, op,
              wire_of_call(g, n, count), tag, 1);
    t->hash = harness_hash(t->hash, res, count * sizeof(float));
  }
  free(in);
  free(out);
}

static void reduce_scatter_case(weft_comm *comm, const wire_group *g, tally *t, int rank, int n,
                                size_t recvcount, int tag) {
  size_t total = recvcount * (size_t)n;
  float *in = malloc(sizeof(float) * (total + 1)), *out = malloc(sizeof(float) * (recvcount + 1));
  fill(in, total, harness_seed(base_seed, rank, tag));
  weft_status st = weft_reduce_scatter(comm, in, out, recvcount, WEFT_F32, WEFT_SUM);
  if (st) {
    fprintf(stderr, "rank %d: reduce_scatter failed: %s\n", rank, weft_last_error(comm));
    t->bad++;
  } else { /* the last sum is not sent on: f32, not a wire value */
    check_sum(t, rank, n, "reduce_scatter", out, recvcount, (size_t)rank * recvcount, WEFT_SUM,
              n > 1 && nhosts_of(g, n) > 1 ? g->wire : WEFT_F32, tag, 0);
  }
  free(in);
  free(out);
}

static void reduce_case(weft_comm *comm, const wire_group *g, tally *t, int rank, int n,
                        size_t count, int tag) {
  float *in = malloc(sizeof(float) * (count + 1)), *out = malloc(sizeof(float) * (count + 1));
  int root = n - 1;
  fill(in, count, harness_seed(base_seed, rank, tag));
  weft_status st = weft_reduce(comm, in, rank == root ? out : NULL, count, WEFT_F32, WEFT_AVG, root);
  if (st) {
    fprintf(stderr, "rank %d: reduce failed: %s\n", rank, weft_last_error(comm));
    t->bad++;
  } else if (rank == root) {
    check_sum(t, rank, n, "reduce", out, count, 0, WEFT_AVG,
              n > 1 && nhosts_of(g, n) > 1 ? g->wire : WEFT_F32, tag, 0);
  }
  free(in);
  free(out);
}

/* Calls the wire dtype never touches: f64 sums and f32 max stay exact. */
static void untouched_cases(weft_comm *comm, tally *t, int rank, int n, int tag) {
  enum { COUNT = 4099 };
  double *d = malloc(sizeof(double) * COUNT), *dw = calloc(COUNT, sizeof(double));
  double *dm = calloc(COUNT, sizeof(double));
  float *f = malloc(sizeof(float) * COUNT), *fmax = malloc(sizeof(float) * COUNT);
  for (int q = 0; q < n; q++) {
    fill(f, COUNT, harness_seed(base_seed, q, tag));
    for (size_t i = 0; i < COUNT; i++) {
      dw[i] += (double)f[i] / 3;
      dm[i] += fabs((double)f[i] / 3);
      fmax[i] = q == 0 || f[i] > fmax[i] ? f[i] : fmax[i];
    }
  }
  fill(f, COUNT, harness_seed(base_seed, rank, tag));
  for (size_t i = 0; i < COUNT; i++) d[i] = (double)f[i] / 3;
  if (weft_allreduce(comm, d, d, COUNT, WEFT_F64, WEFT_SUM)) t->bad++;
  for (size_t i = 0; i < COUNT; i++)
    if (!(fabs(d[i] - dw[i]) <= (n + 1) * ldexp(1, -52) * dm[i]))
      report(t, rank, "f64 sum (wire must not apply)", COUNT, i, d[i], dw[i], 0);
  if (weft_allreduce(comm, f, f, COUNT, WEFT_F32, WEFT_MAX)) t->bad++;
  for (size_t i = 0; i < COUNT; i++)
    if (f[i] != fmax[i]) report(t, rank, "f32 max (wire must not apply)", COUNT, i, f[i], fmax[i], 0);
  free(d);
  free(dw);
  free(dm);
  free(f);
  free(fmax);
}

static void pretend_hosts(const wire_group *g, int rank) {
  char host[32];
  if (!strcmp(g->hosts, "one")) return;
  snprintf(host, sizeof host, "wire-host-%d", !strcmp(g->hosts, "apart") ? rank : rank / 2);
  setenv("WEFT_HOST_ID", host, 1);
  /* shm cannot cross pretend hosts: the suite's shm means shm within them */
  const char *tp = getenv("WEFT_TRANSPORT");
  if (tp && !strcmp(tp, "shm")) unsetenv("WEFT_TRANSPORT");
}

static int rank_main(int rank, int n, const weft_unique_id *id, void *arg) {
  const wire_group *g = arg;
  pretend_hosts(g, rank);
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  tally t = {.hash = 1469598103934665603ULL};
  if (g->via_api) {
    if (weft_comm_set_wire_dtype(comm, WEFT_I32) != WEFT_ERR_INVALID ||
        !strstr(weft_last_error(comm), "wire dtype i32") ||
        weft_comm_set_wire_dtype(NULL, WEFT_BF16) != WEFT_ERR_INVALID) {
      fprintf(stderr, "rank %d: a bad wire dtype was not refused\n", rank);
      t.bad++;
    }
    if (weft_comm_set_wire_dtype(comm, g->wire)) t.bad++;
  }
  static const size_t counts[] = {1, 7, 1021, 60000, 200003};
  int tag = 0;
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
    for (int k = 0; k < 2; k++)
      allreduce_case(comm, g, &t, rank, n, counts[c], k ? WEFT_AVG : WEFT_SUM, (int)(c + k) % 2,
                     ++tag);
  static const size_t rs_counts[] = {1, 1021, 70001};
  for (size_t c = 0; c < sizeof rs_counts / sizeof rs_counts[0]; c++)
    reduce_scatter_case(comm, g, &t, rank, n, rs_counts[c], ++tag);
  reduce_case(comm, g, &t, rank, n, 7, ++tag);
  reduce_case(comm, g, &t, rank, n, 100003, ++tag);
  untouched_cases(comm, &t, rank, n, ++tag);
  if (g->via_api) { /* per call: f32 for one call, then the wire dtype again */
    weft_comm_set_wire_dtype(comm, WEFT_F32);
    wire_group exact = *g;
    exact.wire = WEFT_F32;
    allreduce_case(comm, &exact, &t, rank, n, 70001, WEFT_SUM, 0, ++tag);
    weft_comm_set_wire_dtype(comm, g->wire);
    allreduce_case(comm, g, &t, rank, n, 70001, WEFT_SUM, 0, ++tag);
  }
  /* round to nearest even is unbiased; truncation would pull every result
   * toward zero by about half a unit of each rounding */
  if (t.bias_n >= 10000 && !(fabs(t.bias_sum / (double)t.bias_n) < 0.1)) {
    fprintf(stderr, "rank %d: rounding is biased: mean signed error %.3f units over %zu elements\n",
            rank, t.bias_sum / (double)t.bias_n, t.bias_n);
    t.bad++;
  }
  if (wire_of_call(g, n, 200003) != WEFT_F32 && t.bias_n < 10000) {
    fprintf(stderr, "rank %d: only %zu elements went through the wire dtype\n", rank, t.bias_n);
    t.bad++;
  }
  /* WEFT_WIRE_REPORT=1: the measured error in units of the bound's u * A
   * (the bound is n of them), for docs/tuning.md */
  if (getenv("WEFT_WIRE_REPORT") && rank == 0 && t.bias_n)
    printf("wire %s, %d ranks, %s, hosts %s: error max %.3f, rms %.3f, mean signed %.4f (u A) "
           "over %zu elements; bound %d\n",
           weft_dtype_name(g->wire), n, g->algo, g->hosts, t.max_err,
           sqrt(t.sq_err / (double)t.bias_n), t.bias_sum / (double)t.bias_n, t.bias_n, n);
  harness_shm->word[rank] = t.hash;
  weft_comm_destroy(comm);
  return t.bad != 0;
}

static void run_wire(int n, const wire_group *g) {
  char algo[64], wire[64];
  snprintf(algo, sizeof algo, "WEFT_ALGO=%s", g->algo);
  snprintf(wire, sizeof wire, "WEFT_WIRE_DTYPE=%s", g->via_api ? "f32" : weft_dtype_name(g->wire));
  const char *env[] = {algo, wire, NULL};
  harness_init();
  wire_group copy = *g;
  assert_int_equal(harness_run(n, env, 240, rank_main, &copy), 0);
  for (int r = 1; r < n; r++)
    if (harness_shm->word[r] != harness_shm->word[0]) {
      fprintf(stderr, "rank %d's allreduce results differ bitwise from rank 0's\n", r);
      fail();
    }
}

#define WIRE_TEST(name, n, algo, hosts, wire, api)        \
  static void name(void **state) {                        \
    (void)state;                                          \
    static const wire_group g = {algo, hosts, wire, api}; \
    run_wire(n, &g);                                      \
  }

WIRE_TEST(one_rank, 1, "auto", "apart", WEFT_BF16, 0)
WIRE_TEST(ring2, 2, "ring", "apart", WEFT_BF16, 0)
WIRE_TEST(ring3, 3, "ring", "apart", WEFT_BF16, 0)
WIRE_TEST(ring4, 4, "ring", "apart", WEFT_BF16, 0)
WIRE_TEST(rd2, 2, "rd", "apart", WEFT_BF16, 0)
WIRE_TEST(rd3, 3, "rd", "apart", WEFT_BF16, 0)
WIRE_TEST(rd4, 4, "rd", "apart", WEFT_F16, 1)
WIRE_TEST(hier3, 3, "hier", "apart", WEFT_BF16, 0)
WIRE_TEST(hier4_pairs, 4, "hier", "pairs", WEFT_BF16, 0)
WIRE_TEST(hier3_pairs, 3, "hier", "pairs", WEFT_F16, 1)
WIRE_TEST(auto2, 2, "auto", "apart", WEFT_F16, 0)
WIRE_TEST(auto4_pairs, 4, "auto", "pairs", WEFT_BF16, 0)
WIRE_TEST(ring4_pairs, 4, "ring", "pairs", WEFT_BF16, 0)
WIRE_TEST(exchange3, 3, "exchange", "apart", WEFT_BF16, 0)
/* direct needs one host: across hosts the choice falls back to rd or the ring */
WIRE_TEST(direct4_pairs, 4, "direct", "pairs", WEFT_BF16, 0)
WIRE_TEST(api_f16_ring3, 3, "ring", "apart", WEFT_F16, 1)
/* one host: ignored, exact f32 results */
WIRE_TEST(one_host3, 3, "auto", "one", WEFT_BF16, 0)
WIRE_TEST(one_host_ring4, 4, "ring", "one", WEFT_BF16, 1)

/* ---- ranks that disagree ------------------------------------------------ */

static int disagree_main(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  char host[32];
  snprintf(host, sizeof host, "wire-host-%d", rank);
  setenv("WEFT_HOST_ID", host, 1);
  const char *tp = getenv("WEFT_TRANSPORT");
  if (tp && !strcmp(tp, "shm")) unsetenv("WEFT_TRANSPORT");
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  if (rank == 0) weft_comm_set_wire_dtype(comm, WEFT_BF16);
  float buf[1021];
  fill(buf, 1021, 7);
  weft_status st = weft_allreduce(comm, buf, buf, 1021, WEFT_F32, WEFT_SUM);
  const char *check = getenv("WEFT_CHECK");
  int bad = 0;
  if (st == WEFT_OK) {
    fprintf(stderr, "rank %d: ranks disagreeing on the wire dtype got WEFT_OK\n", rank);
    bad = 1;
  } else if (check && !strcmp(check, "1") && !strstr(weft_last_error(comm), "wire bf16")) {
    fprintf(stderr, "rank %d: WEFT_CHECK's sentence does not name the wire dtype: %s\n", rank,
            weft_last_error(comm));
    bad = 1;
  }
  weft_comm_destroy(comm);
  return bad;
}

static void disagreeing_ranks(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=20", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, disagree_main, NULL), 0);
}

static void disagreeing_ranks_checked(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=20", "WEFT_CHECK=1", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, disagree_main, NULL), 0);
}

/* ---- a peer that dies in the middle of a call ------------------------------ */

static void *die_soon(void *arg) {
  (void)arg;
  struct timespec pause = {0, 150 * 1000000L};
  nanosleep(&pause, NULL);
  _exit(0);
}

/* 3 ranks on three hosts, bf16 allreduces of 1 Mi floats; rank 1 leaves
 * 150 ms in, most likely in the middle of one (a wait on the stage
 * included): the others fail naming it, never hang. */
static int dies_main(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  char host[32];
  snprintf(host, sizeof host, "wire-host-%d", rank);
  setenv("WEFT_HOST_ID", host, 1);
  const char *tp = getenv("WEFT_TRANSPORT");
  if (tp && !strcmp(tp, "shm")) unsetenv("WEFT_TRANSPORT");
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  enum { COUNT = 1 << 20 };
  float *buf = malloc(sizeof(float) * COUNT);
  fill(buf, COUNT, 11);
  pthread_t killer;
  if (rank == 1) pthread_create(&killer, NULL, die_soon, NULL);
  weft_status st = WEFT_OK;
  for (int i = 0; i < 100000 && st == WEFT_OK; i++)
    st = weft_allreduce(comm, buf, buf, COUNT, WEFT_F32, WEFT_AVG);
  const char *why = weft_last_error(comm);
  int bad = !strstr(why, "peer 1") && !strstr(why, "rank 1");
  if (bad) fprintf(stderr, "rank %d: %s does not name rank 1: %s\n", rank, weft_status_name(st), why);
  weft_comm_destroy(comm);
  free(buf);
  return bad;
}

static void peer_dies_mid_call(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=20", "WEFT_WIRE_DTYPE=bf16", NULL};
  harness_init();
  assert_int_equal(harness_run(3, env, 60, dies_main, NULL), 0);
}

/* ---- a setting that is not a wire dtype ------------------------------------ */

static int refused_main(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_rank(&comm, id, rank, n);
  const char *why = weft_last_error(NULL);
  if (st == WEFT_ERR_INVALID && strstr(why, "WEFT_WIRE_DTYPE") && strstr(why, "fp8") &&
      strstr(why, "bf16"))
    return 0;
  fprintf(stderr, "rank %d: WEFT_WIRE_DTYPE=fp8 gave %s: %s\n", rank, weft_status_name(st), why);
  if (comm) weft_comm_destroy(comm);
  return 1;
}

static void setting_refused(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_WIRE_DTYPE=fp8", "WEFT_TIMEOUT=5", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 30, refused_main, NULL), 0);
}

/* ---- a gradient set with its own wire dtype ------------------------------ */

static int grad_main(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  wire_group g = {"auto", "pairs", WEFT_BF16, 0};
  pretend_hosts(&g, rank);
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  tally t = {0};
  weft_grad_options o;
  weft_grad_options_init(&o);
  weft_grad *grad = NULL;
  o.wire_dtype = WEFT_I8;
  if (weft_grad_create(comm, &o, &grad) != WEFT_ERR_INVALID) t.bad++;
  o.wire_dtype = WEFT_BF16;
  o.op = WEFT_SUM;
  o.inplace_min_bytes = 0;
  enum { A = 1021, B = 70001 };
  float *a = malloc(sizeof(float) * A), *b = malloc(sizeof(float) * B);
  int ia, ib;
  if (weft_grad_create(comm, &o, &grad)) {
    fprintf(stderr, "rank %d: grad_create: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  weft_tensor ta = {a, A, WEFT_F32, WEFT_MEMORY_HOST}, tb = {b, B, WEFT_F32, WEFT_MEMORY_HOST};
  if (weft_grad_register(grad, &ta, &ia) || weft_grad_register(grad, &tb, &ib) ||
      weft_grad_finalize(grad)) {
    fprintf(stderr, "rank %d: grad setup: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  fill(a, A, harness_seed(base_seed, rank, 901));
  fill(b, B, harness_seed(base_seed, rank, 902));
  if (weft_grad_ready(grad, ib) || weft_grad_ready(grad, ia) || weft_grad_wait(grad)) {
    fprintf(stderr, "rank %d: grad step: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  check_sum(&t, rank, n, "gradient a", a, A, 0, WEFT_SUM, WEFT_BF16, 901, 1);
  check_sum(&t, rank, n, "gradient b", b, B, 0, WEFT_SUM, WEFT_BF16, 902, 1);
  weft_grad_destroy(grad);
  weft_comm_destroy(comm);
  free(a);
  free(b);
  return t.bad != 0;
}

static void grad_option(void **state) {
  (void)state;
  harness_init();
  assert_int_equal(harness_run(4, NULL, 120, grad_main, NULL), 0);
}

int main(void) {
  const char *seed = getenv("WEFT_TEST_SEED");
  if (seed) base_seed = strtoull(seed, NULL, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_rank),       cmocka_unit_test(ring2),
      cmocka_unit_test(ring3),          cmocka_unit_test(ring4),
      cmocka_unit_test(rd2),            cmocka_unit_test(rd3),
      cmocka_unit_test(rd4),            cmocka_unit_test(hier3),
      cmocka_unit_test(hier4_pairs),    cmocka_unit_test(hier3_pairs),
      cmocka_unit_test(auto2),          cmocka_unit_test(auto4_pairs),
      cmocka_unit_test(ring4_pairs),    cmocka_unit_test(exchange3),
      cmocka_unit_test(api_f16_ring3),  cmocka_unit_test(one_host3),
      cmocka_unit_test(one_host_ring4), cmocka_unit_test(disagreeing_ranks),
      cmocka_unit_test(disagreeing_ranks_checked), cmocka_unit_test(grad_option),
      cmocka_unit_test(direct4_pairs),  cmocka_unit_test(peer_dies_mid_call),
      cmocka_unit_test(setting_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
