/* agree.c - the agreement (agree.h) over the control plane. */
#include "src/elastic/agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/bytes.h"
#include "src/base/log.h"
#include "src/base/net.h"


/* A proposal as held by whoever may coordinate. */
typedef struct proposal {
  bool got;
  uint32_t flags;
  uint8_t *lost; /* size bytes */
  uint8_t *data;
  uint32_t len;
} proposal;

typedef struct agree_state {
  weft_ctl *ctl;
  int rank, size;
  uint32_t epoch;
  proposal *props; /* by rank; mine too */
  uint8_t *decision; /* the decision's bytes once held */
  size_t decision_len;
  int decided_from; /* who it came from (-1: this rank decided) */
} agree_state;

static void props_free(agree_state *s) {
  for (int p = 0; s->props && p < s->size; p++) {
    free(s->props[p].lost);
    free(s->props[p].data);
  }
  free(s->props);
}

/* Parses a proposal's body into props[from]; false if malformed. */
static bool proposal_take(agree_state *s, int from, const uint8_t *b, uint32_t len) {
  size_t n = (size_t)s->size;
  if (len < 8 + n) return false;
  uint32_t dlen = weft_get32(b + 4 + n);
  if (len != 8 + n + dlen) return false;
  proposal *p = &s->props[from];
  uint8_t *lost = malloc(n), *data = malloc(dlen ? dlen : 1);
  if (!lost || !data) {
    free(lost);
    free(data);
    return false;
  }
  memcpy(lost, b + 4, n);
  memcpy(data, b + 8 + n, dlen);
  free(p->lost);
  free(p->data);
  *p = (proposal){.got = true, .flags = weft_get32(b), .lost = lost, .data = data, .len = dlen};
  return true;
}

static uint8_t *proposal_bytes(const agree_state *s, uint32_t flags, const void *payload,
                               size_t len, size_t *out_len) {
  size_t n = (size_t)s->size;
  uint8_t *b = malloc(8 + n + len);
  if (!b) return NULL;
  weft_put32(b, flags);
  for (int p = 0; p < s->size; p++) b[4 + p] = weft_ctl_lost(s->ctl, p) ? 1 : 0;
  weft_put32(b + 4 + n, (uint32_t)len);
  if (len) memcpy(b + 8 + n, payload, len);
  *out_len = 8 + n + len;
  return b;
}

/* Checks a decision's bytes and parses them into *out (pointing into them). */
static bool decision_parse(const uint8_t *b, size_t len, int size, weft_agreement *out) {
  size_t n = (size_t)size;
  if (len < 12 + n || weft_get32(b + 4) != (uint32_t)size) return false;
  out->flags = weft_get32(b);
  out->size = size;
  out->coordinator = (int)weft_get32(b + 8);
  out->lost = calloc(n, 1);
  out->data = calloc(n, sizeof *out->data);
  out->data_len = calloc(n, sizeof *out->data_len);
  if (!out->lost || !out->data || !out->data_len) return false;
  memcpy(out->lost, b + 12, n);
  size_t at = 12 + n;
  out->nlost = 0;
  for (int p = 0; p < size; p++) {
    if (out->lost[p]) {
      out->nlost++;
      continue;
    }
    if (len - at < 4) return false;
    uint32_t dl = weft_get32(b + at);
    at += 4;
    if (len - at < dl) return false;
    out->data[p] = b + at;
    out->data_len[p] = dl;
    at += dl;
  }
  return at == len;
}

/* The coordinator's decision from every proposal it holds: the lost are
 * those it or any proposer knows lost. */
static bool decide(agree_state *s) {
  size_t n = (size_t)s->size;
  uint8_t *lost = calloc(n, 1);
  if (!lost) return false;
  uint32_t flags = 0;
  for (int p = 0; p < s->size; p++) {
    if (weft_ctl_lost(s->ctl, p) || !s->props[p].got) lost[p] = 1;
    if (!s->props[p].got) continue;
    for (int q = 0; q < s->size; q++)
      if (s->props[p].lost[q] && q != s->rank) lost[q] = 1;
  }
  size_t len = 12 + n;
  for (int p = 0; p < s->size; p++)
    if (!lost[p]) {
      flags |= s->props[p].flags;
      len += 4 + s->props[p].len;
    }
  uint8_t *b = malloc(len);
  if (!b) {
    free(lost);
    return false;
  }
  weft_put32(b, flags);
  weft_put32(b + 4, (uint32_t)s->size);
  weft_put32(b + 8, (uint32_t)s->rank);
  memcpy(b + 12, lost, n);
  size_t at = 12 + n;
  for (int p = 0; p < s->size; p++)
    if (!lost[p]) {
      weft_put32(b + at, s->props[p].len);
      memcpy(b + at + 4, s->props[p].data, s->props[p].len);
      at += 4 + s->props[p].len;
    }
  free(lost);
  s->decision = b;
  s->decision_len = len;
  s->decided_from = -1;
  return true;
}

/* Reads this epoch's messages out of the inbox; older ones are dropped,
 * later ones (a rank that is one agreement ahead) are left for it. */
static void inbox_read(agree_state *s) {
  weft_ctl_msg *m = weft_ctl_inbox(s->ctl);
  while (m) {
    weft_ctl_msg *next = m->next;
    /* the probe's and the guests' are not the agreement's */
    if ((m->kind != WEFT_CTL_PROPOSAL && m->kind != WEFT_CTL_DECISION) || m->epoch > s->epoch) {
      m = next;
      continue;
    }
    if (m->epoch == s->epoch && !s->decision) {
      if (m->kind == WEFT_CTL_DECISION) {
        s->decision = malloc(m->len ? m->len : 1);
        if (s->decision) {
          memcpy(s->decision, m->body, m->len);
          s->decision_len = m->len;
          s->decided_from = m->from;
        }
      } else if (m->kind == WEFT_CTL_PROPOSAL && !proposal_take(s, m->from, m->body, m->len)) {
        weft_ctl_mark_lost(s->ctl, m->from, "it sent a malformed proposal");
      }
    }
    weft_ctl_take(s->ctl, m);
    m = next;
  }
}

static int coordinator_of(const agree_state *s) {
  for (int p = 0; p < s->size; p++)
    if (p == s->rank || !weft_ctl_lost(s->ctl, p)) return p;
  return s->rank;
}

/* The first rank the coordinator still waits for, or -1. */
static int waiting_for(const agree_state *s) {
  for (int p = 0; p < s->size; p++)
    if (p != s->rank && !weft_ctl_lost(s->ctl, p) && !s->props[p].got) return p;
  return -1;
}

weft_status weft_agree(weft_ctl *ctl, uint32_t epoch, uint32_t flags, const void *payload,
                       size_t len, double deadline, weft_agreement *out, weft_error_sink *err) {
  memset(out, 0, sizeof *out);
  agree_state s = {.ctl = ctl, .rank = weft_ctl_rank(ctl), .size = weft_ctl_size(ctl),
                   .epoch = epoch, .decided_from = -1};
  s.props = calloc((size_t)s.size, sizeof *s.props);
  weft_status st = WEFT_ERR_NOMEM;
  if (!s.props) goto nomem;
  size_t mine_len;
  uint8_t *mine = proposal_bytes(&s, flags, payload, len, &mine_len);
  if (!mine || !proposal_take(&s, s.rank, mine, (uint32_t)mine_len)) {
    free(mine);
    goto nomem;
  }
  int sent_to = -1;
  bool dialed_all = false;
  for (;;) {
    st = weft_ctl_progress(ctl, 0, err);
    if (st) break;
    inbox_read(&s);
    if (s.decision) break;
    int c = coordinator_of(&s);
    if (c == s.rank) {
      /* the dead show at once (their listeners refuse), a cut link within
       * WEFT_SUSPECT (the pings): every rank not heard from yet */
      for (int p = 0; p < s.size; p++)
        if (!s.props[p].got) weft_ctl_touch(ctl, p);
      if (!dialed_all) {
        dialed_all = true;
        continue;
      }
      if (waiting_for(&s) < 0) {
        /* drain once more: a decision relayed before its sender died is
         * in our sockets, and must win over a new one */
        st = weft_ctl_progress(ctl, 0, err);
        if (st) break;
        inbox_read(&s);
        if (s.decision) break;
        if (waiting_for(&s) >= 0) continue;
        if (!decide(&s)) {
          st = WEFT_ERR_NOMEM;
          break;
        }
        break;
      }
    } else if (sent_to != c) {
      weft_ctl_send(ctl, c, WEFT_CTL_PROPOSAL, epoch, mine, mine_len);
      sent_to = c;
    } else {
      weft_ctl_touch(ctl, c); /* a coordinator behind a cut link shows */
    }
    double now = weft_now();
    if (now >= deadline) {
      int w = c == s.rank ? waiting_for(&s) : c;
      weft_error_sink_set(err,
                          "agreement #%u: no %s from rank %d within the timeout (is it alive and "
                          "does it call the same recovery?)",
                          epoch, c == s.rank ? "proposal" : "decision", w);
      st = WEFT_ERR_TIMEOUT;
      break;
    }
    st = weft_ctl_progress(ctl, now + 0.05 < deadline ? now + 0.05 : deadline, err);
    if (st) break;
  }
  free(mine);
  if (st || !s.decision) goto done;
  if (!decision_parse(s.decision, s.decision_len, s.size, out)) {
    weft_error_sink_set(err, "agreement #%u: rank %d sent a malformed decision", epoch,
                        s.decided_from);
    st = WEFT_ERR_PROTOCOL;
    goto done;
  }
  out->decision = s.decision;
  s.decision = NULL;
  /* relay: every survivor gets it from us too, before we return, and so
   * does a rank that proposed but is counted lost (so it learns so) */
  for (int p = 0; p < s.size; p++)
    if (p != s.rank && p != s.decided_from && (!out->lost[p] || s.props[p].got))
      weft_ctl_send(ctl, p, WEFT_CTL_DECISION, epoch, out->decision, s.decision_len);
  while (!weft_ctl_flushed(ctl) && weft_now() < deadline) {
    st = weft_ctl_progress(ctl, weft_now() + 0.01, err);
    if (st) goto done;
  }
  if (out->lost[s.rank]) {
    weft_error_sink_set(err,
                        "agreement #%u: rank %d (coordinating) counts this rank as lost: another "
                        "rank lost its connection to it",
                        epoch, out->coordinator);
    st = WEFT_ERR_REVOKED;
  } else {
    WEFT_INFO(WEFT_SUBSYS_INIT, "agreement #%u: %d of %d ranks lost, flags 0x%x (rank %d decided)",
              epoch, out->nlost, s.size, out->flags, out->coordinator);
  }
done:
  free(s.decision);
  props_free(&s);
  if (st) weft_agreement_free(out);
  return st;
nomem:
  props_free(&s);
  weft_error_sink_set(err, "out of memory");
  return st;
}

void weft_agreement_free(weft_agreement *a) {
  free(a->lost);
  free(a->data);
  free(a->data_len);
  free(a->decision);
  memset(a, 0, sizeof *a);
}
