/* engine_state.h - the engine's part of a communicator: the queue of
 * collectives, who drives (the call lock, the progress thread), the
 * driver's clock and its tuning, and the p2p lane's state. Defined here,
 * alone, so that the communicator (comm.h) can hold it without including
 * the engine; the communicator's core (src/coll/core.h) points at it. */
#ifndef WEFT_ENGINE_STATE_H
#define WEFT_ENGINE_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct weft_request;
struct weft_p2p_lane;

typedef struct weft_engine {
  pthread_mutex_t call_lock; /* held while a call drives the transport */
  int wake_fd;               /* eventfd: abort, or a caller that wants to drive, ends a wait */
  pthread_mutex_t q_lock;    /* guards the queue, the lane's new posts, the thread's flags */
  pthread_cond_t q_cond;     /* the progress thread sleeps here while idle or stepping aside */
  /* collectives in issue order; the head runs. Written under q_lock; the
   * driver reads q_head without it (engine.c, queue_pass) */
  _Atomic(struct weft_request *) q_head;
  struct weft_request *q_tail;
  pthread_t progress;
  bool progress_started, progress_stop;
  atomic_bool progress_driving; /* the thread holds call_lock: wake its transport wait */
  atomic_int drivers_waiting;   /* callers that want call_lock: the thread steps aside */
  double last_moved;            /* when anything last moved while work was outstanding */
  double others_looked_at;      /* when the transports not slept on last looked (drive) */
  atomic_bool coll_restart;     /* a collective was queued beside waiting messages: the
                                   driver restarts last_moved at its next reading */
  /* the driver's clock (engine.c): its last reading, and the drive round it
   * was taken in (rounds counts them), so a round can reuse a fresh one;
   * clock_ok: taken in this drive and since its last yield or sleep */
  double clock;
  uint64_t rounds, clock_round;
  bool clock_ok;
  int spin_us;  /* a waiting driver spins this long, */
  int yield_us; /* then sched_yields this long before sleeping */
  /* called once per blocking wait before its first yield: the communicator
   * keeps its rank on the CPU it chose (comm.c, weft_spread_keep); NULL: nothing */
  void (*keep_place)(void);
  /* the point-to-point lane (p2p.h): messages on channel WEFT_TP_CHANNEL_P2P
   * of this communicator's own connections, driven beside its collectives */
  struct weft_p2p_lane *lane;
} weft_engine;

#endif
