/* weft.h - the one public header of weft: collectives (allreduce, broadcast,
 * reduce, allgather, reduce-scatter, gather, scatter, alltoall, barrier) that
 * keep model parameters and gradients in sync across processes and machines,
 * without NCCL.
 *
 * Conventions, for every function below:
 *  - Every function returns a weft_status: 0 (WEFT_OK) or a negative error.
 *    weft_strerror() gives one sentence per code; weft_last_error() gives the
 *    detailed message of the last failure on a communicator (which rank, which
 *    call, which peer, what was wrong).
 *  - Every blocking call is bounded: it fails with WEFT_ERR_TIMEOUT once no
 *    peer has made progress for the communicator's timeout (config field or
 *    WEFT_TIMEOUT, seconds). A dead peer is WEFT_ERR_PEER_LOST on every rank.
 *  - Threads: a communicator is used by one thread at a time. The exceptions
 *    are weft_comm_abort() (any thread, any time) and the queries
 *    (rank/size/last_error), which only read. Different communicators are
 *    independent and may be driven by different threads concurrently.
 *  - Collectives on one communicator must be called by every rank in the same
 *    order with matching arguments (count, dtype, op, root). A count that
 *    differs between ranks is detected and reported as WEFT_ERR_MISMATCH.
 *  - Buffers are passed as pointers plus a count of elements. Buffers may live
 *    in host memory now; GPU memory comes in a later release (the same calls).
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define WEFT_API
#elif defined(__GNUC__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0
#define WEFT_VERSION \
  (WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 + WEFT_VERSION_PATCH)

/* Status codes: X(NAME, value, message). One list generates the enum, the
 * names and the messages, so a code can never lack its sentence. */
#define WEFT_STATUS_MAP(X)                                                              \
  X(OK, 0, "success")                                                                   \
  X(ERR_INVALID, -1, "invalid argument")                                                \
  X(ERR_NOMEM, -2, "out of memory")                                                     \
  X(ERR_TIMEOUT, -3, "timed out: no progress from a peer within the timeout")           \
  X(ERR_PEER_LOST, -4, "a peer died, closed its connection or failed")                  \
  X(ERR_SYSTEM, -5, "a system call failed")                                             \
  X(ERR_BOOTSTRAP, -6, "the rendezvous of the ranks failed")                            \
  X(ERR_MISMATCH, -7, "ranks called a collective with different arguments")             \
  X(ERR_ABORTED, -8, "the communicator was aborted")                                    \
  X(ERR_UNSUPPORTED, -9, "not supported by this build or this machine")                 \
  X(ERR_PROTOCOL, -10, "a peer sent a malformed or unexpected message")                 \
  X(ERR_INTERNAL, -11, "internal error in weft (please report it)")

typedef enum weft_status {
#define WEFT_STATUS_ENUM_(name, value, msg) WEFT_##name = value,
  WEFT_STATUS_MAP(WEFT_STATUS_ENUM_)
#undef WEFT_STATUS_ENUM_
} weft_status;

/* Element types. f16 is IEEE binary16, bf16 is bfloat16; both are reduced
 * through float and rounded to nearest even once per reduction step. */
typedef enum weft_dtype {
  WEFT_F32 = 0,
  WEFT_F64 = 1,
  WEFT_F16 = 2,
  WEFT_BF16 = 3,
  WEFT_I8 = 4,
  WEFT_U8 = 5,
  WEFT_I32 = 6,
  WEFT_I64 = 7,
  WEFT_DTYPE_COUNT
} weft_dtype;

/* Reduction operations. Integer sum and prod wrap (two's complement), as in
 * NCCL and MPI. avg is the sum divided by the number of ranks; for integer
 * types the division truncates toward zero. */
typedef enum weft_op {
  WEFT_SUM = 0,
  WEFT_PROD = 1,
  WEFT_MIN = 2,
  WEFT_MAX = 3,
  WEFT_AVG = 4,
  WEFT_OP_COUNT
} weft_op;

typedef struct weft_comm weft_comm; /* opaque */

/* ---- status and errors -------------------------------------------------- */

/* One sentence for a status code; never NULL (unknown codes get a sentence too). */
WEFT_API const char *weft_strerror(weft_status status);
/* The code's name, e.g. "WEFT_ERR_TIMEOUT". Never NULL. */
WEFT_API const char *weft_status_name(weft_status status);
/* The detailed message of the last failed call on `comm` ("" if none). With
 * comm == NULL: the last failure of this thread's weft_comm_init_* call. The
 * string stays valid until the next failing call on the same communicator. */
WEFT_API const char *weft_last_error(const weft_comm *comm);

/* ---- element helpers ---------------------------------------------------- */

/* Bytes per element, 0 for an unknown dtype. */
WEFT_API size_t weft_dtype_size(weft_dtype dtype);
/* "f32", "bf16", ...; "unknown" for out-of-range values. */
WEFT_API const char *weft_dtype_name(weft_dtype dtype);
/* "sum", "avg", ...; "unknown" for out-of-range values. */
WEFT_API const char *weft_op_name(weft_op op);

/* ---- creating a communicator -------------------------------------------- */

#define WEFT_CONFIG_VERSION 1

/* Explicit configuration. Call weft_config_init() first, then set fields. */
typedef struct weft_config {
  uint32_t version;       /* WEFT_CONFIG_VERSION, set by weft_config_init */
  int rank;               /* 0 .. size-1 */
  int size;               /* number of ranks, >= 1 */
  int local_rank;         /* rank among the ranks of this host; -1 = unknown */
  const char *rendezvous; /* "host:port", "[v6addr]:port"; rank 0 listens there */
  double timeout_s;       /* <= 0: the WEFT_TIMEOUT setting */
} weft_config;

/* Fills `cfg` with defaults (rank -1, size 0, no rendezvous, timeout 0). */
WEFT_API void weft_config_init(weft_config *cfg);

/* Creates a communicator from the environment, accepting (first found wins):
 *   weft:    WEFT_RANK, WEFT_SIZE, WEFT_LOCAL_RANK, WEFT_RENDEZVOUS=host:port
 *   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
 *   mpirun (Open MPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
 *   srun (Slurm): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 * The rendezvous address comes from WEFT_RENDEZVOUS, else MASTER_ADDR and
 * MASTER_PORT (a single rank needs none). Blocks until every rank arrived,
 * bounded by the timeout. Collective over all ranks. */
WEFT_API weft_status weft_comm_init_env(weft_comm **comm);

/* Same, from an explicit configuration. Collective over all ranks. */
WEFT_API weft_status weft_comm_init_config(const weft_config *cfg, weft_comm **comm);

/* NCCL-style path for frameworks that distribute an id themselves: one process
 * calls weft_get_unique_id() (it starts a rendezvous server in a background
 * thread of that process, which ends once the ranks met or the timeout
 * passed), sends the id to every rank, and each rank calls
 * weft_comm_init_rank(). The id is plain bytes, safe to copy. */
typedef struct weft_unique_id {
  char bytes[128];
} weft_unique_id;
WEFT_API weft_status weft_get_unique_id(weft_unique_id *id);
WEFT_API weft_status weft_comm_init_rank(weft_comm **comm, const weft_unique_id *id, int rank,
                                         int size);

/* Queries; safe from any thread. Return -1 for an invalid communicator. */
WEFT_API int weft_comm_rank(const weft_comm *comm);
WEFT_API int weft_comm_size(const weft_comm *comm);
WEFT_API int weft_comm_local_rank(const weft_comm *comm);
/* Number of ranks on this rank's host. */
WEFT_API int weft_comm_local_size(const weft_comm *comm);

/* Which transport carries data between this rank and `peer`, and why it
 * was chosen, e.g. "shm" / "same host vm/3f2a..., shared /dev/shm; 8 slots
 * of 256 KiB each way". For the own rank: "self". The strings live as long
 * as the communicator. WEFT_ERR_INVALID for a bad handle or peer. */
WEFT_API weft_status weft_comm_peer_transport(const weft_comm *comm, int peer,
                                             const char **transport, const char **reason);

/* Releases the communicator. Not collective, does not block on peers. Calling
 * it twice, or on a pointer that is not a live communicator, returns
 * WEFT_ERR_INVALID and touches nothing. */
WEFT_API weft_status weft_comm_destroy(weft_comm *comm);

/* Marks the communicator failed: every call blocked in it (from any thread)
 * returns WEFT_ERR_ABORTED promptly, later calls too, and its peers see the
 * abort as an error instead of waiting for their timeout. Safe from any thread
 * and from a signal-free context only. The communicator must still be
 * destroyed. */
WEFT_API weft_status weft_comm_abort(weft_comm *comm);

/* ---- collectives (blocking, collective over all ranks) ------------------ */

/* recvbuf[i] = op over all ranks of sendbuf[i], for i < count, on every rank;
 * bitwise identical on every rank. sendbuf == recvbuf is in place. The
 * buffers must not overlap otherwise. */
WEFT_API weft_status weft_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_op op);

/* recvbuf = root's sendbuf on every rank. sendbuf is read on root only
 * (may be NULL elsewhere); sendbuf == recvbuf on root is in place. */
WEFT_API weft_status weft_broadcast(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, int root);

/* The root's recvbuf[i] = op over all ranks of sendbuf[i], for i < count
 * (avg divides by the number of ranks). sendbuf is read on every rank;
 * recvbuf is written on root only (may be NULL elsewhere). sendbuf ==
 * recvbuf on root is in place. Not necessarily bitwise equal to what
 * weft_allreduce gives (another order of the same operations). */
WEFT_API weft_status weft_reduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, weft_dtype dtype, weft_op op, int root);

/* Every rank's recvbuf (size*sendcount elements) gets rank r's sendbuf
 * (sendcount elements) as block r, at recvbuf + r*sendcount. In place when
 * sendbuf == recvbuf + rank*sendcount (the own block already sits there); the
 * buffers must not overlap otherwise. */
WEFT_API weft_status weft_allgather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t sendcount, weft_dtype dtype);

/* sendbuf holds size blocks of recvcount elements; rank r's recvbuf gets op
 * over all ranks of block r (avg divides by the number of ranks). In place
 * when recvbuf == sendbuf + rank*recvcount; no other overlap. */
WEFT_API weft_status weft_reduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t recvcount, weft_dtype dtype, weft_op op);

/* The root's recvbuf (size*sendcount elements) gets rank r's sendbuf as
 * block r. sendbuf is read on every rank; recvbuf is written on root only
 * (may be NULL elsewhere). In place on root when sendbuf == recvbuf +
 * root*sendcount; no other overlap. */
WEFT_API weft_status weft_gather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t sendcount, weft_dtype dtype, int root);

/* Rank r's recvbuf (recvcount elements) gets block r of the root's sendbuf
 * (size*recvcount elements). sendbuf is read on root only (may be NULL
 * elsewhere). In place on root when recvbuf == sendbuf + root*recvcount; no
 * other overlap. */
WEFT_API weft_status weft_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t recvcount, weft_dtype dtype, int root);

/* Block j of every rank's sendbuf (size blocks of count elements) goes to
 * rank j and lands there as block i, i being the sender's rank, of its
 * recvbuf (size*count elements). Both buffers are used on every rank. Never
 * in place: with count > 0, sendbuf == recvbuf (or any overlap) is
 * WEFT_ERR_INVALID. */
WEFT_API weft_status weft_alltoall(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, weft_dtype dtype);

/* Returns once every rank has entered the barrier. */
WEFT_API weft_status weft_barrier(weft_comm *comm);

/* ---- point to point ----------------------------------------------------- */

/* Sends `count` elements of `dtype` to rank `peer`, labelled `tag` (>= 0).
 * Messages from one rank to another with the same tag arrive in the order
 * they were sent; messages with different tags may be received in any
 * order (one not yet expected is kept by the receiver until its weft_recv).
 * A weft_recv must name the same peer, tag, count and dtype: a message of
 * another size or dtype is WEFT_ERR_MISMATCH. Point-to-point messages never
 * interfere with collectives on the same communicator. */
WEFT_API weft_status weft_send(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype,
                               int peer, int tag);
WEFT_API weft_status weft_recv(weft_comm *comm, void *buf, size_t count, weft_dtype dtype,
                               int peer, int tag);

/* ---- non-blocking operations -------------------------------------------- */

/* Every collective and send/recv has a non-blocking form, weft_iNAME, that
 * checks its arguments, starts the operation and returns at once with a
 * request in *req (NULL when it returned an error: nothing was started).
 * Data moves while the caller computes: a progress thread of the
 * communicator drives outstanding requests, so no further call is needed
 * for them to advance.
 *
 * Rules:
 *  - The buffers of a request belong to weft until it completes: do not
 *    write them (nor read a receive buffer) before weft_wait / weft_test
 *    report completion.
 *  - Collectives are matched across ranks in issue order, blocking and
 *    non-blocking counted together, as in MPI: every rank issues the same
 *    sequence of collectives on a communicator. They complete in issue
 *    order; requests may be waited for or tested in any order.
 *  - Any number of requests may be outstanding, on one communicator or many.
 *  - A request is completed (and freed) exactly once, by weft_wait,
 *    weft_wait_all, or a weft_test that reports done; the handle is set to
 *    NULL then. A NULL handle is complete with WEFT_OK.
 *  - A failure of the communicator (peer lost, timeout, abort) completes
 *    every outstanding request with that error.
 *  - The thread rule of the communicator holds for issuing; weft_wait and
 *    weft_test on different requests may be called from different threads.
 *  - weft_comm_destroy with requests outstanding completes them with
 *    WEFT_ERR_ABORTED; they must still be waited for (which frees them).
 *  - With WEFT_CHECK=1 every collective first compares (call, count, dtype,
 *    op, root) across ranks and fails on every rank, naming both sides,
 *    when they differ. */
typedef struct weft_request weft_request; /* opaque */

WEFT_API weft_status weft_iallreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, weft_dtype dtype, weft_op op,
                                     weft_request **req);
WEFT_API weft_status weft_ibroadcast(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, weft_dtype dtype, int root, weft_request **req);
WEFT_API weft_status weft_ireduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, weft_dtype dtype, weft_op op, int root,
                                  weft_request **req);
WEFT_API weft_status weft_iallgather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t sendcount, weft_dtype dtype, weft_request **req);
WEFT_API weft_status weft_ireduce_scatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t recvcount, weft_dtype dtype, weft_op op,
                                          weft_request **req);
WEFT_API weft_status weft_igather(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t sendcount, weft_dtype dtype, int root,
                                  weft_request **req);
WEFT_API weft_status weft_iscatter(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t recvcount, weft_dtype dtype, int root,
                                   weft_request **req);
WEFT_API weft_status weft_ialltoall(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_request **req);
WEFT_API weft_status weft_ibarrier(weft_comm *comm, weft_request **req);
WEFT_API weft_status weft_isend(weft_comm *comm, const void *buf, size_t count, weft_dtype dtype,
                                int peer, int tag, weft_request **req);
WEFT_API weft_status weft_irecv(weft_comm *comm, void *buf, size_t count, weft_dtype dtype,
                                int peer, int tag, weft_request **req);

/* Blocks until *req completes, frees it, sets *req = NULL and returns its
 * status. Bounded by the communicator's timeout like a blocking call. */
WEFT_API weft_status weft_wait(weft_request **req);
/* Does not block. *done = 1 when the request completed: then it is freed,
 * *req set to NULL, and its status returned. *done = 0: WEFT_OK, the
 * request is still running. */
WEFT_API weft_status weft_test(weft_request **req, int *done);
/* Waits for all `n` requests (NULL entries allowed) and sets each to NULL.
 * Returns WEFT_OK, or the first error among them in array order; every
 * request is completed and freed either way. */
WEFT_API weft_status weft_wait_all(weft_request **reqs, int n);

/* ---- sub-communicators -------------------------------------------------- */

/* Like MPI_Comm_split: collective over `comm`. Ranks passing the same
 * `color` (>= 0) form a new communicator, ordered by `key` then by rank in
 * `comm`. color == WEFT_UNDEFINED: the rank joins none and gets *newcomm =
 * NULL. The new communicator has its own connections and sequence of
 * collectives: calls on it and on `comm` may interleave freely. It is
 * destroyed with weft_comm_destroy, independently of `comm`. */
#define WEFT_UNDEFINED (-1)
WEFT_API weft_status weft_comm_split(weft_comm *comm, int color, int key, weft_comm **newcomm);

/* ---- settings ----------------------------------------------------------- */

/* Every WEFT_* environment setting is declared once, with its help text.
 * weft_setting_describe(i, ...) for i = 0, 1, ... lists them (weft-info does);
 * it returns WEFT_ERR_INVALID past the last one. */
typedef struct weft_setting_desc {
  const char *name;    /* "WEFT_TIMEOUT" */
  const char *deflt;   /* default value as text */
  const char *value;   /* current value as text (the environment's, or the default) */
  const char *help;    /* one line */
} weft_setting_desc;
WEFT_API weft_status weft_setting_describe(int index, weft_setting_desc *desc);

/* The library's version as "major.minor.patch". */
WEFT_API const char *weft_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
