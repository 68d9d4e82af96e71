/* foreign_client.c - strangers at a job's doors, for the fault table
 * (tools/fault_table.sh): while 2 ranks over tcp start up and run
 * allreduces, clients that are not ranks connect to the rendezvous port and
 * to rank 1's data port (each case a process of its own, all at once) and
 * send garbage, an oversize message (every length field at its maximum), a
 * truncated header, nothing at all, or a well-formed message without the
 * job's token (a zero MAC). Prints one markdown row per case: how long until
 * the stranger was dropped, and what each rank returned. Exit 0 when both
 * ranks succeeded with right results. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "harness.h"
#include "src/comm/bootstrap.h"
#include "transports/tcp/tcp.h"

#define CASES 5
static const char *case_name[CASES] = {
    "garbage (300 B)", "oversize (all length fields 0xff..)", "truncated header (17 B, then EOF)",
    "silent (connects, sends nothing)", "no token (well-formed, zero MAC)"};

typedef struct job {
  int rdv_port;
  double dropped[2][CASES]; /* [door][case]: seconds until EOF/RST; -1 never, -2 no connect */
} job;

static job *shared;

/* One stranger: connect, send the case's bytes, then wait (at most 8 s) for
 * the other side to hang up. Returns the seconds that took. */
static double stranger(int port, int door, int c) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  double until = harness_now() + 5;
  int s = -1;
  while (harness_now() < until) {
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (!connect(s, (struct sockaddr *)&a, sizeof a)) break;
    close(s);
    s = -1;
    usleep(5000);
  }
  if (s < 0) return -2;
  uint8_t msg[BOOT_HELLO_BYTES + 64];
  size_t full = door == 0 ? sizeof msg : TCP_HANDSHAKE_BYTES, len = 0;
  uint32_t magic = htonl(door == 0 ? BOOT_MAGIC : TCP_HANDSHAKE_MAGIC);
  switch (c) {
    case 0:
      for (size_t i = 0; i < 300; i++) msg[i] = (uint8_t)(i * 131 + 7);
      len = 300;
      break;
    case 1:
      memset(msg, 0xff, full);
      memcpy(msg, &magic, 4);
      len = full;
      break;
    case 2:
      memset(msg, 0, 17);
      memcpy(msg, &magic, 4);
      len = 17;
      break;
    case 3: len = 0; break;
    default: /* plausible fields, a MAC of zeros */
      memset(msg, 0, full);
      memcpy(msg, &magic, 4);
      if (door == 0)
        msg[5] = BOOT_VERSION, msg[15] = 2; /* version, world size 2 */
      else
        msg[11] = 1; /* to rank 1 */
      len = full;
      break;
  }
  double t0 = harness_now();
  if (len && send(s, msg, len, MSG_NOSIGNAL) < 0) perror("stranger");
  if (c == 2) shutdown(s, SHUT_WR);
  struct timeval tv = {0, 100000};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  double took = -1;
  while (harness_now() < t0 + 8) {
    char buf[256];
    ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      took = harness_now() - t0;
      break;
    }
  }
  close(s);
  return took;
}

/* Every case at once, each a process of its own (reaped by the caller). */
static void strangers(int port, int door) {
  for (int c = 0; c < CASES; c++)
    if (fork() == 0) {
      shared->dropped[door][c] = stranger(port, door, c);
      _exit(0);
    }
}

static int rank_main(int rank, int size, const weft_unique_id *id, void *arg) {
  (void)id, (void)arg;
  char where[64];
  snprintf(where, sizeof where, "127.0.0.1:%d", shared->rdv_port);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.rank = rank;
  cfg.size = size;
  cfg.rendezvous = where;
  cfg.timeout_s = 10;
  weft_comm *comm = NULL;
  double t0 = harness_now();
  if (rank == 1) usleep(1500000); /* the rendezvous strangers come first */
  weft_status st = weft_comm_init_config(&cfg, &comm);
  if (st) {
    harness_shm->status[rank] = st;
    snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%s",
             weft_last_error(NULL));
    return 1;
  }
  if (rank == 0) { /* strangers at rank 1's data port while we work */
    const char *tp, *why;
    weft_comm_peer_transport(comm, 1, &tp, &why);
    const char *colon = strrchr(why, ':');
    strangers(colon ? atoi(colon + 1) : 0, 1);
  }
  /* about 4 s of allreduces (rank 1 accepts, and must refuse, while in a
   * call); the last element says "stop", so both ranks stop after one call */
  int64_t v[1001];
  int calls = 0;
  bool stop = false;
  while (!st && !stop) {
    for (int i = 0; i < 1000; i++) v[i] = (int64_t)i * (rank + 1) + calls;
    v[1000] = harness_now() > t0 + 4.5;
    st = weft_allreduce(comm, v, v, 1001, WEFT_I64, WEFT_SUM);
    for (int i = 0; i < 1000 && !st; i++)
      if (v[i] != (int64_t)i * 3 + 2 * calls) st = WEFT_ERR_INTERNAL;
    stop = v[1000] > 0;
    calls++;
  }
  harness_shm->status[rank] = st;
  snprintf(harness_shm->message[rank], sizeof harness_shm->message[rank], "%d allreduces%s%s",
           calls, st ? ": " : "", st ? weft_last_error(comm) : "");
  weft_comm_destroy(comm);
  while (rank == 0 && wait(NULL) > 0) {
  }
  return st != WEFT_OK;
}

int main(void) {
  shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  shared->rdv_port = harness_free_port();
  harness_init();
  static const char *const env[] = {"WEFT_TRANSPORT=tcp", "WEFT_DEBUG=NONE", NULL};
  strangers(shared->rdv_port, 0);
  int failed = harness_run(2, env, 60, rank_main, NULL);
  while (wait(NULL) > 0) {
  }
  const char *door[2] = {"the rendezvous port", "rank 1's tcp data port"};
  for (int d = 0; d < 2; d++)
    for (int c = 0; c < CASES; c++) {
      char seen[64];
      double t = shared->dropped[d][c];
      if (t >= 0)
        snprintf(seen, sizeof seen, "dropped after %.2f s", t);
      else
        snprintf(seen, sizeof seen, t == -2 ? "could not connect" : "not dropped within 8 s");
      printf("| stranger at %s: %s | %s | rank 0: %s (%s); rank 1: %s (%s) |\n", door[d],
             case_name[c], seen, weft_status_name(harness_shm->status[0]), harness_shm->message[0],
             weft_status_name(harness_shm->status[1]), harness_shm->message[1]);
    }
  return failed ? 1 : 0;
}
