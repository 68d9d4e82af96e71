/* recorder.h - the flight recorder: the last calls of each communicator
 * (what, how big, which algorithm, when issued, started and ended, what it
 * waited for, how it ended), kept in a ring and printed when a call times
 * out, when the communicator is aborted, and on SIGUSR1, so a stuck job
 * tells where each rank is. */
#ifndef WEFT_RECORDER_H
#define WEFT_RECORDER_H

#include <stdint.h>

#include "weft.h"

typedef struct weft_coll_task weft_coll_task; /* coll.h */

typedef enum weft_rec_state {
  WEFT_REC_QUEUED,
  WEFT_REC_RUNNING,
  WEFT_REC_DONE,
  WEFT_REC_FAILED
} weft_rec_state;

typedef struct weft_rec_entry {
  uint32_t seq;
  const char *call, *algo;
  size_t count;
  weft_dtype dtype;
  weft_op op;
  int root;
  weft_rec_state state;
  double issued, started, ended; /* weft_now() seconds; 0 = not yet */
  int waiting_peer;
  const char *waiting_for;
  weft_status status;
} weft_rec_entry;

typedef struct weft_recorder {
  weft_rec_entry *ring;
  uint32_t cap;  /* 0: off */
  uint32_t at;   /* next % cap: the entry the next call takes (no division per call) */
  uint64_t next; /* entries ever recorded */
} weft_recorder;

/* Sized by WEFT_RECORDER; never fails (off when there is no memory). */
void weft_recorder_init(weft_recorder *rec);
void weft_recorder_free(weft_recorder *rec);
/* A call was issued (seq taken, algorithm chosen); its entry's index goes
 * to task->rec_slot. task->issued may still be 0: the engine takes the
 * time when it queues the call and reports it with weft_recorder_issued. */
void weft_recorder_issue(weft_recorder *rec, weft_coll_task *task);
/* task->issued is known now. */
void weft_recorder_issued(weft_recorder *rec, const weft_coll_task *task);
/* The call's state changed at `now` (weft_now(); 0: read the clock here, if
 * the recorder is on); a no-op once the call's entry was reused.
 * Callers that already hold the time pass it: a clock read is a fair part
 * of a small collective (docs/tuning.md, "Clock reads on a small call's path"). */
void weft_recorder_update(weft_recorder *rec, const weft_coll_task *task, weft_rec_state state,
                          weft_status status, double now);
/* Prints the ring of rank `rank` of `size` to stderr, oldest first, with `why`. */
void weft_recorder_dump(const weft_recorder *rec, int rank, int size, const char *why);
/* SIGUSR1 sets a flag; drivers print every live communicator's ring at
 * their next round (a signal handler may not format or lock), through
 * `dump_all`: the recorder does not know the communicators, their owner
 * (comm.c) passes it down. Installed once, only where SIGUSR1 still has its
 * default action. */
void weft_recorder_install_signal(void (*dump_all)(const char *why));
/* Called by drivers every round: prints if SIGUSR1 arrived. */
void weft_recorder_poll_signal(void);

#endif
