/* engine.c - the one loop that moves data: it advances the collective at the
 * head of the queue (then the next, at once), the point-to-point lane (its
 * own channel of the same connections, p2p.h), and every transport; spins
 * briefly, then yields, then sleeps in the transport's wait; and fails the
 * communicator once its collectives saw nothing move for the timeout (the
 * lane keeps a timeout of its own, weft_p2p_clock).
 *
 * Who drives: the holder of the engine's call_lock. A caller that waits (weft_wait,
 * any blocking call) takes it and drives on its own thread, so a blocking
 * call costs no thread hand-off. The progress thread, started by the first
 * non-blocking call, drives only while no caller wants to: it checks
 * drivers_waiting on every round and steps aside. */
#include "src/engine/engine.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/status.h"

/* The progress thread competes with the caller's own work for the cores:
 * it yields for a short while only, then sleeps in slices short enough that
 * it notices a caller who wants to drive, or new work, promptly. */
#define THREAD_YIELD_US 1000
#define THREAD_SLICE_MS 5
/* After a sleep on one transport, the others look for notices at most this
 * often: a look may cost a system call (tcp polls its sockets). */
#define LOOK_PERIOD_S 0.01

/* The lane's failures are its own (p2p.h): they never fail the driver. */
static void lane_pass(weft_core *comm, const weft_engine *e) {
  if (e->lane) weft_p2p_pass(comm);
}

static bool has_work_locked(weft_core *comm) {
  weft_engine *e = comm->engine;
  return atomic_load_explicit(&e->q_head, memory_order_relaxed) || (e->lane && weft_p2p_busy(comm));
}

/* Completes everything queued with `st` (the first cause is already in
 * last_error). Caller holds call_lock. */
static void fail_all(weft_core *comm, weft_status st) {
  weft_engine *e = comm->engine;
  pthread_mutex_lock(&e->q_lock);
  weft_request *r = atomic_load_explicit(&e->q_head, memory_order_relaxed);
  atomic_store_explicit(&e->q_head, NULL, memory_order_relaxed);
  e->q_tail = NULL;
  pthread_mutex_unlock(&e->q_lock);
  while (r) {
    weft_request *next = r->next;
    weft_coll_end(&r->task);
    weft_request_complete(r, st);
    r = next;
  }
  if (e->lane) weft_p2p_fail_all(comm, st);
}

/* A clock read is a fair share of a small call on a paravirtualized machine
 * (docs/tuning.md, "Clock reads on a small call's path"). The driver keeps its
 * last reading (weft_engine.clock) and the round it was taken in, and reuses
 * it where a few rounds do not matter. */
static double engine_now(weft_engine *e) {
  e->clock = weft_now();
  e->clock_round = e->rounds;
  e->clock_ok = true;
  return e->clock;
}

/* The driver's reading if it is at most `rounds` drive rounds old (and no
 * yield or sleep came since), else a fresh one. */
static double engine_recent(weft_engine *e, uint64_t rounds) {
  return e->clock_ok && e->rounds - e->clock_round <= rounds ? e->clock : engine_now(e);
}

/* A call this small moves little per round: its end may be stamped with a
 * reading up to CLOCK_ROUNDS rounds old (within a few microseconds; the
 * recorder prints milliseconds with three decimals). Larger calls read the
 * clock when they end. */
#define END_STAMP_MAX_BYTES 4096

/* A clock read costs as much as a whole idle round. A waiting driver reads
 * it on its first idle round after anything moved (so the timeout counts
 * from the last progress), then once every CLOCK_ROUNDS idle rounds: the
 * spin, yield and timeout thresholds are tens of microseconds and more, a
 * round well under one. */
#define CLOCK_ROUNDS 8

/* Advances the head collectives as far as they go. Negative: the head failed. */
static weft_status queue_pass(weft_core *comm, weft_engine *e, weft_request **failed) {
  for (;;) {
    /* No q_lock to look: only the driver removes the head, and a submitter
     * sets it (release) only on an empty queue. A waiting call goes round
     * here many times; a lock pair each time was a fair part of its cost. */
    weft_request *head = atomic_load_explicit(&e->q_head, memory_order_acquire);
    if (!head) return WEFT_OK;
    weft_coll_task *task = &head->task;
    weft_coll *coll = &task->coll;
    if (!head->started) {
      head->started = true;
      if (!head->time_pending)
        weft_recorder_update(&comm->recorder, task, WEFT_REC_RUNNING, WEFT_OK, 0);
    }
    weft_status st = head->algo_done ? WEFT_OK : coll->advance(coll);
    double now = 0; /* a clock reading of this round, 0: none yet */
    if (head->time_pending) {
      /* Issued and started now, its first sends out (weft_engine_call): the
       * caller has been driving since it issued the call, a few hundred
       * nanoseconds ago. Read before those sends, the clock would delay
       * them; here the call waits for its peers anyway (or is done). */
      head->time_pending = false;
      now = engine_now(e);
      task->issued = now;
      e->last_moved = now; /* queued on an idle engine: the timeout counts from here */
      weft_recorder_issued(&comm->recorder, task);
      weft_recorder_update(&comm->recorder, task, WEFT_REC_RUNNING, WEFT_OK, now);
    }
    if (st == WEFT_OK) {
      head->algo_done = true;
      st = weft_coll_flush(task);
    }
    if (st == WEFT_AGAIN) return WEFT_OK;
    if (st < 0) {
      *failed = head;
      weft_recorder_update(&comm->recorder, task, WEFT_REC_FAILED, st, now);
      return st;
    }
    if (!now && coll->count * coll->elem <= END_STAMP_MAX_BYTES)
      now = engine_recent(e, CLOCK_ROUNDS);
    weft_recorder_update(&comm->recorder, task, WEFT_REC_DONE, WEFT_OK, now);
    weft_coll_end(task);
    pthread_mutex_lock(&e->q_lock); /* a submitter may be appending to it */
    weft_request *next = head->next;
    atomic_store_explicit(&e->q_head, next, memory_order_relaxed);
    if (!next) e->q_tail = NULL;
    pthread_mutex_unlock(&e->q_lock);
    comm->links.events++;
    weft_request_complete(head, WEFT_OK);
  }
}

/* The peer the engine waits for, and its transport. */
static const weft_transport_in_use *waited_transport(weft_core *comm) {
  weft_engine *e = comm->engine;
  int peer = -1;
  weft_request *head = atomic_load_explicit(&e->q_head, memory_order_relaxed);
  if (head) peer = head->task.waiting_peer;
  if (peer < 0 && e->lane) peer = weft_p2p_waiting_peer(comm, NULL);
  int t = peer >= 0 && peer != comm->rank ? comm->links.peers[peer].tp : 0;
  return &comm->links.tps[t < 0 ? 0 : t];
}

/* ---- a timeout's culprit --------------------------------------------------
 * When one rank stops (SIGSTOP, a debugger, a long pause outside the call)
 * or a link dies, every rank that waits on it, directly or through others,
 * times out at about the same moment, each waiting on its own neighbour: no
 * rank alone can tell who stopped. So before it reports, a rank that timed
 * out, or heard a peer's timeout notice, tells every peer whom it waits on
 * and collects theirs for a short grace (culprit_gather): the chain of waits
 * (1 -> 0 -> 3 -> 2) ends at the rank that said nothing, the culprit.
 * The words go in the transports' failure notice, after WAITS_TAG: tcp
 * leaves it at every peer's listener; shm and ibv reach the peers they are
 * connected to, so the grace first opens this host's pairs not yet
 * connected (both ends of a live pair are in their grace then), and both
 * read a peer's notice after sending their own. Every wait is bounded: a
 * timeout is reported at most the grace later (culprit_grace_s), plus tcp's
 * notice (at most 1 s where a host does not answer). */
#define WAITS_TAG "[waits"
#define WAIT_UNKNOWN (-2) /* nothing heard from the rank */
#define WAIT_NOBODY (-1)  /* the rank waits on no peer */

/* timeout/4 within [0.5 s, 1 s]: long enough for every live rank to join
 * (they time out within milliseconds of each other, but on a loaded
 * machine a rank may not run for a hundred; 0.25 s missed some ranks of 8
 * on 2 cores), short against the timeout itself. */
static double culprit_grace_s(const weft_core *comm) {
  double g = comm->fail.timeout_s / 4;
  return g < 0.5 ? 0.5 : g > 1.0 ? 1.0 : g;
}

/* Learns the waits a notice carries ("[waits 1>0 0>3]"), and the call its
 * sender is in ("rank 1 ... in call #7 (signature 0x...)") into tags[sender]. */
static void waits_parse(const char *text, int *waits_on, weft_tag *tags, int n) {
  const char *s = strstr(text, WAITS_TAG);
  if (!s) return;
  const char *head = strstr(text, "rank ");
  int from;
  unsigned seq, sig;
  if (head && sscanf(head, "rank %d made no progress for %*f s in call #%u (signature 0x%x)", &from,
                     &seq, &sig) == 3 &&
      from >= 0 && from < n)
    tags[from] = weft_tag_make(seq, sig);
  s += strlen(WAITS_TAG);
  int a, b, used;
  while (sscanf(s, " %d>%d%n", &a, &b, &used) == 2) {
    if (a >= 0 && a < n && b >= WAIT_NOBODY && b < n && waits_on[a] == WAIT_UNKNOWN)
      waits_on[a] = b;
    s += used;
  }
}

/* This rank's notice: who it is, the call, whom it waits on, then every
 * wait it knows (its own first), as many as fit a notice. */
static void waits_notice(const weft_core *comm, const weft_coll *coll, const int *waits_on,
                         char *buf, size_t len) {
  int n = comm->size, me = comm->rank;
  size_t at = (size_t)snprintf(buf, len,
                               "rank %d made no progress for %.1f s in call #%u (signature "
                               "0x%08x), waiting for peer %d " WAITS_TAG " %d>%d",
                               me, comm->fail.timeout_s, coll->seq, coll->sig, waits_on[me], me,
                               waits_on[me]);
  for (int r = 0; r < n && at + 24 < len; r++) /* room for a whole wait: none is cut */
    if (r != me && waits_on[r] != WAIT_UNKNOWN)
      at += (size_t)snprintf(buf + at, len - at, " %d>%d", r, waits_on[r]);
  if (at + 2 <= len) snprintf(buf + at, len - at, "]");
}

/* Reads every notice the transports hold (tcp: at the listener; shm: on
 * the pairs, also after this rank sent its own). */
static void culprit_harvest(weft_core *comm, int *waits_on, weft_tag *tags) {
  weft_error_sink *sink = &comm->links.sink;
  for (int t = 0; t < comm->links.ntps; t++)
    for (int k = 0; k < 4 * comm->size; k++) { /* one notice per call at most */
      bool moved;
      sink->origin[0] = 0;
      weft_status st = comm->links.tps[t].ops->progress(comm->links.tps[t].ctx, &moved);
      if (st >= 0) break;
      waits_parse(sink->origin, waits_on, tags, comm->size);
    }
  sink->origin[0] = 0;
}

static bool heard_all_but_one(const int *waits_on, int n) {
  int unheard = 0;
  for (int r = 0; r < n; r++) unheard += waits_on[r] == WAIT_UNKNOWN;
  return unheard <= 1;
}

/* The grace: open the pairs not yet connected, send this rank's waits once
 * every pair is up (or half the grace passed: the stopped rank never
 * answers), and collect the others' until the grace ends or all but one
 * rank were heard. `triggered`: a peer's notice started it (in `waits_on`
 * already), so this rank tells the others sooner. */
static void culprit_gather(weft_core *comm, const weft_coll *coll, int *waits_on, weft_tag *tags,
                           bool triggered) {
  weft_peer_table *l = &comm->links;
  int n = comm->size, me = comm->rank;
  double start = weft_now(), grace = culprit_grace_s(comm);
  double send_at = start + grace * (triggered ? 0.25 : 0.5), until = start + grace;
  /* this host's peers only (on 2 loaded cores, 8 ranks' tcp dials kept
   * notices unread past the grace); shm and ibv tell only the peers they
   * are connected to */
  weft_peer_table_open_for_notices(l, comm->hosts.host_members, comm->hosts.local_size, n, me);
  bool sent = false;
  for (;;) {
    if (atomic_load_explicit(&comm->fail.aborted, memory_order_relaxed)) break;
    double now = weft_now();
    if (!sent) {
      bool all_up = true;
      for (int p = 0; p < n; p++) {
        weft_peer_route *lp = &l->peers[p];
        if (p == me || lp->tp < 0 || !lp->conn[WEFT_TP_CHANNEL_COLL]) continue;
        l->sink.origin[0] = 0;
        weft_status st = l->tps[lp->tp].ops->send_ready(lp->conn[WEFT_TP_CHANNEL_COLL]); /* opens it; reads a notice */
        if (st == WEFT_AGAIN) all_up = false;
        if (st < 0) waits_parse(l->sink.origin, waits_on, tags, n);
      }
      if (all_up || now >= send_at) {
        char notice[288]; /* under the transports' 300-byte notice: no wait is cut */
        waits_notice(comm, coll, waits_on, notice, sizeof notice);
        l->sink.origin[0] = 0; /* tcp then dials every listener, as for a first cause */
        weft_peer_table_abort_all(l, notice);
        sent = true;
      }
    }
    culprit_harvest(comm, waits_on, tags);
    if (sent && (now >= until || heard_all_but_one(waits_on, n))) break;
    /* a short sleep in each transport's wait: tcp takes a notice from its
     * listener there */
    for (int t = 0; t < l->ntps; t++) {
      l->sink.origin[0] = 0;
      if (l->tps[t].ops->wait(l->tps[t].ctx, 1) < 0) waits_parse(l->sink.origin, waits_on, tags, n);
    }
    if (!l->ntps) {
      struct timespec pause = {0, 1000000};
      nanosleep(&pause, NULL);
    }
  }
}

/* What the waits say, for the sentence: the chain from this rank ends at a
 * rank that said nothing (or waits on nobody): the culprit, with every rank
 * whose chain ends there; or it closes on itself: a cycle. */
static void culprit_verdict(const weft_core *comm, const int *waits_on, char *out, size_t len) {
  int n = comm->size, me = comm->rank;
  char chain[160];
  size_t at = 0;
  int x = me, hops = 0, culprit = -1;
  bool *seen = calloc((size_t)n, sizeof *seen);
  if (!seen) {
    snprintf(out, len, "(no memory to follow the ranks' waits)");
    return;
  }
  for (;;) {
    if (hops < 12)
      at += (size_t)snprintf(chain + at, sizeof chain - at, hops ? " -> %d" : "%d", x);
    else if (hops == 12)
      at += (size_t)snprintf(chain + at, sizeof chain - at, " -> ...");
    if (at >= sizeof chain) at = sizeof chain - 1;
    hops++;
    if (seen[x]) break; /* a cycle */
    seen[x] = true;
    int next = waits_on[x];
    if (next == WAIT_UNKNOWN || next == WAIT_NOBODY || next == x) {
      culprit = x;
      break;
    }
    x = next;
  }
  free(seen);
  double grace = culprit_grace_s(comm);
  if (culprit < 0) {
    snprintf(out, len,
             "ranks that wait on each other (%s), none of them stopped: a link between them is "
             "cut, or they are in different calls",
             chain);
    return;
  }
  if (culprit == me) { /* this rank waited on no peer: the others' waits cannot start here */
    snprintf(out, len, "no rank's waits lead elsewhere");
    return;
  }
  /* every rank heard from whose waits lead to the culprit */
  char waiters[96] = "";
  size_t w = 0;
  int count = 0;
  for (int r = 0; r < n; r++) {
    if (r == culprit || waits_on[r] == WAIT_UNKNOWN) continue;
    int y = r;
    for (int k = 0; k < n && y != culprit && waits_on[y] >= 0; k++) y = waits_on[y];
    if (y != culprit) continue;
    if (w + 20 < sizeof waiters)
      w += (size_t)snprintf(waiters + w, sizeof waiters - w, "%s%d", count ? ", " : "", r);
    else if (!strstr(waiters, "..."))
      w += (size_t)snprintf(waiters + w, sizeof waiters - w, ", ...");
    count++;
  }
  char because[160];
  if (waits_on[culprit] == WAIT_NOBODY)
    snprintf(because, sizeof because, "it waits on no peer (is it in this call?)");
  else
    snprintf(because, sizeof because,
             "it made no progress and did not answer in %.2f s (stopped, busy outside this "
             "call, or cut off)",
             grace);
  /* the culprit comes first, so a cut sentence (a long chain) still names it;
   * "..." says it was cut */
  if (snprintf(out, len, "the culprit is rank %d: %s; rank%s %s waited on it (%s)", culprit, because,
               count > 1 ? "s" : "", waiters, chain) >= (int)len &&
      len >= 4)
    memcpy(out + len - 4, "...", 4);
}

/* A timeout (this rank's, or a peer's notice of one): the ranks agree on the
 * culprit before the head call reports it. */
static weft_status culprit_fail(weft_core *comm, weft_request *head, bool triggered) {
  int n = comm->size;
  int *waits_on = malloc((size_t)n * sizeof *waits_on);
  weft_tag *tags = calloc((size_t)n, sizeof *tags);
  if (!waits_on || !tags) {
    free(waits_on);
    free(tags);
    return weft_coll_failed(&head->task, WEFT_ERR_TIMEOUT);
  }
  for (int r = 0; r < n; r++) waits_on[r] = WAIT_UNKNOWN;
  int peer = head->task.waiting_peer;
  waits_on[comm->rank] = peer >= 0 && peer < n && peer != comm->rank ? peer : WAIT_NOBODY;
  if (triggered) waits_parse(comm->links.sink.origin, waits_on, tags, n);
  const weft_coll *coll = &head->task.coll;
  culprit_gather(comm, coll, waits_on, tags, triggered);
  char verdict[384];
  /* Ranks that wait on each other in calls that differ (roots that differ,
   * so that no rank sends first: no chunk ever shows it) disagree; the
   * calls name it better than any chain of waits. Only at the same call
   * number: a peer in a later call may simply have finished this one (its
   * data came before a link was cut) and one in an earlier call not yet
   * reached it; the chain of waits says those (once, a cut rail made every
   * rank report a mismatch). */
  weft_tag mine = weft_coll_tag(coll);
  int other = -1;
  for (int r = 0; r < n && other < 0; r++)
    if (r != comm->rank && tags[r] && weft_tag_seq(tags[r]) == weft_tag_seq(mine) && tags[r] != mine)
      other = r;
  weft_status st = WEFT_ERR_TIMEOUT;
  if (other >= 0) {
    char theirs[96], ours[96];
    weft_sig_describe(weft_tag_sig(tags[other]), theirs, sizeof theirs);
    weft_sig_describe(coll->sig, ours, sizeof ours);
    snprintf(verdict, sizeof verdict,
             "rank %d called %s as its call #%u, this rank %s: every rank must make the same "
             "call (each waited for another to send first)",
             other, theirs, weft_tag_seq(tags[other]), ours);
    st = WEFT_ERR_MISMATCH;
  } else {
    culprit_verdict(comm, waits_on, verdict, sizeof verdict);
  }
  free(waits_on);
  free(tags);
  return weft_coll_timed_out(&head->task, st, verdict);
}

/* A failure seen while driving: the head collective words it (or the lane),
 * the communicator fails, every request completes with the error. */
static weft_status drive_failed(weft_core *comm, weft_request *head, weft_status st) {
  weft_engine *e = comm->engine;
  if (!head) head = atomic_load_explicit(&e->q_head, memory_order_relaxed);
  bool timeout_notice = st < 0 && st != WEFT_ERR_ABORTED && st != WEFT_ERR_REVOKED &&
                        strstr(comm->links.sink.origin, WAITS_TAG);
  if (head && !comm->fail.failed && comm->size > 1 && (st == WEFT_ERR_TIMEOUT || timeout_notice)) {
    st = culprit_fail(comm, head, st != WEFT_ERR_TIMEOUT);
  } else if (head) {
    st = weft_coll_failed(&head->task, st);
  } else if (!comm->fail.failed) {
    const char *what = NULL;
    int peer = e->lane ? weft_p2p_waiting_peer(comm, &what) : -1;
    if (st == WEFT_ERR_TIMEOUT)
      weft_core_error(comm, st, "weft_send/weft_recv",
                      "no progress for %.1f s while waiting for %s peer %d; is peer %d alive and "
                      "does it send/receive the matching message?",
                      comm->fail.timeout_s, what ? what : "", peer, peer);
    else if (st == WEFT_ERR_ABORTED)
      weft_core_error(comm, st, "weft_send/weft_recv", "weft_comm_abort was called");
    else if (st == WEFT_ERR_REVOKED)
      weft_core_error(comm, st, "weft_send/weft_recv", "rank %d %s", comm->rank,
                      WEFT_REVOKED_WORDS);
    else {
      const char *words = comm->links.sink.origin[0] ? comm->links.sink.origin : comm->links.sink.msg;
      st = weft_status_revoked_or(st, words);
      weft_core_error(comm, st, "weft_send/weft_recv", "%s", words);
    }
    comm->fail.failed = st;
    weft_peer_table_abort_all(&comm->links, comm->fail.last_error);
  }
  fail_all(comm, comm->fail.failed ? comm->fail.failed : st);
  return st;
}

typedef enum drive_mode { DRIVE_WAIT, DRIVE_ONCE, DRIVE_THREAD } drive_mode;

/* Between two idle rounds of polling memory a peer writes: a core that
 * asks for the line again at once slows the peer's store to it, and the hint
 * yields the pipeline to an SMT sibling (docs/tuning.md, "The spin-wait hint
 * between idle rounds"). */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Leaving drive with work still queued: progress seen since the last
 * stamp must count for the timeout of the driver that comes next. */
static void drive_leave_stamp(weft_core *comm, weft_engine *e, bool stamp) {
  if (stamp &&
      (atomic_load_explicit(&e->q_head, memory_order_relaxed) || (e->lane && weft_p2p_busy(comm))))
    e->last_moved = engine_recent(e, 1);
}

/* How long a driver has waited with nothing moving, and how it waits next:
 * spin (cpu_relax), then yield the core, then sleep in the transport that
 * the head call waits on (drive_idle). */
typedef struct drive_backoff {
  bool thread;          /* the progress thread: shorter yields and slices */
  int yield_us;         /* spinning and yielding end this long after the last move */
  bool stamp;           /* something moved that last_moved does not show yet */
  unsigned idle_rounds; /* rounds since the clock was last read */
  double now;           /* the last reading */
  bool placed;          /* keep_place was called in this wait (the thread never steps) */
  double probe_at;      /* the stall probe's next turn (clock reading) */
} drive_backoff;

/* A stalled driver starts answering its peers' stall probes after this long
 * without progress, and turns to the probe once per this interval. */
#define WEFT_STALL_ANSWER_S 0.1
#define WEFT_STALL_POLL_S 0.02

/* Whether the driver leaves now: its target is done, or (the progress
 * thread) a caller wants to drive or no work is left. */
static bool drive_may_leave(weft_core *comm, weft_engine *e, const weft_request *target,
                            bool thread) {
  if (target && atomic_load_explicit(&target->done, memory_order_acquire)) return true;
  if (!thread) return false;
  if (atomic_load_explicit(&e->drivers_waiting, memory_order_relaxed) > 0) return true;
  pthread_mutex_lock(&e->q_lock);
  bool leave = !has_work_locked(comm) || e->progress_stop;
  pthread_mutex_unlock(&e->q_lock);
  return leave;
}

/* Every transport's progress; *moved when anything moved. */
static weft_status drive_progress(weft_core *comm, bool *moved) {
  weft_status st = WEFT_OK;
  *moved = false;
  for (int t = 0; t < comm->links.ntps && st >= 0; t++) {
    bool this_moved = false;
    st = comm->links.tps[t].ops->progress(comm->links.tps[t].ctx, &this_moved);
    *moved |= this_moved;
  }
  return st;
}

/* A wait past spinning and yielding: sleeps in the transport the head call
 * waits on, at most until the timeout, then has the others look once. */
static weft_status drive_sleep(weft_core *comm, weft_engine *e, drive_backoff *b, bool fresh,
                               bool colls) {
  if (!fresh) b->now = engine_recent(e, 1); /* the sleep is sized by the time left */
  double idle = b->now - e->last_moved;
  /* the lane's timeout is its own; the communicator's counts while a
   * collective is queued */
  double lane_left = e->lane ? weft_p2p_clock(comm, b->now) : 1e9;
  double left_ms = (colls ? comm->fail.timeout_s - idle : lane_left) * 1000;
  if (colls && lane_left * 1000 < left_ms) left_ms = lane_left * 1000;
  weft_request *head = atomic_load_explicit(&e->q_head, memory_order_relaxed);
  if (head) /* what it waits for, for a dump */
    weft_recorder_update(&comm->recorder, &head->task, WEFT_REC_RUNNING, WEFT_OK, b->now);
  int slice = b->thread ? THREAD_SLICE_MS : 100;
  /* sleep on what the head waits for; other transports are polled every
   * round and the waits are bounded slices */
  int ms = left_ms < slice ? (int)left_ms + 1 : slice;
  e->clock_ok = false;
  if (comm->links.ntps == 0) { /* one rank: only a message to itself can come */
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
    return WEFT_OK;
  }
  const weft_transport_in_use *t = waited_transport(comm);
  weft_status st = t->ops->wait(t->ctx, ms);
  /* The others look once, without sleeping: their progress alone may leave
   * a notice unread for many rounds (docs/faults.md, "Notices across
   * transports"). */
  if (comm->links.ntps > 1 && st >= 0) {
    double looked = weft_now();
    if (looked - e->others_looked_at >= LOOK_PERIOD_S) {
      e->others_looked_at = looked;
      for (int i = 0; i < comm->links.ntps && st >= 0; i++)
        if (&comm->links.tps[i] != t) st = comm->links.tps[i].ops->wait(comm->links.tps[i].ctx, 0);
    }
  }
  uint64_t drained;
  if (read(e->wake_fd, &drained, sizeof drained) < 0 && errno != EAGAIN) { /* best effort */
  }
  return st;
}

/* A round in which nothing moved: an abort or the timeout fails the call;
 * else the driver spins, yields or sleeps (drive_backoff) and goes on. */
static weft_status drive_idle(weft_core *comm, weft_engine *e, const weft_request *target,
                              drive_backoff *b) {
  int stopped = atomic_load_explicit(&comm->fail.aborted, memory_order_relaxed);
  if (stopped) {
    comm->links.sink.origin[0] = 0;
    return weft_fail_stopped(stopped);
  }
  /* a reading from this round or the last is fresh enough here */
  bool fresh = b->stamp || b->idle_rounds % CLOCK_ROUNDS == 0;
  if (fresh) {
    b->now = engine_recent(e, 1);
    if (b->stamp) e->last_moved = b->now;
    b->stamp = false;
  }
  if (atomic_load_explicit(&e->coll_restart, memory_order_relaxed) &&
      atomic_exchange_explicit(&e->coll_restart, false, memory_order_relaxed))
    e->last_moved = b->now = engine_recent(e, 1);
  b->idle_rounds++;
  double idle = b->now - e->last_moved;
  if (e->lane) weft_p2p_clock(comm, b->now); /* the lane fails its own timed-out messages */
  if (target && atomic_load_explicit(&target->done, memory_order_acquire)) return WEFT_OK;
  weft_request *head = atomic_load_explicit(&e->q_head, memory_order_relaxed);
  bool colls = head != NULL;
  if (colls && idle >= comm->fail.timeout_s) {
    comm->links.sink.origin[0] = 0;
    return WEFT_ERR_TIMEOUT;
  }
  /* a stalled collective: its peers may be in another call (the probe
   * asks them, off the data path); gated by the clock, so rounds that
   * spin cost nothing */
  if (colls && comm->stall_probe && fresh && idle >= WEFT_STALL_ANSWER_S &&
      b->now >= b->probe_at) {
    b->probe_at = b->now + WEFT_STALL_POLL_S;
    weft_status st = comm->stall_probe(comm, &head->task.coll, head->task.waiting_peer, idle);
    if (st) {
      comm->links.sink.origin[0] = 0;
      return st;
    }
  }
  if (idle * 1e6 < e->spin_us) {
    cpu_relax();
    return WEFT_OK;
  }
  weft_recorder_poll_signal();
  /* after a yield or a sleep (which may last milliseconds), the next round
   * reads the clock; the system call costs far more anyway */
  b->idle_rounds = 0;
  if (idle * 1e6 < e->spin_us + b->yield_us) {
    if (!b->placed) { /* once per wait, before the first yield */
      if (e->keep_place) e->keep_place();
      b->placed = true;
    }
    sched_yield();
    e->clock_ok = false;
    return WEFT_OK;
  }
  return drive_sleep(comm, e, b, fresh, colls);
}

/* Caller holds call_lock. Returns when `target` is done (DRIVE_WAIT), after
 * one pass (DRIVE_ONCE), or when there is no work left or a caller wants to
 * drive (DRIVE_THREAD). Each round: the queued calls and the messages move,
 * then the transports; a round where nothing moved waits (drive_idle). */
static void drive(weft_core *comm, weft_request *target, drive_mode mode) {
  weft_engine *e = comm->engine;
  bool thread = mode == DRIVE_THREAD;
  drive_backoff b = {
      .thread = thread,
      .yield_us = thread && e->yield_us > THREAD_YIELD_US ? THREAD_YIELD_US : e->yield_us,
      .placed = thread};
  e->clock_ok = false; /* the caller may have been away for hours */
  for (;;) {
    e->rounds++;
    uint64_t seen = comm->links.events;
    weft_request *failed = NULL;
    weft_status st = queue_pass(comm, e, &failed);
    if (st < 0) {
      drive_failed(comm, failed, st);
      return;
    }
    lane_pass(comm, e);
    if (drive_may_leave(comm, e, target, thread)) {
      drive_leave_stamp(comm, e, b.stamp || comm->links.events != seen);
      return;
    }
    bool moved;
    st = drive_progress(comm, &moved);
    if (st >= 0 && (moved || comm->links.events != seen)) {
      b.stamp = true;
      b.idle_rounds = 0;
      continue;
    }
    if (st >= 0 && mode == DRIVE_ONCE) {
      drive_leave_stamp(comm, e, b.stamp);
      return;
    }
    if (st >= 0) st = drive_idle(comm, e, target, &b);
    if (st < 0) {
      drive_failed(comm, NULL, st);
      return;
    }
  }
}

static void *progress_main(void *arg) {
  weft_core *comm = arg;
  weft_engine *e = comm->engine;
  weft_log_set_rank(comm->rank);
  pthread_mutex_lock(&e->q_lock);
  for (;;) {
    while (!e->progress_stop && (!has_work_locked(comm) || atomic_load(&e->drivers_waiting) > 0))
      pthread_cond_wait(&e->q_cond, &e->q_lock);
    if (e->progress_stop) break;
    pthread_mutex_unlock(&e->q_lock);
    pthread_mutex_lock(&e->call_lock);
    atomic_store(&e->progress_driving, true);
    drive(comm, NULL, DRIVE_THREAD);
    atomic_store(&e->progress_driving, false);
    pthread_mutex_unlock(&e->call_lock);
    pthread_mutex_lock(&e->q_lock);
  }
  pthread_mutex_unlock(&e->q_lock);
  return NULL;
}

/* `driving`: the caller holds call_lock and drives right after. */
static void submit(weft_request *req, bool wake, bool driving) {
  weft_core *comm = req->comm;
  weft_engine *e = comm->engine;
  req->next = NULL;
  atomic_store_explicit(&req->done, 0, memory_order_relaxed);
  pthread_mutex_lock(&e->q_lock);
  bool idle = !has_work_locked(comm);
  /* A collective's issue time is taken here, before any driver can see it,
   * except for a blocking call that its own caller drives on an idle
   * engine: that one's driver takes it (queue_pass). */
  req->time_pending = driving && idle && req->kind == WEFT_REQ_COLL;
  if (!req->time_pending && (idle || req->kind == WEFT_REQ_COLL)) {
    double now = weft_now();
    if (req->kind == WEFT_REQ_COLL) {
      req->task.issued = now;
      weft_recorder_issued(&comm->recorder, &req->task);
    }
    if (idle) e->last_moved = now; /* the timeout counts from here */
  }
  /* the first collective queued beside messages that wait: its timeout
   * counts from the driver's next reading, not from when they last moved
   * (a driver may be running: it restarts its own clock) */
  if (!idle && req->kind == WEFT_REQ_COLL &&
      !atomic_load_explicit(&e->q_head, memory_order_relaxed))
    atomic_store_explicit(&e->coll_restart, true, memory_order_relaxed);
  if (req->kind == WEFT_REQ_COLL) {
    if (e->q_tail)
      e->q_tail->next = req;
    else
      atomic_store_explicit(&e->q_head, req, memory_order_release);
    e->q_tail = req;
  } else {
    weft_p2p_post(req);
  }
  if (wake && !e->progress_started && !e->progress_stop) {
    if (pthread_create(&e->progress, NULL, progress_main, comm) == 0)
      e->progress_started = true;
    else /* still correct: waits drive it; it just does not overlap */
      WEFT_WARN(WEFT_SUBSYS_COLL, "cannot start the progress thread; requests move only in waits");
  }
  if (wake) pthread_cond_signal(&e->q_cond);
  pthread_mutex_unlock(&e->q_lock);
}

void weft_engine_submit(weft_request *req, bool wake) {
  submit(req, wake, false);
}

/* Takes the call lock as a driver: the progress thread steps aside. */
static void driver_enter(weft_core *comm) {
  weft_engine *e = comm->engine;
  /* Free: no thread to ask aside (one that wants it later waits on the
   * lock, as it would behind a waiting caller), and two atomic updates and
   * a load fewer per blocking call. */
  if (pthread_mutex_trylock(&e->call_lock) == 0) return;
  atomic_fetch_add(&e->drivers_waiting, 1);
  if (atomic_load(&e->progress_driving)) {
    uint64_t one = 1; /* ends a transport wait the thread may be sleeping in */
    if (write(e->wake_fd, &one, sizeof one) < 0) { /* already signalled */
    }
  }
  pthread_mutex_lock(&e->call_lock);
  atomic_fetch_sub(&e->drivers_waiting, 1);
}

static void driver_leave(weft_core *comm) {
  weft_engine *e = comm->engine;
  pthread_mutex_unlock(&e->call_lock);
  if (e->progress_started) {
    pthread_mutex_lock(&e->q_lock);
    pthread_cond_signal(&e->q_cond);
    pthread_mutex_unlock(&e->q_lock);
  }
}

weft_status weft_engine_wait(weft_request *req) {
  if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
    weft_core *comm = req->comm;
    driver_enter(comm);
    drive(comm, req, DRIVE_WAIT);
    driver_leave(comm);
  }
  return req->status;
}

weft_status weft_engine_call(weft_request *req) {
  weft_core *comm = req->comm;
  /* The driver's place first, when free: then the call is known to start at
   * once (submit lets queue_pass take its time). Lock order as everywhere:
   * call_lock, then q_lock. */
  bool driving = pthread_mutex_trylock(&comm->engine->call_lock) == 0;
  submit(req, false, driving);
  if (!driving) driver_enter(comm);
  drive(comm, req, DRIVE_WAIT);
  driver_leave(comm);
  return req->status;
}

bool weft_engine_test(weft_request *req) {
  if (atomic_load_explicit(&req->done, memory_order_acquire)) return true;
  weft_core *comm = req->comm;
  weft_engine *e = comm->engine;
  if (pthread_mutex_trylock(&e->call_lock) == 0) {
    drive(comm, req, DRIVE_ONCE);
    pthread_mutex_unlock(&e->call_lock);
  }
  return atomic_load_explicit(&req->done, memory_order_acquire);
}

void weft_engine_stop(weft_core *comm) {
  weft_engine *e = comm->engine;
  pthread_mutex_lock(&e->q_lock);
  e->progress_stop = true;
  pthread_cond_signal(&e->q_cond);
  bool started = e->progress_started;
  pthread_mutex_unlock(&e->q_lock);
  uint64_t one = 1;
  if (write(e->wake_fd, &one, sizeof one) < 0) { /* already signalled */
  }
  if (started) pthread_join(e->progress, NULL);
  e->progress_started = false;
  pthread_mutex_lock(&e->call_lock);
  if (atomic_load_explicit(&e->q_head, memory_order_relaxed) || (e->lane && weft_p2p_busy(comm))) {
    if (!comm->fail.failed)
      weft_core_error(comm, WEFT_ERR_ABORTED, "weft_comm_destroy",
                      "the communicator was destroyed with requests outstanding");
    fail_all(comm, WEFT_ERR_ABORTED);
  }
  pthread_mutex_unlock(&e->call_lock);
}
