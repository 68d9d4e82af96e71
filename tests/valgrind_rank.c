/* valgrind_rank.c - one rank of test_valgrind.sh, small enough to run under
 * valgrind: allreduce (ring and recursive-doubling sizes), broadcast,
 * reduce, allgather, reduce-scatter, alltoall and a barrier, each checked
 * against values computed here (small integers in f32 and i64, exact).
 * Exit 0 when every result matched. `valgrind_rank peer-exits`: the last
 * rank leaves right after init and the others must get an error and clean
 * up (the error paths are where leaks hide). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft.h"

static int fail(int rank, const char *what, weft_comm *comm) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, weft_last_error(comm));
  return 1;
}

static int check_f32(int rank, const char *what, const float *got, const double *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((double)got[i] != want[i]) {
      fprintf(stderr, "rank %d: %s element %zu is %g, want %g\n", rank, what, i, got[i], want[i]);
      return 1;
    }
  return 0;
}

static int peer_exits(weft_comm *comm, int rank, int size) {
  if (rank == size - 1) _exit(0); /* gone without a word */
  float v[4096] = {0};
  weft_status st = weft_allreduce(comm, v, v, 4096, WEFT_F32, WEFT_SUM);
  printf("rank %d: allreduce with a departed peer -> %s: %s\n", rank, weft_status_name(st),
         weft_last_error(comm));
  weft_comm_destroy(comm);
  return st == WEFT_ERR_PEER_LOST || st == WEFT_ERR_TIMEOUT ? 0 : 1;
}

int main(int argc, char **argv) {
  weft_comm *comm;
  if (weft_comm_init_env(&comm)) return fail(-1, "init", NULL);
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm), bad = 0;
  if (argc > 1 && !strcmp(argv[1], "peer-exits")) return peer_exits(comm, rank, size);
  size_t counts[] = {1, 17, 70000}; /* below and above the recursive-doubling limit */
  for (int c = 0; c < 3 && !bad; c++) {
    size_t n = counts[c];
    float *v = malloc(n * size * sizeof *v);
    double *want = malloc(n * size * sizeof *want);
    int64_t *w = malloc(n * size * sizeof *w);
    for (size_t i = 0; i < n; i++) {
      v[i] = (float)(i % 31 + (size_t)rank);
      want[i] = (double)size * (double)(i % 31) + size * (size - 1) / 2.0;
    }
    if (weft_allreduce(comm, v, v, n, WEFT_F32, WEFT_SUM)) return fail(rank, "allreduce", comm);
    bad |= check_f32(rank, "allreduce", v, want, n);
    for (size_t i = 0; i < n; i++) w[i] = rank == 1 ? (int64_t)(i * 3 + 1) : -1;
    if (weft_broadcast(comm, w, w, n, WEFT_I64, 1)) return fail(rank, "broadcast", comm);
    for (size_t i = 0; i < n && !bad; i++) bad |= w[i] != (int64_t)(i * 3 + 1);
    for (size_t i = 0; i < n; i++) v[i] = (float)(i % 31 + (size_t)rank);
    if (weft_reduce(comm, v, rank == 0 ? v : NULL, n, WEFT_F32, WEFT_SUM, 0))
      return fail(rank, "reduce", comm);
    if (rank == 0) bad |= check_f32(rank, "reduce", v, want, n);
    /* allgather: block r is rank r's values */
    for (size_t i = 0; i < n; i++) w[(size_t)rank * n + i] = (int64_t)(rank * 1000 + (int)(i % 97));
    if (weft_allgather(comm, w + (size_t)rank * n, w, n, WEFT_I64))
      return fail(rank, "allgather", comm);
    for (size_t i = 0; i < n * size && !bad; i++)
      bad |= w[i] != (int64_t)((int)(i / n) * 1000 + (int)(i % n % 97));
    /* reduce-scatter: block r summed over ranks lands on rank r */
    for (size_t i = 0; i < n * size; i++) v[i] = (float)(i % 13 + (size_t)rank);
    if (weft_reduce_scatter(comm, v, v + (size_t)rank * n, n, WEFT_F32, WEFT_SUM))
      return fail(rank, "reduce_scatter", comm);
    for (size_t i = 0; i < n; i++)
      want[i] = (double)size * (double)(((size_t)rank * n + i) % 13) + size * (size - 1) / 2.0;
    bad |= check_f32(rank, "reduce_scatter", v + (size_t)rank * n, want, n);
    /* alltoall: block j of rank i's send lands on rank j as block i */
    int64_t *out = malloc(n * size * sizeof *out);
    for (size_t i = 0; i < n * size; i++) w[i] = (int64_t)(rank * 100 + (int)(i / n));
    if (weft_alltoall(comm, w, out, n, WEFT_I64)) return fail(rank, "alltoall", comm);
    for (size_t i = 0; i < n * size && !bad; i++)
      bad |= out[i] != (int64_t)((int)(i / n) * 100 + rank);
    free(out);
    free(v);
    free(want);
    free(w);
  }
  if (!bad && weft_barrier(comm)) return fail(rank, "barrier", comm);
  if (weft_comm_destroy(comm)) bad = 1;
  if (bad) fprintf(stderr, "rank %d: a result differed from the reference\n", rank);
  return bad;
}
