/* fuzz_seeds_shm.c - the shm part of fuzz_seeds: a real context's published
 * address and the header of a segment it made. (Apart from fuzz_seeds.c
 * because each transport's header defines its own types.) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "src/base/auth.h"
#include "src/topo/select.h"
#include "transports/shm/shm.h"

void fuzz_seeds_shm(const weft_place *place,
                    void (*seed)(const char *, const char *, const void *, size_t)) {
  static weft_error_sink sink;
  static weft_auth_key zero_key;
  weft_transport_init_args args = {.rank = 0,
                                   .size = 2,
                                   .comm_id = 0xfeedf00d12345678ull,
                                   .chunk_bytes = 4096,
                                   .timeout_s = 5,
                                   .wake_fd = -1,
                                   .errors = &sink,
                                   .place = place,
                                   .auth = &zero_key,
                                   .local_size = 2};
  uint8_t blob[WEFT_TRANSPORT_ADDR_MAX];
  size_t blob_len;
  weft_tp_ctx *ctx;
  if (weft_transport_shm.init(&args, &ctx, blob, &blob_len)) exit(1);
  seed("shm_addr", "self", blob, blob_len);
  weft_tp_conn *c;
  if (weft_transport_shm.connect(ctx, 1, 0, blob, blob_len, &c)) exit(1);
  char name[64];
  snprintf(name, sizeof name, "/weft-%016llx-0-1-0", (unsigned long long)args.comm_id); /* channel 0 */
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) exit(1);
  uint8_t head[1 + sizeof(shm_segment)];
  head[0] = 6; /* 8 slots, as made */
  if (pread(fd, head + 1, sizeof(shm_segment), 0) != (ssize_t)sizeof(shm_segment)) exit(1);
  close(fd);
  seed("shm_segment", "made_8_slots", head, sizeof head);
  weft_transport_shm.fini(ctx); /* unlinks: the peer never mapped it */
}
