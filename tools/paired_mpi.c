/* paired_mpi.c - weft and Open MPI timed in the same processes, block by
 * block, so that both see the same placement of ranks on host cores.
 *
 * Why: on a virtual machine the host moves the guest's vCPUs near each other
 * (a shared cache) or apart every few seconds, and a cross-core copy is then
 * 2-3x slower (docs/performance.md, "the host moves the two vCPUs"). Two
 * benchmarks run one after the other draw placements independently, so a
 * single run of a 2-rank row compares placements as much as libraries. Here
 * one mpirun job initializes both libraries on the same buffers and, for each
 * size, alternates blocks of iterations (MPI, weft, weft, MPI, ...) a few
 * milliseconds long; both medians then come from the same stretch of time.
 *
 * Not built by meson (it needs mpicc); tools/paired_mpi.sh builds and runs it.
 * Timing rule as ../shared/peers/src/bench_common.h: the library's own
 * barrier before each iteration, each rank's median, the max over ranks; bytes as nccl-tests
 * (the whole buffer). The first call of each library per size is checked
 * against the expected values (small integers, exact in float). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "weft.h"

enum coll { C_ALLREDUCE, C_BCAST, C_ALLGATHER, C_REDUCE_SCATTER, C_ALLTOALL };
static const char *const coll_names[] = {"allreduce", "bcast", "allgather", "reduce_scatter",
                                         "alltoall"};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static float *alloc_floats(size_t n) {
  size_t bytes = (n ? n : 1) * sizeof(float);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(p, 0, bytes); /* pre-faulted */
  return p;
}

typedef struct job {
  enum coll c;
  int rank, np;
  size_t send_n, recv_n, count; /* elements: send buffer, receive buffer, the call's count */
  float *send, *recv;
  weft_comm *w;
} job;

static float val(size_t i, int rank) { return (float)((i + (size_t)rank) % 13 + 1); }

static void fill(job *j) {
  for (size_t i = 0; i < j->send_n; i++) j->send[i] = val(i, j->rank);
  memset(j->recv, 0, j->recv_n * sizeof(float));
}

/* wrong elements against what the collective must give */
static long check(const job *j) {
  long bad = 0;
  size_t blk = j->count;
  for (size_t i = 0; i < j->recv_n; i++) {
    float want = 0;
    switch (j->c) {
    case C_ALLREDUCE:
      for (int r = 0; r < j->np; r++) want += val(i, r);
      break;
    case C_BCAST: want = val(i, 0); break;
    case C_ALLGATHER: want = val(i % blk, (int)(i / blk)); break;
    case C_REDUCE_SCATTER:
      for (int r = 0; r < j->np; r++) want += val((size_t)j->rank * blk + i, r);
      break;
    case C_ALLTOALL: want = val((size_t)j->rank * blk + i % blk, (int)(i / blk)); break;
    }
    if (j->recv[i] != want) bad++;
  }
  return bad;
}

static int run_mpi(job *j) {
  switch (j->c) {
  case C_ALLREDUCE:
    return MPI_Allreduce(j->send, j->recv, (int)j->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  case C_BCAST: {
    float *b = j->rank == 0 ? j->send : j->recv;
    return MPI_Bcast(b, (int)j->count, MPI_FLOAT, 0, MPI_COMM_WORLD); /* the root's is in place */
  }
  case C_ALLGATHER:
    return MPI_Allgather(j->send, (int)j->count, MPI_FLOAT, j->recv, (int)j->count, MPI_FLOAT,
                         MPI_COMM_WORLD);
  case C_REDUCE_SCATTER:
    return MPI_Reduce_scatter_block(j->send, j->recv, (int)j->count, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
  case C_ALLTOALL:
    return MPI_Alltoall(j->send, (int)j->count, MPI_FLOAT, j->recv, (int)j->count, MPI_FLOAT,
                        MPI_COMM_WORLD);
  }
  return 1;
}

static int run_weft(job *j) {
  switch (j->c) {
  case C_ALLREDUCE: return weft_allreduce(j->w, j->send, j->recv, j->count, WEFT_F32, WEFT_SUM);
  case C_BCAST:
    return weft_broadcast(j->w, j->rank == 0 ? j->send : NULL, j->rank == 0 ? j->send : j->recv,
                          j->count, WEFT_F32, 0);
  case C_ALLGATHER: return weft_allgather(j->w, j->send, j->recv, j->count, WEFT_F32);
  case C_REDUCE_SCATTER:
    return weft_reduce_scatter(j->w, j->send, j->recv, j->count, WEFT_F32, WEFT_SUM);
  case C_ALLTOALL: return weft_alltoall(j->w, j->send, j->recv, j->count, WEFT_F32);
  }
  return 1;
}

/* one library's first call on fresh data, checked everywhere */
static long checked_call(job *j, int lib) {
  fill(j);
  int rc = lib ? run_weft(j) : run_mpi(j);
  if (rc) {
    fprintf(stderr, "rank %d: %s %s failed: %s\n", j->rank, lib ? "weft" : "MPI",
            coll_names[j->c], lib ? weft_last_error(j->w) : "MPI error");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (j->c == C_BCAST && j->rank == 0) return 0;
  return check(j);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  job j = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &j.np);
  const char *cname = argc > 1 ? argv[1] : "allreduce";
  int ci = -1;
  for (int i = 0; i < 5; i++)
    if (!strcmp(cname, coll_names[i])) ci = i;
  if (ci < 0) {
    if (!j.rank) fprintf(stderr, "usage: paired_mpi COLL [ROUNDS [BLOCK [SIZES...]]]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  j.c = (enum coll)ci;
  const char *mb = getenv("WEFT_PAIRED_MPI_BARRIER");
  int mpi_barrier_only = mb && *mb == '1';
  const char *pr = getenv("WEFT_PAIRED_PER_RANK");
  int per_rank = pr && *pr == '1';
  int rounds = argc > 2 ? atoi(argv[2]) : 10, block = argc > 3 ? atoi(argv[3]) : 10;
  static const char *const default_sizes[] = {"8", "32768", "131072", "524288", "2097152",
                                              "8388608", "33554432"};
  int nsizes = argc > 4 ? argc - 4 : 7;
  const char *const *sizes = argc > 4 ? (const char *const *)argv + 4 : default_sizes;
  if (weft_comm_init_env(&j.w)) {
    fprintf(stderr, "rank %d: weft_comm_init_env failed\n", j.rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (!j.rank)
    printf("# %s, %d ranks, %d rounds of 2 blocks of %d iterations per library\n"
           "# %10s %12s %12s %8s %s\n",
           cname, j.np, rounds, block, "bytes", "mpi_us", "weft_us", "mpi/weft", "wrong");
  int n = rounds * block;
  double *t[2] = {malloc(sizeof(double) * (size_t)n * 2), malloc(sizeof(double) * (size_t)n * 2)};
  for (int s = 0; s < nsizes; s++) {
    size_t bytes = strtoull(sizes[s], NULL, 10), total = bytes / sizeof(float);
    size_t per = total / (size_t)j.np; /* a rank's block where the buffer is in blocks */
    switch (j.c) {
    case C_ALLREDUCE:
    case C_BCAST: j.count = j.send_n = j.recv_n = total; break;
    case C_ALLGATHER: j.count = j.send_n = per, j.recv_n = per * (size_t)j.np; break;
    case C_REDUCE_SCATTER: j.count = j.recv_n = per, j.send_n = per * (size_t)j.np; break;
    case C_ALLTOALL: j.count = per, j.send_n = j.recv_n = per * (size_t)j.np; break;
    }
    if (!j.count) continue;
    j.send = alloc_floats(j.send_n);
    j.recv = alloc_floats(j.recv_n);
    long wrong = checked_call(&j, 0) + checked_call(&j, 1);
    int got[2] = {0, 0};
    for (int r = 0; r < rounds * 2; r++) {
      int lib = (r % 4 == 0 || r % 4 == 3) ? 0 : 1; /* MPI weft weft MPI ... */
      for (int i = -1; i < block; i++) { /* i = -1: a warm-up call */
        /* each library's own barrier, as each peer's bench has (a barrier's
         * exit order shapes the next call; WEFT_PAIRED_MPI_BARRIER=1: MPI's for both) */
        if (lib && !mpi_barrier_only) {
          if (weft_barrier(j.w)) {
            fprintf(stderr, "rank %d: weft_barrier failed\n", j.rank);
            MPI_Abort(MPI_COMM_WORLD, 2);
          }
        } else {
          MPI_Barrier(MPI_COMM_WORLD);
        }
        double t0 = now_us();
        if (lib ? run_weft(&j) : run_mpi(&j)) {
          fprintf(stderr, "rank %d: %s failed\n", j.rank, lib ? "weft" : "MPI");
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
        double dt = now_us() - t0;
        if (i >= 0) t[lib][got[lib]++] = dt;
      }
    }
    double med[2] = {median(t[0], got[0]), median(t[1], got[1])}, max[2];
    long wrong_all = 0;
    MPI_Reduce(med, max, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (!j.rank)
      printf("  %10zu %12.2f %12.2f %8.2f %ld\n", bytes, max[0], max[1], max[0] / max[1], wrong_all);
    if (per_rank) { /* which rank sets the max; only rank 0 receives */
      double *all = j.rank ? NULL : malloc(sizeof(double) * 2 * (size_t)j.np);
      if (!j.rank && !all) {
        fprintf(stderr, "paired_mpi: no memory for %d ranks' medians\n", j.np);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      MPI_Gather(med, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      for (int r = 0; !j.rank && r < j.np; r++)
        printf("  %10s rank %d: %8.2f %12.2f\n", "", r, all[2 * r], all[2 * r + 1]);
      free(all);
    }
    fflush(stdout);
    munmap(j.send, (j.send_n ? j.send_n : 1) * sizeof(float));
    munmap(j.recv, (j.recv_n ? j.recv_n : 1) * sizeof(float));
  }
  weft_comm_destroy(j.w);
  MPI_Finalize();
  return 0;
}
