/* probe.c - the stall probe (core.h's stall_probe, WEFT_STALL_PROBE): the
 * detector's other half. A dead peer shows at once; ranks that wait on
 * each other in different calls do not, when no chunk ever crosses to show
 * it (broadcasts whose roots differ so that no rank sends first, a call one
 * rank skipped while its next one waits on others). So a collective that
 * has moved nothing for WEFT_STALL_PROBE seconds asks the peer it waits on
 * (every peer when it knows none), over the control plane
 * (src/elastic/ctl.h), which call it waits in: a peer in a
 * call of the same number with another signature or count is a mismatch,
 * and this rank fails with both calls named (its notice then fails the
 * others, as any failure does). So is the peer this rank waits on when it
 * is in a later call: it is done with this one, so what this rank waits
 * for from it will not come (it sent less: a count that differs). A peer
 * in the same call, in an earlier one or in none (computing, outside
 * weft) says nothing wrong: the wait goes on, to WEFT_TIMEOUT. A stalled rank answers its peers' questions from
 * WEFT_STALL_ANSWER_S on; one that is not waiting does not answer, which
 * is never a mismatch. Nothing runs while data flows. */
#include <stdio.h>
#include <string.h>

#include "src/base/bytes.h"
#include "src/base/call_tag.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/comm/comm.h"

#define STATE_BYTES 16


static weft_comm *comm_of(weft_core *core) {
  return (weft_comm *)(void *)((char *)core - offsetof(weft_comm, core));
}

weft_status weft_comm_stall_probe(weft_core *core, const weft_coll *head, int waits_on,
                                  double idle_s) {
  weft_comm *comm = comm_of(core);
  /* a recovery on another thread owns the control plane now */
  if (!comm->ctl || pthread_mutex_trylock(&comm->ctl_lock)) return WEFT_OK;
  weft_ctl *ctl = comm->ctl;
  weft_error_sink err;
  (void)weft_ctl_progress(ctl, 0, &err); /* a failure here only delays the probe */
  uint8_t mine[STATE_BYTES];
  weft_put32(mine, head->seq);
  weft_put32(mine + 4, head->sig);
  weft_put64(mine + 8, head->count);
  int other = -1;
  uint32_t other_seq = 0, other_sig = 0;
  uint64_t other_count = 0;
  for (weft_ctl_msg *m = weft_ctl_inbox(ctl), *next; m; m = next) {
    next = m->next;
    if (m->kind == WEFT_CTL_PROBE_ASK) {
      weft_ctl_send(ctl, m->from, WEFT_CTL_PROBE_STATE, 0, mine, sizeof mine);
    } else if (m->kind == WEFT_CTL_PROBE_STATE && m->len == STATE_BYTES) {
      uint32_t seq = weft_get32(m->body), sig = weft_get32(m->body + 4);
      uint64_t count = weft_get64(m->body + 8);
      bool differs = seq == head->seq && (sig != head->sig || count != head->count);
      bool past = m->from == waits_on && seq > head->seq && seq != UINT32_MAX;
      if ((differs || past) && other < 0) {
        other = m->from;
        other_seq = seq;
        other_sig = sig;
        other_count = count;
      }
    } else {
      continue; /* the agreement's */
    }
    weft_ctl_take(ctl, m);
  }
  double probe_s = weft_settings()->stall_probe_s, now = weft_now();
  if (idle_s >= probe_s && other < 0 &&
      (comm->probe_seq != head->seq || now - comm->probe_asked_at >= probe_s)) {
    comm->probe_seq = head->seq;
    comm->probe_asked_at = now;
    /* The peer this rank waits on is enough: every stalled rank asks the
     * one it waits on, so the chain of waits is asked link by link, and a
     * whole job that waits (one rank checkpointing) sends n frames a
     * probe interval, not n * (n - 1). Without a known peer: all. */
    bool one = waits_on >= 0 && waits_on < core->size && waits_on != core->rank;
    WEFT_INFO(WEFT_SUBSYS_COLL, "stall probe: rank %d has waited %.1f s in call #%u: asking %s",
              core->rank, idle_s, head->seq, one ? "the peer it waits on" : "its peers");
    for (int p = 0; p < core->size; p++)
      if (p != core->rank && (!one || p == waits_on))
        weft_ctl_send(ctl, p, WEFT_CTL_PROBE_ASK, 0, NULL, 0);
  }
  (void)weft_ctl_progress(ctl, 0, &err);
  pthread_mutex_unlock(&comm->ctl_lock);
  if (other < 0) return WEFT_OK;
  char theirs[96], ours[96];
  weft_sig_describe(other_sig, theirs, sizeof theirs);
  weft_sig_describe(head->sig, ours, sizeof ours);
  if (other_seq == head->seq)
    weft_error_sink_set(&core->links.sink,
                        "rank %d called %s count %llu as its call #%u, this rank %s count %zu: "
                        "every rank must make the same call (stall probe, %.1f s)",
                        other, theirs, (unsigned long long)other_count, other_seq, ours,
                        head->count, idle_s);
  else
    weft_error_sink_set(&core->links.sink,
                        "rank %d, which this rank waits on in call #%u (%s count %zu), is past "
                        "it, in call #%u (%s count %llu): it sent less than this rank expects "
                        "(stall probe, %.1f s)",
                        other, head->seq, ours, head->count, other_seq, theirs,
                        (unsigned long long)other_count, idle_s);
  return WEFT_ERR_MISMATCH;
}
