/* multihost_rank.c - one rank of the transport-choice tests
 * (test_multihost.sh, test_small_shm.sh): `multihost_rank N [TRANSPORT]`
 * checks that peers within its group of N ranks (one host id) use shared
 * memory and the others TCP, or that every peer uses TRANSPORT, then runs
 * allreduce and broadcast against a serial reference. Exit 0 only when
 * everything matched. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

int main(int argc, char **argv) {
  int ranks_per_host = argc > 1 ? atoi(argv[1]) : 2;
  const char *only = argc > 2 ? argv[2] : NULL; /* every peer must use this transport */
  weft_comm *comm;
  if (weft_comm_init_env(&comm)) {
    fprintf(stderr, "init: %s\n", weft_last_error(NULL));
    return 1;
  }
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm), bad = 0;
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    const char *tp, *why;
    weft_comm_peer_transport(comm, p, &tp, &why);
    const char *want = only ? only : p / ranks_per_host == rank / ranks_per_host ? "shm" : "tcp";
    printf("rank %d -> peer %d: %s (%s)\n", rank, p, tp, why);
    if (strcmp(tp, want)) {
      fprintf(stderr, "rank %d: peer %d uses %s, expected %s\n", rank, p, tp, want);
      bad++;
    }
  }
  size_t n = 3 * 1024 * 1024 + 7; /* several MiB, through chunks of every kind of link */
  int64_t *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = (int64_t)(i * 2654435761u) ^ (int64_t)(rank + 1) * 1000003;
  if (weft_allreduce(comm, v, v, n, WEFT_I64, WEFT_SUM)) {
    fprintf(stderr, "allreduce: %s\n", weft_last_error(comm));
    return 1;
  }
  for (size_t i = 0; i < n && bad < 5; i++) {
    uint64_t want = 0;
    for (int r = 0; r < size; r++) want += (uint64_t)((int64_t)(i * 2654435761u) ^ (int64_t)(r + 1) * 1000003);
    if ((uint64_t)v[i] != want) {
      fprintf(stderr, "rank %d: allreduce element %zu wrong\n", rank, i);
      bad++;
    }
  }
  for (int root = 0; root < size; root++) {
    for (size_t i = 0; i < n; i++) v[i] = rank == root ? (int64_t)(i ^ (size_t)root) : -1;
    if (weft_broadcast(comm, v, v, n, WEFT_I64, root)) {
      fprintf(stderr, "broadcast: %s\n", weft_last_error(comm));
      return 1;
    }
    for (size_t i = 0; i < n && bad < 5; i++)
      if (v[i] != (int64_t)(i ^ (size_t)root)) {
        fprintf(stderr, "rank %d: broadcast from %d element %zu wrong\n", rank, root, i);
        bad++;
      }
  }
  free(v);
  weft_comm_destroy(comm);
  if (!bad) printf("rank %d: all results correct\n", rank);
  return bad ? 1 : 0;
}
