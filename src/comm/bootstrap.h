/* bootstrap.h - the rendezvous: every rank dials one server (on rank 0's
 * address, or in the process that made a unique id), sends what peers need to
 * reach it, and gets everybody's back. The server validates the job (one
 * world size, every rank once, the same job nonce and launcher job identity)
 * and answers every rank with the table or with one sentence saying what
 * went wrong; a rank of another job is refused and never becomes a member. */
#ifndef WEFT_BOOTSTRAP_H
#define WEFT_BOOTSTRAP_H

#include <stdint.h>
#include <sys/socket.h>

#include "transports/transport.h"
#include "weft.h"

#define BOOT_NONCE_BYTES 16
#define BOOT_HOST_BYTES 64
/* The launcher's job identity (weft_env_job_id), "" when there is none. */
#define BOOT_JOB_BYTES 96
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

/* ---- wire parsers ----------------------------------------------------------
 * Pure functions over bytes a peer sent, so they can be fuzzed on their own
 * (tests/fuzz/). Each checks the length first and never reads past `len`;
 * strings come out NUL-terminated and addr_len at most BOOT_ADDR_BYTES. */

#define BOOT_MAGIC 0x57454642u /* "WEFB" */
#define BOOT_VERSION 5         /* 5: the hello carries the job identity */
#define BOOT_MSG_BYTES 256
#define BOOT_INFO_BYTES (4 + 4 + BOOT_HOST_BYTES + 2 + BOOT_ADDR_BYTES)
#define BOOT_HELLO_BYTES \
  (4 + 2 + 2 + 4 + 4 + 4 + BOOT_NONCE_BYTES + BOOT_JOB_BYTES + BOOT_INFO_BYTES)
#define BOOT_REPLY_BYTES (4 + 4 + 4 + 8 + BOOT_MSG_BYTES)

/* A rank's hello, as the rendezvous server reads it (after checking its MAC). */
typedef struct boot_hello {
  uint16_t version;
  uint32_t rank, size, timeout_ms;
  uint8_t nonce[BOOT_NONCE_BYTES];
  char job[BOOT_JOB_BYTES]; /* NUL-terminated; "" when the rank's launcher gave none */
  boot_rank_info info;
} boot_hello;

/* The fixed part of the server's answer; a table of `size` infos follows it
 * when status is WEFT_OK. */
typedef struct boot_reply {
  int32_t status;
  uint32_t size;
  uint64_t comm_id;
  char msg[BOOT_MSG_BYTES];
} boot_reply;

/* WEFT_ERR_PROTOCOL when shorter than BOOT_HELLO_BYTES or not a weft hello (magic). */
weft_status boot_hello_parse(const uint8_t *buf, size_t len, boot_hello *out);
/* WEFT_ERR_PROTOCOL when shorter than BOOT_REPLY_BYTES or not a weft answer (magic). */
weft_status boot_reply_parse(const uint8_t *buf, size_t len, boot_reply *out);
/* The table after an answer: `size` infos, indexed by rank.
 * WEFT_ERR_PROTOCOL when `len` cannot hold them or size is negative. */
weft_status boot_table_parse(const uint8_t *buf, size_t len, int size, boot_rank_info *all);
/* The server's greeting: WEFT_AUTH_CHALLENGE_MAGIC then the challenge.
 * WEFT_ERR_PROTOCOL when short or another magic. */
weft_status boot_challenge_parse(const uint8_t *buf, size_t len, const uint8_t **challenge);

/* One rendezvous server: a thread that serves one job. */
typedef struct boot_server boot_server;

/* Starts the server's thread listening on `addr`; it serves one job. `size`
 * 0 means "learn it from the first rank"; `job` is the job identity every
 * rank must present (rank 0's own), NULL to learn it from the first rank
 * (a unique id's server, which is no rank). A rank of another job is
 * refused and the job goes on; a second claimant of a rank fails the job.
 * *bound gets the real address. The caller owns *out and must end it with
 * boot_server_finish (a server of weft_get_unique_id may instead be adopted
 * by a rank of this process, see boot_server_adopt; one nobody adopts is
 * stopped and joined at exit). */
weft_status boot_server_start(const struct sockaddr_storage *addr, socklen_t len,
                              const uint8_t nonce[BOOT_NONCE_BYTES], int size, const char *job,
                              double timeout_s, struct sockaddr_storage *bound,
                              socklen_t *bound_len, boot_server **out, weft_error_sink *err);

/* Hands a server over to the registry of this process (a unique id's: its
 * maker need not be a rank). */
void boot_server_register(boot_server *s);

/* The registered server of this process for `nonce`, now owned by the
 * caller (who must finish it), or NULL when it runs elsewhere. */
boot_server *boot_server_adopt(const uint8_t nonce[BOOT_NONCE_BYTES]);

/* Ends the owner's part: waits for the thread and frees the server, so no
 * thread or fd outlives the call. `why` NULL: the owner's rank is through
 * the rendezvous (or failed there), and the server ends once every rank had
 * its answer, or at its deadline. `why` set: the owner (rank `owner_rank`)
 * failed before it could take part; the server fails the job with that
 * sentence and ends once every other rank was told, or at its deadline.
 * NULL s is a no-op. */
void boot_server_finish(boot_server *s, int owner_rank, const char *why);

/* Client, step 1: dial the server (retrying until the deadline) and learn
 * which local address reached it. */
weft_status boot_connect(const struct sockaddr_storage *server, socklen_t len, double deadline,
                         int *fd, struct sockaddr_storage *local, socklen_t *local_len,
                         weft_error_sink *err);
/* Client, step 2: send `mine` and the job identity `job` (weft_env_job_id,
 * "" for none), receive the job's comm id and all `size` ranks' infos
 * (indexed by rank). Closes fd. Warns once per process when neither a job
 * identity nor a secret keeps other jobs out. */
weft_status boot_exchange(int fd, const uint8_t nonce[BOOT_NONCE_BYTES], const char *job, int rank,
                          int size, const boot_rank_info *mine, double deadline, uint64_t *comm_id,
                          boot_rank_info *all, weft_error_sink *err);

/* The job identity of this process's launcher (env.c), the same on every
 * rank of one job and different between jobs: WEFT_JOB_ID (weftrun sets
 * it), else torchrun's TORCHELASTIC_RUN_ID, Open MPI's
 * OMPI_MCA_ess_base_jobid or PMIx's PMIX_NAMESPACE, Slurm's
 * SLURM_JOB_ID.SLURM_STEP_ID; "" when none is set. */
void weft_env_job_id(char *out, size_t len);

#endif
