/* elastic_train.c - data-parallel training that loses ranks and goes on
 * (issue 48): the MLP of dp_train.c, plain SGD, with ranks SIGKILLed at
 * chosen steps. When a step's allreduce fails, the survivors shrink the
 * communicator (weft_comm_shrink) and redo that step among themselves: no
 * step is lost, and the average is over the survivors.
 *
 *   weftrun --elastic -n 4 build/examples/weft-elastic-train --steps 60 \
 *           --kill 20:1,35:0 --out params.txt
 *
 * Every step takes the same global batch of --batch samples, split evenly
 * over the ranks alive (the batch must split over every size the run goes
 * through), and the gradients are averaged: so the parameters do not
 * depend on how many ranks computed them, and a run that lost ranks ends
 * with the parameters of a 1-rank run, up to float rounding
 * (tests/test_elastic_train.sh compares them).
 *
 * --restart: after each loss, rank 0 of the survivors starts a replacement
 * (this program again), which joins (weft_comm_join) while the survivors
 * weft_comm_grow; it gets the parameters and the step from rank 0, and
 * the run goes on at full size:
 *
 *   weftrun --elastic -n 4 build/examples/weft-elastic-train --kill 10:1,30:0 --restart
 *
 * --kill STEP:RANK,...: the rank launched as RANK kills itself (SIGKILL) a
 * random 0 to 200 microseconds after it entered the allreduce of STEP: in
 * it, or in one of the next calls. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mlp.h"
#include "weft.h"

#define CHECK(expr) MLP_CHECK("elastic_train", expr)

enum { MAX_KILLS = 16 };

typedef struct options {
  int steps, batch;
  double lr;
  const char *out;
  int nkills, kill_step[MAX_KILLS], kill_rank[MAX_KILLS];
  int restart;
} options;

static int parse_kills(const char *v, options *o) {
  for (const char *p = v; *p && o->nkills < MAX_KILLS;) {
    int step, rank, used;
    if (sscanf(p, "%d:%d%n", &step, &rank, &used) != 2) return -1;
    o->kill_step[o->nkills] = step;
    o->kill_rank[o->nkills++] = rank;
    p += used;
    if (*p == ',') p++;
  }
  return 0;
}

static int parse(int argc, char **argv, options *o) {
  *o = (options){.steps = 60, .batch = 48, .lr = 0.5};
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--restart")) { /* takes no value */
      o->restart = 1;
      i--;
      continue;
    }
    if (!v) return -1;
    if (!strcmp(a, "--steps")) o->steps = atoi(v);
    else if (!strcmp(a, "--batch")) o->batch = atoi(v);
    else if (!strcmp(a, "--lr")) o->lr = atof(v);
    else if (!strcmp(a, "--out")) o->out = v;

    else if (!strcmp(a, "--kill")) {
      if (parse_kills(v, o)) return -1;
    } else return -1;
  }
  return o->steps > 0 && o->batch > 0 && o->batch <= MAX_LOCAL ? 0 : -1;
}

static void no_hook(void *ctx, int bias, int weight) {
  (void)ctx;
  (void)bias;
  (void)weight;
}

static void die_now(int sig) {
  (void)sig;
  raise(SIGKILL);
}

/* A replacement: rank 0 runs this program again with --join HEX first. */
static pid_t start_replacement(weft_comm *comm, int argc, char **argv) {
  weft_unique_id gid;
  if (weft_comm_grow_id(comm, &gid)) return -1;
  char hex[2 * sizeof gid.bytes + 1];
  for (size_t i = 0; i < sizeof gid.bytes; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)gid.bytes[i]);
  char **args = calloc((size_t)argc + 3, sizeof *args);
  args[0] = argv[0];
  args[1] = "--join";
  args[2] = hex;
  for (int i = 1; i < argc; i++) args[i + 2] = argv[i];
  pid_t pid = fork();
  if (pid == 0) {
    execv("/proc/self/exe", args);
    _exit(127);
  }
  free(args);
  return pid;
}

int main(int argc, char **argv) {
  const char *join_hex = NULL;
  if (argc > 2 && !strcmp(argv[1], "--join")) { /* a replacement */
    join_hex = argv[2];
    argv[2] = argv[0];
    argv += 2;
    argc -= 2;
  }
  options o;
  if (parse(argc, argv, &o)) {
    fprintf(stderr, "usage: elastic_train [--steps N] [--batch B] [--lr X] [--out FILE]\n"
                    "                     [--kill STEP:RANK,...] [--restart]\n");
    return 2;
  }
  weft_comm *comm = NULL;
  weft_status st;
  if (join_hex) {
    weft_unique_id gid;
    for (size_t i = 0; i < sizeof gid.bytes; i++)
      if (sscanf(join_hex + 2 * i, "%2hhx", (unsigned char *)&gid.bytes[i]) != 1) return 2;
    st = weft_comm_join(&gid, &comm);
    if (st) mlp_die("elastic_train", NULL, st, "weft_comm_join");
  } else {
    st = weft_comm_init_env(&comm);
    if (st) mlp_die("elastic_train", NULL, st, "weft_comm_init_env");
  }
  const int launched_as = join_hex ? -1 : weft_comm_rank(comm); /* -1: no --kill applies */
  int replacements = 0;
  pid_t children[MAX_KILLS] = {0};

  /* the parameters and their gradients, one buffer each */
  size_t total = 0, off[NPARAMS];
  for (int k = 0; k < NPARAMS; k++) {
    off[k] = total;
    total += param_count[k];
  }
  float *pbuf = malloc(total * sizeof(float)), *gbuf = malloc(total * sizeof(float));
  float *before = malloc(total * sizeof(float)); /* the parameters before the last step */
  float *p[NPARAMS], *g[NPARAMS];
  for (int k = 0; k < NPARAMS; k++) {
    p[k] = pbuf + off[k];
    g[k] = gbuf + off[k];
  }
  mlp_init(p, weft_comm_rank(comm));
  int recoveries = 0, step = 0;
  /* rank 0's start; a replacement gets the parameters and the step the
   * others are at (below, after each grow) */
  if (join_hex) {
    int64_t at = 0;
    CHECK(weft_broadcast(comm, &at, &at, 1, WEFT_I64, 0));
    step = (int)at;
  }
  CHECK(weft_broadcast(comm, pbuf, pbuf, total, WEFT_F32, 0));

  while (step < o.steps) {
    int rank = weft_comm_rank(comm), size = weft_comm_size(comm);
    if (o.batch % size) {
      fprintf(stderr, "elastic_train: batch %d does not split over %d ranks\n", o.batch, size);
      return 2;
    }
    int local = o.batch / size;
    memset(gbuf, 0, total * sizeof(float));
    int correct = 0;
    uint64_t first = (uint64_t)step * (uint64_t)o.batch + (uint64_t)rank * (uint64_t)local;
    double loss = mlp_backward(p, g, first, local, 1.0f / (float)local, &correct, no_hook, NULL);
    for (int i = 0; i < o.nkills; i++)
      if (o.kill_step[i] == step && o.kill_rank[i] == launched_as) {
        srand((unsigned)time(NULL) ^ (unsigned)getpid());
        signal(SIGALRM, die_now);
        ualarm((useconds_t)(1 + rand() % 200), 0);
      }
    double metrics[2] = {loss / local, (double)correct / local}, counts[2] = {local, local};
    st = weft_allreduce(comm, gbuf, gbuf, total, WEFT_F32, WEFT_AVG);
    if (!st) st = weft_metrics_average(comm, metrics, counts, 2);
    if (st) {
      /* a rank is gone: the survivors agree on who, make a communicator of
       * themselves, and redo this step (the parameters were not touched) */
      if (rank == 0 || size < 8)
        fprintf(stderr, "elastic_train: step %d failed on rank %d of %d: %s\n", step, rank,
                size, weft_last_error(comm));
      weft_comm *smaller;
      CHECK(weft_comm_shrink(comm, &smaller));
      weft_comm_destroy(comm);
      comm = smaller;
      recoveries++;
      /* A call can end well on some ranks and fail on others (the dead
       * rank's last data reached some): a rank may have finished the step
       * before and failed in this one. The survivors go back to the
       * earliest step among them; such a rank is one step ahead at most
       * (no step completes without every rank), and undoes it. */
      int64_t earliest = step;
      CHECK(weft_allreduce(comm, &earliest, &earliest, 1, WEFT_I64, WEFT_MIN));
      if (earliest < step) {
        memcpy(pbuf, before, total * sizeof(float));
        step = (int)earliest;
      }
      if (o.restart) { /* back to full size: a replacement for each rank lost */
        int lost = size - weft_comm_size(comm);
        for (int k = 0; k < lost; k++) {
          pid_t child = weft_comm_rank(comm) == 0 ? start_replacement(comm, argc, argv) : 0;
          if (child < 0) mlp_die("elastic_train", comm, WEFT_ERR_SYSTEM, "starting a replacement");
          if (child > 0 && replacements < MAX_KILLS) children[replacements] = child;
          replacements++;
        }
        weft_comm *bigger;
        CHECK(weft_comm_grow(comm, lost, &bigger));
        weft_comm_destroy(comm);
        comm = bigger;
        int64_t at = step;
        CHECK(weft_broadcast(comm, &at, &at, 1, WEFT_I64, 0));
        CHECK(weft_broadcast(comm, pbuf, pbuf, total, WEFT_F32, 0));
        if (weft_comm_rank(comm) == 0)
          printf("step %3d: %d replacement(s) joined, %d ranks\n", step, lost,
                 weft_comm_size(comm));
      }
      if (weft_comm_rank(comm) == 0)
        printf("step %3d: going on with %d ranks, redoing the step\n", step,
               weft_comm_size(comm));
      continue;
    }
    memcpy(before, pbuf, total * sizeof(float));
    for (size_t i = 0; i < total; i++) pbuf[i] -= (float)o.lr * gbuf[i];
    if (rank == 0 && (step % 10 == 0 || step == o.steps - 1))
      printf("step %3d loss %.6f accuracy %.3f (%d ranks)\n", step, metrics[0], metrics[1], size);
    step++;
  }
  if (weft_comm_rank(comm) == 0) {
    printf("elastic_train: %d steps, %d recoveries, %d ranks at the end\n", o.steps, recoveries,
           weft_comm_size(comm));
    if (replacements) printf("elastic_train: %d replacements joined\n", replacements);
    FILE *f = o.out ? fopen(o.out, "w") : NULL;
    if (o.out && !f) perror(o.out);
    for (size_t i = 0; f && i < total; i++) fprintf(f, "%.9e\n", pbuf[i]);
    if (f) fclose(f);
  }
  CHECK(weft_barrier(comm));
  weft_comm_destroy(comm);
  for (int i = 0; i < replacements && i < MAX_KILLS; i++) /* this rank's, started above */
    if (children[i] > 0) waitpid(children[i], NULL, 0);
  free(pbuf);
  free(gbuf);
  free(before);
  return 0;
}
