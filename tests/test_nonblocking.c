/* test_nonblocking.c - non-blocking collectives, send/recv and sub-communicators
 * as real processes, against serial references on fresh random data:
 *  - many outstanding requests of mixed kinds (allreduce of several dtypes and
 *    ops, broadcast, reduce, allgather, reduce-scatter, alltoall, barrier),
 *    interleaved with blocking calls, completed in a random order by
 *    weft_test polling, weft_wait and weft_wait_all;
 *  - send/recv: every pair exchanges messages of sizes 0 .. multi-chunk in
 *    both directions at once, received in another order than sent (tag
 *    matching), same-tag messages never overtaking, messages to self;
 *  - split into odd/even and into uneven colors with reversed keys and one
 *    rank left out, collectives and send/recv on parent and children
 *    outstanding at the same time;
 *  - a send/recv size mismatch fails on both ends; destroy completes what is
 *    outstanding with WEFT_ERR_ABORTED;
 *  - messages ride the communicator's own transport contexts (channel 1 of
 *    its connections), not a second hidden set: over tcp the process holds
 *    one listening socket, over shm a pair has exactly its two segments,
 *    one per channel, under one communicator id, and one progress thread
 *    serves collectives and messages;
 *  - a receive whose message never comes fails alone at the timeout, while
 *    collectives keep moving beside it and go on after it; a collective
 *    issued beside such a receive times out from its own issue;
 *  - allreduces issued in different rhythms on different ranks (one at a
 *    time, or all at once) still choose alike call by call, and small ones
 *    stay with the one-round exchange over shm only. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "harness_recorder.h"

static uint64_t base_seed;

/* Rank q's data for call `tag`. */
static void fill(void *buf, size_t count, weft_dtype dt, weft_op op, int q, int tag) {
  harness_fill(buf, count, dt, op, harness_seed(base_seed, q, tag));
}

typedef struct members_of {
  const int *members;
  weft_dtype dt;
  weft_op op;
  int tag;
} members_of;

static void fill_member(void *buf, size_t count, int i, void *ctx) {
  const members_of *k = ctx;
  fill(buf, count, k->dt, k->op, k->members[i], k->tag);
}

/* `res` against op over ranks `members` (n of them, in any order) of call `tag`. */
static int check_reduced(const void *res, int rank, const int *members, int n, size_t count,
                         weft_dtype dt, weft_op op, int tag, const char *what) {
  members_of k = {members, dt, op, tag};
  char label[160];
  snprintf(label, sizeof label, "rank %d: %s (seed %llu):", rank, what,
           (unsigned long long)base_seed);
  return harness_check_reduced(res, count, dt, op, n, fill_member, &k, label);
}

static int check_bytes(const void *got, int rank, size_t count, weft_dtype dt, int q, int tag,
                       const char *what) {
  size_t bytes = count * weft_dtype_size(dt);
  unsigned char *want = malloc(bytes + 1);
  fill(want, count, dt, WEFT_SUM, q, tag);
  int bad = bytes && memcmp(got, want, bytes) != 0;
  if (bad)
    fprintf(stderr, "rank %d: %s: %zu elements of %s from rank %d (call %d) differ (seed %llu)\n",
            rank, what, count, weft_dtype_name(dt), q, tag, (unsigned long long)base_seed);
  free(want);
  return bad;
}

static int report(weft_comm *comm, int rank, const char *what, weft_status st) {
  fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, weft_status_name(st), weft_last_error(comm));
  return 1;
}

/* ---- many outstanding collectives ------------------------------------------- */

typedef struct pending {
  weft_request *req;
  int kind; /* 0 allreduce, 1 broadcast, 2 reduce, 3 allgather, 4 reduce-scatter, 5 alltoall, 6
               barrier */
  int tag, root;
  size_t count;
  weft_dtype dt;
  weft_op op;
  void *in, *out;
} pending;

#define NPEND 16

static weft_status issue(weft_comm *comm, pending *p, int rank, int n) {
  size_t esz = weft_dtype_size(p->dt), c = p->count;
  size_t blocks = p->kind >= 3 && p->kind <= 5 ? (size_t)n : 1;
  p->in = malloc(c * esz * blocks + 1);
  p->out = malloc(c * esz * blocks + 1);
  switch (p->kind) {
    case 0:
      fill(p->in, c, p->dt, p->op, rank, p->tag);
      return weft_iallreduce(comm, p->in, p->out, c, p->dt, p->op, &p->req);
    case 1:
      fill(p->in, c, p->dt, WEFT_SUM, p->root, p->tag);
      return weft_ibroadcast(comm, p->in, p->out, c, p->dt, p->root, &p->req);
    case 2:
      fill(p->in, c, p->dt, p->op, rank, p->tag);
      return weft_ireduce(comm, p->in, p->out, c, p->dt, p->op, p->root, &p->req);
    case 3:
      fill(p->in, c, p->dt, WEFT_SUM, rank, p->tag);
      return weft_iallgather(comm, p->in, p->out, c, p->dt, &p->req);
    case 4:
      for (int b = 0; b < n; b++)
        fill((char *)p->in + (size_t)b * c * esz, c, p->dt, p->op, rank, p->tag * 64 + b);
      return weft_ireduce_scatter(comm, p->in, p->out, c, p->dt, p->op, &p->req);
    case 5:
      for (int b = 0; b < n; b++)
        fill((char *)p->in + (size_t)b * c * esz, c, p->dt, WEFT_SUM, rank, p->tag * 64 + b);
      return weft_ialltoall(comm, p->in, p->out, c, p->dt, &p->req);
    default: return weft_ibarrier(comm, &p->req);
  }
}

static int verify(const pending *p, int rank, int n) {
  int all[HARNESS_MAX_RANKS];
  for (int i = 0; i < n; i++) all[i] = i;
  size_t esz = weft_dtype_size(p->dt), c = p->count;
  int bad = 0;
  switch (p->kind) {
    case 0: return check_reduced(p->out, rank, all, n, c, p->dt, p->op, p->tag, "iallreduce");
    case 1: return check_bytes(p->out, rank, c, p->dt, p->root, p->tag, "ibroadcast");
    case 2:
      return rank == p->root
                 ? check_reduced(p->out, rank, all, n, c, p->dt, p->op, p->tag, "ireduce")
                 : 0;
    case 3:
      for (int q = 0; q < n; q++)
        bad += check_bytes((char *)p->out + (size_t)q * c * esz, rank, c, p->dt, q, p->tag,
                           "iallgather");
      return bad;
    case 4: {
      /* block `rank` of every rank, reduced: the reference folds tag*64+rank */
      return check_reduced(p->out, rank, all, n, c, p->dt, p->op, p->tag * 64 + rank,
                           "ireduce_scatter");
    }
    case 5:
      for (int q = 0; q < n; q++)
        bad += check_bytes((char *)p->out + (size_t)q * c * esz, rank, c, p->dt, q,
                           p->tag * 64 + rank, "ialltoall");
      return bad;
    default: return 0;
  }
}

static int outstanding_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  /* the same plan on every rank (seeded by the base seed only) */
  uint64_t s = base_seed ^ 0x5eed;
  static const weft_dtype dts[] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_I32,
                                   WEFT_I64, WEFT_U8,  WEFT_F16};
  static const size_t counts[] = {0, 1, 7, 1000, 70001, 300000};
  for (int round = 0; round < 3 && !bad; round++) {
    pending p[NPEND];
    memset(p, 0, sizeof p);
    for (int i = 0; i < NPEND; i++) {
      p[i].kind = (int)(harness_rng(&s) % 7);
      p[i].tag = round * NPEND + i + 1;
      p[i].root = (int)(harness_rng(&s) % (uint64_t)n);
      p[i].count = counts[harness_rng(&s) % 6];
      if (p[i].kind >= 3 && p[i].count > 70001) p[i].count = 70001;
      p[i].dt = dts[harness_rng(&s) % 7];
      p[i].op = (weft_op)(harness_rng(&s) % WEFT_OP_COUNT);
      if (p[i].op == WEFT_PROD && p[i].count > 1000) p[i].op = WEFT_SUM;
      weft_status st = issue(comm, &p[i], rank, n);
      if (st) bad += report(comm, rank, "issue", st);
      if (i == NPEND / 2) {
        /* a blocking call in the middle: matched in issue order like the rest */
        int32_t v = rank + 1, sum = 0;
        st = weft_allreduce(comm, &v, &sum, 1, WEFT_I32, WEFT_SUM);
        if (st) bad += report(comm, rank, "blocking allreduce among requests", st);
        if (sum != n * (n + 1) / 2) {
          fprintf(stderr, "rank %d: blocking allreduce among requests gave %d\n", rank, sum);
          bad++;
        }
      }
    }
    /* complete in a random order (each rank its own): poll some, then wait */
    uint64_t mine = harness_seed(base_seed, rank, 1000 + round);
    int order[NPEND];
    for (int i = 0; i < NPEND; i++) order[i] = i;
    for (int i = NPEND - 1; i > 0; i--) {
      int j = (int)(harness_rng(&mine) % (uint64_t)(i + 1)), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    for (int k = 0; k < NPEND; k++) {
      pending *q = &p[order[k]];
      if (!q->req) continue;
      weft_status st;
      if (round == 1 && k < NPEND / 2) {
        int done = 0;
        double t0 = harness_now();
        do st = weft_test(&q->req, &done);
        while (!st && !done && harness_now() - t0 < 60);
        if (!done) {
          fprintf(stderr, "rank %d: weft_test never reported done\n", rank);
          bad++;
          continue;
        }
      } else if (round == 2 && k == NPEND / 2) {
        weft_request *rest[NPEND];
        int m = 0;
        for (int j = k; j < NPEND; j++) rest[m++] = p[order[j]].req;
        st = weft_wait_all(rest, m);
        for (int j = 0; j < m; j++)
          if (rest[j]) {
            fprintf(stderr, "rank %d: weft_wait_all left a request set\n", rank);
            bad++;
          }
        for (int j = k; j < NPEND; j++) p[order[j]].req = NULL;
        if (st) bad += report(comm, rank, "wait_all", st);
        break;
      } else {
        st = weft_wait(&q->req);
      }
      if (st) bad += report(comm, rank, "wait", st);
      if (q->req) {
        fprintf(stderr, "rank %d: completed request not set to NULL\n", rank);
        bad++;
      }
    }
    for (int i = 0; i < NPEND; i++) {
      if (!bad) bad += verify(&p[i], rank, n);
      free(p[i].in);
      free(p[i].out);
    }
  }
  /* NULL handles are complete */
  weft_request *none = NULL;
  int done = 0;
  if (weft_wait(&none) || weft_test(&none, &done) || !done || weft_wait_all(&none, 1)) bad++;
  weft_comm_destroy(comm);
  return bad != 0;
}

/* ---- send / recv ---------------------------------------------------------------- */

#define NMSG 5
static const size_t msg_counts[NMSG] = {0, 1, 1000, 100003, 700000}; /* up to ~2.7 MiB of f32 */

/* The tag of message m from q to r: distinct per (q, r, m). */
static int msg_tag(int m) {
  return 100 + m;
}
static int msg_call(int q, int r, int m) {
  return 10000 + (q * 64 + r) * 16 + m;
}

static int p2p_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  /* every rank sends NMSG messages to every rank (itself too) and receives
   * NMSG from each, all outstanding at once; receives are posted in reverse
   * tag order, sends in forward order */
  int total = 2 * n * NMSG;
  weft_request **reqs = calloc((size_t)total, sizeof *reqs);
  float **sbuf = calloc((size_t)n * NMSG, sizeof *sbuf),
        **rbuf = calloc((size_t)n * NMSG, sizeof *rbuf);
  int k = 0;
  for (int q = 0; q < n; q++)
    for (int m = NMSG - 1; m >= 0; m--) {
      rbuf[q * NMSG + m] = malloc(msg_counts[m] * 4 + 4);
      weft_status st =
          weft_irecv(comm, rbuf[q * NMSG + m], msg_counts[m], WEFT_F32, q, msg_tag(m), &reqs[k++]);
      if (st) bad += report(comm, rank, "irecv", st);
    }
  for (int r = 0; r < n; r++)
    for (int m = 0; m < NMSG; m++) {
      float *b = sbuf[r * NMSG + m] = malloc(msg_counts[m] * 4 + 4);
      fill(b, msg_counts[m], WEFT_F32, WEFT_SUM, rank, msg_call(rank, r, m));
      weft_status st = weft_isend(comm, b, msg_counts[m], WEFT_F32, r, msg_tag(m), &reqs[k++]);
      if (st) bad += report(comm, rank, "isend", st);
    }
  weft_status st = weft_wait_all(reqs, k);
  if (st) bad += report(comm, rank, "wait_all of sends and receives", st);
  for (int q = 0; q < n && !bad; q++)
    for (int m = 0; m < NMSG; m++)
      bad += check_bytes(rbuf[q * NMSG + m], rank, msg_counts[m], WEFT_F32, q, msg_call(q, rank, m),
                         "irecv");
  for (int i = 0; i < n * NMSG; i++) {
    free(sbuf[i]);
    free(rbuf[i]);
  }
  free(sbuf);
  free(rbuf);
  free(reqs);
  /* same tag, two messages: they arrive in the order sent (blocking calls,
   * ring neighbours, even ranks send first so nothing waits in a cycle) */
  if (n > 1) {
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    int64_t a[3] = {rank, 1, 2}, b[3] = {rank, 3, 4}, x[3], y[3];
    weft_request *rq[2];
    if (weft_irecv(comm, x, 3, WEFT_I64, left, 7, &rq[0]) ||
        weft_irecv(comm, y, 3, WEFT_I64, left, 7, &rq[1]))
      bad += report(comm, rank, "irecv same tag", WEFT_ERR_INTERNAL);
    if (weft_send(comm, a, 3, WEFT_I64, right, 7) || weft_send(comm, b, 3, WEFT_I64, right, 7))
      bad += report(comm, rank, "send same tag", WEFT_ERR_INTERNAL);
    if (weft_wait_all(rq, 2)) bad += report(comm, rank, "wait same tag", WEFT_ERR_INTERNAL);
    if (x[0] != left || x[1] != 1 || y[0] != left || y[1] != 3) {
      fprintf(stderr, "rank %d: same-tag messages overtook each other (%lld,%lld then %lld,%lld)\n",
              rank, (long long)x[0], (long long)x[1], (long long)y[0], (long long)y[1]);
      bad++;
    }
    /* a collective between p2p traffic is unaffected (its own lane) */
    int32_t v = 1, sum = 0;
    if (weft_allreduce(comm, &v, &sum, 1, WEFT_I32, WEFT_SUM) || sum != n) bad++;
  }
  weft_comm_destroy(comm);
  return bad != 0;
}

/* ---- split -------------------------------------------------------------------- */

static int split_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  for (int scheme = 0; scheme < 2; scheme++) {
    /* 0: odd/even, key = rank; 1: rank % 3 with keys reversed, last rank out */
    int color = scheme == 0 ? rank % 2 : (rank == n - 1 && n > 2 ? WEFT_UNDEFINED : rank % 3);
    int key = scheme == 0 ? rank : n - rank;
    weft_comm *sub = NULL;
    weft_status st = weft_comm_split(comm, color, key, &sub);
    if (st) {
      bad += report(comm, rank, "split", st);
      break;
    }
    if (color == WEFT_UNDEFINED) {
      if (sub) {
        fprintf(stderr, "rank %d: WEFT_UNDEFINED got a communicator\n", rank);
        bad++;
      }
      /* it still takes part in the parent's collective (blocking here) */
      size_t c = 50001;
      int ptag = 600 + scheme, all[HARNESS_MAX_RANKS];
      for (int i = 0; i < n; i++) all[i] = i;
      float *pin = malloc(c * 4), *pout = malloc(c * 4);
      fill(pin, c, WEFT_F32, WEFT_SUM, rank, ptag);
      if ((st = weft_allreduce(comm, pin, pout, c, WEFT_F32, WEFT_SUM)))
        bad += report(comm, rank, "parent allreduce", st);
      else
        bad += check_reduced(pout, rank, all, n, c, WEFT_F32, WEFT_SUM, ptag, "parent allreduce");
      free(pin);
      free(pout);
    } else {
      /* the members, in their new rank order, computed independently */
      int members[HARNESS_MAX_RANKS], m = 0;
      for (int k = scheme == 0 ? 0 : n; scheme == 0 ? k < n : k >= 0; scheme == 0 ? k++ : k--) {
        int q = scheme == 0 ? k : k; /* keys: rank (scheme 0) or n - rank (scheme 1) */
        if (q < 0 || q >= n) continue;
        int qc = scheme == 0 ? q % 2 : (q == n - 1 && n > 2 ? WEFT_UNDEFINED : q % 3);
        if (qc == color) members[m++] = q;
      }
      int sr = weft_comm_rank(sub), ss = weft_comm_size(sub);
      if (ss != m || sr < 0 || members[sr] != rank) {
        fprintf(stderr, "rank %d: split scheme %d gave rank %d of %d, expected size %d\n", rank,
                scheme, sr, ss, m);
        bad++;
      } else {
        /* outstanding on child and parent at once, waited for in reverse */
        size_t c = 50001;
        float *in = malloc(c * 4), *out = malloc(c * 4), *pin = malloc(c * 4),
              *pout = malloc(c * 4);
        int tag = 500 + scheme * 8 + color, ptag = 600 + scheme;
        fill(in, c, WEFT_F32, WEFT_SUM, rank, tag);
        fill(pin, c, WEFT_F32, WEFT_SUM, rank, ptag);
        weft_request *rs[3] = {NULL, NULL, NULL};
        if (weft_iallreduce(sub, in, out, c, WEFT_F32, WEFT_SUM, &rs[0]) ||
            weft_iallreduce(comm, pin, pout, c, WEFT_F32, WEFT_SUM, &rs[1]))
          bad += report(comm, rank, "iallreduce on child and parent", WEFT_ERR_INTERNAL);
        /* p2p inside the child: a ring of child ranks */
        int32_t token = rank, got = -1;
        int right = (sr + 1) % ss, left = (sr + ss - 1) % ss;
        if (weft_irecv(sub, &got, 1, WEFT_I32, left, 3, &rs[2]) ||
            weft_send(sub, &token, 1, WEFT_I32, right, 3))
          bad += report(sub, rank, "send/recv in the child", WEFT_ERR_INTERNAL);
        for (int i = 2; i >= 0; i--)
          if ((st = weft_wait(&rs[i]))) bad += report(i == 1 ? comm : sub, rank, "wait", st);
        int all[HARNESS_MAX_RANKS];
        for (int i = 0; i < n; i++) all[i] = i;
        if (!bad)
          bad +=
              check_reduced(out, rank, members, m, c, WEFT_F32, WEFT_SUM, tag, "child allreduce");
        if (!bad)
          bad += check_reduced(pout, rank, all, n, c, WEFT_F32, WEFT_SUM, ptag, "parent allreduce");
        if (got != members[left]) {
          fprintf(stderr, "rank %d: child ring got %d, expected %d\n", rank, got, members[left]);
          bad++;
        }
        free(in);
        free(out);
        free(pin);
        free(pout);
      }
      if (weft_comm_destroy(sub)) bad++;
    }
  }
  weft_comm_destroy(comm);
  return bad != 0;
}

/* ---- issued in different rhythms --------------------------------------------- */

/* Some allreduce algorithms depend on what earlier calls found out (the
 * direct question's memory of a shape that met ordinary buffers; the
 * exchange verdict of the communicator's first small call). Even ranks
 * issue each call only after the last completed; odd ranks issue them all,
 * then wait: every rank must still choose the same algorithm for each call.
 * Chosen at issue, they would not (and messages of one algorithm would be
 * read as another's). */
#define STAGGER_CALLS 12
static int staggered_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0, all[HARNESS_MAX_RANKS];
  for (int q = 0; q < n; q++) all[q] = q;
  /* 8 bytes (the exchange), 16 KiB (its limit) and 1 MiB of ordinary memory
   * (the direct question, then the ring), in turn */
  static const size_t counts[] = {2, 4096, 262144};
  float *in[STAGGER_CALLS], *out[STAGGER_CALLS];
  weft_request *req[STAGGER_CALLS];
  for (int round = 0; round < 2; round++) {
    for (int c = 0; c < STAGGER_CALLS; c++) {
      size_t count = counts[c % 3];
      in[c] = malloc(count * sizeof(float));
      out[c] = malloc(count * sizeof(float));
      fill(in[c], count, WEFT_F32, WEFT_SUM, rank, 1000 * round + c);
      weft_status st = weft_iallreduce(comm, in[c], out[c], count, WEFT_F32, WEFT_SUM, &req[c]);
      if (st) bad += report(comm, rank, "staggered iallreduce", st);
      if (rank % 2 == 0 && (st = weft_wait(&req[c])))
        bad += report(comm, rank, "staggered wait", st);
      if (bad) break;
    }
    if (rank % 2 == 1 && !bad) {
      weft_status st = weft_wait_all(req, STAGGER_CALLS);
      if (st) bad += report(comm, rank, "staggered wait_all", st);
    }
    for (int c = 0; c < STAGGER_CALLS && !bad; c++)
      bad += check_reduced(out[c], rank, all, n, counts[c % 3], WEFT_F32, WEFT_SUM,
                           1000 * round + c, "staggered allreduce");
    for (int c = 0; c < STAGGER_CALLS; c++) {
      free(in[c]);
      free(out[c]);
    }
    if (bad) break;
  }
  /* The first exchange settled whether the next ones pay: over shared memory
   * they do, over sockets (and verbs) recursive doubling takes over. Where
   * every rank has a CPU of its own the exchange keeps 3 ranks at most
   * (src/coll/choose.c), and 4 take recursive doubling from the start. */
  const char *tp = getenv("WEFT_TRANSPORT");
  bool exchange_here = n <= 3 || sysconf(_SC_NPROCESSORS_ONLN) < n;
  const char *want = !tp                                       ? NULL
                     : !strcmp(tp, "shm") && exchange_here ? "exchange"
                                                               : "recursive doubling";
  float one = 1, sum = 0;
  weft_status st = bad ? WEFT_OK : weft_allreduce(comm, &one, &sum, 1, WEFT_F32, WEFT_SUM);
  if (st)
    bad += report(comm, rank, "allreduce after the staggered ones", st);
  else if (!bad && (sum != (float)n || (want && strcmp(harness_last_algo(comm), want)))) {
    fprintf(stderr, "rank %d: 4 bytes over %s: sum %g by %s, expected %d by %s\n", rank, tp, sum,
            harness_last_algo(comm), n, want);
    bad = 1;
  }
  weft_comm_destroy(comm);
  return bad != 0;
}

/* ---- one set of transport contexts ----------------------------------------------- */

/* Listening TCP sockets this process holds: the inodes of its socket fds
 * (/proc/self/fd) that /proc/net/tcp{,6} lists in state 0A (LISTEN). */
static int listening_sockets(void) {
  unsigned long inodes[256];
  int ninodes = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d)) && ninodes < 256;) {
    char path[300], link[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = 0;
    unsigned long ino;
    if (sscanf(link, "socket:[%lu]", &ino) == 1) inodes[ninodes++] = ino;
  }
  closedir(d);
  int count = 0;
  static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int t = 0; t < 2; t++) {
    FILE *f = fopen(tables[t], "r");
    if (!f) continue;
    char line[512];
    while (fgets(line, sizeof line, f)) {
      unsigned st;
      unsigned long ino;
      /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
      if (sscanf(line, " %*s %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &ino) != 2 || st != 0x0A)
        continue;
      for (int i = 0; i < ninodes; i++) count += inodes[i] == ino;
    }
    fclose(f);
  }
  return count;
}

/* The weft shared-memory segments this process maps (/proc/self/maps; the
 * names are unlinked once both ends mapped them, the mapping keeps them):
 * "/dev/shm/weft-ID-LO-HI-CHANNEL", distinct, at most `max`. */
static int shm_segments(char names[][96], int max) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  int n = 0;
  char line[768];
  while (fgets(line, sizeof line, f)) {
    char *at = strstr(line, "/dev/shm/weft-");
    if (!at) continue;
    at += strlen("/dev/shm/");
    size_t len = strcspn(at, " \n");
    if (len >= 96) continue;
    bool seen = false;
    for (int i = 0; i < n && !seen; i++) seen = !strncmp(names[i], at, len) && !names[i][len];
    if (seen || n == max) continue;
    memcpy(names[n], at, len);
    names[n++][len] = 0;
  }
  fclose(f);
  return n;
}

static int threads_here(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Two ranks exchange messages (blocking and not) and run collectives
 * beside them; then everything weft started for the communicator is
 * counted. A second, hidden communicator for the messages would show as a
 * second listener, a second id on the pair's segments, a second progress
 * thread. */
static int one_context_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  /* tcp's helper threads (WEFT_TCP_THREADS, auto: some on a host with cores
   * to spare) are the transport's own; this counts the engine's */
  setenv("WEFT_TCP_THREADS", "0", 1);
  /* what this forked rank inherited (an earlier case's rendezvous server in
   * the parent, say) is not the communicator's */
  int listeners0 = listening_sockets(), threads0 = threads_here();
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0, peer = 1 - rank;
  int32_t out[4] = {rank, 1, 2, 3}, in[4] = {-1, -1, -1, -1}, v = 1, sum = 0;
  weft_request *rq[3] = {NULL, NULL, NULL};
  weft_status st = weft_irecv(comm, in, 4, WEFT_I32, peer, 5, &rq[0]);
  if (!st) st = weft_isend(comm, out, 4, WEFT_I32, peer, 5, &rq[1]);
  if (!st) st = weft_iallreduce(comm, &v, &sum, 1, WEFT_I32, WEFT_SUM, &rq[2]);
  if (!st) st = weft_wait_all(rq, 3);
  if (!st)
    st = rank == 0 ? weft_send(comm, out, 4, WEFT_I32, peer, 6)
                   : weft_recv(comm, in, 4, WEFT_I32, peer, 6);
  if (st) bad += report(comm, rank, "messages beside a collective", st);
  if (!bad && (in[0] != peer || in[3] != 3 || sum != n)) {
    fprintf(stderr, "rank %d: got %d %d, sum %d\n", rank, in[0], in[3], sum);
    bad++;
  }
  const char *tp = getenv("WEFT_TRANSPORT");
  tp = tp ? tp : "";
  int listeners = listening_sockets() - listeners0;
  /* tcp: its one listener; shm: none; verbs: its one side listener; and
   * every communicator's control plane (recovery: src/elastic/ctl.h) */
  int want = (!strcmp(tp, "shm") ? 0 : 1) + 1;
  if (listeners != want) {
    fprintf(stderr,
            "rank %d over %s: %d listening sockets, expected %d (one per context, and the "
            "control plane's)\n",
            rank, tp, listeners, want);
    bad++;
  }
  char names[8][96];
  int nseg = shm_segments(names, 8);
  if (!strcmp(tp, "shm")) {
    /* weft-ID-0-1-CHANNEL: the collectives' and the messages' segments of
     * the pair, under one id */
    unsigned long long ids[2] = {0, 0};
    int chans = 0;
    for (int i = 0; i < nseg; i++) {
      unsigned long long cid;
      int lo, hi, ch;
      if (sscanf(names[i], "weft-%llx-%d-%d-%d", &cid, &lo, &hi, &ch) == 4 && lo == 0 && hi == 1 &&
          ch >= 0 && ch < 2) {
        ids[ch] = cid;
        chans |= 1 << ch;
      }
    }
    if (nseg != 2 || chans != 3 || ids[0] != ids[1]) {
      fprintf(stderr,
              "rank %d over shm: %d segments mapped, expected the pair's two channels "
              "under one id:",
              rank, nseg);
      for (int i = 0; i < nseg; i++) fprintf(stderr, " %s", names[i]);
      fprintf(stderr, "\n");
      bad++;
    }
  }
  /* the communicator's one progress thread */
  int threads = threads_here() - threads0;
  if (threads != 1) {
    fprintf(stderr, "rank %d over %s: %d new threads, expected 1 (one progress thread)\n", rank, tp,
            threads);
    bad++;
  }
  weft_comm_destroy(comm);
  return bad != 0;
}

/* ---- the lane's own timeout ---------------------------------------------------------- */

/* WEFT_TIMEOUT=2. Rank 0 posts a receive that rank 1 never sends, then
 * both run allreduces for 3.5 s: the receive must fail with
 * WEFT_ERR_TIMEOUT by then (collectives that move do not keep it alive),
 * the allreduces must all succeed (its failure is not theirs), a later
 * message fails at once with the same cause, and collectives go on. */
#define LANE_TIMEOUT_CALLS 35
static int lane_timeout_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  int32_t got = -1, v = 1, sum = 0;
  weft_request *rq = NULL;
  if (rank == 0 && weft_irecv(comm, &got, 1, WEFT_I32, 1, 42, &rq)) bad++;
  for (int i = 0; i < LANE_TIMEOUT_CALLS && !bad; i++) {
    weft_status st = weft_allreduce(comm, &v, &sum, 1, WEFT_I32, WEFT_SUM);
    if (st || sum != n) bad += report(comm, rank, "allreduce beside a stuck receive", st);
    usleep(100000);
  }
  if (rank == 0 && !bad) {
    int done = 0;
    weft_status st = weft_test(&rq, &done);
    if (!done || st != WEFT_ERR_TIMEOUT || !strstr(weft_last_error(comm), "peer 1")) {
      fprintf(stderr, "rank 0: a receive that never matched, after 3.5 s: done %d, %s: %s\n", done,
              weft_status_name(st), weft_last_error(comm));
      bad++;
    }
    if ((st = weft_send(comm, &v, 1, WEFT_I32, 1, 43)) != WEFT_ERR_TIMEOUT) {
      fprintf(stderr, "rank 0: a send after the lane failed: %s\n", weft_status_name(st));
      bad++;
    }
  }
  weft_status st = weft_allreduce(comm, &v, &sum, 1, WEFT_I32, WEFT_SUM);
  if (st || sum != n) bad += report(comm, rank, "allreduce after the receive failed", st);
  if (rq) weft_wait(&rq);
  weft_comm_destroy(comm);
  return bad != 0;
}

/* WEFT_TIMEOUT=2. Rank 0 posts a receive that never matches, then after
 * 1.5 s joins a broadcast that rank 1 roots only at 2.5 s: the broadcast
 * has waited 1 s of its own and must succeed (its timeout counts from its
 * issue, not from when the waiting receive last moved), while the receive
 * fails at 2 s. */
static int coll_beside_waiting_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  int32_t got = -1, token = rank == 1 ? 4242 : -1;
  weft_request *rq = NULL;
  if (rank == 0 && weft_irecv(comm, &got, 1, WEFT_I32, 1, 42, &rq)) bad++;
  usleep(rank == 0 ? 1500000 : 2500000);
  weft_status st = weft_broadcast(comm, &token, &token, 1, WEFT_I32, 1);
  if (st || token != 4242) bad += report(comm, rank, "broadcast beside a waiting receive", st);
  if (rank == 0 && (st = weft_wait(&rq)) != WEFT_ERR_TIMEOUT) {
    fprintf(stderr, "rank 0: the receive that never matched: %s\n", weft_status_name(st));
    bad++;
  }
  weft_comm_destroy(comm);
  return bad != 0;
}

static void coll_beside_waiting2(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=2", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, coll_beside_waiting_rank, NULL), 0);
}

static void lane_timeout2(void **state) {
  (void)state;
  static const char *const env[] = {"WEFT_TIMEOUT=2", NULL};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, lane_timeout_rank, NULL), 0);
}

/* ---- errors ---------------------------------------------------------------------- */

static int errors_rank(int rank, int n, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, n, id);
  if (!comm) return 1;
  int bad = 0;
  float buf[8] = {0};
  weft_request *r = (weft_request *)1;
  /* refusals: the request is NULL and nothing started */
  if (weft_isend(comm, buf, 1, WEFT_F32, n, 0, &r) != WEFT_ERR_INVALID || r != NULL) bad++;
  if (!strstr(weft_last_error(comm), "peer")) bad++;
  if (weft_irecv(comm, buf, 1, WEFT_F32, 0, -1, &r) != WEFT_ERR_INVALID) bad++;
  if (weft_iallreduce(comm, NULL, buf, 4, WEFT_F32, WEFT_SUM, &r) != WEFT_ERR_INVALID || r) bad++;
  if (weft_iallreduce(comm, buf, buf, 4, WEFT_F32, WEFT_SUM, NULL) != WEFT_ERR_INVALID) bad++;
  if (weft_comm_split(comm, -5, 0, &(weft_comm *){NULL}) != WEFT_ERR_INVALID) bad++;
  if (bad)
    fprintf(stderr, "rank %d: a bad argument was not refused: %s\n", rank, weft_last_error(comm));
  /* a size mismatch between send and recv (ranks 0 and 1): both fail, no hang */
  if (n >= 2 && rank < 2) {
    weft_status st = rank == 0 ? weft_send(comm, buf, 8, WEFT_F32, 1, 9)
                               : weft_recv(comm, buf, 4, WEFT_F32, 0, 9);
    if (st != WEFT_ERR_MISMATCH && !(rank == 0 && st == WEFT_ERR_PEER_LOST) &&
        !(rank == 0 && st == WEFT_OK)) {
      fprintf(stderr, "rank %d: size mismatch gave %s: %s\n", rank, weft_status_name(st),
              weft_last_error(comm));
      bad++;
    }
    if (rank == 1 && !strstr(weft_last_error(comm), "expects 4 elements")) {
      fprintf(stderr, "rank 1: mismatch message: %s\n", weft_last_error(comm));
      bad++;
    }
  }
  /* collectives still work: p2p failures stay on the lane */
  int32_t v = 1, sum = 0;
  if (weft_allreduce(comm, &v, &sum, 1, WEFT_I32, WEFT_SUM) || sum != n) {
    bad += report(comm, rank, "allreduce after a p2p failure", WEFT_ERR_INTERNAL);
  }
  /* destroy with a receive outstanding: it completes, aborted */
  weft_request *pending_recv = NULL;
  if (rank >= 2 && weft_irecv(comm, buf, 1, WEFT_F32, rank, 77, &pending_recv)) bad++;
  weft_comm_destroy(comm);
  if (rank >= 2 && weft_wait(&pending_recv) != WEFT_ERR_ABORTED) {
    fprintf(stderr, "rank %d: a request outstanding at destroy did not complete aborted\n", rank);
    bad++;
  }
  return bad != 0;
}

static void run(int n, harness_rank_fn fn) {
  harness_init();
  assert_int_equal(harness_run(n, NULL, 240, fn, NULL), 0);
}

#define RANKS_TEST(name, fn, n)    \
  static void name(void **state) { \
    (void)state;                   \
    run(n, fn);                    \
  }

RANKS_TEST(outstanding1, outstanding_rank, 1)
RANKS_TEST(outstanding2, outstanding_rank, 2)
RANKS_TEST(outstanding3, outstanding_rank, 3)
RANKS_TEST(outstanding5, outstanding_rank, 5)
RANKS_TEST(p2p1, p2p_rank, 1)
RANKS_TEST(p2p2, p2p_rank, 2)
RANKS_TEST(p2p4, p2p_rank, 4)
RANKS_TEST(split4, split_rank, 4)
RANKS_TEST(split7, split_rank, 7)
RANKS_TEST(errors3, errors_rank, 3)
RANKS_TEST(staggered3, staggered_rank, 3)
RANKS_TEST(staggered4, staggered_rank, 4)
RANKS_TEST(one_context2, one_context_rank, 2)

int main(void) {
  const char *seed = getenv("WEFT_TEST_SEED");
  base_seed = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("# seed %llu (WEFT_TEST_SEED reproduces)\n", (unsigned long long)base_seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(outstanding1),
      cmocka_unit_test(outstanding2),
      cmocka_unit_test(outstanding3),
      cmocka_unit_test(outstanding5),
      cmocka_unit_test(p2p1),
      cmocka_unit_test(p2p2),
      cmocka_unit_test(p2p4),
      cmocka_unit_test(split4),
      cmocka_unit_test(split7),
      cmocka_unit_test(errors3),
      cmocka_unit_test(staggered3),
      cmocka_unit_test(staggered4),
      cmocka_unit_test(one_context2),
      cmocka_unit_test(lane_timeout2),
      cmocka_unit_test(coll_beside_waiting2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
