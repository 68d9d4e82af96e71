/* fuzz_seeds.c - writes a seed corpus of valid messages made by the real
 * encoders: `fuzz_seeds DIR` fills DIR/<target>/ with what real ranks, a real
 * rendezvous server and real transport contexts put on the wire. The
 * rendezvous bytes are recorded by a relay between ranks (threads here) and
 * the server; the TCP bytes by a socket that plays the peer. Run it again
 * when a wire format changes (tests/fuzz/corpus/ was made with it). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/auth.h"
#include "src/comm/bootstrap.h"
#include "src/base/net.h"
#include "src/base/status.h"
#include "src/topo/select.h"
#include "transports/tcp/tcp.h"
#include "weft.h"

/* a tcp frame's header on the wire */
#define HDR sizeof(tcp_frame_hdr)

static const char *out_dir;

/* fuzz_seeds_shm.c */
void fuzz_seeds_shm(const weft_place *place,
                    void (*seed)(const char *, const char *, const void *, size_t));

static void seed(const char *target, const char *name, const void *buf, size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) {
    fprintf(stderr, "fuzz_seeds: cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

/* ---- the rendezvous, through a recording relay ------------------------------ */

#define MAX_LINKS 2
typedef struct recording {
  uint8_t up[8192], down[8192]; /* rank -> server, server -> rank */
  size_t up_len, down_len;
} recording;

typedef struct rank_job {
  weft_unique_id id;
  int rank, size;
  weft_status st;
} rank_job;

static void *rank_main(void *arg) {
  rank_job *j = arg;
  weft_comm *comm = NULL;
  j->st = weft_comm_init_rank(&comm, &j->id, j->rank, j->size);
  if (comm) weft_comm_destroy(comm);
  return NULL;
}

static void append(uint8_t *buf, size_t *len, const uint8_t *data, size_t n) {
  size_t room = 8192 - *len;
  memcpy(buf + *len, data, n < room ? n : room);
  *len += n < room ? n : room;
}

/* Starts `nranks` ranks on an id that names our relay, relays each to the
 * real server at `server`, records both directions. */
static void relay_job(const weft_unique_id *real_id, int nranks, int claimed_size, recording *rec) {
  struct sockaddr_storage server, lo = {0}, bound;
  socklen_t server_len, bound_len;
  if (!net_addr_unpack((const uint8_t *)real_id->bytes + 4, &server, &server_len)) exit(1);
  struct sockaddr_in *lo4 = (struct sockaddr_in *)&lo;
  lo4->sin_family = AF_INET;
  lo4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int lfd;
  weft_error_sink err;
  if (net_listen(&lo, sizeof *lo4, 8, &lfd, &bound, &bound_len, &err)) exit(1);
  rank_job jobs[MAX_LINKS];
  pthread_t th[MAX_LINKS];
  for (int r = 0; r < nranks; r++) {
    jobs[r] = (rank_job){.id = *real_id, .rank = r, .size = claimed_size};
    net_addr_pack(&bound, (uint8_t *)jobs[r].id.bytes + 4);
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  int rank_fd[MAX_LINKS], server_fd[MAX_LINKS];
  for (int i = 0; i < nranks; i++) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, 20000) != 1) exit(1);
    rank_fd[i] = accept(lfd, NULL, NULL);
    if (rank_fd[i] < 0 ||
        net_connect(&server, server_len, weft_now() + 10, true, &server_fd[i], &err))
      exit(1);
  }
  close(lfd);
  int open_links = nranks;
  bool done[MAX_LINKS] = {0};
  double deadline = weft_now() + 20;
  while (open_links && weft_now() < deadline) {
    struct pollfd p[2 * MAX_LINKS];
    for (int i = 0; i < nranks; i++) {
      p[2 * i] = (struct pollfd){.fd = done[i] ? -1 : rank_fd[i], .events = POLLIN};
      p[2 * i + 1] = (struct pollfd){.fd = done[i] ? -1 : server_fd[i], .events = POLLIN};
    }
    if (poll(p, (nfds_t)(2 * nranks), 200) <= 0) continue;
    for (int i = 0; i < nranks; i++)
      for (int side = 0; side < 2 && !done[i]; side++) {
        if (!p[2 * i + side].revents) continue;
        uint8_t buf[4096];
        int from = side ? server_fd[i] : rank_fd[i], to = side ? rank_fd[i] : server_fd[i];
        ssize_t n = recv(from, buf, sizeof buf, 0);
        if (n <= 0) {
          if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          shutdown(to, SHUT_WR);
          done[i] = true;
          open_links--;
          continue;
        }
        if (side)
          append(rec[i].down, &rec[i].down_len, buf, (size_t)n);
        else
          append(rec[i].up, &rec[i].up_len, buf, (size_t)n);
        if (net_send_all(to, buf, (size_t)n, weft_now() + 5, &err)) exit(1);
      }
  }
  for (int r = 0; r < nranks; r++) {
    pthread_join(th[r], NULL);
    close(rank_fd[r]);
    close(server_fd[r]);
  }
}

#define CHALLENGE_MSG (4 + WEFT_AUTH_CHALLENGE_BYTES)

static void rendezvous_seeds(void) {
  /* a good job of two ranks */
  weft_unique_id id;
  if (weft_get_unique_id(&id)) exit(1);
  recording rec[MAX_LINKS] = {0};
  relay_job(&id, 2, 2, rec);
  for (int r = 0; r < 2; r++) {
    char name[32];
    if (rec[r].up_len < BOOT_HELLO_BYTES || rec[r].down_len < CHALLENGE_MSG + BOOT_REPLY_BYTES) {
      fprintf(stderr, "fuzz_seeds: rank %d's rendezvous was not recorded\n", r);
      exit(1);
    }
    snprintf(name, sizeof name, "rank%d_hello", r);
    seed("boot_hello", name, rec[r].up, rec[r].up_len);
    /* the table answer, for a rank expecting 2 ranks (first byte 1) */
    uint8_t answer[8192];
    answer[0] = 1;
    memcpy(answer + 1, rec[r].down + CHALLENGE_MSG, rec[r].down_len - CHALLENGE_MSG);
    snprintf(name, sizeof name, "rank%d_table", r);
    seed("boot_reply", name, answer, 1 + rec[r].down_len - CHALLENGE_MSG);
    /* each rank's transport entries as published (shm then tcp) */
    boot_hello hello;
    if (boot_hello_parse(rec[r].up, rec[r].up_len, &hello)) exit(1);
    uint8_t entries[2 + BOOT_ADDR_BYTES];
    entries[0] = (uint8_t)(hello.info.addr_len >> 8);
    entries[1] = (uint8_t)hello.info.addr_len;
    memcpy(entries + 2, hello.info.addr, hello.info.addr_len);
    snprintf(name, sizeof name, "rank%d_entries", r);
    seed("transport_addr", name, entries, 2 + (size_t)hello.info.addr_len);
  }
  /* a refused job: the server expects 3 ranks, the rank says 2 */
  uint8_t nonce[BOOT_NONCE_BYTES] = "fuzz seed nonce";
  struct sockaddr_storage lo = {0}, bound;
  socklen_t bound_len;
  struct sockaddr_in *lo4 = (struct sockaddr_in *)&lo;
  lo4->sin_family = AF_INET;
  lo4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  weft_error_sink err;
  boot_server *srv;
  if (boot_server_start(&lo, sizeof *lo4, nonce, 3, NULL, 10, &bound, &bound_len, &srv, &err))
    exit(1);
  boot_server_register(srv); /* stopped and joined at exit */
  weft_unique_id bad = {{0}};
  uint32_t magic = htonl(0x57464944u);
  memcpy(bad.bytes, &magic, 4);
  net_addr_pack(&bound, (uint8_t *)bad.bytes + 4);
  memcpy((uint8_t *)bad.bytes + 24, nonce, BOOT_NONCE_BYTES);
  recording refused[MAX_LINKS] = {0};
  relay_job(&bad, 1, 2, refused);
  if (refused[0].down_len < CHALLENGE_MSG + BOOT_REPLY_BYTES) exit(1);
  uint8_t answer[8192];
  answer[0] = 1;
  memcpy(answer + 1, refused[0].down + CHALLENGE_MSG, refused[0].down_len - CHALLENGE_MSG);
  seed("boot_reply", "refused", answer, 1 + refused[0].down_len - CHALLENGE_MSG);
}

/* ---- tcp: a real context dials a socket that plays its peer ---------------- */

static weft_error_sink sink;
static weft_place place;
static weft_auth_key zero_key; /* the fuzz targets' key */

static void recv_exact(int fd, void *buf, size_t len) {
  weft_error_sink err;
  if (net_recv_all(fd, buf, len, weft_now() + 5, &err)) {
    fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
    exit(1);
  }
}

static void tcp_seeds(void) {
  weft_transport_init_args args = {.rank = 0,
                                   .size = 2,
                                   .comm_id = 0x1122334455667788ull,
                                   .chunk_bytes = 4096,
                                   .timeout_s = 5,
                                   .wake_fd = -1,
                                   .errors = &sink,
                                   .place = &place,
                                   .auth = &zero_key,
                                   .local_size = 1};
  struct sockaddr_in *lo = (struct sockaddr_in *)&args.local_addr;
  lo->sin_family = AF_INET;
  lo->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  args.local_addr_len = sizeof *lo;
  uint8_t blob[WEFT_TRANSPORT_ADDR_MAX];
  size_t blob_len;
  weft_tp_ctx *ctx;
  if (weft_transport_tcp.init(&args, &ctx, blob, &blob_len)) exit(1);
  /* the peer: a listener whose packed address rank 0 dials */
  struct sockaddr_storage any = args.local_addr, bound;
  socklen_t bound_len;
  int lfd;
  if (net_listen(&any, sizeof *lo, 1, &lfd, &bound, &bound_len, &sink)) exit(1);
  uint8_t peer_addr[NET_ADDR_PACKED];
  net_addr_pack(&bound, peer_addr);
  weft_tp_conn *c;
  if (weft_transport_tcp.connect(ctx, 1, 0, peer_addr, sizeof peer_addr, &c)) exit(1);
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  if (poll(&p, 1, 5000) != 1) exit(1);
  int fd = accept(lfd, NULL, NULL);
  uint8_t hs[TCP_HANDSHAKE_BYTES];
  recv_exact(fd, hs, sizeof hs);
  seed("tcp_handshake", "rank0_to_1", hs, sizeof hs);
  /* the same bytes arriving at rank 1 of that communicator pass its checks */
  tcp_handshake_info info;
  if (tcp_handshake_parse(hs, sizeof hs, &info) || tcp_handshake_check(&info, 1, args.comm_id))
    exit(1);

  /* data frames of 0, 16 and 4096 bytes, then a failure notice */
  static uint8_t payload[4096];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 7);
  size_t sizes[] = {0, 16, 4096};
  uint8_t stream[2 + 3 * HDR + 16 + 4096 + HDR + 300];
  size_t stream_len = 2;
  for (int i = 0; i < 3; i++) {
    while (weft_transport_tcp.send_ready(c) == WEFT_AGAIN) {
      bool moved;
      weft_transport_tcp.progress(ctx, &moved);
    }
    if (weft_transport_tcp.send(c, payload, sizes[i], (uint32_t)i, NULL, 0)) exit(1);
    while (weft_transport_tcp.send_idle(c) == WEFT_AGAIN) usleep(1000);
    uint8_t frame[HDR + 4096];
    recv_exact(fd, frame, HDR + sizes[i]);
    char name[32];
    snprintf(name, sizeof name, "data_%zu", sizes[i]);
    seed("tcp_frame", name, frame, HDR);
    memcpy(stream + stream_len, frame, HDR + sizes[i]);
    stream_len += HDR + sizes[i];
  }
  weft_transport_tcp.abort_all(ctx, "rank 0 failed in weft_allreduce: a seed for the fuzzer");
  uint8_t abort_frame[HDR + 300];
  recv_exact(fd, abort_frame, HDR);
  tcp_frame_info f;
  if (tcp_frame_parse(abort_frame, HDR, &f) || f.type != TCP_FRAME_ABORT || f.len > 300) exit(1);
  recv_exact(fd, abort_frame + HDR, f.len);
  seed("tcp_frame", "abort", abort_frame, HDR);
  /* streams for the receive path: the 16-byte chunk after a 0-byte one
   * (sizes byte 16, plain reads), and the failure notice alone */
  memcpy(stream + stream_len, abort_frame, HDR + f.len);
  stream_len += HDR + f.len;
  stream[0] = 0, stream[1] = 0; /* expects 0-byte chunks: the first frame passes */
  seed("tcp_stream", "data_then_abort", stream, stream_len);
  uint8_t alone[2 + HDR + 300] = {2, 16};
  memcpy(alone + 2, abort_frame, HDR + f.len);
  seed("tcp_stream", "abort_only", alone, 2 + HDR + f.len);
  close(fd);
  close(lfd);
  weft_transport_tcp.fini(ctx);
}

/* ---- edge cases: what a stranger or a broken peer may send ------------------ */

static void put_be32(uint8_t *p, uint32_t v) {
  v = htonl(v);
  memcpy(p, &v, 4);
}

static void edge_seeds(void) {
  static uint8_t buf[8192];
  /* a hello cut short, one with every length field at its maximum */
  memset(buf, 0, sizeof buf);
  put_be32(buf, BOOT_MAGIC);
  seed("boot_hello", "truncated", buf, 100);
  memset(buf + 4, 0xff, BOOT_HELLO_BYTES - 4);
  seed("boot_hello", "all_ones", buf, BOOT_HELLO_BYTES);
  seed("boot_hello", "empty", buf, 0);
  /* answers: huge world size, an error status beyond the known ones, an
   * unterminated message, a table shorter than announced */
  memset(buf, 0, sizeof buf);
  buf[0] = 7;
  put_be32(buf + 1, BOOT_MAGIC);
  put_be32(buf + 9, 0xffffffffu);
  seed("boot_reply", "huge_size", buf, 1 + BOOT_REPLY_BYTES);
  put_be32(buf + 5, 0x80000000u);
  memset(buf + 1 + 20, 'x', BOOT_MSG_BYTES);
  seed("boot_reply", "unterminated_msg", buf, 1 + BOOT_REPLY_BYTES);
  put_be32(buf + 5, 0);
  put_be32(buf + 9, 8);
  seed("boot_reply", "short_table", buf, 1 + BOOT_REPLY_BYTES + BOOT_INFO_BYTES + 3);
  /* tcp: garbage, a truncated handshake, a frame claiming 4 GiB, an
   * unknown frame type, a failure notice longer than allowed */
  memcpy(buf, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 30);
  seed("tcp_handshake", "http", buf, 30);
  seed("tcp_frame", "http", buf, 30);
  uint8_t stream[64] = {1, 16};
  memcpy(stream + 2, buf, 30);
  seed("tcp_stream", "http", stream, 32);
  memset(buf, 0, 64);
  put_be32(buf, TCP_HANDSHAKE_MAGIC);
  seed("tcp_handshake", "truncated", buf, 20);
  put_be32(buf, TCP_FRAME_MAGIC | TCP_FRAME_DATA);
  put_be32(buf + 8, 0xffffffffu);
  seed("tcp_frame", "len_4g", buf, HDR);
  memcpy(stream + 2, buf, HDR);
  seed("tcp_stream", "len_4g", stream, 2 + HDR);
  put_be32(buf, TCP_FRAME_MAGIC | 0x7777u);
  seed("tcp_frame", "unknown_type", buf, HDR);
  put_be32(buf, TCP_FRAME_MAGIC | TCP_FRAME_ABORT);
  memcpy(stream + 2, buf, HDR);
  seed("tcp_stream", "abort_len_4g_cut", stream, 2 + HDR);
  stream[0] = 0, stream[1] = 0;
  memset(stream + 2 + 8, 0, 8);
  seed("tcp_stream", "zero_frame_cut", stream, 2 + HDR + 3);
  /* addresses */
  static const char *hostports[] = {"127.0.0.1:29500",
                                    "[::1]:80",
                                    "node-7.cluster:65535",
                                    "host:65536",
                                    "[fe80::1%eth0]:1",
                                    "::1:80",
                                    "[::1]80",
                                    ":1",
                                    "host:",
                                    "host:+1",
                                    "[]:1",
                                    "h:0x10"};
  for (size_t i = 0; i < sizeof hostports / sizeof *hostports; i++) {
    char name[16];
    snprintf(name, sizeof name, "case%02zu", i);
    seed("hostport", name, hostports[i], strlen(hostports[i]));
  }
  uint8_t entries[2 + 8] = {0x02, 0x00, 1, 200, 4, 0, 0, 0, 0, 0}; /* entry overruns addr_len */
  seed("transport_addr", "overrun", entries, sizeof entries);
  uint8_t packed[2 + 2 + NET_ADDR_PACKED] = {0, 2 + NET_ADDR_PACKED, 1, NET_ADDR_PACKED, 6};
  seed("transport_addr", "tcp_v6_zero", packed, sizeof packed);
  memset(buf, 0xff, 200);
  seed("shm_addr", "ones", buf, 104);
  seed("shm_segment", "ones", buf, 200);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  out_dir = argv[1];
  mkdir(out_dir, 0755);
  weft_place_here(NULL, &place);
  rendezvous_seeds();
  tcp_seeds();
  fuzz_seeds_shm(&place, seed);
  edge_seeds();
  printf("fuzz_seeds: wrote the corpus under %s\n", out_dir);
  return 0;
}
