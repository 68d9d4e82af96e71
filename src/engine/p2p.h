/* p2p.h - point-to-point messages (weft_send / weft_recv) on their own lane:
 * channel WEFT_TP_CHANNEL_P2P of the communicator's own transport contexts
 * (transport.h), a FIFO of its own beside the collectives' channel, so a
 * message never sits in front of a collective's chunks (or behind them).
 * One driver moves both (engine.c): the same call lock, progress thread and
 * transport wait.
 *
 * On the wire a message is a 16-byte header chunk (tag, dtype, bytes) then
 * its data in chunks of at most chunk_bytes, all tagged with the message's
 * number on that pair and direction, so the transport's tag check catches a
 * lost or extra message. The receiver takes the messages of each peer in
 * order: a header whose tag a posted receive wants goes straight into that
 * buffer; any other is kept (unexpected) until its receive is posted. */
#ifndef WEFT_P2P_H
#define WEFT_P2P_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/mem/mem.h"
#include "weft.h"

typedef struct weft_core weft_core;
typedef struct weft_request weft_request;
typedef struct weft_p2p_unexpected weft_p2p_unexpected;
typedef struct weft_device_msg weft_device_msg;

#define WEFT_P2P_HEADER_BYTES 16

/* One send or receive. */
typedef struct weft_p2p_op {
  const char *call; /* "weft_send", "weft_recv": for messages */
  int peer, tag;
  weft_dtype dtype;
  size_t count, bytes;
  const void *send_buf;
  void *recv_buf;
  size_t moved; /* bytes of data sent or received so far */
  bool header_moved;
  uint8_t header[WEFT_P2P_HEADER_BYTES]; /* send: what goes first */
  /* a device buffer: staged through pinned host memory (coll_device.h),
   * send_buf / recv_buf being the staged copy; or, a send `lent` within a
   * host, its descriptor sent instead of its data (p2p.c) */
  weft_device_msg *dev;
  bool lent, desc_moved;
  weft_mem_desc desc;
} weft_p2p_op;

/* The lane's state, one per communicator (p2p.c), in comm->engine->lane.
 *
 * Failures: one the lane finds itself (a message of another size or dtype,
 * a malformed header, no memory for an unexpected message, no progress of
 * its messages for the timeout, a transport error on a channel-1
 * connection) fails the lane only: its outstanding and later sends and
 * receives complete with it, the collectives go on. A failure of the
 * communicator (peer lost, abort, a collective's) fails the lane too. */
typedef struct weft_p2p_lane weft_p2p_lane;

weft_status weft_p2p_lane_create(weft_core *comm);
void weft_p2p_lane_free(weft_core *comm);

/* Called by the engine, which holds the call lock: takes newly posted
 * requests, moves every peer's messages as far as they go, completes what
 * is done. A failure of the lane's own fails the lane only (above). */
void weft_p2p_pass(weft_core *comm);
/* Whether anything is outstanding (under the queue lock). */
bool weft_p2p_busy(weft_core *comm);
/* A peer the lane waits for, for the transport's wait and for messages; -1 if none. */
int weft_p2p_waiting_peer(weft_core *comm, const char **what);
/* The lane's own timeout, at the driver's clock reading `now` (idle rounds
 * only): nothing of the lane moved for the communicator's timeout while
 * messages were outstanding fails the lane. Returns the seconds left before
 * that (a large value while the lane is idle), for the driver's sleep. */
double weft_p2p_clock(weft_core *comm, double now);
/* Completes every outstanding send and receive with `st` (the
 * communicator failed). */
void weft_p2p_fail_all(weft_core *comm, weft_status st);
/* Hands a new request to the lane (under the queue lock). */
void weft_p2p_post(weft_request *req);

/* Checks a weft_send / weft_recv (is_send false) on the core of a user's
 * communicator the caller found live, `comm`, and fills `r` as a request on
 * it; an error has its sentence written. The caller then submits it to the
 * engine. */
weft_status weft_p2p_setup(weft_request *r, weft_core *comm, const char *call, bool is_send,
                           const void *buf, size_t count, weft_dtype dtype, int peer, int tag);

#endif
