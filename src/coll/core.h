/* core.h - the part of a communicator that call setup (coll.c), the engine
 * and p2p (src/engine) read and write: its ranks and hosts, its peer table
 * (src/link/comm_link.h), its failure state, the call counter, the
 * algorithm choice and the flight recorder. The communicator
 * (src/comm/comm.h) embeds one and fills it; the layers below it see a
 * communicator only as its core, so none of them includes comm.h. */
#ifndef WEFT_CORE_H
#define WEFT_CORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/algo/algo.h"
#include "src/coll/choose.h"
#include "src/coll/recorder.h"
#include "src/link/comm_link.h"
#include "weft.h"

/* Failure: sticky, so every later call fails fast with the first cause. */
/* How a communicator was stopped from outside a call (weft_fail.aborted). */
enum { WEFT_STOP_ABORT = 1, WEFT_STOP_REVOKE = 2 };

typedef struct weft_fail {
  /* 0, or WEFT_STOP_ABORT (weft_comm_abort) or WEFT_STOP_REVOKE
   * (weft_comm_revoke), from any thread: weft_fail_stopped says the status */
  atomic_int aborted;
  weft_status failed;   /* sticky first failure, 0 while healthy */
  double timeout_s;     /* no progress for this long fails the communicator */
  char last_error[768]; /* what weft_last_error returns */
} weft_fail;

/* The status and the sentence of a stopped communicator (aborted != 0). */
static inline weft_status weft_fail_stopped(int how) {
  return how == WEFT_STOP_REVOKE ? WEFT_ERR_REVOKED : WEFT_ERR_ABORTED;
}
static inline const char *weft_fail_stopped_words(int how) {
  return how == WEFT_STOP_REVOKE ? "the communicator was revoked (weft_comm_revoke)"
                                 : "the communicator was aborted";
}

struct weft_engine;

typedef struct weft_core {
  int rank;
  int size;
  size_t chunk_bytes;
  /* hosts, for hierarchical algorithms (weft_hosts: ranks in ascending
   * order); hosts.local_size is the number of ranks on this host */
  weft_hosts hosts;
  weft_peer_table links; /* transports and peers */
  weft_fail fail;
  /* calls */
  uint32_t seq;     /* collective call counter, the same on every rank */
  bool check_calls; /* WEFT_CHECK: compare fingerprints before every collective */
  /* f32 sum/avg data crossing hosts travels as this (WEFT_BF16, WEFT_F16;
   * WEFT_F32: exact): WEFT_WIRE_DTYPE, or weft_comm_set_wire_dtype; coll.c
   * decides per call (weft_coll.wire) */
  weft_dtype wire;
  weft_choice_state choice; /* algorithm choice: its settings and memory */
  weft_recorder recorder;   /* the last calls, for the flight recorder */
  /* device buffers (coll_device.c): the stream and staging of this
   * communicator's device calls (NULL until the first), and the user's CUDA
   * stream they are ordered on (weft_comm_set_stream; NULL: the default) */
  struct weft_coll_device *device;
  void *user_stream;
  /* Calls on device buffers take the device channel (transport.h): every
   * pair of ranks is linked by a transport that carries device chunks
   * (verbs: GPUDirect RDMA), so the algorithms run on the buffers where
   * they lie (route WEFT_ROUTE_DEVICE_CHANNEL). Decided once, at init, from
   * what every rank published, so every rank decides alike. */
  bool device_channel_all;
  /* Allreduces and broadcasts on device buffers take CUDA IPC within a
   * host and the device channel between hosts (src/algo/hier_device.c):
   * several hosts, shm within each, the device channel across, decided as
   * the above. */
  bool device_channel_hier;
  /* the transports' init args (the communicator's): the device channel's
   * GPU and stream are set there before its first connection */
  weft_transport_init_args *tp_args;
  /* weft.h's rule "a communicator is used by one thread at a time", checked
   * where it costs nothing (src/api/api.h): set while a thread is inside a
   * call, and how many calls found it set */
  atomic_int in_call;
  atomic_uint clashes;
  /* the engine's part (src/engine/engine_state.h), held beside this core in
   * the same communicator; only the engine reads it */
  struct weft_engine *engine;
  /* The stall probe (src/comm/probe.c, passed down: the communicator owns
   * the control plane it runs over). A driver whose collective has moved
   * nothing for a while calls it with the head call, the peer it waits
   * on (-1: none known) and how long it has been idle, every few tens of
   * milliseconds (never while data flows): it answers its peers' questions
   * and, past WEFT_STALL_PROBE, asks them which call they are in.
   * WEFT_ERR_MISMATCH, its sentence in links.sink.msg, when a peer is in
   * another call of the same number, or the peer it waits on is past this
   * call; WEFT_OK to wait on. NULL: no probe. */
  weft_status (*stall_probe)(struct weft_core *core, const weft_coll *head, int waits_on,
                             double idle_s);
} weft_core;

/* Records a failure on `core` with the sentence the user reads (its
 * last_error): it starts with the rank and the call. Returns st. */
weft_status weft_core_error(weft_core *core, weft_status st, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
