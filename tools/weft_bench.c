/* weft-bench - an nccl-tests-style sweep of every collective of weft.h
 * (-C NAME or -c NAME, or all): one row per size with nccl-tests' columns
 * (size count type redop root, then time algbw busbw #wrong out of place and
 * in place), its size convention and busbw factors, so scripts written for
 * nccl-tests read it. Every row checks its results against values computed
 * here; a wrong element fails the run (exit 1). Runs under weftrun, mpirun,
 * srun or torchrun alike (weft_comm_init_env).
 *
 * --peers switches to the CLI, data, checks and row format of ../shared/peers
 * (bench_common.h): median of per-iteration times with a barrier before
 * each, max over ranks; for side-by-side tables with Open MPI and Gloo. */
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"
#ifdef WEFT_HAVE_CUDA /* -G: the driver through weft's own table */
#include "src/base/error_sink.h"
#include "src/cuda/cuda_api.h"
#include "src/cuda/cuda_mem.h"
#endif

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* A size as WEFT_*_BYTES settings take it: a number, then K, M or G
 * (powers of 1024, KiB etc. too). Anything else is refused: "-b 8x" once
 * ran as 8 bytes. */
static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  const char *unit = end;
  switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
  }
  if (end != unit && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B')) end += 2;
  if (unit == s || *end || !(v >= 0) || v > 1e15) {
    fprintf(stderr, "weft-bench: \"%s\" is not a size (bytes, or a number then K, M or G)\n", s);
    exit(2);
  }
  return (size_t)v;
}

/* --shared: buffers from weft_mem_alloc, which peers of this host can map
 * (the direct allreduce), as nccl-tests' -R registers its buffers. */
static int shared_requested;

static void *alloc_prefaulted(size_t bytes) {
  void *p = NULL;
  size_t len = (bytes + 4095) & ~(size_t)4095;
  if (shared_requested) {
    if (weft_mem_alloc(len ? len : 4096, &p)) return NULL;
  } else if (posix_memalign(&p, 4096, len ? len : 4096)) {
    return NULL;
  }
  memset(p, 0, len ? len : 4096);
  return p;
}

static void release(void *p) {
  if (shared_requested)
    weft_mem_free(p);
  else
    free(p);
}

/* --bind: pin this rank to CPU (local rank mod usable CPUs), as mpirun does
 * by default, for launchers that do not (torchrun, the peer harness). */
static int bind_requested;

static void bind_to_core(weft_comm *comm) {
  cpu_set_t allowed, one;
  if (!bind_requested || sched_getaffinity(0, sizeof allowed, &allowed)) return;
  int count = CPU_COUNT(&allowed), want = weft_comm_local_rank(comm) % (count ? count : 1);
  if (weft_comm_local_size(comm) > count) return; /* oversubscribed: mpirun binds to none too */
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &allowed) && seen++ == want) {
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      sched_setaffinity(0, sizeof one, &one);
      return;
    }
}

static void die(weft_comm *comm, weft_status st, const char *what) {
  fprintf(stderr, "weft-bench: %s: %s: %s\n", what, weft_strerror(st), weft_last_error(comm));
  exit(1);
}

static double max_over_ranks(weft_comm *comm, double v) {
  weft_status st = weft_allreduce(comm, &v, &v, 1, WEFT_F64, WEFT_MAX);
  if (st) die(comm, st, "allreduce of timings");
  return v;
}

static long sum_over_ranks(weft_comm *comm, long v) {
  int64_t x = v;
  weft_status st = weft_allreduce(comm, &x, &x, 1, WEFT_I64, WEFT_SUM);
  if (st) die(comm, st, "allreduce of error counts");
  return (long)x;
}

/* ---- which transport each pair of ranks took -------------------------------- */

/* Selection, not the command line, decides the path (shm on one host, tcp
 * across hosts), so the output says which one was measured: "#" lines before
 * the table, ignored by scripts that read the rows (nccl-tests' and
 * ../shared/peers' parsers skip "#" lines). A summary for any size (counted by
 * the lower rank of each pair, one small allreduce), and one line per pair
 * with the reason up to PAIR_LINES_MAX ranks (an allgather of every rank's
 * view, so a pair the two ends see differently shows both). Collective: every
 * rank calls it. */
#define PAIR_LINES_MAX 8
#define TP_NAME_LEN 8
#define TP_REASON_LEN 88
static const char *const known_tps[] = {"shm", "tcp", "ibv"};
enum { N_KNOWN_TPS = sizeof known_tps / sizeof known_tps[0] };

struct peer_view { /* what one rank says about one peer, fixed size for the allgather */
  char tp[TP_NAME_LEN];
  char why[TP_REASON_LEN];
};

static void print_transports(weft_comm *comm) {
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  int64_t count[N_KNOWN_TPS + 1] = {0}; /* the last one: any other transport */
  for (int peer = rank + 1; peer < np; peer++) {
    const char *tp, *why;
    weft_status st = weft_comm_peer_transport(comm, peer, &tp, &why);
    if (st) die(comm, st, "weft_comm_peer_transport");
    int k = 0;
    while (k < N_KNOWN_TPS && strcmp(tp, known_tps[k])) k++;
    count[k]++;
  }
  weft_status st = weft_allreduce(comm, count, count, N_KNOWN_TPS + 1, WEFT_I64, WEFT_SUM);
  if (st) die(comm, st, "allreduce of transport counts");
  if (rank == 0 && np > 1) {
    int pairs = np * (np - 1) / 2;
    printf("# transports of the %d rank pair%s:", pairs, pairs == 1 ? "" : "s");
    for (int k = 0; k <= N_KNOWN_TPS; k++)
      if (count[k]) printf(" %s %lld", k < N_KNOWN_TPS ? known_tps[k] : "other", (long long)count[k]);
    printf("\n");
  }
  if (np < 2 || np > PAIR_LINES_MAX) return;
  struct peer_view mine[PAIR_LINES_MAX], all[PAIR_LINES_MAX * PAIR_LINES_MAX];
  memset(mine, 0, sizeof mine);
  for (int peer = 0; peer < np; peer++) {
    const char *tp, *why;
    st = weft_comm_peer_transport(comm, peer, &tp, &why);
    if (st) die(comm, st, "weft_comm_peer_transport");
    snprintf(mine[peer].tp, sizeof mine[peer].tp, "%s", tp);
    snprintf(mine[peer].why, sizeof mine[peer].why, "%s", why);
  }
  st = weft_allgather(comm, mine, all, (size_t)np * sizeof(struct peer_view), WEFT_U8);
  if (st) die(comm, st, "allgather of transports");
  if (rank != 0) return;
  for (int a = 0; a < np; a++)
    for (int b = a + 1; b < np; b++) {
      const struct peer_view *ab = &all[a * np + b], *ba = &all[b * np + a];
      if (strcmp(ab->tp, ba->tp))
        printf("#   %d-%d %s as %d sees it, %s as %d sees it\n", a, b, ab->tp, a, ba->tp, b);
      else
        printf("#   %d-%d %s: %s\n", a, b, ab->tp, ab->why);
    }
}

/* ---- the collectives ------------------------------------------------------ */

/* Every collective of weft.h, with nccl-tests' size convention: a row's size
 * is the whole buffer (nccl-tests prints max(send bytes, receive bytes)):
 * the allgather and gather output, the reduce_scatter and scatter input, one
 * rank's alltoall input (np blocks), the sendrecv message; for those
 * "blocked" collectives the element count is rounded down to a multiple of
 * the ranks. The count column is the count argument of the call, as
 * nccl-tests prints it (one block for the blocked ones). */
enum coll_kind {
  COLL_ALLREDUCE,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALLGATHER,
  COLL_REDUCE_SCATTER,
  COLL_ALLTOALL,
  COLL_GATHER,
  COLL_SCATTER,
  COLL_SENDRECV,
  COLL_COUNT
};

struct coll_info {
  const char *name;       /* -c / -C NAME, and the name in the default table's header */
  const char *peers_name; /* coll= in --peers headers: ../shared/peers says bcast */
  int blocked;            /* the whole buffer is np blocks */
  int reduces;            /* takes an op */
  int rooted;             /* takes a root */
  int in_place;           /* weft.h has an in-place form (alltoall never; sendrecv
                             from one buffer is a race, and nccl-tests does not check it) */
};

static const struct coll_info colls[COLL_COUNT] = {
    [COLL_ALLREDUCE] = {"allreduce", "allreduce", 0, 1, 0, 1},
    [COLL_BROADCAST] = {"broadcast", "bcast", 0, 0, 1, 1},
    [COLL_REDUCE] = {"reduce", "reduce", 0, 1, 1, 1},
    [COLL_ALLGATHER] = {"allgather", "allgather", 1, 0, 0, 1},
    [COLL_REDUCE_SCATTER] = {"reduce_scatter", "reduce_scatter", 1, 1, 0, 1},
    [COLL_ALLTOALL] = {"alltoall", "alltoall", 1, 0, 0, 0},
    [COLL_GATHER] = {"gather", "gather", 1, 0, 1, 1},
    [COLL_SCATTER] = {"scatter", "scatter", 1, 0, 1, 1},
    [COLL_SENDRECV] = {"sendrecv", "sendrecv", 0, 0, 0, 0},
};

#define COLL_NAMES \
  "allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter sendrecv, or all"

/* A collective by name (nccl-tests' binary names and ../shared/peers' bcast
 * too); -1 when unknown: the caller refuses it, never runs another. */
static int coll_by_name(const char *name) {
  static const struct {
    const char *alias;
    int kind;
  } aliases[] = {{"bcast", COLL_BROADCAST}, {"all_reduce", COLL_ALLREDUCE},
                 {"all_gather", COLL_ALLGATHER}, {"reducescatter", COLL_REDUCE_SCATTER}};
  for (int k = 0; k < COLL_COUNT; k++)
    if (!strcmp(name, colls[k].name)) return k;
  for (size_t a = 0; a < sizeof aliases / sizeof aliases[0]; a++)
    if (!strcmp(name, aliases[a].alias)) return aliases[a].kind;
  return -1;
}

/* Parses -c/-C NAME into a set of collectives (bit k: enum coll_kind k). */
static int parse_colls(const char *name, unsigned *set, const char *mode) {
  if (!strcmp(name, "all")) {
    *set = (1u << COLL_COUNT) - 1;
    return 0;
  }
  int k = coll_by_name(name);
  if (k < 0) {
    fprintf(stderr, "weft-bench%s: unknown collective '%s' (known: %s)\n", mode, name, COLL_NAMES);
    return -1;
  }
  *set = 1u << k;
  return 0;
}

/* busbw = algbw * this, as nccl-tests: the share of the whole buffer that
 * crosses each rank's link. Allreduce 2(n-1)/n; allgather, reduce_scatter,
 * alltoall, gather and scatter (n-1)/n (nccl-tests' gather_perf and
 * scatter_perf use the same); broadcast, reduce and sendrecv 1. */
static double busbw_factor(int kind, int np) {
  switch (kind) {
    case COLL_ALLREDUCE: return 2.0 * (np - 1) / np;
    case COLL_BROADCAST: case COLL_REDUCE: case COLL_SENDRECV: return 1.0;
    default: return (double)(np - 1) / np;
  }
}

/* Elements of the whole buffer for `bytes`, and of one call's count argument. */
static size_t whole_count(int kind, size_t bytes, size_t esz, int np) {
  size_t c = bytes / esz;
  return colls[kind].blocked ? c / (size_t)np * (size_t)np : c;
}

static size_t call_count(int kind, size_t whole, int np) {
  return colls[kind].blocked ? whole / (size_t)np : whole;
}

/* Where one call reads and writes, in nccl-tests' layout: out of place from
 * `send` to `recv`; in place within one buffer, the own block at rank*block
 * (allgather and gather read it from the output, reduce_scatter and scatter
 * write it into the input). */
struct placement {
  void *src; /* what the call reads (the own block, or the whole input) */
  void *dst; /* what the call writes, and the check reads */
};

static struct placement place(int kind, int in_place, int rank, void *send, void *recv,
                              size_t block_bytes) {
  char *own_in_recv = (char *)recv + (size_t)rank * block_bytes;
  char *own_in_send = (char *)send + (size_t)rank * block_bytes;
  struct placement p = {send, recv};
  if (!in_place) return p;
  switch (kind) {
    case COLL_ALLGATHER: case COLL_GATHER: p.src = own_in_recv; break;
    case COLL_REDUCE_SCATTER: case COLL_SCATTER: p.dst = own_in_send; break;
    default: p.dst = send; break;
  }
  return p;
}

/* One call. `count` is the call's count argument. Sendrecv is a ring of
 * pairs, as nccl-tests' sendrecv_perf: each rank sends to rank+1 and receives
 * from rank-1 (a rank of one sends to itself). */
static weft_status run_coll(weft_comm *comm, int kind, const void *src, void *dst, size_t count,
                            weft_dtype dt, weft_op op, int root) {
  switch (kind) {
    case COLL_ALLREDUCE: return weft_allreduce(comm, src, dst, count, dt, op);
    case COLL_BROADCAST: return weft_broadcast(comm, src, dst, count, dt, root);
    case COLL_REDUCE: return weft_reduce(comm, src, dst, count, dt, op, root);
    case COLL_ALLGATHER: return weft_allgather(comm, src, dst, count, dt);
    case COLL_REDUCE_SCATTER: return weft_reduce_scatter(comm, src, dst, count, dt, op);
    case COLL_ALLTOALL: return weft_alltoall(comm, src, dst, count, dt);
    case COLL_GATHER: return weft_gather(comm, src, dst, count, dt, root);
    case COLL_SCATTER: return weft_scatter(comm, src, dst, count, dt, root);
    case COLL_SENDRECV: {
      int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
      weft_request *req[2] = {NULL, NULL};
      weft_status st = weft_irecv(comm, dst, count, dt, (rank + np - 1) % np, 0, &req[0]);
      if (!st) st = weft_isend(comm, src, count, dt, (rank + 1) % np, 0, &req[1]);
      weft_status done = weft_wait_all(req, 2);
      return st ? st : done;
    }
    default: return WEFT_ERR_INVALID;
  }
}

/* Which ranks' results the check reads: the root's only for reduce and
 * gather (the others receive nothing). */
static int rank_checks(int kind, int rank, int root) {
  return (kind != COLL_REDUCE && kind != COLL_GATHER) || rank == root;
}

/* --test-corrupt (for the test suite only): one checking rank flips bits of
 * one result element after the checked call and before the check, which
 * must then report it and fail the run. Proves the check can fail. */
static int corrupt_requested;

static int corrupting_rank(int kind, int root, int np, int peers_bcast) {
  if (kind == COLL_REDUCE || kind == COLL_GATHER) return root;
  if (peers_bcast) return np > 1 ? (root + 1) % np : -1; /* ../shared/peers checks no root */
  return np - 1;
}

static void corrupt_element(void *elem, size_t esz) {
  /* bit 6 of every byte: an exponent bit of any float (whatever the byte
   * order), a large change of any integer */
  for (size_t b = 0; b < esz; b++) ((unsigned char *)elem)[b] ^= 0x40;
}

static void die_in(weft_comm *comm, weft_status st, int kind, size_t bytes, const char *what) {
  char where[96];
  snprintf(where, sizeof where, "%s of %zu bytes, %s", colls[kind].name, bytes, what);
  die(comm, st, where);
}

/* The exit status: 1 on every rank when any result was wrong (each has the
 * sum over ranks), rank 0 saying so. Rank 0 speaks before a last barrier:
 * a launcher that stops the job when the first rank exits non-zero
 * (weftrun, mpirun) would otherwise kill it before it said anything. */
static int finish(weft_comm *comm, long wrong, const char *where) {
  fflush(stdout);
  if (wrong && weft_comm_rank(comm) == 0)
    fprintf(stderr, "weft-bench: FAILED: %ld wrong elements (%s)\n", wrong, where);
  weft_status st = weft_barrier(comm);
  if (st) die(comm, st, "last barrier");
  weft_comm_destroy(comm);
  return wrong ? 1 : 0;
}

/* ---- element access for the check, in double ----------------------------- */

static double half_to_double(uint16_t h, int bf) {
  uint32_t bits;
  if (bf) {
    bits = (uint32_t)h << 16;
  } else {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    if (exp == 0) return (sign ? -1 : 1) * ldexp(man, -24);
    if (exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static double get_elem(const void *buf, size_t i, weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: return ((const float *)buf)[i];
    case WEFT_F64: return ((const double *)buf)[i];
    case WEFT_F16: return half_to_double(((const uint16_t *)buf)[i], 0);
    case WEFT_BF16: return half_to_double(((const uint16_t *)buf)[i], 1);
    case WEFT_I8: return ((const int8_t *)buf)[i];
    case WEFT_U8: return ((const uint8_t *)buf)[i];
    case WEFT_I32: return ((const int32_t *)buf)[i];
    case WEFT_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
  }
}

/* Inputs of reductions: small integers 1..4, so sums and products of a few
 * ranks are exact in every type and in any order. */
static int pattern(size_t i, int rank) { return (int)((i * 7 + (size_t)rank * 3) % 4) + 1; }

/* Inputs of the collectives that only move data: 1..113, exact in every type
 * (i8, bf16 included), different for every rank below 113 and for offsets
 * that are not multiples of 113, so a block from the wrong rank or the wrong
 * place shows. */
static int pattern_moved(size_t i, int rank) {
  return (int)((i * 7 + (size_t)rank * 31) % 113) + 1;
}

static void set_elem(void *buf, size_t i, weft_dtype dt, int v) {
  switch (dt) {
    case WEFT_F32: ((float *)buf)[i] = (float)v; break;
    case WEFT_F64: ((double *)buf)[i] = v; break;
    case WEFT_F16: { /* small positive integers (below 2048): exact binary16 */
      int e = 0;
      while ((v >> e) > 1) e++;
      uint16_t man = (uint16_t)(((unsigned)v << (10 - e)) & 1023);
      ((uint16_t *)buf)[i] = (uint16_t)(((e + 15) << 10) | man);
      break;
    }
    case WEFT_BF16: {
      float f = (float)v;
      uint32_t bits;
      memcpy(&bits, &f, 4);
      ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16);
      break;
    }
    case WEFT_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case WEFT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case WEFT_I32: ((int32_t *)buf)[i] = v; break;
    case WEFT_I64: ((int64_t *)buf)[i] = v; break;
    default: break;
  }
}

/* The reduction of element i over all ranks, computed here from the
 * pattern (the reference), in the dtype's arithmetic where it wraps. */
static double reduced(size_t i, int np, weft_op op, weft_dtype dt) {
  double acc = pattern(i, 0);
  for (int r = 1; r < np; r++) {
    double v = pattern(i, r);
    switch (op) {
      case WEFT_SUM: case WEFT_AVG: acc += v; break;
      case WEFT_PROD: acc *= v; break;
      case WEFT_MIN: acc = v < acc ? v : acc; break;
      case WEFT_MAX: acc = v > acc ? v : acc; break;
      default: break;
    }
  }
  if (op == WEFT_AVG) acc /= np;
  int is_int = dt >= WEFT_I8;
  if (is_int && op == WEFT_AVG) acc = trunc(acc);
  if (dt == WEFT_I8) acc = (double)(int8_t)(int64_t)acc;
  if (dt == WEFT_U8) acc = (double)(uint8_t)(int64_t)acc;
  return acc;
}

/* ---- nccl-tests mode ------------------------------------------------------ */

struct opts {
  size_t minb, maxb;
  int factor, iters, warmup, check, root;
  weft_dtype dtype;
  weft_op op;
};

/* What `rank` puts into the call's input (at p.src) for the checked run. */
static void fill_input(int kind, const struct opts *o, void *src, size_t whole, int rank,
                       int np) {
  size_t blk = whole / (size_t)np;
  weft_dtype dt = o->dtype;
  switch (kind) {
    case COLL_ALLREDUCE: case COLL_REDUCE: case COLL_REDUCE_SCATTER:
      for (size_t i = 0; i < whole; i++) set_elem(src, i, dt, pattern(i, rank));
      break;
    case COLL_BROADCAST: case COLL_SCATTER: /* read on the root only */
      if (rank == o->root)
        for (size_t i = 0; i < whole; i++) set_elem(src, i, dt, pattern_moved(i, rank));
      break;
    case COLL_ALLGATHER: case COLL_GATHER: /* the own block, as it lies in the output */
      for (size_t i = 0; i < blk; i++) set_elem(src, i, dt, pattern_moved(rank * blk + i, rank));
      break;
    default: /* alltoall (block j goes to rank j), sendrecv */
      for (size_t i = 0; i < whole; i++) set_elem(src, i, dt, pattern_moved(i, rank));
      break;
  }
}

/* What element i of `rank`'s result must be, from the patterns alone. */
static double want_output(int kind, const struct opts *o, size_t i, size_t whole, int rank,
                          int np) {
  size_t blk = whole / (size_t)np;
  switch (kind) {
    case COLL_ALLREDUCE: case COLL_REDUCE: return reduced(i, np, o->op, o->dtype);
    case COLL_REDUCE_SCATTER: return reduced(rank * blk + i, np, o->op, o->dtype);
    case COLL_BROADCAST: return pattern_moved(i, o->root);
    case COLL_SCATTER: return pattern_moved(rank * blk + i, o->root);
    case COLL_ALLGATHER: case COLL_GATHER: return pattern_moved(i, (int)(i / blk));
    case COLL_ALLTOALL: return pattern_moved(rank * blk + i % blk, (int)(i / blk));
    default: return pattern_moved(i, (rank + np - 1) % np); /* sendrecv: from rank-1 */
  }
}

/* ---- -G: device buffers ----------------------------------------------------
 * The call runs on device memory (CUDA, device 0, which the ranks share);
 * the check fills and reads host copies, moved with synchronous copies
 * outside the timed runs. Built only with CUDA. */
static int device_mode;
/* -R: the device buffers registered (weft_comm_register), so the peers keep
 * them mapped from call to call, as a training loop registers its gradient
 * buffers and NCCL maps its own; 0: lent per call (an IPC open and close per
 * call and peer, what an unregistered buffer costs) */
static int register_buffers = 1;
#ifdef WEFT_HAVE_CUDA
static const weft_cuda_api *dev_api;
static CUdeviceptr dev_send, dev_recv;

static void dev_check(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  char words[160];
  weft_cuda_error_words(dev_api, r, words, sizeof words);
  fprintf(stderr, "weft-bench: %s: %s\n", call, words);
  exit(1);
}

static void device_setup(size_t bytes) {
  char why[512];
  if (!weft_cuda_usable(why, sizeof why)) {
    fprintf(stderr, "weft-bench: -G: no usable CUDA device: %s\n", why);
    exit(77);
  }
  weft_error_sink err = {0};
  dev_api = weft_cuda_api_load(&err);
  CUdevice dev;
  CUcontext ctx;
  dev_check(dev_api->device_get(&dev, 0), "cuDeviceGet");
  dev_check(dev_api->primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  dev_check(dev_api->ctx_set_current(ctx), "cuCtxSetCurrent");
  dev_check(dev_api->mem_alloc(&dev_send, bytes ? bytes : 1), "cuMemAlloc");
  dev_check(dev_api->mem_alloc(&dev_recv, bytes ? bytes : 1), "cuMemAlloc");
}

/* host -> device (to 1) or back, both buffers, waited for */
static void device_sync(void *send, void *recv, size_t bytes, int to) {
  if (!bytes) return;
  if (to) {
    dev_check(dev_api->memcpy_htod_async(dev_send, send, bytes, NULL), "cuMemcpyHtoDAsync");
    dev_check(dev_api->memcpy_htod_async(dev_recv, recv, bytes, NULL), "cuMemcpyHtoDAsync");
  } else {
    dev_check(dev_api->memcpy_dtoh_async(send, dev_send, bytes, NULL), "cuMemcpyDtoHAsync");
    dev_check(dev_api->memcpy_dtoh_async(recv, dev_recv, bytes, NULL), "cuMemcpyDtoHAsync");
  }
  dev_check(dev_api->stream_synchronize(NULL), "cuStreamSynchronize");
}
#define DEV_SEND ((void *)(uintptr_t)dev_send)
#define DEV_RECV ((void *)(uintptr_t)dev_recv)
#else
static void device_setup(size_t bytes) {
  (void)bytes;
  fprintf(stderr, "weft-bench: -G: this build of weft has no CUDA support\n");
  exit(77);
}
static void device_sync(void *send, void *recv, size_t bytes, int to) {
  (void)send, (void)recv, (void)bytes, (void)to;
}
#define DEV_SEND NULL
#define DEV_RECV NULL
#endif

/* One call on freshly filled buffers, then every element this rank
 * receives against want_output; the sum over ranks of the wrong ones. */
static long check_result(weft_comm *comm, int kind, const struct opts *o, void *send, void *recv,
                         size_t whole, int in_place) {
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  size_t esz = weft_dtype_size(o->dtype), blk = whole / (size_t)np;
  size_t out_count = kind == COLL_REDUCE_SCATTER || kind == COLL_SCATTER ? blk : whole;
  /* zeros first: a stale right answer from an earlier call must not pass */
  memset(send, 0, whole * esz);
  memset(recv, 0, whole * esz);
  struct placement p = place(kind, in_place, rank, send, recv, blk * esz);
  fill_input(kind, o, p.src, whole, rank, np);
  struct placement run = p;
  if (device_mode) { /* the same layout in device memory */
    device_sync(send, recv, whole * esz, 1);
    run = place(kind, in_place, rank, DEV_SEND, DEV_RECV, blk * esz);
  }
  weft_status st = run_coll(comm, kind, run.src, run.dst, call_count(kind, whole, np), o->dtype,
                            o->op, o->root);
  if (st) die_in(comm, st, kind, whole * esz, "checked run");
  if (device_mode) device_sync(send, recv, whole * esz, 0);
  long wrong = 0;
  if (rank_checks(kind, rank, o->root)) {
    if (corrupt_requested && rank == corrupting_rank(kind, o->root, np, 0))
      corrupt_element(p.dst, esz);
    double tol = o->dtype == WEFT_F16 || o->dtype == WEFT_BF16 ? 1e-2 : 1e-6;
    for (size_t i = 0; i < out_count; i++) {
      double want = want_output(kind, o, i, whole, rank, np), got = get_elem(p.dst, i, o->dtype);
      if (!(fabs(got - want) <= tol * fabs(want))) wrong++; /* a NaN is wrong too */
    }
  }
  return sum_over_ranks(comm, wrong);
}

static double time_batch(weft_comm *comm, int kind, const struct opts *o, void *send, void *recv,
                         size_t whole, int in_place) {
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  size_t esz = weft_dtype_size(o->dtype);
  if (device_mode) send = DEV_SEND, recv = DEV_RECV;
  struct placement p = place(kind, in_place, rank, send, recv, whole / (size_t)np * esz);
  size_t count = call_count(kind, whole, np);
  for (int i = 0; i < o->warmup; i++) {
    weft_status st = run_coll(comm, kind, p.src, p.dst, count, o->dtype, o->op, o->root);
    if (st) die_in(comm, st, kind, whole * esz, "warmup");
  }
  weft_status st = weft_barrier(comm);
  if (st) die(comm, st, "barrier");
  double t0 = now_us();
  for (int i = 0; i < o->iters; i++) {
    st = run_coll(comm, kind, p.src, p.dst, count, o->dtype, o->op, o->root);
    if (st) die_in(comm, st, kind, whole * esz, "timed run");
  }
  return max_over_ranks(comm, (now_us() - t0) / o->iters);
}

static const char *const dnames[] = {"float", "double", "half", "bfloat16",
                                     "int8",  "uint8",  "int32", "int64"};

/* One nccl-tests table of one collective; returns the wrong elements of all rows. */
static long nccl_table(weft_comm *comm, int kind, const struct opts *o, void *send, void *recv) {
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  const struct coll_info *ci = &colls[kind];
  size_t esz = weft_dtype_size(o->dtype);
  if (rank == 0) {
    printf("# weft-bench %s: %s, %d ranks, dtype %s, op %s, root %d, iters %d, warmup %d, "
           "check %d\n",
           weft_version_string(), ci->name, np, weft_dtype_name(o->dtype),
           ci->reduces ? weft_op_name(o->op) : "none", ci->rooted ? o->root : -1, o->iters,
           o->warmup, o->check);
    printf("#%62s%34s\n", "out-of-place", "in-place");
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  double bw_sum = 0, busf = busbw_factor(kind, np);
  int bw_count = 0;
  long wrong_all = 0;
  for (size_t bytes = o->minb; bytes <= o->maxb; bytes *= (size_t)o->factor) {
    size_t whole = whole_count(kind, bytes, esz, np);
    /* a size below one element per rank has nothing to move: no row, as
     * in ../shared/peers */
    if (whole || bytes == 0) {
      double t[2] = {0, 0}, algbw[2] = {0, 0};
      long wrong[2] = {0, 0};
      int modes = ci->in_place ? 2 : 1;
      for (int ip = 0; ip < modes; ip++) {
        if (o->check) wrong[ip] = check_result(comm, kind, o, send, recv, whole, ip);
        t[ip] = time_batch(comm, kind, o, send, recv, whole, ip);
        algbw[ip] = t[ip] > 0 ? whole * esz / (t[ip] * 1e3) : 0;
        bw_sum += algbw[ip] * busf;
        bw_count++;
        wrong_all += wrong[ip];
      }
      if (rank == 0) {
        char w0[24] = "N/A", tail[64];
        if (o->check) snprintf(w0, sizeof w0, "%ld", wrong[0]);
        if (ci->in_place && o->check)
          snprintf(tail, sizeof tail, "%8.2f %7.2f %7.2f %6ld", t[1], algbw[1], algbw[1] * busf,
                   wrong[1]);
        else if (ci->in_place)
          snprintf(tail, sizeof tail, "%8.2f %7.2f %7.2f %6s", t[1], algbw[1], algbw[1] * busf,
                   "N/A");
        else /* no in-place form in weft.h: nothing measured */
          snprintf(tail, sizeof tail, "%8s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
        printf(" %11zu %12zu %8s %6s %6d %8.2f %7.2f %7.2f %6s %s\n", whole * esz,
               call_count(kind, whole, np), dnames[o->dtype],
               ci->reduces ? weft_op_name(o->op) : "none", ci->rooted ? o->root : -1, t[0],
               algbw[0], algbw[0] * busf, w0, tail);
        fflush(stdout);
      }
    }
    if (bytes == 0) break;
  }
  if (rank == 0) {
    printf("# Out of bounds values : %ld %s\n", wrong_all,
           o->check ? wrong_all ? "FAILED" : "OK" : "(not checked)");
    printf("# Avg bus bandwidth    : %g\n#\n", bw_count ? bw_sum / bw_count : 0);
  }
  return wrong_all;
}

static void nccl_usage(FILE *f) {
  fprintf(f,
          "usage: weft-bench [-C NAME] [-b minbytes] [-e maxbytes] [-f factor] [-n iters]\n"
          "                  [-w warmup] [-c 0|1 check] [-d dtype] [-o op] [-r root]\n"
          "       weft-bench --peers [-c NAME] ... (../shared/peers format)\n"
          "  NAME: " COLL_NAMES "\n"
          "  (-c NAME picks the collective too; -c with a number is nccl-tests' check flag)\n"
          "  sizes are the whole buffer, as in nccl-tests (allgather/gather: the output,\n"
          "  reduce_scatter/scatter: the input, alltoall: one rank's input)\n"
          "  --bind: pin each rank to one CPU by local rank (as mpirun does)\n"
          "  --shared: buffers from weft_mem_alloc (ranks of one host reach them directly)\n"
          "  -G: device buffers (CUDA device 0, shared by the ranks); exit 77 without one\n"
          "  -R 0|1: -G's buffers registered (weft_comm_register, default 1: the peers keep\n"
          "          them mapped); 0: lent per call (an IPC open and close per call and peer)\n"
          "Run one process per rank: weftrun -n 4 weft-bench, or under mpirun/srun/torchrun.\n");
}

static int nccl_mode(int argc, char **argv) {
  struct opts o = {8, 64u << 20, 2, 20, 5, 1, 0, WEFT_F32, WEFT_SUM};
  unsigned which = 1u << COLL_ALLREDUCE;
  int c;
  while ((c = getopt(argc, argv, "b:e:f:n:w:c:d:o:r:C:GR:h")) != -1) {
    switch (c) {
      case 'G': device_mode = 1; break;
      case 'R': register_buffers = atoi(optarg); break;
      case 'b': o.minb = parse_size(optarg); break;
      case 'e': o.maxb = parse_size(optarg); break;
      case 'f': o.factor = atoi(optarg); break;
      case 'n': o.iters = atoi(optarg); break;
      case 'w': o.warmup = atoi(optarg); break;
      case 'r': o.root = atoi(optarg); break;
      case 'c': /* nccl-tests' check flag when a number, else the collective as with -C */
        if (optarg[0] >= '0' && optarg[0] <= '9')
          o.check = atoi(optarg);
        else if (parse_colls(optarg, &which, ""))
          return 2;
        break;
      case 'C':
        if (parse_colls(optarg, &which, "")) return 2;
        break;
      case 'd': {
        int found = 0;
        for (int d = 0; d < WEFT_DTYPE_COUNT; d++)
          if (!strcmp(optarg, weft_dtype_name((weft_dtype)d)) || !strcmp(optarg, dnames[d])) {
            o.dtype = (weft_dtype)d;
            found = 1;
          }
        if (!found) { fprintf(stderr, "weft-bench: unknown dtype %s\n", optarg); return 2; }
        break;
      }
      case 'o': {
        int found = 0;
        for (int p = 0; p < WEFT_OP_COUNT; p++)
          if (!strcmp(optarg, weft_op_name((weft_op)p))) { o.op = (weft_op)p; found = 1; }
        if (!found) { fprintf(stderr, "weft-bench: unknown op %s\n", optarg); return 2; }
        break;
      }
      default:
        nccl_usage(c == 'h' ? stdout : stderr);
        return c == 'h' ? 0 : 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "weft-bench: unexpected argument '%s' (-h for usage)\n", argv[optind]);
    return 2;
  }
  if (o.factor < 2) o.factor = 2;
  if (o.iters < 1) o.iters = 1;
  if (o.warmup < 0) o.warmup = 0;
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) die(NULL, st, "init");
  bind_to_core(comm);
  int np = weft_comm_size(comm);
  if (o.root < 0 || o.root >= np) {
    /* every rank sees the same np: all refuse alike, none waits for the others */
    fprintf(stderr, "weft-bench: root %d is not a rank of %d\n", o.root, np);
    weft_comm_destroy(comm);
    return 2;
  }
  void *send = alloc_prefaulted(o.maxb), *recv = alloc_prefaulted(o.maxb);
  if (!send || !recv) die(comm, WEFT_ERR_NOMEM, "buffers");
  if (device_mode) device_setup(o.maxb);
  if (device_mode && register_buffers && o.maxb &&
      ((st = weft_comm_register(comm, DEV_SEND, o.maxb)) || (st = weft_comm_register(comm, DEV_RECV, o.maxb))))
    die(comm, st, "weft_comm_register");
  print_transports(comm);
  long wrong = 0;
  for (int kind = 0; kind < COLL_COUNT; kind++)
    if (which & (1u << kind)) wrong += nccl_table(comm, kind, &o, send, recv);
  release(send);
  release(recv);
  return finish(comm, wrong, "the #wrong columns");
}

/* ---- ../shared/peers mode ---------------------------------------------------- */

/* The format, data and checks of ../shared/peers/src/bench_common.h, so a
 * row of weft and a row of Open MPI mean the same thing: float32 sum, root
 * 0, out of place (broadcast in place on the root, as MPI_Bcast); bytes the
 * whole buffer and counts of allgather, reduce_scatter and alltoall rounded
 * down to a multiple of the ranks (a size that rounds to nothing gives no
 * row); values small integers so every sum is exact. reduce, gather, scatter
 * and sendrecv, which bench_common.h lacks, follow the same rules (reduce as
 * allreduce and gather as allgather, checked on the root; scatter from root
 * 0; sendrecv from rank-1). */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static float peers_val(size_t i) { return (float)((i % 13) + 1); }

static void peers_fill(int kind, float *send, size_t whole, int rank, int np) {
  size_t blk = whole / (size_t)np;
  switch (kind) {
    case COLL_BROADCAST:
      for (size_t i = 0; i < whole; i++) send[i] = peers_val(i);
      break;
    case COLL_ALLGATHER: case COLL_GATHER:
      for (size_t i = 0; i < blk; i++) send[i] = (float)(rank + 1) * peers_val(rank * blk + i);
      break;
    case COLL_SCATTER: /* block r of the root's input: (r+1)*val, as an allgather's output;
                          zeros elsewhere, so a scatter from another rank shows */
      for (size_t i = 0; i < whole; i++)
        send[i] = rank ? 0.0f : (float)(i / blk + 1) * peers_val(i);
      break;
    default: /* allreduce, reduce, reduce_scatter, alltoall (block j to rank j), sendrecv */
      for (size_t i = 0; i < whole; i++) send[i] = (float)(rank + 1) * peers_val(i);
      break;
  }
}

/* Wrong elements of `rank`'s result (bench_check, and the same for the rest). */
static long peers_check(int kind, const float *res, size_t whole, int rank, int np) {
  size_t blk = whole / (size_t)np, n = whole;
  float sum = (float)(np * (np + 1) / 2);
  long errs = 0;
  if (kind == COLL_REDUCE_SCATTER || kind == COLL_SCATTER) n = blk;
  for (size_t i = 0; i < n; i++) {
    float want;
    switch (kind) {
      case COLL_BROADCAST: want = peers_val(i); break;
      case COLL_ALLREDUCE: case COLL_REDUCE: want = sum * peers_val(i); break;
      case COLL_ALLGATHER: case COLL_GATHER: want = (float)(i / blk + 1) * peers_val(i); break;
      case COLL_REDUCE_SCATTER: want = sum * peers_val(rank * blk + i); break;
      case COLL_ALLTOALL: want = (float)(i / blk + 1) * peers_val(rank * blk + i % blk); break;
      case COLL_SCATTER: want = (float)(rank + 1) * peers_val(rank * blk + i); break;
      default: want = (float)((rank + np - 1) % np + 1) * peers_val(i); break; /* sendrecv */
    }
    if (res[i] != want) errs++;
  }
  return errs;
}

static const char *peers_op(int kind) {
  switch (kind) {
    case COLL_BROADCAST: case COLL_GATHER: case COLL_SCATTER: return "none(root=0)";
    case COLL_REDUCE: return "sum(root=0)";
    case COLL_ALLREDUCE: case COLL_REDUCE_SCATTER: return "sum";
    default: return "none";
  }
}

struct peers_opts {
  size_t minb, maxb, iter_bytes;
  int factor, iters_min, iters_max, barrier;
  const char *label;
};

/* One table of one collective; returns the wrong elements of all rows. */
static long peers_table(weft_comm *comm, int kind, const struct peers_opts *o, float *send,
                        float *recv, double *times) {
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  if (rank == 0) {
    printf("# peer=weft_%s coll=%s np=%d dtype=float32 op=%s label=\"%s\"\n", weft_version_string(),
           colls[kind].peers_name, np, peers_op(kind), o->label);
    printf("# timing: median over iters of per-iter time, max over ranks; %s; GB/s=1e9B/s\n",
           o->barrier ? "barrier before each iter" : "back-to-back (no barrier)");
    printf("# %10s %10s %6s %11s %10s %10s %6s\n", "bytes", "count", "iters", "time_us",
           "algbw_GBs", "busbw_GBs", "check");
    fflush(stdout);
  }
  long wrong_all = 0;
  for (size_t bytes = o->minb; bytes;
       bytes = bytes >= o->maxb ? 0 : (bytes * o->factor > o->maxb ? o->maxb : bytes * o->factor)) {
    size_t whole = whole_count(kind, bytes, 4, np), count = call_count(kind, whole, np);
    if (!whole) continue;
    /* the broadcast's root sends from and keeps its own buffer (MPI_Bcast is in place) */
    float *dst = kind == COLL_BROADCAST && rank == 0 ? send : recv;
    peers_fill(kind, send, whole, rank, np);
    memset(recv, 0, whole * sizeof(float));
    weft_status st = run_coll(comm, kind, send, dst, count, WEFT_F32, WEFT_SUM, 0);
    if (st) die_in(comm, st, kind, bytes, "checked run");
    long errs = 0;
    int checks = rank_checks(kind, rank, 0) && !(kind == COLL_BROADCAST && rank == 0);
    if (checks) {
      if (corrupt_requested && rank == corrupting_rank(kind, 0, np, kind == COLL_BROADCAST))
        corrupt_element(dst, 4);
      errs = peers_check(kind, dst, whole, rank, np);
    }
    errs = sum_over_ranks(comm, errs);
    wrong_all += errs;
    size_t it = o->iter_bytes / bytes; /* bench_iters: the maximum wins over the minimum */
    if (it < (size_t)o->iters_min) it = (size_t)o->iters_min;
    if (it > (size_t)o->iters_max) it = (size_t)o->iters_max;
    int iters = it ? (int)it : 1, warm = iters / 10 + 1;
    /* as bench_common's peers: warm-up and timed iterations alike, each after
     * a barrier (-N: one barrier before the timed ones) */
    for (int k = 0; k < warm + iters; k++) {
      if ((o->barrier || k == warm) && (st = weft_barrier(comm))) die(comm, st, "barrier");
      double t0 = now_us();
      st = run_coll(comm, kind, send, dst, count, WEFT_F32, WEFT_SUM, 0);
      if (st) die_in(comm, st, kind, bytes, k < warm ? "warmup" : "timed run");
      if (k >= warm) times[k - warm] = now_us() - t0;
    }
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    double med = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    med = max_over_ranks(comm, med);
    if (rank == 0) {
      double algbw = bytes / (med * 1e-6) / 1e9;
      printf("  %10zu %10zu %6d %11.2f %10.3f %10.3f %6s\n", bytes, bytes / 4, iters, med, algbw,
             algbw * busbw_factor(kind, np), errs ? "FAIL" : "ok");
      if (errs) printf("# FAIL: %ld wrong elements (summed over ranks)\n", errs);
      fflush(stdout);
    }
  }
  return wrong_all;
}

static int peers_mode(int argc, char **argv) {
  struct peers_opts o = {8, 64u << 20, 256u << 20, 4, 5, 200, 1, ""};
  unsigned which = 1u << COLL_ALLREDUCE;
  int c;
  while ((c = getopt(argc, argv, "c:C:b:e:f:n:m:I:Nt:h")) != -1) {
    switch (c) {
      case 'c': case 'C':
        if (parse_colls(optarg, &which, " --peers")) return 2;
        break;
      case 'b': o.minb = parse_size(optarg); break;
      case 'e': o.maxb = parse_size(optarg); break;
      case 'f': o.factor = atoi(optarg); break;
      case 'n': o.iters_max = atoi(optarg); break;
      case 'm': o.iters_min = atoi(optarg); break;
      case 'I': o.iter_bytes = parse_size(optarg); break;
      case 'N': o.barrier = 0; break;
      case 't': o.label = optarg; break;
      default:
        fprintf(c == 'h' ? stdout : stderr,
                "usage: weft-bench --peers [-c NAME] [-b minbytes] [-e maxbytes] [-f factor]\n"
                "          [-n maxiters] [-m miniters] [-I iterbytes] [-N] [-t label]\n"
                "  NAME: " COLL_NAMES " (bcast for broadcast too)\n"
                "  the options, rows and checks of ../shared/peers/src/bench_common.h\n");
        return c == 'h' ? 0 : 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "weft-bench --peers: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o.minb < 4) o.minb = 4;
  o.minb &= ~(size_t)3;
  o.maxb &= ~(size_t)3;
  if (o.factor < 2) o.factor = 2;
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) die(NULL, st, "init");
  bind_to_core(comm);
  float *send = alloc_prefaulted(o.maxb), *recv = alloc_prefaulted(o.maxb);
  int most = o.iters_max > o.iters_min ? o.iters_max : o.iters_min;
  double *times = malloc(sizeof(double) * (size_t)(most > 1 ? most : 1));
  if (!send || !recv || !times) die(comm, WEFT_ERR_NOMEM, "buffers");
  int first = 1;
  long wrong = 0;
  for (int kind = 0; kind < COLL_COUNT; kind++) {
    if (!(which & (1u << kind))) continue;
    /* "#" lines: run.sh reads only rows with 7 fields not starting with '#' */
    if (first) print_transports(comm);
    first = 0;
    wrong += peers_table(comm, kind, &o, send, recv, times);
  }
  release(send);
  release(recv);
  free(times);
  return finish(comm, wrong, "rows marked FAIL");
}

/* --overlap [-b bytes] [-s sleep_ms] [-n iters]: how much of an allreduce
 * hides behind the caller's other work. Per iteration, after a barrier: a
 * blocking allreduce (its time), then a non-blocking one issued right before
 * the caller sleeps `sleep_ms` (as a CPU does while its GPU computes), and
 * the time weft_wait still takes after the sleep. Medians, max over ranks. */
static int overlap_mode(int argc, char **argv) {
  size_t bytes = 64u << 20;
  int sleep_ms = 100, iters = 5, c;
  while ((c = getopt(argc, argv, "b:s:n:")) != -1) {
    switch (c) {
      case 'b': bytes = parse_size(optarg); break;
      case 's': sleep_ms = atoi(optarg); break;
      case 'n': iters = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: weft-bench --overlap [-b bytes] [-s sleep_ms] [-n iters]\n");
        return 2;
    }
  }
  if (iters < 1 || iters > 1000) iters = 5;
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) die(NULL, st, "init");
  bind_to_core(comm);
  size_t count = bytes / 4;
  float *buf = alloc_prefaulted(count * 4);
  if (!buf) die(comm, WEFT_ERR_NOMEM, "buffer");
  double blocking[1000], waited[1000], total[1000];
  for (int it = -1; it < iters; it++) { /* one warm-up round */
    if ((st = weft_barrier(comm))) die(comm, st, "barrier");
    double t0 = now_us();
    if ((st = weft_allreduce(comm, buf, buf, count, WEFT_F32, WEFT_SUM))) die(comm, st, "allreduce");
    double b = max_over_ranks(comm, now_us() - t0);
    if ((st = weft_barrier(comm))) die(comm, st, "barrier");
    weft_request *req;
    t0 = now_us();
    if ((st = weft_iallreduce(comm, buf, buf, count, WEFT_F32, WEFT_SUM, &req)))
      die(comm, st, "iallreduce");
    struct timespec pause = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    double t1 = now_us();
    if ((st = weft_wait(&req))) die(comm, st, "wait");
    double t2 = now_us();
    double w = max_over_ranks(comm, t2 - t1), t = max_over_ranks(comm, t2 - t0);
    if (it >= 0) {
      blocking[it] = b;
      waited[it] = w;
      total[it] = t;
    }
  }
  qsort(blocking, (size_t)iters, sizeof(double), cmp_double);
  qsort(waited, (size_t)iters, sizeof(double), cmp_double);
  qsort(total, (size_t)iters, sizeof(double), cmp_double);
  double b = blocking[iters / 2], w = waited[iters / 2], t = total[iters / 2];
  if (weft_comm_rank(comm) == 0) {
    printf("# weft-bench --overlap: %d ranks, %zu bytes f32 sum, sleep %d ms, median of %d\n",
           weft_comm_size(comm), count * 4, sleep_ms, iters);
    printf("# %14s %14s %16s %14s %10s\n", "blocking(ms)", "sleep(ms)", "wait after(ms)",
           "issue..done(ms)", "hidden");
    printf("  %14.2f %14d %16.2f %14.2f %9.0f%%\n", b / 1e3, sleep_ms, w / 1e3, t / 1e3,
           100.0 * (1 - w / b));
  }
  release(buf);
  weft_comm_destroy(comm);
  return 0;
}

/* --recover [-b bytes] [-k rank]: what a lost rank costs. Every rank runs
 * allreduces of `bytes`; at the sixth, rank k (default 1) kills itself
 * (SIGKILL, as the kernel's OOM killer or a failed node would). The
 * survivors' call fails, they weft_comm_shrink and run one allreduce on the
 * new communicator, checked. The phases, max over the survivors, from the
 * moment of the SIGKILL (the victim writes it to a shared page first; one
 * host only): the first survivor's error (detect), the last one's (every
 * rank told), the shrink (its agreements and the new transports), the first
 * allreduce; then a weft_comm_agree with no failure on the new
 * communicator (median of 5); then the time to grow back by one rank: the
 * new rank 0 starts a replacement (this program, --recover-join), which
 * joins (weft_comm_join) while the survivors weft_comm_grow, from the call
 * to its return, the replacement's start included. Run it under weftrun
 * --elastic, which lets the job go on after a rank died. */
static int recover_mode(int argc, char **argv) {
  size_t bytes = 4096;
  int victim = 1, c;
  while ((c = getopt(argc, argv, "b:k:")) != -1) {
    switch (c) {
      case 'b': bytes = parse_size(optarg); break;
      case 'k': victim = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: weftrun --elastic -n N weft-bench --recover [-b bytes] [-k rank]\n");
        return 2;
    }
  }
  /* the page the victim stamps: named after weftrun (the ranks' parent) */
  char name[64];
  snprintf(name, sizeof name, "/weft-bench-recover-%d", (int)getppid());
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(double)) != 0) {
    perror("weft-bench: shm_open");
    return 1;
  }
  volatile double *killed_at = mmap(NULL, sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (killed_at == MAP_FAILED) return 1;
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) die(NULL, st, "init");
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm);
  if (size < 2 || victim < 0 || victim >= size) {
    if (rank == 0) fprintf(stderr, "weft-bench --recover: needs 2 ranks or more and -k below %d\n", size);
    return 2;
  }
  size_t count = bytes / 4 ? bytes / 4 : 1;
  float *buf = calloc(count, 4);
  if (!buf) die(comm, WEFT_ERR_NOMEM, "buffer");
  if (rank == 0) *killed_at = 0;
  if ((st = weft_barrier(comm))) die(comm, st, "barrier");
  double t_err = 0;
  for (int it = 0; it < 1000000; it++) {
    if (it == 5 && rank == victim) {
      *killed_at = now_us();
      raise(SIGKILL);
    }
    st = weft_allreduce(comm, buf, buf, count, WEFT_F32, WEFT_SUM);
    if (st) {
      t_err = now_us();
      break;
    }
  }
  weft_comm *shrunk;
  if ((st = weft_comm_shrink(comm, &shrunk))) die(comm, st, "shrink");
  double t_shrunk = now_us();
  for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
  if ((st = weft_allreduce(shrunk, buf, buf, count, WEFT_F32, WEFT_SUM))) die(shrunk, st, "allreduce");
  double t_first = now_us();
  /* every survivor had rank+1; the victim's is missing */
  float want = (float)(size * (size + 1) / 2 - (victim + 1));
  long wrong = 0;
  for (size_t i = 0; i < count; i++) wrong += buf[i] != want;
  double agree[5];
  for (int k = 0; k < 5; k++) {
    uint32_t flags = 0;
    if ((st = weft_barrier(shrunk))) die(shrunk, st, "barrier");
    double t0 = now_us();
    if ((st = weft_comm_agree(shrunk, &flags, NULL, NULL))) die(shrunk, st, "agree");
    agree[k] = max_over_ranks(shrunk, now_us() - t0);
  }
  qsort(agree, 5, sizeof(double), cmp_double);
  /* back to full size: the new rank 0 starts a replacement (this program
   * again, --recover-join), and the survivors grow by one */
  weft_unique_id gid;
  if ((st = weft_comm_grow_id(shrunk, &gid))) die(shrunk, st, "grow id");
  pid_t replacement = weft_comm_rank(shrunk) == 0 ? fork() : -1;
  if (replacement == 0) {
    char hex[2 * sizeof gid.bytes + 1];
    for (size_t i = 0; i < sizeof gid.bytes; i++)
      snprintf(hex + 2 * i, 3, "%02x", (unsigned char)gid.bytes[i]);
    execl("/proc/self/exe", "weft-bench", "--recover-join", hex, (char *)NULL);
    _exit(127);
  }
  double t_grow0 = now_us();
  weft_comm *grown;
  if ((st = weft_comm_grow(shrunk, 1, &grown))) die(shrunk, st, "grow");
  double grow = max_over_ranks(grown, now_us() - t_grow0);
  if ((st = weft_barrier(grown))) die(grown, st, "barrier after the grow");
  double t0 = *killed_at;
  double first_err = -max_over_ranks(shrunk, -(t_err - t0));
  double last_err = max_over_ranks(shrunk, t_err - t0);
  double shrink = max_over_ranks(shrunk, t_shrunk - t_err);
  double first = max_over_ranks(shrunk, t_first - t_shrunk);
  double total = max_over_ranks(shrunk, t_first - t0);
  wrong = sum_over_ranks(shrunk, wrong);
  if (weft_comm_rank(shrunk) == 0) {
    const char *tp = "?", *why = "";
    weft_comm_peer_transport(shrunk, weft_comm_size(shrunk) > 1 ? 1 : 0, &tp, &why);
    printf("# weft-bench --recover: %d ranks, rank %d SIGKILLed in an allreduce of %zu bytes, %s\n",
           size, victim, count * 4, tp);
    printf("# %12s %12s %12s %14s %12s %12s %12s %8s\n", "detect(ms)", "all told(ms)",
           "shrink(ms)", "1st allred(ms)", "total(ms)", "agree(ms)", "grow(ms)", "#wrong");
    printf("  %12.2f %12.2f %12.2f %14.2f %12.2f %12.2f %12.2f %8ld\n", first_err / 1e3,
           last_err / 1e3, shrink / 1e3, first / 1e3, total / 1e3, agree[2] / 1e3, grow / 1e3,
           wrong);
    shm_unlink(name);
  }
  weft_comm_destroy(grown);
  weft_comm_destroy(shrunk);
  weft_comm_destroy(comm);
  free(buf);
  int rstatus = 0;
  if (replacement > 0 && (waitpid(replacement, &rstatus, 0) != replacement || rstatus)) {
    fprintf(stderr, "weft-bench --recover: the replacement ended with status %d\n", rstatus);
    return 1;
  }
  return wrong ? 1 : 0;
}

/* The replacement --recover starts: joins, takes part in the barrier,
 * leaves. */
static int recover_join(const char *hex) {
  weft_unique_id gid;
  for (size_t i = 0; i < sizeof gid.bytes; i++)
    if (sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&gid.bytes[i]) != 1) return 2;
  weft_comm *comm;
  weft_status st = weft_comm_join(&gid, &comm);
  if (st) die(NULL, st, "join");
  double v = 0;
  if ((st = weft_allreduce(comm, &v, &v, 1, WEFT_F64, WEFT_MAX))) die(comm, st, "allreduce");
  if ((st = weft_barrier(comm))) die(comm, st, "barrier");
  weft_comm_destroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) /* --bind, --shared, --test-corrupt may stand anywhere */
    if (!strcmp(argv[i], "--bind") || !strcmp(argv[i], "--shared") ||
        !strcmp(argv[i], "--test-corrupt")) {
      if (!strcmp(argv[i], "--bind")) bind_requested = 1;
      else if (!strcmp(argv[i], "--shared")) shared_requested = 1;
      else corrupt_requested = 1;
      memmove(&argv[i], &argv[i + 1], sizeof *argv * (size_t)(argc - i));
      argc--;
      i--;
    }
  if (argc > 1 && !strcmp(argv[1], "--overlap")) {
    argv[1] = argv[0];
    return overlap_mode(argc - 1, argv + 1);
  }
  if (argc == 3 && !strcmp(argv[1], "--recover-join")) return recover_join(argv[2]);
  if (argc > 1 && !strcmp(argv[1], "--recover")) {
    argv[1] = argv[0];
    return recover_mode(argc - 1, argv + 1);
  }
  if (argc > 1 && !strcmp(argv[1], "--peers")) {
    argv[1] = argv[0];
    return peers_mode(argc - 1, argv + 1);
  }
  return nccl_mode(argc, argv);
}
