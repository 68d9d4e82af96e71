/* rails_rank.c - one rank of the multi-rail test (test_rails.sh):
 * `rails_rank WORDS` checks that every peer TCP carries names WORDS in its
 * reason (weft_comm_peer_transport: "tcp x2 streams over wr0,wr1 to ..."),
 * then runs allreduce, broadcast, allgather and alltoall large enough to
 * cross the rails many times, against a serial reference in double. Exit 0
 * only when everything matched.
 * `rails_rank WORDS loop` runs checked allreduces, printing "iter N ok",
 * until one fails (a rail is cut under it): it prints "rank R FAILED
 * STATUS: sentence" and exits 0; 1 if none failed or a result was wrong. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

/* k/8 with |k| < 8192: sums of a few ranks are exact in float. */
static float value(size_t i, int rank, int tag) {
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull ^ (uint64_t)(rank + 1) * 0xBF58476D1CE4E5B9ull ^
               (uint64_t)tag << 56;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (float)((int)(x % 16384) - 8192) / 8.0f;
}

static int fail(int rank, const char *what, size_t i, double got, double want) {
  fprintf(stderr, "rank %d: %s element %zu = %g, expected %g\n", rank, what, i, got, want);
  return 1;
}

int main(int argc, char **argv) {
  const char *words = argc > 1 ? argv[1] : "";
  weft_comm *comm;
  if (weft_comm_init_env(&comm)) {
    fprintf(stderr, "init: %s\n", weft_last_error(NULL));
    return 1;
  }
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm);
  for (int p = 0; p < size; p++) {
    const char *tp, *why;
    if (p == rank || weft_comm_peer_transport(comm, p, &tp, &why)) continue;
    printf("rank %d -> peer %d: %s (%s)\n", rank, p, tp, why);
    if (!strcmp(tp, "tcp") && !strstr(why, words)) {
      fprintf(stderr, "rank %d: peer %d's reason lacks \"%s\": %s\n", rank, p, words, why);
      return 1;
    }
  }
  size_t n = 4u << 20; /* 16 MiB of floats */
  float *v = malloc(n * sizeof *v);
  if (argc > 2 && !strcmp(argv[2], "loop")) {
    for (int it = 0; it < 400; it++) {
      for (size_t i = 0; i < n; i++) v[i] = value(i, rank, 1);
      weft_status st = weft_allreduce(comm, v, v, n, WEFT_F32, WEFT_SUM);
      if (st) {
        printf("rank %d FAILED %s: %s\n", rank, weft_status_name(st), weft_last_error(comm));
        return 0;
      }
      for (size_t i = 0; i < n; i += 4099) {
        double want = 0;
        for (int r = 0; r < size; r++) want += value(i, r, 1);
        if ((double)v[i] != want) return fail(rank, "allreduce", i, v[i], want);
      }
      printf("iter %d ok\n", it);
      fflush(stdout);
    }
    fprintf(stderr, "rank %d: no call failed\n", rank);
    return 1;
  }
  for (int it = 0; it < 3; it++) {
    for (size_t i = 0; i < n; i++) v[i] = value(i, rank, it);
    if (weft_allreduce(comm, v, v, n, WEFT_F32, WEFT_SUM)) {
      fprintf(stderr, "rank %d: allreduce: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    for (size_t i = 0; i < n; i++) {
      double want = 0;
      for (int r = 0; r < size; r++) want += value(i, r, it);
      if ((double)v[i] != want) return fail(rank, "allreduce", i, v[i], want);
    }
  }
  for (int root = 0; root < size; root++) {
    for (size_t i = 0; i < n; i++) v[i] = rank == root ? value(i, root, 10) : 0;
    if (weft_broadcast(comm, v, v, n, WEFT_F32, root)) {
      fprintf(stderr, "rank %d: broadcast: %s\n", rank, weft_last_error(comm));
      return 1;
    }
    for (size_t i = 0; i < n; i++)
      if (v[i] != value(i, root, 10)) return fail(rank, "broadcast", i, v[i], value(i, root, 10));
  }
  size_t per = n / (size_t)size;
  float *all = malloc(n * sizeof *all);
  for (size_t i = 0; i < per; i++) v[i] = value(i, rank, 20);
  if (weft_allgather(comm, v, all, per, WEFT_F32)) {
    fprintf(stderr, "rank %d: allgather: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < per; i++)
      if (all[(size_t)r * per + i] != value(i, r, 20))
        return fail(rank, "allgather", (size_t)r * per + i, all[(size_t)r * per + i], value(i, r, 20));
  /* alltoall: block q of rank r's input is value(., r, 30 + q) */
  for (int q = 0; q < size; q++)
    for (size_t i = 0; i < per; i++) v[(size_t)q * per + i] = value(i, rank, 30 + q);
  if (weft_alltoall(comm, v, all, per, WEFT_F32)) {
    fprintf(stderr, "rank %d: alltoall: %s\n", rank, weft_last_error(comm));
    return 1;
  }
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < per; i++)
      if (all[(size_t)r * per + i] != value(i, r, 30 + rank))
        return fail(rank, "alltoall", (size_t)r * per + i, all[(size_t)r * per + i],
                    value(i, r, 30 + rank));
  free(v);
  free(all);
  weft_comm_destroy(comm);
  printf("rank %d: all results correct\n", rank);
  return 0;
}
