/* bootstrap.c - rendezvous server (one thread per job, joined by its owner) and client.
 * Wire format: fixed-size records, integers big-endian; every record starts
 * with a magic and is length-checked before use. */
#include "src/comm/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
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
  q += BOOT_NONCE_BYTES;
  memcpy(out->job, q, BOOT_JOB_BYTES);
  out->job[BOOT_JOB_BYTES - 1] = 0;
  unpack_info(q + BOOT_JOB_BYTES, &out->info);
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

/* What the owner asks of the thread (boot_server_finish, exit). */
enum { SERVER_RUN, SERVER_OWNER_FAILED, SERVER_EXITING };

struct boot_server {
  int listen_fd;
  uint8_t nonce[BOOT_NONCE_BYTES];
  char job[BOOT_JOB_BYTES];
  bool job_known; /* false: learned from the first rank (a unique id's server) */
  int size;       /* 0 until learned */
  double deadline;
  double listen_paused_until; /* out of fds with nothing to free: no accept before then */
  struct pending *pend;
  int npend, cap;
  weft_auth_key key;
  int *rank_fd;                                         /* by rank, -1 until arrived */
  uint8_t (*rank_challenge)[WEFT_AUTH_CHALLENGE_BYTES]; /* each rank's, for our answer's proof */
  boot_rank_info *infos;                                /* by rank */
  bool *told; /* by rank: has had its answer (the table or why the job failed) */
  int arrived, ntold;
  weft_status failure; /* set once the job is known bad */
  char why[BOOT_MSG_BYTES];
  /* lifetime: the thread is joined by the owner (boot_server_finish) or at exit */
  pthread_t thread;
  pid_t pid;                      /* the process whose thread serves (a forked child has none) */
  atomic_int request;             /* SERVER_*, from the owner */
  atomic_bool ended;              /* the thread has returned (a registered server may be reaped) */
  char owner_why[BOOT_MSG_BYTES]; /* written before request is set */
  int owner_rank;                 /* likewise */
  struct boot_server *next;       /* in the registry */
};

static bool server_rank_arrays(struct boot_server *s, int size) {
  s->size = size;
  s->rank_fd = malloc(sizeof(int) * (size_t)size);
  s->infos = calloc((size_t)size, sizeof *s->infos);
  s->rank_challenge = calloc((size_t)size, sizeof *s->rank_challenge);
  s->told = calloc((size_t)size, sizeof *s->told);
  if (!s->rank_fd || !s->infos || !s->rank_challenge || !s->told) return false;
  for (int r = 0; r < size; r++) s->rank_fd[r] = -1;
  return true;
}

static void server_free(struct boot_server *s) {
  free(s->pend);
  free(s->rank_fd);
  free(s->infos);
  free(s->rank_challenge);
  free(s->told);
  free(s);
}

/* Every answer ends with a proof over the rank's challenge, so a rank knows
 * the answer came from its job's server. */
static void server_answer(int fd, const struct boot_server *s, weft_status st, const char *why,
                          const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES]) {
  uint8_t reply[REPLY_BYTES + WEFT_AUTH_MAC_BYTES];
  pack_reply(reply, st, s->size, 0, why);
  weft_auth_mac(&s->key, boot_reply_context, challenge, reply, REPLY_BYTES, reply + REPLY_BYTES);
  weft_auth_thread_done(); /* before the answer: its rank may exit as soon as it has it */
  weft_error_sink ignore;
  net_send_all(fd, reply, sizeof reply, weft_now() + 1.0, &ignore);
}

/* Why the job failed, to a process claiming `rank` (counted as told when it
 * is one of ours; -1 for none). */
static void server_reply_error(int fd, struct boot_server *s, int64_t rank,
                               const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES]) {
  server_answer(fd, s, s->failure, s->why, challenge);
  if (rank >= 0 && rank < s->size && !s->told[rank]) {
    s->told[rank] = true;
    s->ntold++;
  }
}

/* A refusal that does not touch the job (a rank of another one). */
static void server_refuse(int fd, const struct boot_server *s,
                          const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES], const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void server_refuse(int fd, const struct boot_server *s,
                          const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES], const char *fmt,
                          ...) {
  char why[BOOT_MSG_BYTES];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  server_answer(fd, s, WEFT_ERR_BOOTSTRAP, why, challenge);
  close(fd);
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
      server_reply_error(s->rank_fd[r], s, r, s->rank_challenge[r]);
      close(s->rank_fd[r]);
      s->rank_fd[r] = -1;
    }
}

static const char *job_or_none(const char *job) {
  return *job ? job : "(none)";
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
    WEFT_WARN(WEFT_SUBSYS_BOOT,
              "rendezvous: rejected a connection that did not prove the job's "
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
    server_refuse(p->fd, s, client_challenge,
                  "the rendezvous server belongs to another job (unique id or port reused)");
    return;
  }
  if (s->job_known && strcmp(hello.job, s->job) != 0) {
    /* Two jobs on one address and port: this rank is not ours, whatever
     * rank it claims; it never becomes a member, and our job goes on. */
    WEFT_WARN(WEFT_SUBSYS_BOOT,
              "rendezvous: refused pid %u on %s, which claims rank %u of job %s: this rendezvous "
              "serves job %s",
              hello.info.pid, hello.info.host, rank, job_or_none(hello.job), job_or_none(s->job));
    server_refuse(p->fd, s, client_challenge,
                  "this rank is of job %.60s, the rendezvous there serves job %.60s: refused "
                  "(another job on the same address and port? ranks of one job share WEFT_JOB_ID)",
                  job_or_none(hello.job), job_or_none(s->job));
    return;
  }
  if (s->failure) {
    /* learn the size even now: the server ends once every rank was told */
    if (!s->size && size >= 1 && size <= (1u << 20) && !server_rank_arrays(s, (int)size))
      s->size = 0;
    server_reply_error(p->fd, s, rank, client_challenge);
    close(p->fd);
    return;
  }
  if (version != BOOT_VERSION) {
    server_fail(s, WEFT_ERR_BOOTSTRAP, "rank %u runs weft protocol %u, the server %u", rank,
                version, BOOT_VERSION);
    server_reply_error(p->fd, s, rank, client_challenge);
    close(p->fd);
    return;
  }
  if (s->size == 0) {
    if (size < 1 || size > (1u << 20)) {
      server_fail(s, WEFT_ERR_INVALID, "rank %u gave world size %u", rank, size);
      server_reply_error(p->fd, s, -1, client_challenge);
      close(p->fd);
      return;
    }
    if (!server_rank_arrays(s, (int)size)) {
      s->size = 0; /* the arrays are freed with the server */
      server_fail(s, WEFT_ERR_NOMEM, "rendezvous server out of memory");
      server_reply_error(p->fd, s, -1, client_challenge);
      close(p->fd);
      return;
    }
  }
  if ((int)size != s->size) {
    server_fail(s, WEFT_ERR_MISMATCH,
                "rank %u says the world size is %u, but an earlier rank said %d", rank, size,
                s->size);
  } else if (rank >= size) {
    server_fail(s, WEFT_ERR_INVALID, "a process claims rank %u, but the world size is %u", rank,
                size);
  } else if (s->rank_fd[rank] >= 0) {
    /* never a silent replacement: the whole job hears of both */
    server_fail(s, WEFT_ERR_INVALID, "two processes claim rank %u (pid %u on %s and pid %u on %s)",
                rank, s->infos[rank].pid, s->infos[rank].host, hello.info.pid, hello.info.host);
  }
  if (s->failure) {
    server_reply_error(p->fd, s, rank, client_challenge);
    close(p->fd);
    return;
  }
  if (!s->job_known) { /* a unique id's server: the first rank's job is the job */
    memcpy(s->job, hello.job, BOOT_JOB_BYTES);
    s->job_known = true;
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
  server_fail(s, WEFT_ERR_TIMEOUT,
              "rank%s %s%s never reached the rendezvous in time (%d of %d missing at the timeout)",
              missing > 1 ? "s" : "", list, missing > 12 ? ", ..." : "", missing, s->size);
}

/* accept4 failed: out of descriptors is not transient (the ranks keep
 * coming, the server would spin), so the job fails with the reason and
 * the fds of the arrived ranks are freed to tell the rest. */
static void server_accept_failed(struct boot_server *s, int err) {
  if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return;
  if (!s->failure) {
    struct rlimit lim = {0};
    getrlimit(RLIMIT_NOFILE, &lim);
    server_fail(s, WEFT_ERR_SYSTEM,
                "the rendezvous server (pid %d) cannot accept more ranks: %s (%d of %d arrived, "
                "RLIMIT_NOFILE %llu; raise it, e.g. ulimit -n)",
                (int)getpid(), strerror(err), s->arrived, s->size,
                (unsigned long long)lim.rlim_cur);
  } else {
    /* nothing left to free: wait rather than spin on a listener that stays readable */
    s->listen_paused_until = weft_now() + 0.1;
  }
}

static void server_accept(struct boot_server *s) {
  for (;;) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      server_accept_failed(s, errno);
      return;
    }
    if (s->npend == s->cap) {
      int cap = s->cap ? 2 * s->cap : 16;
      struct pending *np = realloc(s->pend, sizeof *np * (size_t)cap);
      if (!np) {
        close(fd);
        return;
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

static void server_poll_once(struct boot_server *s) {
  struct pollfd *fds = malloc(sizeof *fds * (size_t)(s->npend + 1));
  if (!fds) return;
  double now = weft_now();
  bool listening = now >= s->listen_paused_until;
  fds[0] = (struct pollfd){.fd = listening ? s->listen_fd : -1, .events = POLLIN};
  for (int i = 0; i < s->npend; i++)
    fds[i + 1] = (struct pollfd){.fd = s->pend[i].fd, .events = POLLIN};
  double left = s->deadline - now;
  if (!listening && s->listen_paused_until - now < left) left = s->listen_paused_until - now;
  /* at most 200 ms, so that the owner's request is seen soon */
  int ms = left <= 0 ? 0 : left > 0.2 ? 200 : (int)(left * 1000) + 1;
  int n = poll(fds, (nfds_t)(s->npend + 1), ms);
  if (n > 0) {
    for (int i = s->npend - 1; i >= 0; i--) {
      if (!fds[i + 1].revents) continue;
      struct pending *p = &s->pend[i];
      ssize_t got = recv(p->fd, p->buf + p->got, HELLO_AUTH_BYTES - p->got, 0);
      bool done = false;
      if (got > 0) {
        size_t before = p->got;
        p->got += (size_t)got;
        uint32_t magic;
        uint16_t version;
        if (before < 6 && p->got >= 6 && get16(get32(p->buf, &magic), &version) &&
            magic == BOOT_MAGIC && version != BOOT_VERSION) {
          /* another weft release: its hello has another length, so waiting
           * for the rest would stall; unproven, so it cannot fail the job */
          WEFT_WARN(WEFT_SUBSYS_BOOT,
                    "rendezvous: dropped a rank speaking rendezvous protocol %u "
                    "(this server speaks %u): are two weft releases mixed in one job?",
                    version, BOOT_VERSION);
          close(p->fd);
          s->pend[i] = s->pend[--s->npend];
          continue;
        }
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
    if (fds[0].revents) server_accept(s);
  }
  free(fds);
}

static void *server_main(void *arg) {
  struct boot_server *s = arg;
  while (weft_now() < s->deadline) {
    int request = atomic_load(&s->request);
    if (request == SERVER_EXITING) {
      server_fail(s, WEFT_ERR_BOOTSTRAP, "the process hosting the rendezvous (pid %d) is exiting",
                  (int)getpid());
      break;
    }
    if (request == SERVER_OWNER_FAILED) {
      server_fail(s, WEFT_ERR_BOOTSTRAP, "%s", s->owner_why);
      /* the owner's rank knows why: it never sends its hello */
      if (s->owner_rank < s->size && !s->told[s->owner_rank]) {
        s->told[s->owner_rank] = true;
        s->ntold++;
      }
    }
    /* a failed job is over once every rank has heard why */
    if (s->failure && s->size && s->ntold == s->size) break;
    server_poll_once(s);
    if (!s->failure && s->size && s->arrived == s->size) {
      server_send_table(s);
      break;
    }
  }
  if (!s->failure && s->size && s->arrived < s->size) server_missing_ranks(s);
  for (int i = 0; i < s->npend; i++) close(s->pend[i].fd);
  s->npend = 0;
  if (s->rank_fd)
    for (int r = 0; r < s->size; r++)
      if (s->rank_fd[r] >= 0) close(s->rank_fd[r]);
  close(s->listen_fd);
  s->listen_fd = -1;
  weft_auth_thread_done();
  atomic_store(&s->ended, true);
  return NULL;
}

/* The registry: servers of weft_get_unique_id, which no rank may own. A
 * rank of this process adopts its own; the rest are reaped once ended, and
 * stopped and joined at exit, before OpenSSL's own exit handler (registered
 * earlier, so it runs later) frees what the thread's MACs use. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static boot_server *registry;
static bool registry_at_exit;

static void server_join(boot_server *s, int request) {
  if (s->pid == getpid()) { /* a forked child has the record but not the thread */
    if (request != SERVER_RUN) atomic_store(&s->request, request);
    pthread_join(s->thread, NULL);
  }
  server_free(s);
}

static void registry_exit(void) {
  pthread_mutex_lock(&registry_lock);
  boot_server *list = registry;
  registry = NULL;
  pthread_mutex_unlock(&registry_lock);
  /* all asked first, then joined: each sees the request within one poll */
  for (boot_server *s = list; s; s = s->next) atomic_store(&s->request, SERVER_EXITING);
  while (list) {
    boot_server *next = list->next;
    server_join(list, SERVER_EXITING);
    list = next;
  }
}

void boot_server_register(boot_server *s) {
  boot_server *ended = NULL;
  pthread_mutex_lock(&registry_lock);
  for (boot_server **p = &registry; *p;) {
    boot_server *r = *p;
    if (atomic_load(&r->ended) || r->pid != getpid()) {
      *p = r->next;
      r->next = ended;
      ended = r;
    } else {
      p = &r->next;
    }
  }
  if (s) {
    s->next = registry;
    registry = s;
  }
  if (!registry_at_exit) registry_at_exit = atexit(registry_exit) == 0;
  pthread_mutex_unlock(&registry_lock);
  while (ended) {
    boot_server *next = ended->next;
    server_join(ended, SERVER_RUN);
    ended = next;
  }
}

boot_server *boot_server_adopt(const uint8_t nonce[BOOT_NONCE_BYTES]) {
  boot_server *found = NULL;
  pthread_mutex_lock(&registry_lock);
  for (boot_server **p = &registry; *p; p = &(*p)->next)
    if ((*p)->pid == getpid() && !memcmp((*p)->nonce, nonce, BOOT_NONCE_BYTES)) {
      found = *p;
      *p = found->next;
      break;
    }
  pthread_mutex_unlock(&registry_lock);
  return found;
}

void boot_server_finish(boot_server *s, int owner_rank, const char *why) {
  if (!s) return;
  if (why) {
    snprintf(s->owner_why, sizeof s->owner_why, "%s", why);
    s->owner_rank = owner_rank < 0 ? INT32_MAX : owner_rank;
  }
  server_join(s, why ? SERVER_OWNER_FAILED : SERVER_RUN);
}

weft_status boot_server_start(const struct sockaddr_storage *addr, socklen_t len,
                              const uint8_t nonce[BOOT_NONCE_BYTES], int size, const char *job,
                              double timeout_s, struct sockaddr_storage *bound,
                              socklen_t *bound_len, boot_server **out, weft_error_sink *err) {
  *out = NULL;
  struct boot_server *s = calloc(1, sizeof *s);
  if (!s) return WEFT_ERR_NOMEM;
  weft_status st = net_listen(addr, len, 1024, &s->listen_fd, bound, bound_len, err);
  if (st) {
    free(s);
    return st;
  }
  memcpy(s->nonce, nonce, BOOT_NONCE_BYTES);
  if (job) {
    snprintf(s->job, sizeof s->job, "%s", job);
    s->job_known = true;
  }
  weft_auth_key_for_job(nonce, BOOT_NONCE_BYTES, &s->key);
  s->deadline = weft_now() + timeout_s;
  s->pid = getpid();
  atomic_init(&s->request, SERVER_RUN);
  atomic_init(&s->ended, false);
  if (size > 0 && !server_rank_arrays(s, size)) {
    close(s->listen_fd);
    server_free(s);
    return WEFT_ERR_NOMEM;
  }
  int rc = pthread_create(&s->thread, NULL, server_main, s);
  if (rc) {
    weft_error_sink_set(err, "cannot start the rendezvous thread: %s", strerror(rc));
    close(s->listen_fd);
    server_free(s);
    return WEFT_ERR_SYSTEM;
  }
  char where[80];
  WEFT_INFO(WEFT_SUBSYS_BOOT, "rendezvous server listening on %s",
            net_addr_str((struct sockaddr *)bound, where, sizeof where));
  *out = s;
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

/* Said once per process: without a secret or a launcher's job id nothing
 * keeps another job's ranks (same address and port) out. */
static void warn_open_rendezvous(int fd) {
  static atomic_flag said = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&said)) return;
  struct sockaddr_storage peer;
  socklen_t len = sizeof peer;
  char where[80] = "its address";
  if (!getpeername(fd, (struct sockaddr *)&peer, &len))
    net_addr_str((const struct sockaddr *)&peer, where, sizeof where);
  WEFT_WARN(WEFT_SUBSYS_BOOT,
            "the rendezvous at %s is open to any process that reaches that port: no launcher job "
            "id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE) and "
            "no WEFT_AUTH_TOKEN; set WEFT_JOB_ID or WEFT_AUTH_TOKEN to keep jobs apart",
            where);
}

weft_status boot_exchange(int fd, const uint8_t nonce[BOOT_NONCE_BYTES], const char *job, int rank,
                          int size, const boot_rank_info *mine, double deadline, uint64_t *comm_id,
                          boot_rank_info *all, weft_error_sink *err) {
  weft_auth_key key;
  weft_auth_key_for_job(nonce, BOOT_NONCE_BYTES, &key);
  if (!job) job = "";
  if (!*job && !key.secret) warn_open_rendezvous(fd);
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
  memset(p, 0, BOOT_JOB_BYTES);
  snprintf((char *)p, BOOT_JOB_BYTES, "%s", job);
  p += BOOT_JOB_BYTES;
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
                            ? " (it hangs up on ranks that cannot prove the job's "
                              "WEFT_AUTH_TOKEN or run another weft release, and when the process "
                              "hosting it ends)"
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
    st = net_recv_all(fd, answer + REPLY_BYTES, body - REPLY_BYTES + WEFT_AUTH_MAC_BYTES,
                      answer_deadline, err);
  if (!weft_answer || st ||
      !weft_auth_verify(&key, boot_reply_context, my_challenge, answer, body, answer + body)) {
    weft_error_sink_set(err,
                        "the rendezvous answer did not prove the job's token (not weft, another "
                        "job, or WEFT_AUTH_TOKEN differs from rank 0's)");
    free(answer);
    return boot_client_fail(fd, WEFT_ERR_BOOTSTRAP);
  }
  if (!ok) {
    weft_error_sink_set(err, "rendezvous refused the job: %s", reply.msg);
    free(answer);
    int32_t s32 = reply.status;
    return boot_client_fail(
        fd, s32 < 0 && s32 >= WEFT_ERR_INTERNAL ? (weft_status)s32 : WEFT_ERR_BOOTSTRAP);
  }
  *comm_id = reply.comm_id;
  boot_table_parse(answer + REPLY_BYTES, table_len, size, all);
  free(answer);
  close(fd);
  return WEFT_OK;
}

