/* test_rendezvous.c - who may join a job at the rendezvous, and what the
 * rendezvous leaves behind: a rank of another job is refused and the job
 * goes on with its own data, a second claimant of a rank fails every rank,
 * a missing rank is named by every rank (no cut-off answers, no crash at
 * exit), rank 0 failing before it takes part is heard by all, a rendezvous
 * open to anyone is said once, a failed init leaves no thread or fd, running out of fds is said
 * as such, and the launcher environments give the job identity and IPv6
 * rendezvous addresses. Ranks are processes (harness.h) that record their
 * status and message for the parent to judge. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <cmocka.h>

#include "harness.h"
#include "src/comm/bootstrap.h"
#include "src/comm/comm.h"
#include "src/base/settings.h"

static void record(int rank, weft_status st, double t0) {
  harness_shm->status[rank] = st;
  harness_shm->seconds[rank] = harness_now() - t0;
  harness_shm->word[rank] = (uint64_t)getpid();
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s",
           weft_last_error(NULL));
  if (st)
    fprintf(stderr, "  process %d -> %s after %.2f s: %s\n", rank, weft_status_name(st),
            harness_shm->seconds[rank], weft_last_error(NULL));
}

static weft_status join_at(int port, int rank, int size, double timeout_s, weft_comm **comm) {
  char where[64];
  snprintf(where, sizeof where, "127.0.0.1:%d", port);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.rank = rank;
  cfg.size = size;
  cfg.rendezvous = where;
  cfg.timeout_s = timeout_s;
  return weft_comm_init_config(&cfg, comm);
}

/* ---- a rank of another job ----------------------------------------------- */

typedef struct two_jobs {
  int port;
} two_jobs;

/* Processes 0..3 are job A's ranks 0..3 (its rank 3 comes late); process 4
 * is job B's rank 3, started at A's address and port (B's own launcher
 * picked the same MASTER_PORT), before A's rank 3. */
static int joins_job_a_or_b(int proc, int nproc, const weft_unique_id *id, void *arg) {
  (void)nproc;
  (void)id;
  const two_jobs *jobs = arg;
  bool stray = proc == 4;
  int rank = stray ? 3 : proc;
  setenv("TORCHELASTIC_RUN_ID", stray ? "job-B" : "job-A", 1);
  if (rank == 3 && !stray) usleep(1000000); /* B's rank 3 dials first */
  if (stray) usleep(200000);                /* A's rank 0 is listening by then */
  weft_comm *comm = NULL;
  double t0 = harness_now();
  weft_status st = join_at(jobs->port, rank, 4, 6, &comm);
  if (st) {
    record(proc, st, t0);
    return 0;
  }
  /* a stray that got in would add its own job's data to A's sums */
  int64_t v[256];
  int64_t scale = stray ? 1000 : 1;
  for (int i = 0; i < 256; i++) v[i] = scale * i * (rank + 1);
  st = weft_allreduce(comm, v, v, 256, WEFT_I64, WEFT_SUM);
  for (int i = 0; i < 256 && !st; i++)
    if (v[i] != (int64_t)i * (1 + 2 + 3 + 4)) st = WEFT_ERR_INTERNAL;
  record(proc, st, t0);
  weft_comm_destroy(comm);
  return 0;
}

static void rank_of_another_job_is_refused(void **state) {
  (void)state;
  static two_jobs jobs;
  jobs.port = harness_free_port();
  harness_init();
  assert_int_equal(harness_run(5, NULL, 60, joins_job_a_or_b, &jobs), 0);
  for (int p = 0; p < 4; p++) assert_int_equal(harness_shm->status[p], WEFT_OK);
  /* refused at once, with both jobs named */
  assert_true(harness_shm->status[4] < 0);
  assert_true(harness_shm->seconds[4] < 3);
  assert_non_null(strstr(harness_shm->message[4], "TORCHELASTIC_RUN_ID=job-A"));
  assert_non_null(strstr(harness_shm->message[4], "TORCHELASTIC_RUN_ID=job-B"));
}

/* ---- two processes claim one rank ---------------------------------------- */

/* Processes 0..3 claim ranks 0, 1, 1, 2 of one job of 3; the second
 * claimant comes 0.3 s after the first, rank 2 a second later. */
static int claims_a_rank(int proc, int nproc, const weft_unique_id *id, void *arg) {
  (void)nproc;
  (void)id;
  const int *port = arg;
  static const int ranks[] = {0, 1, 1, 2};
  static const useconds_t delay[] = {0, 0, 300000, 1000000};
  setenv("TORCHELASTIC_RUN_ID", "one-job", 1);
  usleep(delay[proc]);
  weft_comm *comm = NULL;
  double t0 = harness_now();
  weft_status st = join_at(*port, ranks[proc], 3, 6, &comm);
  record(proc, st, t0);
  if (!st) weft_comm_destroy(comm);
  return 0;
}

static void second_claimant_fails_every_rank(void **state) {
  (void)state;
  static int port;
  port = harness_free_port();
  harness_init();
  assert_int_equal(harness_run(4, NULL, 60, claims_a_rank, &port), 0);
  char first[32], second[32];
  snprintf(first, sizeof first, "pid %u on", (unsigned)harness_shm->word[1]);
  snprintf(second, sizeof second, "pid %u on", (unsigned)harness_shm->word[2]);
  for (int p = 0; p < 4; p++) {
    assert_int_equal(harness_shm->status[p], WEFT_ERR_INVALID);
    assert_true(harness_shm->seconds[p] < 4);
    assert_non_null(strstr(harness_shm->message[p], "two processes claim rank 1"));
    assert_non_null(strstr(harness_shm->message[p], first));
    assert_non_null(strstr(harness_shm->message[p], second));
  }
}

/* ---- a rank that never comes --------------------------------------------- */

/* 8 ranks at rank 0's address, rank 1 never starts; rank 0 exits as soon
 * as its init returns, while its rendezvous answers the others. */
static int joins_without_rank_1(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)id;
  const int *port = arg;
  if (rank == 1) return 0;
  weft_comm *comm = NULL;
  double t0 = harness_now();
  weft_status st = join_at(*port, rank, size, 1, &comm);
  record(rank, st, t0);
  if (!st) weft_comm_destroy(comm);
  return 0;
}

static void missing_rank_is_named_by_every_rank(void **state) {
  (void)state;
  static int port;
  for (int run = 0; run < 4; run++) {
    port = harness_free_port();
    harness_init();
    /* no rank crashes (a signal counts as failed) */
    assert_int_equal(harness_run(8, NULL, 30, joins_without_rank_1, &port), 0);
    for (int r = 0; r < 8; r++) {
      if (r == 1) continue;
      assert_int_equal(harness_shm->status[r], WEFT_ERR_TIMEOUT);
      assert_true(harness_shm->seconds[r] < 6);
      assert_non_null(strstr(harness_shm->message[r], "rank 1 never reached the rendezvous"));
      assert_null(strstr(harness_shm->message[r], "WEFT_AUTH_TOKEN"));
    }
  }
}

/* ---- rank 0 fails before it can take part ---------------------------------- */

/* Rank 0 hosts the rendezvous but has a bad local setting: the others hear
 * its sentence at once, not a timeout. */
static int joins_with_bad_rank_0(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)id;
  const int *port = arg;
  if (rank == 0) {
    setenv("WEFT_TRANSPORT", "carrier-pigeon", 1);
    weft_settings_reload();
  } else {
    usleep(200000);
  }
  weft_comm *comm = NULL;
  double t0 = harness_now();
  weft_status st = join_at(*port, rank, size, 20, &comm);
  record(rank, st, t0);
  if (!st) weft_comm_destroy(comm);
  return 0;
}

static void rank_0_failing_early_is_heard_by_all(void **state) {
  (void)state;
  static int port;
  port = harness_free_port();
  harness_init();
  assert_int_equal(harness_run(3, NULL, 60, joins_with_bad_rank_0, &port), 0);
  for (int r = 0; r < 3; r++) {
    assert_true(harness_shm->status[r] < 0);
    assert_true(harness_shm->seconds[r] < 5);
    assert_non_null(strstr(harness_shm->message[r], "carrier-pigeon"));
  }
}

/* ---- an open rendezvous is said once ------------------------------------- */

typedef struct open_job {
  int port[2];
  const char *job_id; /* NULL: no launcher identity */
} open_job;

/* Two jobs in a row; the rank's log (WARN) goes to a file, and the rank
 * records how often it said that its rendezvous is open to anyone. */
static int joins_twice_and_counts_warnings(int rank, int size, const weft_unique_id *id,
                                           void *arg) {
  (void)id;
  const open_job *job = arg;
  if (job->job_id) setenv("TORCHELASTIC_RUN_ID", job->job_id, 1);
  unsetenv("WEFT_AUTH_TOKEN");
  setenv("WEFT_DEBUG", "WARN", 1);
  weft_settings_reload();
  FILE *log = tmpfile();
  if (!log || dup2(fileno(log), STDERR_FILENO) < 0) return 1;
  weft_status st = WEFT_OK;
  for (int i = 0; i < 2 && !st; i++) {
    weft_comm *comm = NULL;
    st = join_at(job->port[i], rank, size, 10, &comm);
    if (!st) st = weft_barrier(comm);
    weft_comm_destroy(comm);
  }
  harness_shm->status[rank] = st;
  fflush(stderr);
  rewind(log);
  char line[1024];
  uint64_t said = 0;
  while (fgets(line, sizeof line, log))
    if (strstr(line, "is open to any process that reaches that port")) said++;
  harness_shm->word[rank] = said;
  return 0;
}

static void open_rendezvous_is_said_once(void **state) {
  (void)state;
  static open_job job;
  static const char *const ids[] = {NULL, "run-7"};
  for (int with_id = 0; with_id < 2; with_id++) {
    job.port[0] = harness_free_port();
    job.port[1] = harness_free_port();
    job.job_id = ids[with_id];
    harness_init();
    assert_int_equal(harness_run(2, NULL, 60, joins_twice_and_counts_warnings, &job), 0);
    for (int r = 0; r < 2; r++) {
      assert_int_equal(harness_shm->status[r], WEFT_OK);
      /* once per process without an identity, never with one */
      assert_int_equal(harness_shm->word[r], with_id ? 0 : 1);
    }
  }
}

/* ---- what a failed init leaves behind ------------------------------------- */

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* In a fresh child (the test process may hold other jobs' servers): rank 0
 * of 2 hosts the rendezvous, a grandchild claims rank 1 of 3, the job
 * fails; after the init returns, threads and fds are as before it. */
static void failed_init_leaves_no_thread_or_fd(void **state) {
  (void)state;
  int port = harness_free_port();
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    int fds0 = count_entries("/proc/self/fd"), tasks0 = count_entries("/proc/self/task");
    pid_t other = fork();
    if (other == 0) {
      usleep(100000);
      weft_comm *c = NULL;
      _exit(join_at(port, 1, 3, 10, &c) == WEFT_ERR_MISMATCH ? 0 : 1);
    }
    weft_comm *comm = NULL;
    double t0 = harness_now();
    weft_status st = join_at(port, 0, 2, 10, &comm);
    double took = harness_now() - t0;
    int fds1 = count_entries("/proc/self/fd"), tasks1 = count_entries("/proc/self/task");
    int other_st;
    waitpid(other, &other_st, 0);
    fprintf(stderr, "  init: %s after %.2f s; fds %d -> %d, threads %d -> %d: %s\n",
            weft_status_name(st), took, fds0, fds1, tasks0, tasks1, weft_last_error(NULL));
    bool ok = st == WEFT_ERR_MISMATCH && took < 5 && fds1 == fds0 && tasks1 == tasks0 &&
              WIFEXITED(other_st) && WEXITSTATUS(other_st) == 0;
    _exit(ok ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(child, &st, 0), child);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- out of file descriptors at the rendezvous ----------------------------- */

/* 16 ranks over tcp; rank 0 (the rendezvous) has only a few fds to spare. */
static int joins_short_of_fds(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)id;
  const int *port = arg;
  if (rank == 0) {
    struct rlimit lim;
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = (rlim_t)count_entries("/proc/self/fd") + 12;
    setrlimit(RLIMIT_NOFILE, &lim);
  } else {
    usleep(200000);
  }
  weft_comm *comm = NULL;
  double t0 = harness_now();
  weft_status st = join_at(*port, rank, size, 12, &comm);
  record(rank, st, t0);
  if (!st) weft_comm_destroy(comm);
  return 0;
}

static void rendezvous_out_of_fds(void **state) {
  (void)state;
  static int port;
  port = harness_free_port();
  harness_init();
  assert_int_equal(harness_run(16, NULL, 60, joins_short_of_fds, &port), 0);
  /* every rank fails at once (no spinning to the deadline), told why */
  for (int r = 0; r < 16; r++) {
    assert_true(harness_shm->status[r] < 0);
    assert_true(harness_shm->seconds[r] < 6);
    assert_non_null(strstr(harness_shm->message[r], "Too many open files"));
  }
}

/* ---- the launchers' environment ------------------------------------------- */

static const char *const launcher_vars[] = {
    "WEFT_RANK",      "WEFT_SIZE",    "WEFT_RENDEZVOUS",     "WEFT_JOB_ID",
    "MASTER_ADDR",    "MASTER_PORT",  "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE", "SLURM_JOB_ID", "SLURM_STEP_ID",       NULL};

static void clear_env(void) {
  for (int i = 0; launcher_vars[i]; i++) unsetenv(launcher_vars[i]);
  weft_settings_reload();
}

static void job_identity_from_launchers(void **state) {
  (void)state;
  char job[BOOT_JOB_BYTES];
  clear_env();
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "");
  setenv("SLURM_JOB_ID", "4711", 1);
  setenv("SLURM_STEP_ID", "2", 1);
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "SLURM_JOB_ID=4711.2");
  setenv("PMIX_NAMESPACE", "prterun-host-77@1", 1);
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "PMIX_NAMESPACE=prterun-host-77@1");
  setenv("OMPI_MCA_ess_base_jobid", "2998075393", 1);
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "OMPI_MCA_ess_base_jobid=2998075393");
  setenv("TORCHELASTIC_RUN_ID", "none", 1); /* torchrun's default: the same on every job */
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "OMPI_MCA_ess_base_jobid=2998075393");
  setenv("TORCHELASTIC_RUN_ID", "5b0c", 1);
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "TORCHELASTIC_RUN_ID=5b0c");
  setenv("WEFT_JOB_ID", "weftrun-1-ab", 1);
  weft_settings_reload();
  weft_env_job_id(job, sizeof job);
  assert_string_equal(job, "WEFT_JOB_ID=weftrun-1-ab");
  clear_env();
}

static void master_addr_ipv6_literals(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"[::1]", "[::1]:29501"},
      {"::1", "[::1]:29501"},
      {"fe80::1%eth0", "[fe80::1%eth0]:29501"},
      {"10.0.0.7", "10.0.0.7:29501"},
      {"node-3", "node-3:29501"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    clear_env();
    setenv("WEFT_RANK", "1", 1);
    setenv("WEFT_SIZE", "2", 1);
    setenv("MASTER_ADDR", cases[i][0], 1);
    setenv("MASTER_PORT", "29501", 1);
    weft_settings_reload();
    weft_env_job job;
    char why[300] = "";
    assert_int_equal(weft_env_read(&job, why, sizeof why), WEFT_OK);
    assert_string_equal(job.rendezvous, cases[i][1]);
  }
  /* half a bracket is refused with the variable named */
  setenv("MASTER_ADDR", "[::1", 1);
  weft_env_job job;
  char why[300] = "";
  assert_int_equal(weft_env_read(&job, why, sizeof why), WEFT_ERR_INVALID);
  assert_non_null(strstr(why, "MASTER_ADDR"));
  clear_env();
}

int main(void) {
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(failed_init_leaves_no_thread_or_fd),
      cmocka_unit_test(rank_of_another_job_is_refused),
      cmocka_unit_test(second_claimant_fails_every_rank),
      cmocka_unit_test(missing_rank_is_named_by_every_rank),
      cmocka_unit_test(open_rendezvous_is_said_once),
      cmocka_unit_test(rank_0_failing_early_is_heard_by_all),
      cmocka_unit_test(rendezvous_out_of_fds),
      cmocka_unit_test(job_identity_from_launchers),
      cmocka_unit_test(master_addr_ipv6_literals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
