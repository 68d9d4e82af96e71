/* shm_peer.c - how a connection ends: failing it with the user's sentence,
 * the peer's failure notice, and whether the peer process still lives. The
 * data path (shm_conn.c) and single copy (shm_cma.c) both call down into
 * it; it calls neither. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>

#include "shm.h"
#include "src/base/log.h"
#include "src/base/status.h"

/* Takes the pair's name away if it may still be there. Safe whenever this
 * side gives up: the creator needs the name only to make the segment, the
 * opener only to map it, and a segment made after this is its creator's to
 * unlink (it does on giving up, or on seeing this rank dead). */
void shm_conn_unlink(shm_conn *c) {
  if (!c->maybe_linked) return;
  shm_unlink(c->name);
  c->maybe_linked = false;
}

weft_status shm_conn_fail(shm_conn *c, weft_status st, const char *fmt, ...) {
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  weft_error_sink_set(c->ctx->args->errors, "%s", what);
  WEFT_INFO(WEFT_SUBSYS_NET, "shm: connection to peer %d failed: %s", c->peer, what);
  c->state = SHM_CONN_DEAD;
  c->dead_status = st;
  /* The opener will never map it now; the creator keeps a name the opener
   * may still read (the no-room mark) until the opener is gone too. */
  if (!c->creator || c->peer_ended) shm_conn_unlink(c);
  return st;
}

weft_status shm_peer_gone(shm_conn *c) {
  if (c->rx && atomic_load_explicit(&c->rx->aborted, memory_order_acquire)) {
    c->notice_read = true;
    /* the peer's text: bounded here, whether or not it ended it */
    char text[SHM_ABORT_TEXT];
    snprintf(text, sizeof text, "%.*s", SHM_ABORT_TEXT - 1, c->rx->abort_text);
    if (c->seg && atomic_load_explicit(&c->seg->refused, memory_order_relaxed))
      return shm_conn_fail(c, WEFT_ERR_MISMATCH, "%s", text); /* names both settings */
    weft_status st = shm_conn_fail(c, WEFT_ERR_PEER_LOST, "peer %d passed on a failure: %s",
                                   c->peer, text);
    snprintf(c->ctx->args->errors->origin, sizeof c->ctx->args->errors->origin, "%s", text);
    return st;
  }
  return WEFT_OK;
}

/* Notes whether the peer process has ended (one poll of its pidfd). Not an
 * error by itself: a peer may finish and exit while its last chunks still
 * wait in our FIFO. It becomes one when we need more from it. A dead peer
 * will never make or map the pair's segment: its name goes at once, so this
 * rank crashing later leaves nothing (a dead connection is watched only
 * while a name may be left). */
void shm_conn_check_peer(shm_conn *c) {
  /* the opener unlinked it on mapping: nothing of ours is left to watch */
  if (c->creator && c->maybe_linked && c->seg &&
      atomic_load_explicit(&c->seg->peer_mapped, memory_order_relaxed))
    c->maybe_linked = false;
  if (!c->peer_ended && (c->state != SHM_CONN_DEAD || c->maybe_linked)) {
    if (c->pidfd >= 0) {
      struct pollfd p = {.fd = c->pidfd, .events = POLLIN};
      c->peer_ended = poll(&p, 1, 0) == 1;
    } else if (c->peer_pid) {
      c->peer_ended = kill((pid_t)c->peer_pid, 0) != 0 && errno == ESRCH;
    }
  }
  if (c->peer_ended) shm_conn_unlink(c);
}
