/* weft-bench - an nccl-tests-style sweep of weft_allreduce / weft_broadcast.
 * Prints one row per size with nccl-tests' columns (size count type redop
 * root, then time algbw busbw #wrong out of place and in place), so scripts
 * written for nccl-tests read it. Runs under weftrun, mpirun, srun or
 * torchrun alike (weft_comm_init_env).
 *
 * --peers switches to the CLI and row format of ../shared/peers
 * (bench_common.h): -c allreduce|bcast, median of per-iteration times with a
 * barrier before each, max over ranks; for side-by-side tables. */
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
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

/* Small integers (exact in every type): 1..4 */
static int pattern(size_t i, int rank) { return (int)((i * 7 + (size_t)rank * 3) % 4) + 1; }

static void set_elem(void *buf, size_t i, weft_dtype dt, int v) {
  switch (dt) {
    case WEFT_F32: ((float *)buf)[i] = (float)v; break;
    case WEFT_F64: ((double *)buf)[i] = v; break;
    case WEFT_F16: { /* small positive integers: exact binary16 */
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

static double expected(size_t i, int np, weft_op op, int is_bcast, int root) {
  if (is_bcast) return pattern(i, root);
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
  return op == WEFT_AVG ? acc / np : acc;
}

/* ---- nccl-tests mode ------------------------------------------------------ */

struct opts {
  size_t minb, maxb;
  int factor, iters, warmup, check, root, is_bcast;
  weft_dtype dtype;
  weft_op op;
};

static weft_status run_once(weft_comm *comm, const struct opts *o, const void *send, void *recv,
                            size_t count) {
  if (o->is_bcast) return weft_broadcast(comm, send, recv, count, o->dtype, o->root);
  return weft_allreduce(comm, send, recv, count, o->dtype, o->op);
}

static long check_result(weft_comm *comm, const struct opts *o, void *send, void *recv,
                         size_t count, int in_place) {
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  for (size_t i = 0; i < count; i++) set_elem(send, i, o->dtype, pattern(i, rank));
  if (!in_place) memset(recv, 0, count * weft_dtype_size(o->dtype));
  void *dst = in_place ? send : recv;
  weft_status st = run_once(comm, o, send, dst, count);
  if (st) die(comm, st, "checked run");
  long wrong = 0;
  int is_int = o->dtype >= WEFT_I8;
  double tol = o->dtype == WEFT_F16 || o->dtype == WEFT_BF16 ? 1e-2 : 1e-6;
  for (size_t i = 0; i < count; i++) {
    double want = expected(i, np, o->op, o->is_bcast, o->root);
    if (is_int && o->op == WEFT_AVG) want = trunc(want);
    if (is_int && o->dtype == WEFT_I8) want = (double)(int8_t)(int64_t)want;
    if (is_int && o->dtype == WEFT_U8) want = (double)(uint8_t)(int64_t)want;
    double got = get_elem(dst, i, o->dtype);
    if (fabs(got - want) > tol * fabs(want)) wrong++;
  }
  return sum_over_ranks(comm, wrong);
}

static double time_batch(weft_comm *comm, const struct opts *o, const void *send, void *recv,
                         size_t count) {
  for (int i = 0; i < o->warmup; i++) {
    weft_status st = run_once(comm, o, send, recv, count);
    if (st) die(comm, st, "warmup");
  }
  weft_status st = weft_barrier(comm);
  if (st) die(comm, st, "barrier");
  double t0 = now_us();
  for (int i = 0; i < o->iters; i++) {
    st = run_once(comm, o, send, recv, count);
    if (st) die(comm, st, "timed run");
  }
  return max_over_ranks(comm, (now_us() - t0) / o->iters);
}

static int nccl_mode(int argc, char **argv) {
  struct opts o = {8, 64u << 20, 2, 20, 5, 1, 0, 0, WEFT_F32, WEFT_SUM};
  const char *dnames[] = {"float", "double", "half", "bfloat16", "int8", "uint8", "int32", "int64"};
  int c;
  while ((c = getopt(argc, argv, "b:e:f:n:w:c:d:o:r:C:h")) != -1) {
    switch (c) {
      case 'b': o.minb = parse_size(optarg); break;
      case 'e': o.maxb = parse_size(optarg); break;
      case 'f': o.factor = atoi(optarg); break;
      case 'n': o.iters = atoi(optarg); break;
      case 'w': o.warmup = atoi(optarg); break;
      case 'c': o.check = atoi(optarg); break;
      case 'r': o.root = atoi(optarg); break;
      case 'C':
        /* A name this mode cannot run is refused, never run as another */
        if (!strcmp(optarg, "broadcast") || !strcmp(optarg, "bcast")) {
          o.is_bcast = 1;
        } else if (!strcmp(optarg, "allreduce")) {
          o.is_bcast = 0;
        } else {
          fprintf(stderr, "weft-bench: unknown collective '%s' (-C allreduce|broadcast)\n", optarg);
          return 2;
        }
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
        fprintf(stderr,
                "usage: weft-bench [-C allreduce|broadcast] [-b minbytes] [-e maxbytes] [-f factor]\n"
                "                  [-n iters] [-w warmup] [-c 0|1 check] [-d dtype] [-o op] [-r root]\n"
                "       weft-bench --peers [-c allreduce|bcast] ... (../shared/peers format)\n"
                "  --bind: pin each rank to one CPU by local rank (as mpirun does)\n"
                "  --shared: buffers from weft_mem_alloc (ranks of one host reach them directly)\n"
                "Run one process per rank: weftrun -n 4 weft-bench, or under mpirun/srun/torchrun.\n");
        return c == 'h' ? 0 : 2;
    }
  }
  if (o.factor < 2) o.factor = 2;
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) die(NULL, st, "init");
  bind_to_core(comm);
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  if (o.root < 0 || o.root >= np) o.root = 0;
  size_t esz = weft_dtype_size(o.dtype);
  void *send = alloc_prefaulted(o.maxb), *recv = alloc_prefaulted(o.maxb);
  if (!send || !recv) die(comm, WEFT_ERR_NOMEM, "buffers");
  if (rank == 0) {
    printf("# weft-bench %s: %s, %d ranks, dtype %s, op %s, iters %d, warmup %d, check %d\n",
           weft_version_string(), o.is_bcast ? "broadcast" : "allreduce", np,
           weft_dtype_name(o.dtype), o.is_bcast ? "none" : weft_op_name(o.op), o.iters, o.warmup, o.check);
  }
  print_transports(comm);
  if (rank == 0) {
    printf("#%62s%34s\n", "out-of-place", "in-place");
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  double bw_sum = 0;
  int rows = 0;
  for (size_t bytes = o.minb; bytes <= o.maxb; bytes *= (size_t)o.factor) {
    size_t count = bytes / esz;
    double busf = o.is_bcast ? 1.0 : 2.0 * (np - 1) / np;
    double t[2], algbw[2];
    long wrong[2] = {0, 0};
    for (int ip = 0; ip < 2; ip++) {
      if (o.check) wrong[ip] = check_result(comm, &o, send, recv, count, ip);
      t[ip] = time_batch(comm, &o, send, ip ? send : recv, count);
      algbw[ip] = t[ip] > 0 ? count * esz / (t[ip] * 1e3) : 0;
    }
    if (rank == 0) {
      printf(" %11zu %12zu %8s %6s %6d %8.2f %7.2f %7.2f %6ld %8.2f %7.2f %7.2f %6ld\n",
             count * esz, count, dnames[o.dtype], o.is_bcast ? "none" : weft_op_name(o.op),
             o.is_bcast ? o.root : -1, t[0], algbw[0], algbw[0] * busf, o.check ? wrong[0] : -1L,
             t[1], algbw[1], algbw[1] * busf, o.check ? wrong[1] : -1L);
      fflush(stdout);
    }
    bw_sum += algbw[1] * busf;
    rows++;
    if (bytes == 0) break;
  }
  if (rank == 0) printf("# Avg bus bandwidth    : %g\n#\n", rows ? bw_sum / rows : 0);
  release(send);
  release(recv);
  weft_comm_destroy(comm);
  return 0;
}

/* ---- ../shared/peers mode ---------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int peers_mode(int argc, char **argv) {
  const char *coll = "allreduce", *label = "";
  size_t minb = 8, maxb = 64u << 20, iter_bytes = 256u << 20;
  int factor = 4, iters_min = 5, iters_max = 200, barrier = 1, c;
  while ((c = getopt(argc, argv, "c:b:e:f:n:m:I:Nt:")) != -1) {
    switch (c) {
      case 'c': coll = optarg; break;
      case 'b': minb = parse_size(optarg); break;
      case 'e': maxb = parse_size(optarg); break;
      case 'f': factor = atoi(optarg); break;
      case 'n': iters_max = atoi(optarg); break;
      case 'm': iters_min = atoi(optarg); break;
      case 'I': iter_bytes = parse_size(optarg); break;
      case 'N': barrier = 0; break;
      case 't': label = optarg; break;
      default: fprintf(stderr, "weft-bench --peers: see ../shared/peers/src/bench_common.h\n"); return 2;
    }
  }
  if (strcmp(coll, "allreduce") && strcmp(coll, "bcast")) {
    fprintf(stderr, "weft-bench --peers: unknown collective '%s' (-c allreduce|bcast)\n", coll);
    return 2;
  }
  int is_bcast = coll[0] == 'b';
  if (minb < 4) minb = 4;
  minb &= ~(size_t)3;
  maxb &= ~(size_t)3;
  if (factor < 2) factor = 2;
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) die(NULL, st, "init");
  bind_to_core(comm);
  int rank = weft_comm_rank(comm), np = weft_comm_size(comm);
  float *send = alloc_prefaulted(maxb), *recv = alloc_prefaulted(maxb);
  double *times = malloc(sizeof(double) * (size_t)(iters_max > iters_min ? iters_max : iters_min));
  if (!send || !recv || !times) die(comm, WEFT_ERR_NOMEM, "buffers");
  if (rank == 0) {
    printf("# peer=weft_%s coll=%s np=%d dtype=float32 op=%s label=\"%s\"\n", weft_version_string(),
           coll, np, is_bcast ? "none(root=0)" : "sum", label);
    printf("# timing: median over iters of per-iter time, max over ranks; %s; GB/s=1e9B/s\n",
           barrier ? "barrier before each iter" : "back-to-back (no barrier)");
  }
  print_transports(comm); /* "#" lines: run.sh reads only rows with 7 fields not starting with '#' */
  if (rank == 0) {
    printf("# %10s %10s %6s %11s %10s %10s %6s\n", "bytes", "count", "iters", "time_us",
           "algbw_GBs", "busbw_GBs", "check");
    fflush(stdout);
  }
  for (size_t bytes = minb; bytes; bytes = bytes >= maxb ? 0 : (bytes * factor > maxb ? maxb : bytes * factor)) {
    size_t count = bytes / 4;
    for (size_t i = 0; i < count; i++) {
      float v = (float)((i % 13) + 1);
      send[i] = is_bcast ? (rank == 0 ? v : 0) : (float)(rank + 1) * v;
      recv[i] = 0;
    }
    st = is_bcast ? weft_broadcast(comm, send, rank == 0 ? send : recv, count, WEFT_F32, 0)
                  : weft_allreduce(comm, send, recv, count, WEFT_F32, WEFT_SUM);
    if (st) die(comm, st, "checked run");
    const float *res = is_bcast && rank == 0 ? send : recv;
    float scale = is_bcast ? 1.0f : (float)(np * (np + 1) / 2);
    long errs = 0;
    for (size_t i = 0; i < count; i++)
      if (res[i] != scale * (float)((i % 13) + 1)) errs++;
    errs = sum_over_ranks(comm, errs);
    size_t it = iter_bytes / bytes;
    int iters = (int)(it < (size_t)iters_min ? (size_t)iters_min : it > (size_t)iters_max ? (size_t)iters_max : it);
    for (int w = 0; w < iters / 10 + 1; w++) {
      st = is_bcast ? weft_broadcast(comm, send, recv, count, WEFT_F32, 0)
                    : weft_allreduce(comm, send, recv, count, WEFT_F32, WEFT_SUM);
      if (st) die(comm, st, "warmup");
    }
    for (int k = 0; k < iters; k++) {
      if (barrier && (st = weft_barrier(comm))) die(comm, st, "barrier");
      double t0 = now_us();
      st = is_bcast ? weft_broadcast(comm, send, recv, count, WEFT_F32, 0)
                    : weft_allreduce(comm, send, recv, count, WEFT_F32, WEFT_SUM);
      if (st) die(comm, st, "timed run");
      times[k] = now_us() - t0;
    }
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    double med = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    med = max_over_ranks(comm, med);
    if (rank == 0) {
      double algbw = bytes / (med * 1e-6) / 1e9;
      printf("  %10zu %10zu %6d %11.2f %10.3f %10.3f %6s\n", bytes, count, iters, med, algbw,
             algbw * (is_bcast ? 1.0 : 2.0 * (np - 1) / np), errs ? "FAIL" : "ok");
      if (errs) printf("# FAIL: %ld wrong elements (summed over ranks)\n", errs);
      fflush(stdout);
    }
  }
  release(send);
  release(recv);
  free(times);
  weft_comm_destroy(comm);
  return 0;
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

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) /* --bind and --shared may stand anywhere: take them out */
    if (!strcmp(argv[i], "--bind") || !strcmp(argv[i], "--shared")) {
      if (!strcmp(argv[i], "--bind")) bind_requested = 1;
      else shared_requested = 1;
      memmove(&argv[i], &argv[i + 1], sizeof *argv * (size_t)(argc - i));
      argc--;
      i--;
    }
  if (argc > 1 && !strcmp(argv[1], "--overlap")) {
    argv[1] = argv[0];
    return overlap_mode(argc - 1, argv + 1);
  }
  if (argc > 1 && !strcmp(argv[1], "--peers")) {
    argv[1] = argv[0];
    return peers_mode(argc - 1, argv + 1);
  }
  return nccl_mode(argc, argv);
}
