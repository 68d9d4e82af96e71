/* recover.c - surviving a lost rank (weft.h): weft_comm_agree and
 * weft_comm_shrink, over the communicator's control plane
 * (src/elastic/ctl.h) and its agreement (src/elastic/agree.h). Revoking is
 * a stop like abort (comm.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/bytes.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/settings.h"
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

/* ---- grow ------------------------------------------------------------------- */

#define GROW_MAGIC 0x57464752u /* "WFGR" */
#define GROW_ADDRS 4           /* control planes named in an id: ranks 0..3 */
#define GROW_KEY_INCLUDED 0x80u

/* A process that asked in at this member and was not admitted yet. */
struct weft_guest {
  int index; /* its control-plane guest index */
  uint32_t pid;
  char host[BOOT_HOST_BYTES];
};


WEFT_API weft_status weft_comm_grow_id(const weft_comm *comm, weft_unique_id *id) {
  const char *call = "weft_comm_grow_id";
  if (!weft_comm_is_live(comm))
    return weft_init_error(WEFT_ERR_INVALID, -1, call, "not a live communicator");
  if (!id) return weft_init_error(WEFT_ERR_INVALID, comm->core.rank, call, "id is NULL");
  memset(id, 0, sizeof *id);
  uint8_t *b = (uint8_t *)id->bytes;
  weft_put32(b, GROW_MAGIC);
  bool token = *weft_setting_str(WEFT_SETTING_AUTH_TOKEN) != 0;
  weft_put64(b + 5, comm->id);
  if (!token) memcpy(b + 13, comm->auth_key.key, 32);
  int n = 0;
  for (int p = 0; p < comm->core.size && n < GROW_ADDRS; p++) {
    const void *addr;
    size_t len;
    weft_comm_peer_address(comm, p, WEFT_COMM_CTL_ADDR_ID, &addr, &len);
    if (addr && len == NET_ADDR_PACKED) memcpy(b + 45 + NET_ADDR_PACKED * n++, addr, len);
  }
  if (!n)
    return weft_init_error(WEFT_ERR_INVALID, comm->core.rank, call,
                           "a communicator of one rank has no control plane to join through");
  b[4] = (uint8_t)(n | (token ? 0 : GROW_KEY_INCLUDED));
  return WEFT_OK;
}

/* The guests' JOIN messages that reached this member, into comm->guests. */
static void guests_take(weft_comm *comm) {
  for (weft_ctl_msg *m = weft_ctl_inbox(comm->ctl), *next; m; m = next) {
    next = m->next;
    if (m->from > -2 || m->kind != WEFT_CTL_JOIN) continue;
    if (m->len >= 5 && m->len < 5 + BOOT_HOST_BYTES) {
      struct weft_guest *g = realloc(comm->guests, sizeof *g * (size_t)(comm->nguests + 1));
      if (g) {
        comm->guests = g;
        g += comm->nguests++;
        g->index = WEFT_CTL_GUEST_INDEX(m->from);
        g->pid = weft_get32(m->body);
        memset(g->host, 0, sizeof g->host);
        memcpy(g->host, m->body + 5, m->body[4] < m->len - 5 ? m->body[4] : m->len - 5);
      }
    }
    weft_ctl_take(comm->ctl, m);
  }
  /* one that hung up is not waiting any more */
  for (int i = comm->nguests - 1; i >= 0; i--)
    if (!weft_ctl_guest_alive(comm->ctl, comm->guests[i].index))
      comm->guests[i] = comm->guests[--comm->nguests];
}

/* The INFO message of guest `index`, once it came (NULL until then). */
static weft_ctl_msg *guest_info(weft_comm *comm, int index) {
  for (weft_ctl_msg *m = weft_ctl_inbox(comm->ctl); m; m = m->next)
    if (m->from == WEFT_CTL_GUEST(index) && m->kind == WEFT_CTL_INFO) return m;
  return NULL;
}

static weft_status grow_admit(weft_comm *comm, const char *call, int nnew, int *admitted,
                              int *first_rank, double deadline) {
  /* agree on who asked in, until nnew did */
  for (;;) {
    pthread_mutex_lock(&comm->ctl_lock);
    weft_error_sink err;
    (void)weft_ctl_progress(comm->ctl, 0, &err);
    guests_take(comm);
    pthread_mutex_unlock(&comm->ctl_lock);
    uint32_t mine = (uint32_t)comm->nguests;
    weft_agreement a;
    uint8_t payload[4];
    weft_put32(payload, mine);
    WEFT_CHECK(comm_agree(comm, call, 0, payload, sizeof payload, &a));
    int before = 0, total = 0;
    bool lost = a.nlost > 0;
    for (int p = 0; p < a.size && !lost; p++) {
      uint32_t n = a.data_len[p] == 4 ? weft_get32(a.data[p]) : 0;
      if (p < comm->core.rank) before += (int)n;
      total += (int)n;
    }
    weft_agreement_free(&a);
    if (lost)
      return weft_core_error(&comm->core, WEFT_ERR_PEER_LOST, call,
                             "a member was lost while the communicator grew: shrink it first");
    if (total >= nnew) {
      /* the first nnew, in the order of their members' ranks */
      *first_rank = comm->core.size + before;
      *admitted = before >= nnew ? 0 : (mine < (uint32_t)(nnew - before) ? (int)mine : nnew - before);
      return WEFT_OK;
    }
    if (weft_now() >= deadline)
      return weft_core_error(&comm->core, WEFT_ERR_TIMEOUT, call,
                             "%d of the %d processes to admit asked in within the timeout", total,
                             nnew);
    pthread_mutex_lock(&comm->ctl_lock);
    (void)weft_ctl_progress(comm->ctl, weft_now() + 0.02, &err);
    pthread_mutex_unlock(&comm->ctl_lock);
  }
}

WEFT_API weft_status weft_comm_grow(weft_comm *comm, int nnew, weft_comm **newcomm) {
  const char *call = "weft_comm_grow";
  WEFT_CHECK(recover_enter(comm, call));
  if (!newcomm) return weft_core_error(&comm->core, WEFT_ERR_INVALID, call, "newcomm is NULL");
  *newcomm = NULL;
  if (nnew < 1) return weft_core_error(&comm->core, WEFT_ERR_INVALID, call, "nnew is %d", nnew);
  if (!comm->ctl)
    return weft_core_error(&comm->core, WEFT_ERR_UNSUPPORTED, call,
                           "a communicator of one rank has no control plane to grow through");
  double t0 = weft_now(), deadline = t0 + comm->core.fail.timeout_s;
  int admitted = 0, first = 0;
  WEFT_CHECK(grow_admit(comm, call, nnew, &admitted, &first, deadline));
  int size = comm->core.size + nnew;
  /* my admitted guests learn their ranks, then start as this rank does */
  pthread_mutex_lock(&comm->ctl_lock);
  for (int k = 0; k < admitted; k++) {
    uint8_t admit[8];
    weft_put32(admit, (uint32_t)(first + k));
    weft_put32(admit + 4, (uint32_t)size);
    weft_ctl_send_guest(comm->ctl, comm->guests[k].index, WEFT_CTL_ADMIT, admit, sizeof admit);
  }
  pthread_mutex_unlock(&comm->ctl_lock);
  weft_comm *child = NULL;
  boot_rank_info mine;
  weft_status st = weft_comm_child_start(comm, comm->core.rank, size, call, &child, &mine);
  /* payload: mine, then each admitted guest's (rank, info), length-prefixed */
  uint8_t *payload = malloc((size_t)(1 + admitted) * (8 + sizeof mine));
  size_t len = 0;
  bool guests_ok = payload != NULL;
  if (payload && !st) {
    len = 4 + info_pack(&mine, payload + 4);
    weft_put32(payload, (uint32_t)(len - 4));
  }
  pthread_mutex_lock(&comm->ctl_lock);
  for (int k = 0; k < admitted && guests_ok && !st; k++) {
    weft_ctl_msg *m;
    weft_error_sink err;
    while (!(m = guest_info(comm, comm->guests[k].index)) &&
           weft_ctl_guest_alive(comm->ctl, comm->guests[k].index) && weft_now() < deadline)
      (void)weft_ctl_progress(comm->ctl, weft_now() + 0.01, &err);
    boot_rank_info g;
    if (!m || !info_unpack(m->body, m->len, (uint32_t)(first + k), &g)) {
      guests_ok = false;
      break;
    }
    weft_ctl_take(comm->ctl, m);
    weft_put32(payload + len, (uint32_t)(first + k));
    size_t n = info_pack(&g, payload + len + 8);
    weft_put32(payload + len + 4, (uint32_t)n);
    len += 8 + n;
  }
  pthread_mutex_unlock(&comm->ctl_lock);
  weft_agreement b;
  weft_status ast =
      comm_agree(comm, call, st || !guests_ok ? 1u : 0u, payload, st ? 0 : len, &b);
  free(payload);
  if (ast) {
    weft_comm_child_drop(child);
    return ast;
  }
  boot_rank_info *infos = calloc((size_t)size, sizeof *infos);
  int have = 0;
  if (!(b.flags & 1u) && !b.nlost && infos) {
    for (int p = 0; p < b.size; p++) {
      const uint8_t *d = b.data[p];
      uint32_t dl = b.data_len[p], at = 0;
      if (dl < 4 || weft_get32(d) > dl - 4 || !info_unpack(d + 4, weft_get32(d), (uint32_t)p, &infos[p]))
        break;
      have++;
      at = 4 + weft_get32(d);
      while (dl - at >= 8) {
        uint32_t r = weft_get32(d + at), n = weft_get32(d + at + 4);
        if (r >= (uint32_t)size || n > dl - at - 8 || !info_unpack(d + at + 8, n, r, &infos[r]))
          break;
        have++;
        at += 8 + n;
      }
    }
  }
  uint64_t id = weft_comm_derive_id(comm, 0x47524f5700000000ull | comm->agreements);
  weft_agreement_free(&b);
  if (have != size) {
    free(infos);
    weft_comm_child_drop(child);
    /* the admitted guests hear it from their connection's end */
    return st ? st
              : weft_core_error(&comm->core, WEFT_ERR_PEER_LOST, call,
                                "a rank or a process being admitted was lost while the "
                                "communicator grew (%d of %d ranks known)",
                                have, size);
  }
  /* the table, to my admitted guests: id, size, every rank's info */
  size_t tlen = 12;
  uint8_t *table = malloc(12 + (size_t)size * (4 + sizeof(boot_rank_info)));
  if (table) {
    weft_put64(table, id);
    weft_put32(table + 8, (uint32_t)size);
    for (int r = 0; r < size; r++) {
      size_t n = info_pack(&infos[r], table + tlen + 4);
      weft_put32(table + tlen, (uint32_t)n);
      tlen += 4 + n;
    }
  }
  pthread_mutex_lock(&comm->ctl_lock);
  for (int k = 0; k < admitted && table; k++)
    weft_ctl_send_guest(comm->ctl, comm->guests[k].index, WEFT_CTL_TABLE, table, tlen);
  weft_error_sink err;
  while (!weft_ctl_flushed(comm->ctl) && weft_now() < deadline)
    (void)weft_ctl_progress(comm->ctl, weft_now() + 0.01, &err);
  /* the admitted leave the waiting list */
  if (admitted) {
    memmove(comm->guests, comm->guests + admitted,
            sizeof *comm->guests * (size_t)(comm->nguests - admitted));
    comm->nguests -= admitted;
  }
  pthread_mutex_unlock(&comm->ctl_lock);
  free(table);
  st = weft_comm_child_finish(comm, child, infos, id, call);
  free(infos);
  if (st) {
    weft_comm_child_drop(child);
    return st;
  }
  WEFT_INFO(WEFT_SUBSYS_INIT, "grow: rank %d of %d, %d admitted (%d by this rank): %.1f ms",
            comm->core.rank, size, nnew, admitted, (weft_now() - t0) * 1e3);
  *newcomm = child;
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_join(const weft_unique_id *id, weft_comm **newcomm) {
  const char *call = "weft_comm_join";
  if (!id || !newcomm) return weft_init_error(WEFT_ERR_INVALID, -1, call, "id or newcomm is NULL");
  *newcomm = NULL;
  weft_status st;
  const uint8_t *b = (const uint8_t *)id->bytes;
  int naddrs = b[4] & 0x7f;
  if (weft_get32(b) != GROW_MAGIC || naddrs < 1 || naddrs > GROW_ADDRS)
    return weft_init_error(WEFT_ERR_INVALID, -1, call,
                           "the id is not one weft_comm_grow_id wrote");
  uint64_t comm_id = weft_get64(b + 5);
  weft_auth_key key;
  if (b[4] & GROW_KEY_INCLUDED) {
    memcpy(key.key, b + 13, 32);
    key.secret = true;
  } else {
    weft_auth_key_for_job(NULL, 0, &key); /* from WEFT_AUTH_TOKEN */
  }
  double timeout = weft_settings()->timeout_s, deadline = weft_now() + timeout;
  weft_error_sink err = {0};
  int fd = -1;
  for (int i = 0; i < naddrs && fd < 0; i++) {
    struct sockaddr_storage addr;
    socklen_t len;
    if (!net_addr_unpack(b + 45 + NET_ADDR_PACKED * i, &addr, &len)) continue;
    if (net_connect(&addr, len, deadline, false, &fd, &err)) fd = -1;
  }
  if (fd < 0)
    return weft_init_error(WEFT_ERR_PEER_LOST, -1, call,
                           "no member named in the id answers (%s)", err.msg);
  struct sockaddr_storage local;
  socklen_t local_len = sizeof local;
  getsockname(fd, (struct sockaddr *)&local, &local_len);
  uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], join[5 + BOOT_HOST_BYTES];
  weft_comm *comm = NULL;
  uint8_t *body = NULL;
  uint32_t kind = 0, len = 0;
  st = weft_ctl_guest_hello(fd, comm_id, &key, nonce, deadline, &err);
  if (!st) { /* its pid and host, as the members will see them */
    char host[BOOT_HOST_BYTES];
    weft_comm_host_here(host, sizeof host);
    size_t hlen = strnlen(host, sizeof host);
    weft_put32(join, (uint32_t)getpid());
    join[4] = (uint8_t)hlen;
    memcpy(join + 5, host, hlen);
    st = weft_ctl_guest_send(fd, &key, nonce, WEFT_CTL_JOIN, join, 5 + hlen, deadline, &err);
  }
  if (!st) st = weft_ctl_guest_recv(fd, &key, nonce, &kind, &body, &len, deadline, &err);
  if (!st && (kind != WEFT_CTL_ADMIT || len != 8)) st = WEFT_ERR_PROTOCOL;
  int rank = st ? -1 : (int)weft_get32(body), size = st ? 0 : (int)weft_get32(body + 4);
  free(body);
  body = NULL;
  boot_rank_info mine;
  if (!st) st = weft_comm_guest_start(rank, size, timeout, &local, local_len, &key, call, &comm, &mine);
  if (!st) {
    uint8_t packed[sizeof mine];
    size_t n = info_pack(&mine, packed);
    st = weft_ctl_guest_send(fd, &key, nonce, WEFT_CTL_INFO, packed, n, deadline, &err);
  }
  if (!st) st = weft_ctl_guest_recv(fd, &key, nonce, &kind, &body, &len, deadline, &err);
  boot_rank_info *infos = NULL;
  uint64_t new_id = 0;
  if (!st && (kind != WEFT_CTL_TABLE || len < 12 || weft_get32(body + 8) != (uint32_t)size))
    st = WEFT_ERR_PROTOCOL;
  if (!st) {
    new_id = weft_get64(body);
    infos = calloc((size_t)size, sizeof *infos);
    size_t at = 12;
    for (int r = 0; r < size && !st; r++) {
      uint32_t n = len - at >= 4 ? weft_get32(body + at) : UINT32_MAX;
      if (!infos || n > len - at - 4 || !info_unpack(body + at + 4, n, (uint32_t)r, &infos[r]))
        st = WEFT_ERR_PROTOCOL;
      at += 4 + (size_t)n;
    }
  }
  free(body);
  close(fd);
  if (!st) st = weft_comm_child_finish(NULL, comm, infos, new_id, call);
  free(infos);
  if (st) {
    weft_comm_child_drop(comm);
    if (st == WEFT_ERR_PROTOCOL && !err.msg[0])
      weft_error_sink_set(&err, "the member answered out of turn");
    /* without a sentence here, making the communicator failed and said why */
    if (err.msg[0]) weft_init_error(st, rank, call, "%s", err.msg);
    return st;
  }
  WEFT_INFO(WEFT_SUBSYS_INIT, "join: rank %d of %d", rank, size);
  *newcomm = comm;
  return WEFT_OK;
}
