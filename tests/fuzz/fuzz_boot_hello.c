/* fuzz_boot_hello.c - the rendezvous server's reading of a rank's hello
 * (src/comm/bootstrap.c, boot_hello_parse), as it arrives from any client that
 * can reach the server's port. */
#include <stdint.h>
#include <string.h>

#include "src/comm/bootstrap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  boot_hello hello;
  if (boot_hello_parse(data, size, &hello) != WEFT_OK) return 0;
  /* what the server goes on to print and copy must be bounded */
  if (strnlen(hello.info.host, sizeof hello.info.host) == sizeof hello.info.host) __builtin_trap();
  if (strnlen(hello.job, sizeof hello.job) == sizeof hello.job) __builtin_trap(); /* job ids it names */
  if (hello.info.addr_len > BOOT_ADDR_BYTES) __builtin_trap();
  return 0;
}
