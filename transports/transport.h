/* transport.h - what every transport (tcp now; shm, ibv later) implements.
 *
 * The model: between two ranks a transport carries a FIFO stream of chunks in
 * each direction. A chunk is at most `chunk_bytes` long and lands in one of a
 * bounded set of receive slots on the receiver: TCP fills a slot with socket
 * reads, shared memory with stores, verbs with an RDMA write with immediate.
 * The receiver looks at the oldest filled slot (recv_peek), uses it, and gives
 * it back (recv_release), which returns the credit to the sender. A sender
 * may have at most `send_depth` chunks posted and not yet complete.
 *
 * Every chunk carries the sequence number of the collective it belongs to and
 * the receiver states how many bytes it expects: a chunk of another call or
 * of another size is WEFT_ERR_MISMATCH, never silently used.
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
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "src/base/error_sink.h"
#include "src/mem/shared_mem.h"
#include "weft.h"

/* Bumped whenever a member changes, so an out-of-tree transport (a plugin)
 * built against another layout is refused rather than called wrongly. */
#define WEFT_TRANSPORT_ABI 3

/* Longest address blob a transport publishes through the rendezvous. */
#define WEFT_TRANSPORT_ADDR_MAX 160

typedef struct weft_transport_ctx weft_transport_ctx; /* per communicator */
typedef struct weft_conn weft_conn;                   /* per peer */
struct weft_mem_ops;

/* map_peer_mem for transports that cannot reach a peer's memory. */
weft_status weft_transport_no_map(weft_conn *conn, const weft_mem_key *key, void **local);

typedef struct weft_transport_init_args {
  int rank;
  int size;
  uint64_t comm_id;          /* random per communicator; guards every connection.
                                The rendezvous assigns it after init, before the
                                first connect: read it at connect time. */
  size_t chunk_bytes;        /* largest chunk a send may carry */
  int send_depth;            /* chunks a sender may have in flight per peer */
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
} weft_transport_init_args;

typedef struct weft_transport {
  uint32_t abi_version; /* WEFT_TRANSPORT_ABI */
  const char *name;     /* "tcp"; also the folder and the function prefix */

  /* True when a small send is a few stores into memory the peer polls: no
   * system call, no wire. Algorithms may then spend more messages to save
   * rounds (coll.c picks the one-round exchange allreduce only when every
   * peer's transport says so: over loopback TCP its extra sends cost more
   * than the round they save, 50 against 43 us at 4 ranks). */
  bool sends_are_stores;

  /* Creates the transport's state for one communicator and writes, into
   * `addr` (WEFT_TRANSPORT_ADDR_MAX bytes), what a peer needs to connect to
   * this rank; the rendezvous hands it to every peer. Does not block.
   * Returns WEFT_ERR_UNSUPPORTED when the transport cannot run here at all
   * (no device, no library), with the reason in the error sink. `args` is
   * owned by the core and outlives the context: keep the pointer. */
  weft_status (*init)(const weft_transport_init_args *args, weft_transport_ctx **ctx, void *addr,
                      size_t *addr_len);

  /* Whether this transport can carry data to `peer`, given its published
   * address, with the reason in `why` (shown by weft_comm_peer_transport).
   * Pure and cheap: selection asks every transport in order. Both ranks of a
   * pair must reach the same answer from the same published facts. */
  bool (*can_reach)(weft_transport_ctx *ctx, int peer, const void *peer_addr, size_t addr_len,
                    char *why, size_t why_len);

  /* Starts a connection to `peer` and returns its handle at once; the
   * connection finishes in later calls (data calls return WEFT_AGAIN until it
   * is up). Both ranks of a pair call connect for each other; the transport
   * decides who dials. The handle lives until fini. */
  weft_status (*connect)(weft_transport_ctx *ctx, int peer, const void *peer_addr,
                         size_t addr_len, weft_conn **conn);

  /* WEFT_OK if `send` would accept a chunk now, WEFT_AGAIN if `send_depth`
   * chunks are still in flight or the connection is not up yet. */
  weft_status (*send_ready)(weft_conn *conn);

  /* Posts one chunk of `bytes` (<= chunk_bytes, may be 0) tagged `seq`.
   * Only after send_ready said OK. `src` (memory described by `mem`) must
   * stay unchanged until send_idle reports the chunk complete, or until the
   * peer has released it (causality: a released chunk was read). */
  weft_status (*send)(weft_conn *conn, const void *src, size_t bytes, uint32_t seq,
                      const struct weft_mem_ops *mem);

  /* WEFT_OK when every posted chunk is complete (its source may be reused),
   * WEFT_AGAIN otherwise. Drives the sends forward. */
  weft_status (*send_idle)(weft_conn *conn);

  /* The oldest received chunk: it must be tagged `seq` and be `bytes` long,
   * else WEFT_ERR_MISMATCH. `*data` stays valid until recv_release. WEFT_AGAIN
   * when it has not (completely) arrived. Calling it again before release
   * returns the same chunk. Drives receiving forward. */
  weft_status (*recv_peek)(weft_conn *conn, uint32_t seq, size_t bytes, const void **data);

  /* Gives the slot of the chunk returned by recv_peek back to the sender. */
  weft_status (*recv_release)(weft_conn *conn);

  /* Like recv_peek + copy into `dst` + recv_release, but a transport may
   * place the chunk straight into `dst` (TCP reads the socket into it).
   * WEFT_AGAIN until the whole chunk is in `dst`; then WEFT_OK once. Between
   * the first call and WEFT_OK, `dst` may be partly written and no other
   * receive may be started on this connection. */
  weft_status (*recv_into)(weft_conn *conn, uint32_t seq, size_t bytes, void *dst,
                           const struct weft_mem_ops *mem);

  /* Maps memory a peer shares through weft_mem_alloc, described by `key`
   * (which the peer sent in a chunk), into this process and points *local at
   * the buffer's first byte. Mappings are cached per connection and last
   * until fini, so they stay valid even if the peer frees or crashes. A
   * failure leaves the connection usable. WEFT_ERR_UNSUPPORTED when this
   * transport cannot reach a peer's memory (only shm can); WEFT_ERR_PROTOCOL
   * when the key does not fit what is mapped; WEFT_ERR_SYSTEM when the
   * kernel refuses (the sentence in the error sink). Never blocks. */
  weft_status (*map_peer_mem)(weft_conn *conn, const weft_mem_key *key, void **local);

  /* Non-blocking: moves pending sends forward, accepts connections.
   * Sets *progressed when anything moved. */
  weft_status (*progress)(weft_transport_ctx *ctx, bool *progressed);

  /* Sleeps until a connection that a data call returned WEFT_AGAIN for can
   * move, the wake fd is readable, or `timeout_ms` passed. Never longer. */
  weft_status (*wait)(weft_transport_ctx *ctx, int timeout_ms);

  /* Best effort, does not block: tells every connected peer that this rank
   * failed, with `reason`, so they fail now instead of at their timeout.
   * Connections are unusable afterwards. */
  void (*abort_all)(weft_transport_ctx *ctx, const char *reason);

  /* Releases everything: connections, sockets, memory. Never blocks. */
  void (*fini)(weft_transport_ctx *ctx);
} weft_transport;

/* The transports built into this library. */
extern const weft_transport weft_transport_shm;
extern const weft_transport weft_transport_tcp;
#ifdef WEFT_HAVE_IBV
extern const weft_transport weft_transport_ibv; /* built when rdma-core's headers are found */
#endif

#endif
