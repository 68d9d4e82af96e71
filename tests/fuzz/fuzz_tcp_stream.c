/* fuzz_tcp_stream.c - the TCP transport's whole receive path on a byte stream
 * from a peer: frame headers split anywhere, payloads, failure notices,
 * garbage and an early end, read through recv_peek/recv_release and
 * recv_into as the core calls them. Input: 2 bytes choosing the expected
 * chunk sizes, then what the peer sent (a socketpair carries it). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "src/base/auth.h"
#include "src/base/net.h"
#include "src/base/status.h"
#include "transports/tcp/tcp.h"

#define CHUNK 4096

static weft_error_sink sink;
static weft_auth_key key;
static weft_transport_init_args args;
static weft_tp_ctx *tctx;
static tcp_ctx *ctx;

static int setup(void) {
  args = (weft_transport_init_args){.rank = 1,
                                    .size = 2,
                                    .comm_id = 1,
                                    .chunk_bytes = CHUNK,
                                    .timeout_s = 1,
                                    .wake_fd = -1,
                                    .errors = &sink,
                                    .auth = &key,
                                    .local_size = 1};
  struct sockaddr_in *lo = (struct sockaddr_in *)&args.local_addr;
  lo->sin_family = AF_INET;
  lo->sin_addr.s_addr = htonl(0x7f000001);
  args.local_addr_len = sizeof *lo;
  uint8_t blob[WEFT_TRANSPORT_ADDR_MAX];
  size_t blob_len;
  if (weft_transport_tcp.init(&args, &tctx, blob, &blob_len) != WEFT_OK) return 0;
  ctx = tcp_ctx_of(tctx);
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ctx && !setup()) __builtin_trap();
  if (size < 2 || size > 60000) return 0; /* fits a socket buffer: written at once */
  size_t want = data[0] % 2 ? (size_t)data[1] * 16 % (CHUNK + 1) : (size_t)data[1];
  bool into = data[0] & 2;
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sp)) return 0;
  int sndbuf = 1 << 20;
  setsockopt(sp[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  if (write(sp[1], data + 2, size - 2) != (ssize_t)(size - 2)) {
    close(sp[0]);
    close(sp[1]);
    return 0;
  }
  close(sp[1]); /* then the peer is gone */
  tcp_conn *c;
  if (tcp_conn_create(ctx, 0, 0, &c)) __builtin_trap();
  c->streams[0].fd = sp[0];
  c->state = TCP_CONN_UP;
  ctx->awaiting_accept--;
  char *dst = malloc(CHUNK);
  weft_status st = WEFT_OK;
  for (uint32_t seq = 0; st == WEFT_OK; seq++) { /* each frame takes >= 16 bytes: ends */
    const void *got;
    st = into ? tcp_recv_into((weft_tp_conn *)c, seq, want, dst, NULL)
              : tcp_recv_peek((weft_tp_conn *)c, seq, want, &got);
    if (st == WEFT_OK && !into) st = tcp_recv_release((weft_tp_conn *)c);
  }
  /* the stream ended: every path ends in an error naming why, never OK forever */
  if (st == WEFT_OK || st == WEFT_AGAIN) __builtin_trap();
  if (c->state != TCP_CONN_DEAD || strnlen(sink.msg, sizeof sink.msg) == sizeof sink.msg)
    __builtin_trap();
  /* a dead connection keeps failing, never crashes */
  const void *got;
  if (tcp_recv_peek((weft_tp_conn *)c, 0, want, &got) == WEFT_OK) __builtin_trap();
  free(dst);
  tcp_conn_destroy(c);
  return 0;
}
