/* fuzz_transport_addr.c - a peer's published transport addresses as they
 * come out of the rendezvous table: the entry list (transport index,
 * length, bytes; weft_comm_peer_address), then each transport's reading of
 * its entry (tcp: a packed socket address, net_addr_unpack; shm: its
 * address), through can_reach as selection calls it.
 * Input: 2 bytes of addr_len (big-endian, as on the wire), then the bytes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>

#include "src/comm/comm.h"
#include "src/base/net.h"
#include "src/topo/select.h"

static weft_error_sink sink;
static weft_place place;
static weft_auth_key key;
static weft_transport_init_args args;
static weft_tp_ctx *shm_tctx, *tcp_tctx;

static void setup(void) {
  weft_place_here(NULL, &place);
  args = (weft_transport_init_args){.rank = 0,
                                    .size = 2,
                                    .chunk_bytes = 4096,
                                    .timeout_s = 1,
                                    .wake_fd = -1,
                                    .errors = &sink,
                                    .place = &place,
                                    .auth = &key,
                                    .local_size = 2};
  struct sockaddr_in *lo = (struct sockaddr_in *)&args.local_addr;
  lo->sin_family = AF_INET;
  lo->sin_addr.s_addr = htonl(0x7f000001);
  args.local_addr_len = sizeof *lo;
  uint8_t blob[WEFT_TRANSPORT_ADDR_MAX];
  size_t blob_len;
  if (weft_transport_shm.init(&args, &shm_tctx, blob, &blob_len)) __builtin_trap();
  if (weft_transport_tcp.init(&args, &tcp_tctx, blob, &blob_len)) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!shm_tctx) setup();
  if (size < 2) return 0;
  static weft_peer peers[2];
  weft_comm comm = {.core = {.rank = 0, .size = 2}, .peers = peers};
  boot_rank_info *info = &peers[1].info;
  /* as unpack_info leaves it: addr_len clamped to the buffer */
  info->addr_len = (uint16_t)(data[0] << 8 | data[1]);
  if (info->addr_len > BOOT_ADDR_BYTES) info->addr_len = BOOT_ADDR_BYTES;
  memset(info->addr, 0, sizeof info->addr);
  memcpy(info->addr, data + 2, size - 2 < BOOT_ADDR_BYTES ? size - 2 : BOOT_ADDR_BYTES);
  weft_tp_ctx *ctxs[2] = {shm_tctx, tcp_tctx};
  const weft_transport *ops[2] = {&weft_transport_shm, &weft_transport_tcp};
  for (int b = 0; b < 2; b++) {
    const void *addr;
    size_t len;
    weft_comm_peer_address(&comm, 1, b, &addr, &len);
    if (!addr) continue;
    const uint8_t *a = addr;
    if (a < info->addr || a + len > info->addr + info->addr_len) __builtin_trap();
    char why[192];
    ops[b]->can_reach(ctxs[b], 1, addr, len, why, sizeof why);
    if (strnlen(why, sizeof why) == sizeof why) __builtin_trap();
    if (len >= NET_ADDR_PACKED) {
      struct sockaddr_storage ss;
      socklen_t sl;
      if (net_addr_unpack(a, &ss, &sl) && sl > sizeof ss) __builtin_trap();
    }
  }
  return 0;
}
