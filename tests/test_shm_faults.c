/* test_shm_faults.c - the shared-memory transport when a pair goes wrong
 * before both ranks have mapped its segment: a rank dies first (no name may
 * be left in /dev/shm), the ranks' settings differ (a mismatch on both at
 * once, not a timeout), /dev/shm fills up after the transport was chosen
 * (both ranks fail alike, at once, saying so). Ranks are processes; the
 * segment checks look only at this test's own names (its own communicator
 * id, or a private /dev/shm), so other jobs on the machine do not matter. */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <cmocka.h>

#include "harness.h"
#include "src/base/auth.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "src/topo/select.h"
#include "transports/transport.h"

static void record(int rank, weft_status st, double t0, const char *msg) {
  harness_shm->status[rank] = st;
  harness_shm->seconds[rank] = harness_now() - t0;
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s", msg);
  if (st)
    fprintf(stderr, "  rank %d -> %s after %.2f s: %s\n", rank, weft_status_name(st),
            harness_shm->seconds[rank], msg);
}

/* ---- a rank dies before the pair's segment is mapped (transport level) ---- */

/* Words in harness_shm: the published addresses' lengths and the ranks'
 * pids, then what each step has reached. */
enum { W_ALEN = 0, W_PID = 2, W_CONNECTED = 4, W_NAME_LEFT = 5 };
_Static_assert(WEFT_TRANSPORT_ADDR_MAX <= sizeof harness_shm->message[0], "addresses fit");

typedef struct tp_rank {
  weft_place place;
  weft_auth_key key;
  weft_error_sink sink;
  weft_transport_init_args args;
  uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
  size_t alen;
  weft_tp_ctx *ctx;
} tp_rank;

static uint64_t comm_id_now; /* a fresh one per case: the names are this test's own */

static const weft_transport *shm = &weft_transport_shm;

static void pair_name(char *path, size_t len) {
  snprintf(path, len, "/dev/shm/weft-%016llx-0-1-0", (unsigned long long)comm_id_now);
}

static bool name_exists(void) {
  char path[96];
  pair_name(path, sizeof path);
  return access(path, F_OK) == 0;
}

static uint64_t word_get(int i) {
  return __atomic_load_n(&harness_shm->word[i], __ATOMIC_ACQUIRE);
}
static void word_set(int i, uint64_t v) {
  __atomic_store_n(&harness_shm->word[i], v, __ATOMIC_RELEASE);
}
/* Waits (bounded) for word i to become non-zero. */
static bool word_wait(int i) {
  double until = harness_now() + 10;
  while (!word_get(i)) {
    if (harness_now() > until) return false;
    usleep(1000);
  }
  return true;
}

/* This rank's context, its address published, the peer's read back. */
static bool tp_start(tp_rank *t, int rank, uint8_t *peer_addr, size_t *peer_len) {
  memset(t, 0, sizeof *t);
  weft_place_here(NULL, &t->place);
  weft_auth_key_for_job(NULL, 0, &t->key);
  t->args = (weft_transport_init_args){.rank = rank,
                                       .size = 2,
                                       .comm_id = comm_id_now,
                                       .chunk_bytes = 4096,
                                       .timeout_s = 5,
                                       .wake_fd = -1,
                                       .errors = &t->sink,
                                       .place = &t->place,
                                       .auth = &t->key,
                                       .local_size = 2};
  if (shm->init(&t->args, &t->ctx, t->addr, &t->alen)) return false;
  memcpy(harness_shm->message[rank], t->addr, t->alen);
  word_set(W_PID + rank, (uint64_t)getpid());
  word_set(W_ALEN + rank, t->alen);
  if (!word_wait(W_ALEN + !rank)) return false;
  *peer_len = word_get(W_ALEN + !rank);
  memcpy(peer_addr, harness_shm->message[!rank], *peer_len);
  char why[256];
  return shm->can_reach(t->ctx, !rank, peer_addr, *peer_len, why, sizeof why);
}

/* Blocks until process `pid` (a sibling, so not ours to wait for) ended:
 * its pidfd where the kernel has them, else until the harness reaped it. */
static bool process_ended(pid_t pid) {
  int fd = -1;
#ifdef SYS_pidfd_open
  fd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
  if (fd >= 0) {
    struct pollfd p = {fd, POLLIN, 0};
    bool ended = poll(&p, 1, 10000) == 1;
    close(fd);
    return ended;
  }
  double until = harness_now() + 10;
  while (kill(pid, 0) == 0 || errno != ESRCH) {
    if (harness_now() > until) return false;
    usleep(1000);
  }
  return true;
}

/* Drives `conn` until it answers something other than WEFT_AGAIN; `idle`:
 * asks whether what it sent is complete, else whether it may send. It
 * sleeps first, so the transport looks at its peer's liveness first. */
static weft_status until_answer(tp_rank *t, weft_tp_conn *conn, bool idle) {
  double until = harness_now() + 10;
  weft_status st;
  do {
    shm->wait(t->ctx, 1);
    st = idle ? shm->send_idle(conn) : shm->send_ready(conn);
  } while (st == WEFT_AGAIN && harness_now() < until);
  return st;
}

/* Rank 1 has started to open the pair (its segment not there yet); rank 0
 * makes the segment and dies before rank 1 maps it. Rank 1 sees the death
 * first, as it does whenever the death comes between two of its looks. */
static int creator_dies(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)size, (void)id, (void)arg;
  tp_rank t;
  uint8_t peer[WEFT_TRANSPORT_ADDR_MAX];
  size_t plen;
  if (!tp_start(&t, rank, peer, &plen)) return 1;
  weft_tp_conn *conn;
  if (rank == 0) {
    if (!word_wait(W_CONNECTED)) return 1;
    if (shm->connect(t.ctx, 1, 0, peer, plen, &conn) || !name_exists()) return 1;
    _exit(0); /* gone without a word, its segment made and not yet mapped */
  }
  double t0 = harness_now();
  if (shm->connect(t.ctx, 0, 0, peer, plen, &conn) || name_exists()) return 1;
  word_set(W_CONNECTED, 1);
  if (!process_ended((pid_t)word_get(W_PID + 0))) return 1;
  weft_status st = until_answer(&t, conn, false);
  /* before this rank's own end: it may crash next, and must leave nothing */
  word_set(W_NAME_LEFT + rank, name_exists());
  record(rank, st, t0, t.sink.msg);
  shm->fini(t.ctx);
  return 0;
}

static void creator_dies_before_the_opener_maps(void **state) {
  (void)state;
  harness_init();
  comm_id_now = ((uint64_t)getpid() << 32) ^ 0x5e6d01;
  assert_int_equal(harness_run(2, NULL, 30, creator_dies, NULL), 0);
  assert_int_equal(harness_shm->status[1], WEFT_ERR_PEER_LOST);
  assert_non_null(strstr(harness_shm->message[1], "peer 0"));
  assert_int_equal(word_get(W_NAME_LEFT + 1), 0);
  assert_false(name_exists());
}

/* Rank 0 makes the segment; rank 1 exits without opening it; rank 0 sees
 * that, then crashes before its own end: nothing may be left. */
static int opener_dies(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)size, (void)id, (void)arg;
  tp_rank t;
  uint8_t peer[WEFT_TRANSPORT_ADDR_MAX];
  size_t plen;
  if (!tp_start(&t, rank, peer, &plen)) return 1;
  if (rank == 1) _exit(0);
  weft_tp_conn *conn;
  double t0 = harness_now();
  if (shm->connect(t.ctx, 1, 0, peer, plen, &conn) || !name_exists()) return 1;
  if (!process_ended((pid_t)word_get(W_PID + 1))) return 1;
  /* a chunk posted before the peer mapped it is never delivered */
  static const char chunk[16] = "to a dead peer";
  weft_status st = shm->send_ready(conn);
  if (st == WEFT_OK) st = shm->send(conn, chunk, sizeof chunk, 1, &weft_mem_host, 0);
  if (st == WEFT_OK) st = until_answer(&t, conn, true);
  word_set(W_NAME_LEFT + rank, name_exists());
  record(rank, st, t0, t.sink.msg);
  _exit(0); /* crashes here: no fini */
}

static void opener_dies_then_the_creator_crashes(void **state) {
  (void)state;
  harness_init();
  comm_id_now = ((uint64_t)getpid() << 32) ^ 0x5e6d02;
  assert_int_equal(harness_run(2, NULL, 30, opener_dies, NULL), 0);
  assert_int_equal(harness_shm->status[0], WEFT_ERR_PEER_LOST);
  assert_int_equal(word_get(W_NAME_LEFT + 0), 0);
  assert_false(name_exists());
}

/* ---- the pair's settings differ (library level) ------------------------------ */

typedef struct setting_pair {
  const char *name;
  const char *value[2]; /* per rank */
} setting_pair;

static int allreduce_with_setting(int rank, int size, const weft_unique_id *id, void *arg) {
  const setting_pair *sp = arg;
  setenv(sp->name, sp->value[rank], 1);
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  float v[1000] = {0};
  double t0 = harness_now();
  weft_status st = weft_allreduce(comm, v, v, 1000, WEFT_F32, WEFT_SUM);
  record(rank, st, t0, weft_last_error(comm));
  weft_comm_destroy(comm);
  return 0;
}

static void check_setting_mismatch(const char *name, const char *lower, const char *higher) {
  static const char *const env[] = {"WEFT_TIMEOUT=20", "WEFT_TRANSPORT=shm", NULL};
  setting_pair sp = {name, {lower, higher}};
  harness_init();
  assert_int_equal(harness_run(2, env, 60, allreduce_with_setting, &sp), 0);
  for (int r = 0; r < 2; r++) {
    const char *msg = harness_shm->message[r];
    assert_int_equal(harness_shm->status[r], WEFT_ERR_MISMATCH);
    assert_true(harness_shm->seconds[r] < 5); /* at once, not at the timeout */
    char lo[64], hi[64];
    snprintf(lo, sizeof lo, "%s on rank 0", lower);
    snprintf(hi, sizeof hi, "%s on rank 1", higher);
    if (!strstr(msg, name) || !strstr(msg, lo) || !strstr(msg, hi))
      fail_msg("rank %d's message does not name %s, %s and %s: %s", r, name, lo, hi, msg);
  }
}

static void slots_differ_higher_rank_larger(void **state) {
  (void)state;
  check_setting_mismatch("WEFT_SHM_SLOTS", "8", "16");
}

static void slots_differ_lower_rank_larger(void **state) {
  (void)state;
  check_setting_mismatch("WEFT_SHM_SLOTS", "16", "4");
}

static void chunk_bytes_differ_higher_rank_larger(void **state) {
  (void)state;
  check_setting_mismatch("WEFT_CHUNK_BYTES", "262144", "524288");
}

/* ---- /dev/shm fills up between the choice and the first call ---------------- */

#define SHM_PRIVATE_MIB 16
#define W_FILLED 12

static int filled_after_init(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)arg;
  weft_comm *comm = harness_comm(rank, size, id);
  if (!comm) return 1;
  const char *tp = "", *why;
  weft_comm_peer_transport(comm, !rank, &tp, &why);
  snprintf(harness_shm->transport[rank], sizeof harness_shm->transport[rank], "%s", tp);
  if (rank == 0) { /* another job takes all but 1 MiB */
    struct statvfs vfs;
    int fd = open("/dev/shm/other-job", O_CREAT | O_RDWR, 0600);
    if (fd < 0 || statvfs("/dev/shm", &vfs)) return 1;
    off_t take = (off_t)(vfs.f_bavail * vfs.f_frsize) - (1 << 20);
    if (posix_fallocate(fd, 0, take)) return 1;
    close(fd);
    word_set(W_FILLED, 1);
  } else if (!word_wait(W_FILLED)) {
    return 1;
  }
  float v[1000] = {0};
  double t0 = harness_now();
  weft_status st = weft_allreduce(comm, v, v, 1000, WEFT_F32, WEFT_SUM);
  record(rank, st, t0, weft_last_error(comm));
  if (rank == 0) sleep(3); /* alive a while after its error, as a program that reports it */
  weft_comm_destroy(comm);
  if (rank == 0) unlink("/dev/shm/other-job");
  return 0;
}

/* In a private mount namespace with a small tmpfs on /dev/shm (as
 * tests/test_small_shm.sh): what is left there is this test's alone. */
static int run_in_small_dev_shm(void) {
  if (unshare(CLONE_NEWNS)) return 77;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) return 77;
  char opts[32];
  snprintf(opts, sizeof opts, "size=%dm", SHM_PRIVATE_MIB);
  if (mount("tmpfs", "/dev/shm", "tmpfs", 0, opts)) return 77;
  static const char *const env[] = {"WEFT_TIMEOUT=20", NULL};
  int failed = harness_run(2, env, 60, filled_after_init, NULL);
  int left = 0;
  DIR *d = opendir("/dev/shm");
  for (struct dirent *e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') {
      fprintf(stderr, "  left in /dev/shm: %s\n", e->d_name);
      left++;
    }
  if (d) closedir(d);
  return failed ? 1 : left ? 2 : 0;
}

static void dev_shm_filled_between_init_and_first_call(void **state) {
  (void)state;
  harness_init();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(run_in_small_dev_shm());
  int wst = 0;
  waitpid(pid, &wst, 0);
  assert_true(WIFEXITED(wst));
  if (WEXITSTATUS(wst) == 77) skip(); /* no root or no mount namespace here */
  assert_int_equal(WEXITSTATUS(wst), 0);
  for (int r = 0; r < 2; r++) {
    assert_string_equal(harness_shm->transport[r], "shm"); /* the room was there at init */
    assert_int_equal(harness_shm->status[r], WEFT_ERR_NOMEM);
    const char *msg = harness_shm->message[r];
    if (!strstr(msg, "/dev/shm has") || !strstr(msg, "MiB free") || !strstr(msg, "needs"))
      fail_msg("rank %d's message names neither /dev/shm's free space nor the need: %s", r, msg);
  }
  /* the opener learns it from the creator's mark, not when the creator ends */
  assert_true(harness_shm->seconds[1] < 2);
}

int main(void) {
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(creator_dies_before_the_opener_maps),
      cmocka_unit_test(opener_dies_then_the_creator_crashes),
      cmocka_unit_test(slots_differ_higher_rank_larger),
      cmocka_unit_test(slots_differ_lower_rank_larger),
      cmocka_unit_test(chunk_bytes_differ_higher_rank_larger),
      cmocka_unit_test(dev_shm_filled_between_init_and_first_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
