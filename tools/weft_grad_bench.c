/* weft-grad-bench - a model's gradient list (a .tsv of name, shape, numel,
 * e.g. tools/data/resnet50_grads.tsv) synchronised per step: one allreduce
 * per tensor against weft_grad buckets (copies and owned storage), and a
 * simulated backward (a sleep per layer, in reverse order) with buckets
 * reduced while it runs against compute alone plus blocking communication.
 * Run it under a launcher: weftrun -n 4 build/tools/weft-grad-bench.
 * Times are the median over steps of the slowest rank's step; the modes
 * take turns step by step. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft.h"

#define MAX_TENSORS 4096

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(weft_comm *comm, weft_status st, const char *what) {
  fprintf(stderr, "weft-grad-bench: %s: %s: %s\n", what, weft_strerror(st), weft_last_error(comm));
  exit(1);
}
#define CHECK(comm, expr)             \
  do {                                \
    weft_status st_ = (expr);         \
    if (st_) die((comm), st_, #expr); \
  } while (0)

typedef struct bench {
  weft_comm *comm;
  int rank, size, n;
  size_t count[MAX_TENSORS], total;
  float *mine[MAX_TENSORS]; /* the framework's gradients (copy mode and per tensor) */
  int steps;
  double compute_s; /* simulated backward, spread over layers by size */
  size_t cap, first_cap;
  size_t max_numel; /* -x: only tensors up to this size (the latency-bound part) */
} bench;

static int load(bench *b, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return -1;
  }
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    char name[512], shape[256];
    long long idx;
    unsigned long long numel;
    if (line[0] == '#' || sscanf(line, "%lld %511s %255s %llu", &idx, name, shape, &numel) != 4)
      continue; /* header and comment lines */
    if (b->n == MAX_TENSORS) break;
    if (b->max_numel && numel > b->max_numel) continue;
    b->count[b->n++] = (size_t)numel;
    b->total += (size_t)numel;
  }
  fclose(f);
  return b->n ? 0 : -1;
}

static double max_over_ranks(bench *b, double v) {
  CHECK(b->comm, weft_allreduce(b->comm, &v, &v, 1, WEFT_F64, WEFT_MAX));
  return v;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, c = *(const double *)y;
  return a < c ? -1 : a > c;
}

/* Every rank's gradient is rank+1 everywhere: the mean is (size+1)/2, exact. */
static void fill(float *p, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) p[i] = (float)(rank + 1);
}

static long wrong(bench *b, float **grads) {
  float want = (float)(b->size + 1) / 2;
  long bad = 0;
  for (int t = 0; t < b->n; t++)
    for (size_t i = 0; i < b->count[t]; i++) bad += grads[t][i] != want;
  int64_t x = bad;
  CHECK(b->comm, weft_allreduce(b->comm, &x, &x, 1, WEFT_I64, WEFT_SUM));
  return (long)x;
}

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

enum mode { PER_TENSOR, PER_TENSOR_NB, COPY_ALL, BUCKETED, OWNED, COMPUTE, OVERLAP, NMODES };
static const char *const mode_names[NMODES] = {
    "per-tensor allreduce (blocking)", "per-tensor iallreduce + wait_all",
    "buckets, every tensor copied",    "buckets, copies under 1 MiB",
    "buckets, owned storage",          "compute alone (sleep per layer)",
    "backward + buckets (owned)"};

typedef struct result {
  double median_s, min_s;
  double copied_bytes; /* per step */
  long wrong;
  int ran;
} result;

/* One step of `mode`; returns its time on this rank. */
static double step(bench *b, enum mode m, weft_grad *g, float **grads, weft_request **reqs) {
  CHECK(b->comm, weft_barrier(b->comm));
  double t0 = now_s();
  switch (m) {
    case PER_TENSOR:
      for (int t = b->n - 1; t >= 0; t--)
        CHECK(b->comm,
              weft_allreduce(b->comm, grads[t], grads[t], b->count[t], WEFT_F32, WEFT_AVG));
      break;
    case PER_TENSOR_NB:
      for (int t = b->n - 1; t >= 0; t--)
        CHECK(b->comm, weft_iallreduce(b->comm, grads[t], grads[t], b->count[t], WEFT_F32, WEFT_AVG,
                                       &reqs[t]));
      CHECK(b->comm, weft_wait_all(reqs, b->n));
      break;
    case COPY_ALL:
    case BUCKETED:
    case OWNED:
      for (int t = b->n - 1; t >= 0; t--) CHECK(b->comm, weft_grad_ready(g, t));
      CHECK(b->comm, weft_grad_wait(g));
      break;
    case COMPUTE:
      for (int t = b->n - 1; t >= 0; t--) sleep_s(b->compute_s * b->count[t] / b->total);
      break;
    case OVERLAP:
      for (int t = b->n - 1; t >= 0; t--) {
        sleep_s(b->compute_s * b->count[t] / b->total);
        CHECK(b->comm, weft_grad_ready(g, t));
      }
      CHECK(b->comm, weft_grad_wait(g));
      break;
    default: break;
  }
  return now_s() - t0;
}

/* copy_all: DDP's and Horovod's way, every gradient through a bucket buffer */
static weft_grad *make_set(bench *b, int owned, int copy_all, float **grads) {
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = owned;
  if (copy_all) o.inplace_min_bytes = 0;
  o.bucket_cap_bytes = b->cap;
  o.first_bucket_cap_bytes = b->first_cap;
  weft_grad *g;
  CHECK(b->comm, weft_grad_create(b->comm, &o, &g));
  for (int t = 0; t < b->n; t++) {
    weft_tensor ten = {owned ? NULL : b->mine[t], b->count[t], WEFT_F32, WEFT_MEMORY_HOST};
    CHECK(b->comm, weft_grad_register(g, &ten, NULL));
  }
  CHECK(b->comm, weft_grad_finalize(g));
  for (int t = 0; t < b->n; t++) {
    if (!owned) {
      grads[t] = b->mine[t];
      continue;
    }
    void *p;
    CHECK(b->comm, weft_grad_tensor_ptr(g, t, &p));
    grads[t] = p;
  }
  return g;
}

/* Modes take turns step by step (not one block each), so load from other
 * processes on a shared machine falls on every mode alike. */
static void run_all(bench *b, const int *want, result *r) {
  static float *grads[NMODES][MAX_TENSORS];
  static weft_request *reqs[MAX_TENSORS];
  weft_grad *copy_all = NULL, *copies = NULL, *owned = NULL, *set[NMODES] = {NULL};
  if (want[COPY_ALL]) copy_all = make_set(b, 0, 1, grads[COPY_ALL]);
  if (want[BUCKETED]) copies = make_set(b, 0, 0, grads[BUCKETED]);
  if (want[OWNED] || want[OVERLAP]) owned = make_set(b, 1, 0, grads[OWNED]);
  set[COPY_ALL] = copy_all;
  set[BUCKETED] = copies;
  set[OWNED] = set[OVERLAP] = owned;
  for (int m = 0; m < NMODES; m++)
    if (!set[m])
      for (int t = 0; t < b->n; t++) grads[m][t] = b->mine[t];
  memcpy(grads[OVERLAP], grads[OWNED], sizeof grads[OWNED]);
  double *times = malloc(sizeof(double) * NMODES * (size_t)b->steps);
  weft_grad_stats s0[NMODES] = {{0}}, s1[NMODES] = {{0}};
  for (int k = -1; k < b->steps; k++) /* round -1: warm-up and the correctness check */
    for (int m = 0; m < NMODES; m++) {
      if (!want[m]) continue;
      if (m != COMPUTE)
        for (int t = 0; t < b->n; t++) fill(grads[m][t], b->count[t], b->rank);
      if (set[m]) CHECK(b->comm, weft_grad_get_stats(set[m], &s0[m]));
      double dt = max_over_ranks(b, step(b, (enum mode)m, set[m], grads[m], reqs));
      if (set[m]) CHECK(b->comm, weft_grad_get_stats(set[m], &s1[m]));
      if (k < 0) {
        r[m].wrong = m == COMPUTE ? 0 : wrong(b, grads[m]);
        continue;
      }
      times[m * b->steps + k] = dt;
      r[m].copied_bytes += (double)(s1[m].bytes_copied - s0[m].bytes_copied) / b->steps;
    }
  for (int m = 0; m < NMODES; m++) {
    if (!want[m]) continue;
    double *tm = times + m * b->steps;
    qsort(tm, (size_t)b->steps, sizeof *tm, cmp_double);
    r[m].median_s = tm[b->steps / 2];
    r[m].min_s = tm[0];
    r[m].ran = 1;
  }
  if (b->rank == 0)
    printf(
        "# buckets (cap %zu B, first %zu B): %d with every tensor copied, %d with copies under "
        "1 MiB, %d owned\n",
        b->cap, b->first_cap, weft_grad_bucket_count(copy_all), weft_grad_bucket_count(copies),
        weft_grad_bucket_count(owned));
  weft_grad_destroy(copy_all);
  weft_grad_destroy(copies);
  weft_grad_destroy(owned);
  free(times);
}

static void usage(void) {
  fprintf(stderr,
          "usage: weft-grad-bench [-f grads.tsv] [-n steps] [-c compute_ms] [-b cap_MiB]\n"
          "                       [-B first_cap_KiB] [-m mode,mode...] [-x max_numel]\n"
          "modes: 0 per-tensor, 1 per-tensor non-blocking, 2 buckets copying all, 3 buckets,\n"
          "       4 owned, 5 compute, 6 overlap (default: all)\n");
}

int main(int argc, char **argv) {
  static bench b;
  const char *path = "tools/data/resnet50_grads.tsv";
  int want[NMODES] = {1, 1, 1, 1, 1, 1, 1}, opt;
  b.steps = 5;
  b.compute_s = 0.3;
  b.cap = 25u << 20;
  b.first_cap = 1u << 20;
  while ((opt = getopt(argc, argv, "f:n:c:b:B:m:x:h")) != -1) {
    switch (opt) {
      case 'f': path = optarg; break;
      case 'n': b.steps = atoi(optarg); break;
      case 'c': b.compute_s = atof(optarg) / 1000; break;
      case 'b': b.cap = (size_t)(atof(optarg) * 1048576); break;
      case 'B': b.first_cap = (size_t)(atof(optarg) * 1024); break;
      case 'x': b.max_numel = (size_t)atoll(optarg); break;
      case 'm': {
        memset(want, 0, sizeof want);
        for (char *tok = strtok(optarg, ","); tok; tok = strtok(NULL, ","))
          if (atoi(tok) >= 0 && atoi(tok) < NMODES) want[atoi(tok)] = 1;
        break;
      }
      default: usage(); return 2;
    }
  }
  if (b.steps < 1 || !b.cap || load(&b, path)) {
    usage();
    return 2;
  }
  CHECK(NULL, weft_comm_init_env(&b.comm));
  b.rank = weft_comm_rank(b.comm);
  b.size = weft_comm_size(b.comm);
  for (int t = 0; t < b.n; t++) {
    b.mine[t] = malloc(b.count[t] * sizeof(float) + 4);
    if (!b.mine[t]) die(b.comm, WEFT_ERR_NOMEM, "malloc");
  }
  const char *tp = "self", *why = "";
  if (b.size > 1) weft_comm_peer_transport(b.comm, (b.rank + 1) % b.size, &tp, &why);
  if (b.rank == 0)
    printf(
        "# weft-grad-bench %s: %d tensors, %zu f32 (%.1f MiB), %d ranks over %s, %d steps, "
        "compute %.0f ms\n",
        path, b.n, b.total, b.total * 4.0 / 1048576, b.size, tp, b.steps, b.compute_s * 1e3);
  result r[NMODES] = {{0}};
  run_all(&b, want, r);
  if (b.rank == 0) {
    printf("%-34s %10s %10s %14s %7s\n", "# mode", "median_ms", "min_ms", "copied_MiB/step",
           "wrong");
    for (int m = 0; m < NMODES; m++)
      if (r[m].ran)
        printf("%-34s %10.1f %10.1f %14.1f %7ld\n", mode_names[m], r[m].median_s * 1e3,
               r[m].min_s * 1e3, r[m].copied_bytes / 1048576, r[m].wrong);
    for (int m = COPY_ALL; m <= OWNED; m++)
      if (r[PER_TENSOR].ran && r[m].ran)
        printf("# %s vs one allreduce per tensor: %.2fx faster\n", mode_names[m],
               r[PER_TENSOR].median_s / r[m].median_s);
    if (r[OWNED].ran && r[COPY_ALL].ran)
      printf("# owned storage saves %.1f MiB of copies and %.1f ms per step against copying all\n",
             (r[COPY_ALL].copied_bytes - r[OWNED].copied_bytes) / 1048576,
             (r[COPY_ALL].median_s - r[OWNED].median_s) * 1e3);
    if (r[COMPUTE].ran && r[OWNED].ran && r[OVERLAP].ran) {
      double comm = r[OWNED].median_s, serial = r[COMPUTE].median_s + comm;
      printf(
          "# overlap: compute %.1f + communication %.1f = %.1f ms serial; overlapped %.1f ms: "
          "%.0f%% of the communication hidden\n",
          r[COMPUTE].median_s * 1e3, comm * 1e3, serial * 1e3, r[OVERLAP].median_s * 1e3,
          100 * (serial - r[OVERLAP].median_s) / comm);
    }
  }
  long bad = 0;
  for (int m = 0; m < NMODES; m++) bad += r[m].wrong;
  CHECK(b.comm, weft_barrier(b.comm));
  weft_comm_destroy(b.comm);
  for (int t = 0; t < b.n; t++) free(b.mine[t]);
  return bad ? 1 : 0;
}
