/* recorder.c - see recorder.h. The ring is written only by the thread that
 * issues calls (issue) and by the driver (update), both under the
 * communicator's rules; a dump from a driver reads a consistent-enough
 * picture for a human, and never blocks. */
#include "src/coll/recorder.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/algo/algo.h"
#include "src/coll/coll.h"
#include "src/base/net.h"
#include "src/base/settings.h"

void weft_recorder_init(weft_recorder *rec) {
  long long cap = weft_settings()->recorder;
  rec->cap = 0;
  rec->at = 0;
  rec->next = 0;
  rec->ring = NULL;
  if (cap <= 0) return;
  if (cap > 100000) cap = 100000;
  rec->ring = calloc((size_t)cap, sizeof *rec->ring);
  if (rec->ring) rec->cap = (uint32_t)cap;
}

void weft_recorder_free(weft_recorder *rec) {
  free(rec->ring);
  rec->ring = NULL;
  rec->cap = 0;
}

void weft_recorder_issue(weft_recorder *rec, weft_coll_task *task) {
  if (!rec->cap) return;
  const weft_coll *coll = &task->coll;
  task->rec_slot = rec->at;
  weft_rec_entry *e = &rec->ring[rec->at];
  if (++rec->at == rec->cap) rec->at = 0;
  rec->next++;
  *e = (weft_rec_entry){.seq = coll->seq,
                        .call = coll->call,
                        .algo = coll->algo,
                        .count = coll->count,
                        .dtype = coll->dtype,
                        .op = coll->op,
                        .root = coll->root,
                        .state = WEFT_REC_QUEUED,
                        .issued = task->issued,
                        .waiting_peer = -1};
}

/* The call's entry, or NULL once a later call took it (the ring wrapped). */
static weft_rec_entry *entry_of(weft_recorder *rec, const weft_coll_task *task) {
  if (!rec->cap || task->rec_slot >= rec->cap) return NULL;
  weft_rec_entry *e = &rec->ring[task->rec_slot];
  return e->seq == task->coll.seq && e->call == task->coll.call ? e : NULL;
}

void weft_recorder_issued(weft_recorder *rec, const weft_coll_task *task) {
  weft_rec_entry *e = entry_of(rec, task);
  if (e) e->issued = task->issued;
}

void weft_recorder_update(weft_recorder *rec, const weft_coll_task *task, weft_rec_state state,
                          weft_status status, double now) {
  weft_rec_entry *e = entry_of(rec, task);
  if (!e) return;
  if (now == 0) now = weft_now();
  if (state == WEFT_REC_RUNNING && !e->started) e->started = now;
  if (state >= WEFT_REC_DONE) e->ended = now;
  e->state = state;
  e->status = status;
  e->algo = task->coll.algo; /* what actually ran: direct may have become the ring */
  e->waiting_peer = task->waiting_peer;
  e->waiting_for = task->waiting_for;
}

static const char *state_name(weft_rec_state s) {
  static const char *const names[] = {"queued", "running", "done", "FAILED"};
  return names[s];
}

void weft_recorder_dump(const weft_recorder *rec, int rank, int size, const char *why) {
  if (!rec->cap) return;
  double now = weft_now();
  uint64_t first = rec->next > rec->cap ? rec->next - rec->cap : 0;
  fprintf(stderr,
          "weft rank %d/%d flight recorder (%s): last %llu of %llu calls, times in ms before now\n",
          rank, size, why, (unsigned long long)(rec->next - first), (unsigned long long)rec->next);
  for (uint64_t i = first; i < rec->next; i++) {
    const weft_rec_entry *e = &rec->ring[i % rec->cap];
    char waiting[96] = "";
    if ((e->state == WEFT_REC_RUNNING || e->state == WEFT_REC_FAILED) && e->waiting_peer >= 0)
      snprintf(waiting, sizeof waiting, ", waiting for %s peer %d",
               e->waiting_for ? e->waiting_for : "", e->waiting_peer);
    char ended[48] = "";
    if (e->ended) snprintf(ended, sizeof ended, ", ended %.3f", (now - e->ended) * 1e3);
    fprintf(stderr,
            "  #%u %s count=%zu %s %s root=%d algo=%s: %s%s%s (issued %.3f, started %.3f%s)\n",
            e->seq, e->call, e->count, weft_dtype_name(e->dtype), weft_op_name(e->op), e->root,
            e->algo ? e->algo : "-", state_name(e->state), e->state == WEFT_REC_FAILED ? " " : "",
            e->state == WEFT_REC_FAILED ? weft_status_name(e->status) : "",
            e->issued ? (now - e->issued) * 1e3 : 0.0, /* 0: being queued this instant */
            e->started ? (now - e->started) * 1e3 : 0.0, ended);
    if (waiting[0]) fprintf(stderr, "    %s\n", waiting + 2);
  }
}

static atomic_int signal_seen;
/* Who prints every live communicator's ring: the list's owner (comm.c). */
static void (*_Atomic dump_all)(const char *why);

static void on_sigusr1(int sig) {
  (void)sig;
  atomic_store(&signal_seen, 1);
}

void weft_recorder_install_signal(void (*dump)(const char *why)) {
  static atomic_int installed;
  atomic_store(&dump_all, dump);
  if (atomic_exchange(&installed, 1)) return;
  struct sigaction old;
  if (sigaction(SIGUSR1, NULL, &old) || old.sa_handler != SIG_DFL) return; /* the app's own */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
}

void weft_recorder_poll_signal(void) {
  if (atomic_load_explicit(&signal_seen, memory_order_relaxed) &&
      atomic_exchange(&signal_seen, 0)) {
    void (*dump)(const char *why) = atomic_load(&dump_all);
    if (dump) dump("SIGUSR1");
  }
}
