/* fuzz_tcp_handshake.c - the TCP transport's reading of a dialer's first
 * bytes (transports/tcp/tcp_wire.c: tcp_handshake_parse, the MAC check and
 * tcp_handshake_check), as any client reaching a rank's data port sends them. */
#include <stdint.h>
#include <string.h>

#include "src/base/auth.h"
#include "transports/tcp/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static weft_auth_key key; /* the fuzz corpus's job key: 32 zero bytes */
  tcp_handshake_info hs;
  if (tcp_handshake_parse(data, size, &hs) != WEFT_OK) return 0;
  static const uint8_t no_challenge[WEFT_AUTH_CHALLENGE_BYTES];
  bool proven = weft_auth_verify(&key, "weft tcp hello", no_challenge, hs.signed_part,
                                 sizeof(tcp_handshake), hs.mac);
  const char *why = tcp_handshake_check(&hs, 1, 0x1122334455667788ull);
  /* a rank accepts only a lower rank dialing it, except for a failure
   * notice or a liveness probe, which any other rank may send */
  bool any_rank = hs.channel == TCP_NOTICE_CHANNEL || hs.channel == TCP_PROBE_CHANNEL;
  if (!why && !any_rank && (hs.from >= 1 || hs.to != 1)) __builtin_trap();
  if (!why && any_rank && (hs.from == 1 || hs.to != 1)) __builtin_trap();
  (void)proven;
  return 0;
}
