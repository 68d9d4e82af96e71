/* dp_train.c - data-parallel training with weft's gradient buckets: a 2-layer
 * MLP (tanh, softmax) on a deterministic synthetic data set (labels from a
 * fixed random teacher), plain SGD. Each of N ranks takes 1/N of every global
 * batch; gradients are averaged over ranks in buckets filled as the backward
 * pass produces them (layer 2 before layer 1), so N ranks reach the same
 * parameters as 1 rank on the whole batch, up to float rounding.
 *
 *   weftrun -n 4 build/examples/weft-dp-train --steps 60 --out params.txt
 *
 * Shows: owned storage (gradients written straight into weft's buckets),
 * weft_grad_ready per layer, the parameter broadcast at start (ranks start
 * from different values on purpose) and every --bcast-period steps,
 * accumulation over --accum micro-batches (weft_grad_set_sync), and the
 * loss averaged over ranks weighted by each rank's sample count. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"
#include "weft.h"

typedef struct options {
  int steps, batch, accum, bcast_period;
  double lr;
  size_t bucket_bytes;
  const char *out;
} options;

#define CHECK(expr) MLP_CHECK("dp_train", expr) /* a failed call ends the program */

/* weft_grad_ready for a layer's gradients, as the backward pass makes them */
typedef struct ready_ctx {
  weft_grad *set;
  weft_comm *comm;
} ready_ctx;

static void layer_ready(void *ctx, int bias, int weight) {
  ready_ctx *r = ctx;
  weft_comm *comm = r->comm;
  CHECK(weft_grad_ready(r->set, bias));
  CHECK(weft_grad_ready(r->set, weight));
}

static double backward(weft_grad *set, float *const *p, float *const *g, uint64_t first, int n,
                       float scale, int *correct, weft_comm *comm) {
  ready_ctx r = {set, comm};
  return mlp_backward(p, g, first, n, scale, correct, layer_ready, &r);
}

static int parse(int argc, char **argv, options *o) {
  *o = (options){.steps = 60,
                 .batch = 64,
                 .accum = 1,
                 .bcast_period = 25,
                 .lr = 0.5,
                 .bucket_bytes = 1024,
                 .out = NULL};
  for (int i = 1; i < argc; i += 2) { /* every option takes a value */
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return -1;
    if (!strcmp(a, "--steps"))
      o->steps = atoi(v);
    else if (!strcmp(a, "--batch"))
      o->batch = atoi(v);
    else if (!strcmp(a, "--accum"))
      o->accum = atoi(v);
    else if (!strcmp(a, "--bcast-period"))
      o->bcast_period = atoi(v);
    else if (!strcmp(a, "--lr"))
      o->lr = atof(v);
    else if (!strcmp(a, "--bucket-bytes"))
      o->bucket_bytes = (size_t)atol(v);
    else if (!strcmp(a, "--out"))
      o->out = v;
    else
      return -1;
  }
  return o->steps > 0 && o->batch > 0 && o->accum > 0 && o->bucket_bytes ? 0 : -1;
}

int main(int argc, char **argv) {
  options o;
  if (parse(argc, argv, &o)) {
    fprintf(stderr,
            "usage: dp_train [--steps N] [--batch B] [--accum K] [--bcast-period P] [--lr X]\n"
            "                [--bucket-bytes N] [--out FILE]\n");
    return 2;
  }
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_env(&comm);
  if (st) mlp_die("dp_train", NULL, st, "weft_comm_init_env");
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm);
  int local = o.batch / size;
  if (o.batch % size || local % o.accum || local > MAX_LOCAL) {
    fprintf(stderr, "dp_train: batch %d must split evenly over %d ranks and %d micro-batches\n",
            o.batch, size, o.accum);
    return 2;
  }

  float *p[NPARAMS], *g[NPARAMS];
  weft_tensor params[NPARAMS];
  for (int k = 0; k < NPARAMS; k++) {
    p[k] = malloc(param_count[k] * sizeof(float));
    params[k] = (weft_tensor){p[k], param_count[k], WEFT_F32, WEFT_MEMORY_HOST};
  }
  mlp_init(p, rank);

  weft_grad_options go;
  weft_grad_options_init(&go);
  go.op = WEFT_AVG;
  go.owned_storage = 1;
  go.bucket_cap_bytes = o.bucket_bytes;
  go.first_bucket_cap_bytes = o.bucket_bytes / 4 ? o.bucket_bytes / 4 : 1;
  go.bcast_period = o.bcast_period;
  weft_grad *set;
  CHECK(weft_grad_create(comm, &go, &set));
  for (int k = 0; k < NPARAMS; k++) {
    weft_tensor t = {NULL, param_count[k], WEFT_F32, WEFT_MEMORY_HOST};
    CHECK(weft_grad_register(set, &t, NULL));
  }
  CHECK(weft_grad_set_params(set, params, NPARAMS));
  CHECK(weft_grad_finalize(set)); /* the check, the buckets, the parameter broadcast */
  for (int k = 0; k < NPARAMS; k++) CHECK(weft_grad_tensor_ptr(set, k, (void **)&g[k]));
  if (rank == 0)
    printf("dp_train: %d ranks, %d samples each per step, %d micro-batches, %d buckets\n", size,
           local, o.accum, weft_grad_bucket_count(set));

  double first_loss = -1, loss_now = 0;
  for (int step = 0; step < o.steps; step++) {
    for (int k = 0; k < NPARAMS; k++) memset(g[k], 0, param_count[k] * sizeof(float));
    double loss = 0;
    int correct = 0, micro_n = local / o.accum;
    uint64_t base = (uint64_t)step * (uint64_t)o.batch + (uint64_t)rank * (uint64_t)local;
    for (int m = 0; m < o.accum; m++) {
      /* micro-batches before the last only accumulate (DDP's no_sync) */
      CHECK(weft_grad_set_sync(set, m == o.accum - 1));
      loss += backward(set, p, g, base + (uint64_t)(m * micro_n), micro_n, 1.0f / (float)local,
                       &correct, comm);
      CHECK(weft_grad_wait(set)); /* the last one: every bucket averaged over ranks */
    }
    for (int k = 0; k < NPARAMS; k++)
      for (size_t i = 0; i < param_count[k]; i++) p[k][i] -= (float)o.lr * g[k][i];
    double metrics[2] = {loss / local, (double)correct / local}, counts[2] = {local, local};
    CHECK(weft_metrics_average(comm, metrics, counts, 2));
    if (first_loss < 0) first_loss = metrics[0];
    loss_now = metrics[0];
    if (rank == 0 && (step % 10 == 0 || step == o.steps - 1))
      printf("step %3d loss %.6f accuracy %.3f (%g samples)\n", step, metrics[0], metrics[1],
             counts[0]);
  }
  if (rank == 0) {
    printf("loss first %.6f last %.6f\n", first_loss, loss_now);
    FILE *f = o.out ? fopen(o.out, "w") : NULL;
    if (o.out && !f) perror(o.out);
    for (int k = 0; f && k < NPARAMS; k++)
      for (size_t i = 0; i < param_count[k]; i++) fprintf(f, "%.9e\n", p[k][i]);
    if (f) fclose(f);
  }
  CHECK(weft_barrier(comm));
  weft_grad_destroy(set);
  weft_comm_destroy(comm);
  for (int k = 0; k < NPARAMS; k++) free(p[k]);
  return 0;
}
