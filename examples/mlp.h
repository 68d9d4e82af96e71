/* mlp.h - the model the examples train (dp_train.c on host gradients,
 * grad_device.c on device gradients): a 2-layer MLP (tanh, softmax) on a
 * deterministic synthetic data set, labels from a fixed random teacher; and
 * their end on a failed call. Header-only, so each example stays one file
 * to read beside it. */
#ifndef WEFT_EXAMPLES_MLP_H
#define WEFT_EXAMPLES_MLP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "weft.h"

/* An example's end on a failed call: what failed, the status and weft's
 * sentence (naming the rank, the call and the peer). MLP_CHECK needs a
 * `comm` in scope (NULL before there is one). */
static void mlp_die(const char *prog, weft_comm *comm, weft_status st, const char *what) {
  fprintf(stderr, "%s: %s: %s: %s\n", prog, what, weft_strerror(st), weft_last_error(comm));
  exit(1);
}
#define MLP_CHECK(prog, expr)                   \
  do {                                          \
    weft_status st_ = (expr);                   \
    if (st_) mlp_die(prog, comm, st_, #expr);   \
  } while (0)

enum { D = 16, H = 32, K = 4, MAX_LOCAL = 1024 };

/* Parameters in declaration order: W1 b1 W2 b2. */
enum { P_W1, P_B1, P_W2, P_B2, NPARAMS };
static const size_t param_count[NPARAMS] = {H * D, H, K *H, K};

static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
/* uniform in [-1, 1), a pure function of (stream, index) */
static double unit(uint64_t stream, uint64_t i) {
  return (double)(mix(mix(stream) ^ i) >> 11) * 0x1.0p-52 - 1.0;
}

/* Sample `s` of the endless data set: x and its teacher label. */
static void sample(uint64_t s, float *x, int *y) {
  double best = -1e300;
  for (int d = 0; d < D; d++) x[d] = (float)unit(1, s * D + (uint64_t)d);
  for (int k = 0; k < K; k++) {
    double z = 0;
    for (int d = 0; d < D; d++) z += unit(2, (uint64_t)(k * D + d)) * x[d];
    if (z > best) {
      best = z;
      *y = k;
    }
  }
}

/* Forward and backward over samples [first, first+n) of the data set, adding
 * scale * d(loss)/d(param) into g; calls layer_done(ctx, P_B2, P_W2) once
 * layer 2's gradients are final, before layer 1's are computed (a framework
 * marks them ready there), then layer_done(ctx, P_B1, P_W1). Returns the
 * summed loss; counts correct predictions. */
typedef void (*mlp_layer_done)(void *ctx, int bias, int weight);
static double mlp_backward(float *const *p, float *const *g, uint64_t first, int n, float scale,
                           int *correct, mlp_layer_done layer_done, void *ctx) {
  static float x[MAX_LOCAL][D], h[MAX_LOCAL][H], dz[MAX_LOCAL][K];
  double loss = 0;
  for (int i = 0; i < n; i++) {
    int y = 0;
    sample(first + (uint64_t)i, x[i], &y);
    for (int j = 0; j < H; j++) {
      float a = p[P_B1][j];
      for (int d = 0; d < D; d++) a += p[P_W1][j * D + d] * x[i][d];
      h[i][j] = tanhf(a);
    }
    float z[K], zmax = -1e30f, sum = 0;
    for (int k = 0; k < K; k++) {
      z[k] = p[P_B2][k];
      for (int j = 0; j < H; j++) z[k] += p[P_W2][k * H + j] * h[i][j];
      if (z[k] > zmax) zmax = z[k];
    }
    for (int k = 0; k < K; k++) sum += expf(z[k] - zmax);
    int arg = 0;
    for (int k = 0; k < K; k++) {
      float pk = expf(z[k] - zmax) / sum;
      dz[i][k] = (pk - (k == y)) * scale;
      if (z[k] > z[arg]) arg = k;
    }
    loss += -(z[y] - zmax - logf(sum));
    *correct += arg == y;
  }
  /* layer 2 first: its gradients are final before layer 1's are computed */
  for (int i = 0; i < n; i++)
    for (int k = 0; k < K; k++) {
      g[P_B2][k] += dz[i][k];
      for (int j = 0; j < H; j++) g[P_W2][k * H + j] += dz[i][k] * h[i][j];
    }
  layer_done(ctx, P_B2, P_W2);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < H; j++) {
      float dh = 0;
      for (int k = 0; k < K; k++) dh += p[P_W2][k * H + j] * dz[i][k];
      float da = dh * (1 - h[i][j] * h[i][j]);
      g[P_B1][j] += da;
      for (int d = 0; d < D; d++) g[P_W1][j * D + d] += da * x[i][d];
    }
  layer_done(ctx, P_B1, P_W1);
  return loss;
}

/* Rank 0's initial values are the model's; the others start elsewhere on
 * purpose: the broadcast at finalize must make them equal. */
static void mlp_init(float *const *p, int rank) {
  for (int k = 0; k < NPARAMS; k++) {
    double fan_in = k <= P_B1 ? D : H;
    for (size_t i = 0; i < param_count[k]; i++)
      p[k][i] = rank == 0 ? (float)(unit(10 + (uint64_t)k, i) / sqrt(fan_in)) : (float)rank;
  }
}

#endif
