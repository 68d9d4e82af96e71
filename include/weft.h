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
 *    are weft_comm_abort() (any thread, any time), the queries
 *    (rank/size/last_error), which only read, and waiting on or testing a
 *    request from another thread. It is checked: a collective or message
 *    call that finds another thread inside a call on the same communicator
 *    fails with WEFT_ERR_INVALID, and so does the call it met. Different
 *    communicators are independent and may be driven by different threads
 *    concurrently.
 *  - Collectives on one communicator must be called by every rank in the same
 *    order with matching arguments (count, dtype, op, root). It is checked
 *    at no cost: every data message carries its call's number, collective,
 *    dtype, op and root (for a gradient set's bucket, its step) and its
 *    length, and a rank that receives one of another call fails with
 *    WEFT_ERR_MISMATCH naming both calls ("rank 0 called weft_allreduce(f32,
 *    max) as its call #7, this rank weft_allreduce(f32, sum)"); its peers
 *    fail with WEFT_ERR_PEER_LOST quoting it. Every rank fails in that call,
 *    except that a rank that only sent in it (the root of a broadcast or a
 *    scatter, the other ranks of a reduce or a gather) may return WEFT_OK
 *    and fail in its next call on the communicator, weft_comm_destroy
 *    included. WEFT_CHECK=1 also catches what no message shows (a rank
 *    that passes count 0), and fails every rank in the very call. Calls
 *    that differ where no chunk ever crosses (each rank waits for another to
 *    send first; a rank that skipped a call waits in its next one) are found
 *    by the stall probe: a collective that has moved nothing for
 *    WEFT_STALL_PROBE seconds (default 1, 0 = off) asks the peer it waits on
 *    which call it is in, over the control plane (below), off the data path.
 *  - Buffers are passed as pointers plus a count of elements, in host memory
 *    or, for the collectives, in a GPU's memory (weft_comm_set_stream says how
 *    such a call is ordered).
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
  X(ERR_INTERNAL, -11, "internal error in weft (please report it)")                    \
  X(ERR_REVOKED, -12, "the communicator was revoked: recover with weft_comm_shrink")

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
 * types the division truncates toward zero. An i8, u8 or i32 avg sums in 64
 * bits, so it never wraps (three ranks of i8 100 give 100) and costs a
 * 64-bit copy of the buffer for the call (in ordinary memory: it never takes
 * the direct allreduce of weft_mem_alloc buffers); an i64 avg sums in 64 bits
 * and may wrap before the division, like an i64 sum. */
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
/* Same, with cfg's rank, size, local_rank and timeout_s (rendezvous must be
 * NULL: the id carries it), for frameworks that bring their own timeout. */
WEFT_API weft_status weft_comm_init_rank_config(weft_comm **comm, const weft_unique_id *id,
                                                const weft_config *cfg);

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

/* ---- f32 gradients on the wire as bf16 / f16 ------------------------------ */
/* What the f32 data of a sum or avg allreduce, reduce-scatter or reduce
 * travels as between hosts: WEFT_BF16 or WEFT_F16 halves the bytes on the
 * network; WEFT_F32 (the default, or the WEFT_WIRE_DTYPE setting) keeps it
 * exact. Sums are still formed in f32: each hop adds the arriving value to
 * its own in f32 and rounds once to send it on. An allreduce's result is
 * rounded once more at the end and is the same bits on every rank; its
 * error is below about (hops + 1) * 2^-8 (bf16; f16: 2^-11, within f16's
 * range of 65504) of the sum of |x| over ranks, hops <= size - 1 (docs/
 * tuning.md derives it). It applies to the calls issued after it on this
 * communicator, so setting it around a call makes it per call (a gradient
 * set has its own, weft_grad_options.wire_dtype). Other dtypes and ops, the
 * other collectives and a communicator whose ranks all share one host move
 * exact data, as before. Every rank must set the same value before the same
 * call, like the call's own arguments: otherwise the chunk lengths differ
 * and the call fails with WEFT_ERR_MISMATCH (WEFT_CHECK=1 names the wire
 * dtypes). WEFT_ERR_INVALID for any other dtype or a bad handle. */
WEFT_API weft_status weft_comm_set_wire_dtype(weft_comm *comm, weft_dtype wire);

/* GPU buffers. Every collective takes device pointers (CUDA memory of one
 * GPU per communicator) as well as host pointers; weft asks the driver which
 * a pointer is, so sendbuf and recvbuf must be of one kind (else
 * WEFT_ERR_INVALID), and every rank of a call should pass the same kind:
 * within one host a call on device buffers runs through CUDA IPC, and a rank
 * passing host memory there fails every rank with WEFT_ERR_MISMATCH naming
 * the kinds. A call on device buffers is ordered on a CUDA stream,
 * as NCCL's are: it starts after the work queued on that stream when it is
 * issued, and work queued on the stream later waits for its result, without
 * the host thread synchronizing the stream. Blocking calls return when the
 * result is in recvbuf; a request of a weft_iNAME call completes then. A
 * weft_iNAME call queues that wait on the stream when it is issued (a
 * cuStreamWaitValue32 on a word weft writes once the result is in place),
 * so a copy of the result queued on the stream, and the stream synchronized,
 * read the result even before weft_wait; the communicator's progress thread
 * moves the call meanwhile. The stream is held until then: queue the work
 * that should overlap the call on another stream (weft.torch uses a side
 * stream per call, as PyTorch's NCCL backend does). A call that fails, and
 * weft_comm_destroy, let the stream go on (the buffer's contents are then
 * undefined). A call's own GPU work never waits for work queued on the
 * stream after it was issued, so later calls' user work cannot delay it.
 * weft_comm_set_stream names the stream (a CUstream or cudaStream_t, as
 * void *) for the calls issued after it on this communicator; NULL (the
 * default) is the legacy default stream of the buffers' device's primary
 * context (the runtime API's and PyTorch's context, the one weft works in).
 * A call with a NULL stream issued while the thread's current context is
 * one of the process's own (cuCtxCreate) is WEFT_ERR_INVALID, saying so:
 * that context's NULL stream is another stream, which weft cannot order
 * after; a stream of such a context is refused by the driver (a CUDA error
 * naming cuEventRecord). A build without CUDA (weft-info says which)
 * refuses a stream other than NULL with WEFT_ERR_UNSUPPORTED.
 * Point-to-point messages take device buffers too: a send reads its
 * buffer, and a receive writes its buffer, after the work queued on the
 * stream when the call is issued; unlike the collectives, the stream is not
 * made to wait for them: weft_send and weft_recv return, and weft_wait of
 * weft_isend / weft_irecv returns, once the message is done (the receive's
 * buffer holds the data), and work queued after that sees it. Within a
 * host (shm) a message of 16 chunks or more (4 MiB by default) is lent to
 * the receiver over CUDA IPC, which copies out of the sender's buffer: its
 * send completes only once the receive is posted and done, as NCCL's do
 * (post receives first, or use the non-blocking forms); other messages are
 * staged through pinned host memory. Gradient sets take device tensors
 * (below). */
WEFT_API weft_status weft_comm_set_stream(weft_comm *comm, void *cuda_stream);

/* Buffers the caller keeps. Within a host a call on device buffers lends
 * them to the peers for that call only: a peer maps one (CUDA IPC) and
 * closes it again before the call ends on its owner, because CUDA leaves
 * freeing memory that another process has open undefined. A buffer
 * registered here stays mapped by the peers from one call to the next,
 * which saves an IPC open and close per call and peer (tens to hundreds of
 * microseconds on a GPU); in exchange the caller must not free it, nor let
 * an allocator give it back to the driver (torch.cuda.empty_cache), until
 * weft_comm_deregister returns. Like NCCL's ncclCommRegister. Host memory
 * needs neither (accepted; peers map only weft_mem_alloc memory, which a
 * mapping keeps alive). weft_comm_register is local and cheap; a range
 * inside a registered one counts as registered; WEFT_ERR_INVALID for a NULL
 * buf or 0 bytes. weft_comm_deregister is collective, counted among the
 * collectives: every rank calls it the same number of times (buf: one it
 * registered on this communicator, NULL where it has none to give back);
 * it waits for this rank's earlier calls and returns once no peer maps buf
 * any more (every rank closes its mappings of its peers' device memory, so
 * other registered buffers are opened again at their next use).
 * WEFT_ERR_INVALID, nothing done, for a buf not registered on comm; a
 * communicator's registrations end with it. */
WEFT_API weft_status weft_comm_register(weft_comm *comm, const void *buf, size_t bytes);
WEFT_API weft_status weft_comm_deregister(weft_comm *comm, const void *buf);

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

/* ---- surviving a lost rank ------------------------------------------------
 * A rank that dies fails every rank's calls on the communicator (the dead
 * one is named); the survivors need not end the job. They call
 * weft_comm_shrink and go on with a communicator of the survivors. These
 * calls run over a control plane of their own (a listener per
 * communicator, opened at creation), never over the data transports, and
 * need no rendezvous through rank 0, which may be the rank that died. A
 * peer counts as lost when its process ended (its listener refuses, its
 * connections end, or, on this host, its pid is gone), or when its host
 * does not answer for WEFT_SUSPECT seconds; a live rank that is late is
 * waited for, up to the communicator's timeout. docs/faults.md has the
 * protocol and the recovery times measured. */

/* Every rank's pending and later calls on `comm` fail with
 * WEFT_ERR_REVOKED, promptly (the peers are told as a failure is), except
 * weft_comm_agree, weft_comm_shrink and weft_comm_destroy. For a rank that
 * decides on its own that the communicator must go (an error of its own,
 * a peer it wants out). Not collective; safe from any thread. */
WEFT_API weft_status weft_comm_revoke(weft_comm *comm);

/* A fault-tolerant agreement among the live ranks of `comm` (collective
 * over them; works on a failed or revoked communicator too): *flags
 * becomes the bitwise or of every survivor's *flags, and failed[0..
 * *nfailed) the ranks that are lost, ascending (failed has room for
 * weft_comm_size entries; NULL to skip). Every rank that returns WEFT_OK
 * returns the same, even when ranks die during it, the coordinating one
 * among them (MPI ULFM's MPI_Comm_agree). A rank that the others counted
 * as lost (a cut link) gets WEFT_ERR_REVOKED; past the timeout,
 * WEFT_ERR_TIMEOUT naming the rank waited for. It does not change the
 * communicator; the agreements on one communicator are numbered, so every
 * survivor must make the same ones, as with collectives. */
WEFT_API weft_status weft_comm_agree(weft_comm *comm, uint32_t *flags, int *failed,
                                     int *nfailed);

/* A new communicator of the ranks of `comm` that are alive, numbered
 * densely in their old order (rank 3 of 4, after rank 1 died, is rank 2 of
 * 3). Collective over the survivors; `comm` is revoked first if it is not
 * failed already (its pending calls end), and stays to be destroyed. It
 * agrees on the lost ranks (weft_comm_agree), then the survivors start new
 * transports and agree on their addresses; a rank lost meanwhile makes it
 * agree again, so it returns a communicator of ranks alive at that moment.
 * Errors as weft_comm_agree. */
WEFT_API weft_status weft_comm_shrink(weft_comm *comm, weft_comm **newcomm);

/* Growing: a process that starts later (a replacement, or one more) joins
 * an existing communicator. A member writes an id (weft_comm_grow_id:
 * local, no communication; it names the control planes of the lowest ranks
 * and the communicator, and carries the job key unless WEFT_AUTH_TOKEN
 * holds it, which the new process must then have too) and hands it to the
 * new process, which calls weft_comm_join: it asks in at the first member
 * that answers and blocks until it is admitted. The members call
 * weft_comm_grow (collective over them), which waits until `nnew` processes
 * asked in (up to the timeout), admits them together by agreement, and
 * makes the new communicator: the members keep their ranks, the newcomers
 * follow in the order the agreement lists them. `comm` stays usable and is
 * not changed. A member lost in the meantime fails it on every member with
 * WEFT_ERR_PEER_LOST (shrink first); a newcomer lost in the meantime fails
 * it too, and the newcomers that were admitted get WEFT_ERR_PEER_LOST. */
WEFT_API weft_status weft_comm_grow_id(const weft_comm *comm, weft_unique_id *id);
WEFT_API weft_status weft_comm_grow(weft_comm *comm, int nnew, weft_comm **newcomm);
WEFT_API weft_status weft_comm_join(const weft_unique_id *id, weft_comm **newcomm);

/* ---- collectives (blocking, collective over all ranks) ------------------ */

/* Count 0 (of any call): no data moves. Every rank must still make the call
 * (it counts in the order of collectives), and every rank must pass 0.
 * Without WEFT_CHECK a count-0 call returns at once without a word to the
 * peers, so a rank that passes 0 where the others pass 10 gets WEFT_OK; a
 * rank that waits for its data fails in that call, the others (a broadcast's
 * root, say) and the rank itself in their next call, with WEFT_ERR_MISMATCH
 * naming the calls (or the peers' notice of it). With WEFT_CHECK=1 a
 * count-0 call compares its fingerprint like any other, and every rank fails
 * in it, naming both counts. */

/* recvbuf[i] = op over all ranks of sendbuf[i], for i < count, on every rank;
 * bitwise identical on every rank. sendbuf == recvbuf is in place. The
 * buffers must not overlap otherwise. */
WEFT_API weft_status weft_allreduce(weft_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, weft_dtype dtype, weft_op op);

/* recvbuf = root's sendbuf on every rank. sendbuf is read on root only
 * (may be NULL elsewhere); sendbuf == recvbuf on root is in place.
 * Every rank must pass the same count, dtype and root. The plain tree
 * carries no extra message: a rank whose count, dtype or root differs from
 * what reaches it fails in that call with WEFT_ERR_MISMATCH naming both
 * sides; the root, and the ranks that agree with it, fail in their next
 * call on this communicator (weft_comm_destroy included, which then
 * returns the error), quoting it. No rank's data is wrong: the root's is
 * the source, and the agreeing ranks received it. Roots that differ so
 * that no rank sends first are found by the stall probe, once the call has
 * moved nothing for WEFT_STALL_PROBE seconds (1; with it 0, at the
 * timeout): the ranks compare the calls they wait in over the control
 * plane (WEFT_ERR_MISMATCH naming both). WEFT_CHECK=1
 * confirms every rank's count, dtype and root over the edges of a hypercube
 * beside the data, so that every rank fails in that very call. */
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

/* ---- shared buffers ------------------------------------------------------ */
/* Host memory that other ranks of this host can map (a memfd). When every
 * rank's buffers of a large allreduce lie in such memory, each rank reads
 * its slice straight from every peer's input and writes the sum straight
 * into every peer's output: one pass over the data instead of a ring of
 * copies through shared-memory slots (see README, "shared buffers"). Any
 * other buffer still works, through the ring. Zero-filled, page-aligned;
 * usable by every communicator of the process. WEFT_ERR_INVALID for 0 bytes,
 * WEFT_ERR_NOMEM / WEFT_ERR_SYSTEM when the kernel refuses. */
WEFT_API weft_status weft_mem_alloc(size_t bytes, void **ptr);
/* Releases memory from weft_mem_alloc (NULL is a no-op). Not while a call
 * that uses it is outstanding; peers' mappings of it end with their
 * communicators. WEFT_ERR_INVALID for a pointer weft_mem_alloc did not give. */
WEFT_API weft_status weft_mem_free(void *ptr);

/* ---- gradient buckets, parameters and metrics --------------------------- */

/* What an optimizer needs around a data-parallel step: gradients packed into
 * buckets and reduced while the backward pass still runs (the DDP reducer,
 * Horovod's tensor fusion, MegEngine's AllreduceCallback), parameters
 * broadcast at start and every N steps, buffers and metrics synchronised.
 *
 * A step, as a framework drives it:
 *   weft_grad_options o; weft_grad_options_init(&o);       (25 MiB buckets, mean)
 *   weft_grad_create(comm, &o, &g);
 *   for each parameter p, in declaration order: weft_grad_register(g, &grad_p, &id_p);
 *   weft_grad_finalize(g);                 (collective: checks every rank agrees)
 *   each step: backward calls weft_grad_ready(g, id) as each gradient is final;
 *              weft_grad_wait(g) before the optimizer step: gradients reduced in place.
 *
 * Rules:
 *  - A set holds tensors of one memory kind (else WEFT_ERR_INVALID). Its
 *    parameters (weft_grad_set_params), and the lists of weft_params_broadcast
 *    and weft_buffers_sync, take host or device tensors: device ones move
 *    one call each, ordered on the communicator's stream, and are in place
 *    when the call returns.
 *  - Device sets (WEFT_MEMORY_DEVICE tensors) are stream-ordered, as NCCL's
 *    calls are. The set's stream is the communicator's (weft_comm_set_stream)
 *    unless weft_grad_set_stream names one. weft_grad_ready(g, i) means:
 *    gradient i is final once the work queued on the set's stream so far
 *    completes, so it may be called as soon as the kernel that makes the
 *    gradient is queued, never after it ran; the framework queues its writes
 *    to gradients on that stream (or orders them before it). When a bucket
 *    is complete, its pack (copy mode: one kernel for the bucket, prediv's
 *    scaling fused in) is queued on the set's stream and its allreduce
 *    starts on the GPU after it, through an event: the host does not wait,
 *    and the set's stream does NOT wait for the allreduce, so the backward
 *    kernels queued after it overlap the transfer. The results reach the
 *    gradients in one of two ways:
 *      weft_grad_wait(g): the host waits, queues the unpacks (one kernel per
 *        bucket, the avg/prediv scaling fused in) on the set's stream and
 *        waits for them too: on return the gradients hold the result and may
 *        be read from any stream or copied to the host;
 *      weft_grad_wait_stream(g, s): the host does not wait. Work queued on s
 *        afterwards runs after every bucket's result is in place (the unpacks
 *        are queued on s), so the optimizer's kernels follow the reduction
 *        on the GPU alone. The step's failure, if any, is returned by a later
 *        call on the set (the next launch of a bucket, weft_grad_wait,
 *        weft_grad_bucket_test, or weft_grad_destroy), naming the bucket and
 *        its step; s still goes on (its gradients are then not reduced).
 *    Gradients marked ready must not be written until the step's wait (host
 *    form) returns; after the stream form, only by work ordered after s.
 *    In a step with synchronisation off (weft_grad_set_sync) both forms
 *    return at once and queue nothing: the gradients are the framework's
 *    own writes, in the order of the stream it queued them on.
 *  - Buckets hold tensors of one dtype and one memory kind. They are filled
 *    in the reverse of registration order (the order backward produces
 *    gradients) unless weft_grad_set_order gives another order; a bucket
 *    takes tensors while they fit in its cap (the first bucket's cap is
 *    first_bucket_cap_bytes, so communication starts early); a tensor larger
 *    than the cap gets a bucket of its own, and so does, without owned
 *    storage, one of inplace_min_bytes or more (it closes the bucket being
 *    filled). Buckets are numbered in the order their first tensor is due.
 *  - Buckets are launched (a non-blocking allreduce each) in bucket index
 *    order on every rank, whatever order weft_grad_ready calls arrive in: a
 *    bucket whose tensors are all ready waits until every earlier bucket has
 *    been launched. So every rank issues the same collectives in the same
 *    order (the matching rule above) even when backward runs differently.
 *  - Between the first weft_grad_ready of a step and its weft_grad_wait,
 *    buckets are issued on `comm` at moments that differ between ranks: issue
 *    no other collective on that communicator meanwhile (give the gradient
 *    set its own communicator with weft_comm_split if the framework needs to).
 *  - A gradient marked ready is final for the step: it must not be written
 *    again until weft_grad_wait returns (its bucket may be in flight).
 *  - A gradient set is used by one thread at a time, like its communicator. */

/* Kinds of memory. A tensor says HOST or DEVICE; device memory needs a CUDA
 * build: until then it is WEFT_ERR_UNSUPPORTED. The other kinds are forms the
 * library itself registers with a transport (transports/transport.h): host
 * memory from weft_mem_alloc that ranks of one host can map (SHARED), and
 * device memory exported as a dma-buf file descriptor for RDMA (DMABUF).
 * The values are fixed: they travel in messages between ranks. */
typedef enum weft_memory {
  WEFT_MEMORY_HOST = 0,   /* ordinary (pageable) host memory */
  WEFT_MEMORY_DEVICE = 1, /* a GPU's memory */
  WEFT_MEMORY_SHARED = 2, /* host memory from weft_mem_alloc, mappable by ranks of this host */
  WEFT_MEMORY_DMABUF = 3, /* device memory as a dma-buf fd (verbs registration) */
  WEFT_MEMORY_COUNT
} weft_memory;

/* 1 when this build of weft, on this machine, takes buffers of `memory` in
 * the collectives: HOST and SHARED always; DEVICE in a CUDA build whose driver
 * loads and sees a GPU (weft-info's cuda line says the same). *why, when not
 * NULL, gets a sentence either way (static storage, valid until the next
 * call). A framework asks before it hands weft a device pointer: a build
 * without CUDA cannot tell one from a host pointer. */
WEFT_API int weft_memory_usable(weft_memory memory, const char **why);

/* A tensor as weft sees it: a flat buffer of `count` elements. */
typedef struct weft_tensor {
  void *ptr;          /* may be NULL when count is 0, or for owned gradients */
  size_t count;       /* elements */
  weft_dtype dtype;
  weft_memory memory;
} weft_tensor;

typedef struct weft_grad weft_grad; /* opaque */

#define WEFT_GRAD_OPTIONS_VERSION 2 /* 2: wire_dtype */

typedef struct weft_grad_options {
  uint32_t version;              /* WEFT_GRAD_OPTIONS_VERSION, set by weft_grad_options_init */
  size_t bucket_cap_bytes;       /* default 25 MiB, as DDP; >= 1 */
  size_t first_bucket_cap_bytes; /* cap of bucket 0; default 1 MiB; 0 = bucket_cap_bytes */
  weft_op op;                    /* WEFT_AVG (mean over ranks, default) or WEFT_SUM */
  /* > 1: each rank's gradient is divided by prediv before the sum and the
   * result multiplied by prediv/size (avg) or prediv (sum) after, so the
   * same result with smaller partial sums (f16/bf16 ranges). 0 or 1: none. */
  double prediv;
  /* 1: weft allocates each bucket's flat buffer; weft_grad_tensor_ptr gives
   * every tensor's place in it, the framework writes gradients there and no
   * copy in or out is made (DDP's gradient_as_bucket_view). Registered
   * pointers are then ignored (may be NULL). 0: weft copies registered
   * tensors into buckets at ready time and back at wait (a bucket of one
   * tensor is reduced in place, without copies). */
  int owned_storage;
  /* Copies only: a tensor of at least this many bytes is not copied; it gets
   * a bucket of its own, reduced where it lies, and closes the bucket being
   * filled, so buckets still leave in backward order. Default 1 MiB: one
   * more allreduce costs less than copying 2 MiB in and out. 0: every tensor
   * goes through a bucket buffer, as in DDP and Horovod. */
  size_t inplace_min_bytes;
  /* 1: weft_grad_wait also checks, at the start of each step, that every
   * rank is in the same step with the same registrations and sync flag (one
   * small allgather per step). Also on when the WEFT_GRAD_CHECK setting is 1. */
  int check_every_step;
  /* Parameter broadcast from bcast_root (see weft_grad_set_params): -1 never,
   * 0 only in weft_grad_finalize (default), N > 0 also after the reduction
   * of every N-th synchronised step, inside weft_grad_wait. */
  int bcast_period;
  int bcast_root;
  /* What f32 buckets travel as between hosts (weft_comm_set_wire_dtype):
   * WEFT_BF16 or WEFT_F16 halves the bytes, WEFT_F32 keeps them exact; -1
   * (the default): the communicator's. Every rank passes the same. */
  int wire_dtype;
} weft_grad_options;

/* Fills `opts` with the defaults above. */
WEFT_API void weft_grad_options_init(weft_grad_options *opts);

/* A gradient set on `comm` (not collective; weft_grad_finalize is). `opts`
 * NULL means the defaults. The communicator must outlive the set. */
WEFT_API weft_status weft_grad_create(weft_comm *comm, const weft_grad_options *opts,
                                      weft_grad **grad);

/* Registers one gradient tensor, once, in the order the framework declares
 * parameters; *index gets its id (0, 1, ...). Before weft_grad_finalize. */
WEFT_API weft_status weft_grad_register(weft_grad *grad, const weft_tensor *tensor, int *index);

/* Optional, after the last weft_grad_register and before weft_grad_finalize:
 * the order in which backward produces the gradients (a permutation of
 * 0..n-1), instead of reverse registration. */
WEFT_API weft_status weft_grad_set_order(weft_grad *grad, const int *order, int n);

/* Optional, before weft_grad_finalize: the parameters to broadcast from
 * opts.bcast_root (weft_params_broadcast) at finalize and every
 * opts.bcast_period synchronised steps. The array is copied; the buffers must
 * stay valid as long as the set. */
WEFT_API weft_status weft_grad_set_params(weft_grad *grad, const weft_tensor *params, int n);

/* Collective over the communicator: forms the buckets, allocates owned
 * storage, and checks that every rank registered the same tensors (number,
 * counts, dtypes, memory kinds), order, parameters and options. Any
 * difference (or a rank whose own registration was invalid) gives
 * WEFT_ERR_MISMATCH on every rank, with weft_last_error naming the first
 * difference and the ranks involved; it never hangs. Then broadcasts the
 * parameters when opts.bcast_period >= 0 and some were set. */
WEFT_API weft_status weft_grad_finalize(weft_grad *grad);

/* Owned storage: the place of tensor `index` inside its bucket (zero-filled
 * at finalize; aligned to 64 bytes). After weft_grad_finalize. */
WEFT_API weft_status weft_grad_tensor_ptr(const weft_grad *grad, int index, void **ptr);

/* The gradient of tensor `index` is final for this step. When that completes
 * the bucket with the lowest index not yet launched, that bucket and every
 * complete bucket after it are launched at once (non-blocking). Marking a
 * tensor twice in one step is WEFT_ERR_INVALID. While synchronisation is off
 * (weft_grad_set_sync) it only records the call. */
WEFT_API weft_status weft_grad_ready(weft_grad *grad, int index);

/* Ends the step: launches the buckets not yet launched (a tensor never marked
 * ready goes in as it is, e.g. the zeros of an unused parameter), waits for
 * every bucket, and leaves each registered (or owned) gradient holding the
 * mean or sum over ranks. Bounded by the communicator's timeout. On an error
 * every bucket is still waited for; weft_last_error names the bucket. */
WEFT_API weft_status weft_grad_wait(weft_grad *grad);

/* The stream form of weft_grad_wait for a device set (the rules above):
 * launches what is left, makes `stream` (a CUstream or cudaStream_t; NULL:
 * the legacy default stream) wait on the GPU for every bucket's result,
 * queues the unpacks and scalings on it, and returns without waiting. The
 * next step's work that writes the gradients (its backward) must be ordered
 * after `stream` (queued on it, or on a stream made to wait for an event
 * recorded there), as the optimizer's reads are. A host set: the same as
 * weft_grad_wait. */
WEFT_API weft_status weft_grad_wait_stream(weft_grad *grad, void *stream);

/* Names the CUDA stream a device set's work is ordered on (its packs, its
 * buckets' start, the host form's unpacks), instead of the communicator's;
 * between steps. Every rank may pass its own. */
WEFT_API weft_status weft_grad_set_stream(weft_grad *grad, void *stream);

/* Does not block: *done = 1 once bucket `bucket`'s allreduce of the current
 * step has completed (its result is in the bucket: owned storage's views
 * hold it, before any post-scaling); 0 while it runs or before it is
 * launched. For frameworks that start work per bucket, and for tests. An
 * error names the bucket and leaves the set failed. */
WEFT_API weft_status weft_grad_bucket_test(weft_grad *grad, int bucket, int *done);

/* Gradient accumulation (DDP's no_sync): sync = 0 makes the following steps
 * local (weft_grad_ready records, weft_grad_wait returns at once, gradients
 * are left as they are, so the framework keeps accumulating into them);
 * sync = 1 makes the next step reduce what accumulated. Call it between
 * steps, with the same sequence on every rank. */
WEFT_API weft_status weft_grad_set_sync(weft_grad *grad, int sync);

/* Describes bucket `bucket` (0 .. count-1) or tensor placement, for tests
 * and tools. */
typedef enum weft_grad_bucket_state {
  WEFT_GRAD_BUCKET_FILLING = 0, /* some tensors not ready yet this step */
  WEFT_GRAD_BUCKET_FULL = 1,    /* every tensor ready; waits for an earlier bucket */
  WEFT_GRAD_BUCKET_LAUNCHED = 2 /* its allreduce is issued; completes in weft_grad_wait */
} weft_grad_bucket_state;
typedef struct weft_grad_bucket_desc {
  weft_dtype dtype;
  weft_memory memory;
  size_t count;     /* elements reduced, padding included */
  size_t bytes;
  int ntensors;
  int first_tensor; /* the tensor filled first (the bucket's tensors in fill order: weft_grad_tensor_place) */
  weft_grad_bucket_state state;
} weft_grad_bucket_desc;
WEFT_API int weft_grad_bucket_count(const weft_grad *grad);
WEFT_API weft_status weft_grad_bucket_info(const weft_grad *grad, int bucket,
                                           weft_grad_bucket_desc *desc);
/* Tensor `index` lies in bucket *bucket at element *offset. */
WEFT_API weft_status weft_grad_tensor_place(const weft_grad *grad, int index, int *bucket,
                                            size_t *offset);

/* Counters since creation: what moved, for benchmarks and tests. */
typedef struct weft_grad_stats {
  uint64_t steps;            /* weft_grad_wait calls that completed */
  uint64_t synced_steps;     /* of which reduced gradients */
  uint64_t buckets_launched;
  uint64_t bytes_reduced;    /* bytes handed to allreduce */
  uint64_t bytes_copied;     /* bytes copied into and out of buckets */
  uint64_t bytes_scaled;     /* bytes passed over by prediv scaling */
  uint64_t params_broadcasts;
} weft_grad_stats;
WEFT_API weft_status weft_grad_get_stats(const weft_grad *grad, weft_grad_stats *stats);

/* Frees the set and its owned storage, after waiting for buckets still in
 * flight. Not collective. NULL is a no-op. */
WEFT_API weft_status weft_grad_destroy(weft_grad *grad);

/* After a lost rank (weft_comm_shrink): moves the set onto `comm`, the
 * survivors' communicator, keeping its tensors, buckets and owned storage.
 * It waits for the buckets of the failed step (they failed with the old
 * communicator) and clears the set's failure. Redo the failed step on it:
 * compute the gradients again and mark them ready; avg is then over the
 * survivors. (The failed step's buckets may hold partly reduced data, so
 * the gradients must be computed again, not reused.) Not collective, but
 * every survivor must do it before the set's next step, as with any call.
 * WEFT_ERR_INVALID for a set not finalized or a communicator not live. */
WEFT_API weft_status weft_grad_rebind(weft_grad *grad, weft_comm *comm);

/* Collective: every rank's tensors get the root's values. First checks that
 * every rank passes the same number of tensors with the same counts, dtypes
 * and memory kinds (WEFT_ERR_MISMATCH on every rank otherwise, never a hang,
 * demucs' parameter-count check done fully); small tensors are packed into
 * a few broadcasts. */
WEFT_API weft_status weft_params_broadcast(weft_comm *comm, const weft_tensor *tensors, int n,
                                           int root);

/* How weft_buffers_sync treats floating-point buffers (running means...);
 * integer buffers (counters) are always broadcast from root. */
typedef enum weft_sync_mode { WEFT_SYNC_AVERAGE = 0, WEFT_SYNC_BROADCAST = 1 } weft_sync_mode;

/* Collective: averages the floating-point buffers over ranks (or broadcasts
 * them from root) and broadcasts integer buffers from root, after the same
 * check as weft_params_broadcast. */
WEFT_API weft_status weft_buffers_sync(weft_comm *comm, const weft_tensor *tensors, int n,
                                       weft_sync_mode mode, int root);

/* Collective: values[i] becomes the mean over ranks weighted by counts[i]
 * (sum of value*count / sum of count, in double) and counts[i] the total
 * count; counts NULL weighs every rank 1. A metric no rank counted (total 0)
 * becomes NaN; a NaN value (a diverged loss) stays NaN. A negative or
 * non-finite count on any rank fails the call on every rank
 * (WEFT_ERR_INVALID there, WEFT_ERR_MISMATCH elsewhere); an `n` that differs
 * between ranks is WEFT_ERR_MISMATCH. */
WEFT_API weft_status weft_metrics_average(weft_comm *comm, double *values, double *counts, int n);

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
