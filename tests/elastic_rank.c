/* elastic_rank.c - one rank of tests/test_elastic_linkdown.sh: allreduces
 * (i64 sums of rank + 1) until one fails (a link is cut under the job),
 * then weft_comm_shrink and one allreduce on the survivors, whose sum says
 * who they are. Prints "iter 1 ok" once traffic flows, then "failed: ..."
 * and "shrunk: rank R of N, sum S, T ms after the failure" (or "shrink
 * failed: ..."). Exit 0 either way: the script judges the lines. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "weft.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
  weft_comm *comm;
  weft_status st = weft_comm_init_env(&comm);
  if (st) {
    printf("init failed: %s\n", weft_last_error(NULL));
    return 2;
  }
  int rank = weft_comm_rank(comm);
  static int64_t v[4096];
  for (int iter = 0; iter < 1000000; iter++) {
    for (int i = 0; i < 4096; i++) v[i] = rank + 1;
    st = weft_allreduce(comm, v, v, 4096, WEFT_I64, WEFT_SUM);
    if (st) break;
    if (iter == 1) {
      printf("iter 1 ok\n");
      fflush(stdout);
    }
  }
  double failed_at = now_s();
  printf("failed: %s\n", weft_last_error(comm));
  fflush(stdout);
  weft_comm *survivors;
  st = weft_comm_shrink(comm, &survivors);
  if (st) {
    printf("shrink failed: %s\n", weft_last_error(comm));
    weft_comm_destroy(comm);
    return 0;
  }
  int64_t mine = rank + 1;
  st = weft_allreduce(survivors, &mine, &mine, 1, WEFT_I64, WEFT_SUM);
  printf("shrunk: rank %d of %d, sum %lld, %.0f ms after the failure%s\n",
         weft_comm_rank(survivors), weft_comm_size(survivors), (long long)mine,
         (now_s() - failed_at) * 1e3, st ? " (its allreduce failed)" : "");
  weft_comm_destroy(survivors);
  weft_comm_destroy(comm);
  return 0;
}
