/* settings.h - every WEFT_* environment setting, declared once with its
 * default and one line of help (settings.c). Read from the environment once;
 * weft-info lists them. No other file calls getenv for a WEFT_ setting. */
#ifndef WEFT_SETTINGS_H
#define WEFT_SETTINGS_H

#include <stddef.h>

/* X(ID, default, help) */
#define WEFT_SETTINGS_MAP(X)                                                                  \
  X(TIMEOUT, "300", "seconds a blocking call waits without progress from a peer before failing") \
  X(DEBUG, "WARN", "log level: NONE, WARN, INFO or TRACE")                                   \
  X(DEBUG_SUBSYS, "ALL", "subsystems to log: ALL or a list of INIT,BOOT,NET,COLL,GRAD; ^ excludes") \
  X(RANK, "", "this process's rank (takes precedence over RANK, OMPI_*, SLURM_*)")          \
  X(SIZE, "", "number of ranks (takes precedence over WORLD_SIZE, OMPI_*, SLURM_*)")         \
  X(LOCAL_RANK, "", "rank among the ranks of this host")                                     \
  X(RENDEZVOUS, "", "host:port of the rendezvous (rank 0 listens); else MASTER_ADDR:MASTER_PORT") \
  X(AUTH_TOKEN, "", "job secret every connection must prove (HMAC); weftrun makes one; empty: the unique id, else none") \
  X(JOB_ID, "", "job identity every rank of one job shares, so that a rank of another job at the same rendezvous is refused; weftrun sets one; empty: the launcher's (TORCHELASTIC_RUN_ID, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, SLURM_JOB_ID.SLURM_STEP_ID)") \
  X(SOCKET_IFNAME, "", "interfaces for data sockets: eth0 (prefix), =eth0 (exact), ^docker (exclude)") \
  X(SOCKET_FAMILY, "", "address family for data sockets: 4, 6, or empty for either")        \
  X(CHUNK_BYTES, "262144", "bytes per pipelined chunk (slot size) in ring and tree algorithms") \
  X(SHM_SLOTS, "8", "chunks in flight per direction between two ranks of one host (2..64)") \
  X(TCP_BUF_BYTES, "0", "SO_SNDBUF/SO_RCVBUF of data sockets; 0 keeps the kernel's autotuning") \
  X(SPIN_US, "auto", "microseconds to busy-poll a waiting call; auto: 50, or 0 when ranks outnumber cores") \
  X(SPREAD, "auto", "ranks of a host that outnumber its CPUs each step onto CPU local_rank mod CPUs when the communicator starts, and back there when a blocking call finds them elsewhere (at most every 50 ms); their affinity mask is left as it was (an even start, not a binding); auto: only then, 1: always, 0: never") \
  X(YIELD_US, "100000", "then microseconds to poll with sched_yield before sleeping in poll(); 0 sleeps at once") \
  X(ALGO, "auto", "allreduce algorithm: auto, ring, rd (recursive doubling), exchange (one round, every rank to every rank), hier (within hosts, then across) or direct (shared buffers, any size)")             \
  X(DIRECT_MIN_BYTES, "1048576", "allreduce of at least this many bytes among ranks of one host first asks whether every rank's buffers are shared (weft_mem_alloc): if so, one pass straight through them; 0 = never") \
  X(EXCHANGE_MAX_BYTES, "16384", "auto picks the one-round exchange for allreduce up to this many bytes when all ranks (at most 8) share one host: it needs fewer turns of ranks that share a core; 0 = never") \
  X(RD_MAX_BYTES, "262144", "auto picks recursive doubling for allreduce up to this many bytes (at most one chunk)") \
  X(BCAST_FANOUT, "0", "broadcast tree fan-out; 0 = auto (binary below WEFT_BCAST_CHAIN_BYTES, else a chain)") \
  X(BCAST_CHAIN_BYTES, "65536", "broadcasts of at least this many bytes use a pipelined chain") \
  X(CHECK, "0", "1: every collective first compares a fingerprint (call, count, dtype, op, root) across ranks; a difference fails every rank naming both sides") \
  X(RECORDER, "64", "calls each communicator remembers (flight recorder), printed on timeout, abort and SIGUSR1; 0 = off") \
  X(HOST_ID, "", "host identity for transport choice; ranks with the same one use shared memory (tests, containers)") \
  X(TRANSPORT, "", "force one transport for every peer: shm, tcp (or ibv when built); empty = choose per peer") \
  X(GRAD_CHECK, "0", "1: every gradient set checks at each step that all ranks agree (one small allgather a step; debug)") \
  X(IB_HCA, "", "RDMA devices/ports for verbs: mlx5 (prefix), =mlx5_0 (exact), mlx5_0:1 (port), ^mlx5_1 (exclude)") \
  X(IB_GID_INDEX, "", "RoCE GID index to use; empty = auto (RoCE v2, IPv4-mapped first, as NCCL and perftest)") \
  X(IB_QPS_PER_PEER, "1", "RC queue pairs per peer for verbs (1..8); chunks go round-robin over them") \
  X(IB_ZCOPY_BYTES, "0", "verbs chunks of at least this many bytes are sent from the user's buffer (registration cache); 0 = always copy (see README)") \
  X(IB_TIMEOUT, "18", "verbs ACK timeout exponent: 4.096 us * 2^N per try (1..31)")         \
  X(IB_RETRY_CNT, "7", "verbs transport retries before a work request fails (0..7)")         \
  X(IB_LIBRARY, "", "for tests: the verbs library to dlopen instead of libibverbs.so.1 (the in-tree emulator)")

enum weft_setting_id {
#define WEFT_SETTING_ENUM_(id, dflt, help) WEFT_SETTING_##id,
  WEFT_SETTINGS_MAP(WEFT_SETTING_ENUM_)
#undef WEFT_SETTING_ENUM_
  WEFT_SETTING_COUNT
};

/* Current value as text ("" when empty); never NULL. */
const char *weft_setting_str(enum weft_setting_id id);
/* Parsed as a number; `fallback` when empty or unparsable (a warning is logged once). */
double weft_setting_double(enum weft_setting_id id, double fallback);
long long weft_setting_ll(enum weft_setting_id id, long long fallback);
/* Re-reads the environment (tests change it between communicators). */
void weft_settings_reload(void);

#endif
