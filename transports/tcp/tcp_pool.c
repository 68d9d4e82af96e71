/* tcp_pool.c - the helper threads that drive a connection's streams past
 * the first (WEFT_TCP_THREADS), so one chunk's pieces move on several cores
 * at once. The caller posts a stream's pieces to send and the piece to
 * receive (tcp_conn.c) and keeps driving stream 0 itself; a helper writes
 * and reads its streams with the same non-blocking calls, under each
 * stream's lock, and tells the caller through the context's done fd when a
 * piece ended or the stream failed. A helper never writes the error sink or
 * anything of the context but its own flags: the caller turns what it found
 * into the connection's failure (tcp_stream_absorb), so every sentence still
 * comes from the one thread that drives the communicator. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/status.h"
#include "tcp.h"

static void tcp_pool_signal(int fd) {
  uint64_t one = 1;
  if (fd >= 0 && write(fd, &one, sizeof one) < 0) { /* full counter: already readable */
  }
}

static void tcp_stream_failed(tcp_stream *s, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tcp_stream_failed(tcp_stream *s, weft_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->why, sizeof s->why, fmt, ap);
  va_end(ap);
  s->failed = st;
}

/* Sends what the socket takes; true when a piece completed or it failed. */
static bool tcp_helper_send(tcp_stream *s, bool *moved) {
  tcp_conn *c = s->conn;
  int before = s->sq_count;
  while (s->sq_count) {
    ssize_t w = tcp_stream_write(s);
    if (w == -EINTR) continue;
    if (w == -EAGAIN) break;
    if (w < 0) {
      tcp_stream_failed(s, WEFT_ERR_PEER_LOST, "sending to peer %d (%s) on stream %d of %d: %s",
                        c->peer, c->where, s->index, c->nstreams, strerror((int)-w));
      return true;
    }
    *moved = true;
    atomic_store_explicit(&c->heard, true, memory_order_relaxed);
  }
  return s->sq_count < before;
}

/* The peer's failure notice came on this stream: its words, as
 * tcp_read_abort keeps them. */
static void tcp_helper_notice(tcp_stream *s) {
  const tcp_conn *c = s->conn;
  size_t len = ntohl(s->rhdr.len);
  if (len > TCP_ABORT_TEXT_MAX) len = TCP_ABORT_TEXT_MAX;
  size_t got = s->rpay_got < len ? s->rpay_got : len;
  if (got) memcpy(s->origin, s->rx_target, got);
  weft_error_sink err;
  if (got < len && net_recv_all(s->fd, s->origin + got, len - got, weft_now() + 1.0, &err))
    len = got;
  s->origin[len] = 0;
  s->failed_notice = true;
  tcp_stream_failed(s, WEFT_ERR_PEER_LOST, "peer %d passed on a failure: %s", c->peer, s->origin);
}

/* A piece's header: the frame the caller posted for, or why not. */
static bool tcp_helper_header(tcp_stream *s) {
  const tcp_conn *c = s->conn;
  tcp_frame_info f;
  if (tcp_frame_parse((const uint8_t *)&s->rhdr, sizeof s->rhdr, &f)) {
    tcp_stream_failed(s, WEFT_ERR_PROTOCOL, "garbage on stream %d of %d from %s", s->index,
                      c->nstreams, c->where);
    return false;
  }
  if (f.type == TCP_FRAME_ABORT) {
    tcp_helper_notice(s);
    return false;
  }
  if (f.type != TCP_FRAME_DATA) {
    tcp_stream_failed(s, WEFT_ERR_PROTOCOL, "unknown frame type %u from %s", f.type, c->where);
    return false;
  }
  weft_error_sink sink;
  if (weft_chunk_check(&sink, c->peer, f.tag, s->rx_tag, f.total, s->rx_total)) {
    tcp_stream_failed(s, WEFT_ERR_MISMATCH, "%s", sink.msg);
    return false;
  }
  if (f.len != s->rx_len) {
    tcp_stream_failed(s, WEFT_ERR_PROTOCOL,
                      "peer %d sent a %u-byte piece of a %zu-byte chunk on stream %d of %d "
                      "where %zu bytes belong",
                      c->peer, f.len, s->rx_total, s->index, c->nstreams, s->rx_len);
    return false;
  }
  return true;
}

/* Reads the posted piece; true when it completed or the stream failed. */
static bool tcp_helper_recv(tcp_stream *s, bool *moved) {
  tcp_conn *c = s->conn;
  while (s->rhdr_got < sizeof s->rhdr || s->rpay_got < s->rx_len) {
    bool hdr_was_open = s->rhdr_got < sizeof s->rhdr;
    ssize_t r = tcp_stream_read(s, s->rx_target, s->rx_len);
    if (r == -EINTR) continue;
    if (r == -EAGAIN) return false;
    if (r == 0) {
      tcp_stream_failed(s, WEFT_ERR_PEER_LOST,
                        "peer %d (%s) closed stream %d of %d: its process ended or crashed, or "
                        "the stream was cut",
                        c->peer, c->where, s->index, c->nstreams);
      return true;
    }
    if (r < 0) {
      tcp_stream_failed(s, WEFT_ERR_PEER_LOST, "receiving from peer %d (%s) on stream %d of %d: %s",
                        c->peer, c->where, s->index, c->nstreams, strerror((int)-r));
      return true;
    }
    *moved = true;
    atomic_store_explicit(&c->heard, true, memory_order_relaxed);
    if (hdr_was_open && s->rhdr_got == sizeof s->rhdr && !tcp_helper_header(s)) return true;
  }
  s->rx_done = true;
  return true;
}

static void *tcp_worker_main(void *arg) {
  tcp_worker *w = arg;
  tcp_ctx *ctx = w->ctx;
  tcp_stream **mine = NULL;
  struct pollfd *pf = NULL;
  int n = 0;
  while (!atomic_load(&ctx->stop)) {
    if (atomic_exchange(&w->changed, 0)) {
      pthread_mutex_lock(&w->lock);
      tcp_stream **m = realloc(mine, (size_t)w->n * sizeof *m);
      struct pollfd *p = realloc(pf, ((size_t)w->n + 1) * sizeof *p);
      if (m) mine = m;
      if (p) pf = p;
      if (m && p) {
        memcpy(mine, w->list, (size_t)w->n * sizeof *mine);
        n = w->n;
      } else {
        atomic_store(&w->changed, 1); /* try again next round */
      }
      pthread_mutex_unlock(&w->lock);
      if (!pf) {
        poll(NULL, 0, TCP_POOL_POLL_MS);
        continue;
      }
    }
    uint64_t drained;
    if (read(w->wake_fd, &drained, sizeof drained) < 0) { /* nothing posted since */
    }
    bool moved = false, ended = false;
    nfds_t k = 0;
    if (pf) pf[k++] = (struct pollfd){.fd = w->wake_fd, .events = POLLIN};
    for (int i = 0; i < n; i++) {
      tcp_stream *s = mine[i];
      short ev = 0;
      pthread_mutex_lock(&s->lock);
      if (!s->dead && !s->failed && s->sq_count) ended |= tcp_helper_send(s, &moved);
      if (!s->dead && !s->failed && s->rx_posted && !s->rx_done) ended |= tcp_helper_recv(s, &moved);
      if (!s->dead && !s->failed)
        ev = (short)((s->sq_count ? POLLOUT : 0) | (s->rx_posted && !s->rx_done ? POLLIN : 0));
      pthread_mutex_unlock(&s->lock);
      if (ev) pf[k++] = (struct pollfd){.fd = s->fd, .events = ev};
    }
    if (moved) atomic_store(&ctx->helper_moved, true);
    if (ended) tcp_pool_signal(ctx->done_fd);
    if (!moved && !ended && pf) poll(pf, k, TCP_POOL_POLL_MS);
  }
  free(mine);
  free(pf);
  return NULL;
}

weft_status tcp_pool_start(tcp_ctx *ctx) {
  if (ctx->workers) return ctx->nworkers > 0 ? WEFT_OK : WEFT_ERR_SYSTEM;
  int want = ctx->want_threads;
  ctx->workers = calloc((size_t)want, sizeof *ctx->workers);
  if (!ctx->workers) return WEFT_ERR_NOMEM;
  ctx->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ctx->done_fd < 0) return WEFT_ERR_SYSTEM;
  /* Helpers take no signals: the application's threads keep them. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (int i = 0; i < want; i++) {
    tcp_worker *w = &ctx->workers[i];
    w->ctx = ctx;
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->wake_fd < 0) break;
    pthread_mutex_init(&w->lock, NULL);
    if (pthread_create(&w->thread, NULL, tcp_worker_main, w)) {
      pthread_mutex_destroy(&w->lock);
      close(w->wake_fd);
      break;
    }
    ctx->nworkers++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (ctx->nworkers < want)
    WEFT_WARN(WEFT_SUBSYS_NET, "tcp: rank %d started %d of %d helper threads; this thread drives "
                               "the other streams",
              ctx->args->rank, ctx->nworkers, want);
  else
    WEFT_INFO(WEFT_SUBSYS_NET, "tcp: rank %d started %d helper threads", ctx->args->rank, want);
  return ctx->nworkers > 0 ? WEFT_OK : WEFT_ERR_SYSTEM;
}

void tcp_pool_adopt(tcp_ctx *ctx, tcp_stream *s) {
  int owner = (s->index - 1) % ctx->nworkers;
  tcp_worker *w = &ctx->workers[owner];
  pthread_mutex_lock(&w->lock);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 8;
    tcp_stream **l = realloc(w->list, (size_t)cap * sizeof *l);
    if (!l) { /* no room: the caller keeps driving this one */
      pthread_mutex_unlock(&w->lock);
      return;
    }
    w->list = l;
    w->cap = cap;
  }
  s->owner = owner; /* before the helper can see it: from now on, under its lock */
  w->list[w->n++] = s;
  pthread_mutex_unlock(&w->lock);
  atomic_store(&w->changed, 1);
  tcp_pool_signal(w->wake_fd);
}

void tcp_pool_wake(tcp_ctx *ctx, const tcp_stream *s) {
  tcp_pool_signal(ctx->workers[s->owner].wake_fd);
}

void tcp_pool_stop(tcp_ctx *ctx) {
  if (!ctx->workers) return;
  atomic_store(&ctx->stop, true);
  for (int i = 0; i < ctx->nworkers; i++) tcp_pool_signal(ctx->workers[i].wake_fd);
  for (int i = 0; i < ctx->nworkers; i++) {
    tcp_worker *w = &ctx->workers[i];
    pthread_join(w->thread, NULL);
    /* its streams are the caller's again */
    for (int j = 0; j < w->n; j++) w->list[j]->owner = -1;
    close(w->wake_fd);
    pthread_mutex_destroy(&w->lock);
    free(w->list);
  }
  free(ctx->workers);
  ctx->workers = NULL;
  ctx->nworkers = 0;
  ctx->want_threads = 0; /* never again for this context */
  if (ctx->done_fd >= 0) close(ctx->done_fd);
  ctx->done_fd = -1;
}
