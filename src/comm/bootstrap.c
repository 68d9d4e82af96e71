/* bootstrap.c - rendezvous server (one detached thread per job) and client.
 * Wire format: fixed-size records, integers big-endian; every record starts
 * with a magic and is length-checked before use. */
#include "src/comm/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "src/base/auth.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/status.h"

#define INFO_BYTES BOOT_INFO_BYTES
#define HELLO_BYTES BOOT_HELLO_BYTES
#define REPLY_BYTES BOOT_REPLY_BYTES
/* After the hello: the rank's own challenge and its proof over both. */
#define HELLO_AUTH_BYTES (HELLO_BYTES + WEFT_AUTH_CHALLENGE_BYTES + WEFT_AUTH_MAC_BYTES)
#define CHALLENGE_MSG_BYTES (4 + WEFT_AUTH_CHALLENGE_BYTES)
static const char boot_hello_context[] = "weft rendezvous hello";
static const char boot_reply_context[] = "weft rendezvous answer";

/* ---- packing ------------------------------------------------------------ */

static uint8_t *put32(uint8_t *p, uint32_t v) {
  v = htonl(v);
  memcpy(p, &v, 4);
  return p + 4;
}
static uint8_t *put16(uint8_t *p, uint16_t v) {
  v = htons(v);
  memcpy(p, &v, 2);
  return p + 2;
}
static const uint8_t *get32(const uint8_t *p, uint32_t *v) {
  memcpy(v, p, 4);
  *v = ntohl(*v);
  return p + 4;
}
static const uint8_t *get16(const uint8_t *p, uint16_t *v) {
  memcpy(v, p, 2);
  *v = ntohs(*v);
  return p + 2;
}

static uint8_t *pack_info(uint8_t *p, const boot_rank_info *in) {
  p = put32(p, in->rank);
  p = put32(p, in->pid);
  memcpy(p, in->host, BOOT_HOST_BYTES);
  p += BOOT_HOST_BYTES;
  p = put16(p, in->addr_len);
  memcpy(p, in->addr, BOOT_ADDR_BYTES);
  return p + BOOT_ADDR_BYTES;
}

static const uint8_t *unpack_info(const uint8_t *p, boot_rank_info *out) {
  p = get32(p, &out->rank);
  p = get32(p, &out->pid);
  memcpy(out->host, p, BOOT_HOST_BYTES);
  out->host[BOOT_HOST_BYTES - 1] = 0;
  p += BOOT_HOST_BYTES;
  p = get16(p, &out->addr_len);
  if (out->addr_len > BOOT_ADDR_BYTES) out->addr_len = BOOT_ADDR_BYTES;
  memcpy(out->addr, p, BOOT_ADDR_BYTES);
  return p + BOOT_ADDR_BYTES;
}

weft_status boot_hello_parse(const uint8_t *buf, size_t len, boot_hello *out) {
  uint32_t magic;
  uint16_t reserved;
  if (len < HELLO_BYTES) return WEFT_ERR_PROTOCOL;
  const uint8_t *q = get32(buf, &magic);
  if (magic != BOOT_MAGIC) return WEFT_ERR_PROTOCOL;
  q = get16(q, &out->version);
  q = get16(q, &reserved);
  q = get32(q, &out->rank);
  q = get32(q, &out->size);
  q = get32(q, &out->timeout_ms);
  memcpy(out->nonce, q, BOOT_NONCE_BYTES);
  unpack_info(q + BOOT_NONCE_BYTES, &out->info);
  return WEFT_OK;
}

weft_status boot_reply_parse(const uint8_t *buf, size_t len, boot_reply *out) {
  uint32_t magic, status, hi, lo;
  if (len < REPLY_BYTES) return WEFT_ERR_PROTOCOL;
  const uint8_t *q = get32(buf, &magic);
  if (magic != BOOT_MAGIC) return WEFT_ERR_PROTOCOL;
  q = get32(q, &status);
  q = get32(q, &out->size);
  q = get32(q, &hi);
  q = get32(q, &lo);
  out->status = (int32_t)status;
  out->comm_id = ((uint64_t)hi << 32) | lo;
  memcpy(out->msg, q, BOOT_MSG_BYTES);
  out->msg[BOOT_MSG_BYTES - 1] = 0;
  return WEFT_OK;
}

weft_status boot_table_parse(const uint8_t *buf, size_t len, int size, boot_rank_info *all) {
  if (size < 0 || len / INFO_BYTES < (size_t)size) return WEFT_ERR_PROTOCOL;
  for (int r = 0; r < size; r++) unpack_info(buf + (size_t)r * INFO_BYTES, &all[r]);
  return WEFT_OK;
}

weft_status boot_challenge_parse(const uint8_t *buf, size_t len, const uint8_t **challenge) {
  uint32_t magic;
  if (len < CHALLENGE_MSG_BYTES) return WEFT_ERR_PROTOCOL;
  get32(buf, &magic);
  if (magic != WEFT_AUTH_CHALLENGE_MAGIC) return WEFT_ERR_PROTOCOL;
  *challenge = buf + 4;
  return WEFT_OK;
}

static void pack_reply(uint8_t *buf, weft_status st, int size, uint64_t comm_id, const char *msg) {
  uint8_t *p = put32(buf, BOOT_MAGIC);
  p = put32(p, (uint32_t)(int32_t)st);
  p = put32(p, (uint32_t)size);
  p = put32(p, (uint32_t)(comm_id >> 32));
  p = put32(p, (uint32_t)comm_id);
  memset(p, 0, BOOT_MSG_BYTES);
  snprintf((char *)p, BOOT_MSG_BYTES, "%s", msg ? msg : "");
}

/* ---- server ------------------------------------------------------------- */

struct pending {
  int fd;
  size_t got;
  uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES]; /* ours, sent on accept */
  uint8_t buf[HELLO_AUTH_BYTES];
};

struct boot_server {
  int listen_fd;
  uint8_t nonce[BOOT_NONCE_BYTES];
  int size; /* 0 until learned */
  double deadline;
  struct pending *pend;
  int npend, cap;
  weft_auth_key key;
  int *rank_fd;           /* by rank, -1 until arrived */
  uint8_t (*rank_challenge)[WEFT_AUTH_CHALLENGE_BYTES]; /* each rank's, for our answer's proof */
  boot_rank_info *infos;  /* by rank */
  int arrived;
  weft_status failure;    /* set once the job is known bad */
  char why[BOOT_MSG_BYTES];
};

/* Every answer ends with a proof over the rank's challenge, so a rank knows
 * the answer came from its job's server. */
static void server_reply_error(int fd, const struct boot_server *s,
                               const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES]) {
  uint8_t reply[REPLY_BYTES + WEFT_AUTH_MAC_BYTES];
  pack_reply(reply, s->failure, s->size, 0, s->why);
  weft_auth_mac(&s->key, boot_reply_context, challenge, reply, REPLY_BYTES, reply + REPLY_BYTES);
  weft_auth_thread_done(); /* before the answer: its rank may exit as soon as it has it */
  weft_error_sink ignore;
  net_send_all(fd, reply, sizeof reply, weft_now() + 1.0, &ignore);
}

static void server_fail(struct boot_server *s, weft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void server_fail(struct boot_server *s, weft_status st, const char *fmt, ...) {
  if (s->failure) return; /* keep the first cause */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->why, sizeof s->why, fmt, ap);
  va_end(ap);
  s->failure = st;
  WEFT_WARN(WEFT_SUBSYS_BOOT, "rendezvous failed: %s", s->why);
  for (int r = 0; r < s->size; r++)
    if (s->rank_fd[r] >= 0) {
      server_reply_error(s->rank_fd[r], s, s->rank_challenge[r]);
      close(s->rank_fd[r]);
      s->rank_fd[r] = -1;
    }
}

/* A complete hello arrived on p: validate and file it. */
static void server_take_hello(struct boot_server *s, struct pending *p) {
  const uint8_t *client_challenge = p->buf + HELLO_BYTES;
  bool proven = weft_auth_verify(&s->key, boot_hello_context, p->challenge, p->buf,
                                 HELLO_BYTES + WEFT_AUTH_CHALLENGE_BYTES,
                                 client_challenge + WEFT_AUTH_CHALLENGE_BYTES);
  weft_auth_thread_done();
  if (!proven) {
    /* a stranger, or a rank with another WEFT_AUTH_TOKEN: not one of ours */
    WEFT_WARN(WEFT_SUBSYS_BOOT, "rendezvous: rejected a connection that did not prove the job's "
              "token (a foreign client, or WEFT_AUTH_TOKEN differs)");
    close(p->fd);
    return;
  }
  boot_hello hello;
  if (boot_hello_parse(p->buf, HELLO_BYTES, &hello)) {
    WEFT_WARN(WEFT_SUBSYS_BOOT, "rendezvous: dropped a connection that is not a weft rank");
    close(p->fd);
    return;
  }
  uint32_t rank = hello.rank, size = hello.size, timeout_ms = hello.timeout_ms;
  uint16_t version = hello.version;
  if (memcmp(hello.nonce, s->nonce, BOOT_NONCE_BYTES) != 0) {
    /* a rank of another job (stale id, reused port): tell it, keep serving ours */
    struct boot_server other = *s;
    other.failure = WEFT_ERR_BOOTSTRAP;
    snprintf(other.why, sizeof other.why,
             "the rendezvous server belongs to another job (unique id or port reused)");
    server_reply_error(p->fd, &other, client_challenge);
    close(p->fd);
    return;
  }
  if (s->failure) {
    server_reply_error(p->fd, s, client_challenge);
    close(p->fd);
    return;
  }
  if (version != BOOT_VERSION) {
    server_fail(s, WEFT_ERR_BOOTSTRAP, "rank %u runs weft protocol %u, the server %u", rank,
                version, BOOT_VERSION);
    server_reply_error(p->fd, s, client_challenge);
    close(p->fd);
    return;
  }
  if (s->size == 0) {
    if (size < 1 || size > (1u << 20)) {
      server_fail(s, WEFT_ERR_INVALID, "rank %u gave world size %u", rank, size);
      server_reply_error(p->fd, s, client_challenge);
      close(p->fd);
      return;
    }
    s->size = (int)size;
    s->rank_fd = malloc(sizeof(int) * size);
    s->infos = calloc(size, sizeof *s->infos);
    s->rank_challenge = calloc(size, sizeof *s->rank_challenge);
    for (uint32_t r = 0; r < size; r++) s->rank_fd[r] = -1;
  }
  if ((int)size != s->size) {
    server_fail(s, WEFT_ERR_MISMATCH, "rank %u says the world size is %u, but an earlier rank said %d",
                rank, size, s->size);
  } else if (rank >= size) {
    server_fail(s, WEFT_ERR_INVALID, "a process claims rank %u, but the world size is %u", rank,
                size);
  } else if (s->rank_fd[rank] >= 0) {
    server_fail(s, WEFT_ERR_INVALID, "two processes claim rank %u (pid %u on %s and pid %u on %s)",
                rank, s->infos[rank].pid, s->infos[rank].host, hello.info.pid, hello.info.host);
  }
  if (s->failure) {
    server_reply_error(p->fd, s, client_challenge);
    close(p->fd);
    return;
  }
  s->infos[rank] = hello.info;
  s->infos[rank].rank = rank;
  memcpy(s->rank_challenge[rank], client_challenge, WEFT_AUTH_CHALLENGE_BYTES);
  /* answer before the most impatient rank gives up (ranks wait a little
   * longer than their timeout for this answer) */
  double rank_deadline = weft_now() + timeout_ms / 1000.0;
  if (rank_deadline < s->deadline) s->deadline = rank_deadline;
  s->rank_fd[rank] = p->fd;
  s->arrived++;
  WEFT_INFO(WEFT_SUBSYS_BOOT, "rendezvous: rank %u of %u arrived (pid %u on %s)", rank, size,
            s->infos[rank].pid, s->infos[rank].host);
}

static void server_send_table(struct boot_server *s) {
  uint64_t comm_id = 0;
  if (getrandom(&comm_id, sizeof comm_id, 0) != sizeof comm_id) comm_id = (uint64_t)weft_now();
  size_t len = REPLY_BYTES + (size_t)s->size * INFO_BYTES;
  uint8_t *buf = malloc(len + WEFT_AUTH_MAC_BYTES);
  if (!buf) {
    server_fail(s, WEFT_ERR_NOMEM, "rendezvous server out of memory");
    return;
  }
  pack_reply(buf, WEFT_OK, s->size, comm_id, "");
  uint8_t *p = buf + REPLY_BYTES;
  for (int r = 0; r < s->size; r++) p = pack_info(p, &s->infos[r]);
  for (int r = 0; r < s->size; r++) {
    weft_error_sink err;
    weft_auth_mac(&s->key, boot_reply_context, s->rank_challenge[r], buf, len, buf + len);
    weft_auth_thread_done(); /* before the answer: its rank may exit as soon as it has it */
    if (net_send_all(s->rank_fd[r], buf, len + WEFT_AUTH_MAC_BYTES, s->deadline, &err))
      WEFT_WARN(WEFT_SUBSYS_BOOT, "rendezvous: could not answer rank %d: %s", r, err.msg);
    close(s->rank_fd[r]);
    s->rank_fd[r] = -1;
  }
  free(buf);
}

static void server_missing_ranks(struct boot_server *s) {
  char list[160] = "";
  int missing = 0;
  for (int r = 0; r < s->size; r++)
    if (s->rank_fd[r] < 0) {
      if (missing < 12)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", missing ? ", " : "", r);
      missing++;
    }
  server_fail(s, WEFT_ERR_TIMEOUT, "%d of %d ranks never reached the rendezvous in time: %s%s",
              missing, s->size, list, missing > 12 ? ", ..." : "");
}

static void server_poll_once(struct boot_server *s) {
  struct pollfd *fds = malloc(sizeof *fds * (size_t)(s->npend + 1));
  if (!fds) return;
  fds[0] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
  for (int i = 0; i < s->npend; i++) fds[i + 1] = (struct pollfd){.fd = s->pend[i].fd, .events = POLLIN};
  double left = s->deadline - weft_now();
  int ms = left <= 0 ? 0 : left > 0.2 ? 200 : (int)(left * 1000) + 1;
  int n = poll(fds, (nfds_t)(s->npend + 1), ms);
  if (n > 0) {
    for (int i = s->npend - 1; i >= 0; i--) {
      if (!fds[i + 1].revents) continue;
      struct pending *p = &s->pend[i];
      ssize_t got = recv(p->fd, p->buf + p->got, HELLO_AUTH_BYTES - p->got, 0);
      bool done = false;
      if (got > 0) {
        p->got += (size_t)got;
        if (p->got == HELLO_AUTH_BYTES) {
          server_take_hello(s, p);
          done = true;
        }
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(p->fd); /* hung up before finishing its hello */
        done = true;
      }
      if (done) s->pend[i] = s->pend[--s->npend];
    }
    if (fds[0].revents) {
      int fd;
      while ((fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (s->npend == s->cap) {
          int cap = s->cap ? 2 * s->cap : 16;
          struct pending *np = realloc(s->pend, sizeof *np * (size_t)cap);
          if (!np) {
            close(fd);
            break;
          }
          s->pend = np;
          s->cap = cap;
        }
        struct pending *np = &s->pend[s->npend];
        *np = (struct pending){.fd = fd, .got = 0};
        /* the challenge first: a hello must prove the token over it */
        uint8_t msg[CHALLENGE_MSG_BYTES];
        put32(msg, WEFT_AUTH_CHALLENGE_MAGIC);
        weft_auth_challenge(np->challenge);
        memcpy(msg + 4, np->challenge, WEFT_AUTH_CHALLENGE_BYTES);
        if (send(fd, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof msg) {
          close(fd);
          continue;
        }
        s->npend++;
      }
    }
  }
  free(fds);
}

static void *server_main(void *arg) {
  struct boot_server *s = arg;
  while (weft_now() < s->deadline) {
    server_poll_once(s);
    if (!s->failure && s->size && s->arrived == s->size) {
      server_send_table(s);
      break;
    }
  }
  if (!s->failure && s->size && s->arrived < s->size) server_missing_ranks(s);
  for (int i = 0; i < s->npend; i++) close(s->pend[i].fd);
  if (s->rank_fd)
    for (int r = 0; r < s->size; r++)
      if (s->rank_fd[r] >= 0) close(s->rank_fd[r]);
  close(s->listen_fd);
  free(s->pend);
  free(s->rank_fd);
  free(s->infos);
  free(s->rank_challenge);
  free(s);
  return NULL;
}

weft_status boot_server_start(const struct sockaddr_storage *addr, socklen_t len,
                              const uint8_t nonce[BOOT_NONCE_BYTES], int size, double timeout_s,
                              struct sockaddr_storage *bound, socklen_t *bound_len,
                              weft_error_sink *err) {
  struct boot_server *s = calloc(1, sizeof *s);
  if (!s) return WEFT_ERR_NOMEM;
  weft_status st = net_listen(addr, len, 1024, &s->listen_fd, bound, bound_len, err);
  if (st) {
    free(s);
    return st;
  }
  memcpy(s->nonce, nonce, BOOT_NONCE_BYTES);
  weft_auth_key_for_job(nonce, BOOT_NONCE_BYTES, &s->key);
  s->deadline = weft_now() + timeout_s;
  if (size > 0) {
    s->size = size;
    s->rank_fd = malloc(sizeof(int) * (size_t)size);
    s->infos = calloc((size_t)size, sizeof *s->infos);
    s->rank_challenge = calloc((size_t)size, sizeof *s->rank_challenge);
    if (!s->rank_fd || !s->infos || !s->rank_challenge) {
      close(s->listen_fd);
      free(s->rank_fd);
      free(s->infos);
      free(s->rank_challenge);
      free(s);
      return WEFT_ERR_NOMEM;
    }
    for (int r = 0; r < size; r++) s->rank_fd[r] = -1;
  }
  pthread_t th;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&th, &attr, server_main, s);
  pthread_attr_destroy(&attr);
  if (rc) {
    weft_error_sink_set(err, "cannot start the rendezvous thread: %s", strerror(rc));
    close(s->listen_fd);
    free(s->rank_fd);
    free(s->infos);
    free(s->rank_challenge);
    free(s);
    return WEFT_ERR_SYSTEM;
  }
  char where[80];
  WEFT_INFO(WEFT_SUBSYS_BOOT, "rendezvous server listening on %s",
            net_addr_str((struct sockaddr *)bound, where, sizeof where));
  return WEFT_OK;
}

/* ---- client ------------------------------------------------------------- */

weft_status boot_connect(const struct sockaddr_storage *server, socklen_t len, double deadline,
                         int *fd, struct sockaddr_storage *local, socklen_t *local_len,
                         weft_error_sink *err) {
  weft_status st = net_connect(server, len, deadline, true, fd, err);
  if (st) {
    char where[80];
    weft_error_sink tmp = *err;
    weft_error_sink_set(err, "no rendezvous server answered at %s: %s",
                        net_addr_str((const struct sockaddr *)server, where, sizeof where),
                        tmp.msg);
    return st == WEFT_ERR_TIMEOUT ? st : WEFT_ERR_BOOTSTRAP;
  }
  *local_len = sizeof *local;
  getsockname(*fd, (struct sockaddr *)local, local_len);
  return WEFT_OK;
}

static weft_status boot_client_fail(int fd, weft_status st) {
  close(fd);
  return st;
}

weft_status boot_exchange(int fd, const uint8_t nonce[BOOT_NONCE_BYTES], int rank, int size,
                          const boot_rank_info *mine, double deadline, uint64_t *comm_id,
                          boot_rank_info *all, weft_error_sink *err) {
  weft_auth_key key;
  weft_auth_key_for_job(nonce, BOOT_NONCE_BYTES, &key);
  /* The server speaks first: a challenge our hello must prove the token over. */
  uint8_t challenge_msg[CHALLENGE_MSG_BYTES];
  weft_status st = net_recv_all(fd, challenge_msg, sizeof challenge_msg, deadline, err);
  if (st) {
    weft_error_sink tmp = *err;
    weft_error_sink_set(err, "%s while waiting for the rendezvous server to greet us", tmp.msg);
    return boot_client_fail(fd, st == WEFT_ERR_TIMEOUT ? st : WEFT_ERR_BOOTSTRAP);
  }
  const uint8_t *server_challenge;
  if (boot_challenge_parse(challenge_msg, sizeof challenge_msg, &server_challenge)) {
    weft_error_sink_set(err, "the rendezvous address answered with something that is not weft");
    return boot_client_fail(fd, WEFT_ERR_BOOTSTRAP);
  }
  uint8_t hello[HELLO_AUTH_BYTES];
  uint8_t *p = put32(hello, BOOT_MAGIC);
  p = put16(p, BOOT_VERSION);
  p = put16(p, 0);
  p = put32(p, (uint32_t)rank);
  p = put32(p, (uint32_t)size);
  double left = deadline - weft_now();
  p = put32(p, (uint32_t)(left <= 0 ? 0 : left > 4e6 ? 4e9 : left * 1000));
  memcpy(p, nonce, BOOT_NONCE_BYTES);
  p += BOOT_NONCE_BYTES;
  pack_info(p, mine);
  uint8_t *my_challenge = hello + HELLO_BYTES;
  weft_auth_challenge(my_challenge);
  weft_auth_mac(&key, boot_hello_context, server_challenge, hello,
                HELLO_BYTES + WEFT_AUTH_CHALLENGE_BYTES, my_challenge + WEFT_AUTH_CHALLENGE_BYTES);
  st = net_send_all(fd, hello, sizeof hello, deadline, err);
  /* The server answers by its own deadline, which started before ours: wait
   * a little past ours so that its sentence (who never arrived) reaches us. */
  double answer_deadline = deadline + 2.0;
  size_t table_len = (size_t)size * INFO_BYTES;
  uint8_t *answer = malloc(REPLY_BYTES + table_len + WEFT_AUTH_MAC_BYTES);
  if (!answer) return boot_client_fail(fd, WEFT_ERR_NOMEM);
  if (!st) st = net_recv_all(fd, answer, REPLY_BYTES, answer_deadline, err);
  if (st) {
    weft_error_sink tmp = *err;
    weft_error_sink_set(err, "%s before the rendezvous answered%s", tmp.msg,
                        st == WEFT_ERR_TIMEOUT ? " (some rank did not arrive?)"
                        : st == WEFT_ERR_PEER_LOST
                            ? " (it rejects ranks that cannot prove the job's WEFT_AUTH_TOKEN)"
                            : "");
    free(answer);
    return boot_client_fail(fd, st == WEFT_ERR_TIMEOUT ? st : WEFT_ERR_BOOTSTRAP);
  }
  boot_reply reply = {0};
  bool weft_answer = boot_reply_parse(answer, REPLY_BYTES, &reply) == WEFT_OK;
  bool ok = reply.status == WEFT_OK;
  if (weft_answer && ok && (int)reply.size != size) {
    weft_error_sink_set(err, "rendezvous answered for %u ranks, expected %d", reply.size, size);
    free(answer);
    return boot_client_fail(fd, WEFT_ERR_PROTOCOL);
  }
  size_t body = REPLY_BYTES + (ok ? table_len : 0);
  if (weft_answer)
    st = net_recv_all(fd, answer + REPLY_BYTES, body - REPLY_BYTES + WEFT_AUTH_MAC_BYTES, answer_deadline, err);
  if (!weft_answer || st ||
      !weft_auth_verify(&key, boot_reply_context, my_challenge, answer, body, answer + body)) {
    weft_error_sink_set(err, "the rendezvous answer did not prove the job's token (not weft, another "
                        "job, or WEFT_AUTH_TOKEN differs from rank 0's)");
    free(answer);
    return boot_client_fail(fd, WEFT_ERR_BOOTSTRAP);
  }
  if (!ok) {
    weft_error_sink_set(err, "rendezvous refused the job: %s", reply.msg);
    free(answer);
    int32_t s32 = reply.status;
    return boot_client_fail(fd, s32 < 0 && s32 >= WEFT_ERR_INTERNAL ? (weft_status)s32 : WEFT_ERR_BOOTSTRAP);
  }
  *comm_id = reply.comm_id;
  boot_table_parse(answer + REPLY_BYTES, table_len, size, all);
  free(answer);
  close(fd);
  return WEFT_OK;
}

