/* shm_cma.c - single copy (process_vm_readv) over shm, apart from the ring it
 * steers (shm_conn.c), as UCX keeps CMA in files of its own: the policy (does
 * a pair read by address, which chunks go that way), with its state on the
 * context and the connection, and the reads of a peer's memory. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "shm.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "transports/shm/shm_settings.h"
#include "src/base/status.h"

/* ---- what single copy costs here ------------------------------------------------ */

#define SHM_CMA_TIMED_BYTES (256u << 10)
#define SHM_CMA_TIMED_TRIES 11
/* The bar: process_vm_readv pins every page it reads, and at twice a
 * memcpy or more two copies through the slots cost less, in time (one on
 * each core) and in CPU where ranks outnumber cores (docs/tuning.md,
 * "Where single copy pays"). */
#define SHM_CMA_PAYS_BELOW 2.0 /* readv time over memcpy time */

/* Times both ways of moving SHM_CMA_TIMED_BYTES within this process (a
 * process may read itself), the best of SHM_CMA_TIMED_TRIES each: with fewer,
 * one rank of a pair now and then took a preempted memcpy for the norm and
 * decided the other way (docs/tuning.md, "Timed once per communicator"). */
static void shm_cma_time(shm_cma_timing *t) {
  size_t n = SHM_CMA_TIMED_BYTES;
  char *a = mmap(NULL, 2 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) return;
  char *b = a + n;
  memset(a, 1, 2 * n); /* faults stay out of the timing */
  double readv_us = 1e9, copy_us = 1e9;
  for (int i = 0; i < SHM_CMA_TIMED_TRIES; i++) {
    double t0 = weft_now() * 1e6;
    memcpy(b, a, n);
    double t1 = weft_now() * 1e6;
    struct iovec local = {b, n}, remote = {a, n};
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    double t2 = weft_now() * 1e6;
    if (got != (ssize_t)n) break;
    if (t1 - t0 < copy_us) copy_us = t1 - t0;
    if (t2 - t1 < readv_us) readv_us = t2 - t1;
  }
  munmap(a, 2 * n);
  if (readv_us < 1e9 && copy_us > 0) {
    t->readv_us = readv_us;
    t->copy_us = copy_us;
    t->ratio = readv_us / copy_us;
  }
}

double shm_cma_cost_ratio(shm_cma_timing *t) {
  if (!t->tried) {
    t->tried = true;
    shm_cma_time(t);
  }
  return t->ratio;
}

bool shm_cma_ratio_pays(double ratio) {
  return ratio < SHM_CMA_PAYS_BELOW;
}

double shm_mix_readv_ns_kib(shm_cma_timing *t) {
  double ratio = shm_cma_cost_ratio(t); /* times once, if no one has */
  return ratio > 0 ? t->readv_us * 1000.0 / (SHM_CMA_TIMED_BYTES >> 10) : 0;
}

bool shm_ranks_outnumber_cores(const weft_transport_init_args *args, long *cores) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores) *cores = n;
  return n > 0 && args->local_size > n;
}

/* The pair's ratio is the mean of both ends' timings: each end times its own
 * process, and where the two fell on either side of the bar one direction
 * read by address while the other took the slots, slower than either way
 * alone. From the same two numbers both receivers decide alike
 * (docs/tuning.md, "Where single copy pays"). */
bool shm_cma_pays(shm_ctx *ctx, double peer_ratio, char *why, size_t why_len) {
  shm_cma_timing *t = &ctx->cma_timing;
  double own = shm_cma_cost_ratio(t);
  if (own <= 0 && peer_ratio <= 0) {
    snprintf(why, why_len, "process_vm_readv could not be timed");
    return true; /* the probe decides, as before */
  }
  double ratio = own <= 0 ? peer_ratio : peer_ratio <= 0 ? own : (own + peer_ratio) / 2;
  bool pays = shm_cma_ratio_pays(ratio);
  char because[96] = "";
  long cores;
  if (!pays && shm_ranks_outnumber_cores(ctx->args, &cores))
    snprintf(because, sizeof because, "; %d ranks on %ld cores here: two copies cost less CPU",
             ctx->args->local_size, cores);
  else if (!pays)
    snprintf(because, sizeof because,
             "; every rank here has a core, so two copies at once are faster");
  snprintf(why, why_len,
           "process_vm_readv of %u KiB took %.1f us, %.1fx a memcpy of it (%.1f us); the pair's "
           "mean with the peer's %.1fx: %.1fx%s",
           SHM_CMA_TIMED_BYTES >> 10, t->readv_us, own, t->copy_us, peer_ratio, ratio, because);
  return pays;
}

/* ---- letting peers read this process ------------------------------------------- */

/* Under Yama's ptrace_scope 1 only a process's ancestors may read its
 * memory, so a peer's process_vm_readv of our chunks fails. As Open MPI
 * does for its single copy, this process then lets any process of its user
 * read it (the probe still decides per pair); only with single copy on, and
 * once per process: the permission is the process's, not a context's, so
 * its flag is too. Scopes 2 and 3 cannot be lifted this way: the probe
 * fails and the pair keeps two copies. */
void shm_cma_allow_readers(void) {
  static atomic_bool done;
  if (atomic_exchange(&done, true)) return;
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (!f) return; /* no Yama: same-user reads are allowed */
  int scope = -1;
  if (fscanf(f, "%d", &scope) != 1) scope = -1;
  fclose(f);
  if (scope != 1) return;
  if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
    WEFT_INFO(WEFT_SUBSYS_NET,
              "shm: Yama ptrace_scope is 1: this process lets processes of its user read its "
              "memory (PR_SET_PTRACER_ANY) for single copy; WEFT_SHM_CMA=0 leaves it as it was");
  else
    WEFT_INFO(WEFT_SUBSYS_NET, "shm: PR_SET_PTRACER_ANY: %s (peers will copy twice)",
              strerror(errno));
}

/* ---- the pair's agreement (shm_fifo's cma words) --------------------------------- */

/* The sender's side: offer the peer a word of ours to read from our process.
 * The word lies in the segment, so the peer can compare what it read with
 * what it sees itself; with the offer goes our timing, for the pair's mean. */
void shm_cma_offer(shm_conn *c) {
  shm_ctx *ctx = c->ctx;
  if (ctx->cma_mode == WEFT_SHM_CMA_OFF || atomic_load(&c->tx->cma_offer)) return;
  c->tx->cma_probe_word =
      ((uint64_t)ctx->self.pid << 32) ^ (uint64_t)(uintptr_t)c ^ 0x9e3779b97f4a7c15ull;
  c->tx->cma_probe_addr = (uint64_t)(uintptr_t)&c->tx->cma_probe_word;
  double ratio = ctx->cma_mode == WEFT_SHM_CMA_AUTO ? shm_cma_cost_ratio(&ctx->cma_timing) : 0;
  c->tx->cma_cost_milli = ratio > 0 && ratio < 1e6 ? (uint32_t)(ratio * 1000 + 0.5) : 0;
  atomic_store_explicit(&c->tx->cma_offer, 1, memory_order_release);
}

/* The receiver's side: once the sender has offered its word, read it from
 * the sender's process and say whether that worked. Refusals are ordinary
 * (seccomp in containers, Yama ptrace_scope 2+, another user): the pair
 * keeps two copies, said under NET. */
void shm_cma_decide(shm_conn *c) {
  if (!atomic_load_explicit(&c->rx->cma_offer, memory_order_acquire)) return;
  c->rx_cma_decided = true;
  shm_ctx *ctx = c->ctx;
  uint32_t verdict = SHM_CMA_NO;
  if (ctx->cma_mode == WEFT_SHM_CMA_OFF) {
    WEFT_INFO(WEFT_SUBSYS_NET,
              "shm: rank %d takes peer %d's chunks through the slots (WEFT_SHM_CMA=0)",
              ctx->args->rank, c->peer);
  } else {
    /* test-refused reads address 0, which fails as a refusing kernel's read does */
    uint64_t addr = ctx->cma_mode == WEFT_SHM_CMA_TEST_REFUSED ? 0 : c->rx->cma_probe_addr;
    uint64_t word = 0;
    struct iovec local = {&word, sizeof word}, remote = {(void *)(uintptr_t)addr, sizeof word};
    ssize_t n = process_vm_readv((pid_t)c->peer_pid, &local, 1, &remote, 1, 0);
    int e = n < 0 ? errno : 0;
    char pays_why[256] = "WEFT_SHM_CMA=on";
    bool allowed = n == (ssize_t)sizeof word && word == c->rx->cma_probe_word;
    if (allowed && ctx->cma_mode == WEFT_SHM_CMA_AUTO &&
        !shm_cma_pays(ctx, c->rx->cma_cost_milli / 1000.0, pays_why, sizeof pays_why)) {
      verdict = SHM_CMA_MIXED;
      WEFT_INFO(WEFT_SUBSYS_NET,
                "shm: rank %d takes peer %d's chunks through the slots: %s; while the peer's "
                "copies into them run slower than a read, every other chunk it sends one way "
                "comes by single copy (WEFT_SHM_CMA=on reads them all straight from its memory)",
                ctx->args->rank, c->peer, pays_why);
    } else if (allowed) {
      verdict = SHM_CMA_YES;
      WEFT_INFO(WEFT_SUBSYS_NET,
                "shm: rank %d reads peer %d's chunks of %zu bytes and more straight from its "
                "memory (process_vm_readv, single copy; %s)%s",
                ctx->args->rank, c->peer,
                ctx->cma_min_bytes > SHM_INLINE_BYTES ? ctx->cma_min_bytes : SHM_INLINE_BYTES + 1,
                pays_why,
                ctx->cma_stream_bytes ? "; a call's one-way stream past WEFT_SHM_CMA_STREAM_BYTES "
                                        "comes through the slots while the peer has nothing "
                                        "else to move"
                                      : "");
    } else {
      WEFT_INFO(WEFT_SUBSYS_NET,
                "shm: rank %d cannot read peer %d's memory (process_vm_readv of pid %u: %s%s): "
                "two copies through the slots",
                ctx->args->rank, c->peer, c->peer_pid, e ? strerror(e) : "another value",
                ctx->cma_mode == WEFT_SHM_CMA_TEST_REFUSED ? ", WEFT_SHM_CMA=test-refused" : "");
    }
  }
  atomic_store_explicit(&c->rx->cma_verdict, verdict, memory_order_release);
}

/* ---- what this rank moved in its recent calls --------------------------------- */

/* The record of call `seq`: the latest one, or the one before it (calls
 * overlap when started without waiting); a newer call makes the latest the
 * one before. NULL for a call older than both: nothing is kept for it. */
static shm_large_call *shm_large_call_of(shm_ctx *ctx, uint32_t seq) {
  if (ctx->large_now.valid && ctx->large_now.seq == seq) return &ctx->large_now;
  if (ctx->large_before.valid && ctx->large_before.seq == seq) return &ctx->large_before;
  if (ctx->large_now.valid && (int32_t)(seq - ctx->large_now.seq) < 0) return NULL;
  ctx->large_before = ctx->large_now;
  ctx->large_now = (shm_large_call){.seq = seq, .valid = true};
  return &ctx->large_now;
}

void shm_note_large_rx(shm_conn *c, uint32_t seq) {
  shm_large_call *call = shm_large_call_of(c->ctx, seq);
  if (call) call->received = true;
}

void shm_note_large_tx(shm_conn *c, uint32_t seq) {
  shm_large_call *call = shm_large_call_of(c->ctx, seq);
  if (!call) return;
  if (!call->first_tx) call->first_tx = c;
  if (call->first_tx != c) call->fanout = true;
}

/* What this rank moves in call `seq` merged with its last call that moved
 * large chunks before it: `received`, its core already copies what comes
 * in; `fanout`, it sends large chunks on two connections or more. Not "in
 * this call or the one before": a barrier between two calls (every
 * iteration of a benchmark) hid the pattern at the start of each call. A
 * call older than both kept ones runs beside newer calls: busy. */
static shm_large_call shm_recent(shm_ctx *ctx, uint32_t seq) {
  const shm_large_call *now = shm_large_call_of(ctx, seq);
  if (!now) return (shm_large_call){.received = true, .fanout = true};
  shm_large_call merged = *now;
  const shm_large_call *last = now == &ctx->large_now ? &ctx->large_before : NULL;
  if (last && last->valid) {
    merged.received |= last->received;
    merged.fanout |= last->fanout;
  }
  return merged;
}

/* ---- the verdict MIXED: some chunks by address while the slots run slow ----------
 *
 * Where a read cost 2 memcpy or more, two copies through the slots win only
 * while the sender's copies into them run at memcpy speed, and on a 2-vCPU
 * guest the host's placement of the vCPUs sometimes slows them. So the
 * sender times those copies, and while they cost more than a read of the
 * same bytes (timed at start), every other chunk goes by address: the peer
 * reads it while the sender copies the next. Half, not all, keeps the slots
 * measured, so the way back is found. Only where this rank takes no large
 * chunks itself (shm_recent); where it does, each core already makes both
 * copies, so the bar is higher (SHM_MIX_BOTH_WAYS_BAR) and, once over it,
 * all but 1 in SHM_MIX_BOTH_WAYS_SLOTS go by address (docs/tuning.md,
 * "While the slots run slow, part by single copy"). */
#define SHM_MIX_BOTH_WAYS_BAR 1.3   /* slot copies over a read, where large chunks come back */
#define SHM_MIX_BOTH_WAYS_SLOTS 16u /* there 1 in this many still goes through the slots */

/* A large chunk copied into slot `slot` in `secs`: folded into the average,
 * unless it wrote past what that slot had held. Those bytes met first-touch
 * page faults, which say nothing of the placement, and once folded in they
 * kept the average over the bar for good (docs/tuning.md, "While the slots
 * run slow, part by single copy"). */
void shm_mix_fold(shm_conn *c, uint32_t slot, size_t bytes, double secs) {
  if (bytes > c->tx_slot_touched[slot]) {
    c->tx_slot_touched[slot] = (uint32_t)bytes;
    return;
  }
  double x = secs * 1e9 / ((double)bytes / 1024.0);
  c->tx_in_ns_kib = c->tx_in_ns_kib > 0 ? (7 * c->tx_in_ns_kib + x) / 8 : x;
}

static bool shm_mix_by_address(shm_conn *c, uint32_t seq) {
  double readv = shm_mix_readv_ns_kib(&c->ctx->cma_timing);
  if (readv <= 0) return false;
  bool takes = shm_recent(c->ctx, seq).received;
  if (!(c->tx_in_ns_kib > (takes ? SHM_MIX_BOTH_WAYS_BAR : 1.0) * readv)) return false;
  if (takes) return c->tx_mix_turn++ % SHM_MIX_BOTH_WAYS_SLOTS != 0;
  return (c->tx_mix_turn++ & 1) == 0;
}

/* ---- one-way streams on a pair that reads by single copy ----------------------
 *
 * One reader moves every byte of a single copy alone: once a stream
 * outgrows the cache, two copies through the slots, one on each core, go
 * faster. So the part of a call's stream past WEFT_SHM_CMA_STREAM_BYTES goes
 * through the slots, but only where this rank's core has nothing else to
 * do: no large chunk came in on any connection in this call or in its last
 * call that moved large chunks (a chain's middle ranks, allgather, alltoall
 * already work), and no other connection sent large chunks then (a
 * scatter's root would copy every piece where the readers copy in
 * parallel) (docs/tuning.md, "A long one-way stream goes through the slots
 * after its first MiB"). */

/* For an eligible chunk of `bytes` on a YES pair: whether it goes through
 * the slots after all (counts it either way). */
static bool shm_stream_through_slots(shm_conn *c, size_t bytes, uint32_t seq) {
  shm_ctx *ctx = c->ctx;
  if (c->tx_stream_seq != seq) {
    c->tx_stream_seq = seq;
    c->tx_stream_bytes = 0;
  }
  uint64_t before = c->tx_stream_bytes;
  c->tx_stream_bytes += bytes;
  if (ctx->cma_stream_bytes == 0 || before < ctx->cma_stream_bytes) return false;
  shm_large_call recent = shm_recent(ctx, seq);
  return !recent.received && !recent.fanout;
}

/* Whether a chunk of `bytes` read with `mem` could go as a descriptor: large
 * enough to be worth a system call, and host memory (the peer's kernel reads
 * it through our page tables). Whether it does is the peer's verdict. */
static bool shm_cma_eligible(shm_conn *c, size_t bytes, const struct weft_mem_ops *mem) {
  if (bytes <= SHM_INLINE_BYTES || bytes < c->ctx->cma_min_bytes) return false;
  if (mem->kind != WEFT_MEMORY_HOST && mem->kind != WEFT_MEMORY_SHARED) return false;
  if (c->tx_cma == SHM_CMA_UNDECIDED)
    c->tx_cma = (uint8_t)atomic_load_explicit(&c->tx->cma_verdict, memory_order_acquire);
  return true;
}

enum shm_send_way shm_cma_send_way(shm_conn *c, size_t bytes, uint32_t seq,
                                   const struct weft_mem_ops *mem) {
  if (!shm_cma_eligible(c, bytes, mem)) return SHM_SEND_COPY;
  if (c->tx_cma == SHM_CMA_MIXED) /* the slots' copies are timed, some go by address */
    return shm_mix_by_address(c, seq) ? SHM_SEND_BY_ADDRESS : SHM_SEND_COPY_TIMED;
  if (c->tx_cma == SHM_CMA_YES && !shm_stream_through_slots(c, bytes, seq))
    return SHM_SEND_BY_ADDRESS;
  return SHM_SEND_COPY;
}

/* ---- reading the peer's memory --------------------------------------------------- */

/* Whether the peer's process is still there, asked now (not from the last
 * liveness round). */
static bool shm_peer_alive_now(shm_conn *c) {
  if (c->pidfd >= 0) {
    struct pollfd p = {.fd = c->pidfd, .events = POLLIN};
    if (poll(&p, 1, 0) == 1) c->peer_ended = true;
  } else if (kill((pid_t)c->peer_pid, 0) != 0 && errno == ESRCH) {
    c->peer_ended = true;
  }
  return !c->peer_ended;
}

/* The sender of a descriptor ended before we copied its chunk: the bytes
 * were only in its memory, so they are lost with it. */
static weft_status shm_cma_lost(shm_conn *c, size_t bytes) {
  weft_status st = shm_peer_gone(c); /* a failure notice says more than the exit */
  if (st) return st;
  return shm_conn_fail(c, WEFT_ERR_PEER_LOST,
                       "peer %d (pid %u) ended or crashed before this rank copied the %zu bytes "
                       "it had posted (single copy: they were only in its memory)",
                       c->peer, c->peer_pid, bytes);
}

weft_status shm_cma_readv(shm_conn *c, const struct iovec *remote, size_t n, void *dst,
                          size_t bytes) {
  struct iovec rest[SHM_CELLS];
  const struct iovec *from = remote;
  size_t first = 0, skip = 0, done = 0; /* remote[first], `skip` bytes in, is where `done` is */
  while (done < bytes) {
    struct iovec local = {(char *)dst + done, bytes - done};
    if (done) { /* short: go on from where it stopped */
      memcpy(rest, remote + first, (n - first) * sizeof *rest);
      rest[0].iov_base = (char *)rest[0].iov_base + skip;
      rest[0].iov_len -= skip;
      from = rest;
    }
    ssize_t got = process_vm_readv((pid_t)c->peer_pid, &local, 1, from, n - first, 0);
    c->cma_reads++;
    if (got > 0) { /* short only where a page failed: the next call says why */
      done += (size_t)got;
      skip += (size_t)got;
      while (first < n && skip >= remote[first].iov_len) skip -= remote[first++].iov_len;
      continue;
    }
    int e = got < 0 ? errno : EFAULT;
    if (e == EINTR) continue;
    if (e == ESRCH || !shm_peer_alive_now(c)) return shm_cma_lost(c, bytes);
    return shm_conn_fail(c, e == EFAULT ? WEFT_ERR_PROTOCOL : WEFT_ERR_SYSTEM,
                         "rank %d could not copy %zu bytes from peer %d (pid %u) at %#llx: "
                         "process_vm_readv: %s",
                         c->ctx->args->rank, bytes, c->peer, c->peer_pid,
                         (unsigned long long)(uintptr_t)remote[first].iov_base + skip, strerror(e));
  }
  /* The pid named the peer all along only if the peer is alive now: a pid
   * reused after its end would be another process's memory. */
  if (!shm_peer_alive_now(c)) return shm_cma_lost(c, bytes);
  /* A sender that failed may have handed its buffer back to its caller
   * before we read it: what we read may not be what it posted. */
  if (atomic_load_explicit(&c->rx->aborted, memory_order_acquire)) return shm_peer_gone(c);
  c->cma_chunks += n;
  c->cma_bytes += bytes;
  return WEFT_OK;
}

struct iovec shm_cma_where(const shm_cell *cell, size_t bytes) {
  uint64_t addr;
  memcpy(&addr, cell->data, sizeof addr);
  return (struct iovec){(void *)(uintptr_t)addr, bytes};
}

weft_status shm_cma_read(shm_conn *c, const shm_cell *cell, void *dst, size_t bytes) {
  struct iovec remote = shm_cma_where(cell, bytes);
  return shm_cma_readv(c, &remote, 1, dst, bytes);
}
