/* recover.c - surviving a lost rank (weft.h): weft_comm_agree and
 * weft_comm_shrink, over the communicator's control plane
 * (src/elastic/ctl.h) and its agreement (src/elastic/agree.h). Revoking is
 * a stop like abort (comm.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/status.h"
#include "src/comm/comm.h"
#include "src/elastic/agree.h"

/* The usual checks of an entry point, and the control plane it needs. */
static weft_status recover_enter(weft_comm *comm, const char *call) {
  if (!weft_comm_is_live(comm))
    return weft_init_error(WEFT_ERR_INVALID, -1, call, "not a live communicator");
  if (comm->core.size > 1 && !comm->ctl)
    return weft_core_error(&comm->core, WEFT_ERR_INTERNAL, call, "it has no control plane");
  return WEFT_OK;
}

/* One agreement on `comm` (the next number), its failure worded. */
static weft_status comm_agree(weft_comm *comm, const char *call, uint32_t flags, const void *data,
                              size_t len, weft_agreement *out) {
  weft_error_sink err = {0};
  uint32_t epoch = comm->agreements++;
  double deadline = weft_now() + comm->core.fail.timeout_s;
  pthread_mutex_lock(&comm->ctl_lock);
  weft_status st = weft_agree(comm->ctl, epoch, flags, data, len, deadline, out, &err);
  pthread_mutex_unlock(&comm->ctl_lock);
  if (st) {
    /* the communicator's own failure stays the first cause; the message
     * of this call is ours */
    weft_status first = comm->core.fail.failed;
    weft_core_error(&comm->core, st, call, "%s", err.msg);
    comm->core.fail.failed = first;
  }
  return st;
}

WEFT_API weft_status weft_comm_agree(weft_comm *comm, uint32_t *flags, int *failed,
                                     int *nfailed) {
  const char *call = "weft_comm_agree";
  WEFT_CHECK(recover_enter(comm, call));
  if (!flags)
    return weft_core_error(&comm->core, WEFT_ERR_INVALID, call, "flags is NULL");
  if (nfailed) *nfailed = 0;
  if (comm->core.size == 1) return WEFT_OK;
  weft_agreement a;
  WEFT_CHECK(comm_agree(comm, call, *flags, NULL, 0, &a));
  *flags = a.flags;
  int n = 0;
  for (int p = 0; p < a.size; p++)
    if (a.lost[p]) {
      if (failed) failed[n] = p;
      n++;
    }
  if (nfailed) *nfailed = n;
  weft_agreement_free(&a);
  return WEFT_OK;
}

/* ---- shrink ----------------------------------------------------------------- */

/* What a survivor publishes for the new communicator: boot_rank_info,
 * packed without its unused room. */
static size_t info_pack(const boot_rank_info *in, uint8_t *out) {
  size_t host = strnlen(in->host, sizeof in->host);
  uint8_t *p = out;
  memcpy(p, &in->pid, 4);
  p += 4;
  *p++ = (uint8_t)host;
  memcpy(p, in->host, host);
  p += host;
  memcpy(p, &in->addr_len, 2);
  p += 2;
  memcpy(p, in->addr, in->addr_len);
  return (size_t)(p - out) + in->addr_len;
}

static bool info_unpack(const uint8_t *b, uint32_t len, uint32_t rank, boot_rank_info *out) {
  memset(out, 0, sizeof *out);
  out->rank = rank;
  if (len < 5) return false;
  memcpy(&out->pid, b, 4);
  size_t host = b[4];
  if (host >= sizeof out->host || len < 5 + host + 2) return false;
  memcpy(out->host, b + 5, host);
  memcpy(&out->addr_len, b + 5 + host, 2);
  if (out->addr_len > sizeof out->addr || len != 5 + host + 2 + out->addr_len) return false;
  memcpy(out->addr, b + 7 + host, out->addr_len);
  return true;
}

static bool same_lost(const weft_agreement *a, const weft_agreement *b) {
  return a->size == b->size && !memcmp(a->lost, b->lost, (size_t)a->size);
}

/* The survivors of `a` start a communicator of their own and agree on its
 * addresses; *again when a rank was lost meanwhile (then `a` becomes that
 * agreement, and the caller goes round once more). */
static weft_status shrink_round(weft_comm *comm, const char *call, weft_agreement *a,
                                weft_comm **out, bool *again) {
  *again = false;
  int size = a->size - a->nlost, rank = 0;
  for (int p = 0; p < comm->core.rank; p++) rank += !a->lost[p];
  weft_comm *child = NULL;
  boot_rank_info mine;
  weft_status st = weft_comm_child_start(comm, rank, size, call, &child, &mine);
  uint8_t packed[sizeof mine];
  size_t packed_len = st ? 0 : info_pack(&mine, packed);
  /* A rank that could not start its part still agrees, with flag 1, so
   * that every survivor fails alike instead of waiting for it. */
  weft_agreement b;
  weft_status ast = comm_agree(comm, call, st ? 1u : 0u, packed, packed_len, &b);
  if (ast) {
    weft_comm_child_drop(child);
    return ast;
  }
  if (b.flags & 1u) {
    weft_comm_child_drop(child);
    weft_status own = st;
    weft_agreement_free(&b);
    if (own) return own;
    return weft_core_error(&comm->core, WEFT_ERR_PEER_LOST, call,
                           "a surviving rank could not start its part of the new communicator");
  }
  if (!same_lost(a, &b)) { /* lost meanwhile: again, from this agreement */
    weft_comm_child_drop(child);
    weft_agreement_free(a);
    *a = b;
    *again = true;
    return WEFT_OK;
  }
  boot_rank_info *infos = calloc((size_t)size, sizeof *infos);
  if (!infos) {
    weft_comm_child_drop(child);
    weft_agreement_free(&b);
    return weft_core_error(&comm->core, WEFT_ERR_NOMEM, call, "out of memory");
  }
  int r = 0;
  for (int p = 0; p < b.size; p++) {
    if (b.lost[p]) continue;
    if (!info_unpack(b.data[p], b.data_len[p], (uint32_t)r, &infos[r])) {
      st = weft_core_error(&comm->core, WEFT_ERR_PROTOCOL, call,
                           "rank %d published a malformed address for the new communicator", p);
      break;
    }
    r++;
  }
  /* the same on every survivor: the old id and the agreement's number */
  uint64_t id = weft_comm_derive_id(comm, 0x5348524b00000000ull | comm->agreements);
  if (!st) st = weft_comm_child_finish(comm, child, infos, id, call);
  free(infos);
  weft_agreement_free(&b);
  if (st) {
    weft_comm_child_drop(child);
    return st;
  }
  *out = child;
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_shrink(weft_comm *comm, weft_comm **newcomm) {
  const char *call = "weft_comm_shrink";
  WEFT_CHECK(recover_enter(comm, call));
  if (!newcomm) return weft_core_error(&comm->core, WEFT_ERR_INVALID, call, "newcomm is NULL");
  *newcomm = NULL;
  double t0 = weft_now();
  /* the survivors' pending calls end, wherever they wait */
  if (!comm->core.fail.failed) weft_comm_revoke(comm);
  weft_comm *child = NULL;
  if (comm->core.size == 1) {
    boot_rank_info mine;
    weft_status st = weft_comm_child_start(comm, 0, 1, call, &child, &mine);
    if (!st) st = weft_comm_child_finish(comm, child, &mine, weft_comm_derive_id(comm, 1), call);
    if (st) {
      weft_comm_child_drop(child);
      return st;
    }
    *newcomm = child;
    return WEFT_OK;
  }
  weft_agreement a;
  WEFT_CHECK(comm_agree(comm, call, 0, NULL, 0, &a));
  double t_agreed = weft_now();
  weft_status st = WEFT_OK;
  for (int round = 0; round <= comm->core.size; round++) {
    bool again;
    st = shrink_round(comm, call, &a, &child, &again);
    if (st || !again) break;
  }
  int lost = a.nlost;
  weft_agreement_free(&a);
  if (st) return st;
  if (!child)
    return weft_core_error(&comm->core, WEFT_ERR_INTERNAL, call,
                           "ranks kept being lost: no stable set of survivors");
  WEFT_INFO(WEFT_SUBSYS_INIT,
            "shrink: rank %d of %d is rank %d of %d (%d lost): agreed in %.1f ms, new "
            "communicator in %.1f ms",
            comm->core.rank, comm->core.size, child->core.rank, child->core.size, lost,
            (t_agreed - t0) * 1e3, (weft_now() - t_agreed) * 1e3);
  *newcomm = child;
  return WEFT_OK;
}
