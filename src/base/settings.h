/* settings.h - every WEFT_* environment setting, declared once: name, type,
 * default, bounds and one line of help. Base declares its own (the core list
 * below) and keeps the registry: a layer above with settings of its own (each
 * transport, in its folder) defines a table of the same rows and hands it
 * over (weft_settings_register), so base names nobody above it. The registry
 * reads every table from the environment once (or on reload), checks it
 * (weft_settings_check) and lists it (weft_setting_get_info, for weft-info);
 * no other file calls getenv for a WEFT_ setting. Settings sit below the log:
 * they never log, they return errors to the caller that reports them. */
#ifndef WEFT_SETTINGS_H
#define WEFT_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>

#include "weft.h"

/* Bytes settings with no useful upper bound (2^53: exact in a double). */
#define WEFT_SETTING_NO_MAX 9007199254740992.0
/* The value of an INT_OR_AUTO setting that says "auto". */
#define WEFT_SETTING_AUTO (-1)

/* A word-valued setting lists its words once, W(CONSTANT, "word"): the list
 * makes both its C enum (in this order, from 0) and the words it accepts. */
#define WEFT_NO_WORDS(W)
#define WEFT_ALGO_WORDS(W)                                                                       \
  W(WEFT_ALGO_AUTO, "auto") W(WEFT_ALGO_RING, "ring") W(WEFT_ALGO_RD, "rd")                      \
  W(WEFT_ALGO_HIER, "hier") W(WEFT_ALGO_DIRECT, "direct") W(WEFT_ALGO_EXCHANGE, "exchange")
/* The log's levels, in its order (log.h). */
#define WEFT_DEBUG_WORDS(W)                                                                      \
  W(WEFT_DEBUG_NONE, "NONE") W(WEFT_DEBUG_WARN, "WARN") W(WEFT_DEBUG_INFO, "INFO")               \
  W(WEFT_DEBUG_TRACE, "TRACE")
/* The log's subsystems, in the order of their bits (log.h). */
#define WEFT_DEBUG_SUBSYS_WORDS(W)                                                               \
  W(WEFT_DEBUG_SUBSYS_INIT, "INIT") W(WEFT_DEBUG_SUBSYS_BOOT, "BOOT")                            \
  W(WEFT_DEBUG_SUBSYS_NET, "NET") W(WEFT_DEBUG_SUBSYS_COLL, "COLL")                              \
  W(WEFT_DEBUG_SUBSYS_GRAD, "GRAD")
#ifdef WEFT_HAVE_IBV
#define WEFT_TRANSPORT_IBV_WORD_(W) W(WEFT_TRANSPORT_IBV, "ibv")
#else
#define WEFT_TRANSPORT_IBV_WORD_(W)
#endif
#define WEFT_TRANSPORT_WORDS(W)                                                                  \
  W(WEFT_TRANSPORT_AUTO, "auto") W(WEFT_TRANSPORT_SHM, "shm") W(WEFT_TRANSPORT_TCP, "tcp")       \
  WEFT_TRANSPORT_IBV_WORD_(W)
#define WEFT_SPREAD_WORDS(W)                                                                     \
  W(WEFT_SPREAD_AUTO, "auto") W(WEFT_SPREAD_NEVER, "0") W(WEFT_SPREAD_ALWAYS, "1")
/* What f32 sum/avg data crossing hosts travels as (WEFT_WIRE_DTYPE). */
#define WEFT_WIRE_WORDS(W) W(WEFT_WIRE_F32, "f32") W(WEFT_WIRE_BF16, "bf16") W(WEFT_WIRE_F16, "f16")

/* X(ID, field, TYPE, default, min, max, WORDS, help): WEFT_<ID> is read into
 * weft_settings()-><field> (a transport's list: into its own values, as
 * tcp_settings()-><field>, ...). TYPE is
 *   INT          an integer in min..max                       (long long)
 *   INT_OR_AUTO  "auto" (WEFT_SETTING_AUTO) or min..max        (long long)
 *   BYTES        a byte count in min..max                     (size_t)
 *   BYTES_OR_0   0 or a byte count in min..max                (size_t)
 *   SECONDS      a number of seconds in min..max              (double)
 *   BOOL         0/1, no/yes, false/true, off/on              (bool)
 *   ENUM, ENUM_ANYCASE  one of WORDS (exactly / in any case)  (int: WORDS' enum)
 *   WORD_SET     ALL, or WORDS joined by commas (any case), a   (unsigned: bit i for
 *                leading ^ excludes them                        WORDS' word i)
 *   STRING       any text, read by its user                   (const char *)
 * An empty value is the default; anything else that does not fit is an
 * error at communicator creation (weft_settings_check), never a silent fallback. */
#define WEFT_CORE_SETTINGS(X)                                                                    \
  X(TIMEOUT, timeout_s, SECONDS, "300", 0.001, 86400, WEFT_NO_WORDS,                             \
    "seconds a blocking call waits without progress from a peer before failing")                 \
  X(DEBUG, debug, ENUM_ANYCASE, "WARN", 0, 0, WEFT_DEBUG_WORDS,                                 \
    "how much to log to stderr (lines name host, pid and rank)")                     \
  X(DEBUG_SUBSYS, debug_subsys, WORD_SET, "ALL", 0, 0, WEFT_DEBUG_SUBSYS_WORDS,                   \
    "subsystems to log, e.g. INIT,NET; ^COLL logs all but COLL")                                 \
  X(RANK, rank, STRING, "", 0, 0, WEFT_NO_WORDS,                                                 \
    "this process's rank (takes precedence over RANK, OMPI_*, SLURM_*)")                         \
  X(SIZE, size, STRING, "", 0, 0, WEFT_NO_WORDS,                                                 \
    "number of ranks (takes precedence over WORLD_SIZE, OMPI_*, SLURM_*)")                       \
  X(LOCAL_RANK, local_rank, STRING, "", 0, 0, WEFT_NO_WORDS, "rank among the ranks of this host") \
  X(RENDEZVOUS, rendezvous, STRING, "", 0, 0, WEFT_NO_WORDS,                                     \
    "host:port of the rendezvous (rank 0 listens); else MASTER_ADDR:MASTER_PORT")                \
  X(AUTH_TOKEN, auth_token, STRING, "", 0, 0, WEFT_NO_WORDS,                                     \
    "job secret every connection must prove (HMAC); weftrun makes one; empty: the unique id, else none") \
  X(JOB_ID, job_id, STRING, "", 0, 0, WEFT_NO_WORDS,                                             \
    "job identity every rank of one job shares, so that a rank of another job at the same rendezvous is refused; weftrun sets one; empty: the launcher's (TORCHELASTIC_RUN_ID, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, SLURM_JOB_ID.SLURM_STEP_ID)") \
  X(CHUNK_BYTES, chunk_bytes, BYTES, "262144", 4096, 64 << 20, WEFT_NO_WORDS,                    \
    "bytes per pipelined chunk (slot size) in ring and tree algorithms")                         \
  X(SPIN_US, spin_us, INT_OR_AUTO, "auto", 0, 1000000, WEFT_NO_WORDS,                            \
    "microseconds to busy-poll a waiting call; auto: 50, or 0 when ranks outnumber cores")       \
  X(SPREAD, spread, ENUM, "auto", 0, 0, WEFT_SPREAD_WORDS,                                       \
    "ranks of a host that outnumber its CPUs each step onto CPU local_rank mod CPUs when the communicator starts, and back there when a blocking call finds them elsewhere (at most every 50 ms); their affinity mask is left as it was (an even start, not a binding); auto: only then, 1: always, 0: never") \
  X(YIELD_US, yield_us, INT, "100000", 0, 60000000, WEFT_NO_WORDS,                               \
    "then microseconds to poll with sched_yield before sleeping in poll(); 0 sleeps at once")    \
  X(ALGO, algo, ENUM_ANYCASE, "auto", 0, 0, WEFT_ALGO_WORDS,                                     \
    "allreduce algorithm: auto, ring, rd (recursive doubling), exchange (one round, every rank to every rank), hier (within hosts, then across) or direct (shared buffers, any size)") \
  X(DIRECT_MIN_BYTES, direct_min_bytes, BYTES, "1048576", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS, \
    "allreduce of at least this many bytes among ranks of one host first asks whether every rank's buffers are shared (weft_mem_alloc): if so, one pass straight through them; 0 = never") \
  X(EXCHANGE_MAX_BYTES, exchange_max_bytes, BYTES, "16384", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS, \
    "auto picks the one-round exchange for allreduce up to this many bytes when all ranks share one host, at most 8 of them (3 where every rank has a CPU of its own): it needs fewer turns of ranks that share a core; 0 = never") \
  X(RD_MAX_BYTES, rd_max_bytes, BYTES, "262144", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,          \
    "auto picks recursive doubling for allreduce up to this many bytes (at most one chunk; on shm with a CPU per rank and 3 or more ranks, at most 192 KiB / log2(ranks))") \
  X(BCAST_FANOUT, bcast_fanout, INT, "0", 0, 65536, WEFT_NO_WORDS,                               \
    "broadcast tree fan-out; 0 = auto (flat among 3-4 ranks on shm within the WEFT_BCAST_FLAT_ sizes, else a binomial tree for one chunk or two ranks, binary below WEFT_BCAST_CHAIN_BYTES, else a chain)") \
  X(BCAST_CHAIN_BYTES, bcast_chain_bytes, BYTES, "65536", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS, \
    "broadcasts of at least this many bytes use a pipelined chain")                              \
  X(BCAST_FLAT_MIN_BYTES, bcast_flat_min_bytes, BYTES, "16384", 0, WEFT_SETTING_NO_MAX,          \
    WEFT_NO_WORDS,                                                                               \
    "broadcasts of at least this many bytes among 3 or 4 ranks all on shm: the root sends to every rank itself (a flat tree; with single copy every rank copies straight from the root's buffer, all at once); 0 = never") \
  X(BCAST_FLAT_MAX_BYTES, bcast_flat_max_bytes, BYTES, "1048576", 0, WEFT_SETTING_NO_MAX,        \
    WEFT_NO_WORDS, "broadcasts take the flat tree (WEFT_BCAST_FLAT_MIN_BYTES) up to this many bytes") \
  X(ALLGATHER_PAIRWISE_BYTES, allgather_pairwise_bytes, BYTES, "8192", 0, WEFT_SETTING_NO_MAX, \
    WEFT_NO_WORDS,                                                                               \
    "allgather with at least this many bytes per rank, 3 or more ranks all on shm: every rank sends its block straight to every other (pairwise; with single copy each is read once from its owner) instead of around the ring; 0 = always the ring") \
  /* measured where log2 rounds stop winning (choose.c, whole_is_small) */                      \
  X(ALLGATHER_BRUCK_MAX_BYTES, allgather_bruck_max_bytes, BYTES, "262144", 0,                   \
    WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,                                                          \
    "allgather among 3 or more ranks whose whole output (all ranks' blocks) is at most this many bytes and one chunk, over links that are not all shm (sockets, verbs): Bruck's ceil(log2 ranks) rounds instead of the ring's ranks-1 steps; 0 = never") \
  X(ALLGATHER_BRUCK_SHM_MAX_BYTES, allgather_bruck_shm_max_bytes, BYTES, "8192", 0,             \
    WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,                                                          \
    "the same where every link is shm (there pairwise's single copy takes over sooner); 0 = never") \
  X(REDUCE_SCATTER_RD_MAX_BYTES, reduce_scatter_rd_max_bytes, BYTES, "32768", 0,                \
    WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,                                                          \
    "reduce_scatter among 3 or more ranks whose whole input (all ranks' blocks) is at most this many bytes and one chunk, over links that are not all shm: recursive doubling on the whole input, each rank keeping its block, instead of the ring's ranks-1 steps; 0 = never") \
  X(REDUCE_SCATTER_RD_SHM_MAX_BYTES, reduce_scatter_rd_shm_max_bytes, BYTES, "2048", 0,         \
    WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,                                                          \
    "the same where every link is shm (there the ring's steps cost little and rounds over the whole input soon cost more); 0 = never") \
  X(REDUCE_SCATTER_HALVING_MAX_BYTES, reduce_scatter_halving_max_bytes, BYTES, "524288", 0,     \
    WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,                                                          \
    "reduce_scatter among 4, 8, 16 .. ranks (a power of two) whose whole input is at most this many bytes and two chunks, over links that are not all shm: recursive halving, log2(ranks) rounds each sending half of what the last one did, ahead of recursive doubling and the ring; 0 = never") \
  X(REDUCE_SCATTER_HALVING_SHM_MAX_BYTES, reduce_scatter_halving_shm_max_bytes, BYTES, "32768", \
    0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,                                                       \
    "the same where every link is shm; 0 = never") \
  X(CHECK, check, BOOL, "0", 0, 0, WEFT_NO_WORDS,                                                \
    "1: every collective first compares a fingerprint (call, count, dtype, op, root) across ranks, and broadcasts confirm every rank's count, dtype and root: a difference fails every rank in that call naming both sides. 0: each chunk still carries its call's signature, so a difference fails every rank in that call or, where a rank only sent (a broadcast's root), in its next one") \
  X(STALL_PROBE, stall_probe_s, SECONDS, "1", 0, 86400, WEFT_NO_WORDS,                            \
    "a collective that has moved nothing for this long asks the peer it waits on (all when it knows none) which call it is in (over the control plane, off the data path): one in another call of the same number (a root, a count or a collective that differs, a call one rank skipped) fails every rank then with WEFT_ERR_MISMATCH naming both, instead of at WEFT_TIMEOUT; 0: off") \
  X(SUSPECT, suspect_s, SECONDS, "2", 0.05, 3600, WEFT_NO_WORDS,                                 \
    "recovery (weft_comm_agree, weft_comm_shrink) counts a peer as lost when its host does not answer a dial or a write for this long (a cut link, a host that is down); a peer that ended is seen at once, and a live one that is late is waited for up to WEFT_TIMEOUT") \
  X(RECORDER, recorder, INT, "64", 0, 100000, WEFT_NO_WORDS,                                     \
    "calls each communicator remembers (flight recorder), printed on timeout, abort and SIGUSR1; 0 = off") \
  X(HOST_ID, host_id, STRING, "", 0, 0, WEFT_NO_WORDS,                                           \
    "host identity for transport choice; ranks with the same one use shared memory (tests, containers)") \
  X(TRANSPORT, transport, ENUM, "auto", 0, 0, WEFT_TRANSPORT_WORDS,                              \
    "force one transport for every peer; auto = choose per peer")                                \
  X(GRAD_CHECK, grad_check, BOOL, "0", 0, 0, WEFT_NO_WORDS,                                      \
    "1: every gradient set checks at each step that all ranks agree (one small allgather a step; debug)") \
  X(WIRE_DTYPE, wire_dtype, ENUM_ANYCASE, "f32", 0, 0, WEFT_WIRE_WORDS,                           \
    "f32 sum/avg allreduce, reduce-scatter and reduce data crossing hosts travels as f32 (exact), bf16 or f16 (half the bytes; f32 sums, one rounding per hop: relative error up to about ranks x 2^-8 (bf16) or 2^-11 (f16) of the sum of |x|); ignored on one host; weft_comm_set_wire_dtype sets it per communicator") \
  X(CUDA_IPC, cuda_ipc, BOOL, "1", 0, 0, WEFT_NO_WORDS,                                          \
    "device buffers of ranks all on one host, all linked by shm: every collective reads the peers' buffers through CUDA IPC (the allreduce writes them too), with no copy through host memory (falls back to staging where a peer's buffer cannot be mapped); 0: always stage through pinned host memory") \
  X(DEVICE_SLICE_BYTES, device_slice_bytes, BYTES, "4194304", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS, \
    "an allreduce, broadcast or reduce of device buffers staged through host memory runs in slices of this many bytes (at most 64 slices), so slice k+1 is copied off the GPU while slice k is reduced and slice k-1 copied back; 0: the call in one piece") \
  X(CUDA_LIBRARY, cuda_library, STRING, "", 0, 0, WEFT_NO_WORDS,                                 \
    "for tests: the CUDA driver library to dlopen instead of libcuda.so.1 (the in-tree stand-in)")

/* ---- what the lists generate ------------------------------------------- */

/* A words list's enum and its words, for any list (a transport's too):
 * enum x { X_WORDS(WEFT_SETTING_WORD_ENUM) }; WEFT_SETTING_WORD_TEXT makes
 * the NULL-terminated array of its words. */
#define WEFT_SETTING_WORD_ENUM(constant, word) constant,
#define WEFT_SETTING_WORD_TEXT(constant, word) word,
enum weft_algo_choice { WEFT_ALGO_WORDS(WEFT_SETTING_WORD_ENUM) };
enum weft_debug_choice { WEFT_DEBUG_WORDS(WEFT_SETTING_WORD_ENUM) };
enum weft_transport_choice { WEFT_TRANSPORT_WORDS(WEFT_SETTING_WORD_ENUM) };
enum weft_spread_choice { WEFT_SPREAD_WORDS(WEFT_SETTING_WORD_ENUM) };
enum weft_wire_choice { WEFT_WIRE_WORDS(WEFT_SETTING_WORD_ENUM) };
enum weft_debug_subsys_choice { WEFT_DEBUG_SUBSYS_WORDS(WEFT_SETTING_WORD_ENUM) };

/* The core settings' ids: their index in the core table (weft_setting_str). */
enum weft_setting_id {
#define WEFT_SETTING_ID_(id, field, type, dflt, lo, hi, words, help) WEFT_SETTING_##id,
  WEFT_CORE_SETTINGS(WEFT_SETTING_ID_)
#undef WEFT_SETTING_ID_
  WEFT_SETTING_COUNT
};

enum weft_setting_type {
  WEFT_SETTING_INT,
  WEFT_SETTING_INT_OR_AUTO,
  WEFT_SETTING_BYTES,
  WEFT_SETTING_BYTES_OR_0,
  WEFT_SETTING_SECONDS,
  WEFT_SETTING_BOOL,
  WEFT_SETTING_ENUM,
  WEFT_SETTING_ENUM_ANYCASE,
  WEFT_SETTING_WORD_SET,
  WEFT_SETTING_STRING,
};

/* The C type of each TYPE's field. */
#define WEFT_SETTING_CTYPE_INT long long
#define WEFT_SETTING_CTYPE_INT_OR_AUTO long long
#define WEFT_SETTING_CTYPE_BYTES size_t
#define WEFT_SETTING_CTYPE_BYTES_OR_0 size_t
#define WEFT_SETTING_CTYPE_SECONDS double
#define WEFT_SETTING_CTYPE_BOOL bool
#define WEFT_SETTING_CTYPE_ENUM int
#define WEFT_SETTING_CTYPE_ENUM_ANYCASE int
#define WEFT_SETTING_CTYPE_WORD_SET unsigned
#define WEFT_SETTING_CTYPE_STRING const char *

/* A field of a values struct, from a row of a list:
 * struct { LIST(WEFT_SETTING_FIELD) }. */
#define WEFT_SETTING_FIELD(id, field, type, dflt, lo, hi, words, help) \
  WEFT_SETTING_CTYPE_##type field;

/* The core values, parsed and checked: a setting whose text was refused
 * holds its default here (and weft_settings_check says why). */
typedef struct weft_settings_values {
  WEFT_CORE_SETTINGS(WEFT_SETTING_FIELD)
} weft_settings_values;

/* ---- tables: the core's, and each one a layer above hands over ----------- */

/* One setting of a table: a row of its list, and where its typed value
 * lies in the table's values struct. */
typedef struct weft_setting_spec {
  const char *name; /* "WEFT_TCP_STREAMS" */
  enum weft_setting_type type;
  const char *deflt;
  double lo, hi;
  const char *const *words; /* NULL-terminated; used by the ENUM types and WORD_SET */
  const char *help;
  size_t offset; /* of its field (WEFT_SETTING_CTYPE_<TYPE>) in the values struct */
} weft_setting_spec;

/* A row of a list as a spec whose value lies in a `values_type` struct made
 * by WEFT_SETTING_FIELD from the same list. A list's row macro forwards to
 * it: #define ROW_(...) WEFT_SETTING_SPEC(tcp_settings_values, __VA_ARGS__), */
#define WEFT_SETTING_SPEC(values_type, id_, field_, type_, dflt_, lo_, hi_, words_, help_)     \
  {"WEFT_" #id_, WEFT_SETTING_##type_, dflt_, lo_, hi_,                                         \
   (const char *const[]){words_(WEFT_SETTING_WORD_TEXT) NULL}, help_,                          \
   offsetof(values_type, field_)}

/* What the registry keeps of one setting: the environment's text and why it
 * was refused. */
typedef struct weft_setting_state {
  char *env;         /* owned copy of the environment's value, or NULL when unset */
  char refused[256]; /* why the environment's value was refused; "" when accepted */
} weft_setting_state;

/* A table of settings: its owner defines the specs, the values struct and
 * room for the states (WEFT_SETTINGS_TABLE); the registry fills the values.
 * The owner reads them with weft_settings_table_values, which loads the
 * table on first use whether or not it was registered yet; registering
 * makes it one that weft_settings_check checks and weft-info lists. */
typedef struct weft_settings_table {
  const char *group; /* weft-info's heading: "tcp" */
  const weft_setting_spec *specs;
  int count;
  void *values;
  weft_setting_state *states; /* count of them */
  /* the registry's own, under its lock */
  unsigned loaded_at; /* the reading its values come from (0: none yet) */
  bool registered;
  struct weft_settings_table *next;
} weft_settings_table;
#define WEFT_SETTINGS_TABLE(group_, specs_, values_, states_)                                \
  {.group = group_, .specs = specs_, .count = (int)(sizeof specs_ / sizeof specs_[0]),          \
   .values = values_, .states = states_}

/* Adds `table` to the ones checked and listed, after those before it (the
 * core's first); a second call for the same table does nothing. The layer
 * that lists what is built in calls it (transports/transport_settings.c)
 * before it needs them checked or listed. */
void weft_settings_register(weft_settings_table *table);
/* The table's values, loaded on first use and after each reload. Valid until
 * the next reload. */
const void *weft_settings_table_values(weft_settings_table *table);
/* Setting `index` of the table as text, as weft_setting_str. */
const char *weft_settings_table_text(weft_settings_table *table, int index);

/* ---- the core settings, and every registered table ------------------------ */

/* The current values (loaded on first use). Valid until the next reload. */
const weft_settings_values *weft_settings(void);
/* Current value as text: the environment's, or the default when it is unset
 * or empty; never NULL. For STRING settings and messages. */
const char *weft_setting_str(enum weft_setting_id id);

/* WEFT_OK, or WEFT_ERR_INVALID with a sentence in `why` naming the first
 * refused setting, its value and the rule (and how many more were refused),
 * over the core table and every registered one. Communicator creation calls
 * it before it starts anything. */
weft_status weft_settings_check(char *why, size_t len);

/* Re-reads the environment (tests change it between communicators; a forked
 * child re-reads its own on first use). */
void weft_settings_reload(void);
/* `fn` runs after each reload (and in a forked child): how a layer above
 * (the log) learns that values it derived are stale. At most 4 listeners. */
void weft_settings_on_reload(void (*fn)(void));

/* For weft-info: what setting `id` is (counting the core's, then each
 * registered table's in turn), its rule as a phrase ("an integer from 2 to
 * 64"), and the refusal of its current text ("" when accepted);
 * WEFT_ERR_INVALID past the last. */
typedef struct weft_setting_info {
  const char *name;  /* "WEFT_TIMEOUT" */
  const char *group; /* "weft", "tcp", "shm", "ibv" */
  enum weft_setting_type type;
  const char *type_name; /* "seconds" */
  const char *deflt;
  const char *value; /* as weft_setting_str */
  const char *help;
  char rule[160];
  char refused[256];
} weft_setting_info;
weft_status weft_setting_get_info(int id, weft_setting_info *info);
/* The same, as the public header's description (weft_setting_describe,
 * which registers the built-in transports' tables first). */
weft_status weft_settings_describe(int id, weft_setting_desc *desc);

#endif
