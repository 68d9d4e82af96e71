/* test_grad.c - the gradient set (weft_grad_*), parameter broadcast, buffer
 * sync and metric averaging, as real processes on 1..4 ranks. Gradients are
 * fresh random data per rank, step and micro-step, checked against a serial
 * reference in double (wide integers for integer dtypes); bucket layouts
 * against the rule written out here independently; mismatches must reach
 * every rank as WEFT_ERR_MISMATCH naming the difference, in bounded time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

static uint64_t base_seed;

#define MAX_T 64

/* ---- a model: tensors shared by every rank -------------------------------- */

typedef struct model {
  int n;
  weft_dtype dt[MAX_T];
  size_t count[MAX_T];
} model;

/* A mix of dtypes and sizes, the same on every rank (seeded by base_seed
 * only); tensor `big` (if >= 0) is larger than any cap used here. */
static void make_model(model *m, int n, const weft_dtype *dts, int ndts, int big) {
  uint64_t s = base_seed ^ 0x5151;
  m->n = n;
  for (int i = 0; i < n; i++) {
    m->dt[i] = dts[i % ndts];
    uint64_t r = harness_rng(&s);
    m->count[i] = r % 5 == 0 ? 1 : r % 7 == 0 ? 0 : 1 + r % 700;
    if (i == big) m->count[i] = 9000 + r % 100;
  }
}

static int tag_of(int step, int micro, int i) {
  return (step * 8 + micro) * MAX_T + i;
}

/* Rank q's gradient of tensor i at (step, micro). Integers are kept small
 * so sums and prediv stay exact where a test needs that. */
static void fill_grad(void *buf, const model *m, int i, int q, int step, int micro) {
  harness_fill(buf, m->count[i], m->dt[i], WEFT_SUM,
               harness_seed(base_seed, q, tag_of(step, micro, i)));
}

/* Compares tensor i's result with op over ranks of the sum over `micros`
 * micro-steps; returns the number of bad elements reported. */
static int check_tensor(const void *res, const model *m, int i, int rank, int n, weft_op op,
                        int step, int micros, const char *what) {
  size_t c = m->count[i];
  weft_dtype dt = m->dt[i];
  unsigned char *tmp = malloc(c * 8 + 8);
  double *acc = calloc(c + 1, sizeof *acc), *mag = calloc(c + 1, sizeof *mag);
  double *a1 = calloc(c + 1, sizeof *a1), *m1 = calloc(c + 1, sizeof *m1);
  uint64_t *iacc = calloc(c + 1, sizeof *iacc), *i1 = calloc(c + 1, sizeof *i1);
  /* an integer avg sums the ranks' values in 64 bits; each rank's value is
   * its micro-steps' sum in the dtype, which wraps */
  uint64_t *iwide = calloc(c + 1, sizeof *iwide);
  uint64_t *irank = calloc(c + 1, sizeof *irank);
  for (int q = 0; q < n; q++) {
    memset(irank, 0, (c + 1) * sizeof *irank);
    for (int mi = 0; mi < micros; mi++) {
      fill_grad(tmp, m, i, q, step, mi);
      harness_ref_fold(a1, m1, i1, tmp, c, dt, WEFT_SUM, 1);
      for (size_t e = 0; e < c; e++) {
        acc[e] += a1[e];
        mag[e] += m1[e];
        iacc[e] += i1[e];
        irank[e] += i1[e];
      }
    }
    for (size_t e = 0; e < c; e++) iwide[e] += (uint64_t)harness_wrap(irank[e], dt);
  }
  int bad = 0;
  for (size_t e = 0; e < c && bad < 3; e++) {
    double got, want;
    int ok;
    if (harness_is_float(dt)) {
      double eps = harness_eps(dt);
      want = op == WEFT_AVG ? acc[e] / n : acc[e];
      got = harness_get(res, e, dt);
      /* n*micros roundings of partial sums, plus pre/post scaling */
      ok = fabs(got - want) <= (n * micros + 3) * eps * mag[e] + 3 * eps * fabs(want);
    } else {
      int64_t w = harness_wrap(iacc[e], dt), g = harness_get_int(res, e, dt);
      /* avg sums i8, u8 and i32 in 64 bits (no wrap), i64 in 64 bits (may wrap) */
      if (op == WEFT_AVG) w = (dt == WEFT_I64 ? w : (int64_t)iwide[e]) / n;
      ok = g == w;
      got = (double)g;
      want = (double)w;
    }
    if (!ok) {
      fprintf(stderr,
              "rank %d: %s: step %d tensor %d (%zu %s, %s) element %zu is %.17g, reference "
              "%.17g (seed %llu)\n",
              rank, what, step, i, c, weft_dtype_name(dt), weft_op_name(op), e, got, want,
              (unsigned long long)base_seed);
      bad++;
    }
  }
  free(tmp);
  free(acc);
  free(mag);
  free(a1);
  free(m1);
  free(iacc);
  free(iwide);
  free(irank);
  free(i1);
  return bad;
}

/* Ends a rank: a barrier first, so no rank unmaps its side of a connection
 * while a peer still reads the last collective's data from it. */
static int finish(weft_comm *comm, int rank, int bad) {
  if (weft_barrier(comm)) {
    fprintf(stderr, "rank %d: final barrier: %s\n", rank, weft_last_error(comm));
    bad++;
  }
  weft_comm_destroy(comm);
  return bad != 0;
}

#define FAILS(expr, what)                                                            \
  do {                                                                               \
    weft_status st_ = (expr);                                                        \
    if (st_) {                                                                       \
      fprintf(stderr, "rank %d: line %d: %s: %s: %s\n", rank, __LINE__, what, #expr, \
              weft_last_error(comm));                                                \
      bad++;                                                                         \
      goto out;                                                                      \
    }                                                                                \
  } while (0)

/* A random permutation of 0..n-1 for (rank, step). */
static void shuffle(int *p, int n, int rank, int step) {
  uint64_t s = harness_seed(base_seed, rank, 900000 + step);
  for (int i = 0; i < n; i++) p[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(harness_rng(&s) % (uint64_t)(i + 1));
    int t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

/* ---- bucket formation ------------------------------------------------------ */

/* The rule of weft.h, written out again: walk tensors in reverse
 * registration order; per dtype one open bucket; a tensor that does not fit
 * closes it; the first bucket of a dtype has the first cap; a bucket is
 * closed once full; offsets are rounded up to 64 bytes. */
static void expected_layout(const model *m, size_t cap, size_t first_cap, size_t inplace,
                            const int *order, int *bucket, size_t *offset, int *nbuckets) {
  int open[WEFT_DTYPE_COUNT], formed[WEFT_DTYPE_COUNT] = {0};
  size_t used[WEFT_DTYPE_COUNT] = {0}, ocap[WEFT_DTYPE_COUNT] = {0};
  for (int d = 0; d < WEFT_DTYPE_COUNT; d++) open[d] = -1;
  *nbuckets = 0;
  if (!first_cap) first_cap = cap; /* 0: the same cap for the first bucket */
  for (int k = 0; k < m->n; k++) {
    int i = order ? order[k] : m->n - 1 - k;
    int d = m->dt[i];
    size_t esz = weft_dtype_size(m->dt[i]), bytes = m->count[i] * esz;
    if (inplace && bytes >= inplace) { /* copies: alone, and the open bucket closes */
      open[d] = -1;
      bucket[i] = (*nbuckets)++;
      offset[i] = 0;
      continue;
    }
    if (open[d] >= 0 && used[d] + bytes > ocap[d]) open[d] = -1;
    if (open[d] < 0) {
      open[d] = (*nbuckets)++;
      ocap[d] = formed[d]++ ? cap : first_cap;
      used[d] = 0;
    }
    bucket[i] = open[d];
    offset[i] = used[d] / esz;
    used[d] += (bytes + 63) / 64 * 64;
    if (used[d] >= ocap[d]) open[d] = -1;
  }
}

typedef struct grad_case {
  int owned;
  weft_op op;
  double prediv;
  int with_ints;   /* integer tensors too (not with prediv: it truncates) */
  int skip_unused; /* step 1: tensor 3 is never marked ready (an unused parameter) */
  size_t cap, first_cap;
  int given_order; /* weft_grad_set_order with a random permutation (the same on every rank) */
  size_t inplace;  /* inplace_min_bytes (copy mode) */
} grad_case;

static const weft_dtype float_mix[] = {WEFT_F32, WEFT_F16, WEFT_F32, WEFT_F64, WEFT_BF16};
static const weft_dtype int_mix[] = {WEFT_F32, WEFT_I32, WEFT_F16, WEFT_F64, WEFT_BF16, WEFT_I64};

/* Registers the model, checks the layout, then 3 steps with each rank
 * marking tensors ready in its own random order, each checked. */
static int reduce_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  const grad_case *gc = arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  model m;
  if (gc->with_ints)
    make_model(&m, 23, int_mix, 6, 7);
  else
    make_model(&m, 23, float_mix, 5, 7);
  int bad = 0, idx[MAX_T], perm[MAX_T];
  void *mine[MAX_T] = {0}, *ptr[MAX_T];
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = gc->owned;
  o.op = gc->op;
  o.prediv = gc->prediv;
  o.bucket_cap_bytes = gc->cap;
  o.first_bucket_cap_bytes = gc->first_cap;
  o.inplace_min_bytes = gc->inplace;
  FAILS(weft_grad_create(comm, &o, &g), "create");
  for (int i = 0; i < m.n; i++) {
    mine[i] = malloc(m.count[i] * 8 + 8);
    weft_tensor t = {gc->owned ? NULL : mine[i], m.count[i], m.dt[i], WEFT_MEMORY_HOST};
    FAILS(weft_grad_register(g, &t, &idx[i]), "register");
    if (idx[i] != i) {
      fprintf(stderr, "rank %d: tensor %d got index %d\n", rank, i, idx[i]);
      bad++;
    }
  }
  int order[MAX_T];
  if (gc->given_order) {
    shuffle(order, m.n, 0, 12345); /* rank 0's permutation, on every rank */
    FAILS(weft_grad_set_order(g, order, m.n), "set_order");
  }
  FAILS(weft_grad_finalize(g), "finalize");

  /* layout: as the rule says, and sane on its own terms */
  int want_b[MAX_T], nb;
  size_t want_off[MAX_T];
  expected_layout(&m, gc->cap, gc->first_cap, gc->owned ? 0 : gc->inplace,
                  gc->given_order ? order : NULL, want_b, want_off, &nb);
  if (weft_grad_bucket_count(g) != nb) {
    fprintf(stderr, "rank %d: %d buckets, the rule gives %d\n", rank, weft_grad_bucket_count(g),
            nb);
    bad++;
  }
  for (int i = 0; i < m.n; i++) {
    int b;
    size_t off;
    FAILS(weft_grad_tensor_place(g, i, &b, &off), "place");
    if (b != want_b[i] || off != want_off[i]) {
      fprintf(stderr, "rank %d: tensor %d (%zu %s) in bucket %d at %zu; rule: %d at %zu\n", rank, i,
              m.count[i], weft_dtype_name(m.dt[i]), b, off, want_b[i], want_off[i]);
      bad++;
    }
  }
  for (int b = 0; b < nb && !bad; b++) {
    weft_grad_bucket_desc d;
    FAILS(weft_grad_bucket_info(g, b, &d), "bucket_info");
    if (d.bytes > gc->cap && d.ntensors != 1) {
      fprintf(stderr, "rank %d: bucket %d holds %zu bytes in %d tensors over the cap %zu\n", rank,
              b, d.bytes, d.ntensors, gc->cap);
      bad++;
    }
  }
  {
    int b;
    size_t off;
    weft_grad_bucket_desc d;
    FAILS(weft_grad_tensor_place(g, 7, &b, &off), "place");
    FAILS(weft_grad_bucket_info(g, b, &d), "bucket_info");
    if (m.count[7] * weft_dtype_size(m.dt[7]) > gc->cap &&
        (d.ntensors != 1 || d.count != m.count[7])) {
      fprintf(stderr, "rank %d: the tensor over the cap shares bucket %d (%d tensors)\n", rank, b,
              d.ntensors);
      bad++;
    }
  }
  for (int i = 0; i < m.n; i++) {
    if (!gc->owned) {
      ptr[i] = mine[i];
      continue;
    }
    FAILS(weft_grad_tensor_ptr(g, i, &ptr[i]), "tensor_ptr");
    if ((uintptr_t)ptr[i] % 64) {
      fprintf(stderr, "rank %d: tensor %d's view is not 64-byte aligned\n", rank, i);
      bad++;
    }
  }

  for (int step = 0; step < 3 && !bad; step++) {
    for (int i = 0; i < m.n; i++) fill_grad(ptr[i], &m, i, rank, step, 0);
    shuffle(perm, m.n, rank, step);
    for (int k = 0; k < m.n; k++) {
      if (gc->skip_unused && step == 1 && perm[k] == 3) continue;
      FAILS(weft_grad_ready(g, perm[k]), "ready");
    }
    FAILS(weft_grad_wait(g), "wait");
    for (int i = 0; i < m.n; i++)
      bad += check_tensor(ptr[i], &m, i, rank, n, gc->op, step, 1, "reduce");
  }
  weft_grad_stats stats;
  FAILS(weft_grad_get_stats(g, &stats), "stats");
  if (stats.synced_steps != 3 || stats.buckets_launched != 3 * (uint64_t)nb) {
    fprintf(stderr, "rank %d: stats: %llu synced steps, %llu buckets launched (want 3, %d)\n", rank,
            (unsigned long long)stats.synced_steps, (unsigned long long)stats.buckets_launched,
            3 * nb);
    bad++;
  }
  /* owned storage: no pass over the gradients besides the reduction */
  if (gc->owned && stats.bytes_copied) {
    fprintf(stderr, "rank %d: owned storage copied %llu bytes\n", rank,
            (unsigned long long)stats.bytes_copied);
    bad++;
  }
  /* copy mode copies the tensors of every bucket that holds more than one
   * (a bucket of one tensor is reduced where it lies, whatever its size: with
   * random sizes, every small tensor can end up alone between large ones) */
  int some_staged = 0, *members = calloc((size_t)nb + 1, sizeof *members);
  size_t *bytes_in = calloc((size_t)nb + 1, sizeof *bytes_in);
  for (int i = 0; i < m.n && members && bytes_in; i++) {
    int b = -1;
    size_t off;
    FAILS(weft_grad_tensor_place(g, i, &b, &off), "tensor_place");
    if (b < 0 || b >= nb) continue;
    members[b]++;
    bytes_in[b] += m.count[i] * weft_dtype_size(m.dt[i]);
    /* a bucket of empty tensors (count 0) copies nothing either */
    some_staged |= members[b] > 1 && bytes_in[b] > 0;
  }
  free(members);
  free(bytes_in);
  if (!gc->owned && some_staged && !stats.bytes_copied) {
    fprintf(stderr, "rank %d: copy mode copied nothing (is the count broken?) (seed %llu)\n", rank,
            (unsigned long long)base_seed);
    bad++;
  }
out:
  weft_grad_destroy(g);
  for (int i = 0; i < m.n; i++) free(mine[i]);
  return finish(comm, rank, bad);
}

static void run_reduce(int n, grad_case gc) {
  harness_init();
  assert_int_equal(harness_run(n, NULL, 90, reduce_rank, &gc), 0);
}

/* formation: mixed dtypes and sizes, one tensor over the cap, 1 and 2 ranks */
static void formation_mixed(void **state) {
  (void)state;
  grad_case gc = {0, WEFT_SUM, 0, 1, 0, 4096, 1024, 0, 0};
  run_reduce(1, gc);
  run_reduce(2, gc);
}
/* mean and sum, copies and owned storage, 1..4 ranks */
static void mean_copy_1to4(void **state) {
  (void)state;
  for (int n = 1; n <= 4; n++) run_reduce(n, (grad_case){0, WEFT_AVG, 0, 1, 1, 2048, 512, 0, 0});
}
static void sum_owned_3(void **state) {
  (void)state;
  run_reduce(3, (grad_case){1, WEFT_SUM, 0, 1, 1, 2048, 512, 0, 0});
}
static void mean_owned_4(void **state) {
  (void)state;
  run_reduce(4, (grad_case){1, WEFT_AVG, 0, 1, 0, 3000, 0, 0, 0});
}
static void prediv_mean_and_sum(void **state) {
  (void)state;
  run_reduce(3, (grad_case){0, WEFT_AVG, 2, 0, 0, 2048, 512, 0, 0});
  run_reduce(2, (grad_case){1, WEFT_SUM, 3, 0, 1, 2048, 512, 0, 0});
}
static void default_caps_one_bucket_per_dtype(void **state) {
  (void)state;
  run_reduce(2, (grad_case){0, WEFT_AVG, 0, 1, 0, 25u << 20, 1u << 20, 0, 0});
}
/* the caller's order instead of reverse registration */
static void given_order(void **state) {
  (void)state;
  run_reduce(3, (grad_case){0, WEFT_SUM, 0, 1, 0, 2048, 256, 1, 0});
  run_reduce(2, (grad_case){1, WEFT_AVG, 0, 0, 1, 1500, 0, 1, 0});
}
/* copies: large tensors reduced where they lie, in buckets of their own */
static void large_tensors_in_place(void **state) {
  (void)state;
  run_reduce(3, (grad_case){0, WEFT_AVG, 0, 1, 1, 4096, 1024, 0, 1024});
  run_reduce(2, (grad_case){0, WEFT_SUM, 0, 0, 0, 2048, 512, 1, 700});
}

/* ---- out-of-order ready: buckets still leave in index order ---------------- */

static int order_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  model m;
  make_model(&m, 20, float_mix, 1, -1); /* all f32: one chain of buckets */
  for (int i = 0; i < m.n; i++) m.count[i] = 100 + i;
  int bad = 0, nb = 0;
  void *buf[MAX_T] = {0};
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.bucket_cap_bytes = 1200;
  o.first_bucket_cap_bytes = 1200;
  FAILS(weft_grad_create(comm, &o, &g), "create");
  for (int i = 0; i < m.n; i++) {
    buf[i] = malloc(m.count[i] * 4);
    weft_tensor t = {buf[i], m.count[i], WEFT_F32, WEFT_MEMORY_HOST};
    FAILS(weft_grad_register(g, &t, NULL), "register");
  }
  FAILS(weft_grad_finalize(g), "finalize");
  nb = weft_grad_bucket_count(g);
  if (nb < 4) {
    fprintf(stderr, "rank %d: only %d buckets\n", rank, nb);
    bad++;
    goto out;
  }
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < m.n; i++) fill_grad(buf[i], &m, i, rank, step, 0);
    /* rank 0: registration order, i.e. the last bucket fills first; others random */
    int perm[MAX_T];
    shuffle(perm, m.n, rank, step);
    for (int k = 0; k < m.n; k++) {
      int i = rank == 0 ? k : perm[k];
      FAILS(weft_grad_ready(g, i), "ready");
      /* no bucket may be launched while an earlier one is not */
      int seen_unlaunched = -1;
      for (int b = 0; b < nb; b++) {
        weft_grad_bucket_desc d;
        FAILS(weft_grad_bucket_info(g, b, &d), "bucket_info");
        if (d.state != WEFT_GRAD_BUCKET_LAUNCHED && seen_unlaunched < 0) seen_unlaunched = b;
        if (d.state == WEFT_GRAD_BUCKET_LAUNCHED && seen_unlaunched >= 0) {
          fprintf(stderr, "rank %d: bucket %d launched before bucket %d\n", rank, b,
                  seen_unlaunched);
          bad++;
        }
        /* a full bucket right after the launched prefix would have been launched */
        if (d.state == WEFT_GRAD_BUCKET_FULL && b == seen_unlaunched) {
          fprintf(stderr, "rank %d: bucket %d is full but was not launched\n", rank, b);
          bad++;
        }
      }
      if (rank == 0 && k == m.n - 2) {
        /* everything but tensor 19 (in bucket 0) is ready: the others wait, full */
        weft_grad_bucket_desc d0, dl;
        FAILS(weft_grad_bucket_info(g, 0, &d0), "bucket_info");
        FAILS(weft_grad_bucket_info(g, nb - 1, &dl), "bucket_info");
        if (d0.state != WEFT_GRAD_BUCKET_FILLING || dl.state != WEFT_GRAD_BUCKET_FULL) {
          fprintf(stderr, "rank 0: bucket 0 state %d (want filling), last %d (want full)\n",
                  d0.state, dl.state);
          bad++;
        }
      }
    }
    FAILS(weft_grad_wait(g), "wait");
    for (int i = 0; i < m.n; i++)
      bad += check_tensor(buf[i], &m, i, rank, n, WEFT_AVG, step, 1, "order");
  }
out:
  weft_grad_destroy(g);
  for (int i = 0; i < m.n; i++) free(buf[i]);
  return finish(comm, rank, bad);
}

static void out_of_order_ready(void **state) {
  (void)state;
  for (int n = 2; n <= 3; n++) {
    harness_init();
    assert_int_equal(harness_run(n, NULL, 60, order_rank, NULL), 0);
  }
}

/* ---- accumulation -------------------------------------------------------------- */

static int accumulate_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  int owned = *(const int *)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  static const weft_dtype dts[] = {WEFT_F32, WEFT_F64};
  model m;
  make_model(&m, 12, dts, 2, 2);
  int bad = 0, k = 3;
  void *mine[MAX_T] = {0}, *ptr[MAX_T];
  unsigned char tmp[80000];
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = owned;
  o.bucket_cap_bytes = 3000;
  FAILS(weft_grad_create(comm, &o, &g), "create");
  for (int i = 0; i < m.n; i++) {
    mine[i] = calloc(m.count[i] + 1, 8);
    weft_tensor t = {mine[i], m.count[i], m.dt[i], WEFT_MEMORY_HOST};
    FAILS(weft_grad_register(g, &t, NULL), "register");
  }
  FAILS(weft_grad_finalize(g), "finalize");
  for (int i = 0; i < m.n; i++)
    if (!owned)
      ptr[i] = mine[i];
    else
      FAILS(weft_grad_tensor_ptr(g, i, &ptr[i]), "tensor_ptr");
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < m.n; i++) memset(ptr[i], 0, m.count[i] * weft_dtype_size(m.dt[i]));
    /* k local micro-steps, then the synced one: the framework adds each
     * micro-step's gradient into the tensors (zero_grad only after a sync) */
    for (int micro = 0; micro <= k; micro++) {
      FAILS(weft_grad_set_sync(g, micro == k), "set_sync");
      weft_grad_stats before, after;
      FAILS(weft_grad_get_stats(g, &before), "stats");
      for (int i = 0; i < m.n; i++) {
        fill_grad(tmp, &m, i, rank, step, micro);
        for (size_t e = 0; e < m.count[i]; e++) {
          if (m.dt[i] == WEFT_F32)
            ((float *)ptr[i])[e] += ((float *)tmp)[e];
          else
            ((double *)ptr[i])[e] += ((double *)tmp)[e];
        }
        FAILS(weft_grad_ready(g, i), "ready"); /* final once added: backward's hook */
      }
      FAILS(weft_grad_wait(g), "wait");
      FAILS(weft_grad_get_stats(g, &after), "stats");
      if (micro < k && after.buckets_launched != before.buckets_launched) {
        fprintf(stderr, "rank %d: a no-sync micro-step launched buckets\n", rank);
        bad++;
      }
      if (micro < k && n > 1) {
        /* still this rank's own sums: compare with a 1-rank "reduction" of ours */
        for (int i = 0; i < m.n && !bad; i++) {
          double d0 = 0;
          for (int mi = 0; mi <= micro; mi++) {
            fill_grad(tmp, &m, i, rank, step, mi);
            d0 += m.count[i] ? harness_get(tmp, 0, m.dt[i]) : 0;
          }
          if (m.count[i] && harness_get(ptr[i], 0, m.dt[i]) != d0) {
            fprintf(stderr, "rank %d: micro-step %d changed tensor %d without sync\n", rank, micro,
                    i);
            bad++;
          }
        }
      }
    }
    for (int i = 0; i < m.n; i++)
      bad += check_tensor(ptr[i], &m, i, rank, n, WEFT_AVG, step, k + 1, "accumulate");
  }
out:
  weft_grad_destroy(g);
  for (int i = 0; i < m.n; i++) free(mine[i]);
  return finish(comm, rank, bad);
}

static void accumulation(void **state) {
  (void)state;
  for (int owned = 0; owned < 2; owned++) {
    harness_init();
    assert_int_equal(harness_run(3, NULL, 60, accumulate_rank, &owned), 0);
  }
}

/* ---- mismatches reach every rank ----------------------------------------------- */

enum {
  MIS_COUNT,
  MIS_DTYPE,
  MIS_NUMBER,
  MIS_CAP,
  MIS_ORDER,
  MIS_PARAMS,
  MIS_METRICS,
  MIS_STEP_SYNC,
  MIS_CALL,
  MIS_KINDS
};
/* what the message on every rank must say */
static const char *const mis_words[MIS_KINDS] = {
    "tensor 5 differs: rank 0 has 16 f32 (host), rank 3 has 15 f32 (host)",
    "tensor 0 differs: rank 0 has 16 f32 (host), rank 2 has 16 bf16 (host)",
    "rank 0 has 10 tensors, rank(s) 3 a different number (the first 9 agree)",
    "bucket_cap_bytes differs: rank 0 has 26214400, rank(s) 2 not (rank 2: 1000)",
    "fill order differs",
    "tensor 2 differs: rank 0 has 16 f32 (host), rank 2 has 3 f32 (host)",
    "the number of metrics differs: rank 0 has 4, rank(s) 3 not (rank 3: 3)",
    "synchronisation on (weft_grad_set_sync) differs: rank 0 has 1, rank(s) 2 not",
    "another call"};

static int mismatch_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  int kind = *(const int *)arg, odd = rank == n - 1, bad = 0;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  float data[64][16];
  weft_tensor t[64];
  for (int i = 0; i < 64; i++) t[i] = (weft_tensor){data[i], 16, WEFT_F32, WEFT_MEMORY_HOST};
  int nt = 10;
  if (odd && kind == MIS_COUNT) t[5].count = 15;
  if (odd && kind == MIS_DTYPE) t[0].dtype = WEFT_BF16;
  if (odd && kind == MIS_NUMBER) nt = 9;
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  if (odd && kind == MIS_CAP) o.bucket_cap_bytes = 1000;
  /* the per-step check by option here; by WEFT_GRAD_CHECK=1 in the second run */
  if (kind == MIS_STEP_SYNC && !getenv("WEFT_GRAD_CHECK")) o.check_every_step = 1;
  double t0 = harness_now();
  weft_status st = WEFT_OK;
  if (kind == MIS_PARAMS) {
    if (odd) t[2].count = 3;
    st = weft_params_broadcast(comm, t, nt, 0);
  } else if (kind == MIS_CALL) {
    /* the odd rank broadcasts parameters while the others sync buffers */
    st = odd ? weft_params_broadcast(comm, t, nt, 0)
             : weft_buffers_sync(comm, t, nt, WEFT_SYNC_AVERAGE, 0);
  } else if (kind == MIS_METRICS) {
    double v[4] = {1, 2, 3, 4};
    st = weft_metrics_average(comm, v, NULL, odd ? 3 : 4);
  } else {
    FAILS(weft_grad_create(comm, &o, &g), "create");
    for (int i = 0; i < nt; i++) FAILS(weft_grad_register(g, &t[i], NULL), "register");
    if (kind == MIS_ORDER && !odd) {
      int order[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
      FAILS(weft_grad_set_order(g, order, nt), "set_order");
    }
    st = weft_grad_finalize(g);
    if (kind == MIS_STEP_SYNC && !st) {
      /* step 0 agrees; in step 1 the odd rank accumulates while the others sync */
      for (int step = 0; step < 2 && !st; step++) {
        if (step == 1 && odd) weft_grad_set_sync(g, 0);
        for (int i = 0; i < nt && !st; i++) st = weft_grad_ready(g, i);
        if (!st) st = weft_grad_wait(g);
      }
    }
  }
  double secs = harness_now() - t0;
  const char *e = weft_last_error(comm);
  if (st != WEFT_ERR_MISMATCH || !strstr(e, mis_words[kind]) || secs > 15) {
    fprintf(stderr, "rank %d: kind %d: %s after %.1f s: \"%s\" (want \"%s\")\n", rank, kind,
            weft_status_name(st), secs, e, mis_words[kind]);
    bad++;
  }
out:
  weft_grad_destroy(g);
  return finish(comm, rank, bad);
}

static void mismatch_every_rank(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=20", NULL};
  for (int kind = 0; kind < MIS_KINDS; kind++) {
    int n = kind % 2 ? 3 : 4;
    harness_init();
    if (harness_run(n, env, 60, mismatch_rank, &kind)) {
      fprintf(stderr, "mismatch kind %d (\"%s\") on %d ranks failed\n", kind, mis_words[kind], n);
      fail();
    }
  }
  static const char *const env_check[] = {"WEFT_TIMEOUT=20", "WEFT_GRAD_CHECK=1", NULL};
  int kind = MIS_STEP_SYNC;
  harness_init();
  assert_int_equal(harness_run(3, env_check, 60, mismatch_rank, &kind), 0);
}

/* The default mode (no per-step check): one rank accumulates in step 1
 * (weft_grad_set_sync(g, 0)) while the others sync. Before, every call
 * returned OK and from step 2 on that rank's buckets paired with the others'
 * of the step before (issue 39: 1,120,144 of 1,960,252 elements wrong). Now
 * each bucket's chunks carry the set's step: the others fail in step 1,
 * the odd rank in step 2 (its first bucket after the skipped one), naming the
 * steps; no rank returns OK past the step where it happened. */
static int skipped_sync_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0, odd = rank == n - 1;
  enum { NT = 35 };
  static float data[NT][300];
  weft_tensor t[NT];
  for (int i = 0; i < NT; i++)
    t[i] = (weft_tensor){data[i], (size_t)(50 + 7 * i), i % 3 ? WEFT_F32 : WEFT_F64, WEFT_MEMORY_HOST};
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.bucket_cap_bytes = 1024;
  FAILS(weft_grad_create(comm, &o, &g), "create");
  for (int i = 0; i < NT; i++) FAILS(weft_grad_register(g, &t[i], NULL), "register");
  FAILS(weft_grad_finalize(g), "finalize");
  weft_status st = WEFT_OK;
  int step = 0;
  double t0 = harness_now();
  for (; step < 4 && !st; step++) {
    if (odd) weft_grad_set_sync(g, step != 1);
    for (int i = 0; i < NT && !st; i++) st = weft_grad_ready(g, i);
    if (!st) st = weft_grad_wait(g);
  }
  step--; /* the step that failed */
  const char *e = weft_last_error(comm);
  harness_shm->word[rank] = strstr(e, "step") != NULL;
  if (st == WEFT_OK || step > 2 || harness_now() - t0 > 15) {
    fprintf(stderr, "rank %d%s: %s in step %d: %s\n", rank, odd ? " (skipped step 1)" : "",
            weft_status_name(st), step, e);
    bad++;
  }
out:
  weft_grad_destroy(g);
  weft_comm_destroy(comm); /* failed on purpose: no final barrier */
  return bad != 0;
}

static void skipped_sync_fails_every_rank(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=20", NULL};
  for (int tp = 0; tp < 2; tp++) {
    const char *const envs[] = {env[0], tp ? "WEFT_TRANSPORT=tcp" : "WEFT_TRANSPORT=shm", NULL};
    harness_init();
    assert_int_equal(harness_run(3, envs, 60, skipped_sync_rank, NULL), 0);
    uint64_t named = 0;
    for (int r = 0; r < 3; r++) named += harness_shm->word[r];
    assert_true(named >= 1); /* a rank names the steps */
  }
}

/* a rank that refuses its own arguments still joins the agreement: it gets
 * WEFT_ERR_INVALID with its reason, the others WEFT_ERR_MISMATCH, nobody waits */
static int local_refusal_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0, odd = rank == n - 1;
  float data[4][8];
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  FAILS(weft_grad_create(comm, &o, &g), "create");
  for (int i = 0; i < 4; i++) {
    weft_tensor t = {data[i], 8, WEFT_F32, WEFT_MEMORY_HOST};
    FAILS(weft_grad_register(g, &t, NULL), "register");
  }
  double t0 = harness_now();
  weft_status st = odd ? weft_metrics_average(comm, (double[]){1}, (double[]){-1}, 1)
                       : weft_metrics_average(comm, (double[]){1}, (double[]){1}, 1);
  const char *e = weft_last_error(comm);
  if ((odd && (st != WEFT_ERR_INVALID || !strstr(e, "counts[0] is -1"))) ||
      (!odd && (st != WEFT_ERR_MISMATCH || !strstr(e, "refused their own arguments"))) ||
      harness_now() - t0 > 15) {
    fprintf(stderr, "rank %d: metrics refusal: %s \"%s\"\n", rank, weft_status_name(st), e);
    bad++;
  }
  weft_tensor p = {data[0], odd ? 1 : 8, WEFT_F32, odd ? (weft_memory)7 : WEFT_MEMORY_HOST};
  st = weft_params_broadcast(comm, &p, 1, 0);
  e = weft_last_error(comm);
  if ((odd && (st != WEFT_ERR_INVALID || !strstr(e, "unknown memory kind 7"))) ||
      (!odd && (st != WEFT_ERR_MISMATCH || !strstr(e, "refused their own arguments")))) {
    fprintf(stderr, "rank %d: params refusal: %s \"%s\"\n", rank, weft_status_name(st), e);
    bad++;
  }
  /* and the communicator still works: the same collectives on every rank */
  FAILS(weft_grad_finalize(g), "finalize after refusals");
out:
  weft_grad_destroy(g);
  return finish(comm, rank, bad);
}

static void local_refusal_every_rank(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=20", NULL};
  harness_init();
  assert_int_equal(harness_run(3, env, 60, local_refusal_rank, NULL), 0);
}

/* ---- parameters: at start and every N synced steps ----------------------------- */

static int params_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0, root = n - 1, period = 2;
  /* two small tensors (packed) and one of 1.2 MB (broadcast in place) */
  size_t counts[3] = {1000, 3001, 300007};
  weft_dtype dts[3] = {WEFT_F32, WEFT_BF16, WEFT_F32};
  weft_tensor p[3];
  unsigned char *want[3];
  for (int i = 0; i < 3; i++) {
    p[i] = (weft_tensor){malloc(counts[i] * 4), counts[i], dts[i], WEFT_MEMORY_HOST};
    want[i] = malloc(counts[i] * 4);
  }
  float gbuf[8] = {0};
  weft_grad *g = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.bcast_period = period;
  o.bcast_root = root;
  FAILS(weft_grad_create(comm, &o, &g), "create");
  weft_tensor gt = {gbuf, 8, WEFT_F32, WEFT_MEMORY_HOST};
  FAILS(weft_grad_register(g, &gt, NULL), "register");
  FAILS(weft_grad_set_params(g, p, 3), "set_params");
  /* round r: every rank writes its own values; the expected result is the
   * root's (after a broadcast) or the own (otherwise) */
  int synced = 0;
  for (int round = 0; round < 6; round++) {
    for (int i = 0; i < 3; i++) {
      harness_fill(p[i].ptr, counts[i], dts[i], WEFT_SUM,
                   harness_seed(base_seed, rank, 700 + round * 3 + i));
    }
    int accumulate = round == 3; /* a no-sync step does not count */
    int expect_bcast;
    if (round == 0) {
      FAILS(weft_grad_finalize(g), "finalize");
      expect_bcast = 1;
    } else {
      FAILS(weft_grad_set_sync(g, !accumulate), "set_sync");
      FAILS(weft_grad_ready(g, 0), "ready");
      FAILS(weft_grad_wait(g), "wait");
      if (!accumulate) synced++;
      expect_bcast = !accumulate && synced % period == 0;
    }
    for (int i = 0; i < 3; i++) {
      int from = expect_bcast ? root : rank;
      harness_fill(want[i], counts[i], dts[i], WEFT_SUM,
                   harness_seed(base_seed, from, 700 + round * 3 + i));
      if (memcmp(want[i], p[i].ptr, counts[i] * weft_dtype_size(dts[i]))) {
        fprintf(stderr, "rank %d: round %d (synced %d): parameter %d is not rank %d's\n", rank,
                round, synced, i, from);
        bad++;
      }
    }
  }
  weft_grad_stats s;
  FAILS(weft_grad_get_stats(g, &s), "stats");
  if (s.params_broadcasts != 3) { /* finalize, synced steps 2 and 4 */
    fprintf(stderr, "rank %d: %llu parameter broadcasts, want 3\n", rank,
            (unsigned long long)s.params_broadcasts);
    bad++;
  }
out:
  weft_grad_destroy(g);
  for (int i = 0; i < 3; i++) {
    free(p[i].ptr);
    free(want[i]);
  }
  return finish(comm, rank, bad);
}

static void periodic_broadcast(void **state) {
  (void)state;
  harness_init();
  assert_int_equal(harness_run(3, NULL, 60, params_rank, NULL), 0);
}

/* ---- buffers: average floats, broadcast integers -------------------------------- */

static int buffers_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  int mode = *(const int *)arg, root = 1 % n, bad = 0;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  model m;
  static const weft_dtype dts[] = {WEFT_F32, WEFT_I64, WEFT_F64, WEFT_BF16, WEFT_I32};
  make_model(&m, 9, dts, 5, -1);
  m.count[5] = 400000; /* an f32 buffer of 1.6 MB: averaged in place */
  weft_tensor t[MAX_T];
  for (int i = 0; i < m.n; i++) {
    t[i] = (weft_tensor){malloc(m.count[i] * 8 + 8), m.count[i], m.dt[i], WEFT_MEMORY_HOST};
    fill_grad(t[i].ptr, &m, i, rank, 40, 0);
  }
  FAILS(weft_buffers_sync(comm, t, m.n, (weft_sync_mode)mode, root), "buffers_sync");
  unsigned char *want = malloc(400000 * 8);
  for (int i = 0; i < m.n; i++) {
    if (mode == WEFT_SYNC_AVERAGE && harness_is_float(m.dt[i])) {
      bad += check_tensor(t[i].ptr, &m, i, rank, n, WEFT_AVG, 40, 1, "buffers average");
    } else {
      fill_grad(want, &m, i, root, 40, 0);
      if (memcmp(want, t[i].ptr, m.count[i] * weft_dtype_size(m.dt[i]))) {
        fprintf(stderr, "rank %d: buffer %d (%s) is not the root's\n", rank, i,
                weft_dtype_name(m.dt[i]));
        bad++;
      }
    }
  }
  free(want);
out:
  for (int i = 0; i < m.n; i++) free(t[i].ptr);
  return finish(comm, rank, bad);
}

static void buffers_sync(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++)
    for (int n = 1; n <= 3; n += 2) {
      harness_init();
      assert_int_equal(harness_run(n, NULL, 60, buffers_rank, &mode), 0);
    }
}

/* ---- metrics ---------------------------------------------------------------------- */

static int metrics_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  int weighted = *(const int *)arg, bad = 0;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  enum { M = 7 };
  double v[M], c[M], sum_vc[M] = {0}, sum_c[M] = {0};
  for (int q = 0; q < n; q++) {
    uint64_t s = harness_seed(base_seed, q, 555);
    for (int i = 0; i < M; i++) {
      double val = (double)(harness_rng(&s) % 100000) / 7.0 - 5000;
      double cnt = weighted ? (double)(harness_rng(&s) % 50) : 1;
      if (weighted && i == M - 1) cnt = 0;       /* nobody counted this one */
      if (weighted && i == 2 && q == 0) cnt = 0; /* rank 0 has no samples for metric 2 */
      sum_vc[i] += val * cnt;
      sum_c[i] += cnt;
      if (q == rank) {
        v[i] = val;
        c[i] = cnt;
      }
    }
  }
  FAILS(weft_metrics_average(comm, v, weighted ? c : NULL, M), "metrics_average");
  for (int i = 0; i < M; i++) {
    double want = sum_c[i] > 0 ? sum_vc[i] / sum_c[i] : NAN;
    int ok = isnan(want) ? isnan(v[i]) : fabs(v[i] - want) <= 1e-12 * (fabs(want) + 5000);
    if (!ok || (weighted && c[i] != sum_c[i])) {
      fprintf(stderr, "rank %d: metric %d is %.17g (count %g), reference %.17g (count %g)\n", rank,
              i, v[i], c[i], want, sum_c[i]);
      bad++;
    }
  }
out:
  return finish(comm, rank, bad);
}

static void metrics_weighted(void **state) {
  (void)state;
  for (int weighted = 0; weighted < 2; weighted++)
    for (int n = 1; n <= 4; n += 3) {
      harness_init();
      assert_int_equal(harness_run(n, NULL, 60, metrics_rank, &weighted), 0);
    }
}

/* ---- refusals --------------------------------------------------------------------- */

static int refused(const weft_comm *comm, weft_status st, weft_status want, const char *words,
                   int line) {
  const char *e = weft_last_error(comm);
  if (st == want && strstr(e, words)) return 0;
  fprintf(stderr, "line %d: expected %s naming \"%s\", got %s: \"%s\"\n", line,
          weft_status_name(want), words, weft_status_name(st), e);
  return 1;
}
#define REFUSED(expr, want, words) bad += refused(comm, (expr), (want), (words), __LINE__)
#define REFUSED_NOCOMM(expr, words) \
  bad += refused(NULL, (expr), WEFT_ERR_INVALID, (words), __LINE__)

static int bad_input_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  float a[16] = {0};
  weft_grad *g = NULL, *og = NULL;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.op = WEFT_MAX;
  REFUSED(weft_grad_create(comm, &o, &g), WEFT_ERR_INVALID, "op max");
  weft_grad_options_init(&o);
  o.version = 99;
  REFUSED(weft_grad_create(comm, &o, &g), WEFT_ERR_INVALID, "options version 99");
  weft_grad_options_init(&o);
  o.bucket_cap_bytes = 0;
  REFUSED(weft_grad_create(comm, &o, &g), WEFT_ERR_INVALID, "bucket_cap_bytes is 0");
  weft_grad_options_init(&o);
  o.prediv = -2;
  REFUSED(weft_grad_create(comm, &o, &g), WEFT_ERR_INVALID, "prediv -2");
  weft_grad_options_init(&o);
  o.bcast_root = n;
  REFUSED(weft_grad_create(comm, &o, &g), WEFT_ERR_INVALID, "bcast_root");
  REFUSED_NOCOMM(weft_grad_create(NULL, NULL, &g), "not a live communicator");
  REFUSED_NOCOMM(weft_grad_ready(NULL, 0), "NULL or destroyed");

  FAILS(weft_grad_create(comm, NULL, &g), "create");
  weft_tensor t = {NULL, 16, WEFT_F32, WEFT_MEMORY_HOST};
  REFUSED(weft_grad_register(g, &t, NULL), WEFT_ERR_INVALID,
          "tensor 0: ptr is NULL but count is 16");
  t = (weft_tensor){a, 16, (weft_dtype)17, WEFT_MEMORY_HOST};
  REFUSED(weft_grad_register(g, &t, NULL), WEFT_ERR_INVALID, "unknown dtype 17");
  t = (weft_tensor){a, 16, WEFT_F32, WEFT_MEMORY_DEVICE};
  REFUSED(weft_grad_register(g, &t, NULL), WEFT_ERR_UNSUPPORTED, "device memory");
  REFUSED(weft_grad_register(g, NULL, NULL), WEFT_ERR_INVALID, "tensor is NULL");
  t = (weft_tensor){a, 8, WEFT_F32, WEFT_MEMORY_HOST};
  FAILS(weft_grad_register(g, &t, NULL), "register");
  t.ptr = a + 8;
  FAILS(weft_grad_register(g, &t, NULL), "register");
  REFUSED(weft_grad_ready(g, 0), WEFT_ERR_INVALID, "not finalized");
  REFUSED(weft_grad_set_order(g, (int[]){1, 1}, 2), WEFT_ERR_INVALID, "not a permutation");
  REFUSED(weft_grad_set_order(g, (int[]){0}, 1), WEFT_ERR_INVALID, "2 tensors are registered");
  FAILS(weft_grad_set_order(g, (int[]){0, 1}, 2), "set_order");
  REFUSED(weft_grad_register(g, &t, NULL), WEFT_ERR_INVALID, "after weft_grad_set_order");
  void *p;
  REFUSED(weft_grad_tensor_ptr(g, 0, &p), WEFT_ERR_INVALID, "not finalized");
  FAILS(weft_grad_finalize(g), "finalize");
  REFUSED(weft_grad_finalize(g), WEFT_ERR_INVALID, "already finalized");
  REFUSED(weft_grad_register(g, &t, NULL), WEFT_ERR_INVALID, "after weft_grad_finalize");
  REFUSED(weft_grad_tensor_ptr(g, 0, &p), WEFT_ERR_INVALID, "does not own its storage");
  REFUSED(weft_grad_ready(g, 2), WEFT_ERR_INVALID, "tensor 2 is out of range (2 registered)");
  REFUSED(weft_grad_ready(g, -1), WEFT_ERR_INVALID, "tensor -1 is out of range");
  FAILS(weft_grad_ready(g, 1), "ready");
  REFUSED(weft_grad_ready(g, 1), WEFT_ERR_INVALID, "tensor 1 was already marked ready in step 0");
  REFUSED(weft_grad_set_sync(g, 0), WEFT_ERR_INVALID, "middle of step 0");
  FAILS(weft_grad_wait(g), "wait");
  /* owned storage: pointers are not needed, views come back */
  weft_grad_options_init(&o);
  o.owned_storage = 1;
  FAILS(weft_grad_create(comm, &o, &og), "create owned");
  t = (weft_tensor){NULL, 5, WEFT_F64, WEFT_MEMORY_HOST};
  FAILS(weft_grad_register(og, &t, NULL), "register owned");
  FAILS(weft_grad_finalize(og), "finalize owned");
  FAILS(weft_grad_tensor_ptr(og, 0, &p), "tensor_ptr");
  if (!p) bad++;
  REFUSED(weft_grad_tensor_ptr(og, 1, &p), WEFT_ERR_INVALID, "tensor 1 is out of range");
  REFUSED(weft_metrics_average(comm, NULL, NULL, 2), WEFT_ERR_INVALID, "values is NULL");
  REFUSED(weft_params_broadcast(comm, &t, 1, 0), WEFT_ERR_INVALID, "tensor 0: ptr is NULL");
  REFUSED(weft_params_broadcast(comm, &t, 1, n), WEFT_ERR_INVALID, "root 1 is out of range");
  REFUSED(weft_buffers_sync(comm, NULL, 0, (weft_sync_mode)5, 0), WEFT_ERR_INVALID,
          "unknown mode 5");
out:
  weft_grad_destroy(g);
  weft_grad_destroy(og);
  return finish(comm, rank, bad);
}

static void bad_input(void **state) {
  (void)state;
  harness_init();
  assert_int_equal(harness_run(1, NULL, 60, bad_input_rank, NULL), 0);
}

int main(void) {
  const char *fixed = getenv("WEFT_TEST_SEED");
  base_seed = fixed ? strtoull(fixed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  printf("# seed %llu (set WEFT_TEST_SEED to repeat)\n", (unsigned long long)base_seed);
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(formation_mixed),     cmocka_unit_test(mean_copy_1to4),
      cmocka_unit_test(sum_owned_3),         cmocka_unit_test(mean_owned_4),
      cmocka_unit_test(prediv_mean_and_sum), cmocka_unit_test(default_caps_one_bucket_per_dtype),
      cmocka_unit_test(given_order),         cmocka_unit_test(large_tensors_in_place),
      cmocka_unit_test(out_of_order_ready),  cmocka_unit_test(accumulation),
      cmocka_unit_test(mismatch_every_rank), cmocka_unit_test(skipped_sync_fails_every_rank),
      cmocka_unit_test(local_refusal_every_rank),
      cmocka_unit_test(periodic_broadcast),  cmocka_unit_test(buffers_sync),
      cmocka_unit_test(metrics_weighted),    cmocka_unit_test(bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
