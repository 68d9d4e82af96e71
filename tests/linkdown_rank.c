/* linkdown_rank.c - one rank of test_linkdown.sh: `linkdown_rank MIB ITERS`
 * runs allreduces of MIB MiB (floats) until one fails or ITERS passed,
 * checking every result against a reference computed here. After each
 * call it prints one line the script reads:
 *   "iter N ok"  or  "rank R FAILED STATUS after S s: MESSAGE"
 * Exit 0: a call failed with WEFT_ERR_TIMEOUT or WEFT_ERR_PEER_LOST and a
 * sentence naming a peer (what a cut link must give); 1: every call
 * succeeded; 2: anything else (wrong data, another status, no peer named). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
  int iters = argc > 2 ? atoi(argv[2]) : 1000;
  setvbuf(stdout, NULL, _IOLBF, 0);
  weft_comm *comm;
  if (weft_comm_init_env(&comm)) {
    printf("rank ? FAILED init: %s\n", weft_last_error(NULL));
    return 2;
  }
  int rank = weft_comm_rank(comm), size = weft_comm_size(comm);
  size_t n = mib * 1024 * 1024 / sizeof(float);
  float *v = malloc(n * sizeof *v);
  if (!v) return 2;
  int rc = 1;
  for (int it = 0; it < iters; it++) {
    /* small integers: exact in float, so the sum over ranks is exact */
    for (size_t i = 0; i < n; i++) v[i] = (float)((i + (size_t)it) % 97 + (size_t)rank);
    double t0 = now();
    weft_status st = weft_allreduce(comm, v, v, n, WEFT_F32, WEFT_SUM);
    double took = now() - t0;
    if (st) {
      const char *msg = weft_last_error(comm);
      printf("rank %d FAILED %s after %.2f s: %s\n", rank, weft_status_name(st), took, msg);
      bool expected = st == WEFT_ERR_TIMEOUT || st == WEFT_ERR_PEER_LOST;
      rc = expected && strstr(msg, "peer") ? 0 : 2;
      break;
    }
    for (size_t i = 0; i < n; i++) {
      double want = (double)size * (double)((i + (size_t)it) % 97) + (double)size * (size - 1) / 2;
      if (v[i] != (float)want) {
        printf("rank %d FAILED wrong data at iteration %d element %zu: %g, want %g\n", rank, it, i,
               v[i], want);
        rc = 2;
        goto out;
      }
    }
    printf("iter %d ok (%.2f s)\n", it, took);
  }
out:
  free(v);
  weft_comm_destroy(comm);
  return rc;
}
