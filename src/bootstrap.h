/* bootstrap.h - the rendezvous: every rank dials one server (on rank 0's
 * address, or in the process that made a unique id), sends what peers need to
 * reach it, and gets everybody's back. The server validates the job (one
 * world size, every rank once, the same job nonce) and answers every rank
 * with the table or with one sentence saying what went wrong. */
#ifndef WEFT_BOOTSTRAP_H
#define WEFT_BOOTSTRAP_H

#include <stdint.h>
#include <sys/socket.h>

#include "transports/transport.h"
#include "weft.h"

#define BOOT_NONCE_BYTES 16
#define BOOT_HOST_BYTES 64
/* Room for every transport's address: entries of (transport index, length, bytes). */
#define BOOT_ADDR_BYTES 512

/* What one rank tells the others. */
typedef struct boot_rank_info {
  uint32_t rank;
  uint32_t pid;
  char host[BOOT_HOST_BYTES]; /* host identity: ranks with the same one share a host */
  uint16_t addr_len;          /* transport addresses, see BOOT_ADDR_BYTES */
  uint8_t addr[BOOT_ADDR_BYTES];
} boot_rank_info;

/* Starts the server in a detached thread listening on `addr`; it serves one
 * job and ends when every rank has its answer or at the timeout. `size` 0
 * means "learn it from the first rank". *bound gets the real address. */
weft_status boot_server_start(const struct sockaddr_storage *addr, socklen_t len,
                              const uint8_t nonce[BOOT_NONCE_BYTES], int size, double timeout_s,
                              struct sockaddr_storage *bound, socklen_t *bound_len,
                              weft_error_sink *err);

/* Client, step 1: dial the server (retrying until the deadline) and learn
 * which local address reached it. */
weft_status boot_connect(const struct sockaddr_storage *server, socklen_t len, double deadline,
                         int *fd, struct sockaddr_storage *local, socklen_t *local_len,
                         weft_error_sink *err);
/* Client, step 2: send `mine`, receive the job's comm id and all `size`
 * ranks' infos (indexed by rank). Closes fd. */
weft_status boot_exchange(int fd, const uint8_t nonce[BOOT_NONCE_BYTES], int rank, int size,
                          const boot_rank_info *mine, double deadline, uint64_t *comm_id,
                          boot_rank_info *all, weft_error_sink *err);

/* A string naming this host, the same for every process on it:
 * WEFT_HOST_ID if set (later), else hostname plus the kernel's boot id. */
void boot_host_identity(char *out, size_t len);

#endif
