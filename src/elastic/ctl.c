/* ctl.c - the control plane (ctl.h): one listener, a connection per peer
 * and direction as needed, framed messages, and the loss detector. */
#include "src/elastic/ctl.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "src/base/bytes.h"
#include "src/base/log.h"
#include "src/base/status.h"

#define CTL_MAGIC 0x57464354u /* "WFCT" */
#define CTL_HDR_BYTES 20
#define CTL_BODY_MAX (16u << 20)
#define CTL_MAC_CONTEXT "weft control frame"
#define CTL_HELLO_BYTES (12 + WEFT_AUTH_CHALLENGE_BYTES)

/* ctl's own kinds (the agreement's start at 16, ctl.h): the hello, and a
 * ping that nobody answers: a write the peer's kernel must acknowledge, so
 * a cut link shows within WEFT_SUSPECT (TCP_USER_TIMEOUT) even while we
 * only wait to hear from that peer */
enum { CTL_HELLO = 2, CTL_PING = 3 };

/* A connection's state. An outbound one: CONNECTING until the kernel
 * connected it, then READY: its hello and frames go out at once, without
 * waiting for the peer to take part (a peer that already left the
 * agreement still gets what we relay: its kernel acknowledges it). An
 * inbound one: WAIT_HELLO from accept until the dialer proved itself. */
enum { CONN_CONNECTING, CONN_WAIT_HELLO, CONN_READY };

typedef struct ctl_conn {
  int fd;
  int peer;  /* -1 for an inbound one until its hello, and for a guest's */
  int guest; /* >= 0: a guest's connection (inbound; it carries frames both ways) */
  bool outbound;
  int state;
  double since;     /* when it entered its state */
  double pinged_at; /* the last ping (weft_ctl_touch) */
  /* the dialer's nonce: every frame after the hello carries a MAC over
   * it, its header and its body, under the job key */
  uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES];
  uint8_t *out; /* frames to write, from out_off */
  size_t out_len, out_off, out_cap;
  uint8_t *in; /* bytes read, not yet a whole frame */
  size_t in_len, in_cap;
} ctl_conn;

typedef struct ctl_peer {
  struct sockaddr_storage addr;
  socklen_t addr_len;
  bool known;
  bool same_host;
  uint32_t pid;
  int pidfd; /* -1: none (yet) */
  bool lost;
  char why[192];
  ctl_conn *dial; /* our outbound connection, or NULL */
} ctl_peer;

struct weft_ctl {
  int rank, size;
  uint64_t comm_id;
  weft_auth_key key;
  double suspect_s;
  int listen_fd;
  ctl_peer *peers;
  ctl_conn **conns;
  int nconns, conns_cap;
  struct pollfd *pfds;
  int pfds_cap;
  weft_ctl_msg *inbox, *inbox_tail;
  int nguests; /* guests that said hello so far */
};

/* ---- bytes ---------------------------------------------------------------- */


static bool grow(uint8_t **buf, size_t *cap, size_t need) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  uint8_t *b = realloc(*buf, c);
  if (!b) return false;
  *buf = b;
  *cap = c;
  return true;
}

/* Appends one frame to the connection's queue (at the front: a hello,
 * which must precede what was queued while the dial was under way). */
static bool conn_queue(ctl_conn *c, const weft_ctl *ctl, uint32_t kind, uint32_t epoch,
                       const void *body, size_t len, bool front) {
  size_t pending = c->out_len - c->out_off;
  if (c->out_off && !front) { /* compact what was written */
    memmove(c->out, c->out + c->out_off, pending);
    c->out_off = 0;
    c->out_len = pending;
  }
  size_t whole = CTL_HDR_BYTES + len + WEFT_AUTH_MAC_BYTES;
  if (!grow(&c->out, &c->out_cap, pending + whole + c->out_off)) return false;
  uint8_t *at;
  if (front) {
    memmove(c->out + c->out_off + whole, c->out + c->out_off, pending);
    at = c->out + c->out_off;
  } else {
    at = c->out + c->out_len;
  }
  weft_put32(at, CTL_MAGIC);
  weft_put32(at + 4, kind);
  weft_put32(at + 8, (uint32_t)ctl->rank);
  weft_put32(at + 12, epoch);
  weft_put32(at + 16, (uint32_t)len);
  if (len) memcpy(at + CTL_HDR_BYTES, body, len);
  weft_auth_mac(&ctl->key, CTL_MAC_CONTEXT, c->nonce, at, CTL_HDR_BYTES + len,
                at + CTL_HDR_BYTES + len);
  c->out_len += whole;
  return true;
}

/* ---- losses --------------------------------------------------------------- */

void weft_ctl_mark_lost(weft_ctl *ctl, int peer, const char *why) {
  ctl_peer *p = &ctl->peers[peer];
  if (p->lost || peer == ctl->rank) return;
  p->lost = true;
  snprintf(p->why, sizeof p->why, "%s", why);
  WEFT_INFO(WEFT_SUBSYS_INIT, "control plane: rank %d counts peer %d as lost: %s", ctl->rank, peer,
            why);
}

const char *weft_ctl_lost(const weft_ctl *ctl, int peer) {
  return ctl->peers[peer].lost ? ctl->peers[peer].why : NULL;
}

static void conn_free(ctl_conn *c) {
  if (c->fd >= 0) close(c->fd);
  free(c->out);
  free(c->in);
  free(c);
}

/* Ends a connection; `why` (not NULL) makes its peer lost: a connection
 * ends only with its process or its host's reachability. */
static void conn_end(weft_ctl *ctl, int i, const char *why) {
  ctl_conn *c = ctl->conns[i];
  if (c->peer >= 0) {
    if (ctl->peers[c->peer].dial == c) ctl->peers[c->peer].dial = NULL;
    if (why) weft_ctl_mark_lost(ctl, c->peer, why);
  }
  conn_free(c);
  ctl->conns[i] = ctl->conns[--ctl->nconns];
}

static ctl_conn *conn_add(weft_ctl *ctl, int fd, int peer, bool outbound, int state) {
  if (ctl->nconns == ctl->conns_cap) {
    int cap = ctl->conns_cap ? 2 * ctl->conns_cap : 16;
    ctl_conn **n = realloc(ctl->conns, sizeof *n * (size_t)cap);
    if (!n) return NULL;
    ctl->conns = n;
    ctl->conns_cap = cap;
  }
  ctl_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->peer = peer;
  c->guest = -1;
  c->outbound = outbound;
  c->state = state;
  c->since = weft_now();
  ctl->conns[ctl->nconns++] = c;
  return c;
}

/* A dead link shows as unacknowledged data: the kernel gives up on it
 * after WEFT_SUSPECT seconds (ETIMEDOUT) instead of its ~15 minutes. */
static void conn_tune(const weft_ctl *ctl, int fd) {
  net_set_nodelay(fd);
  unsigned ms = (unsigned)(ctl->suspect_s * 1000);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
}

/* ---- open, close ---------------------------------------------------------- */

weft_status weft_ctl_open(int rank, int size, uint64_t comm_id, const weft_auth_key *key,
                          const struct sockaddr_storage *local, socklen_t local_len,
                          double suspect_s, weft_ctl **out, uint8_t addr[NET_ADDR_PACKED],
                          weft_error_sink *err) {
  *out = NULL;
  weft_ctl *ctl = calloc(1, sizeof *ctl);
  if (!ctl) return WEFT_ERR_NOMEM;
  ctl->rank = rank;
  ctl->size = size;
  ctl->comm_id = comm_id;
  ctl->key = *key;
  ctl->suspect_s = suspect_s;
  ctl->listen_fd = -1;
  ctl->peers = calloc((size_t)size, sizeof *ctl->peers);
  if (!ctl->peers) {
    free(ctl);
    return WEFT_ERR_NOMEM;
  }
  for (int p = 0; p < size; p++) ctl->peers[p].pidfd = -1;
  struct sockaddr_storage any = *local, bound;
  socklen_t bound_len;
  net_addr_set_port(&any, 0);
  weft_status st = net_listen(&any, local_len, 1024, &ctl->listen_fd, &bound, &bound_len, err);
  if (st) {
    weft_ctl_close(ctl);
    return st;
  }
  net_addr_pack(&bound, addr);
  *out = ctl;
  return WEFT_OK;
}

void weft_ctl_set_peer(weft_ctl *ctl, int peer, const uint8_t addr[NET_ADDR_PACKED], uint32_t pid,
                       bool same_host) {
  ctl_peer *p = &ctl->peers[peer];
  p->known = net_addr_unpack(addr, &p->addr, &p->addr_len);
  p->pid = pid;
  p->same_host = same_host;
}

void weft_ctl_close(weft_ctl *ctl) {
  if (!ctl) return;
  for (int i = 0; i < ctl->nconns; i++) conn_free(ctl->conns[i]);
  free(ctl->conns);
  for (int p = 0; ctl->peers && p < ctl->size; p++)
    if (ctl->peers[p].pidfd >= 0) close(ctl->peers[p].pidfd);
  free(ctl->peers);
  if (ctl->listen_fd >= 0) close(ctl->listen_fd);
  while (ctl->inbox) weft_ctl_take(ctl, ctl->inbox);
  free(ctl->pfds);
  free(ctl);
}

void weft_ctl_set_id(weft_ctl *ctl, uint64_t comm_id) { ctl->comm_id = comm_id; }

int weft_ctl_rank(const weft_ctl *ctl) { return ctl->rank; }
int weft_ctl_size(const weft_ctl *ctl) { return ctl->size; }

/* ---- sending -------------------------------------------------------------- */

static void ctl_dial(weft_ctl *ctl, int peer) {
  ctl_peer *p = &ctl->peers[peer];
  if (!p->known) {
    weft_ctl_mark_lost(ctl, peer, "it published no control-plane address");
    return;
  }
  int fd = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return; /* out of fds: tried again at the next send */
  conn_tune(ctl, fd);
  int state = CONN_READY;
  if (connect(fd, (const struct sockaddr *)&p->addr, p->addr_len)) {
    if (errno == EINPROGRESS) {
      state = CONN_CONNECTING;
    } else {
      char why[160];
      snprintf(why, sizeof why, "%s",
               errno == ECONNREFUSED ? "its control listener refuses connections: its process ended"
                                     : strerror(errno));
      close(fd);
      weft_ctl_mark_lost(ctl, peer, why);
      return;
    }
  }
  ctl_conn *c = conn_add(ctl, fd, peer, true, state);
  if (!c) {
    close(fd);
    return;
  }
  weft_auth_challenge(c->nonce);
  uint8_t hello[CTL_HELLO_BYTES];
  weft_put64(hello, ctl->comm_id);
  weft_put32(hello + 8, (uint32_t)ctl->rank);
  memcpy(hello + 12, c->nonce, sizeof c->nonce);
  if (!conn_queue(c, ctl, CTL_HELLO, 0, hello, sizeof hello, false)) {
    conn_end(ctl, ctl->nconns - 1, NULL);
    return;
  }
  p->dial = c;
}

void weft_ctl_touch(weft_ctl *ctl, int peer) {
  if (peer == ctl->rank || ctl->peers[peer].lost) return;
  ctl_conn *c = ctl->peers[peer].dial;
  if (!c) {
    ctl_dial(ctl, peer);
    return;
  }
  double now = weft_now();
  if (c->state == CONN_READY && c->out_len == c->out_off && now - c->pinged_at >= ctl->suspect_s / 4) {
    c->pinged_at = now;
    (void)conn_queue(c, ctl, CTL_PING, 0, NULL, 0, false);
  }
}

void weft_ctl_send(weft_ctl *ctl, int peer, uint32_t kind, uint32_t epoch, const void *body,
                   size_t len) {
  if (peer == ctl->rank || ctl->peers[peer].lost) return;
  if (!ctl->peers[peer].dial) ctl_dial(ctl, peer);
  ctl_conn *c = ctl->peers[peer].dial;
  if (!c || !conn_queue(c, ctl, kind, epoch, body, len, false))
    weft_ctl_mark_lost(ctl, peer, "this rank could not queue a message to it (out of memory)");
}

bool weft_ctl_flushed(weft_ctl *ctl) {
  for (int i = 0; i < ctl->nconns; i++) {
    ctl_conn *c = ctl->conns[i];
    if ((!c->outbound && c->guest < 0) || (c->peer >= 0 && ctl->peers[c->peer].lost)) continue;
    if (c->out_len > c->out_off || c->state != CONN_READY) return false;
    int unacked = 0;
    if (!ioctl(c->fd, SIOCOUTQ, &unacked) && unacked > 0) return false;
  }
  return true;
}

static ctl_conn *guest_conn(const weft_ctl *ctl, int g) {
  for (int i = 0; i < ctl->nconns; i++)
    if (ctl->conns[i]->guest == g) return ctl->conns[i];
  return NULL;
}

bool weft_ctl_guest_alive(const weft_ctl *ctl, int g) { return guest_conn(ctl, g) != NULL; }

bool weft_ctl_send_guest(weft_ctl *ctl, int g, uint32_t kind, const void *body, size_t len) {
  ctl_conn *c = guest_conn(ctl, g);
  return c && conn_queue(c, ctl, kind, 0, body, len, false);
}

/* ---- the guest's side ------------------------------------------------------ */

static weft_status guest_frame(int fd, const weft_auth_key *key,
                               const uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], uint32_t kind,
                               const void *body, size_t len, double deadline,
                               weft_error_sink *err) {
  size_t whole = CTL_HDR_BYTES + len + WEFT_AUTH_MAC_BYTES;
  uint8_t *f = malloc(whole);
  if (!f) return WEFT_ERR_NOMEM;
  weft_put32(f, CTL_MAGIC);
  weft_put32(f + 4, kind);
  weft_put32(f + 8, WEFT_CTL_GUEST_HELLO);
  weft_put32(f + 12, 0);
  weft_put32(f + 16, (uint32_t)len);
  if (len) memcpy(f + CTL_HDR_BYTES, body, len);
  weft_auth_mac(key, CTL_MAC_CONTEXT, nonce, f, CTL_HDR_BYTES + len, f + CTL_HDR_BYTES + len);
  weft_status st = net_send_all(fd, f, whole, deadline, err);
  free(f);
  return st;
}

weft_status weft_ctl_guest_hello(int fd, uint64_t comm_id, const weft_auth_key *key,
                                 uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], double deadline,
                                 weft_error_sink *err) {
  weft_auth_challenge(nonce);
  uint8_t hello[CTL_HELLO_BYTES];
  weft_put64(hello, comm_id);
  weft_put32(hello + 8, WEFT_CTL_GUEST_HELLO);
  memcpy(hello + 12, nonce, WEFT_AUTH_CHALLENGE_BYTES);
  return guest_frame(fd, key, nonce, CTL_HELLO, hello, sizeof hello, deadline, err);
}

weft_status weft_ctl_guest_send(int fd, const weft_auth_key *key,
                                const uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], uint32_t kind,
                                const void *body, size_t len, double deadline,
                                weft_error_sink *err) {
  return guest_frame(fd, key, nonce, kind, body, len, deadline, err);
}

weft_status weft_ctl_guest_recv(int fd, const weft_auth_key *key,
                                const uint8_t nonce[WEFT_AUTH_CHALLENGE_BYTES], uint32_t *kind,
                                uint8_t **body, uint32_t *len, double deadline,
                                weft_error_sink *err) {
  *body = NULL;
  uint8_t h[CTL_HDR_BYTES];
  WEFT_CHECK(net_recv_all(fd, h, sizeof h, deadline, err));
  uint32_t n = weft_get32(h + 16);
  if (weft_get32(h) != CTL_MAGIC || n > CTL_BODY_MAX) {
    weft_error_sink_set(err, "the member sent a malformed control message");
    return WEFT_ERR_PROTOCOL;
  }
  uint8_t *f = malloc(CTL_HDR_BYTES + (size_t)n + WEFT_AUTH_MAC_BYTES);
  if (!f) return WEFT_ERR_NOMEM;
  memcpy(f, h, sizeof h);
  weft_status st = net_recv_all(fd, f + CTL_HDR_BYTES, (size_t)n + WEFT_AUTH_MAC_BYTES, deadline, err);
  if (!st && !weft_auth_verify(key, CTL_MAC_CONTEXT, nonce, f, CTL_HDR_BYTES + n,
                               f + CTL_HDR_BYTES + n)) {
    weft_error_sink_set(err, "a message from the member failed its proof (another job's key?)");
    st = WEFT_ERR_PROTOCOL;
  }
  if (st) {
    free(f);
    return st;
  }
  *kind = weft_get32(h + 4);
  *len = n;
  memmove(f, f + CTL_HDR_BYTES, n);
  *body = f;
  return WEFT_OK;
}

/* ---- progress ------------------------------------------------------------- */

static void inbox_add(weft_ctl *ctl, int from, uint32_t kind, uint32_t epoch, const uint8_t *body,
                      uint32_t len) {
  weft_ctl_msg *m = malloc(sizeof *m + len);
  if (!m) {
    if (from >= 0)
      weft_ctl_mark_lost(ctl, from, "this rank could not hold a message of it (out of memory)");
    return;
  }
  m->from = from;
  m->kind = kind;
  m->epoch = epoch;
  m->len = len;
  m->body = (uint8_t *)(m + 1);
  if (len) memcpy(m->body, body, len);
  m->next = NULL;
  if (ctl->inbox_tail)
    ctl->inbox_tail->next = m;
  else
    ctl->inbox = m;
  ctl->inbox_tail = m;
}

weft_ctl_msg *weft_ctl_inbox(weft_ctl *ctl) { return ctl->inbox; }

void weft_ctl_take(weft_ctl *ctl, weft_ctl_msg *msg) {
  weft_ctl_msg **at = &ctl->inbox, *prev = NULL;
  while (*at && *at != msg) {
    prev = *at;
    at = &(*at)->next;
  }
  if (!*at) return;
  *at = msg->next;
  if (ctl->inbox_tail == msg) ctl->inbox_tail = prev;
  free(msg);
}

/* One whole frame of connection i (its MAC at body + len). false: the
 * connection ends. */
static bool conn_frame(weft_ctl *ctl, int i, const uint8_t *frame, uint32_t len) {
  ctl_conn *c = ctl->conns[i];
  uint32_t kind = weft_get32(frame + 4), from = weft_get32(frame + 8), epoch = weft_get32(frame + 12);
  const uint8_t *body = frame + CTL_HDR_BYTES;
  if (c->state == CONN_WAIT_HELLO) { /* only a proof may come first */
    bool guest = from == WEFT_CTL_GUEST_HELLO;
    if (kind != CTL_HELLO || len != CTL_HELLO_BYTES || weft_get64(body) != ctl->comm_id ||
        weft_get32(body + 8) != from ||
        (!guest && (from >= (uint32_t)ctl->size || (int)from == ctl->rank)))
      goto unproven;
    memcpy(c->nonce, body + 12, sizeof c->nonce);
    if (!weft_auth_verify(&ctl->key, CTL_MAC_CONTEXT, c->nonce, frame, CTL_HDR_BYTES + len,
                          body + len))
      goto unproven;
    if (guest) {
      c->guest = ctl->nguests++;
      WEFT_INFO(WEFT_SUBSYS_INIT, "control plane: rank %d has guest %d (a process asking in)",
                ctl->rank, c->guest);
    } else {
      c->peer = (int)from;
    }
    c->state = CONN_READY;
    return true;
  unproven:
    WEFT_INFO(WEFT_SUBSYS_INIT, "control plane: rank %d drops a connection that did not prove "
              "it belongs to this communicator", ctl->rank);
    return false;
  }
  bool proven = weft_auth_verify(&ctl->key, CTL_MAC_CONTEXT, c->nonce, frame, CTL_HDR_BYTES + len,
                                 body + len);
  if (c->guest >= 0) { /* a guest's: dropped when it misbehaves, nobody is lost */
    if (!proven || from != WEFT_CTL_GUEST_HELLO) return false;
    if (kind >= WEFT_CTL_PROPOSAL) inbox_add(ctl, WEFT_CTL_GUEST(c->guest), kind, epoch, body, len);
    return true;
  }
  if (c->outbound || (int)from != c->peer || !proven) {
    weft_ctl_mark_lost(ctl, c->peer, "a control message on its connection failed its proof");
    return false;
  }
  if (kind >= WEFT_CTL_PROPOSAL) inbox_add(ctl, c->peer, kind, epoch, body, len);
  return true;
}

/* Reads what connection i has; false: it ended (its peer lost if proven). */
static bool conn_read(weft_ctl *ctl, int i) {
  ctl_conn *c = ctl->conns[i];
  for (;;) {
    if (!grow(&c->in, &c->in_cap, c->in_len + 4096)) return false;
    ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (r > 0) c->in_len += (size_t)r;
    /* whole frames first: what a peer sent before it ended counts */
    size_t at = 0;
    while (c->in_len - at >= CTL_HDR_BYTES) {
      const uint8_t *h = c->in + at;
      uint32_t len = weft_get32(h + 16);
      if (weft_get32(h) != CTL_MAGIC || len > CTL_BODY_MAX) {
        if (c->peer >= 0 && c->state == CONN_READY)
          weft_ctl_mark_lost(ctl, c->peer, "it sent a malformed control message");
        return false;
      }
      size_t whole = CTL_HDR_BYTES + (size_t)len + WEFT_AUTH_MAC_BYTES;
      if (c->in_len - at < whole) break;
      if (!conn_frame(ctl, i, h, len)) return false;
      c = ctl->conns[i];
      at += whole;
    }
    if (at) {
      memmove(c->in, c->in + at, c->in_len - at);
      c->in_len -= at;
    }
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false; /* EOF or an error */
  }
}

static bool conn_write(ctl_conn *c) {
  while (c->out_len > c->out_off) {
    ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      c->out_off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  c->out_off = c->out_len = 0;
  return true;
}

static void ctl_accept(weft_ctl *ctl) {
  for (;;) {
    int fd = accept4(ctl->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    conn_tune(ctl, fd);
    if (!conn_add(ctl, fd, -1, false, CONN_WAIT_HELLO)) {
      close(fd);
      return;
    }
  }
}

/* The pidfd of a peer of this host, opened at the first progress: a
 * process that ended shows there even while a child holds its sockets. */
static void ctl_watch_pids(weft_ctl *ctl) {
#ifdef SYS_pidfd_open
  for (int p = 0; p < ctl->size; p++) {
    ctl_peer *q = &ctl->peers[p];
    if (p == ctl->rank || !q->same_host || !q->pid || q->pidfd >= 0 || q->lost) continue;
    q->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)q->pid, 0);
    if (q->pidfd < 0 && errno == ESRCH) weft_ctl_mark_lost(ctl, p, "its process ended");
    if (q->pidfd < 0) q->pidfd = -2; /* not again */
  }
#endif
}

weft_status weft_ctl_progress(weft_ctl *ctl, double until, weft_error_sink *err) {
  ctl_watch_pids(ctl);
  int need = ctl->nconns + 1 + ctl->size;
  if (need > ctl->pfds_cap) {
    struct pollfd *n = realloc(ctl->pfds, sizeof *n * (size_t)need);
    if (!n) {
      weft_error_sink_set(err, "out of memory");
      return WEFT_ERR_NOMEM;
    }
    ctl->pfds = n;
    ctl->pfds_cap = need;
  }
  struct pollfd *pf = ctl->pfds;
  int n = 0;
  pf[n++] = (struct pollfd){.fd = ctl->listen_fd, .events = POLLIN};
  for (int i = 0; i < ctl->nconns; i++) {
    ctl_conn *c = ctl->conns[i];
    short ev = POLLIN;
    if (c->state == CONN_CONNECTING || c->out_len > c->out_off) ev |= POLLOUT;
    pf[n++] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  int npid0 = n;
  for (int p = 0; p < ctl->size; p++)
    pf[n++] = (struct pollfd){.fd = ctl->peers[p].pidfd >= 0 && !ctl->peers[p].lost
                                        ? ctl->peers[p].pidfd
                                        : -1,
                              .events = POLLIN};
  double now = weft_now();
  /* a dial that hangs wakes us at its WEFT_SUSPECT bound */
  double wake = until;
  for (int i = 0; i < ctl->nconns; i++)
    if (ctl->conns[i]->state == CONN_CONNECTING && ctl->conns[i]->since + ctl->suspect_s < wake)
      wake = ctl->conns[i]->since + ctl->suspect_s;
  int ms = wake > now ? (int)((wake - now) * 1000) + 1 : 0;
  int got = poll(pf, (nfds_t)n, ms);
  if (got < 0 && errno != EINTR) {
    weft_error_sink_set(err, "poll: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  now = weft_now();
  if (pf[0].revents) ctl_accept(ctl);
  /* connections in the order polled; conn_end moves the last one into i,
   * so walk backwards and re-check the fd each time */
  int nc = npid0 - 1;
  for (int i = nc - 1; i >= 0; i--) {
    if (i >= ctl->nconns) continue;
    ctl_conn *c = ctl->conns[i];
    short rev = pf[i + 1].fd == c->fd ? pf[i + 1].revents : 0;
    if (c->state == CONN_CONNECTING) {
      if (rev & (POLLOUT | POLLERR | POLLHUP)) {
        int e = 0;
        socklen_t el = sizeof e;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el)) e = errno;
        if (e) {
          char why[160];
          snprintf(why, sizeof why, "%s",
                   e == ECONNREFUSED ? "its control listener refuses connections: its process ended"
                                     : strerror(e));
          conn_end(ctl, i, why);
          continue;
        }
        c->state = CONN_READY;
        c->since = now;
      } else if (now - c->since >= ctl->suspect_s) {
        char why[160];
        snprintf(why, sizeof why, "its host did not answer a dial for %.1f s (WEFT_SUSPECT)",
                 ctl->suspect_s);
        conn_end(ctl, i, why);
        continue;
      }
    }
    if (rev & (POLLIN | POLLERR | POLLHUP)) {
      if (!conn_read(ctl, i)) {
        c = ctl->conns[i];
        char why[160];
        int e = 0;
        socklen_t el = sizeof e;
        (void)getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
        snprintf(why, sizeof why, "its control connection ended (%s)",
                 e ? strerror(e) : "closed: its process ended or left");
        conn_end(ctl, i, c->state == CONN_READY || c->outbound ? why : NULL);
        continue;
      }
    }
    c = ctl->conns[i];
    if (c->state == CONN_READY && c->out_len > c->out_off && !conn_write(c)) {
      char why[160];
      snprintf(why, sizeof why, "writing to its control connection: %s", strerror(errno));
      conn_end(ctl, i, why);
    }
  }
  /* after the connections: whatever it sent before it ended is read */
  for (int p = 0; p < ctl->size; p++)
    if (pf[npid0 + p].fd >= 0 && (pf[npid0 + p].revents & POLLIN))
      weft_ctl_mark_lost(ctl, p, "its process ended");
  /* a lost peer's connections carry nothing more */
  for (int i = ctl->nconns - 1; i >= 0; i--)
    if (ctl->conns[i]->peer >= 0 && ctl->peers[ctl->conns[i]->peer].lost) conn_end(ctl, i, NULL);
  return WEFT_OK;
}
