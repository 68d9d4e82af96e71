/* shm.h - the shared-memory transport's private types. Two ranks of one host
 * share one segment per pair and channel: two FIFOs (lower->higher, higher->lower) of
 * `nslots` slots of chunk_bytes. Counters are 32-bit and double as futex
 * words, so a sleeping side is woken by the other with no extra state. */
#ifndef WEFT_SHM_H
#define WEFT_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "src/topo/select.h"
#include "transports/transport.h"

#define SHM_SEG_MAGIC 0x5745534du /* "WESM" */
/* 2: one cache line per slot, small chunks inline; 3: `refused`; 4: single
 * copy (a cell's `how`, the FIFO's cma words); 5: the sender's cma_cost_milli;
 * 6: the verdict "mixed"; 7: SHM_CELLS cells, the slots taken in order by the
 * chunks that need one */
#define SHM_SEG_VERSION 7
#define SHM_MAX_SLOTS 64
/* Cells per direction: chunks in flight. Only a chunk above inline size
 * sent through the slots holds a slot too (WEFT_SHM_SLOTS of them), so
 * descriptors (single copy) and inline chunks run up to SHM_CELLS ahead:
 * a sender posts a whole 16 MiB block of an alltoall by address at once,
 * and its receivers read it while it is descheduled (docs/tuning.md, "Cells
 * beyond the slots: 64 chunks in flight"). */
#define SHM_CELLS 64
#define SHM_ABORT_TEXT 300
/* The size a creator leaves its pair's name at when /dev/shm had no room for
 * the segment: a size costs tmpfs no space, and no segment is ever this small
 * (a creator's name is 0 bytes until fallocate makes it whole), so the opener
 * learns why at once and fails alike instead of waiting for a segment. */
#define SHM_NO_ROOM_BYTES 1

/* A slot's tag and, for a chunk of up to SHM_INLINE_BYTES, its data: two
 * cache lines. Moving a line between two cores is slow next to a small
 * chunk's copy (docs/tuning.md, "The ring's cache lines"), so a small chunk
 * must not cost lines fetched one after the other (a head counter, a tag
 * array and a data slot were three): the receiver polls `ready` and finds tag
 * and the first SHM_INLINE_FIRST bytes beside it; a longer chunk's second
 * line it prefetches while it polls, so both lines travel at once. */
#define SHM_INLINE_FIRST 48
#define SHM_INLINE_BYTES 112
enum shm_cell_how {
  SHM_CELL_DATA = 0, /* the chunk is in `data` (inline) or in the cell's slot */
  SHM_CELL_CMA = 1,  /* single copy: `data` holds the sender's address of the chunk (a
                        uint64_t); the receiver reads it with process_vm_readv, and the chunk
                        is complete for the sender once the receiver released the cell */
};
typedef struct shm_cell {
  _Alignas(64) atomic_uint ready;    /* the chunk's number + 1 once tag and data are written */
  uint32_t seq, sig;                    /* the chunk's tag (call_tag.h) */
  uint32_t len_how;                     /* the length (< 2^30: WEFT_CHUNK_BYTES' maximum is
                                           64 MiB), enum shm_cell_how in the top 2 bits:
                                           written in one store (shm_cell_set) */
  unsigned char data[SHM_INLINE_BYTES]; /* the chunk when len <= SHM_INLINE_BYTES */
} shm_cell;
_Static_assert(sizeof(shm_cell) == 128, "a cell is two cache lines");
_Static_assert(offsetof(shm_cell, data) + SHM_INLINE_FIRST == 64, "the first line's data");
_Static_assert((SHM_CELLS & (SHM_CELLS - 1)) == 0 && SHM_CELLS >= SHM_MAX_SLOTS,
               "a power of two (chunk numbers wrap), and no fewer cells than slots");

/* One direction. Fields written by different sides sit on different cache
 * lines so the two processes do not fight over one line per chunk. */
typedef struct shm_fifo {
  _Alignas(64) atomic_uint head;     /* chunks published by the sender (futex word) */
  atomic_uint recv_sleeping;         /* receiver is (about to be) in futex_wait on head */
  _Alignas(64) atomic_uint tail;     /* chunks released by the receiver (futex word) */
  atomic_uint send_sleeping;         /* sender waits for room on tail */
  _Alignas(64) atomic_uint aborted;  /* the sender failed; abort_text says why */
  char abort_text[SHM_ABORT_TEXT];
  /* Single copy (process_vm_readv), decided once per direction: the sender
   * offers (cma_offer, last) the address in its own process of the word
   * cma_probe_word, which both see; the receiver reads that address from
   * the sender's process and writes its verdict. Only after a yes does the
   * sender post descriptors (SHM_CELL_CMA), so both ends agree. */
  _Alignas(64) atomic_uint cma_offer; /* 1: probe_addr and probe_word are written */
  atomic_uint cma_verdict;            /* the receiver's: 0 not yet, 1 yes, 2 no, 3 mixed */
  uint64_t cma_probe_addr;            /* &cma_probe_word in the sender's mapping */
  uint64_t cma_probe_word;            /* a value of the sender's choosing */
  uint32_t cma_cost_milli; /* the sender's timed process_vm_readv / memcpy ratio x 1000 (0: not
                              timed): the receiver decides from both ends' timings, so the two
                              directions of a pair decide alike (shm_cma_pays) */
  shm_cell cell[SHM_CELLS]; /* written by the sender, `ready` last; chunk n in
                               cell n % SHM_CELLS */
} shm_fifo;

typedef struct shm_segment {
  atomic_uint magic;                 /* written last by the creator */
  uint32_t version, nslots;
  uint64_t slot_bytes;
  atomic_uint peer_mapped;           /* the opener has mapped (and unlinked) it */
  atomic_uint refused;               /* the opener found other settings: fifo[1].abort_text
                                        says which, and the pair fails as a mismatch */
  _Alignas(64) shm_fifo fifo[2];     /* [0] lower->higher, [1] higher->lower */
  /* then 2 * nslots * slot_bytes of slot data, page aligned */
} shm_segment;

/* What a rank publishes for this transport. */
typedef struct shm_addr {
  uint32_t magic;
  uint32_t pid;
  uint64_t shm_free;                 /* free bytes of /dev/shm seen at init */
  weft_place place;
} shm_addr;

/* ---- parsers of what a peer wrote: pure functions, fuzzed on their own
 * (tests/fuzz/). They check the length first and never read past it. */

/* A peer's published address (arrives at any alignment). WEFT_ERR_PROTOCOL
 * when the length or magic is not an shm address's. */
weft_status shm_addr_parse(const uint8_t *buf, size_t len, shm_addr *out);

/* The fixed header of a pair segment, as its creator wrote it. */
typedef struct shm_segment_info {
  uint32_t magic, version, nslots;
  uint64_t slot_bytes;
} shm_segment_info;
/* WEFT_ERR_PROTOCOL when `len` cannot hold the header. */
weft_status shm_segment_parse(const uint8_t *buf, size_t len, shm_segment_info *out);
/* NULL when a segment with this header can be used with (nslots,
 * slot_bytes) and mapped in `seg_bytes`; else why not. */
const char *shm_segment_check(const shm_segment_info *info, uint32_t nslots, uint64_t slot_bytes,
                              size_t seg_bytes);

/* A peer's buffer mapped here: shared host memory (weft_mem_alloc), which
 * shm maps itself, or device memory, which the memory table maps (CUDA IPC:
 * mem.h, map_peer) and shm only keeps, keyed by the peer's descriptor. A
 * training step that reduces each gradient on its own names every one of
 * them each step (ResNet-50: 161): the cache holds them all, or each step
 * would close and open again what the last evicted (on a GPU, an IPC open
 * costs more than a small allreduce). About 36 KiB per connection. */
#define SHM_PEER_MAPS 256
typedef struct shm_peer_map {
  uint8_t kind;   /* WEFT_MEMORY_SHARED or WEFT_MEMORY_DEVICE */
  uint64_t ino;   /* SHARED: the peer's memfd: what the mapping is of */
  size_t bytes;   /* SHARED: mapped length: the memfd's size when it was mapped */
  void *base;     /* the mapping (DEVICE: the table's, for unmap_peer) */
  void *local;    /* DEVICE: the described buffer's first byte */
  uint64_t len;   /* DEVICE: the described length */
  uint8_t body[WEFT_MEM_DESC_BODY]; /* DEVICE: the descriptor it was mapped from */
  uint64_t used;  /* the connection's use counter when last looked up (LRU) */
  bool lent;      /* DEVICE: lent for one call (no WEFT_MEM_DESC_KEEP): closed by release_peer_mem */
} shm_peer_map;

enum shm_conn_state { SHM_CONN_OPENING, SHM_CONN_UP, SHM_CONN_DEAD };

typedef struct shm_ctx shm_ctx;
typedef struct shm_conn shm_conn;
#define SHM_CELL_LEN_BITS 30
static inline void shm_cell_set(shm_cell *cell, size_t len, enum shm_cell_how how) {
  cell->len_how = (uint32_t)len | (uint32_t)how << SHM_CELL_LEN_BITS;
}
static inline uint32_t shm_cell_len(const shm_cell *cell) {
  return cell->len_how & ((1u << SHM_CELL_LEN_BITS) - 1);
}
static inline enum shm_cell_how shm_cell_how(const shm_cell *cell) {
  return (enum shm_cell_how)(cell->len_how >> SHM_CELL_LEN_BITS);
}
enum shm_want { SHM_WANT_NONE, SHM_WANT_RECV, SHM_WANT_SEND, SHM_WANT_OPEN, SHM_WANT_IDLE };
/* MIXED: the receiver can read the sender, but two copies paid when timed;
 * the sender takes single copy for some chunks while its copies into the
 * slots run slow (shm_mix_by_address). The receiver takes either form. */
enum shm_cma_verdict { SHM_CMA_UNDECIDED = 0, SHM_CMA_YES = 1, SHM_CMA_NO = 2, SHM_CMA_MIXED = 3 };

/* What this rank moved in one call that carried chunks above inline size,
 * over all its connections. */
typedef struct shm_large_call {
  uint32_t seq;
  bool valid;
  bool received;                     /* a large chunk came in */
  bool fanout;                       /* large chunks left on two connections or more */
  shm_conn *first_tx;                /* where the first large chunk left */
} shm_large_call;

/* What single copy costs in this process: process_vm_readv over memcpy of
 * the same bytes (shm_cma.c). Whoever needs it owns one (a context, a
 * test, weft-info's probe) and it is timed on first use, once per owner. */
typedef struct shm_cma_timing {
  bool tried;                        /* timed, or tried to */
  double ratio;                      /* readv_us / copy_us; 0: could not be timed */
  double readv_us, copy_us;          /* the best of the tries */
} shm_cma_timing;

struct shm_conn {
  shm_ctx *ctx;
  int peer;
  int channel;
  enum shm_conn_state state;
  weft_status dead_status;
  bool creator;                      /* this rank made the segment (lower rank) */
  bool maybe_linked;                 /* the name may still exist. The opener unlinks it
                                        on mapping it or on giving up; the creator once
                                        the opener is dead, or on its own end */
  char name[64];
  shm_segment *seg;
  size_t seg_bytes;
  shm_fifo *tx, *rx;
  char *tx_slots, *rx_slots;
  uint32_t tx_head;                  /* local copy: chunks we published */
  uint32_t tx_tail_seen;             /* the peer's tail when we last read it: room is
                                        known without touching its line every send */
  uint32_t rx_tail;                  /* local copy: chunks we released */
  /* The slots, taken in chunk order by the chunks that go through one
   * (above inline size, not by address): slot k % nslots for the k-th. The
   * sender counts those it took, and after each chunk it notes the count,
   * so the peer's tail tells how many came back; the receiver counts those
   * it released. */
  uint32_t tx_slots_taken;
  uint32_t tx_slots_after[SHM_CELLS]; /* tx_slots_taken once chunk n was posted, at n % SHM_CELLS */
  uint32_t rx_slots_released;
  void *rx_peeked; /* a descriptor's chunk read for a peek (chunk_bytes,
                      allocated on first use): it holds no slot */
  bool peeked;
  /* single copy (shm_fifo's cma words) */
  uint8_t tx_cma;                 /* the peer's verdict on reading us, once it is known */
  bool tx_copy_pending;           /* chunks up to tx_copy_until are descriptors: */
  uint32_t tx_copy_until;         /* complete only once tail reaches it */
  bool rx_cma_decided;            /* our verdict on reading the peer is written */
  bool rx_read;                   /* the peeked descriptor's chunk was read (rx_peeked) */
  uint64_t cma_chunks, cma_bytes; /* received by single copy (logged at the end; tests) */
  uint64_t cma_reads;             /* the process_vm_readv that read them (recv: one per run) */
  /* the verdict MIXED (shm_mix_by_address) */
  double tx_in_ns_kib;               /* our recent copies of large chunks into the slots,
                                        ns per KiB (a moving average; 0: none yet) */
  uint32_t tx_slot_touched[SHM_MAX_SLOTS]; /* bytes of each slot written so far: a copy
                                        past them meets first-touch page faults */
  uint32_t tx_mix_turn;              /* one-way chunks sent while slow: every other one
                                        goes by address */
  /* one-way streams on a pair that reads by single copy (shm_stream_through_slots) */
  uint32_t tx_stream_seq;            /* the call whose chunks tx_stream_bytes counts */
  uint64_t tx_stream_bytes;          /* eligible bytes sent to the peer in that call */
  int pidfd;                         /* readable once the peer process ended; -1 */
  bool peer_ended;                   /* its process is gone: what it sent is still read */
  bool notice_read;                  /* the peer's failure notice was read */
  uint32_t peer_pid;
  shm_peer_map maps[SHM_PEER_MAPS]; /* the peer's shared buffers, mapped on first use */
  int nmaps;
  int nlent; /* of those, device buffers lent for one call: release_peer_mem's work */
  uint64_t map_uses;
};

struct shm_ctx {
  const weft_transport_init_args *args;
  shm_addr self;
  int nslots;                        /* slots per direction: WEFT_SHM_SLOTS */
  shm_conn **conns;                  /* by shm_conn_index(peer, channel) */
  bool *reachable;                   /* by peer: can_reach said yes, so a lower one may
                                        have made segments this rank never opened */
  int cma_mode;                      /* WEFT_SHM_CMA (shm_settings.h) */
  size_t cma_min_bytes;              /* WEFT_SHM_CMA_MIN_BYTES */
  uint64_t cma_stream_bytes;         /* WEFT_SHM_CMA_STREAM_BYTES; 0 where it cannot apply
                                        (not auto, or ranks outnumber cores) */
  shm_cma_timing cma_timing;         /* this rank's, timed at its first connection (auto) */
  /* this rank's latest call that moved large chunks, and the one before it
   * (shm_recent); calls between them (a barrier) do not count */
  shm_large_call large_now, large_before;
  shm_conn *want_conn;       /* the last connection a data call said AGAIN for */
  enum shm_want want;
  double next_liveness_check;
  uint32_t progress_calls;           /* the clock is read on every SHM_CLOCK_ROUNDS-th */
};

static inline int shm_conn_index(int peer, int channel) {
  return peer * WEFT_TP_CHANNELS + channel;
}
/* The contract's opaque handles are these (transport.h). */
static inline shm_conn *shm_conn_of(weft_tp_conn *c) {
  return (shm_conn *)c;
}
static inline shm_ctx *shm_ctx_of(weft_tp_ctx *c) {
  return (shm_ctx *)c;
}

/* shm_conn.c */
size_t shm_segment_bytes(int nslots, size_t slot_bytes);
void shm_pair_name(char *name, size_t len, uint64_t comm_id, int rank, int peer, int channel);
weft_status shm_conn_create(shm_ctx *ctx, int peer, int channel, const shm_addr *peer_addr,
                            shm_conn **out);
weft_status shm_conn_try_open(shm_conn *c);
void shm_conn_notify_abort(shm_conn *c, const char *reason);
void shm_notice_unopened(shm_ctx *ctx, int peer, int channel, const char *reason);
weft_status shm_conn_take_notice(shm_conn *c);
void shm_conn_destroy(shm_conn *c);
void shm_futex_wake(atomic_uint *word);
void shm_futex_wait(atomic_uint *word, uint32_t expected, int timeout_ms);

/* shm_peer.c: how a connection ends */
/* Takes the pair's name away if it may still be there. */
void shm_conn_unlink(shm_conn *c);
/* Fails the connection with `st` and the sentence for the user. Returns st. */
weft_status shm_conn_fail(shm_conn *c, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
weft_status shm_peer_gone(shm_conn *c); /* the peer's failure notice, if it left one */
void shm_conn_check_peer(shm_conn *c);  /* notes whether the peer process ended */

/* the table's data and memory members */
weft_status shm_send_ready(weft_tp_conn *conn);
weft_status shm_send(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                     const struct weft_mem_ops *mem, unsigned flags);
weft_status shm_send_idle(weft_tp_conn *conn);
weft_status shm_send_released(weft_tp_conn *conn);
weft_status shm_recv_peek(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data);
weft_status shm_recv_release(weft_tp_conn *conn);
weft_status shm_recv(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks);
weft_status shm_register_mem(weft_tp_ctx *ctx, const weft_mem_region *region, weft_tp_mem *handle,
                             weft_mem_desc *desc);
void shm_deregister_mem(weft_tp_ctx *ctx, weft_tp_mem *handle);
weft_status shm_map_peer_mem(weft_tp_conn *conn, const weft_mem_desc *desc, void **local);
void shm_release_peer_mem(weft_tp_conn *conn, bool kept_too);

/* shm_cma.c: single copy (process_vm_readv), its policy and its reads */

/* Single copy's cost in `t`, timed now if it was not (0: it could not be). */
double shm_cma_cost_ratio(shm_cma_timing *t);
bool shm_cma_ratio_pays(double ratio);          /* whether a read this many memcpy beats two copies */
double shm_mix_readv_ns_kib(shm_cma_timing *t); /* the timed read, per KiB (0: not timed) */
/* Whether this host's ranks outnumber its cores (then a stream through
 * single copy is not split: the sender's core is not free); `cores`, when
 * not NULL, gets the count. */
bool shm_ranks_outnumber_cores(const weft_transport_init_args *args, long *cores);
/* Whether single copy pays on this pair (WEFT_SHM_CMA=auto), from the
 * context's timing and the peer's (0: not timed); `why` says so in words. */
bool shm_cma_pays(shm_ctx *ctx, double peer_ratio, char *why, size_t why_len);
/* Lets processes of this user read this one where Yama would refuse them
 * (once per process, with single copy on). */
void shm_cma_allow_readers(void);
/* The pair's agreement: the sender offers (once its FIFOs are mapped), the
 * receiver reads the offer and writes its verdict (on its first look). */
void shm_cma_offer(shm_conn *c);
void shm_cma_decide(shm_conn *c);
/* How a chunk sent for copy travels; only SHM_SEND_COPY_TIMED's copy into
 * the slots is timed, and handed to shm_mix_fold. */
enum shm_send_way { SHM_SEND_COPY, SHM_SEND_COPY_TIMED, SHM_SEND_BY_ADDRESS };
enum shm_send_way shm_cma_send_way(shm_conn *c, size_t bytes, uint32_t seq,
                                   const struct weft_mem_ops *mem);
void shm_mix_fold(shm_conn *c, uint32_t slot, size_t bytes, double secs);
/* A chunk above inline size of call `seq` left on `c`, or came in on it. */
void shm_note_large_tx(shm_conn *c, uint32_t seq);
void shm_note_large_rx(shm_conn *c, uint32_t seq);
/* Where in the peer's process a descriptor cell's chunk of `bytes` lies. */
struct iovec shm_cma_where(const shm_cell *cell, size_t bytes);
/* Copies the chunks that `n` descriptors point at (remote[], in the peer's
 * process) into dst, one after another (host memory): one process_vm_readv
 * for all of them, more only where one came back short. */
weft_status shm_cma_readv(shm_conn *c, const struct iovec *remote, size_t n, void *dst,
                          size_t bytes);
/* One descriptor cell's chunk into dst (host memory). */
weft_status shm_cma_read(shm_conn *c, const shm_cell *cell, void *dst, size_t bytes);

#endif
