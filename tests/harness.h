/* harness.h - runs N ranks as real processes for the tests. The parent forks
 * first and makes the unique id afterwards (its rendezvous thread must not be
 * copied into children), then hands the id to each child over a pipe. Every
 * run is bounded: ranks still alive at the deadline are killed and counted
 * as failed, so a hang is a test failure, never a stuck suite. A rank that
 * crashes (SIGSEGV, SIGBUS, ...) ends there and counts as failed; the others
 * get HARNESS_CRASH_GRACE_S to notice (the library's dead-peer detection),
 * then are killed, so a crash fails its test in seconds. */
#ifndef WEFT_TEST_HARNESS_H
#define WEFT_TEST_HARNESS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"

#define HARNESS_MAX_RANKS 64

/* Shared with the children: per-rank result words. */
typedef struct harness_shared {
  uint64_t word[HARNESS_MAX_RANKS];
  double seconds[HARNESS_MAX_RANKS];
  int status[HARNESS_MAX_RANKS];
  char message[HARNESS_MAX_RANKS][768]; /* room for a wrapped message (a gradient set quoting its allreduce) */
  char transport[HARNESS_MAX_RANKS][8]; /* what a rank's test chose to record */
  uint64_t job_id;                      /* a test's choice: the job's communicator id */
  int ended_by[HARNESS_MAX_RANKS];      /* harness_run: the signal that ended a rank, or 0 */
} harness_shared;

/* After a rank crashed, the seconds the others have to end on their own. */
#define HARNESS_CRASH_GRACE_S 5.0

/* The signals of a crash (a bug in the rank), as opposed to a test's own
 * SIGKILL or SIGSTOP of a rank. */
static const int harness_crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS};
#define HARNESS_NCRASH ((int)(sizeof harness_crash_signals / sizeof harness_crash_signals[0]))

static inline int harness_is_crash(int sig) {
  for (int i = 0; i < HARNESS_NCRASH; i++)
    if (harness_crash_signals[i] == sig) return 1;
  return 0;
}

/* In a forked rank: a crash ends the process. CMocka catches these signals
 * to report a crashed test and go on with the next; a child inherits its
 * handlers, and a crash would send the rank back into the test loop, to run
 * the rest of the suite in the child while its peers wait (a 935 s timeout
 * and 194 "Test failed with exception" lines where one failed rank was
 * meant). A parent that caught one before may also have left it blocked. */
static inline void harness_default_crash_signals(void) {
  sigset_t crash;
  sigemptyset(&crash);
  for (int i = 0; i < HARNESS_NCRASH; i++) {
    signal(harness_crash_signals[i], SIG_DFL);
    sigaddset(&crash, harness_crash_signals[i]);
  }
  sigprocmask(SIG_UNBLOCK, &crash, NULL);
}

static harness_shared *harness_shm;

static inline double harness_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void harness_init(void) {
  if (!harness_shm) {
    harness_shm = mmap(NULL, sizeof *harness_shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (harness_shm == MAP_FAILED) abort();
  }
  memset(harness_shm, 0, sizeof *harness_shm);
}

/* Before a hung rank is killed: every thread's stack, from gdb where it is
 * installed (tools/setup-debian.sh installs it), else each thread's name and
 * kernel wait channel; so a hang that happens once in many runs says where
 * it stood. Bounded: gdb gets 30 s. */
static inline void harness_dump_stacks(int rank, pid_t pid) {
  char pid_text[16];
  snprintf(pid_text, sizeof pid_text, "%d", (int)pid);
  fprintf(stderr, "harness: rank %d (pid %d) at the hang:\n", rank, (int)pid);
  fflush(NULL);
  pid_t dumper = fork();
  if (dumper == 0) {
    dup2(2, 1);
    execlp("timeout", "timeout", "30", "gdb", "-p", pid_text, "-batch", "-nx", "-q", "-ex",
           "thread apply all bt", (char *)NULL);
    _exit(127);
  }
  int st = 0;
  if (dumper > 0 && waitpid(dumper, &st, 0) == dumper && WIFEXITED(st) && WEXITSTATUS(st) == 0) return;
  /* no gdb (or it failed): the threads' names and where the kernel holds them */
  char path[300], line[128];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *tasks = opendir(path);
  for (struct dirent *t; tasks && (t = readdir(tasks));) {
    static const char *const parts[] = {"comm", "wchan"};
    if (t->d_name[0] == '.') continue;
    fprintf(stderr, "  thread %s:", t->d_name);
    for (int i = 0; i < 2; i++) {
      snprintf(path, sizeof path, "/proc/%d/task/%s/%s", (int)pid, t->d_name, parts[i]);
      FILE *f = fopen(path, "r");
      if (f && fgets(line, sizeof line, f)) fprintf(stderr, " %s=%.*s", parts[i], (int)strcspn(line, "\n"), line);
      if (f) fclose(f);
    }
    fprintf(stderr, "\n");
  }
  if (tasks) closedir(tasks);
}

/* A rank's body: rank, size, the job's id; returns 0 on success. */
typedef int (*harness_rank_fn)(int rank, int size, const weft_unique_id *id, void *arg);

/* Starts `n` ranks with `env` ("NAME=VALUE" strings, NULL-terminated, may
 * be NULL) set in each; returns how many failed (non-zero exit, signal, or
 * still running at `timeout_s`, or HARNESS_CRASH_GRACE_S after another rank
 * crashed). harness_shm->ended_by says which signal ended each rank. */
static inline int harness_run(int n, const char *const *env, double timeout_s, harness_rank_fn fn,
                              void *arg) {
  pid_t pids[HARNESS_MAX_RANKS];
  int pipes[HARNESS_MAX_RANKS][2];
  if (!harness_shm) harness_init(); /* ended_by is written there */
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    if (pipe(pipes[r])) abort();
    pids[r] = fork();
    if (pids[r] == 0) {
      harness_default_crash_signals();
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
      close(pipes[r][1]);
      weft_unique_id id;
      struct pollfd p = {pipes[r][0], POLLIN, 0};
      if (poll(&p, 1, 20000) != 1 || read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) _exit(90);
      int rc = fn(r, n, &id, arg);
      fflush(NULL);
      _exit(rc ? 1 : 0);
    }
    close(pipes[r][0]);
  }
  weft_unique_id id;
  if (weft_get_unique_id(&id)) {
    fprintf(stderr, "harness: weft_get_unique_id: %s\n", weft_last_error(NULL));
    memset(&id, 0, sizeof id);
  }
  for (int r = 0; r < n; r++) {
    if (write(pipes[r][1], &id, sizeof id) != (ssize_t)sizeof id) perror("harness: write id");
    close(pipes[r][1]);
  }
  int failed = 0, left = n, crashed = -1, dumped = 0;
  double deadline = harness_now() + timeout_s;
  int done[HARNESS_MAX_RANKS] = {0};
  for (int r = 0; r < n; r++) harness_shm->ended_by[r] = 0;
  while (left > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < n; r++)
        if (pids[r] == pid && !done[r]) {
          done[r] = 1;
          left--;
          if (WIFSIGNALED(st)) {
            failed++;
            harness_shm->ended_by[r] = WTERMSIG(st);
            fprintf(stderr, "harness: rank %d killed by signal %d (%s)\n", r, WTERMSIG(st),
                    strsignal(WTERMSIG(st)));
            if (harness_is_crash(WTERMSIG(st)) && crashed < 0) {
              crashed = r;
              double soon = harness_now() + HARNESS_CRASH_GRACE_S;
              if (soon < deadline) deadline = soon;
            }
          } else if (WEXITSTATUS(st) != 0) {
            failed++;
            fprintf(stderr, "harness: rank %d exited with %d\n", r, WEXITSTATUS(st));
          }
        }
      continue;
    }
    if (harness_now() > deadline) {
      for (int r = 0; r < n; r++)
        if (!done[r]) {
          if (crashed >= 0)
            fprintf(stderr, "harness: rank %d still running %.0f s after rank %d crashed: killed\n",
                    r, HARNESS_CRASH_GRACE_S, crashed);
          else {
            fprintf(stderr, "harness: rank %d still running after %.0f s: killed (a hang)\n", r,
                    timeout_s);
            if (dumped++ < 4) harness_dump_stacks(r, pids[r]); /* a few say enough, and gdb is slow */
          }
          kill(pids[r], SIGKILL);
        }
      while (left > 0) {
        pid = waitpid(-1, &st, 0);
        for (int r = 0; r < n; r++)
          if (pids[r] == pid && !done[r]) {
            done[r] = 1;
            left--;
            failed++;
            if (WIFSIGNALED(st)) harness_shm->ended_by[r] = WTERMSIG(st);
          }
      }
      break;
    }
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
  return failed;
}

/* Rank body helper: a communicator from the id, or a message and NULL. */
static inline weft_comm *harness_comm(int rank, int size, const weft_unique_id *id) {
  weft_comm *comm = NULL;
  weft_status st = weft_comm_init_rank(&comm, id, rank, size);
  if (st) fprintf(stderr, "rank %d: init failed: %s\n", rank, weft_last_error(NULL));
  return comm;
}

/* ---- data and reference ------------------------------------------------ */

/* A loopback TCP port that was free a moment ago (for a rendezvous). */
/* A rank's outcome into the shared page (status, seconds since t0, the
 * communicator's last sentence), and one line of it on stderr. */
static inline void harness_record(int rank, weft_status st, double t0, const weft_comm *comm) {
  harness_shm->status[rank] = st;
  harness_shm->seconds[rank] = harness_now() - t0;
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s",
           weft_last_error(comm));
  fprintf(stderr, "  rank %d -> %s after %.2f s: %s\n", rank, weft_status_name(st),
          harness_shm->seconds[rank], weft_last_error(comm));
}

static inline int harness_free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len))
    abort();
  close(s);
  return ntohs(a.sin_port);
}

static inline uint64_t harness_rng(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static inline uint64_t harness_seed(uint64_t base, int rank, int tag) {
  uint64_t s = base ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(rank + 1)) ^ ((uint64_t)tag << 40);
  for (int i = 0; i < 4; i++) harness_rng(&s);
  return s ? s : 1;
}

/* Decoding written independently of the library's half.h. */
static inline double harness_f16_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v;
  if (exp == 0) v = ldexp(man, -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}
static inline double harness_bf16_to_double(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
/* Exact encodings for values that are representable (multiples of 1/64 up to 4). */
static inline uint16_t harness_double_to_f16_exact(double v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  v = fabs(v);
  int e;
  double m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
  return (uint16_t)(sign | ((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}
static inline uint16_t harness_double_to_bf16_exact(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t)(bits >> 16);
}

static inline double harness_get(const void *buf, size_t i, weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: return ((const float *)buf)[i];
    case WEFT_F64: return ((const double *)buf)[i];
    case WEFT_F16: return harness_f16_to_double(((const uint16_t *)buf)[i]);
    case WEFT_BF16: return harness_bf16_to_double(((const uint16_t *)buf)[i]);
    default: return 0;
  }
}
static inline int64_t harness_get_int(const void *buf, size_t i, weft_dtype dt) {
  switch (dt) {
    case WEFT_I8: return ((const int8_t *)buf)[i];
    case WEFT_U8: return ((const uint8_t *)buf)[i];
    case WEFT_I32: return ((const int32_t *)buf)[i];
    case WEFT_I64: return ((const int64_t *)buf)[i];
    default: return 0;
  }
}

static inline int harness_is_float(weft_dtype dt) { return dt <= WEFT_BF16; }

/* Fresh random data for (seed, rank): floats are multiples of 1/64 (exact in
 * every float type); for prod in [0.875, 1.125], so a product over up to 64
 * ranks stays well inside f16's range (a reference in double would not
 * model the overflow); integers use their full range (wrapping is part of
 * the contract). */
static inline void harness_fill(void *buf, size_t count, weft_dtype dt, weft_op op, uint64_t seed) {
  uint64_t s = seed;
  for (size_t i = 0; i < count; i++) {
    uint64_t r = harness_rng(&s);
    double v = op == WEFT_PROD ? (56 + (double)(r % 17)) / 64.0 : ((double)(r % 257) - 128) / 64.0;
    switch (dt) {
      case WEFT_F32: ((float *)buf)[i] = (float)v; break;
      case WEFT_F64: ((double *)buf)[i] = v; break;
      case WEFT_F16: ((uint16_t *)buf)[i] = harness_double_to_f16_exact(v); break;
      case WEFT_BF16: ((uint16_t *)buf)[i] = harness_double_to_bf16_exact(v); break;
      case WEFT_I8: ((int8_t *)buf)[i] = (int8_t)r; break;
      case WEFT_U8: ((uint8_t *)buf)[i] = (uint8_t)r; break;
      case WEFT_I32: ((int32_t *)buf)[i] = (int32_t)r; break;
      case WEFT_I64: ((int64_t *)buf)[i] = (int64_t)r; break;
      default: break;
    }
  }
}

static inline double harness_eps(weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: return ldexp(1, -23);
    case WEFT_F64: return ldexp(1, -52);
    case WEFT_F16: return ldexp(1, -10);
    case WEFT_BF16: return ldexp(1, -7);
    default: return 0;
  }
}

/* Wraps a wide integer into the dtype's width, as the dtype's type. */
static inline int64_t harness_wrap(uint64_t v, weft_dtype dt) {
  switch (dt) {
    case WEFT_I8: return (int8_t)(uint8_t)v;
    case WEFT_U8: return (uint8_t)v;
    case WEFT_I32: return (int32_t)(uint32_t)v;
    default: return (int64_t)v;
  }
}

/* The serial reference: folds one rank's data (`tmp`) into the accumulators,
 * in double for floats (with the sum of magnitudes, for the tolerance) and in
 * wide integers that wrap like the dtype. `first` starts them. */
static inline void harness_ref_fold(double *acc, double *mag, uint64_t *iacc, const void *tmp,
                                    size_t count, weft_dtype dt, weft_op op, int first) {
  for (size_t i = 0; i < count; i++) {
    if (harness_is_float(dt)) {
      double v = harness_get(tmp, i, dt);
      if (first) {
        acc[i] = v;
        mag[i] = fabs(v);
        continue;
      }
      mag[i] += fabs(v);
      switch (op) {
        case WEFT_SUM: case WEFT_AVG: acc[i] += v; break;
        case WEFT_PROD: acc[i] *= v; break;
        case WEFT_MIN: acc[i] = v < acc[i] ? v : acc[i]; break;
        case WEFT_MAX: acc[i] = v > acc[i] ? v : acc[i]; break;
        default: break;
      }
    } else {
      int64_t v = harness_get_int(tmp, i, dt);
      if (first) {
        iacc[i] = (uint64_t)v;
        continue;
      }
      switch (op) {
        case WEFT_SUM: case WEFT_AVG: iacc[i] += (uint64_t)v; break;
        case WEFT_PROD: iacc[i] *= (uint64_t)v; break;
        case WEFT_MIN: if (v < harness_wrap(iacc[i], dt)) iacc[i] = (uint64_t)v; break;
        case WEFT_MAX: if (v > harness_wrap(iacc[i], dt)) iacc[i] = (uint64_t)v; break;
        default: break;
      }
    }
  }
}

/* Contribution i (0 .. n-1) to a reduction: its `count` elements into buf. */
typedef void (*harness_fill_fn)(void *buf, size_t count, int i, void *ctx);

/* Checks `res` against op over the n contributions `fill` produces, folded
 * serially in double or wide integers (harness_ref_fold). Tolerance: each of
 * the n-1 roundings may be off by eps of the partial result. Prints up to 3
 * differing elements after `what`; returns 1 if any differs. */
static inline int harness_check_reduced(const void *res, size_t count, weft_dtype dt, weft_op op,
                                        int n, harness_fill_fn fill, void *ctx, const char *what) {
  size_t esz = weft_dtype_size(dt);
  unsigned char *tmp = malloc(count * esz + 8);
  double *acc = malloc(sizeof(double) * (count + 1)), *mag = malloc(sizeof(double) * (count + 1));
  uint64_t *iacc = malloc(sizeof(uint64_t) * (count + 1));
  int bad = 0;
  for (int q = 0; q < n; q++) {
    fill(tmp, count, q, ctx);
    harness_ref_fold(acc, mag, iacc, tmp, count, dt, op, q == 0);
  }
  for (size_t i = 0; i < count && bad < 3; i++) {
    double got, want;
    int ok;
    if (harness_is_float(dt)) {
      double eps = harness_eps(dt);
      want = op == WEFT_AVG ? acc[i] / n : acc[i];
      got = harness_get(res, i, dt);
      double tol = op == WEFT_MIN || op == WEFT_MAX ? 0
                   : op == WEFT_PROD
                       ? (n + 1) * eps * fabs(want)
                       : (n + 1) * eps * (op == WEFT_AVG ? mag[i] / n : mag[i]) + eps * fabs(want);
      ok = fabs(got - want) <= tol;
    } else {
      int64_t w = harness_wrap(iacc[i], dt), g = harness_get_int(res, i, dt);
      /* avg sums i8, u8 and i32 in 64 bits, where n <= 64 of them cannot wrap,
       * and i64 in 64 bits, which may; C division truncates toward zero, as
       * documented */
      if (op == WEFT_AVG) w = (dt == WEFT_I64 ? w : (int64_t)iacc[i]) / n;
      ok = g == w;
      got = (double)g;
      want = (double)w;
    }
    if (!ok) {
      fprintf(stderr, "%s count=%zu %s %s: element %zu is %.17g, reference %.17g\n", what, count,
              weft_dtype_name(dt), weft_op_name(op), i, got, want);
      bad++;
    }
  }
  free(tmp);
  free(acc);
  free(mag);
  free(iacc);
  return bad != 0;
}

/* FNV-1a over bytes: identical results on every rank give identical hashes. */
static inline uint64_t harness_hash(uint64_t h, const void *buf, size_t bytes) {
  const unsigned char *p = buf;
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

#endif
