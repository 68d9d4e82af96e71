/* weft_device_check.c - every collective on device buffers against a host
 * reference, run as ranks (weftrun -n N weft-device-check): every dtype and
 * op, in place and out of place, a few counts, with the call ordered on a
 * stream of the user's. Needs no CMocka: the GPU machine runs it
 * (tools/gpu_check.sh), and the suite runs it on the CUDA stand-in
 * (tests/cuda_emu, WEFT_CUDA_LIBRARY). Each rank's input is a function of
 * (rank, call, index) that every rank can compute, so each checks its
 * result against a reference summed serially in double or 64-bit integers.
 * Values are small integers, so a float sum is exact in any order and the
 * result must match the reference exactly (avg: the mean rounded once).
 * Prints one line per failure and "device-check: N passed, M failed";
 * exit 0 when all passed, 77 when no CUDA device is usable (the reason on
 * stdout), 1 otherwise. --quick: fewer counts. --probe: only whether a
 * device is usable (no communicator). --gdr-probe: whether GPU 0's memory
 * exports as a dma-buf (GPUDirect RDMA's first step: an allocation, its
 * export, the fd closed; the registration with a NIC is not tried), as
 * "gdr-probe: ..." (exit 0 either way, 1 when the probe itself failed).
 * --resnet TSV: no checks, a figure:
 * the gradient set TSV lists (index, name, shape, numel) as f32 device
 * tensors, one non-blocking allreduce (avg) per tensor waited for together,
 * then the same bytes as one flat buffer; prints ms per step, medians of 20
 * steps after 3 warm-ups; the buffers registered (weft_comm_register),
 * or with a third argument "lent" not. --mixed: rank 0 passes host memory to an allreduce,
 * the others device memory; over shm with CUDA IPC every rank must fail
 * (prints "device-check: mixed: rank R: STATUS: message"; exit 0 when this
 * rank's call failed, 1 when it returned OK). --fault: 40 allreduces on
 * device buffers, stopping at the first that fails (the stand-in's
 * WEFT_CUDA_EMU_KERNEL_FAULT makes one rank's kernel fault): prints
 * "device-check: fault: rank R: STATUS after K calls: message"; exit 0 when
 * a call failed, 1 when all returned OK. --in-flight N: N non-blocking
 * allreduces on device buffers issued before any wait, then checked.
 * --order N: the stream order of non-blocking calls, N rounds of two
 * checks (order_check below). --churn N: N rounds of allocate, allreduce,
 * free (churn below). --host-only: allreduces on host memory, and
 * no CUDA call of this program's: weft must create no CUDA context
 * (host_only below). --grad N: N random gradient sets on device memory
 * against the same sets on host memory (grad_check below). --grad-resnet
 * TSV [backward] [host]: the host's cost per weft_grad_ready and weft_grad_wait
 * of the set as one device gradient set, a figure, no check; --grad-overlap,
 * --grad-fault, --grad-skip: a device set's stream order, its overlap with
 * backward, its failures (below). WEFT_DEVICE_CHECK_VMM=1: every device buffer from
 * cuMemCreate and cuMemMap, as PyTorch's expandable segments make them (no
 * legacy IPC handle; addresses mapped again to new memory once freed).
 * WEFT_DEVICE_CHECK_HOSTS=H: the ranks as H pretend hosts (WEFT_HOST_ID). */
#include <time.h>
#include <math.h>
#include <dlfcn.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

#ifdef WEFT_HAVE_CUDA
#include "src/base/half.h"
#include "src/cuda/cuda_api.h"
#include "src/cuda/cuda_mem.h"

static const weft_cuda_api *cu;
static CUstream user_stream;
static int rank, size;
static long passed, failed;

#define CU_OK(expr)                                                               \
  do {                                                                            \
    CUresult r_ = (expr);                                                         \
    if (r_ != CUDA_SUCCESS) {                                                     \
      char w_[160];                                                               \
      weft_cuda_error_words(cu, r_, w_, sizeof w_);                               \
      fprintf(stderr, "rank %d: %s:%d %s: %s\n", rank, __FILE__, __LINE__, #expr, w_); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

/* Rank r's value at index i of call c: small integers (and halves for avg
 * of floats), so sums are exact in every dtype. */
static int64_t value_of(int r, int c, size_t i, weft_dtype dt, weft_op op) {
  uint64_t h = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)c * 0xBF58476D1CE4E5B9ull ^
               (uint64_t)i * 0x94D049BB133111EBull;
  h ^= h >> 31;
  if (op == WEFT_PROD) return (int64_t)(h % 3) - 1 ? 2 : 1; /* 1 or 2: products stay exact */
  int64_t v = (int64_t)(h % 17) - 8;                         /* -8 .. 8 */
  if (dt == WEFT_U8) v = (int64_t)(h % 9);                   /* 0 .. 8 */
  return v;
}

static void store(void *buf, size_t i, weft_dtype dt, double v) {
  switch (dt) {
    case WEFT_F32: ((float *)buf)[i] = (float)v; break;
    case WEFT_F64: ((double *)buf)[i] = v; break;
    case WEFT_F16: ((uint16_t *)buf)[i] = weft_float_to_f16((float)v); break;
    case WEFT_BF16: ((uint16_t *)buf)[i] = weft_float_to_bf16((float)v); break;
    case WEFT_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case WEFT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case WEFT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case WEFT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
  }
}

static double load(const void *buf, size_t i, weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: return ((const float *)buf)[i];
    case WEFT_F64: return ((const double *)buf)[i];
    case WEFT_F16: return weft_f16_to_float(((const uint16_t *)buf)[i]);
    case WEFT_BF16: return weft_bf16_to_float(((const uint16_t *)buf)[i]);
    case WEFT_I8: return ((const int8_t *)buf)[i];
    case WEFT_U8: return ((const uint8_t *)buf)[i];
    case WEFT_I32: return ((const int32_t *)buf)[i];
    case WEFT_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
  }
}

static bool is_float(weft_dtype dt) {
  return dt == WEFT_F32 || dt == WEFT_F64 || dt == WEFT_F16 || dt == WEFT_BF16;
}

/* The reference reduction of element i over every rank, as dtype dt holds it. */
static double reduced(int c, size_t i, weft_dtype dt, weft_op op) {
  int64_t acc = value_of(0, c, i, dt, op);
  for (int r = 1; r < size; r++) {
    int64_t v = value_of(r, c, i, dt, op);
    switch (op) {
      case WEFT_SUM:
      case WEFT_AVG: acc += v; break;
      case WEFT_PROD: acc *= v; break;
      case WEFT_MIN: acc = v < acc ? v : acc; break;
      case WEFT_MAX: acc = v > acc ? v : acc; break;
      default: break;
    }
  }
  double out = (double)acc;
  if (op == WEFT_AVG) /* floats: the mean, rounded once; integers: truncated toward zero */
    out = is_float(dt) ? out / size : (double)(acc / size);
  char one[8];
  store(one, 0, dt, out); /* as the dtype holds it (wraps, rounds) */
  return load(one, 0, dt);
}

/* Device buffers: filled from and read into host memory through the
 * user's stream, so the call is ordered behind the fill and the read
 * behind the call, with no synchronize of weft's stream. */
/* WEFT_DEVICE_CHECK_VMM=1: device buffers as PyTorch's expandable segments
 * make them (cuMemCreate memory mapped into one reserved range, which has no
 * legacy IPC handle), freed chunks mapped again at the same addresses to
 * new memory; else cuMemAlloc's. The calls come from the library weft
 * loaded (cu->library), by name: weft itself needs none of them. */
static struct {
  bool on;
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUmemAllocationProp prop;
  size_t grain;
  CUdeviceptr arena;
  size_t arena_bytes;
  /* the arena's chunks, in address order: first fit, freed ones merged */
  struct vmm_chunk {
    size_t at, bytes;
    bool used;
    CUmemGenericAllocationHandle handle;
  } chunks[4096];
  int nchunks;
} vmm;

static void vmm_init(int ordinal) {
  const char *want = getenv("WEFT_DEVICE_CHECK_VMM");
  if (!want || strcmp(want, "1")) return;
  void *lib = dlopen(cu->library, RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen(cu->library, RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "device-check: WEFT_DEVICE_CHECK_VMM: cannot open %s\n", cu->library);
    exit(1);
  }
#define VMM_SYM(field, name)                                                          \
  if (!(*(void **)&vmm.field = dlsym(lib, name))) {                                   \
    fprintf(stderr, "device-check: WEFT_DEVICE_CHECK_VMM: %s has no %s\n", cu->library, name); \
    exit(1);                                                                          \
  }
  VMM_SYM(reserve, "cuMemAddressReserve");
  VMM_SYM(create, "cuMemCreate");
  VMM_SYM(map, "cuMemMap");
  VMM_SYM(set_access, "cuMemSetAccess");
  VMM_SYM(unmap, "cuMemUnmap");
  VMM_SYM(release, "cuMemRelease");
  VMM_SYM(granularity, "cuMemGetAllocationGranularity");
#undef VMM_SYM
  vmm.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  vmm.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  vmm.prop.location.id = ordinal;
  CU_OK(vmm.granularity(&vmm.grain, &vmm.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  vmm.arena_bytes = (size_t)1 << 30;
  CU_OK(vmm.reserve(&vmm.arena, vmm.arena_bytes, vmm.grain, 0, 0));
  vmm.chunks[0] = (struct vmm_chunk){.at = 0, .bytes = vmm.arena_bytes};
  vmm.nchunks = 1;
  vmm.on = true;
}

static CUdeviceptr dev_alloc(size_t bytes) {
  CUdeviceptr p;
  if (!vmm.on) {
    CU_OK(cu->mem_alloc(&p, bytes ? bytes : 1));
    return p;
  }
  size_t need = ((bytes ? bytes : 1) + vmm.grain - 1) / vmm.grain * vmm.grain;
  for (int i = 0; i < vmm.nchunks; i++) {
    struct vmm_chunk *c = &vmm.chunks[i];
    if (c->used || c->bytes < need) continue;
    if (c->bytes > need) { /* split: the rest stays free after it */
      if (vmm.nchunks == (int)(sizeof vmm.chunks / sizeof vmm.chunks[0])) break;
      memmove(c + 2, c + 1, (size_t)(vmm.nchunks - i - 1) * sizeof *c);
      c[1] = (struct vmm_chunk){.at = c->at + need, .bytes = c->bytes - need};
      c->bytes = need;
      vmm.nchunks++;
    }
    p = vmm.arena + c->at;
    CU_OK(vmm.create(&c->handle, need, &vmm.prop, 0));
    CU_OK(vmm.map(p, need, 0, c->handle, 0));
    CUmemAccessDesc access = {.location = vmm.prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_OK(vmm.set_access(p, need, &access, 1));
    c->used = true;
    return p;
  }
  fprintf(stderr, "device-check: WEFT_DEVICE_CHECK_VMM: the 1 GiB arena has no %zu bytes free\n", need);
  exit(1);
}

static CUresult dev_free(CUdeviceptr p) {
  if (!vmm.on) return cu->mem_free(p);
  for (int i = 0; i < vmm.nchunks; i++) {
    struct vmm_chunk *c = &vmm.chunks[i];
    if (!c->used || vmm.arena + c->at != p) continue;
    CUresult r = vmm.unmap(p, c->bytes);
    if (r == CUDA_SUCCESS) r = vmm.release(c->handle);
    c->used = false;
    /* merged with free neighbours, so the addresses are handed out again */
    if (i + 1 < vmm.nchunks && !c[1].used) {
      c->bytes += c[1].bytes;
      memmove(c + 1, c + 2, (size_t)(vmm.nchunks - i - 2) * sizeof *c);
      vmm.nchunks--;
    }
    if (i > 0 && !c[-1].used) {
      c[-1].bytes += c->bytes;
      memmove(c, c + 1, (size_t)(vmm.nchunks - i - 1) * sizeof *c);
      vmm.nchunks--;
    }
    return r;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static void fill_dev(CUdeviceptr dst, const void *host, size_t bytes) {
  if (bytes) CU_OK(cu->memcpy_htod_async(dst, host, bytes, user_stream));
}

static void read_dev(void *host, CUdeviceptr src, size_t bytes) {
  if (bytes) CU_OK(cu->memcpy_dtoh_async(host, src, bytes, user_stream));
  CU_OK(cu->stream_synchronize(user_stream));
}

static void expect(bool ok, const char *what, int c, weft_dtype dt, weft_op op, size_t count,
                   bool in_place, size_t i, double got, double want) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  if (failed <= 20)
    printf("rank %d: FAIL %s call %d %s %s count %zu %s: element %zu is %g, want %g\n", rank,
           what, c, weft_dtype_name(dt), weft_op_name(op), count,
           in_place ? "in place" : "out of place", i, got, want);
}

typedef enum { ALLREDUCE, REDUCE, REDUCE_SCATTER, BROADCAST, ALLGATHER, GATHER, SCATTER, ALLTOALL } coll_id;
static const char *const coll_names[] = {"allreduce", "reduce",    "reduce_scatter", "broadcast",
                                         "allgather", "gather",    "scatter",        "alltoall"};

/* One call: fills, runs, checks. Reductions take `op`; the others move data. */
static void one_call(weft_comm *comm, coll_id id, int c, weft_dtype dt, weft_op op, size_t count,
                     bool in_place) {
  size_t elem = weft_dtype_size(dt), n = (size_t)size;
  int root = c % size;
  /* elements of each side as this rank sees them */
  size_t in_elems = count, out_elems = count;
  switch (id) {
    case REDUCE_SCATTER: in_elems = n * count; break;
    case ALLGATHER: out_elems = n * count; break;
    case GATHER: out_elems = n * count; break;
    case SCATTER: in_elems = n * count; break;
    case ALLTOALL: in_elems = out_elems = n * count; break;
    default: break;
  }
  size_t whole = in_elems > out_elems ? in_elems : out_elems;
  char *in = calloc(whole + 1, elem), *out = calloc(whole + 1, elem);
  /* the input: element j of this rank's send buffer */
  for (size_t j = 0; j < in_elems; j++) store(in, j, dt, (double)value_of(rank, c, j, dt, op));
  CUdeviceptr dsend = dev_alloc(whole * elem), drecv = in_place ? dsend : dev_alloc(whole * elem);
  weft_status st = WEFT_OK;
  /* in place, the send side lies where the call reads it */
  size_t send_at = 0;
  if (in_place && id == ALLGATHER) send_at = (size_t)rank * count;
  if (in_place && id == GATHER && rank == root) send_at = (size_t)root * count;
  memset(out, 0, whole * elem);
  fill_dev(drecv, out, whole * elem); /* a known recv buffer */
  if (in_place && (id == ALLGATHER || id == GATHER)) {
    /* the own block sits inside recvbuf; `in` holds it (a queued copy reads
     * its source when it runs, so the source lives until the read below) */
    fill_dev(dsend + send_at * elem, in, count * elem);
  } else {
    fill_dev(dsend, in, in_elems * elem);
  }
  void *s = (void *)(uintptr_t)(dsend + send_at * elem), *r = (void *)(uintptr_t)drecv;
  switch (id) {
    case ALLREDUCE: st = weft_allreduce(comm, s, r, count, dt, op); break;
    case REDUCE: st = weft_reduce(comm, s, r, count, dt, op, root); break;
    case REDUCE_SCATTER:
      /* in place: recvbuf is sendbuf + rank*count */
      if (in_place) r = (void *)(uintptr_t)(dsend + (size_t)rank * count * elem);
      st = weft_reduce_scatter(comm, s, r, count, dt, op);
      break;
    case BROADCAST: st = weft_broadcast(comm, s, r, count, dt, root); break;
    case ALLGATHER: st = weft_allgather(comm, s, r, count, dt); break;
    case GATHER: st = weft_gather(comm, s, r, count, dt, root); break;
    case SCATTER:
      if (in_place && rank == root) r = (void *)(uintptr_t)(dsend + (size_t)root * count * elem);
      st = weft_scatter(comm, s, r, count, dt, root);
      break;
    case ALLTOALL: st = weft_alltoall(comm, s, r, count, dt); break;
  }
  if (st != WEFT_OK) {
    failed++;
    printf("rank %d: FAIL %s call %d %s %s count %zu: %s: %s\n", rank, coll_names[id], c,
           weft_dtype_name(dt), weft_op_name(op), count, weft_status_name(st),
           weft_last_error(comm));
    free(in);
    free(out);
    exit(1); /* the communicator is failed: the other checks would only repeat it */
  }
  read_dev(out, (CUdeviceptr)(uintptr_t)r, out_elems * elem);
  switch (id) {
    case ALLREDUCE:
    case REDUCE:
      if (id == REDUCE && rank != root) break;
      for (size_t i = 0; i < count; i++) {
        double want = reduced(c, i, dt, op), got = load(out, i, dt);
        expect(got == want, coll_names[id], c, dt, op, count, in_place, i, got, want);
      }
      break;
    case REDUCE_SCATTER:
      for (size_t i = 0; i < count; i++) {
        double want = reduced(c, (size_t)rank * count + i, dt, op), got = load(out, i, dt);
        expect(got == want, coll_names[id], c, dt, op, count, in_place, i, got, want);
      }
      break;
    case BROADCAST:
      for (size_t i = 0; i < count; i++) {
        char one[8];
        store(one, 0, dt, (double)value_of(root, c, i, dt, op));
        double want = load(one, 0, dt), got = load(out, i, dt);
        expect(got == want, coll_names[id], c, dt, op, count, in_place, i, got, want);
      }
      break;
    case ALLGATHER:
    case GATHER:
      if (id == GATHER && rank != root) break;
      for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < count; i++) {
          char one[8];
          store(one, 0, dt, (double)value_of((int)b, c, i, dt, op));
          double want = load(one, 0, dt), got = load(out, b * count + i, dt);
          expect(got == want, coll_names[id], c, dt, op, count, in_place, b * count + i, got, want);
        }
      break;
    case SCATTER:
      for (size_t i = 0; i < count; i++) {
        char one[8];
        store(one, 0, dt, (double)value_of(root, c, (size_t)rank * count + i, dt, op));
        double want = load(one, 0, dt), got = load(out, i, dt);
        expect(got == want, coll_names[id], c, dt, op, count, in_place, i, got, want);
      }
      break;
    case ALLTOALL:
      for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < count; i++) {
          char one[8];
          store(one, 0, dt, (double)value_of((int)b, c, (size_t)rank * count + i, dt, op));
          double want = load(one, 0, dt), got = load(out, b * count + i, dt);
          expect(got == want, coll_names[id], c, dt, op, count, in_place, b * count + i, got, want);
        }
      break;
  }
  CU_OK(dev_free(dsend));
  if (!in_place) CU_OK(dev_free(drecv));
  free(in);
  free(out);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The figure of --resnet: ms per step, per tensor and flat. */
/* The tensors' element counts of a gradient-set TSV (index, name, shape,
 * numel; tools/data/resnet50_grads.tsv), at most `max`; -1 when it cannot
 * be opened (said on stderr). */
static int read_grad_tsv(const char *tsv, size_t *counts, int max) {
  FILE *f = fopen(tsv, "r");
  if (!f) {
    fprintf(stderr, "rank %d: cannot open %s\n", rank, tsv);
    return -1;
  }
  int n = 0;
  char line[512];
  while (fgets(line, sizeof line, f) && n < max) {
    char name[256], shape[128];
    int index;
    size_t numel;
    if (sscanf(line, "%d %255s %127s %zu", &index, name, shape, &numel) == 4 && numel) counts[n++] = numel;
  }
  fclose(f);
  return n;
}

static int resnet(weft_comm *comm, const char *tsv, bool lent) {
  size_t counts[1024], total = 0;
  int n = read_grad_tsv(tsv, counts, 1024);
  if (n < 0) return 1;
  for (int t = 0; t < n; t++) total += counts[t];
  CUdeviceptr *bufs = calloc((size_t)n, sizeof *bufs), flat = dev_alloc(total * 4);
  weft_request **reqs = calloc((size_t)n, sizeof *reqs);
  for (int t = 0; t < n; t++) {
    bufs[t] = dev_alloc(counts[t] * 4);
    CU_OK(cu->memset_d8_async(bufs[t], 0, counts[t] * 4, user_stream));
  }
  CU_OK(cu->memset_d8_async(flat, 0, total * 4, user_stream));
  CU_OK(cu->stream_synchronize(user_stream));
  /* registered, as a training loop's gradient buffers would be: the peers
   * keep them mapped from step to step (without: lent, opened and closed
   * by the peers in every call) */
  for (int t = 0; t < n && !lent; t++)
    if (weft_comm_register(comm, (void *)(uintptr_t)bufs[t], counts[t] * 4) ||
        (t == 0 && weft_comm_register(comm, (void *)(uintptr_t)flat, total * 4))) {
      fprintf(stderr, "rank %d: weft_comm_register: %s\n", rank, weft_last_error(comm));
      return 1;
    }
  enum { WARM = 3, STEPS = 20 };
  double per[STEPS], whole[STEPS];
  for (int step = 0; step < WARM + STEPS; step++) {
    weft_barrier(comm);
    double t0 = now_s();
    for (int t = n - 1; t >= 0; t--) /* backward's order: the last layer's first */
      if (weft_iallreduce(comm, (void *)(uintptr_t)bufs[t], (void *)(uintptr_t)bufs[t], counts[t],
                          WEFT_F32, WEFT_AVG, &reqs[t])) {
        fprintf(stderr, "rank %d: weft_iallreduce: %s\n", rank, weft_last_error(comm));
        return 1;
      }
    if (weft_wait_all(reqs, n)) {
      fprintf(stderr, "rank %d: weft_wait_all: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    double t1 = now_s();
    weft_barrier(comm);
    double t2 = now_s();
    if (weft_allreduce(comm, (void *)(uintptr_t)flat, (void *)(uintptr_t)flat, total, WEFT_F32,
                       WEFT_AVG)) {
      fprintf(stderr, "rank %d: weft_allreduce: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    double t3 = now_s();
    if (step >= WARM) per[step - WARM] = (t1 - t0) * 1e3, whole[step - WARM] = (t3 - t2) * 1e3;
  }
  qsort(per, STEPS, sizeof per[0], cmp_double);
  qsort(whole, STEPS, sizeof whole[0], cmp_double);
  if (rank == 0)
    printf("resnet: %d tensors, %.1f MB, %d ranks, %s: per tensor: %.3f ms per step, flat buffer: "
           "%.3f ms per step (medians of %d)\n",
           n, total * 4 / 1e6, size, lent ? "lent per call" : "registered", per[STEPS / 2],
           whole[STEPS / 2], STEPS);
  /* collective, before the buffers go: then no peer maps them (the
   * stand-in aborts a cuMemFree of memory another process has open) */
  for (int t = 0; t < n && !lent; t++)
    if (weft_comm_deregister(comm, (void *)(uintptr_t)bufs[t]) ||
        (t == 0 && weft_comm_deregister(comm, (void *)(uintptr_t)flat))) {
      fprintf(stderr, "rank %d: weft_comm_deregister: %s\n", rank, weft_last_error(comm));
      return 1;
    }
  for (int t = 0; t < n; t++) CU_OK(dev_free(bufs[t]));
  CU_OK(dev_free(flat));
  free(bufs);
  free(reqs);
  return 0;
}

/* --in-flight N: N non-blocking allreduces (sum, f32, in place) on slices of
 * one device buffer, all issued before any is waited for, as a backward pass
 * issues one per gradient tensor; then every result against the reference.
 * weft.h puts no limit on calls in flight short of memory (once, a full ring
 * of 256 stream events crashed the 300th). */
static int in_flight(weft_comm *comm, int n) {
  enum { COUNT = 16 };
  size_t bytes = (size_t)n * COUNT * sizeof(float);
  float *host = malloc(bytes);
  weft_request **reqs = calloc((size_t)n, sizeof *reqs);
  if (!host || !reqs) return 1;
  for (int c = 0; c < n; c++)
    for (size_t i = 0; i < COUNT; i++)
      host[(size_t)c * COUNT + i] = (float)value_of(rank, c, i, WEFT_F32, WEFT_SUM);
  CUdeviceptr buf = dev_alloc(bytes);
  fill_dev(buf, host, bytes);
  weft_status st = WEFT_OK;
  int issued = 0;
  double t0 = now_s();
  for (; issued < n && st == WEFT_OK; issued++) {
    void *slice = (void *)(uintptr_t)(buf + (CUdeviceptr)issued * COUNT * sizeof(float));
    st = weft_iallreduce(comm, slice, slice, COUNT, WEFT_F32, WEFT_SUM, &reqs[issued]);
  }
  double issue_s = now_s() - t0;
  if (st) {
    issued--;
    printf("device-check: in-flight: rank %d: call %d of %d refused: %s\n", rank, issued, n,
           weft_last_error(comm));
  }
  for (int c = 0; c < issued; c++) {
    weft_status w = weft_wait(&reqs[c]);
    if (w && st == WEFT_OK) {
      st = w;
      printf("device-check: in-flight: rank %d: call %d of %d failed: %s\n", rank, c, n,
             weft_last_error(comm));
    }
  }
  read_dev(host, buf, bytes);
  long bad = 0;
  for (int c = 0; c < n && st == WEFT_OK; c++)
    for (size_t i = 0; i < COUNT; i++) {
      double want = 0;
      for (int r = 0; r < size; r++) want += (double)value_of(r, c, i, WEFT_F32, WEFT_SUM);
      if ((double)host[(size_t)c * COUNT + i] != want && bad++ < 5)
        printf("device-check: in-flight: rank %d: call %d element %zu is %g, want %g\n", rank, c, i,
               (double)host[(size_t)c * COUNT + i], want);
    }
  passed += st == WEFT_OK && !bad ? n : 0;
  failed += st != WEFT_OK || bad ? 1 : 0;
  printf("device-check: rank %d: in flight: %d allreduces issued before any wait (%.1f us per issue, "
         "%.2f s to the last result), %s\n",
         rank, n, issue_s * 1e6 / n, now_s() - t0, st ? "FAILED" : bad ? "wrong results" : "all right");
  CU_OK(dev_free(buf));
  free(host);
  free(reqs);
  return st || bad ? 1 : 0;
}

/* --order N: what weft.h promises a non-blocking call on device buffers,
 * N rounds of two checks (issue 45), each on fresh values:
 *  - read after: weft_iallreduce in place, then a copy of the buffer to the
 *    host queued on the user's stream, and that stream synchronized before
 *    weft_wait: the copy must read the sum (work queued on the stream after
 *    the call waits for its result);
 *  - head of line: weft_iallreduce A, then a gate on the user's stream (a
 *    cuStreamWaitValue32 on a word only this program opens), then
 *    weft_iallreduce B: weft_wait(A) must complete, with A's sum, while the
 *    gate is shut (A's work never waits for user work queued after A);
 *    then the gate opens and B completes with its sum.
 * Without the promise the first reads stale data and the second waits
 * until WEFT_TIMEOUT: deterministic, no timing involved. */
static void fill_round(float *host, size_t count, int c) {
  for (size_t i = 0; i < count; i++) host[i] = (float)value_of(rank, c, i, WEFT_F32, WEFT_SUM);
}

static long wrong_sums(const float *got, size_t count, int c, const char *what, int round) {
  long bad = 0;
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int r = 0; r < size; r++) want += (double)value_of(r, c, i, WEFT_F32, WEFT_SUM);
    if ((double)got[i] != want && bad++ < 3)
      printf("device-check: order: rank %d: round %d: %s: element %zu is %g, want %g\n", rank, round,
             what, i, (double)got[i], want);
  }
  return bad;
}

static int order_check(weft_comm *comm, int rounds, size_t count) {
  size_t bytes = count * sizeof(float);
  /* a host buffer per device buffer: a copy from pageable memory may read
   * it as late as when it runs (the stand-in does) */
  float *host = malloc(bytes), *host_b = malloc(bytes), *got = malloc(bytes);
  static const uint32_t shut = 0;
  CUdeviceptr a = dev_alloc(bytes), b = dev_alloc(bytes), gate = dev_alloc(sizeof(uint32_t));
  CUstream side; /* opens the gate and reads A while the user's stream is held */
  CU_OK(cu->stream_create(&side, CU_STREAM_NON_BLOCKING));
  long bad_read = 0, bad_hol = 0;
  int failed_calls = 0;
  for (int round = 0; round < rounds && !failed_calls; round++) {
    /* read after */
    int c = 3 * round;
    fill_round(host, count, c);
    fill_dev(a, host, bytes);
    weft_request *ra = NULL, *rb = NULL;
    void *pa = (void *)(uintptr_t)a, *pb = (void *)(uintptr_t)b;
    weft_status st = weft_iallreduce(comm, pa, pa, count, WEFT_F32, WEFT_SUM, &ra);
    if (!st) {
      memset(got, 0, bytes);
      read_dev(got, a, bytes); /* the user's stream: before weft_wait */
      bad_read += wrong_sums(got, count, c, "read after, before weft_wait", round);
      st = weft_wait(&ra);
    }
    /* head of line */
    if (!st) {
      fill_dev(gate, &shut, sizeof shut);
      fill_round(host, count, c + 1);
      fill_dev(a, host, bytes);
      st = weft_iallreduce(comm, pa, pa, count, WEFT_F32, WEFT_SUM, &ra);
    }
    if (!st) {
      CU_OK(cu->stream_wait_value32(user_stream, gate, 1, CU_STREAM_WAIT_VALUE_GEQ));
      fill_round(host_b, count, c + 2);
      fill_dev(b, host_b, bytes); /* behind the gate too */
      st = weft_iallreduce(comm, pb, pb, count, WEFT_F32, WEFT_SUM, &rb);
      weft_status wa = weft_wait(&ra); /* the gate is shut */
      if (wa && !st) st = wa;
      if (wa)
        printf("device-check: order: rank %d: round %d: head of line: weft_wait(A) with the user's "
               "stream held after A: %s: %s\n", rank, round, weft_status_name(wa), weft_last_error(comm));
      if (!wa) {
        memset(got, 0, bytes);
        CU_OK(cu->memcpy_dtoh_async(got, a, bytes, side));
        CU_OK(cu->stream_synchronize(side));
        bad_hol += wrong_sums(got, count, c + 1, "head of line, A", round);
      }
      CU_OK(cu->stream_write_value32(side, gate, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
      CU_OK(cu->stream_synchronize(side));
      weft_status wb = rb ? weft_wait(&rb) : WEFT_OK;
      if (wb && !st) st = wb;
      if (!wb && rb == NULL && !st) {
        memset(got, 0, bytes);
        read_dev(got, b, bytes);
        bad_hol += wrong_sums(got, count, c + 2, "head of line, B", round);
      }
    }
    if (st) {
      failed_calls++;
      printf("device-check: order: rank %d: round %d: %s: %s\n", rank, round, weft_status_name(st),
             weft_last_error(comm));
    }
  }
  CU_OK(cu->stream_synchronize(user_stream));
  CU_OK(cu->stream_destroy(side));
  CU_OK(dev_free(a));
  CU_OK(dev_free(b));
  CU_OK(dev_free(gate));
  free(host);
  free(host_b);
  free(got);
  bool ok = !bad_read && !bad_hol && !failed_calls;
  passed += ok ? rounds : 0;
  failed += ok ? 0 : 1;
  printf("device-check: rank %d: order: %d rounds of %zu floats: read after the call on its stream "
         "before weft_wait: %s; weft_wait(A) with the stream held after A: %s%s\n",
         rank, rounds, count, bad_read ? "STALE" : "right", bad_hol ? "WRONG" : "right",
         failed_calls ? " (a call FAILED)" : "");
  return ok ? 0 : 1;
}

/* --churn N: N rounds of cuMemAlloc, a non-blocking allreduce in place on
 * the new buffer (waited for, then checked), cuMemFree at once, sizes that
 * change round to round so the allocator hands addresses out again: a
 * training loop whose allocator frees and reuses memory (PyTorch's
 * empty_cache, an out-of-memory retry). A peer that kept a buffer mapped
 * past its call would make the free undefined (the stand-in aborts), and a
 * stale mapping of a reused address would read the old buffer. */
static int churn(weft_comm *comm, int rounds) {
  long bad = 0;
  weft_status st = WEFT_OK;
  float host[4096];
  for (int c = 0; c < rounds && !st; c++) {
    size_t count = 256 + (size_t)(c * 37 % 16) * 240; /* 256 .. 3856 floats */
    for (size_t i = 0; i < count; i++) host[i] = (float)value_of(rank, c, i, WEFT_F32, WEFT_SUM);
    CUdeviceptr buf = dev_alloc(count * sizeof(float));
    fill_dev(buf, host, count * sizeof(float));
    weft_request *req = NULL;
    st = weft_iallreduce(comm, (void *)(uintptr_t)buf, (void *)(uintptr_t)buf, count, WEFT_F32,
                         WEFT_SUM, &req);
    if (!st) st = weft_wait(&req);
    if (!st) {
      read_dev(host, buf, count * sizeof(float));
      for (size_t i = 0; i < count; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (double)value_of(r, c, i, WEFT_F32, WEFT_SUM);
        if ((double)host[i] != want && bad++ < 3)
          printf("device-check: churn: rank %d: round %d element %zu is %g, want %g\n", rank, c, i,
                 (double)host[i], want);
      }
    }
    CU_OK(dev_free(buf)); /* at once: no peer may still have it open */
  }
  if (st) printf("device-check: churn: rank %d: %s: %s\n", rank, weft_status_name(st), weft_last_error(comm));
  bool ok = !st && !bad;
  passed += ok ? rounds : 0;
  failed += ok ? 0 : 1;
  printf("device-check: rank %d: churn: %d rounds of allocate, allreduce, free: %s\n", rank, rounds,
         st ? "FAILED" : bad ? "wrong results" : "all right");
  return ok ? 0 : 1;
}

/* --host-only: a rank that passes host memory only, on a node with GPUs
 * (every CPU rank of a GPU node), must create no CUDA context: one would
 * hold about 500 MB of that GPU's memory and show in nvidia-smi. 200
 * allreduces on host buffers checked against the reference; then, where
 * nvidia-smi runs (a GPU machine), rank 0 asks it which processes hold a
 * context while every rank is still alive, and none may be a rank. The
 * stand-in's count of context retains at exit (WEFT_CUDA_EMU_REPORT
 * primary_refs) is the suite's check. */
static int host_only(weft_comm *comm) {
  enum { COUNT = 1000, CALLS = 200 };
  static float buf[COUNT];
  long bad = 0;
  weft_status st = WEFT_OK;
  for (int c = 0; c < CALLS && !st; c++) {
    for (size_t i = 0; i < COUNT; i++) buf[i] = (float)value_of(rank, c, i, WEFT_F32, WEFT_SUM);
    st = weft_allreduce(comm, buf, buf, COUNT, WEFT_F32, WEFT_SUM);
    for (size_t i = 0; i < COUNT && !st; i++) {
      double want = 0;
      for (int r = 0; r < size; r++) want += (double)value_of(r, c, i, WEFT_F32, WEFT_SUM);
      bad += (double)buf[i] != want;
    }
  }
  int64_t pid = (int64_t)getpid(), *pids = calloc((size_t)size, sizeof *pids);
  if (!st) st = weft_allgather(comm, &pid, pids, 1, WEFT_I64);
  int listed = 0;
  char seen[256] = "";
  FILE *smi = rank == 0 && !st ? popen("command -v nvidia-smi >/dev/null 2>&1 || echo no-smi; "
                                       "nvidia-smi --query-compute-apps=pid,used_memory "
                                       "--format=csv,noheader,nounits 2>/dev/null", "r")
                               : NULL;
  char line[256];
  bool no_smi = false;
  while (smi && fgets(line, sizeof line, smi)) {
    if (!strncmp(line, "no-smi", 6)) no_smi = true;
    long long p = atoll(line);
    for (int r = 0; r < size; r++)
      if (p == pids[r] && listed++ < 4)
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), " rank %d (pid %lld, %s MiB)", r, p,
                 strchr(line, ',') ? strchr(line, ',') + 2 : "?");
  }
  if (smi) pclose(smi);
  if (!st) st = weft_barrier(comm); /* every rank alive until nvidia-smi answered */
  free(pids);
  if (st) printf("device-check: host-only: rank %d: %s: %s\n", rank, weft_status_name(st), weft_last_error(comm));
  if (rank == 0)
    printf("device-check: rank 0: host-only: %d allreduces on host memory, %ld wrong elements; "
           "ranks nvidia-smi lists with a CUDA context: %s\n", CALLS, bad,
           listed ? seen : no_smi ? "none (no nvidia-smi here)" : "none");
  bool ok = !st && !bad && !listed;
  passed += ok ? CALLS : 0;
  failed += ok ? 0 : 1;
  return ok ? 0 : 1;
}

/* The end of a checking mode: every rank learns whether any failed (so
 * all exit alike), says its counts, and the communicator goes. */
/* --grad N: N gradient sets of random shape on device memory, 10 to 150
 * tensors of one float dtype each, random caps, sum or avg, owned storage
 * (the gradients are views of weft's device buckets) or copies (one pack
 * and one unpack kernel per bucket), prediv 0, 2 or 4, the communicator's
 * stream or one of the set's own (weft_grad_set_stream); two steps, the
 * first ended by weft_grad_wait and the second by weft_grad_wait_stream on
 * the program's stream, each rank marking its tensors ready in an order of
 * its own right after it queued their fill on the set's stream (never
 * waited: the stand-in runs queued work late, at random, so a bucket read
 * before its fill ran, or a result read before it was in place, is
 * wrong); and the same set on host memory. Every reduced element is
 * checked against the reference (small integers: exact in any order, so
 * device and host must agree bit for bit too). Prints "grad: K sets, T
 * tensors, ..."; counts into passed and failed. */
static uint64_t grad_rng(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

/* The stand-in's counters (cuda_emu.h), where WEFT_CUDA_LIBRARY is it;
 * false on a real driver. */
typedef struct emu_counts {
  int allocations, host_allocations, streams, events, modules, ipc_mappings, pending, primary_refs, reclaimed,
      ipc_opened, ipc_exported, dmabuf_exported, dmabuf_open;
  int room[16]; /* counters a later stand-in appends: never written past */
} emu_counts;
static bool emu_counts_now(emu_counts *c) {
  static void (*fn)(emu_counts *);
  static bool looked;
  if (!looked) {
    looked = true;
    void *lib = dlopen(cu->library, RTLD_NOW | RTLD_NOLOAD);
    if (lib) *(void **)&fn = dlsym(lib, "weft_cuda_emu_counts");
  }
  if (!fn) return false;
  fn(c);
  return true;
}

typedef struct grad_shape {
  int n;
  size_t *counts;
  weft_dtype dt;
  weft_op op;
  size_t cap, first, inplace_min;
  int owned;
  double prediv;
  bool own_stream;
  bool accum;         /* step 1 is a no_sync step (weft_grad_set_sync(0)): gradients stay local */
  bool check;         /* check_every_step */
  bool params;        /* three parameters broadcast from the last rank after every synced step */
  int wire;           /* wire_dtype (-1: the communicator's): what f32 buckets cross hosts as */
} grad_shape;

static grad_shape grad_shape_of(int k) {
  static const weft_dtype dts[] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16};
  static const double prediv[] = {0, 2, 4};
  grad_shape sh;
  uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)(k + 1) * 0x100000001b3ull; /* alike on every rank */
  sh.n = 10 + (int)(grad_rng(&x) % 141);
  sh.dt = dts[grad_rng(&x) % 4];
  sh.op = grad_rng(&x) % 2 ? WEFT_AVG : WEFT_SUM;
  sh.cap = (size_t)256 << (grad_rng(&x) % 10);
  sh.first = (size_t)64 << (grad_rng(&x) % 6);
  sh.owned = (int)(grad_rng(&x) % 2);
  sh.inplace_min = grad_rng(&x) % 2 ? 1024 : 0;
  sh.prediv = prediv[grad_rng(&x) % 3];
  sh.own_stream = grad_rng(&x) % 2;
  sh.accum = grad_rng(&x) % 2;
  sh.check = grad_rng(&x) % 3 == 0;
  sh.params = grad_rng(&x) % 2;
  {
    static const int wires[] = {-1, WEFT_F32, WEFT_BF16, WEFT_F16};
    sh.wire = wires[grad_rng(&x) % 4];
  }
  sh.counts = malloc(sizeof *sh.counts * (size_t)sh.n);
  for (int i = 0; i < sh.n; i++) sh.counts[i] = 1 + grad_rng(&x) % 700;
  return sh;
}

/* One set of shape `sh`, set `k`, on device (kind 0) or host (1) memory,
 * two steps; every element against the reference into got (when not
 * NULL). The set's stream for its fills: `fill_on`. 0, or 1 where
 * something failed early. */
static int grad_run(weft_comm *comm, const grad_shape *sh, int k, int kind, CUstream set_on, double *got,
                    long *buckets) {
  size_t esz = weft_dtype_size(sh->dt);
  int n = sh->n;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = sh->owned;
  o.op = sh->op;
  o.bucket_cap_bytes = sh->cap;
  o.first_bucket_cap_bytes = sh->first;
  o.inplace_min_bytes = sh->inplace_min;
  o.prediv = sh->prediv;
  o.check_every_step = sh->check;
  o.wire_dtype = sh->wire; /* the small integers here are exact in bf16 and f16 */
  o.bcast_period = sh->params ? 1 : -1;
  o.bcast_root = size - 1;
  weft_grad *g = NULL;
  if (weft_grad_create(comm, &o, &g)) {
    printf("device-check: grad: rank %d: set %d: weft_grad_create: %s\n", rank, k, weft_last_error(comm));
    failed++;
    return 1;
  }
  CUstream fill_on = kind == 0 && sh->own_stream ? set_on : user_stream;
  if (kind == 0 && sh->own_stream && weft_grad_set_stream(g, set_on)) {
    printf("device-check: grad: rank %d: set %d: weft_grad_set_stream: %s\n", rank, k, weft_last_error(comm));
    failed++;
  }
  void **mine = calloc((size_t)n, sizeof *mine); /* copy mode: the program's own gradients */
  for (int i = 0; i < n; i++) {
    if (!sh->owned)
      mine[i] = kind == 0 ? (void *)(uintptr_t)dev_alloc(sh->counts[i] * esz) : malloc(sh->counts[i] * esz);
    weft_tensor t = {mine[i], sh->counts[i], sh->dt, kind == 0 ? WEFT_MEMORY_DEVICE : WEFT_MEMORY_HOST};
    if (weft_grad_register(g, &t, NULL)) {
      printf("device-check: grad: rank %d: set %d: register: %s\n", rank, k, weft_last_error(comm));
      failed++;
    }
  }
  /* parameters in the set's memory kind, each rank writing its own values
   * before every step: after a synced step they hold the last rank's */
  enum { NPARAM = 3 };
  static const size_t param_count[NPARAM] = {5, 100, 3000};
  void *param[NPARAM] = {NULL, NULL, NULL};
  float *param_host = malloc(sizeof(float) * 3000);
  if (sh->params) {
    weft_tensor pt[NPARAM];
    for (int j = 0; j < NPARAM; j++) {
      param[j] = kind == 0 ? (void *)(uintptr_t)dev_alloc(param_count[j] * 4) : malloc(param_count[j] * 4);
      pt[j] = (weft_tensor){param[j], param_count[j], WEFT_F32, kind == 0 ? WEFT_MEMORY_DEVICE : WEFT_MEMORY_HOST};
    }
    if (weft_grad_set_params(g, pt, NPARAM)) {
      printf("device-check: grad: rank %d: set %d: set_params: %s\n", rank, k, weft_last_error(comm));
      failed++;
    }
  }
  int rc = 0;
  if (weft_grad_finalize(g)) {
    printf("device-check: grad: rank %d: set %d: finalize: %s\n", rank, k, weft_last_error(comm));
    failed++;
    rc = 1;
  }
  size_t at = 0;
  for (int step = 0; step < 3 && !rc; step++) {
    bool synced = !(step == 1 && sh->accum);
    if (weft_grad_set_sync(g, synced)) {
      printf("device-check: grad: rank %d: set %d: set_sync: %s\n", rank, k, weft_last_error(comm));
      failed++;
    }
    for (int j = 0; sh->params && j < NPARAM; j++) { /* this rank's own values, queued */
      float *own = kind == 0 ? malloc(param_count[j] * 4) : param[j];
      for (size_t e = 0; e < param_count[j]; e++) own[e] = (float)((rank + 1) * 1000 + j * 10 + (int)e % 7 + step);
      if (kind == 0) {
        fill_dev((CUdeviceptr)(uintptr_t)param[j], own, param_count[j] * 4);
        CU_OK(cu->stream_synchronize(user_stream));
        free(own);
      }
    }
    /* this rank's order: its own shuffle */
    int *order = malloc(sizeof *order * (size_t)n);
    uint64_t y = (uint64_t)(k + 7) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(rank + 1) * 0x2545f4914f6cdd1dull ^
                 (uint64_t)step;
    for (int i = 0; i < n; i++) order[i] = n - 1 - i;
    for (int i = n - 1; i > 0; i--) {
      int j = (int)(grad_rng(&y) % (uint64_t)(i + 1)), tmp = order[i];
      order[i] = order[j], order[j] = tmp;
    }
    char **fills = calloc((size_t)n, sizeof *fills);
    for (int q = 0; q < n; q++) {
      int i = order[q];
      void *view = mine[i];
      if (sh->owned) weft_grad_tensor_ptr(g, i, &view);
      char *host = fills[i] = malloc(sh->counts[i] * esz);
      for (size_t e = 0; e < sh->counts[i]; e++)
        store(host, e, sh->dt, (double)((rank * 3 + i + (int)e * 5 + step * 7 + k) % 9));
      if (kind == 0)
        CU_OK(cu->memcpy_htod_async((CUdeviceptr)(uintptr_t)view, host, sh->counts[i] * esz, fill_on));
      else
        memcpy(view, host, sh->counts[i] * esz);
      if (weft_grad_ready(g, i)) {
        printf("device-check: grad: rank %d: set %d: ready(%d): %s\n", rank, k, i, weft_last_error(comm));
        failed++;
      }
    }
    free(order);
    /* steps 0 and 1: the host waits; step 2: the program's stream does */
    weft_status waited = step < 2 ? weft_grad_wait(g) : weft_grad_wait_stream(g, user_stream);
    if (waited) {
      printf("device-check: grad: rank %d: set %d step %d: %s: %s\n", rank, k, step,
             step < 2 ? "wait" : "wait_stream", weft_last_error(comm));
      failed++;
      rc = 1;
      if (kind == 0) CU_OK(cu->stream_synchronize(fill_on));
      for (int i = 0; i < n; i++) free(fills[i]);
      free(fills);
      break;
    }
    /* a no_sync step's wait does nothing: the gradients are this rank's own
     * writes, in the order of the stream they were queued on */
    if (!synced && kind == 0) CU_OK(cu->stream_synchronize(fill_on));
    for (int i = 0; i < n; i++) {
      void *view = mine[i];
      if (sh->owned) weft_grad_tensor_ptr(g, i, &view);
      char *host = malloc(sh->counts[i] * esz);
      if (kind == 0)
        read_dev(host, (CUdeviceptr)(uintptr_t)view, sh->counts[i] * esz); /* on the program's stream */
      else
        memcpy(host, view, sh->counts[i] * esz);
      for (size_t e = 0; e < sh->counts[i]; e++, at++) {
        double sum = 0;
        for (int r = 0; r < size; r++) sum += (double)((r * 3 + i + (int)e * 5 + step * 7 + k) % 9);
        char one[8];
        /* a no_sync step leaves this rank's own gradient as it was */
        double local = (double)((rank * 3 + i + (int)e * 5 + step * 7 + k) % 9);
        store(one, 0, sh->dt, !synced ? local : sh->op == WEFT_AVG ? sum / size : sum);
        double want = load(one, 0, sh->dt), v = load(host, e, sh->dt);
        if (got) got[at] = v;
        bool ok = v == want;
        passed += ok;
        failed += !ok;
        if (!ok && failed <= 10)
          printf("device-check: grad: rank %d: set %d (%s %s %s, %s, prediv %g%s%s) step %d tensor %d element %zu: "
                 "%g, want %g\n",
                 rank, k, kind == 0 ? "device" : "host", sh->owned ? "owned" : "copies", weft_dtype_name(sh->dt),
                 weft_op_name(sh->op), sh->prediv, sh->own_stream ? ", own stream" : "", synced ? "" : ", no_sync",
                 step, i, e, v, want);
      }
      free(host);
    }
    for (int j = 0; sh->params && j < NPARAM; j++) {
      if (kind == 0)
        read_dev(param_host, (CUdeviceptr)(uintptr_t)param[j], param_count[j] * 4);
      else
        memcpy(param_host, param[j], param_count[j] * 4);
      int from = synced ? size - 1 : rank; /* broadcast after every synced step */
      size_t bad = 0;
      for (size_t e = 0; e < param_count[j]; e++)
        bad += param_host[e] != (float)((from + 1) * 1000 + j * 10 + (int)e % 7 + step);
      passed += param_count[j] - bad;
      failed += bad;
      if (bad)
        printf("device-check: grad: rank %d: set %d step %d: parameter %d: %zu elements are not rank %d's\n", rank,
               k, step, j, bad, from);
    }
    /* the fills read their host buffers until they ran: the set's stream is
     * synchronized only now, after the results were read on the program's
     * stream, so a result that needed it to be is not hidden by it */
    if (kind == 0) CU_OK(cu->stream_synchronize(fill_on));
    for (int i = 0; i < n; i++) free(fills[i]);
    free(fills);
  }
  if (kind == 0 && buckets) {
    weft_grad_stats st;
    if (!weft_grad_get_stats(g, &st)) *buckets += (long)st.buckets_launched / 2;
  }
  weft_grad_destroy(g);
  for (int j = 0; sh->params && j < NPARAM; j++) {
    if (kind == 0)
      CU_OK(dev_free((CUdeviceptr)(uintptr_t)param[j]));
    else
      free(param[j]);
  }
  free(param_host);
  for (int i = 0; i < n; i++) {
    if (!mine[i]) continue;
    if (kind == 0)
      CU_OK(dev_free((CUdeviceptr)(uintptr_t)mine[i]));
    else
      free(mine[i]);
  }
  free(mine);
  return rc;
}

static int grad_check(weft_comm *comm, int nsets) {
  long tensors = 0, buckets = 0;
  int kinds[2][2] = {{0}}; /* [owned][prediv > 1] of the device sets run */
  int with_accum = 0, with_check = 0, with_params = 0;
  CUstream set_on;
  CU_OK(cu->stream_create(&set_on, CU_STREAM_NON_BLOCKING));
  for (int k = 0; k < nsets; k++) {
    grad_shape sh = grad_shape_of(k);
    size_t total = 0;
    for (int i = 0; i < sh.n; i++) total += sh.counts[i];
    double *got[2] = {calloc(3 * total, sizeof(double)), calloc(3 * total, sizeof(double))};
    int bad = 0;
    for (int kind = 0; kind < 2 && !bad; kind++) /* device, then host */
      bad = grad_run(comm, &sh, k, kind, set_on, got[kind], kind == 0 ? &buckets : NULL);
    if (!bad) {
      bool same = !memcmp(got[0], got[1], 3 * total * sizeof(double));
      passed += same;
      failed += !same;
      if (!same) printf("device-check: grad: rank %d: set %d: device and host results differ\n", rank, k);
      tensors += sh.n;
      kinds[sh.owned][sh.prediv > 1]++;
      with_accum += sh.accum, with_check += sh.check, with_params += sh.params;
    }
    free(got[0]);
    free(got[1]);
    free(sh.counts);
  }
  /* weft_grad_destroy gives back every allocation and event the set took:
   * the same set run twice leaves the stand-in's counts where the first
   * run left them (the communicator's own pools settle in the first) */
  emu_counts c0, c1, c2;
  const char *release = "not counted (a real driver)";
  if (emu_counts_now(&c0)) {
    grad_shape sh = grad_shape_of(3);
    sh.owned = 0, sh.prediv = 2, sh.own_stream = true, sh.params = true, sh.accum = true;
    grad_run(comm, &sh, 3, 0, set_on, NULL, NULL);
    emu_counts_now(&c1);
    grad_run(comm, &sh, 3, 0, set_on, NULL, NULL);
    emu_counts_now(&c2);
    bool ok = c2.allocations == c1.allocations && c2.events == c1.events &&
              c2.host_allocations == c1.host_allocations && c2.streams == c1.streams;
    passed += ok;
    failed += !ok;
    release = ok ? "all given back at destroy" : "LEAKED";
    if (!ok)
      printf("device-check: grad: rank %d: a set's run and destroy changed the counts: allocations %d -> %d, events "
             "%d -> %d, pinned %d -> %d, streams %d -> %d\n",
             rank, c1.allocations, c2.allocations, c1.events, c2.events, c1.host_allocations, c2.host_allocations,
             c1.streams, c2.streams);
    free(sh.counts);
  }
  CU_OK(cu->stream_destroy(set_on));
  /* a set that mixes memory kinds is refused, named, before anything is sent */
  {
    weft_grad *g = NULL;
    weft_status st = weft_grad_create(comm, NULL, &g);
    static float host_grad[8];
    CUdeviceptr d = dev_alloc(32);
    weft_tensor host_t = {host_grad, 8, WEFT_F32, WEFT_MEMORY_HOST};
    weft_tensor dev_t = {(void *)(uintptr_t)d, 8, WEFT_F32, WEFT_MEMORY_DEVICE};
    if (!st) st = weft_grad_register(g, &host_t, NULL);
    if (!st) st = weft_grad_register(g, &dev_t, NULL);
    bool ok = st == WEFT_ERR_INVALID && strstr(weft_last_error(comm), "one memory kind");
    passed += ok;
    failed += !ok;
    if (!ok)
      printf("device-check: grad: rank %d: mixed kinds: %s (%s), want WEFT_ERR_INVALID naming one memory kind\n",
             rank, weft_status_name(st), weft_last_error(comm));
    weft_grad_destroy(g);
    dev_free(d);
  }
  printf("device-check: rank %d: grad: %d sets (owned %d, owned+prediv %d, copies %d, copies+prediv %d; %d with a "
         "no_sync step, %d checked every step, %d with parameters broadcast every step), %ld tensors in %ld buckets "
         "on device memory, 3 steps each (host waits, the last a stream wait), equal to the reference and to the "
         "same sets on host memory; events and allocations %s; mixed kinds refused\n",
         rank, nsets, kinds[1][0], kinds[1][1], kinds[0][0], kinds[0][1], with_accum, with_check, with_params, tensors,
         buckets, release);
  return 0;
}

/* --grad-overlap: what stream order buys a device set, on the stand-in
 * (its spin kernel; "skipped" on a real driver). 8 tensors, owned storage,
 * buckets of one or two tensors.
 * A: the set's stream is not held by the buckets in flight. Rank 0 marks
 *    every gradient ready and records an event E on the set's stream after
 *    them while the other ranks sleep 3 s, so no bucket can complete: E
 *    must complete within 2.5 s anyway (backward's later kernels would
 *    wait behind the buckets otherwise) and bucket 0 must still be running.
 * B: reducing while backward runs. Every rank queues the fills of every
 *    tensor but the last due, a 1.5 s kernel, then the last fill, marking
 *    each ready as it queues it: bucket 0's allreduce must complete while
 *    that kernel still holds the stream (the last gradient not made yet).
 * Both steps' results against the reference. */
static int grad_overlap(weft_comm *comm) {
  static const uint32_t fake_fatbin[4] = {0xBA55ED50u, 0, 0, 0}; /* the stand-in's magic */
  CUmodule m;
  CUfunction spin;
  emu_counts c;
  if (!emu_counts_now(&c) || cu->module_load_data(&m, fake_fatbin) != CUDA_SUCCESS ||
      cu->module_get_function(&spin, m, "weft_emu_test_spin") != CUDA_SUCCESS) {
    printf("device-check: rank %d: grad-overlap: skipped (needs the stand-in's spin kernel)\n", rank);
    return 0;
  }
  enum { N = 8, COUNT = 1000 };
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = 1;
  o.op = WEFT_SUM;
  o.first_bucket_cap_bytes = 4096;
  o.bucket_cap_bytes = 8192;
  weft_grad *g = NULL;
  if (weft_grad_create(comm, &o, &g)) return 1;
  for (int i = 0; i < N; i++) {
    weft_tensor t = {NULL, COUNT, WEFT_F32, WEFT_MEMORY_DEVICE};
    if (weft_grad_register(g, &t, NULL)) return 1;
  }
  if (weft_grad_finalize(g)) {
    printf("device-check: grad-overlap: rank %d: finalize: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  float host[N][COUNT];
  CUevent e;
  CU_OK(cu->event_create(&e, CU_EVENT_DISABLE_TIMING));
  double e_after = -1, bucket0_after = -1;
  int bucket0_done_at_e = -1, last_made_at_bucket0 = -1;
  for (int step = 0; step < 2; step++) {
    weft_barrier(comm);
    double t0 = now_s();
    if (step == 0 && rank != 0) usleep(3000000);
    /* the fill order: the reverse of registration, as the buckets' */
    for (int q = 0; q < N; q++) {
      int i = N - 1 - q;
      void *view = NULL;
      weft_grad_tensor_ptr(g, i, &view);
      for (int k = 0; k < COUNT; k++) host[i][k] = (float)((rank + 1) * (i + 1) + k % 7 + step);
      if (step == 1 && q == N - 1) {
        double seconds = 1.5;
        void *params[] = {&seconds};
        CU_OK(cu->launch_kernel(spin, 1, 1, 1, 1, 1, 1, 0, user_stream, params, NULL));
      }
      CU_OK(cu->memcpy_htod_async((CUdeviceptr)(uintptr_t)view, host[i], sizeof host[i], user_stream));
      if (step == 1 && q == N - 1) CU_OK(cu->event_record(e, user_stream));
      if (weft_grad_ready(g, i)) {
        printf("device-check: grad-overlap: rank %d: ready(%d): %s\n", rank, i, weft_last_error(comm));
        failed++;
      }
    }
    if (step == 0 && rank == 0) {
      CU_OK(cu->event_record(e, user_stream));
      CUresult r;
      while ((r = cu->event_query(e)) == CUDA_ERROR_NOT_READY && now_s() - t0 < 2.5) usleep(200);
      e_after = now_s() - t0;
      int done = 0;
      weft_grad_bucket_test(g, 0, &done);
      bucket0_done_at_e = done;
      bool ok = r == CUDA_SUCCESS && e_after < 2.5 && !done;
      passed += ok;
      failed += !ok;
      if (!ok)
        printf("device-check: grad-overlap: rank 0: the set's stream %s after %.3f s with the peers asleep (bucket 0 "
               "%s): the buckets in flight held it\n",
               r == CUDA_SUCCESS ? "went on" : "was still held", e_after, done ? "done" : "running");
    }
    if (step == 1) {
      int done = 0;
      while (!weft_grad_bucket_test(g, 0, &done) && !done && now_s() - t0 < 10) usleep(200);
      bucket0_after = now_s() - t0;
      CUresult r = cu->event_query(e);
      last_made_at_bucket0 = r == CUDA_SUCCESS;
      bool ok = done && r == CUDA_ERROR_NOT_READY;
      passed += ok;
      failed += !ok;
      if (!ok)
        printf("device-check: grad-overlap: rank %d: bucket 0 %s after %.3f s, the last gradient %s: not reduced "
               "while backward ran\n",
               rank, done ? "reduced" : "not reduced", bucket0_after, r == CUDA_SUCCESS ? "already made" : "not made");
    }
    if (weft_grad_wait(g)) {
      printf("device-check: grad-overlap: rank %d: step %d: wait: %s\n", rank, step, weft_last_error(comm));
      failed++;
      break;
    }
    for (int i = 0; i < N; i++) {
      void *view = NULL;
      weft_grad_tensor_ptr(g, i, &view);
      float got[COUNT];
      read_dev(got, (CUdeviceptr)(uintptr_t)view, sizeof got);
      for (int k = 0; k < COUNT; k++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (float)((r + 1) * (i + 1) + k % 7 + step);
        bool ok = got[k] == (float)want;
        passed += ok;
        failed += !ok;
      }
    }
  }
  CU_OK(cu->event_destroy(e));
  weft_grad_destroy(g);
  if (rank == 0)
    printf("device-check: rank 0: grad-overlap: A: the set's stream went on after %.3f s with every bucket in flight "
           "and the peers asleep (bucket 0 %s); B: bucket 0 reduced %.3f s into the step while a 1.5 s kernel still "
           "held back the last gradient (%s)\n",
           e_after, bucket0_done_at_e ? "done: WRONG" : "still running", bucket0_after,
           last_made_at_bucket0 ? "made: WRONG" : "not made yet");
  return 0;
}

/* --grad-fault and --grad-skip: a device set (copies, prediv 2, 12
 * tensors) fails on every rank, never hangs, and says where.
 * --grad-fault, run with WEFT_CUDA_EMU_KERNEL_FAULT=N and
 * WEFT_CUDA_EMU_FAULT_RANK=R: rank R's N-th kernel faults (a pack, an
 * unpack or a reduction), as a kernel reading a bad address does; every
 * rank's step must fail naming a bucket. --grad-skip: rank 1 skips the
 * second step's reduction (weft_grad_set_sync(0)) while the others reduce;
 * every rank must fail naming both steps (WEFT_ERR_MISMATCH where it was
 * seen, a peer's notice quoting it elsewhere). Prints
 * "grad-fault: rank R: STATUS: sentence" per rank. */
static int grad_fault(weft_comm *comm, bool skip) {
  enum { N = 12, COUNT = 300 };
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.prediv = 2;
  o.inplace_min_bytes = 0;
  o.first_bucket_cap_bytes = 2048;
  o.bucket_cap_bytes = 4096;
  weft_grad *g = NULL;
  if (weft_grad_create(comm, &o, &g)) return 1;
  CUdeviceptr mine[N];
  for (int i = 0; i < N; i++) {
    mine[i] = dev_alloc(COUNT * sizeof(float));
    weft_tensor t = {(void *)(uintptr_t)mine[i], COUNT, WEFT_F32, WEFT_MEMORY_DEVICE};
    if (weft_grad_register(g, &t, NULL)) return 1;
  }
  weft_status st = weft_grad_finalize(g);
  static float host[COUNT]; /* read by copies queued until the stream is done */
  for (int k = 0; k < COUNT; k++) host[k] = (float)(rank + k % 5);
  for (int step = 0; step < 4 && !st; step++) {
    if (skip) weft_grad_set_sync(g, !(step == 1 && rank == 1));
    for (int i = N - 1; i >= 0 && !st; i--) {
      /* not CU_OK: after the fault this rank's context answers every call with it */
      cu->memcpy_htod_async(mine[i], host, sizeof host, user_stream);
      st = weft_grad_ready(g, i);
    }
    if (!st) st = weft_grad_wait(g);
  }
  const char *msg = weft_last_error(comm);
  /* a rank that saw the mismatch says WEFT_ERR_MISMATCH; one that heard of
   * it from that rank's notice says WEFT_ERR_PEER_LOST with its words: both
   * name the two steps */
  bool ok = st != WEFT_OK && (skip ? strstr(msg, "step 1") && strstr(msg, "step 2") : strstr(msg, "bucket") != NULL);
  passed += ok;
  failed += !ok;
  printf("device-check: grad-fault: rank %d: %s: %s%s\n", rank, weft_status_name(st), msg,
         ok ? "" : skip ? " (want a failure naming steps 1 and 2)" : " (want a failure naming the bucket)");
  weft_grad_destroy(g);
  /* the set's failure must leave this rank's GPU usable where no kernel of
   * its own faulted: nothing weft queued may run on memory it freed (a
   * pack queued for a bucket whose call then failed to start read its
   * piece table after the destroy freed it, faulting the context) */
  const char *fault_rank = getenv("WEFT_CUDA_EMU_FAULT_RANK");
  bool own_fault = !skip && (!fault_rank || atoi(fault_rank) == rank);
  CUresult after = cu->stream_synchronize(user_stream);
  if (!own_fault) {
    bool usable = after == CUDA_SUCCESS;
    passed += usable;
    failed += !usable;
    if (!usable) {
      char w[160];
      weft_cuda_error_words(cu, after, w, sizeof w);
      printf("device-check: grad-fault: rank %d: the GPU is unusable after the set's destroy: %s\n", rank, w);
    }
  }
  /* the gradients stay: a peer whose call failed part-way may still map
   * them over CUDA IPC, and freeing memory another process has open is
   * undefined (the stand-in aborts); they go with the process */
  return 0;
}

/* --p2p N: N rounds of messages between device buffers (weft_send /
 * weft_recv and their non-blocking forms), staged through pinned host
 * memory: each rank sends to the next and receives from the previous around
 * the ring, and to itself, random sizes (up to 6 MiB: within a host the
 * large ones are lent over CUDA IPC, the rest staged) and dtypes.
 * The send buffer's fill and a memset of the receive buffer are queued on
 * the stream right before the calls and never waited for: the message must
 * carry the fill, and the received data must land after the memset (weft
 * orders both after the stream's earlier work). Every element checked. */
static int p2p_check(weft_comm *comm, int rounds) {
  long msgs = 0, bytes_total = 0;
  for (int k = 0; k < rounds; k++) {
    uint64_t x = 0x51ed270b2f7e4c3dull ^ (uint64_t)(k + 1) * 0x9e3779b97f4a7c15ull; /* alike on every rank */
    weft_dtype dt = (weft_dtype)(grad_rng(&x) % WEFT_DTYPE_COUNT);
    /* small, medium, and large: 4.5 to 6 MiB, which a send within a host
     * lends over CUDA IPC (16 chunks or more) instead of staging */
    uint64_t pick = grad_rng(&x) % 3;
    size_t count = pick == 0   ? grad_rng(&x) % 16
                   : pick == 1 ? grad_rng(&x) % 300000
                               : ((size_t)9 << 19) + grad_rng(&x) % ((size_t)3 << 19);
    if (pick == 2) count /= weft_dtype_size(dt);
    bool blocking = grad_rng(&x) % 2;
    size_t esz = weft_dtype_size(dt), bytes = count * esz;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    CUdeviceptr sbuf = dev_alloc(bytes), rbuf = dev_alloc(bytes), self_s = dev_alloc(bytes), self_r = dev_alloc(bytes);
    char *host = malloc(bytes + 1), *host_self = malloc(bytes + 1), *got = malloc(bytes + 1);
    for (size_t e = 0; e < count; e++) {
      store(host, e, dt, (double)((rank * 7 + (int)e + k) % 11));
      store(host_self, e, dt, (double)((rank * 5 + (int)e * 3 + k) % 13));
    }
    /* queued, not waited: the calls must come after them */
    fill_dev(sbuf, host, bytes);
    fill_dev(self_s, host_self, bytes);
    if (bytes) {
      CU_OK(cu->memset_d8_async(rbuf, 0xee, bytes, user_stream));
      CU_OK(cu->memset_d8_async(self_r, 0xee, bytes, user_stream));
    }
    weft_status st = WEFT_OK;
    void *sp = (void *)(uintptr_t)sbuf, *rp = (void *)(uintptr_t)rbuf;
    void *ssp = (void *)(uintptr_t)self_s, *srp = (void *)(uintptr_t)self_r;
    if (blocking) {
      /* even ranks send first, odd ranks receive first: no cycle of waits */
      if (size > 1 && rank % 2 == 0) {
        st = weft_send(comm, sp, count, dt, next, k);
        if (!st) st = weft_recv(comm, rp, count, dt, prev, k);
      } else if (size > 1) {
        st = weft_recv(comm, rp, count, dt, prev, k);
        if (!st) st = weft_send(comm, sp, count, dt, next, k);
      }
      if (!st) st = weft_send(comm, ssp, count, dt, rank, 1000000 + k);
      if (!st) st = weft_recv(comm, srp, count, dt, rank, 1000000 + k);
    } else {
      weft_request *req[4] = {NULL, NULL, NULL, NULL};
      if (size > 1) st = weft_irecv(comm, rp, count, dt, prev, k, &req[0]);
      if (!st && size > 1) st = weft_isend(comm, sp, count, dt, next, k, &req[1]);
      if (!st) st = weft_isend(comm, ssp, count, dt, rank, 1000000 + k, &req[2]);
      if (!st) st = weft_irecv(comm, srp, count, dt, rank, 1000000 + k, &req[3]);
      weft_status w = weft_wait_all(req, 4);
      if (!st) st = w;
    }
    if (st) {
      printf("device-check: p2p: rank %d: round %d (%zu %s, %s): %s: %s\n", rank, k, count, weft_dtype_name(dt),
             blocking ? "blocking" : "non-blocking", weft_status_name(st), weft_last_error(comm));
      failed++;
    } else {
      for (int which = 0; which < 2; which++) {
        if (which == 0 && size == 1) continue;
        read_dev(got, which == 0 ? rbuf : self_r, bytes);
        int from = which == 0 ? prev : rank;
        size_t bad = 0;
        for (size_t e = 0; e < count; e++) {
          double want = which == 0 ? (double)((from * 7 + (int)e + k) % 11) : (double)((from * 5 + (int)e * 3 + k) % 13);
          char one[8];
          store(one, 0, dt, want);
          if (load(got, e, dt) != load(one, 0, dt)) bad++;
        }
        passed += count - bad;
        failed += bad;
        if (bad)
          printf("device-check: p2p: rank %d: round %d (%zu %s, %s) from %s: %zu elements wrong\n", rank, k, count,
                 weft_dtype_name(dt), blocking ? "blocking" : "non-blocking", which ? "itself" : "the previous rank", bad);
        msgs++;
        bytes_total += (long)bytes;
      }
    }
    CU_OK(cu->stream_synchronize(user_stream)); /* the fills read their host buffers until then */
    free(host);
    free(host_self);
    free(got);
    CU_OK(dev_free(sbuf));
    CU_OK(dev_free(rbuf));
    CU_OK(dev_free(self_s));
    CU_OK(dev_free(self_r));
  }
  /* a lent buffer stays lent until the receiver copied out of it: rank 0's
   * send completes only then, so its overwrite right after cannot reach
   * rank 1, which posts its receive 0.3 s late */
  if (size >= 2 && rank <= 1) {
    size_t count = (size_t)6 << 18; /* 6 MiB of f32: lent within a host */
    CUdeviceptr buf = dev_alloc(count * 4);
    float *host = malloc(count * 4);
    weft_request *req = NULL;
    weft_status st;
    if (rank == 0) {
      for (size_t e = 0; e < count; e++) host[e] = (float)(e % 251);
      fill_dev(buf, host, count * 4);
      st = weft_isend(comm, (void *)(uintptr_t)buf, count, WEFT_F32, 1, 777, &req);
      if (!st) st = weft_wait(&req);
      CU_OK(cu->memset_d8_async(buf, 0xee, count * 4, user_stream));
      CU_OK(cu->stream_synchronize(user_stream));
    } else {
      usleep(300000);
      st = weft_irecv(comm, (void *)(uintptr_t)buf, count, WEFT_F32, 0, 777, &req);
      if (!st) st = weft_wait(&req);
      read_dev(host, buf, count * 4);
      size_t bad = 0;
      for (size_t e = 0; e < count; e++) bad += host[e] != (float)(e % 251);
      passed += count - bad;
      failed += bad;
      if (bad) printf("device-check: p2p: rank 1: the late receive: %zu elements wrong (the lent buffer was "
                      "overwritten before it was copied)\n", bad);
    }
    if (st) {
      printf("device-check: p2p: rank %d: the late receive: %s: %s\n", rank, weft_status_name(st), weft_last_error(comm));
      failed++;
    }
    free(host);
    CU_OK(dev_free(buf));
  }
  printf("device-check: rank %d: p2p: %ld messages (%ld bytes) between device buffers received right, blocking and "
         "non-blocking, from the previous rank and from itself, ordered after the stream's earlier work; a receive "
         "posted late still gets what was sent\n",
         rank, msgs, bytes_total);
  return 0;
}

/* --grad-resnet TSV: the ResNet-50 gradient set (TSV as --resnet) as one
 * device gradient set with owned storage and DDP's caps (25 MiB, first 1
 * MiB); every step marks all tensors ready in backward's order, then waits.
 * Prints the host's time per weft_grad_ready and per weft_grad_wait, and the
 * step, medians of 20 steps after 3 (issue 46: the per-step overhead of 161
 * tensors before any GPU run). "backward": a simulated backward, each
 * gradient's "kernel" (a memset of its size) queued on the stream and the
 * gradient marked ready at once, in reverse order; the time from the last
 * ready to the end of weft_grad_wait, and on every other step to the end
 * of the stream's work after weft_grad_wait_stream. "host": the same set on
 * host memory (the comparison over tcp). No check: --grad checks. */
static int grad_resnet(weft_comm *comm, const char *tsv, bool backward, bool on_host) {
  size_t counts[1024];
  int n = read_grad_tsv(tsv, counts, 1024);
  if (n < 0) return 1;
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = 1;
  weft_grad *g = NULL;
  if (weft_grad_create(comm, &o, &g)) return 1;
  weft_memory kind = on_host ? WEFT_MEMORY_HOST : WEFT_MEMORY_DEVICE;
  for (int i = 0; i < n; i++) {
    weft_tensor t = {NULL, counts[i], WEFT_F32, kind};
    if (weft_grad_register(g, &t, NULL)) {
      fprintf(stderr, "rank %d: register: %s\n", rank, weft_last_error(comm));
      return 1;
    }
  }
  if (weft_grad_finalize(g)) {
    fprintf(stderr, "rank %d: finalize: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  void **view = malloc(sizeof *view * (size_t)n);
  for (int i = 0; i < n; i++) weft_grad_tensor_ptr(g, i, &view[i]);
  enum { WARM = 3, STEPS = 20 };
  double ready_us[STEPS], wait_us[STEPS], step_ms[STEPS], stream_ms[STEPS];
  for (int step = 0; step < WARM + STEPS; step++) {
    /* odd steps of the backward mode end with the stream form: the
     * program's stream waits, the host only to read the clock */
    bool stream_form = backward && !on_host && step % 2;
    weft_barrier(comm);
    double t0 = now_s();
    for (int i = n - 1; i >= 0; i--) {
      /* backward: the "kernel" making gradient i (a memset of its size) is
       * queued, then it is marked ready at once */
      if (backward && on_host)
        memset(view[i], 0, counts[i] * 4);
      else if (backward)
        CU_OK(cu->memset_d8_async((CUdeviceptr)(uintptr_t)view[i], 0, counts[i] * 4, user_stream));
      if (weft_grad_ready(g, i)) {
        fprintf(stderr, "rank %d: ready: %s\n", rank, weft_last_error(comm));
        return 1;
      }
    }
    double t1 = now_s();
    if (stream_form ? weft_grad_wait_stream(g, user_stream) : weft_grad_wait(g)) {
      fprintf(stderr, "rank %d: wait: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    if (stream_form) CU_OK(cu->stream_synchronize(user_stream));
    double t2 = now_s();
    if (step >= WARM) {
      int k = step - WARM;
      ready_us[k] = (t1 - t0) * 1e6 / n;
      (stream_form ? stream_ms : wait_us)[k] = stream_form ? (t2 - t1) * 1e3 : (t2 - t1) * 1e6;
      step_ms[k] = (t2 - t0) * 1e3;
    }
  }
  /* the steps of each form: packed to the front, then sorted */
  int nwait = 0, nstream = 0;
  for (int k = 0; k < STEPS; k++) {
    bool sf = backward && !on_host && (k + WARM) % 2;
    if (sf)
      stream_ms[nstream++] = stream_ms[k];
    else
      wait_us[nwait++] = wait_us[k];
  }
  qsort(ready_us, STEPS, sizeof ready_us[0], cmp_double);
  qsort(wait_us, (size_t)nwait, sizeof wait_us[0], cmp_double);
  qsort(stream_ms, (size_t)nstream, sizeof stream_ms[0], cmp_double);
  qsort(step_ms, STEPS, sizeof step_ms[0], cmp_double);
  weft_grad_stats st;
  weft_grad_get_stats(g, &st);
  const char *where = on_host ? "host memory" : "device memory";
  if (rank == 0 && !backward)
    printf("grad-resnet: %d tensors in %llu buckets on %s, %d ranks: %.2f us per weft_grad_ready "
           "(all marked at once), %.3f ms per weft_grad_wait, %.3f ms a step (medians of %d)\n",
           n, (unsigned long long)(st.buckets_launched / (WARM + STEPS)), where, size, ready_us[STEPS / 2],
           wait_us[nwait / 2] / 1e3, step_ms[STEPS / 2], STEPS);
  if (rank == 0 && backward) {
    printf("grad-resnet backward: %d tensors in %llu buckets on %s, %d ranks, each gradient's memset queued "
           "then marked ready: %.2f us per weft_grad_ready, %.3f ms from the last ready to the end of "
           "weft_grad_wait (median of %d)",
           n, (unsigned long long)(st.buckets_launched / (WARM + STEPS)), where, size, ready_us[STEPS / 2],
           wait_us[nwait / 2] / 1e3, nwait);
    if (nstream)
      printf(", %.3f ms from the last ready to the end of the stream's work after weft_grad_wait_stream "
             "(median of %d)",
             stream_ms[nstream / 2], nstream);
    printf("\n");
  }
  free(view);
  weft_grad_destroy(g);
  weft_comm_destroy(comm);
  return 0;
}

static int mode_end(weft_comm *comm, int rc) {
  long all_failed = failed;
  weft_allreduce(comm, &failed, &all_failed, 1, WEFT_I64, WEFT_SUM);
  printf("device-check: rank %d: %ld passed, %ld failed\n", rank, passed, failed);
  weft_comm_destroy(comm);
  return rc || all_failed ? 1 : 0;
}

/* --gdr-probe (above): 2 MiB of GPU 0, exported the way transports/ibv
 * registers device memory (the device table's range_of and export_dmabuf). */
static int gdr_probe(void) {
  const weft_mem_ops *dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
  char why[300];
  if (!dev) {
    printf("gdr-probe: no device table\n");
    return 1;
  }
  bool driver = dev->dmabuf_supported(0, why, sizeof why);
  printf("gdr-probe: driver: %s\n", why);
  size_t bytes = (size_t)2 << 20;
  weft_error_sink err = {{0}, {0}};
  weft_mem_stream *stream = NULL; /* holds GPU 0's primary context, as a communicator's does */
  void *buf = weft_cuda_stream_create(0, &stream, &err) == WEFT_OK ? dev->alloc_on(0, bytes) : NULL;
  if (!buf) {
    printf("gdr-probe: no 2 MiB of device memory (%s)\n", err.msg);
    weft_cuda_stream_destroy(stream);
    return 1;
  }
  weft_mem_range range;
  int rc = 0;
  if (!dev->range_of(buf, bytes, &range)) {
    printf("gdr-probe: the allocation's range is unknown to the driver\n");
    rc = 1;
  } else {
    weft_error_sink sink = {{0}, {0}};
    int fd = -1;
    weft_status st = dev->export_dmabuf(&range, &fd, &sink);
    if (st == WEFT_OK) {
      printf("gdr-probe: export: dma-buf fd of the %zu-byte allocation (buffer id %llu): works\n",
             range.bytes, (unsigned long long)range.buffer_id);
      close(fd);
    } else {
      printf("gdr-probe: export: refused (%s)%s\n", sink.msg,
             driver ? "" : ", as the driver's attribute says");
    }
  }
  dev->free_scratch(buf);
  weft_cuda_stream_destroy(stream);
  return rc;
}

int main(int argc, char **argv) {
  bool quick = argc > 1 && !strcmp(argv[1], "--quick");
  const char *resnet_tsv = argc > 2 && !strcmp(argv[1], "--resnet") ? argv[2] : NULL;
  bool resnet_lent = resnet_tsv && argc > 3 && !strcmp(argv[3], "lent");
  char why[512];
  if (!weft_cuda_usable(why, sizeof why)) {
    printf("device-check: SKIP: %s\n", why);
    return 77;
  }
  if (argc > 1 && !strcmp(argv[1], "--probe")) {
    printf("device-check: %s\n", why);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--gdr-probe")) return gdr_probe();
  weft_error_sink err = {0};
  cu = weft_cuda_api_load(&err);
  /* WEFT_DEVICE_CHECK_HOSTS=H: the ranks as H pretend hosts (WEFT_HOST_ID,
   * rank r on host r % H), so device calls cross hosts: staged, over tcp,
   * the f32 wire dtype applied between them */
  const char *hosts = getenv("WEFT_DEVICE_CHECK_HOSTS"), *my_rank = getenv("WEFT_RANK");
  if (hosts && atoi(hosts) > 1 && my_rank) {
    char id[64];
    snprintf(id, sizeof id, "device-check-host-%d", atoi(my_rank) % atoi(hosts));
    setenv("WEFT_HOST_ID", id, 1);
  }
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) {
    fprintf(stderr, "weft_comm_init_env: %s\n", weft_last_error(NULL));
    return 1;
  }
  rank = weft_comm_rank(comm);
  size = weft_comm_size(comm);
  if (argc > 1 && !strcmp(argv[1], "--host-only")) { /* before this program touches CUDA */
    int rc = host_only(comm);
    printf("device-check: rank %d: %ld passed, %ld failed\n", rank, passed, failed);
    weft_comm_destroy(comm);
    return rc;
  }
  CUdevice dev;
  CUcontext ctx;
  /* the ranks share device 0; WEFT_DEVICE_CHECK_SPREAD=1: rank r takes
   * device r % count (gpu_check.sh's two-GPU stage: IPC between GPUs) */
  int ndev = 1, ordinal = 0;
  CU_OK(cu->device_get_count(&ndev));
  const char *spread = getenv("WEFT_DEVICE_CHECK_SPREAD");
  if (spread && !strcmp(spread, "1") && ndev > 0) ordinal = rank % ndev;
  CU_OK(cu->device_get(&dev, ordinal));
  CU_OK(cu->primary_ctx_retain(&ctx, dev));
  CU_OK(cu->ctx_set_current(ctx));
  CU_OK(cu->stream_create(&user_stream, CU_STREAM_NON_BLOCKING));
  weft_comm_set_stream(comm, user_stream);
  vmm_init(ordinal);
  if (argc > 2 && !strcmp(argv[1], "--grad-resnet")) {
    bool backward = false, on_host = false;
    for (int a = 3; a < argc; a++) {
      backward |= !strcmp(argv[a], "backward");
      on_host |= !strcmp(argv[a], "host");
    }
    return grad_resnet(comm, argv[2], backward, on_host);
  }
  if (resnet_tsv) {
    int rc = resnet(comm, resnet_tsv, resnet_lent);
    weft_comm_destroy(comm);
    return rc;
  }
  if (argc > 2 && !strcmp(argv[1], "--in-flight")) return mode_end(comm, in_flight(comm, atoi(argv[2])));
  if (argc > 2 && !strcmp(argv[1], "--churn")) return mode_end(comm, churn(comm, atoi(argv[2])));
  if (argc > 2 && !strcmp(argv[1], "--grad")) return mode_end(comm, grad_check(comm, atoi(argv[2])));
  if (argc > 1 && !strcmp(argv[1], "--grad-overlap")) return mode_end(comm, grad_overlap(comm));
  if (argc > 2 && !strcmp(argv[1], "--p2p")) return mode_end(comm, p2p_check(comm, atoi(argv[2])));
  if (argc > 1 && (!strcmp(argv[1], "--grad-fault") || !strcmp(argv[1], "--grad-skip"))) {
    int rc = grad_fault(comm, !strcmp(argv[1], "--grad-skip"));
    printf("device-check: rank %d: %ld passed, %ld failed\n", rank, passed, failed);
    weft_comm_destroy(comm);
    return rc || failed ? 1 : 0;
  }
  if (argc > 2 && !strcmp(argv[1], "--order"))
    return mode_end(comm, order_check(comm, atoi(argv[2]), argc > 3 ? (size_t)atol(argv[3]) : 4096));
  if (argc > 1 && !strcmp(argv[1], "--fault")) {
    /* a kernel that faults on one rank fails the call on every rank: the
     * faulting rank from its stream's error, the others from its notice,
     * bounded by WEFT_TIMEOUT; nothing here touches the (sticky) stream */
    enum { N = 1000 };
    CUdeviceptr din = dev_alloc(N * 4), dout = dev_alloc(N * 4);
    weft_status got = WEFT_OK;
    int k = 0;
    for (; k < 40 && got == WEFT_OK; k++)
      got = weft_allreduce(comm, (void *)(uintptr_t)din, (void *)(uintptr_t)dout, N, WEFT_F32,
                           WEFT_SUM);
    printf("device-check: fault: rank %d: %s after %d calls: %s\n", rank, weft_status_name(got), k,
           got ? weft_last_error(comm) : "every call returned OK");
    weft_comm_destroy(comm);
    return got == WEFT_OK ? 1 : 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--foreign-ctx")) {
    /* a NULL stream while a context of the program's own (cuCtxCreate) is
     * current: refused on every rank at issue, naming the rule; then, the
     * primary context current again, the same call works */
    enum { N = 4096 };
    CUdeviceptr din = dev_alloc(N * 4), dout = dev_alloc(N * 4);
    weft_comm_set_stream(comm, NULL);
    CUresult (*ctx_create)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    void *lib = dlopen(cu->library, RTLD_NOW);
    *(void **)&ctx_create = lib ? dlsym(lib, "cuCtxCreate_v4") : NULL;
    *(void **)&ctx_destroy = lib ? dlsym(lib, "cuCtxDestroy_v2") : NULL;
    if (!ctx_create || !ctx_destroy) {
      printf("device-check: foreign ctx: rank %d: %s has no cuCtxCreate_v4\n", rank, cu->library);
      return 1;
    }
    CUcontext own;
    CU_OK(ctx_create(&own, NULL, 0, dev));
    weft_status got = weft_allreduce(comm, (void *)(uintptr_t)din, (void *)(uintptr_t)dout, N, WEFT_F32, WEFT_SUM);
    CUcontext after = NULL;
    CU_OK(cu->ctx_get_current(&after));
    printf("device-check: foreign ctx: rank %d: %s: %s; context restored: %s\n", rank, weft_status_name(got),
           got ? weft_last_error(comm) : "returned OK", after == own ? "yes" : "no");
    CU_OK(cu->ctx_set_current(ctx));
    static float host[N];
    for (int i = 0; i < N; i++) host[i] = (float)(rank + 1);
    fill_dev(din, host, N * 4);
    weft_status again = weft_allreduce(comm, (void *)(uintptr_t)din, (void *)(uintptr_t)dout, N, WEFT_F32, WEFT_SUM);
    read_dev(host, dout, N * 4);
    bool right = again == WEFT_OK && host[0] == (float)(size * (size + 1) / 2) && host[N - 1] == host[0];
    printf("device-check: foreign ctx: rank %d: in the primary context again: %s\n", rank,
           right ? "right" : again ? weft_last_error(comm) : "a wrong sum");
    CU_OK(ctx_destroy(own));
    CU_OK(cu->ctx_set_current(ctx));
    dev_free(din);
    dev_free(dout);
    weft_comm_destroy(comm);
    return got == WEFT_ERR_INVALID && after == own && right ? 0 : 1;
  }
  if (argc > 1 && !strcmp(argv[1], "--mixed")) {
    /* one rank's buffers of the other kind: a bad call that must fail on
     * every rank, bounded by WEFT_TIMEOUT, never a silent result */
    enum { N = 4096 };
    static float host_in[N], host_out[N];
    CUdeviceptr din = dev_alloc(N * 4), dout = dev_alloc(N * 4);
    void *in = rank == 0 ? (void *)host_in : (void *)(uintptr_t)din;
    void *out = rank == 0 ? (void *)host_out : (void *)(uintptr_t)dout;
    weft_status got = weft_allreduce(comm, in, out, N, WEFT_F32, WEFT_SUM);
    if (got == WEFT_OK) got = weft_barrier(comm); /* a rank that only sent hears it here */
    printf("device-check: mixed: rank %d: %s: %s\n", rank, weft_status_name(got),
           got ? weft_last_error(comm) : "returned OK");
    dev_free(din);
    dev_free(dout);
    weft_comm_destroy(comm);
    return got == WEFT_OK ? 1 : 0;
  }
  static const weft_dtype dts[] = {WEFT_F32, WEFT_F64, WEFT_F16, WEFT_BF16,
                                   WEFT_I8,  WEFT_U8,  WEFT_I32, WEFT_I64};
  static const weft_op ops[] = {WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX, WEFT_AVG};
  static const size_t counts_full[] = {1, 7, 1000, 70001}, counts_quick[] = {3, 1000};
  const size_t *counts = quick ? counts_quick : counts_full;
  int ncounts = quick ? 2 : 4, c = 0;
  for (int id = ALLREDUCE; id <= ALLTOALL; id++)
    for (int d = 0; d < 8; d++)
      for (int o = 0; o < (id <= REDUCE_SCATTER ? 5 : 1); o++)
        for (int k = 0; k < ncounts; k++)
          for (int place = 0; place < 2; place++) {
            bool in_place = place == 1;
            if (in_place && id == ALLTOALL) continue; /* alltoall never runs in place */
            /* prod of 1s and 2s over many ranks overflows i8: keep to what fits */
            if (ops[o] == WEFT_PROD && (dts[d] == WEFT_I8 || dts[d] == WEFT_U8) && size > 6)
              continue;
            one_call(comm, (coll_id)id, c++, dts[d], ops[o], counts[k], in_place);
          }
  long all_failed = failed;
  weft_allreduce(comm, &failed, &all_failed, 1, WEFT_I64, WEFT_SUM);
  printf("device-check: rank %d: %ld passed, %ld failed\n", rank, passed, failed);
  CU_OK(cu->stream_destroy(user_stream));
  weft_comm_destroy(comm);
  return all_failed ? 1 : 0;
}

#else

int main(void) {
  printf("device-check: SKIP: this build of weft has no CUDA support (configure with "
         "-Dcuda=enabled where nvcc and the CUDA headers are found)\n");
  return 77;
}

#endif
