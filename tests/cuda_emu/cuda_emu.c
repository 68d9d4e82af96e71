/* cuda_emu.c - a stand-in for the CUDA driver (libcuda.so.1) on machines
 * without a GPU, for tests: built as a shared library exporting the driver
 * symbols weft's table looks up (src/cuda/cuda_api.c, by versioned name, with
 * cuda.h's prototypes), loaded through WEFT_CUDA_LIBRARY; never part of the
 * library build.
 *
 * As strict as a GPU, so that code written without one fails here first:
 * - a device pointer is an address the host cannot touch: each allocation is
 *   a memfd mapped twice, PROT_NONE at the address handed out (a host
 *   dereference faults, as it would on a GPU) and read-write at an alias
 *   only the stand-in's copies and kernels use. Fresh memory is filled with
 *   0xff (NaN, -1), not zeros; a freed range stays reserved for a while, so
 *   a late use of it faults instead of landing in the next allocation.
 * - work is queued, never run when it is queued: it runs only inside the
 *   stand-in, a random 0..2 operations at each cuStreamQuery/cuEventQuery
 *   (any ready operation of any stream, each stream in order, cross-stream
 *   waits and the legacy default stream's implicit ordering kept), all that
 *   is needed at a synchronize. Copies read their source when they run.
 *   cuStreamWaitValue32 holds its stream until the word meets the value;
 *   a synchronize that can run nothing lets go of the lock meanwhile (the
 *   writer may be another thread), and aborts, naming the waits, where
 *   nothing ran for WEFT_CUDA_EMU_HANG_S.
 * - a copy or kernel touching memory outside a live allocation (or past
 *   its end, or another device's memory from a kernel) fails when it runs
 *   with CUDA_ERROR_ILLEGAL_ADDRESS, kept by its context: every later call
 *   of that context answers it, its queued work is dropped, until the
 *   primary context is reset (its last release).
 * - a call that needs a context fails without one current; a child forked
 *   after cuInit gets CUDA_ERROR_NOT_INITIALIZED from every call, cuInit
 *   included, as CUDA does not survive fork (exec a new image instead).
 * - handles carry a generation: a destroyed stream, event or module, or
 *   one of a reset context, is CUDA_ERROR_INVALID_HANDLE, never reused.
 *
 * IPC: a handle names the exporter's pid, the memfd's descriptor and the
 * allocation's serial number; another process opens /proc/<pid>/fd/<fd>,
 * checks the memfd's name (pid and serial) and size, and maps it.
 *
 * dma-buf export (GPUDirect RDMA, cuMemGetHandleForAddressRange with
 * CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD): the descriptor handed out is a fresh
 * open (O_RDWR | O_CLOEXEC) of the allocation's memfd through
 * /proc/self/fd, so its byte 0 is the allocation's base; mmap it (as the
 * verbs stand-in's ibv_reg_dmabuf_mr does) to see the device memory. Limits,
 * narrower than a GPU's:
 * - dptr must be the base of a live cuMemAlloc allocation of this process
 *   (each allocation is a memfd of its own, whose byte 0 is the base); an
 *   address inside one, memory opened by IPC or anything else:
 *   CUDA_ERROR_INVALID_VALUE. size: a nonzero multiple of the host page
 *   size, at most the allocation's size rounded up to whole pages; flags 0
 *   (CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE is refused, as where no
 *   BAR1 mapping exists); another handle type: CUDA_ERROR_INVALID_VALUE.
 * - memory mapped by cuMemMap (cuMemCreate's) and cuMemHostAlloc's pinned
 *   host memory are not exported: CUDA_ERROR_NOT_SUPPORTED (a GPU needs the
 *   cuMemCreate allocation made gpuDirectRDMACapable;
 *   CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED and
 *   CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED say 0).
 * - WEFT_CUDA_EMU_DMABUF=0: every dma-buf export answers
 *   CUDA_ERROR_NOT_SUPPORTED and CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED says
 *   0, as a driver or kernel without dma-buf.
 * - no cuFlushGPUDirectRDMAWrites (FLUSH_WRITES_OPTIONS 0, WRITES_ORDERING
 *   NONE): what a NIC writes becomes visible through an RDMA read flush,
 *   which the verbs stand-in enforces.
 * - cuMemFree (or a context's reset) while an exported descriptor is still
 *   open is allowed, as on a GPU where the dma-buf holds a reference: the
 *   memfd lives on through the descriptor, so whoever mapped it keeps the
 *   memory; only the device address goes (it faults, as any freed one).
 * The counters dmabuf_exported and dmabuf_open (cuda_emu.h) tell how many
 * were handed out and how many of those descriptors are still open.
 *
 * Kernels: cuModuleLoadData takes any fatbin (checked by magic only) and
 * cuModuleGetFunction finds kernels in cuda_emu_kernels.c by name.
 * Settings and the test-only counters: cuda_emu.h.
 *
 * Threads: one lock around everything; work runs in whichever thread
 * queries or synchronizes, under the lock. */
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "cuda_emu.h"
#include "cuda_emu_kernels.h"

#define EMU_EXPORT __attribute__((visibility("default")))
#define EMU_MAX_DEVICES 16
#define EMU_FATBIN_MAGIC 0xBA55ED50u
#define EMU_IPC_MAGIC 0x57435549u /* "IUCW": a handle this stand-in made */
#define EMU_QUARANTINE 64         /* freed device ranges kept reserved */
#define EMU_SHARED_BYTES 49152    /* dynamic shared memory per block without opt-in */
#define EMU_POISON 0xff           /* fresh memory: NaN as a float, -1 as an integer */

/* ---- errors: one list, names and messages ------------------------------------ */

#define EMU_ERRORS(X)                                                              \
  X(CUDA_SUCCESS, "no error")                                                      \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                  \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                     \
  X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported across the given devices") \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                            \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                              \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                    \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                           \
  X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                    \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                          \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                          \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                \
  X(CUDA_ERROR_NOT_READY, "device not ready")                                      \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")        \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch") \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                        \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                       \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                           \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped") \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

/* ---- state ------------------------------------------------------------------ */

/* When a queued operation is complete: shared by the operation, the events
 * recorded by it and the operations that wait for it. */
typedef struct emu_marker {
  int refs;
  bool done;
} emu_marker;

struct emu_stream;

/* A device's primary context (the only kind weft uses). */
struct CUctx_st {
  int device;
  int refs; /* retains not yet released; 0: inactive */
  bool active;
  CUresult sticky;           /* the first error of its work, answered by every later call */
  struct emu_stream *legacy; /* the NULL stream, CU_STREAM_LEGACY */
};

typedef enum {
  OP_HTOD,
  OP_DTOH,
  OP_DTOD,
  OP_MEMSET,
  OP_KERNEL,
  OP_RECORD,
  OP_WAIT,
  OP_WAIT_VALUE, /* cuStreamWaitValue32: ready once the word at dst meets value32 */
  OP_WRITE_VALUE /* cuStreamWriteValue32 */
} emu_op_kind;

typedef struct emu_op {
  emu_op_kind kind;
  struct emu_op *next; /* in its stream */
  emu_marker *done;
  emu_marker **deps; /* must be done before it runs (its stream's order aside) */
  int ndeps;
  CUdeviceptr dst, src; /* device addresses, checked when it runs */
  void *host;           /* HtoD's source, DtoH's destination */
  bool host_pinned;     /* it was pinned when queued: it must still be when it runs */
  size_t bytes;
  unsigned char value;
  uint32_t value32;         /* a stream memory operation's value, */
  unsigned int value_flags; /* and its flags (CU_STREAM_WAIT_VALUE_GEQ, ...) */
  const cuda_emu_kernel *kernel;
  double held_since; /* a kernel that holds its stream (holds): when it reached the head */
  cuda_emu_launch launch;
  unsigned char *args; /* the parameter values, copied at launch */
  void *argv[CUDA_EMU_MAX_PARAMS];
} emu_op;

/* Stream, event and module start with their context (a reset finds them). */
typedef struct emu_stream {
  struct CUctx_st *ctx;
  unsigned int flags;
  bool legacy;
  bool destroyed; /* its handle is gone; it lives on until its work ran */
  uint64_t handle;
  emu_op *head, *tail;
  struct emu_stream *next; /* every stream of the process */
} emu_stream;

typedef struct emu_event {
  struct CUctx_st *ctx;
  unsigned int flags;
  uint64_t handle;
  emu_marker *latest; /* the last record's; NULL: never recorded */
} emu_event;

typedef struct emu_module {
  struct CUctx_st *ctx;
  uint64_t handle;
} emu_module;

/* Device memory: cuMemAlloc's, or another process's opened by IPC. */
typedef struct emu_alloc {
  CUdeviceptr base;     /* the PROT_NONE mapping */
  size_t size, mapped;  /* asked for; mapped (whole pages) */
  unsigned char *alias; /* read-write, for copies and kernels only */
  int fd;
  uint64_t serial; /* per process: BUFFER_ID, and what an IPC handle names */
  struct CUctx_st *ctx;
  bool imported;
  bool exported;     /* cuIpcGetMemHandle gave a handle of it */
  bool vmm;          /* cuMemMap's: a mapping of a cuMemCreate handle, no legacy IPC handle */
  int opens;         /* imported: opens not yet closed */
  int32_t owner_pid; /* imported: the exporter and its serial */
  uint64_t owner_serial;
} emu_alloc;

typedef struct emu_host {
  unsigned char *ptr;
  size_t size, mapped; /* mapped 0: the caller's memory, registered (cuMemHostRegister) */
  struct CUctx_st *ctx;
} emu_host;

/* What a CUipcMemHandle holds. */
typedef struct emu_ipc_handle {
  uint32_t magic;
  int32_t pid, fd, device;
  uint64_t serial, size;
} emu_ipc_handle;
_Static_assert(sizeof(emu_ipc_handle) <= CU_IPC_HANDLE_SIZE, "an IPC handle is 64 bytes");

/* Handles: kind (8 bits), a kernel's index for functions (12), slot (20),
 * generation (24). A stale handle's generation no longer matches. */
enum { H_STREAM = 0x5a, H_EVENT = 0x5e, H_MODULE = 0x3d, H_FUNCTION = 0xf5 };
#define H_SLOT_BITS 20
#define H_GEN_MASK 0xffffffu

/* A dma-buf descriptor handed out, and the file it was: still open only
 * while fstat finds the same file behind the number. */
typedef struct emu_dmabuf {
  int fd;
  dev_t dev;
  ino_t ino;
} emu_dmabuf;

typedef struct emu_slot {
  uint32_t gen;
  uint8_t kind;
  void *obj;
} emu_slot;

static struct {
  pthread_mutex_t lock;
  bool asked;       /* cuInit was called */
  bool initialized; /* and succeeded */
  CUresult init_result;
  int devices;
  size_t memory; /* per device */
  size_t used[EMU_MAX_DEVICES];
  uint64_t rng;
  uint64_t serial;
  struct CUctx_st ctx[EMU_MAX_DEVICES];
  emu_stream *streams;
  emu_slot *slots;
  uint32_t nslots, slot_cap;
  uint32_t *free_slots;
  uint32_t nfree;
  emu_alloc **allocs;
  size_t nallocs, alloc_cap;
  emu_host *hosts;
  size_t nhosts, host_cap;
  struct {
    void *addr;
    size_t len;
  } quarantine[EMU_QUARANTINE];
  int quarantine_next;
  bool ipc_refused;    /* WEFT_CUDA_EMU_IPC=0: cuIpcOpenMemHandle answers as across GPUs without P2P */
  bool no_legacy_ipc;  /* WEFT_CUDA_EMU_LEGACY_IPC=0: memory as cuMemCreate's, without a legacy handle */
  bool no_dmabuf;      /* WEFT_CUDA_EMU_DMABUF=0: no dma-buf export, as a driver or kernel without it */
  emu_dmabuf *dmabufs; /* descriptors cuMemGetHandleForAddressRange handed out, maybe closed since */
  size_t ndmabufs, dmabuf_cap;
  const char *report;  /* WEFT_CUDA_EMU_REPORT: a file the counters are appended to at exit */
  long kernel_fault;   /* WEFT_CUDA_EMU_KERNEL_FAULT: the kernel run that faults (0: none) */
  long hang_s;         /* WEFT_CUDA_EMU_HANG_S: a synchronize stuck this long aborts */
  long kernels_run;
  weft_cuda_emu_counters counts;
} emu = {.lock = PTHREAD_MUTEX_INITIALIZER, .nslots = 1};

static volatile int emu_forked; /* this is a child forked after cuInit */
static __thread struct CUctx_st *emu_current;

static void emu_fork_prepare(void) {
  pthread_mutex_lock(&emu.lock);
}
static void emu_fork_parent(void) {
  pthread_mutex_unlock(&emu.lock);
}
static void emu_fork_child(void) {
  if (emu.asked) emu_forked = 1;
  pthread_mutex_unlock(&emu.lock);
}

__attribute__((constructor)) static void emu_load(void) {
  pthread_atfork(emu_fork_prepare, emu_fork_parent, emu_fork_child);
}

/* ---- entering and leaving ------------------------------------------------------ */

/* Every call that needs cuInit: the lock taken, or why not. */
static CUresult emu_enter(void) {
  if (emu_forked) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&emu.lock);
  if (!emu.initialized) {
    pthread_mutex_unlock(&emu.lock);
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  return CUDA_SUCCESS;
}

static CUresult emu_leave(CUresult r) {
  pthread_mutex_unlock(&emu.lock);
  return r;
}

/* The calling thread's context, for a call that needs one. */
static CUresult emu_need_ctx(struct CUctx_st **out) {
  struct CUctx_st *c = emu_current;
  if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
  if (c->sticky) return c->sticky;
  *out = c;
  return CUDA_SUCCESS;
}

static bool emu_device_valid(CUdevice dev) {
  return dev >= 0 && dev < emu.devices;
}

static uint64_t emu_random(void) {
  uint64_t x = emu.rng; /* xorshift64* */
  x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
  emu.rng = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static size_t emu_page_round(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (bytes + page - 1) / page * page;
}

/* ---- handles ------------------------------------------------------------------ */

static uint64_t handle_new(uint8_t kind, void *obj) {
  uint32_t i;
  if (emu.nfree) {
    i = emu.free_slots[--emu.nfree];
  } else {
    if (emu.nslots >= (1u << H_SLOT_BITS)) return 0;
    if (emu.nslots >= emu.slot_cap) {
      uint32_t cap = emu.slot_cap ? emu.slot_cap * 2 : 256;
      emu_slot *s = realloc(emu.slots, cap * sizeof *s);
      uint32_t *f = realloc(emu.free_slots, cap * sizeof *f);
      if (s) emu.slots = s;
      if (f) emu.free_slots = f;
      if (!s || !f) return 0;
      memset(emu.slots + emu.slot_cap, 0, (cap - emu.slot_cap) * sizeof *s);
      emu.slot_cap = cap;
    }
    i = emu.nslots++;
  }
  emu.slots[i].kind = kind;
  emu.slots[i].obj = obj;
  return (uint64_t)kind << 56 | (uint64_t)i << 24 | (emu.slots[i].gen & H_GEN_MASK);
}

static void *handle_get(uint8_t kind, uint64_t h) {
  uint32_t i = (uint32_t)(h >> 24) & ((1u << H_SLOT_BITS) - 1);
  if ((uint8_t)(h >> 56) != kind || !i || i >= emu.nslots) return NULL;
  emu_slot *s = &emu.slots[i];
  if (!s->obj || s->kind != kind || (s->gen & H_GEN_MASK) != (h & H_GEN_MASK)) return NULL;
  return s->obj;
}

static void handle_free(uint64_t h) {
  uint32_t i = (uint32_t)(h >> 24) & ((1u << H_SLOT_BITS) - 1);
  emu.slots[i].obj = NULL;
  emu.slots[i].gen++;
  emu.free_slots[emu.nfree++] = i;
}

/* ---- markers and the queues ------------------------------------------------------ */

static emu_marker *marker_new(void) {
  emu_marker *m = calloc(1, sizeof *m);
  if (m) m->refs = 1;
  return m;
}

static void marker_put(emu_marker *m) {
  if (m && --m->refs == 0) free(m);
}

static emu_stream *stream_new(struct CUctx_st *ctx, unsigned int flags, bool legacy) {
  emu_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->ctx = ctx;
  s->flags = flags;
  s->legacy = legacy;
  s->next = emu.streams;
  emu.streams = s;
  return s;
}

static void stream_unlink_free(emu_stream *s) {
  for (emu_stream **p = &emu.streams; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  free(s);
}

static emu_op *op_new(emu_op_kind kind) {
  emu_op *op = calloc(1, sizeof *op);
  if (!op) return NULL;
  op->kind = kind;
  if (!(op->done = marker_new())) {
    free(op);
    return NULL;
  }
  return op;
}

static void op_free(emu_op *op) {
  marker_put(op->done);
  for (int i = 0; i < op->ndeps; i++) marker_put(op->deps[i]);
  free(op->deps);
  free(op->args);
  free(op);
}

static bool op_add_dep(emu_op *op, emu_marker *m) {
  if (!m || m->done) return true;
  emu_marker **d = realloc(op->deps, (size_t)(op->ndeps + 1) * sizeof *d);
  if (!d) return false;
  op->deps = d;
  m->refs++;
  op->deps[op->ndeps++] = m;
  return true;
}

/* Queues `op` on `s` (or frees it: CUDA_ERROR_OUT_OF_MEMORY). The legacy
 * stream waits for the work queued before on the context's blocking
 * streams, and they wait for its. */
static CUresult op_enqueue(emu_stream *s, emu_op *op) {
  bool ok = true;
  if (s->legacy) {
    for (emu_stream *t = emu.streams; t && ok; t = t->next)
      if (t->ctx == s->ctx && !t->legacy && !(t->flags & CU_STREAM_NON_BLOCKING) && t->tail)
        ok = op_add_dep(op, t->tail->done);
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && s->ctx->legacy->tail) {
    ok = op_add_dep(op, s->ctx->legacy->tail->done);
  }
  if (!ok) {
    op_free(op);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  emu.counts.pending++;
  return CUDA_SUCCESS;
}

/* The head of `s` is done (or dropped): waiters may go on. */
static void op_retire(emu_stream *s) {
  emu_op *op = s->head;
  s->head = op->next;
  if (!s->head) s->tail = NULL;
  op->done->done = true;
  op_free(op);
  emu.counts.pending--;
}

static emu_alloc *alloc_find(CUdeviceptr ptr);
static emu_host *host_find(const void *ptr);

/* The word a stream memory operation reads or writes: device memory (at its
 * alias) or pinned host memory; NULL when it is neither any more. */
static volatile uint32_t *value_word(CUdeviceptr addr) {
  emu_alloc *a = alloc_find(addr);
  if (a) return addr - a->base <= a->size - 4 ? (volatile uint32_t *)(a->alias + (addr - a->base)) : NULL;
  emu_host *h = host_find((const void *)(uintptr_t)addr);
  if (h && addr - (uintptr_t)h->ptr <= h->size - 4) return (volatile uint32_t *)(uintptr_t)addr;
  return NULL;
}

/* Whether a cuStreamWaitValue32 is met (the driver's four conditions). */
static bool wait_value_met(const emu_op *op) {
  volatile uint32_t *w = value_word(op->dst);
  if (!w) return true; /* the memory is gone: op_execute fails the context */
  uint32_t v = *w;
  switch (op->value_flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(v - op->value32) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == op->value32;
    case CU_STREAM_WAIT_VALUE_AND: return (v & op->value32) != 0;
    case CU_STREAM_WAIT_VALUE_NOR: return ~(v | op->value32) != 0;
  }
  return true;
}

static double emu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Asked of the head of a stream only: a holding kernel's time starts the
 * first time it is asked with its dependencies done. */
static bool op_ready(emu_op *op) {
  for (int i = 0; i < op->ndeps; i++)
    if (!op->deps[i]->done) return false;
  if (op->kind == OP_KERNEL && op->kernel->holds) {
    double now = emu_now();
    if (!op->held_since) op->held_since = now;
    return now - op->held_since >= *(double *)op->argv[0];
  }
  return op->kind != OP_WAIT_VALUE || wait_value_met(op);
}

/* ---- memory lookups --------------------------------------------------------------- */

static emu_alloc *alloc_find(CUdeviceptr ptr) {
  for (size_t i = 0; i < emu.nallocs; i++) {
    emu_alloc *a = emu.allocs[i];
    if (ptr >= a->base && ptr - a->base < a->size) return a;
  }
  return NULL;
}

static emu_host *host_find(const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  for (size_t i = 0; i < emu.nhosts; i++) {
    uintptr_t b = (uintptr_t)emu.hosts[i].ptr;
    if (p >= b && p - b < emu.hosts[i].size) return &emu.hosts[i];
  }
  return NULL;
}

/* Whether [p, p + bytes) touches a device mapping (live or quarantined):
 * the stand-in must not read or write it as host memory, it would fault. */
static bool host_range_is_device(const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
  for (size_t i = 0; i < emu.nallocs; i++) {
    uintptr_t b = emu.allocs[i]->base;
    if (lo < b + emu.allocs[i]->mapped && b < hi) return true;
  }
  for (int i = 0; i < EMU_QUARANTINE; i++) {
    uintptr_t b = (uintptr_t)emu.quarantine[i].addr;
    if (b && lo < b + emu.quarantine[i].len && b < hi) return true;
  }
  return false;
}

/* Where the stand-in reads or writes [ptr, ptr + bytes) of device-visible
 * memory when work of `ctx` runs; NULL: an illegal address. A kernel
 * reaches only its own device's memory, peer memory opened by IPC (peer
 * access enabled lazily) and pinned host memory; a copy reaches any. */
static void *emu_span(const struct CUctx_st *ctx, CUdeviceptr ptr, size_t bytes, bool kernel) {
  emu_alloc *a = alloc_find(ptr);
  if (a) {
    if (bytes > a->size - (ptr - a->base)) return NULL;
    if (kernel && !a->imported && a->ctx->device != ctx->device) return NULL;
    return a->alias + (ptr - a->base);
  }
  emu_host *h = host_find((const void *)(uintptr_t)ptr);
  if (h && bytes <= h->size - ((uintptr_t)ptr - (uintptr_t)h->ptr)) return (void *)(uintptr_t)ptr;
  return NULL;
}

void *cuda_emu_span(const cuda_emu_launch *launch, CUdeviceptr ptr, size_t bytes) {
  return emu_span(launch->ctx, ptr, bytes, true);
}

/* ---- running queued work ------------------------------------------------------------ */

static void stream_drop_work(emu_stream *s) {
  while (s->head) op_retire(s);
}

/* The sticky error: the context's queued work is dropped (waiters of other
 * contexts go on), its later calls answer `r`. */
static void ctx_fail(struct CUctx_st *ctx, CUresult r) {
  if (!ctx->sticky) ctx->sticky = r;
  emu_stream *next;
  for (emu_stream *s = emu.streams; s; s = next) {
    next = s->next;
    if (s->ctx != ctx) continue;
    stream_drop_work(s);
    if (s->destroyed) stream_unlink_free(s);
  }
}

/* Pinned host memory a copy was queued with and that was freed since: the
 * stand-in must not touch it (a GPU's copy engine would fault on it). */
static bool host_gone(const emu_op *op) {
  if (!op->host_pinned) return false;
  emu_host *h = host_find(op->host);
  return !h || op->bytes > h->size - ((uintptr_t)op->host - (uintptr_t)h->ptr);
}

static CUresult op_execute(const emu_stream *s, emu_op *op) {
  if (!op->bytes && op->kind <= OP_MEMSET) return CUDA_SUCCESS;
  void *d, *src;
  if (host_gone(op)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  switch (op->kind) {
    case OP_HTOD:
      if (!(d = emu_span(s->ctx, op->dst, op->bytes, false))) return CUDA_ERROR_ILLEGAL_ADDRESS;
      memcpy(d, op->host, op->bytes);
      emu.counts.htod_bytes += (long long)op->bytes;
      return CUDA_SUCCESS;
    case OP_DTOH:
      if (!(src = emu_span(s->ctx, op->src, op->bytes, false))) return CUDA_ERROR_ILLEGAL_ADDRESS;
      memcpy(op->host, src, op->bytes);
      emu.counts.dtoh_bytes += (long long)op->bytes;
      return CUDA_SUCCESS;
    case OP_DTOD:
      if (!(d = emu_span(s->ctx, op->dst, op->bytes, false)) ||
          !(src = emu_span(s->ctx, op->src, op->bytes, false)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      memmove(d, src, op->bytes);
      return CUDA_SUCCESS;
    case OP_MEMSET:
      if (!(d = emu_span(s->ctx, op->dst, op->bytes, false))) return CUDA_ERROR_ILLEGAL_ADDRESS;
      memset(d, op->value, op->bytes);
      return CUDA_SUCCESS;
    case OP_KERNEL:
      if (emu.kernel_fault && ++emu.kernels_run == emu.kernel_fault)
        return CUDA_ERROR_ILLEGAL_ADDRESS; /* injected (WEFT_CUDA_EMU_KERNEL_FAULT) */
      return op->kernel->run(&op->launch, op->argv);
    case OP_RECORD: /* its marker is the event's: done when retired */
    case OP_WAIT: /* its dependency held it until now */ return CUDA_SUCCESS;
    case OP_WAIT_VALUE: /* its word held it until now, or was freed meanwhile */
      return value_word(op->dst) ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
    case OP_WRITE_VALUE: {
      volatile uint32_t *w = value_word(op->dst);
      if (!w) return CUDA_ERROR_ILLEGAL_ADDRESS;
      *w = op->value32;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_UNKNOWN;
}

/* Runs one ready operation of any stream, chosen at random; false when
 * none is ready. Something is ready whenever anything is queued, but for a
 * cuStreamWaitValue32 whose word is not written yet: its writer may be
 * work another thread has still to queue (emu_drive). */
static bool emu_step(void) {
  int ready = 0;
  for (emu_stream *s = emu.streams; s; s = s->next)
    if (s->head && op_ready(s->head)) ready++;
  if (!ready) return false;
  int pick = (int)(emu_random() % (uint64_t)ready);
  emu_stream *s = emu.streams;
  for (;; s = s->next)
    if (s->head && op_ready(s->head) && pick-- == 0) break;
  CUresult r = op_execute(s, s->head);
  op_retire(s);
  if (r != CUDA_SUCCESS)
    ctx_fail(s->ctx, r); /* frees `s` if it was destroyed */
  else if (s->destroyed && !s->head)
    stream_unlink_free(s);
  return true;
}

/* Runs work until done(arg) holds, for a synchronize. Where nothing is
 * ready (a stream waits for a value another thread will have written), the
 * lock is let go a while; where nothing moved for WEFT_CUDA_EMU_HANG_S
 * seconds, the process aborts naming `call` and every stuck wait: a GPU
 * would hang there for good, and a test must fail, not hang. */
static void emu_drive(bool (*done)(const void *arg), const void *arg, const char *call) {
  unsigned stalled_ms = 0;
  while (!done(arg)) {
    if (emu_step()) {
      stalled_ms = 0;
      continue;
    }
    if (stalled_ms >= (unsigned long)emu.hang_s * 1000) {
      fprintf(stderr, "cuda stand-in: %s: stuck for %ld s: queued work can never run:\n", call,
              emu.hang_s);
      for (emu_stream *s = emu.streams; s; s = s->next)
        if (s->head && s->head->kind == OP_WAIT_VALUE && op_ready(s->head) == false) {
          volatile uint32_t *w = value_word(s->head->dst);
          fprintf(stderr, "  a stream of device %d: cuStreamWaitValue32 at %#llx for %u (flags %#x); "
                  "the word holds %u\n", s->ctx->device, (unsigned long long)s->head->dst,
                  s->head->value32, s->head->value_flags, w ? *w : 0u);
        }
      abort();
    }
    pthread_mutex_unlock(&emu.lock);
    usleep(1000);
    pthread_mutex_lock(&emu.lock);
    stalled_ms++;
  }
}

/* What a query lets the "device" do meanwhile: 0, 1 or 2 operations. */
static void emu_progress(void) {
  for (int n = (int)(emu_random() % 3); n > 0; n--) emu_step();
}

static bool ctx_idle(const struct CUctx_st *ctx) {
  for (emu_stream *s = emu.streams; s; s = s->next)
    if (s->ctx == ctx && s->head) return false;
  return true;
}

/* What the synchronizes wait for (emu_drive): done, or the context failed. */
static bool ctx_synced(const void *arg) {
  const struct CUctx_st *ctx = arg;
  return ctx->sticky || ctx_idle(ctx);
}
static bool stream_synced(const void *arg) {
  const emu_stream *s = arg;
  return s->ctx->sticky || !s->head;
}
static bool event_synced(const void *arg) {
  const emu_event *e = arg;
  return e->ctx->sticky || !e->latest || e->latest->done;
}

/* ---- memory ------------------------------------------------------------------------- */

static bool alloc_register(emu_alloc *a) {
  if (emu.nallocs == emu.alloc_cap) {
    size_t cap = emu.alloc_cap ? emu.alloc_cap * 2 : 64;
    emu_alloc **p = realloc(emu.allocs, cap * sizeof *p);
    if (!p) return false;
    emu.allocs = p;
    emu.alloc_cap = cap;
  }
  emu.allocs[emu.nallocs++] = a;
  return true;
}

/* Maps `fd` as a device range: PROT_NONE where the caller sees it, read-write
 * at the alias. */
static bool alloc_map(emu_alloc *a) {
  void *dev = mmap(NULL, a->mapped, PROT_NONE, MAP_SHARED, a->fd, 0);
  if (dev == MAP_FAILED) return false;
  void *alias = mmap(NULL, a->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  if (alias == MAP_FAILED) {
    munmap(dev, a->mapped);
    return false;
  }
  a->base = (CUdeviceptr)(uintptr_t)dev;
  a->alias = alias;
  return true;
}

/* Unmaps and forgets `a`. Its device range stays reserved (PROT_NONE,
 * nothing behind it) until EMU_QUARANTINE later frees, so a late use
 * faults or is an illegal address, not a write into a newer buffer. */
static void alloc_release(emu_alloc *a) {
  for (size_t i = 0; i < emu.nallocs; i++)
    if (emu.allocs[i] == a) {
      emu.allocs[i] = emu.allocs[--emu.nallocs];
      break;
    }
  void *dev = (void *)(uintptr_t)a->base;
  if (mmap(dev, a->mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
           0) == MAP_FAILED) {
    munmap(dev, a->mapped);
  } else {
    int q = emu.quarantine_next;
    emu.quarantine_next = (q + 1) % EMU_QUARANTINE;
    if (emu.quarantine[q].addr) munmap(emu.quarantine[q].addr, emu.quarantine[q].len);
    emu.quarantine[q].addr = dev;
    emu.quarantine[q].len = a->mapped;
  }
  munmap(a->alias, a->mapped);
  close(a->fd);
  if (!a->imported) emu.used[a->ctx->device] -= a->mapped;
  free(a);
}

static void host_release(size_t i) {
  if (emu.hosts[i].mapped) munmap(emu.hosts[i].ptr, emu.hosts[i].mapped);
  emu.hosts[i] = emu.hosts[--emu.nhosts];
}

/* ---- contexts ------------------------------------------------------------------------ */

/* The last release of a primary context: its work is dropped and whatever
 * its owners left (streams, events, modules, memory) freed, counted in
 * `reclaimed`; its sticky error is gone. */
static void ctx_reset(struct CUctx_st *ctx) {
  emu_stream *next;
  for (emu_stream *s = emu.streams; s; s = next) {
    next = s->next;
    if (s->ctx != ctx) continue;
    stream_drop_work(s);
    if (s->destroyed || s->legacy) stream_unlink_free(s);
  }
  for (uint32_t i = 1; i < emu.nslots; i++) {
    emu_slot *sl = &emu.slots[i];
    if (!sl->obj || sl->kind == H_FUNCTION || *(struct CUctx_st **)sl->obj != ctx) continue;
    uint64_t h = (uint64_t)sl->kind << 56 | (uint64_t)i << 24 | (sl->gen & H_GEN_MASK);
    emu.counts.reclaimed++;
    if (sl->kind == H_STREAM) {
      emu.counts.streams--;
      stream_unlink_free(sl->obj);
    } else if (sl->kind == H_EVENT) {
      emu.counts.events--;
      marker_put(((emu_event *)sl->obj)->latest);
      free(sl->obj);
    } else {
      emu.counts.modules--;
      free(sl->obj);
    }
    handle_free(h);
  }
  for (size_t i = emu.nallocs; i-- > 0;) {
    emu_alloc *a = emu.allocs[i];
    if (a->ctx != ctx || a->vmm) continue; /* cuMemMap's mappings belong to no context */
    emu.counts.reclaimed++;
    if (a->imported)
      emu.counts.ipc_mappings -= a->opens;
    else
      emu.counts.allocations--;
    alloc_release(a);
  }
  for (size_t i = emu.nhosts; i-- > 0;)
    if (emu.hosts[i].ctx == ctx) {
      emu.counts.reclaimed++;
      emu.counts.host_allocations--;
      host_release(i);
    }
  ctx->legacy = NULL;
  ctx->active = false;
  ctx->sticky = CUDA_SUCCESS;
}

/* ---- the driver, devices, contexts ------------------------------------------------------- */

static long emu_env_long(const char *name, long fallback, long lo, long hi) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end;
  long n = strtol(v, &end, 0);
  if (*end || n < lo) return fallback;
  return n > hi ? hi : n;
}

/* ---- dma-buf descriptors handed out ------------------------------------------------------ */

static bool dmabuf_still_open(const emu_dmabuf *d) {
  struct stat st;
  return fstat(d->fd, &st) == 0 && st.st_dev == d->dev && st.st_ino == d->ino;
}

/* Forgets the descriptors closed since (a number reused for another file
 * is not the same one); how many are left open. */
static int dmabuf_count_open(void) {
  size_t n = 0;
  for (size_t i = 0; i < emu.ndmabufs; i++)
    if (dmabuf_still_open(&emu.dmabufs[i])) emu.dmabufs[n++] = emu.dmabufs[i];
  emu.ndmabufs = n;
  return (int)n;
}

/* Remembers `fd` (just opened, of file `st`); false when out of memory. An
 * entry of the same number is stale: that descriptor was closed, or the
 * number could not have been handed out again. */
static bool dmabuf_track(int fd, const struct stat *st) {
  size_t n = 0;
  for (size_t i = 0; i < emu.ndmabufs; i++)
    if (emu.dmabufs[i].fd != fd && dmabuf_still_open(&emu.dmabufs[i]))
      emu.dmabufs[n++] = emu.dmabufs[i];
  emu.ndmabufs = n;
  if (emu.ndmabufs == emu.dmabuf_cap) {
    size_t cap = emu.dmabuf_cap ? emu.dmabuf_cap * 2 : 16;
    emu_dmabuf *p = realloc(emu.dmabufs, cap * sizeof *p);
    if (!p) return false;
    emu.dmabufs = p;
    emu.dmabuf_cap = cap;
  }
  emu.dmabufs[emu.ndmabufs++] = (emu_dmabuf){.fd = fd, .dev = st->st_dev, .ino = st->st_ino};
  return true;
}

/* At exit: one line of this process's counters (WEFT_CUDA_EMU_REPORT), so a
 * script can see which path ran and what was left open. */
static void emu_report(void) {
  FILE *f = fopen(emu.report, "a");
  if (!f) return;
  emu.counts.dmabuf_open = dmabuf_count_open();
  fprintf(f, "pid %d ipc_opened %d ipc_exported %d ipc_mappings %d allocations %d host_allocations %d "
          "primary_refs %d dmabuf_exported %d dmabuf_open %d htod_bytes %lld dtoh_bytes %lld\n",
          (int)getpid(), emu.counts.ipc_opened, emu.counts.ipc_exported, emu.counts.ipc_mappings,
          emu.counts.allocations, emu.counts.host_allocations, emu.counts.primary_refs,
          emu.counts.dmabuf_exported, emu.counts.dmabuf_open, emu.counts.htod_bytes,
          emu.counts.dtoh_bytes);
  fclose(f);
}

EMU_EXPORT CUresult CUDAAPI cuInit(unsigned int flags) {
  if (emu_forked) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&emu.lock);
  if (!emu.asked) {
    emu.asked = true;
    emu.devices = (int)emu_env_long("WEFT_CUDA_EMU_DEVICES", 1, 0, EMU_MAX_DEVICES);
    emu.memory = (size_t)emu_env_long("WEFT_CUDA_EMU_MEMORY", 4L << 30, 1, LONG_MAX);
    emu.rng = (uint64_t)emu_env_long("WEFT_CUDA_EMU_SEED", 1, 0, LONG_MAX) * 2 + 1;
    emu.ipc_refused = emu_env_long("WEFT_CUDA_EMU_IPC", 1, 0, 1) == 0;
    emu.no_legacy_ipc = emu_env_long("WEFT_CUDA_EMU_LEGACY_IPC", 1, 0, 1) == 0;
    emu.no_dmabuf = emu_env_long("WEFT_CUDA_EMU_DMABUF", 1, 0, 1) == 0;
    emu.report = getenv("WEFT_CUDA_EMU_REPORT");
    long fault_rank = emu_env_long("WEFT_CUDA_EMU_FAULT_RANK", -1, -1, INT_MAX);
    if (fault_rank < 0 || fault_rank == emu_env_long("WEFT_RANK", -1, -1, INT_MAX))
      emu.kernel_fault = emu_env_long("WEFT_CUDA_EMU_KERNEL_FAULT", 0, 0, LONG_MAX);
    if (emu.report && *emu.report) atexit(emu_report);
    emu.hang_s = emu_env_long("WEFT_CUDA_EMU_HANG_S", 60, 1, 100000);
    for (int i = 0; i < EMU_MAX_DEVICES; i++) emu.ctx[i].device = i;
    emu.init_result = emu.devices ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
    emu.initialized = emu.devices > 0;
  }
  return emu_leave(emu.init_result);
}

EMU_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

#define EMU_ERROR_NAME(code, text) \
  case code:                       \
    *str = #code;                  \
    return CUDA_SUCCESS;
#define EMU_ERROR_TEXT(code, text) \
  case code: *str = text; return CUDA_SUCCESS;

EMU_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  switch (error) { EMU_ERRORS(EMU_ERROR_NAME) default : break; }
  *str = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

EMU_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  switch (error) { EMU_ERRORS(EMU_ERROR_TEXT) default : break; }
  *str = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

EMU_EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count) {
  if (emu_forked) return CUDA_ERROR_NOT_INITIALIZED;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&emu.lock);
  CUresult r = CUDA_SUCCESS;
  if (emu.initialized || emu.init_result == CUDA_ERROR_NO_DEVICE)
    *count = emu.devices; /* 0 after cuInit found none */
  else
    r = CUDA_ERROR_NOT_INITIALIZED;
  return emu_leave(r);
}

EMU_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!device) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (!emu_device_valid(ordinal)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!emu_device_valid(dev)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  if (!name || len <= 0) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  snprintf(name, (size_t)len, "weft emulated GPU %d", dev);
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!emu_device_valid(dev)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  if (!id || len <= 0) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  snprintf(id, (size_t)len, "0000:%02x:00.0", dev);
  return emu_leave(CUDA_SUCCESS);
}

/* A Hopper-like device: what a kernel's launch limits are checked against.
 * An attribute not listed is refused, not invented. */
static bool emu_attribute(CUdevice_attribute attr, CUdevice dev, int *value) {
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = EMU_SHARED_BYTES; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *value = EMU_SHARED_BYTES;
      return true;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1755000; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 2619000; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 5120; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 50331648; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 4; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *value = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = 233472; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *value = dev; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *value = 2; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *value = CU_COMPUTEMODE_DEFAULT; return true;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *value = 0; return true;
    /* GPUDirect RDMA: cuMemAlloc memory exported as a dma-buf (not with
     * WEFT_CUDA_EMU_DMABUF=0); no cuFlushGPUDirectRDMAWrites, and remote
     * writes are not promised in order to the owner (ORDERING_NONE): a NIC's
     * writes are seen after an RDMA read flush. Not cuMemCreate memory, not
     * pinned host memory. */
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *value = !emu.no_dmabuf; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING:
      *value = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
      return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED: *value = 0; return true;
    /* not emulated: managed memory, pageable access, VMM, memory pools,
     * priorities */
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: *value = 0; return true;
    default: return false;
  }
}

EMU_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *value, CUdevice_attribute attr,
                                                 CUdevice dev) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!emu_device_valid(dev)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  if (!value || !emu_attribute(attr, dev, value)) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  return emu_leave(CUDA_SUCCESS);
}

/* Every pair of emulated devices can reach each other (an NVLink box);
 * a device is not its own peer. */
EMU_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!emu_device_valid(dev) || !emu_device_valid(peer))
    return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  if (!can) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  *can = dev != peer;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!emu_device_valid(dev)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  if (!pctx) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  struct CUctx_st *c = &emu.ctx[dev];
  if (!c->active) {
    if (!(c->legacy = stream_new(c, CU_STREAM_DEFAULT, true)))
      return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
    c->active = true;
    c->sticky = CUDA_SUCCESS;
  }
  c->refs++;
  emu.counts.primary_refs++;
  *pctx = c;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!emu_device_valid(dev)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  struct CUctx_st *c = &emu.ctx[dev];
  if (!c->refs) return emu_leave(CUDA_ERROR_INVALID_CONTEXT);
  emu.counts.primary_refs--;
  if (--c->refs == 0) ctx_reset(c);
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!pctx) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  *pctx = emu_current;
  return emu_leave(CUDA_SUCCESS);
}

/* Contexts of the process's own (cuCtxCreate), beside the primary ones: a
 * legacy stream each, their own streams, events and memory. weft works in
 * primary contexts (the runtime API's, PyTorch's) and must never take one
 * of these for a device's. */
#define EMU_CREATED_CTX 16
static struct CUctx_st *emu_created[EMU_CREATED_CTX];

static bool ctx_known(const struct CUctx_st *ctx) {
  for (int i = 0; i < emu.devices; i++)
    if (ctx == &emu.ctx[i]) return true;
  for (int i = 0; i < EMU_CREATED_CTX; i++)
    if (ctx == emu_created[i]) return true;
  return false;
}

EMU_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  CUresult r = emu_enter();
  if (r) return r;
  if (ctx && (!ctx_known(ctx) || !ctx->active)) return emu_leave(CUDA_ERROR_INVALID_CONTEXT);
  emu_current = ctx;
  return emu_leave(CUDA_SUCCESS);
}

/* CUDA 13's cuCtxCreate (cuCtxCreate_v4): a new context on `dev`, made
 * current on this thread. */
EMU_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                           CUdevice dev) {
  (void)params, (void)flags;
  CUresult r = emu_enter();
  if (r) return r;
  if (!pctx) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (!emu_device_valid(dev)) return emu_leave(CUDA_ERROR_INVALID_DEVICE);
  int slot = -1;
  for (int i = 0; i < EMU_CREATED_CTX && slot < 0; i++)
    if (!emu_created[i]) slot = i;
  struct CUctx_st *c = slot < 0 ? NULL : calloc(1, sizeof *c);
  if (!c) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  c->device = dev;
  c->refs = 1;
  if (!(c->legacy = stream_new(c, CU_STREAM_DEFAULT, true))) {
    free(c);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  c->active = true;
  emu_created[slot] = c;
  emu_current = c;
  *pctx = c;
  return emu_leave(CUDA_SUCCESS);
}

/* Its work dropped and what it owns freed, as a primary context's last release. */
EMU_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  CUresult r = emu_enter();
  if (r) return r;
  for (int i = 0; i < EMU_CREATED_CTX; i++)
    if (ctx && emu_created[i] == ctx) {
      ctx_reset(ctx);
      emu_created[i] = NULL;
      if (emu_current == ctx) emu_current = NULL;
      free(ctx);
      return emu_leave(CUDA_SUCCESS);
    }
  return emu_leave(CUDA_ERROR_INVALID_CONTEXT);
}

/* Not in weft's table; for tests: all work of the current context. */
EMU_EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_drive(ctx_synced, ctx, "cuCtxSynchronize");
  return emu_leave(ctx->sticky);
}

/* ---- what a pointer is ---------------------------------------------------------------- */

EMU_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs,
                                                   void **data, CUdeviceptr ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!n || !attrs || !data) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_alloc *a = alloc_find(ptr);
  emu_host *h = a ? NULL : host_find((const void *)(uintptr_t)ptr);
  struct CUctx_st *ctx = a ? a->ctx : h ? h->ctx : NULL;
  for (unsigned int i = 0; i < n; i++) {
    void *d = data[i];
    if (!d) return emu_leave(CUDA_ERROR_INVALID_VALUE);
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        /* 0 for memory the driver does not know (pageable host memory) */
        *(unsigned int *)d = a ? CU_MEMORYTYPE_DEVICE : h ? CU_MEMORYTYPE_HOST : 0;
        break;
      case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)d = ctx; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)d = ctx ? ctx->device : -2; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)d = a || h ? ptr : 0; break;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)d = h ? (void *)(uintptr_t)ptr : NULL;
        break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)d = 0; break;
      case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)d = a || h; break;
      case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(unsigned int *)d = a && !a->imported && !a->vmm && !emu.no_legacy_ipc;
        break;
      case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)d = a ? a->serial : 0; break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)d = a ? a->base : h ? (CUdeviceptr)(uintptr_t)h->ptr : 0;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)d = a ? a->size : h ? h->size : 0; break;
      default: return emu_leave(CUDA_ERROR_INVALID_VALUE);
    }
  }
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_alloc *a = alloc_find(ptr);
  if (!a) return emu_leave(CUDA_ERROR_NOT_FOUND);
  if (base) *base = a->base;
  if (size) *size = a->size;
  return emu_leave(CUDA_SUCCESS);
}

/* ---- memory ------------------------------------------------------------------------- */

EMU_EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytes) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  if (!dptr || !bytes) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  size_t mapped = emu_page_round(bytes);
  if (mapped < bytes || mapped > emu.memory - emu.used[ctx->device])
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  emu_alloc *a = calloc(1, sizeof *a);
  if (!a) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  a->size = bytes;
  a->mapped = mapped;
  a->ctx = ctx;
  a->serial = ++emu.serial;
  char name[64];
  snprintf(name, sizeof name, "weft-cuda-emu:%d:%llu", (int)getpid(),
           (unsigned long long)a->serial);
  a->fd = memfd_create(name, MFD_CLOEXEC);
  if (a->fd < 0 || ftruncate(a->fd, (off_t)mapped) != 0 || !alloc_map(a)) {
    if (a->fd >= 0) close(a->fd);
    free(a);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  if (!alloc_register(a)) {
    munmap((void *)(uintptr_t)a->base, mapped);
    munmap(a->alias, mapped);
    close(a->fd);
    free(a);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  memset(a->alias, EMU_POISON, mapped); /* cuMemAlloc does not clear memory */
  emu.used[ctx->device] += mapped;
  emu.counts.allocations++;
  *dptr = a->base;
  return emu_leave(CUDA_SUCCESS);
}

/* Whether a process that opened this exported allocation still has it
 * open: its shared lock on the memfd (taken at cuIpcOpenMemHandle, gone with
 * the descriptor at cuIpcCloseMemHandle or its exit) keeps ours out. */
static bool exported_still_open(emu_alloc *a) {
  if (flock(a->fd, LOCK_EX | LOCK_NB) == 0) {
    flock(a->fd, LOCK_UN);
    return false;
  }
  return errno == EWOULDBLOCK;
}

EMU_EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_alloc *a = alloc_find(ptr);
  /* an inner address, a buffer opened by IPC, or not ours */
  if (!a || a->base != ptr || a->imported || a->vmm) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (a->ctx->sticky) return emu_leave(a->ctx->sticky);
  if (a->exported && exported_still_open(a)) {
    /* undefined on a GPU (cuIpcOpenMemHandle's documentation): the
     * importer's kernels may read or write memory handed out again */
    fprintf(stderr,
            "cuda stand-in: cuMemFree: %zu bytes at %#llx, exported by cuIpcGetMemHandle, freed "
            "while another process still has them open (cuIpcOpenMemHandle without "
            "cuIpcCloseMemHandle): undefined behaviour on a GPU\n",
            a->size, (unsigned long long)a->base);
    abort();
  }
  /* No wait for queued work: what still uses it fails when it runs. */
  emu.counts.allocations--;
  alloc_release(a);
  return emu_leave(CUDA_SUCCESS);
}

/* A dma-buf of device memory, for a NIC to reach it (GPUDirect RDMA): a
 * fresh open of the allocation's memfd, whose byte 0 is `dptr`. The
 * stand-in's limits (the header comment): the base of a cuMemAlloc
 * allocation only, whole pages, flags 0; cuMemCreate memory and pinned host
 * memory are not exported (CUDA_ERROR_NOT_SUPPORTED), nor anything with
 * WEFT_CUDA_EMU_DMABUF=0. */
EMU_EXPORT CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                          CUmemRangeHandleType handleType,
                                                          unsigned long long flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  if (!handle || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (emu.no_dmabuf) return emu_leave(CUDA_ERROR_NOT_SUPPORTED);
  emu_alloc *a = alloc_find(dptr);
  if (a && a->vmm) return emu_leave(CUDA_ERROR_NOT_SUPPORTED); /* not made gpuDirectRDMACapable */
  if (!a) {
    emu_host *h = host_find((const void *)(uintptr_t)dptr);
    if (h && h->mapped) return emu_leave(CUDA_ERROR_NOT_SUPPORTED); /* HOST_ALLOC_DMA_BUF_SUPPORTED 0 */
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (!a || a->imported || a->base != dptr || flags || !size || size % page || size > a->mapped)
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", a->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY); /* out of descriptors */
  struct stat st;
  if (fstat(fd, &st) != 0 || !dmabuf_track(fd, &st)) {
    close(fd);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  *(int *)handle = fd;
  emu.counts.dmabuf_exported++;
  return emu_leave(CUDA_SUCCESS);
}

/* ---- virtual memory management (cuMemCreate and cuMemMap) --------------------------------
 *
 * What PyTorch's expandable segments and cudaMallocAsync pools use: a range
 * of addresses reserved, physical memory created apart (a handle), mapped
 * into the range, access granted. Such memory has no legacy IPC handle
 * (IS_LEGACY_CUDA_IPC_CAPABLE 0, cuIpcGetMemHandle refuses), and its
 * addresses are handed out again when a chunk is unmapped and another
 * mapped in its place. A reservation is a PROT_NONE mapping; a handle a
 * memfd; each cuMemMap an allocation of its own (alloc_find's), at the
 * reserved address. */

#define EMU_VMM_MAX 256
static struct {
  uintptr_t base;
  size_t size;
} emu_reservations[EMU_VMM_MAX];

typedef struct emu_vmm_handle {
  int fd;
  size_t size;
  int device;
  uint64_t serial;
} emu_vmm_handle;

static bool vmm_reserved(uintptr_t p, size_t size) {
  for (int i = 0; i < EMU_VMM_MAX; i++)
    if (emu_reservations[i].size && p >= emu_reservations[i].base &&
        p + size <= emu_reservations[i].base + emu_reservations[i].size && p + size >= p)
      return true;
  return false;
}

EMU_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                          CUmemAllocationGranularity_flags option) {
  (void)option;
  if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
  *granularity = (size_t)sysconf(_SC_PAGESIZE);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                unsigned long long flags) {
  (void)alignment, (void)addr, (void)flags;
  CUresult r = emu_enter();
  if (r) return r;
  if (!ptr || !size || size % (size_t)sysconf(_SC_PAGESIZE)) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  int slot = -1;
  for (int i = 0; i < EMU_VMM_MAX && slot < 0; i++)
    if (!emu_reservations[i].size) slot = i;
  if (slot < 0) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  emu_reservations[slot].base = (uintptr_t)p;
  emu_reservations[slot].size = size;
  *ptr = (CUdeviceptr)(uintptr_t)p;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  CUresult r = emu_enter();
  if (r) return r;
  for (int i = 0; i < EMU_VMM_MAX; i++)
    if (emu_reservations[i].size && emu_reservations[i].base == ptr && emu_reservations[i].size == size) {
      for (size_t k = 0; k < emu.nallocs; k++)
        if (emu.allocs[k]->vmm && vmm_reserved(emu.allocs[k]->base, emu.allocs[k]->size) &&
            emu.allocs[k]->base >= ptr && emu.allocs[k]->base < ptr + size)
          return emu_leave(CUDA_ERROR_INVALID_VALUE); /* still mapped: cuMemUnmap first */
      munmap((void *)(uintptr_t)ptr, size);
      emu_reservations[i].size = 0;
      return emu_leave(CUDA_SUCCESS);
    }
  return emu_leave(CUDA_ERROR_INVALID_VALUE);
}

EMU_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                        const CUmemAllocationProp *prop, unsigned long long flags) {
  (void)flags;
  CUresult r = emu_enter();
  if (r) return r;
  if (!handle || !prop || !size || size % (size_t)sysconf(_SC_PAGESIZE) ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      prop->location.id < 0 || prop->location.id >= emu.devices)
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  int device = prop->location.id;
  if (size > emu.memory - emu.used[device]) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  emu_vmm_handle *h = calloc(1, sizeof *h);
  if (!h) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  h->serial = ++emu.serial;
  char name[64];
  snprintf(name, sizeof name, "weft-cuda-emu-vmm:%d:%llu", (int)getpid(), (unsigned long long)h->serial);
  h->fd = memfd_create(name, MFD_CLOEXEC);
  if (h->fd < 0 || ftruncate(h->fd, (off_t)size) != 0) {
    if (h->fd >= 0) close(h->fd);
    free(h);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  h->size = size;
  h->device = device;
  emu.used[device] += size;
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
  return emu_leave(CUDA_SUCCESS);
}

/* The physical memory goes once its handle is released and no mapping of
 * it is left (the mappings hold the memfd open themselves). */
EMU_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_vmm_handle *h = (emu_vmm_handle *)(uintptr_t)handle;
  if (!h) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu.used[h->device] -= h->size;
  close(h->fd);
  free(h);
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                     CUmemGenericAllocationHandle handle, unsigned long long flags) {
  (void)flags;
  CUresult r = emu_enter();
  if (r) return r;
  emu_vmm_handle *h = (emu_vmm_handle *)(uintptr_t)handle;
  if (!h || !size || offset + size > h->size || offset % (size_t)sysconf(_SC_PAGESIZE) ||
      !vmm_reserved(ptr, size) || alloc_find(ptr) || alloc_find(ptr + size - 1))
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_alloc *a = calloc(1, sizeof *a);
  if (!a) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  a->fd = dup(h->fd);
  void *dev = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset);
  void *alias = dev == MAP_FAILED ? MAP_FAILED
                                  : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, (off_t)offset);
  if (a->fd < 0 || dev == MAP_FAILED || alias == MAP_FAILED || !alloc_register(a)) {
    if (dev != MAP_FAILED)
      mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (alias != MAP_FAILED) munmap(alias, size);
    if (a->fd >= 0) close(a->fd);
    free(a);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  a->base = ptr;
  a->alias = alias;
  a->size = a->mapped = size;
  a->ctx = &emu.ctx[h->device];
  a->serial = ++emu.serial;
  a->vmm = true;
  return emu_leave(CUDA_SUCCESS);
}

/* Access is granted per range; the stand-in's kernels reach a device's own
 * memory either way, so this only checks its arguments. */
EMU_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  CUresult r = emu_enter();
  if (r) return r;
  if (!desc || !count || !vmm_reserved(ptr, size)) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  return emu_leave(CUDA_SUCCESS);
}

/* The range goes back to reserved addresses at once (a later cuMemMap may
 * put other memory at the same address, as PyTorch's allocator does): what
 * still uses it fails when it runs, as with cuMemFree. */
EMU_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_alloc *a = alloc_find(ptr);
  if (!a || !a->vmm || a->base != ptr || a->size != size) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  for (size_t i = 0; i < emu.nallocs; i++)
    if (emu.allocs[i] == a) {
      emu.allocs[i] = emu.allocs[--emu.nallocs];
      break;
    }
  mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  munmap(a->alias, size);
  close(a->fd);
  free(a);
  return emu_leave(CUDA_SUCCESS);
}

/* Room for one more host entry (cuMemHostAlloc, cuMemHostRegister). */
static bool host_room(void) {
  if (emu.nhosts < emu.host_cap) return true;
  size_t cap = emu.host_cap ? emu.host_cap * 2 : 64;
  emu_host *h = realloc(emu.hosts, cap * sizeof *h);
  if (!h) return false;
  emu.hosts = h;
  emu.host_cap = cap;
  return true;
}

EMU_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **ptr, size_t bytes, unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  unsigned int known =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (!ptr || !bytes || (flags & ~known)) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (!host_room()) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  size_t mapped = emu_page_round(bytes);
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  memset(p, EMU_POISON, mapped);
  emu.hosts[emu.nhosts++] = (emu_host){.ptr = p, .size = bytes, .mapped = mapped, .ctx = ctx};
  emu.counts.host_allocations++;
  *ptr = p;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuMemFreeHost(void *ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  for (size_t i = 0; i < emu.nhosts; i++)
    if (emu.hosts[i].ptr == ptr && emu.hosts[i].mapped) {
      host_release(i);
      emu.counts.host_allocations--;
      return emu_leave(CUDA_SUCCESS);
    }
  return emu_leave(CUDA_ERROR_INVALID_VALUE);
}

/* The caller's host memory page-locked: copies may then use it as pinned
 * memory; the memory stays the caller's (cuMemHostUnregister only forgets
 * it). Counted with the host allocations. */
EMU_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void *ptr, size_t bytes, unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  if (!ptr || !bytes || (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)))
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  const unsigned char *lo = ptr;
  for (size_t i = 0; i < emu.nhosts; i++)
    if (lo < emu.hosts[i].ptr + emu.hosts[i].size && emu.hosts[i].ptr < lo + bytes)
      return emu_leave(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  if (!host_room()) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  emu.hosts[emu.nhosts++] = (emu_host){.ptr = ptr, .size = bytes, .mapped = 0, .ctx = ctx};
  emu.counts.host_allocations++;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuMemHostUnregister(void *ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  for (size_t i = 0; i < emu.nhosts; i++)
    if (emu.hosts[i].ptr == ptr && !emu.hosts[i].mapped) {
      host_release(i);
      emu.counts.host_allocations--;
      return emu_leave(CUDA_SUCCESS);
    }
  return emu_leave(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* ---- streams ------------------------------------------------------------------------- */

/* The stream a handle names: NULL and CU_STREAM_LEGACY are the current
 * context's default stream. Checks that the stream's context is usable. */
static CUresult stream_resolve(CUstream h, emu_stream **out) {
  emu_stream *s;
  if (!h || h == CU_STREAM_LEGACY) {
    struct CUctx_st *ctx;
    CUresult r = emu_need_ctx(&ctx);
    if (r) return r;
    s = ctx->legacy;
  } else if (!(s = handle_get(H_STREAM, (uint64_t)(uintptr_t)h))) {
    return CUDA_ERROR_INVALID_HANDLE; /* CU_STREAM_PER_THREAD too: not emulated */
  }
  if (s->ctx->sticky) return s->ctx->sticky;
  *out = s;
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  if (!stream || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_stream *s = stream_new(ctx, flags, false);
  if (!s) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  if (!(s->handle = handle_new(H_STREAM, s))) {
    stream_unlink_free(s);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  emu.counts.streams++;
  *stream = (CUstream)(uintptr_t)s->handle;
  return emu_leave(CUDA_SUCCESS);
}

/* Returns at once; queued work still runs, then the stream goes. */
EMU_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_stream *s = handle_get(H_STREAM, (uint64_t)(uintptr_t)stream);
  if (!s) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  handle_free(s->handle);
  emu.counts.streams--;
  s->destroyed = true;
  if (!s->head) stream_unlink_free(s);
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream stream) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  emu_progress();
  if (s->ctx->sticky) return emu_leave(s->ctx->sticky);
  return emu_leave(s->head ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  struct CUctx_st *ctx = s->ctx;
  /* `s` is live (a handle or a default stream): it is not freed meanwhile */
  emu_drive(stream_synced, s, "cuStreamSynchronize");
  return emu_leave(ctx->sticky);
}

/* ---- events ------------------------------------------------------------------------ */

EMU_EXPORT CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!event || (flags & ~known) ||
      ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_event *e = calloc(1, sizeof *e);
  if (!e) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  e->ctx = ctx;
  e->flags = flags;
  if (!(e->handle = handle_new(H_EVENT, e))) {
    free(e);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  emu.counts.events++;
  *event = (CUevent)(uintptr_t)e->handle;
  return emu_leave(CUDA_SUCCESS);
}

/* Returns at once; a pending record still completes for its waiters. */
EMU_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent event) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_event *e = handle_get(H_EVENT, (uint64_t)(uintptr_t)event);
  if (!e) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  handle_free(e->handle);
  marker_put(e->latest);
  free(e);
  emu.counts.events--;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_event *e = handle_get(H_EVENT, (uint64_t)(uintptr_t)event);
  if (!e) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  if (s->ctx != e->ctx) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  emu_op *op = op_new(OP_RECORD);
  if (!op) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  emu_marker *m = op->done;
  if ((r = op_enqueue(s, op))) return emu_leave(r);
  m->refs++;
  marker_put(e->latest);
  e->latest = m;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuEventQuery(CUevent event) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_event *e = handle_get(H_EVENT, (uint64_t)(uintptr_t)event);
  if (!e) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  if (e->ctx->sticky) return emu_leave(e->ctx->sticky);
  emu_progress();
  if (e->ctx->sticky) return emu_leave(e->ctx->sticky);
  return emu_leave(e->latest && !e->latest->done ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent event) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_event *e = handle_get(H_EVENT, (uint64_t)(uintptr_t)event);
  if (!e) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  emu_drive(event_synced, e, "cuEventSynchronize");
  return emu_leave(e->ctx->sticky);
}

EMU_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  emu_event *e = handle_get(H_EVENT, (uint64_t)(uintptr_t)event);
  if (!e) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  if (flags != CU_EVENT_WAIT_DEFAULT) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  /* the event's last record as of now; none: nothing to wait for */
  emu_op *op = op_new(OP_WAIT);
  if (!op) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  if (!op_add_dep(op, e->latest)) {
    op_free(op);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return emu_leave(op_enqueue(s, op));
}

/* ---- stream memory operations ---------------------------------------------------------- */

/* A 32-bit word of device memory or of pinned (registered) host memory, as
 * the driver requires; the stream's context must be current. */
static CUresult value_enqueue(emu_op_kind kind, CUstream stream, CUdeviceptr addr, cuuint32_t value,
                              unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  unsigned int known = kind == OP_WAIT_VALUE ? 0x3u | CU_STREAM_WAIT_VALUE_FLUSH
                                             : (unsigned int)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
  if ((addr & 3) || !value_word(addr) || (flags & ~known)) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_op *op = op_new(kind);
  if (!op) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  op->dst = addr;
  op->value32 = value;
  op->value_flags = flags;
  return emu_leave(op_enqueue(s, op));
}

EMU_EXPORT CUresult CUDAAPI cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                                unsigned int flags) {
  return value_enqueue(OP_WAIT_VALUE, stream, addr, value, flags);
}

EMU_EXPORT CUresult CUDAAPI cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                                 unsigned int flags) {
  return value_enqueue(OP_WRITE_VALUE, stream, addr, value, flags);
}

/* ---- copies ------------------------------------------------------------------------ */

/* A copy or memset: the current context needed, the stream's (maybe
 * another device's) runs it. */
static CUresult copy_enqueue(emu_op_kind kind, CUdeviceptr dst, CUdeviceptr src, void *host,
                             size_t bytes, unsigned char value, CUstream stream) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  if (bytes && (kind == OP_HTOD || kind == OP_DTOH) && (!host || host_range_is_device(host, bytes)))
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_op *op = op_new(kind);
  if (!op) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  op->dst = dst;
  op->src = src;
  op->host = host;
  op->host_pinned = host && host_find(host);
  op->bytes = bytes;
  op->value = value;
  return emu_leave(op_enqueue(s, op));
}

EMU_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes,
                                              CUstream stream) {
  return copy_enqueue(OP_HTOD, dst, 0, (void *)src, bytes, 0, stream);
}

EMU_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes,
                                              CUstream stream) {
  return copy_enqueue(OP_DTOH, 0, src, dst, bytes, 0, stream);
}

EMU_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                              CUstream stream) {
  return copy_enqueue(OP_DTOD, dst, src, NULL, bytes, 0, stream);
}

EMU_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                            CUstream stream) {
  return copy_enqueue(OP_MEMSET, dst, 0, NULL, n, value, stream);
}

/* ---- modules and kernels --------------------------------------------------------------- */

EMU_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  if (!module || !image) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  uint32_t magic;
  memcpy(&magic, image, sizeof magic);
  if (magic != EMU_FATBIN_MAGIC) return emu_leave(CUDA_ERROR_INVALID_IMAGE); /* PTX, cubin too */
  emu_module *m = calloc(1, sizeof *m);
  if (!m) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  m->ctx = ctx;
  if (!(m->handle = handle_new(H_MODULE, m))) {
    free(m);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  emu.counts.modules++;
  *module = (CUmodule)(uintptr_t)m->handle;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule module) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_module *m = handle_get(H_MODULE, (uint64_t)(uintptr_t)module);
  if (!m) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  handle_free(m->handle);
  free(m);
  emu.counts.modules--;
  return emu_leave(CUDA_SUCCESS);
}

/* A function's handle: its module's, with the kernel's index in bits 44..55. */
#define H_FUNCTION_KERNEL_SHIFT 44

EMU_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
  CUresult r = emu_enter();
  if (r) return r;
  emu_module *m = handle_get(H_MODULE, (uint64_t)(uintptr_t)module);
  if (!m) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  if (!fn || !name) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (m->ctx->sticky) return emu_leave(m->ctx->sticky);
  for (size_t i = 0; i < cuda_emu_kernel_count; i++)
    if (!strcmp(cuda_emu_kernels[i].name, name)) {
      uint64_t h = (m->handle & ((1ull << H_FUNCTION_KERNEL_SHIFT) - 1)) |
                   (uint64_t)i << H_FUNCTION_KERNEL_SHIFT | (uint64_t)H_FUNCTION << 56;
      *fn = (CUfunction)(uintptr_t)h;
      return emu_leave(CUDA_SUCCESS);
    }
  return emu_leave(CUDA_ERROR_NOT_FOUND);
}

/* The kernel a function handle names, while its module is loaded. */
static const cuda_emu_kernel *function_resolve(CUfunction fn, emu_module **module) {
  uint64_t h = (uint64_t)(uintptr_t)fn;
  if ((uint8_t)(h >> 56) != H_FUNCTION) return NULL;
  size_t k = (size_t)(h >> H_FUNCTION_KERNEL_SHIFT) & 0xfff;
  uint64_t mh = (h & ((1ull << H_FUNCTION_KERNEL_SHIFT) - 1)) | (uint64_t)H_MODULE << 56;
  if (k >= cuda_emu_kernel_count || !(*module = handle_get(H_MODULE, mh))) return NULL;
  return &cuda_emu_kernels[k];
}

static bool launch_dims_valid(unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                              unsigned int by, unsigned int bz, unsigned int shared) {
  if (!gx || !gy || !gz || !bx || !by || !bz) return false;
  if (gx > 2147483647u || gy > 65535 || gz > 65535) return false;
  if (bx > 1024 || by > 1024 || bz > 64 || (uint64_t)bx * by * bz > 1024) return false;
  return shared <= EMU_SHARED_BYTES;
}

/* Copies the parameter values as the driver does at launch, from
 * kernelParams or from extra's CU_LAUNCH_PARAM_BUFFER_POINTER. */
static CUresult launch_copy_params(const cuda_emu_kernel *k, void **params, void **extra,
                                   emu_op *op) {
  size_t offset[CUDA_EMU_MAX_PARAMS], total = 0;
  int n = 0;
  for (; n < CUDA_EMU_MAX_PARAMS && k->params[n].size; n++) {
    size_t align = k->params[n].align ? k->params[n].align : 1;
    total = (total + align - 1) / align * align;
    offset[n] = total;
    total += k->params[n].size;
  }
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;
  if (!(op->args = calloc(1, total ? total : 1))) return CUDA_ERROR_OUT_OF_MEMORY;
  if (params) {
    for (int i = 0; i < n; i++) {
      if (!params[i]) return CUDA_ERROR_INVALID_VALUE;
      memcpy(op->args + offset[i], params[i], k->params[i].size);
    }
  } else if (extra) {
    void *buffer = NULL;
    size_t *size = NULL;
    for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        buffer = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        size = extra[i + 1];
      else
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!buffer || !size || *size != total) return CUDA_ERROR_INVALID_VALUE;
    memcpy(op->args, buffer, total);
  } else if (n) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (int i = 0; i < n; i++) op->argv[i] = op->args + offset[i];
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction fn, unsigned int gx, unsigned int gy,
                                           unsigned int gz, unsigned int bx, unsigned int by,
                                           unsigned int bz, unsigned int shared_bytes,
                                           CUstream stream, void **params, void **extra) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_module *m;
  const cuda_emu_kernel *k = function_resolve(fn, &m);
  if (!k) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  emu_stream *s;
  if ((r = stream_resolve(stream, &s))) return emu_leave(r);
  /* a kernel runs on the current device: its module and stream must be of it */
  if (m->ctx != ctx || s->ctx != ctx) return emu_leave(CUDA_ERROR_INVALID_HANDLE);
  if (!launch_dims_valid(gx, gy, gz, bx, by, bz, shared_bytes))
    return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu_op *op = op_new(OP_KERNEL);
  if (!op) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  if ((r = launch_copy_params(k, params, extra, op))) {
    op_free(op);
    return emu_leave(r);
  }
  op->kernel = k;
  op->launch = (cuda_emu_launch){.grid = {gx, gy, gz},
                                 .block = {bx, by, bz},
                                 .shared_bytes = shared_bytes,
                                 .device = ctx->device,
                                 .ctx = ctx};
  return emu_leave(op_enqueue(s, op));
}

/* ---- IPC ------------------------------------------------------------------------------- */

EMU_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_alloc *a = alloc_find(ptr);
  /* the base of a cuMemAlloc allocation of this process */
  if (!handle || !a || a->base != ptr || a->imported) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  /* memory from cuMemCreate (PyTorch's expandable segments, cudaMallocAsync
   * pools) has no legacy handle: the driver refuses */
  if (emu.no_legacy_ipc || a->vmm) return emu_leave(CUDA_ERROR_NOT_SUPPORTED);
  emu_ipc_handle h = {.magic = EMU_IPC_MAGIC,
                      .pid = (int32_t)getpid(),
                      .fd = a->fd,
                      .device = a->ctx->device,
                      .serial = a->serial,
                      .size = a->size};
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &h, sizeof h);
  a->exported = true;
  emu.counts.ipc_exported++;
  return emu_leave(CUDA_SUCCESS);
}

/* Opens the exporter's memfd through /proc and checks it is the allocation
 * the handle names: the memfd's name carries the pid and serial, so a
 * descriptor freed and reused since is refused. */
static int ipc_open_fd(const emu_ipc_handle *h) {
  char path[64], link[128], want[96];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  snprintf(want, sizeof want, "/memfd:weft-cuda-emu:%d:%llu ", (int)h->pid,
           (unsigned long long)h->serial);
  struct stat st;
  if (n <= 0 || (link[n] = 0, strncmp(link, want, strlen(want)) != 0) || fstat(fd, &st) != 0 ||
      (size_t)st.st_size != emu_page_round(h->size)) {
    close(fd);
    return -1;
  }
  return fd;
}

EMU_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *ptr, CUipcMemHandle handle,
                                               unsigned int flags) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_ipc_handle h;
  memcpy(&h, handle.reserved, sizeof h);
  if (!ptr || h.magic != EMU_IPC_MAGIC || !h.size) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  if (h.pid == (int32_t)getpid()) return emu_leave(CUDA_ERROR_INVALID_CONTEXT);
  if (emu.ipc_refused) return emu_leave(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  for (size_t i = 0; i < emu.nallocs; i++) {
    emu_alloc *a = emu.allocs[i];
    if (a->imported && a->ctx == ctx && a->owner_pid == h.pid && a->owner_serial == h.serial) {
      a->opens++; /* opened again: the same mapping, counted */
      emu.counts.ipc_mappings++;
      emu.counts.ipc_opened++;
      *ptr = a->base;
      return emu_leave(CUDA_SUCCESS);
    }
  }
  emu_alloc *a = calloc(1, sizeof *a);
  if (!a) return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  a->size = (size_t)h.size;
  a->mapped = emu_page_round(a->size);
  a->ctx = ctx;
  a->imported = true;
  a->opens = 1;
  a->owner_pid = h.pid;
  a->owner_serial = h.serial;
  a->serial = ++emu.serial;
  if ((a->fd = ipc_open_fd(&h)) < 0) {
    free(a);
    return emu_leave(CUDA_ERROR_INVALID_VALUE); /* freed, or its process is gone */
  }
  /* a shared lock on the memfd while it is open here: the exporter's
   * cuMemFree sees it (exported_still_open) */
  (void)flock(a->fd, LOCK_SH | LOCK_NB);
  if (!alloc_map(a) || !alloc_register(a)) {
    if (a->alias) {
      munmap((void *)(uintptr_t)a->base, a->mapped);
      munmap(a->alias, a->mapped);
    }
    close(a->fd);
    free(a);
    return emu_leave(CUDA_ERROR_OUT_OF_MEMORY);
  }
  emu.counts.ipc_mappings++;
  emu.counts.ipc_opened++;
  *ptr = a->base;
  return emu_leave(CUDA_SUCCESS);
}

EMU_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr ptr) {
  CUresult r = emu_enter();
  if (r) return r;
  struct CUctx_st *ctx;
  if ((r = emu_need_ctx(&ctx))) return emu_leave(r);
  emu_alloc *a = alloc_find(ptr);
  if (!a || a->base != ptr || !a->imported) return emu_leave(CUDA_ERROR_INVALID_VALUE);
  emu.counts.ipc_mappings--;
  if (--a->opens == 0) alloc_release(a);
  return emu_leave(CUDA_SUCCESS);
}

/* ---- for tests ------------------------------------------------------------------------- */

EMU_EXPORT void weft_cuda_emu_counts(weft_cuda_emu_counters *out) {
  pthread_mutex_lock(&emu.lock);
  emu.counts.dmabuf_open = dmabuf_count_open();
  *out = emu.counts;
  pthread_mutex_unlock(&emu.lock);
}
