/* grad_device.c - data-parallel training with a gradient set on the GPU:
 * dp_train.c's model (mlp.h) whose gradients live in weft's device buckets
 * (owned storage), reduced in the stream order of the program's stream,
 * while the host goes on. Each of N ranks takes 1/N of every global batch.
 *
 *   weftrun -n 2 build/examples/weft-grad-device --steps 40 --out params.txt
 *
 * A step, as a framework on CUDA drives it:
 *   - the backward's kernels write each gradient into its view of weft's
 *     device bucket, queued on the stream, and the gradient is marked ready
 *     right after it is queued (weft_grad_ready), never after it ran;
 *   - weft_grad_wait_stream(set, stream): the stream waits, on the GPU, for
 *     every bucket's mean, and the host does not wait;
 *   - the optimizer's kernels, queued on the stream, read the means.
 * The model's arithmetic is done on the host here so that the example needs
 * no kernels of its own (it runs on the CUDA stand-in as on a GPU): its
 * "backward kernel" is the copy of each layer's gradient into the device
 * view, and its "optimizer kernel" the copy of the means back. Either way
 * every transfer is queued on the stream, and the host synchronizes only to
 * read the means for its SGD step. --check: the last parameters against the
 * same training run on host memory in this process (one rank: its own
 * batches; N ranks: all of them, serially), printed and exit status 1 past
 * 1e-5.
 *
 * The driver (libcuda.so.1, or WEFT_CUDA_LIBRARY's) is opened at run time,
 * as weft opens it, so the program needs no CUDA library to link. */
#include <cuda.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"
#include "weft.h"

/* The few driver calls this program makes, by their versioned names. */
static struct {
  CUresult (*init)(unsigned int);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*primary_retain)(CUcontext *, CUdevice);
  CUresult (*primary_release)(CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*stream_create)(CUstream *, unsigned int);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*htod)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUstream);
} cu;

static int cuda_open(void) {
  const char *lib = getenv("WEFT_CUDA_LIBRARY");
  void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW);
  if (!h) return -1;
#define SYM(field, name) \
  if (!(*(void **)&cu.field = dlsym(h, name))) return -1;
  SYM(init, "cuInit")
  SYM(device_get, "cuDeviceGet")
  SYM(primary_retain, "cuDevicePrimaryCtxRetain")
  SYM(primary_release, "cuDevicePrimaryCtxRelease_v2")
  SYM(ctx_set_current, "cuCtxSetCurrent")
  SYM(stream_create, "cuStreamCreate")
  SYM(stream_destroy, "cuStreamDestroy_v2")
  SYM(stream_synchronize, "cuStreamSynchronize")
  SYM(htod, "cuMemcpyHtoDAsync_v2")
  SYM(dtoh, "cuMemcpyDtoHAsync_v2")
#undef SYM
  return 0;
}

#define CU(expr)                                                            \
  do {                                                                      \
    CUresult r_ = (expr);                                                   \
    if (r_ != CUDA_SUCCESS) {                                               \
      fprintf(stderr, "grad_device: %s: CUDA error %d\n", #expr, (int)r_); \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

#define CHECK(expr) MLP_CHECK("grad_device", expr) /* a failed call ends the program */

/* One layer's gradients computed on the host: their "kernel" is queued (the
 * copy into the device views) and they are marked ready at once. */
typedef struct step_ctx {
  weft_comm *comm;
  weft_grad *set;
  CUstream stream;
  float **host_grad;
  void **dev_grad;
} step_ctx;

static void layer_done(void *ctx, int bias, int weight) {
  step_ctx *c = ctx;
  weft_comm *comm = c->comm;
  int ids[2] = {bias, weight};
  for (int q = 0; q < 2; q++) {
    int k = ids[q];
    CU(cu.htod((CUdeviceptr)(uintptr_t)c->dev_grad[k], c->host_grad[k], param_count[k] * sizeof(float),
               c->stream));
    CHECK(weft_grad_ready(c->set, k));
  }
}

/* No-op for the host reference: its gradients are used where they are. */
static void layer_nothing(void *ctx, int bias, int weight) {
  (void)ctx, (void)bias, (void)weight;
}

/* The same training on host memory, serially over the `ranks` ranks'
 * batches of each step: what the device run must reach. */
static void reference(int steps, int batch, int ranks, double lr, float *const *out) {
  float *g[NPARAMS];
  for (int k = 0; k < NPARAMS; k++) g[k] = calloc(param_count[k], sizeof(float));
  mlp_init(out, 0);
  int local = batch / ranks;
  for (int step = 0; step < steps; step++) {
    for (int k = 0; k < NPARAMS; k++) memset(g[k], 0, param_count[k] * sizeof(float));
    int correct = 0;
    /* each rank's mean gradient, averaged over ranks: the batch's mean */
    for (int r = 0; r < ranks; r++)
      mlp_backward(out, g, (uint64_t)step * (uint64_t)batch + (uint64_t)r * (uint64_t)local, local,
                   1.0f / (float)local / (float)ranks, &correct, layer_nothing, NULL);
    for (int k = 0; k < NPARAMS; k++)
      for (size_t i = 0; i < param_count[k]; i++) out[k][i] -= (float)lr * g[k][i];
  }
  for (int k = 0; k < NPARAMS; k++) free(g[k]);
}

int main(int argc, char **argv) {
  int steps = 40, batch = 64, check = 0;
  double lr = 0.5;
  const char *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
      batch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!strcmp(argv[i], "--check"))
      check = 1;
    else {
      fprintf(stderr, "usage: grad_device [--steps N] [--batch B] [--out FILE] [--check]\n");
      return 2;
    }
  }
  const char *why = NULL;
  if (!weft_memory_usable(WEFT_MEMORY_DEVICE, &why) || cuda_open()) {
    printf("grad_device: skipped: no usable GPU (%s)\n", why ? why : "the driver did not open");
    return 77;
  }
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_env(&comm);
  if (st) mlp_die("grad_device", NULL, st, "weft_comm_init_env");
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm);
  int local = batch / size;
  if (steps < 1 || batch % size || local > MAX_LOCAL) {
    fprintf(stderr, "grad_device: batch %d must split evenly over %d ranks\n", batch, size);
    return 2;
  }
  /* the device and its primary context (the runtime API's, PyTorch's), and
   * the program's stream: the gradients' writes and the optimizer's reads
   * are queued there, and weft orders the set after it */
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CU(cu.init(0));
  CU(cu.device_get(&dev, 0));
  CU(cu.primary_retain(&ctx, dev));
  CU(cu.ctx_set_current(ctx));
  CU(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(weft_comm_set_stream(comm, stream));

  float *p[NPARAMS], *g[NPARAMS];
  void *dev_grad[NPARAMS];
  weft_tensor params[NPARAMS];
  for (int k = 0; k < NPARAMS; k++) {
    p[k] = malloc(param_count[k] * sizeof(float));
    g[k] = malloc(param_count[k] * sizeof(float));
    params[k] = (weft_tensor){p[k], param_count[k], WEFT_F32, WEFT_MEMORY_HOST};
  }
  mlp_init(p, rank);

  weft_grad_options go;
  weft_grad_options_init(&go);
  go.op = WEFT_AVG;
  go.owned_storage = 1; /* the gradients are views of weft's device buckets */
  go.bucket_cap_bytes = 4096;
  go.first_bucket_cap_bytes = 1024;
  weft_grad *set;
  CHECK(weft_grad_create(comm, &go, &set));
  for (int k = 0; k < NPARAMS; k++) {
    weft_tensor t = {NULL, param_count[k], WEFT_F32, WEFT_MEMORY_DEVICE};
    CHECK(weft_grad_register(set, &t, NULL));
  }
  CHECK(weft_grad_set_params(set, params, NPARAMS)); /* host parameters, from rank 0 */
  CHECK(weft_grad_finalize(set));
  for (int k = 0; k < NPARAMS; k++) CHECK(weft_grad_tensor_ptr(set, k, &dev_grad[k]));
  if (rank == 0)
    printf("grad_device: %d ranks, %d samples each per step, %d device buckets\n", size, local,
           weft_grad_bucket_count(set));

  step_ctx sc = {comm, set, stream, g, dev_grad};
  double loss0 = -1, loss = 0;
  for (int step = 0; step < steps; step++) {
    for (int k = 0; k < NPARAMS; k++) memset(g[k], 0, param_count[k] * sizeof(float));
    int correct = 0;
    uint64_t base = (uint64_t)step * (uint64_t)batch + (uint64_t)rank * (uint64_t)local;
    loss = mlp_backward(p, g, base, local, 1.0f / (float)local, &correct, layer_done, &sc) / local;
    /* the stream waits for the means on the GPU; the copies back (the
     * "optimizer kernel") follow them there */
    CHECK(weft_grad_wait_stream(set, stream));
    for (int k = 0; k < NPARAMS; k++)
      CU(cu.dtoh(g[k], (CUdeviceptr)(uintptr_t)dev_grad[k], param_count[k] * sizeof(float), stream));
    CU(cu.stream_synchronize(stream)); /* the host's SGD reads them */
    for (int k = 0; k < NPARAMS; k++)
      for (size_t i = 0; i < param_count[k]; i++) p[k][i] -= (float)lr * g[k][i];
    if (loss0 < 0) loss0 = loss;
  }
  if (rank == 0) printf("grad_device: rank 0's loss first %.6f last %.6f\n", loss0, loss);
  int rc = 0;
  if (check) {
    float *ref[NPARAMS];
    for (int k = 0; k < NPARAMS; k++) ref[k] = malloc(param_count[k] * sizeof(float));
    reference(steps, batch, size, lr, ref);
    double worst = 0;
    for (int k = 0; k < NPARAMS; k++)
      for (size_t i = 0; i < param_count[k]; i++) {
        double d = fabs((double)p[k][i] - ref[k][i]) / (1 + fabs((double)ref[k][i]));
        if (d > worst) worst = d;
      }
    /* a missing bucket, a sum instead of the mean, or a gradient read
     * before its copy ran is off by far more than float rounding */
    rc = worst > 1e-5;
    printf("grad_device: rank %d: parameters against the host run of every rank's batches: largest "
           "difference %.3g (%s)\n",
           rank, worst, rc ? "FAILED, want <= 1e-5" : "right");
    for (int k = 0; k < NPARAMS; k++) free(ref[k]);
  }
  if (rank == 0 && out) {
    FILE *f = fopen(out, "w");
    if (!f) perror(out);
    for (int k = 0; f && k < NPARAMS; k++)
      for (size_t i = 0; i < param_count[k]; i++) fprintf(f, "%.9e\n", p[k][i]);
    if (f) fclose(f);
  }
  CHECK(weft_grad_destroy(set));
  weft_comm_destroy(comm);
  CU(cu.stream_destroy(stream));
  CU(cu.primary_release(dev));
  for (int k = 0; k < NPARAMS; k++) {
    free(p[k]);
    free(g[k]);
  }
  return rc;
}
