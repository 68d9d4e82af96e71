/* fuzz_hostport.c - "host:port" / "[v6]:port" parsing (net_split_hostport),
 * used for WEFT_RENDEZVOUS and weftrun's addresses. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  char host[64];
  int port = -1;
  weft_error_sink err;
  if (net_split_hostport(text, host, sizeof host, &port, &err) == WEFT_OK) {
    if (port < 0 || port > 65535 || !host[0] || strnlen(host, sizeof host) == sizeof host)
      __builtin_trap();
    /* a bare host has no colon: v6 needs brackets */
    if (text[0] != '[' && strchr(host, ':')) __builtin_trap();
  } else if (strnlen(err.msg, sizeof err.msg) == sizeof err.msg) {
    __builtin_trap();
  }
  free(text);
  return 0;
}
