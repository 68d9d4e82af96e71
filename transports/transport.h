/* transport.h - what every transport (tcp, shm, ibv) implements.
 *
 * The model: between two ranks a transport carries a FIFO stream of chunks in
 * each direction, one per channel (WEFT_TP_CHANNELS). A chunk is at most
 * `chunk_bytes` long and lands in one of a bounded set of receive slots on
 * the receiver (from the memory table's alloc_slots where the transport
 * owns them, mem.h): TCP fills a slot with socket reads, shared memory with
 * stores, verbs with an RDMA write with immediate. The receiver looks at the
 * oldest filled slot (recv_peek), uses it, and gives it back (recv_release),
 * which returns the credit to the sender. A sender may have at most
 * `send_depth` chunks posted and not yet complete.
 *
 * Every chunk carries the tag of the call it belongs to (its sequence number
 * and its signature: src/base/call_tag.h) and the receiver states how many
 * bytes it expects: a chunk of another call, another signature or another
 * size is WEFT_ERR_MISMATCH (weft_chunk_check), never silently used. A
 * transport carries the tag whole and compares it whole.
 *
 * Rules that hold for every member:
 *  - Nothing blocks except `wait`, and `wait` at most `timeout_ms`.
 *  - WEFT_AGAIN (status.h) means "not now, no error"; negative is an error
 *    after which the connection is dead: later calls on it return an error
 *    again, never crash. The transport writes a human sentence for the error
 *    into its error sink (init args), naming the peer's address if it can.
 *  - Algorithms never see this table: they go through the link functions of
 *    src/algo/algo.h, so they cannot know which transport runs under them.
 *  - Unsupported members point at a stub returning WEFT_ERR_UNSUPPORTED;
 *    the core never tests a member for NULL.
 *  - One thread at a time per context (the communicator's rule), except that
 *    the core's wake fd may be written from any thread to end a `wait`.
 *    Channels do not relax it: every channel of a context is driven by the
 *    same one thread at a time, so p2p on channel 1 needs one driver for
 *    the communicator's collectives and its messages.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "src/base/error_sink.h"
#include "src/mem/mem.h"
#include "weft.h"

/* Bumped whenever a member changes, so an out-of-tree transport (a plugin)
 * built against another layout is refused rather than called wrongly.
 * 4: caps, channels, probe, send_depth reported by the transport, memory
 *    registration by kind with descriptors, opaque handles.
 * 5: send_for_copy.
 * 6: one send with flags (send_for_copy and send_now folded in), one recv
 *    for a chunk or a run (recv_into and recv_run folded in).
 * 7: chunks carry a 64-bit tag (call number and signature, call_tag.h) for
 *    the 32-bit sequence number.
 * 8: the device channel (WEFT_TP_CHANNEL_DEVICE, caps.device_channel, the
 *    init args' device and device_stream). */
#define WEFT_TRANSPORT_ABI 8

/* Longest address blob a transport publishes through the rendezvous. */
#define WEFT_TRANSPORT_ADDR_MAX 160

/* Opaque to the core: each transport defines its own state (tcp_ctx,
 * shm_conn, ...) and converts these pointers to it. Two distinct types, so
 * a context cannot be passed where a connection is expected. */
typedef struct weft_tp_ctx weft_tp_ctx;   /* per communicator */
typedef struct weft_tp_conn weft_tp_conn; /* per (peer, channel) */
struct weft_mem_ops;

/* Channels: independent connections to one peer inside ONE context, each a
 * FIFO stream of its own (its own sequence of chunks, slots and credits),
 * so point-to-point messages need no second context with its own sockets,
 * segments or queue pairs. tcp: a socket per channel, dialed to the same
 * listener with the channel in the handshake; shm: a segment per (pair,
 * channel); ibv: queue pairs per channel in the same device context,
 * protection domain and side listener. A channel costs nothing until
 * connect is called for it. */
/* WEFT_TP_CHANNEL_DEVICE, only where caps.device_channel says so: chunks
 * of device memory, on the GPU the init args name (device, device_stream,
 * set by the core before it connects the channel): `send` reads them from
 * device memory, `recv` writes them into device memory, and recv_peek's
 * *data is device memory, visible to kernels queued on device_stream from
 * the moment recv_peek answers OK (the transport did what the NIC needs for
 * that: a flush). The chunks' tags travel apart (the processor cannot read
 * device memory), and are checked as on every channel. */
#define WEFT_TP_CHANNELS 3
enum { WEFT_TP_CHANNEL_COLL = 0, WEFT_TP_CHANNEL_P2P = 1, WEFT_TP_CHANNEL_DEVICE = 2 };
/* The channels a transport without caps.device_channel is ever asked for
 * (COLL and P2P): what it sizes its shared resources by. */
#define WEFT_TP_HOST_CHANNELS 2

/* A buffer to register (register_mem). */
typedef struct weft_mem_region {
  weft_memory kind;       /* what `ptr` points at */
  void *ptr;              /* first byte; for DEVICE and DMABUF the device address */
  size_t bytes;
  int dmabuf_fd;          /* DMABUF: the fd the GPU driver exported (the caller's: it
                             stays open while registered; never closed here); else -1 */
  uint64_t dmabuf_offset; /* DMABUF: ptr's offset inside the dma-buf */
} weft_mem_region;

/* A registration: the caller's storage, filled by register_mem, tagged
 * with the region's kind; nothing in it is the core's to read but that. */
typedef struct weft_tp_mem {
  weft_mem_region region; /* what was registered; region.kind is the tag */
  uintptr_t priv[2];      /* the transport's: a memory region, a cache entry */
} weft_tp_mem;

/* What a transport can do, fixed for the transport (not per context). */
typedef struct weft_transport_caps {
  /* WEFT_MEMORY_BIT (mem.h) of the kinds `send` may read from and
   * `recv` may write into. Host and shared memory everywhere today; a
   * device kind only where the transport moves it itself (GPUDirect): the
   * core stages other kinds through host memory first. */
  uint32_t send_kinds;
  uint32_t recv_kinds;
  /* Kinds register_mem accepts and, from a peer's descriptor, map_peer_mem
   * maps: shm maps SHARED; nobody else today. */
  uint32_t map_kinds;
  /* True when a small send is a few stores into memory the peer polls: no
   * system call, no wire. Algorithms may then spend more messages to save
   * rounds (the one-round exchange allreduce, src/coll/choose.c). */
  bool sends_are_stores;
  /* True when abort_all reaches every peer, connected or not (tcp leaves its
   * notice at each peer's listener); else only the peers a connection is
   * open to hear it, and a caller that needs every peer to hear opens the
   * connections first (a timeout's culprit exchange, src/engine/engine.c). */
  bool notices_reach_unconnected;
  /* True when WEFT_TP_CHANNEL_DEVICE carries device chunks (above): ibv,
   * straight from and into GPU memory where it is registered (GPUDirect
   * RDMA, transports/ibv/ibv_gdr.c), staged inside the transport where it
   * is not. */
  bool device_channel;
} weft_transport_caps;

typedef struct weft_transport_init_args {
  int rank;
  int size;
  uint64_t comm_id;          /* random per communicator; guards every connection.
                                The rendezvous assigns it after init, before the
                                first connect: read it at connect time. */
  size_t chunk_bytes;        /* largest chunk a send may carry */
  double timeout_s;          /* bound for the connection handshakes */
  int wake_fd;               /* readable when the core wants `wait` to return */
  struct sockaddr_storage local_addr; /* the address this rank reached the rendezvous
                                         from: the default interface for sockets */
  socklen_t local_addr_len;
  weft_error_sink *errors;   /* owned by the core, outlives the context */
  const struct weft_place *place; /* where this rank runs (host, namespaces, devices) */
  const struct weft_auth_key *auth; /* the job key network connections must prove (auth.h) */
  int local_size;            /* ranks on this host; known after the rendezvous, before
                                the first can_reach */
  const struct weft_mem_ops *slot_mem; /* the table whose alloc_slots gives the receive
                                slots and bounce buffers (mem.h; a CUDA build: pinned
                                host memory); NULL: the host table */
  /* The device channel's GPU and the stream its copies go on (the
   * communicator's, src/coll/coll_device.c): device_stream is NULL until
   * the core knows them, which it does before it connects that channel. A transport
   * reads them when it sets the channel up, and a peer's hello for the
   * channel that comes earlier waits for them. */
  int device;
  struct weft_mem_stream *device_stream;
} weft_transport_init_args;

/* What a chunk is for (send's flags); 0: an ordinary chunk, which the
 * receiver may peek or copy and which may start moving at the next
 * progress. */
enum {
  /* The receiver takes it with recv, never recv_peek: a transport that can
   * copy it from `src` straight into the receiver's buffer may post only
   * where it is (shm: a process_vm_readv by the receiver, one copy instead
   * of two). The chunk is then complete (send_idle, and its credit for
   * send_ready) only once the receiver has copied it. A receiver that
   * peeks it anyway still gets it (copied into a slot first). */
  WEFT_SEND_FOR_COPY = 1u << 0,
  /* On a pipeline's path (a ring's or a chain's next hop waits for it):
   * this chunk and those posted before it on the connection start moving
   * now, not at the next progress. */
  WEFT_SEND_NOW = 1u << 1,
};

typedef struct weft_transport {
  uint32_t abi_version; /* WEFT_TRANSPORT_ABI */
  const char *name;     /* "tcp"; also the folder and the function prefix */
  weft_transport_caps caps;

  /* Whether this transport can run on this machine, with a sentence for
   * weft-info in `why` either way (verbs: library and devices; shm: /dev/shm
   * and its free space; tcp: the interfaces). Creates no context, opens no
   * listener, may read settings; cheap enough to call once per process.
   * WEFT_OK when init would be worth trying, WEFT_ERR_UNSUPPORTED when not.
   * It does not promise that init succeeds (a peer's view still matters). */
  weft_status (*probe)(char *why, size_t why_len);

  /* Creates the transport's state for one communicator and writes, into
   * `addr` (WEFT_TRANSPORT_ADDR_MAX bytes), what a peer needs to connect to
   * this rank; the rendezvous hands it to every peer. Does not block.
   * Returns WEFT_ERR_UNSUPPORTED when the transport cannot run here at all
   * (no device, no library), with the reason in the error sink. `args` is
   * owned by the core and outlives the context: keep the pointer. */
  weft_status (*init)(const weft_transport_init_args *args, weft_tp_ctx **ctx, void *addr,
                      size_t *addr_len);

  /* Chunks a sender may have posted and not complete on one connection
   * (send_ready answers WEFT_AGAIN beyond it, and may earlier: shm's 64
   * cells hold at most WEFT_SHM_SLOTS chunks in its slots, where chunks by
   * single copy and inline ones hold none). The transport alone decides
   * it, at init (shm: 64; tcp and ibv: 8), the same for every
   * connection and channel of the context; the core reads it here and never
   * passes a depth of its own. */
  int (*send_depth)(const weft_tp_ctx *ctx);

  /* Whether this transport can carry data to `peer`, given its published
   * address, with the reason in `why` (shown by weft_comm_peer_transport).
   * Pure and cheap: selection asks every transport in order. Both ranks of a
   * pair must reach the same answer from the same published facts. The
   * answer covers every channel. */
  bool (*can_reach)(weft_tp_ctx *ctx, int peer, const void *peer_addr, size_t addr_len,
                    char *why, size_t why_len);

  /* Pure: whether the rank that published `peer_addr` (any rank, this one
   * too) carries device chunks on WEFT_TP_CHANNEL_DEVICE: its settings
   * allow the channel (ibv: WEFT_IB_GDR is not off). The core routes calls
   * on device buffers over the channel only where every rank says so, from
   * the same published facts on every rank. Stub: false. */
  bool (*publishes_device_channel)(const void *peer_addr, size_t addr_len);

  /* Starts the connection to `peer` on `channel` (< WEFT_TP_CHANNELS, else
   * WEFT_ERR_INVALID) and returns its handle at once; the connection
   * finishes in later calls (data calls return WEFT_AGAIN until it is up).
   * Both ranks of a pair call connect for each other on the channels they
   * use; the transport decides who dials. Calling it again for the same
   * (peer, channel) returns the same handle. The handle lives until fini.
   * Channels of one peer share nothing a caller can see: chunks, sequence
   * numbers, slots and credits are per channel; failure of one (a peer's
   * process ending, abort_all) fails them all. */
  weft_status (*connect)(weft_tp_ctx *ctx, int peer, int channel, const void *peer_addr,
                         size_t addr_len, weft_tp_conn **conn);

  /* WEFT_OK if `send` would accept a chunk now, WEFT_AGAIN if send_depth
   * chunks are still in flight or the connection is not up yet. */
  weft_status (*send_ready)(weft_tp_conn *conn);

  /* Posts one chunk of `bytes` (<= chunk_bytes, may be 0) tagged `tag`,
   * only after send_ready said OK. `flags` (WEFT_SEND_*, below) say what the
   * chunk is for; the transport decides how to move it. `src` (memory
   * described by `mem`, whose kind is in caps.send_kinds) stays unchanged
   * until send_idle reports the chunk complete, or until the peer has
   * released it (causality: a released chunk was read). Without
   * WEFT_SEND_NOW the bytes may start moving only at the next progress or
   * send_idle (tcp leaves large chunks for then, to write what an algorithm
   * posted at once in one system call). */
  weft_status (*send)(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                      const struct weft_mem_ops *mem, unsigned flags);

  /* WEFT_OK when every posted chunk is complete (its source may be reused),
   * WEFT_AGAIN otherwise. Drives the sends forward. */
  weft_status (*send_idle)(weft_tp_conn *conn);

  /* Optional (NULL where the transport cannot tell): WEFT_OK once the peer
   * has released (recv_release) every chunk posted on this connection,
   * WEFT_AGAIN before. Stronger than send_idle, which a copy into a slot
   * satisfies: a sender that lent memory in a chunk's descriptor (a device
   * buffer over CUDA IPC, src/engine/p2p.c) learns here that the receiver,
   * which releases that chunk only after its copy out of the buffer, is
   * done with it. shm: the receiver's released count. */
  weft_status (*send_released)(weft_tp_conn *conn);

  /* The oldest received chunk, in place: it must be tagged `tag` and be
   * `bytes` long, else WEFT_ERR_MISMATCH. `*data` (host memory) stays valid
   * until recv_release. WEFT_AGAIN when it has not (completely) arrived.
   * Calling it again before release returns the same chunk. Drives
   * receiving forward. */
  weft_status (*recv_peek)(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data);

  /* Gives the slot of the chunk returned by recv_peek back to the sender. */
  weft_status (*recv_release)(weft_tp_conn *conn);

  /* Copies received chunks into `dst` (kind from `mem`, in
   * caps.recv_kinds): the next chunks of a run of `bytes` that the sender
   * cut into chunks of `chunk_bytes` (the last may be shorter), all tagged
   * `tag`, placed one after another from `dst`. One chunk is a run with
   * chunk_bytes == bytes. Takes at least one chunk (WEFT_AGAIN until the
   * first is whole) and at most as many as have arrived whole, and sets
   * *chunks to how many; a transport that reads a run at once (shm: one
   * process_vm_readv for many descriptors) takes them all, others one.
   * Each chunk is checked as recv_peek checks it; on a mismatch the ones
   * before it may have been taken. A transport may place a chunk straight
   * into `dst` (tcp reads the socket into it): between the first call that
   * returned WEFT_AGAIN and WEFT_OK the first chunk's bytes may be partly
   * written, and no other receive may be started on this connection. */
  weft_status (*recv)(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                      const struct weft_mem_ops *mem, size_t *chunks);

  /* Registers `region` with this context and fills `*handle` (the caller's
   * storage, tagged with region->kind); with `desc` non-NULL also writes
   * the descriptor a peer passes to map_peer_mem (mem.h: fixed size,
   * versioned, kind-tagged). WEFT_ERR_UNSUPPORTED for a kind not in
   * caps.map_kinds (the stub refuses every kind); WEFT_ERR_INVALID when the
   * region is not of its kind (SHARED: not inside one weft_mem_alloc
   * allocation). Never blocks; a failure leaves the context usable.
   * shm registers SHARED from the registry of weft_mem_alloc: nothing is
   * pinned, the handle holds nothing to release.
   * ibv keeps its own cache of host registrations for zero-copy sends
   * (ibv_mr.c) and does not take this path yet. A device kind registers
   * there as: DEVICE through ibv_reg_mr where nvidia-peermem is loaded;
   * DMABUF through ibv_reg_dmabuf_mr(pd, dmabuf_offset, bytes, ptr as the
   * iova, dmabuf_fd, access); the MR goes in priv[0], and the descriptor
   * (for RDMA to it) carries address, length and rkey. */
  weft_status (*register_mem)(weft_tp_ctx *ctx, const weft_mem_region *region, weft_tp_mem *handle,
                              weft_mem_desc *desc);

  /* Undoes register_mem; a handle the stub refused, or one already
   * deregistered (its kind is then WEFT_MEMORY_COUNT), is a no-op. Peers'
   * mappings of it are theirs (map_peer_mem) and outlive this. */
  void (*deregister_mem)(weft_tp_ctx *ctx, weft_tp_mem *handle);

  /* Maps memory a peer registered and described in `desc` (which the peer
   * sent in a chunk) into this process and points *local at the buffer's
   * first byte. Mappings are cached per connection and last until fini, so
   * they stay valid even if the peer frees or crashes. A failure leaves the
   * connection usable. WEFT_ERR_UNSUPPORTED when `desc`'s kind is not in
   * caps.map_kinds (only shm maps anything: SHARED itself, DEVICE through the
   * memory table's map_peer, CUDA IPC, where the build and host have a
   * driver, else WEFT_ERR_UNSUPPORTED); WEFT_ERR_PROTOCOL when
   * the descriptor is malformed, of another version or does not fit what is
   * mapped; WEFT_ERR_SYSTEM when the kernel refuses (the sentence in the
   * error sink). Never blocks. */
  weft_status (*map_peer_mem)(weft_tp_conn *conn, const weft_mem_desc *desc, void **local);

  /* Closes this connection's mappings (map_peer_mem) of device memory the
   * peer lent for one call (a descriptor without WEFT_MEM_DESC_KEEP), and
   * with `kept_too` of every device buffer of the peer (weft_comm_
   * deregister): the caller's work on them is done, and the peer may free
   * that memory once its call ends, which it cannot before this rank says
   * so. Never blocks, never fails; nothing where nothing is mapped. */
  void (*release_peer_mem)(weft_tp_conn *conn, bool kept_too);

  /* Non-blocking: moves pending sends forward, accepts connections.
   * Sets *progressed when anything moved. */
  weft_status (*progress)(weft_tp_ctx *ctx, bool *progressed);

  /* Sleeps until a connection that a data call returned WEFT_AGAIN for can
   * move, the wake fd is readable, or `timeout_ms` passed. Never longer.
   * With 0 it does not sleep but looks at everything a wait watches (peers'
   * notices, listeners, peers' processes): a notice it read is its status,
   * one waiting to be read (tcp's listener) is for the next progress. The
   * engine calls that on every transport it did not sleep on, after each
   * sleep (at most every 10 ms). */
  weft_status (*wait)(weft_tp_ctx *ctx, int timeout_ms);

  /* Best effort, bounded (tcp: at most about 1 s, when it dials peers it
   * had no connection to and a host does not answer): tells every peer that
   * this rank failed, with `reason`, so they fail now instead of at their
   * timeout.
   * Connections (every channel) are unusable afterwards. */
  void (*abort_all)(weft_tp_ctx *ctx, const char *reason);

  /* Releases everything: connections, sockets, memory. Never blocks. */
  void (*fini)(weft_tp_ctx *ctx);
} weft_transport;

/* recv for a transport that copies one chunk per call: the run's first
 * chunk through `into` (its recv_peek-checked copy into dst). */
static inline weft_status weft_tp_recv_first(weft_status (*into)(weft_tp_conn *conn, weft_tag tag,
                                                                 size_t bytes, void *dst,
                                                                 const struct weft_mem_ops *mem),
                                             weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes,
                                             size_t bytes, void *dst,
                                             const struct weft_mem_ops *mem, size_t *chunks) {
  weft_status st = into(conn, tag, bytes < chunk_bytes ? bytes : chunk_bytes, dst, mem);
  *chunks = st == WEFT_OK ? 1 : 0;
  return st;
}

/* Stubs for the registration members of transports that cannot reach a
 * peer's memory: every kind is WEFT_ERR_UNSUPPORTED. */
weft_status weft_tp_no_register(weft_tp_ctx *ctx, const weft_mem_region *region,
                                weft_tp_mem *handle, weft_mem_desc *desc);
void weft_tp_no_deregister(weft_tp_ctx *ctx, weft_tp_mem *handle);
weft_status weft_tp_no_map(weft_tp_conn *conn, const weft_mem_desc *desc, void **local);
void weft_tp_no_release(weft_tp_conn *conn, bool kept_too);
bool weft_tp_no_device_channel(const void *peer_addr, size_t addr_len);

/* The transports built into this library. */
extern const weft_transport weft_transport_shm;
extern const weft_transport weft_transport_tcp;
#ifdef WEFT_HAVE_IBV
extern const weft_transport weft_transport_ibv; /* built when rdma-core's headers are found */
#endif

#endif
