/* shm_conn.c - one shared-memory connection: the pair segment (created by the
 * lower rank, unlinked by the higher as soon as it has mapped it, and by
 * whichever side gives up on the pair before that, so a crash leaves no name
 * behind), the FIFO data path, single copy (process_vm_readv) for chunks the
 * receiver takes with recv, futex sleeping, and noticing a dead peer
 * through its pidfd. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"
#include "src/base/log.h"
#include "src/mem/mem.h"
#include "src/mem/shared_mem.h"
#include "src/base/net.h"
#include "transports/shm/shm_settings.h"
#include "src/base/status.h"

/* The header's pages: the same for every geometry, so an opener can read a
 * creator's settings even when they differ from its own. */
static size_t shm_segment_head(void) {
  return (sizeof(shm_segment) + 4095) & ~(size_t)4095;
}

size_t shm_segment_bytes(int nslots, size_t slot_bytes) {
  return shm_segment_head() + 2 * (size_t)nslots * slot_bytes;
}

void shm_pair_name(char *name, size_t len, uint64_t comm_id, int rank, int peer, int channel) {
  int lo = rank < peer ? rank : peer, hi = rank < peer ? peer : rank;
  snprintf(name, len, "/weft-%016llx-%d-%d-%d", (unsigned long long)comm_id, lo, hi, channel);
}

/* ---- futex ------------------------------------------------------------------ */

/* Not FUTEX_PRIVATE: the word is shared between processes. */
void shm_futex_wake(atomic_uint *word) {
  syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void shm_futex_wait(atomic_uint *word, uint32_t expected, int timeout_ms) {
  struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

/* ---- segment header ---------------------------------------------------------- */

weft_status shm_segment_parse(const uint8_t *buf, size_t len, shm_segment_info *out) {
  if (len < sizeof(shm_segment)) return WEFT_ERR_PROTOCOL;
  memcpy(&out->magic, buf + offsetof(shm_segment, magic), 4);
  memcpy(&out->version, buf + offsetof(shm_segment, version), 4);
  memcpy(&out->nslots, buf + offsetof(shm_segment, nslots), 4);
  memcpy(&out->slot_bytes, buf + offsetof(shm_segment, slot_bytes), 8);
  return WEFT_OK;
}

const char *shm_segment_check(const shm_segment_info *info, uint32_t nslots, uint64_t slot_bytes,
                              size_t seg_bytes) {
  if (info->magic != SHM_SEG_MAGIC) return "not a weft segment";
  if (info->version != SHM_SEG_VERSION || info->nslots != nslots || info->slot_bytes != slot_bytes)
    return "made with other settings (slots, WEFT_CHUNK_BYTES)";
  /* the FIFOs index slots by these numbers: they must fit what was mapped */
  if (nslots == 0 || nslots > SHM_MAX_SLOTS || shm_segment_bytes((int)nslots, slot_bytes) > seg_bytes)
    return "larger than its mapping";
  return NULL;
}

/* ---- set-up and teardown -------------------------------------------------- */

/* Takes the pair's name away if it may still be there. Safe whenever this
 * side gives up: the creator needs the name only to make the segment, the
 * opener only to map it, and a segment made after this is its creator's to
 * unlink (it does on giving up, or on seeing this rank dead). */
static void shm_conn_unlink(shm_conn *c) {
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

/* /dev/shm had no room for the pair's segment although can_reach found
 * enough: another process took it since. Both ranks of the pair fail with
 * this sentence (the opener reads the creator's mark), so neither waits for
 * the other and neither is left on shm while the other is not. */
static weft_status shm_conn_no_room(shm_conn *c) {
  shm_ctx *ctx = c->ctx;
  struct statvfs vfs;
  unsigned long long free_bytes =
      statvfs("/dev/shm", &vfs) == 0 ? (unsigned long long)vfs.f_bavail * vfs.f_frsize : 0;
  int lo = ctx->args->rank < c->peer ? ctx->args->rank : c->peer;
  return shm_conn_fail(c, WEFT_ERR_NOMEM,
                       "rank %d could not make the shared memory of ranks %d and %d: /dev/shm has "
                       "%.1f MiB free and the pair needs %.1f MiB (%d slots of %zu KiB each way); "
                       "the room was there when the communicator chose shm, so another process "
                       "took it since: free or enlarge /dev/shm, lower WEFT_SHM_SLOTS or "
                       "WEFT_CHUNK_BYTES, or set WEFT_TRANSPORT=tcp",
                       lo, lo, c->creator ? c->peer : ctx->args->rank,
                       (double)free_bytes / (1 << 20), (double)c->seg_bytes / (1 << 20),
                       ctx->nslots, ctx->args->chunk_bytes >> 10);
}

static void shm_conn_map_fifos(shm_conn *c) {
  bool lower = c->ctx->args->rank < c->peer;
  size_t head = shm_segment_head();
  size_t fifo_bytes = (size_t)c->seg->nslots * c->seg->slot_bytes;
  char *data = (char *)c->seg + head;
  c->tx = &c->seg->fifo[lower ? 0 : 1];
  c->rx = &c->seg->fifo[lower ? 1 : 0];
  c->tx_slots = data + (lower ? 0 : fifo_bytes);
  c->rx_slots = data + (lower ? fifo_bytes : 0);
  c->tx_head = atomic_load(&c->tx->head);
  c->tx_tail_seen = atomic_load(&c->tx->tail);
  c->rx_tail = atomic_load(&c->rx->tail);
  /* Single copy: offer the peer a word of ours to read from our process
   * (shm_fifo says how the pair agrees). The word lies in the segment, so
   * the peer can compare what it read with what it sees itself. */
  if (c->ctx->cma_mode != WEFT_SHM_CMA_OFF && !atomic_load(&c->tx->cma_offer)) {
    c->tx->cma_probe_word =
        ((uint64_t)c->ctx->self.pid << 32) ^ (uint64_t)(uintptr_t)c ^ 0x9e3779b97f4a7c15ull;
    c->tx->cma_probe_addr = (uint64_t)(uintptr_t)&c->tx->cma_probe_word;
    double ratio = c->ctx->cma_mode == WEFT_SHM_CMA_AUTO ? shm_cma_cost_ratio() : 0;
    c->tx->cma_cost_milli = ratio > 0 && ratio < 1e6 ? (uint32_t)(ratio * 1000 + 0.5) : 0;
    atomic_store_explicit(&c->tx->cma_offer, 1, memory_order_release);
  }
}

static weft_status shm_conn_make_segment(shm_conn *c) {
  shm_ctx *ctx = c->ctx;
  int fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return shm_conn_fail(c, WEFT_ERR_SYSTEM, "cannot create shared memory %s: %s", c->name,
                         strerror(errno));
  c->maybe_linked = true;
  /* fallocate, not ftruncate: a full /dev/shm is an error now, not a SIGBUS
   * later when a page is first touched. */
  int rc = posix_fallocate(fd, 0, (off_t)c->seg_bytes);
  if (rc == ENOSPC) {
    /* leave the mark (no space needed) for the opener; unlinked by whichever
     * side gives up last (shm_conn_fail, shm_conn_check_peer, destroy) */
    bool marked = ftruncate(fd, SHM_NO_ROOM_BYTES) == 0;
    close(fd);
    if (!marked) shm_conn_unlink(c);
    return shm_conn_no_room(c);
  }
  if (rc) {
    close(fd);
    shm_conn_unlink(c);
    return shm_conn_fail(c, WEFT_ERR_SYSTEM, "cannot size the shared memory %s: %s", c->name,
                         strerror(rc));
  }
  void *p = mmap(NULL, c->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    int e = errno;
    shm_conn_unlink(c);
    return shm_conn_fail(c, WEFT_ERR_SYSTEM, "mmap of %s: %s", c->name, strerror(e));
  }
  c->seg = p;
  c->seg->version = SHM_SEG_VERSION;
  c->seg->nslots = (uint32_t)ctx->nslots;
  c->seg->slot_bytes = ctx->args->chunk_bytes;
  atomic_store_explicit(&c->seg->magic, SHM_SEG_MAGIC, memory_order_release);
  shm_conn_map_fifos(c);
  c->state = SHM_CONN_UP;
  WEFT_INFO(WEFT_SUBSYS_NET, "shm: rank %d made %s (%zu bytes) for peer %d", ctx->args->rank,
            c->name, c->seg_bytes, c->peer);
  return WEFT_OK;
}

/* The pair's settings differ (WEFT_SHM_SLOTS, WEFT_CHUNK_BYTES, or the
 * segment layout of another build): a mismatch on both ranks at once. The
 * creator learns it from the segment's header and its abort text (the same
 * sentence, naming both values); written only when the layout versions
 * agree, since only then is the creator's header laid out as ours. */
static weft_status shm_conn_refuse(shm_conn *c, shm_segment *seg, const shm_segment_info *info) {
  int me = c->ctx->args->rank, lo = c->peer;
  char what[SHM_ABORT_TEXT];
  if (info->version != SHM_SEG_VERSION) {
    snprintf(what, sizeof what,
             "ranks %d and %d run weft builds whose shared memory differs (segment layout %u on "
             "rank %d, %u on rank %d): run one build on every rank",
             lo, me, info->version, lo, SHM_SEG_VERSION, me);
    return shm_conn_fail(c, WEFT_ERR_MISMATCH, "%s", what);
  }
  char slots[96] = "", chunk[128] = "";
  if (info->nslots != (uint32_t)c->ctx->nslots)
    snprintf(slots, sizeof slots, "WEFT_SHM_SLOTS is %u on rank %d and %d on rank %d",
             info->nslots, lo, c->ctx->nslots, me);
  if (info->slot_bytes != c->ctx->args->chunk_bytes)
    snprintf(chunk, sizeof chunk, "%sWEFT_CHUNK_BYTES is %llu on rank %d and %zu on rank %d",
             slots[0] ? " and " : "", (unsigned long long)info->slot_bytes, lo,
             c->ctx->args->chunk_bytes, me);
  /* the precisions keep the sentence within SHM_ABORT_TEXT, as the
   * compiler checks: the parts never reach them */
  snprintf(what, sizeof what,
           "ranks %d and %d disagree on their shared memory: %.80s%.100s; set them alike on "
           "every rank",
           lo, me, slots, chunk);
  shm_fifo *to_creator = &seg->fifo[1];
  snprintf(to_creator->abort_text, sizeof to_creator->abort_text, "%s", what);
  atomic_store_explicit(&seg->refused, 1, memory_order_relaxed);
  atomic_store_explicit(&to_creator->aborted, 1, memory_order_release);
  /* the words the creator may sleep on: data from us, room toward us */
  shm_futex_wake(&to_creator->head);
  shm_futex_wake(&seg->fifo[0].tail);
  return shm_conn_fail(c, WEFT_ERR_MISMATCH, "%s", what);
}

/* The higher rank: map the segment once the lower rank made it, then take
 * the name away (nobody needs it any more). WEFT_AGAIN until it exists. */
weft_status shm_conn_try_open(shm_conn *c) {
  int fd = shm_open(c->name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return WEFT_AGAIN;
    return shm_conn_fail(c, WEFT_ERR_SYSTEM, "cannot open shared memory %s: %s", c->name,
                         strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return shm_conn_fail(c, WEFT_ERR_SYSTEM, "fstat of shared memory %s: %s", c->name,
                         strerror(e));
  }
  size_t size = (size_t)st.st_size;
  if (size == SHM_NO_ROOM_BYTES) {
    close(fd);
    return shm_conn_no_room(c);
  }
  if (size < shm_segment_head()) {
    close(fd); /* still being sized by its creator */
    return WEFT_AGAIN;
  }
  /* What the creator made, up to what this rank needs: its header tells
   * its settings even when its segment is smaller than ours would be. */
  size_t len = size < c->seg_bytes ? size : c->seg_bytes;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return shm_conn_fail(c, WEFT_ERR_SYSTEM, "mmap of %s: %s", c->name, strerror(errno));
  shm_segment *seg = p;
  if (atomic_load_explicit(&seg->magic, memory_order_acquire) != SHM_SEG_MAGIC) {
    munmap(p, len);
    return WEFT_AGAIN;
  }
  shm_segment_info info = {0};
  shm_segment_parse(p, len, &info); /* len >= the header's pages */
  if (info.version != SHM_SEG_VERSION || info.nslots != (uint32_t)c->ctx->nslots ||
      info.slot_bytes != c->ctx->args->chunk_bytes) {
    weft_status st = shm_conn_refuse(c, seg, &info);
    munmap(p, len);
    return st;
  }
  const char *bad = shm_segment_check(&info, (uint32_t)c->ctx->nslots, c->ctx->args->chunk_bytes, len);
  if (bad) {
    munmap(p, len);
    return shm_conn_fail(c, WEFT_ERR_PROTOCOL, "peer %d's shared memory %s is %s", c->peer,
                         c->name, bad);
  }
  c->seg = seg;
  shm_conn_unlink(c);
  atomic_store(&seg->peer_mapped, 1);
  shm_conn_map_fifos(c);
  c->state = SHM_CONN_UP;
  return WEFT_OK;
}

weft_status shm_conn_create(shm_ctx *ctx, int peer, int channel, const shm_addr *peer_addr,
                            shm_conn **out) {
  shm_conn *c = calloc(1, sizeof *c);
  if (!c) return WEFT_ERR_NOMEM;
  c->ctx = ctx;
  c->peer = peer;
  c->channel = channel;
  c->pidfd = -1;
  c->peer_pid = peer_addr->pid;
  c->state = SHM_CONN_OPENING;
  c->seg_bytes = shm_segment_bytes(ctx->nslots, ctx->args->chunk_bytes);
  shm_pair_name(c->name, sizeof c->name, ctx->args->comm_id, ctx->args->rank, peer, channel);
#ifdef SYS_pidfd_open
  c->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)peer_addr->pid, 0);
#endif
  *out = c;
  if (ctx->args->rank < peer) {
    c->creator = true;
    return shm_conn_make_segment(c);
  }
  c->maybe_linked = true; /* its creator may have made it: ours to unlink if we give up */
  weft_status st = shm_conn_try_open(c);
  return st == WEFT_AGAIN ? WEFT_OK : st;
}

/* A failure notice to a lower peer this rank never connected to: the peer
 * may have made the pair's segment and be waiting on it for this rank's
 * first chunk (a rank that fails before its first exchange with it). Only
 * the header is mapped, to write the notice where the peer looks; the name
 * stays for shm_unlink_unopened. Never made here: a segment the peer never
 * comes for would outlive a rank that exits without weft_comm_destroy, and
 * a crash must leave nothing in /dev/shm. A peer that makes it after this
 * learns that this rank ended, from its pidfd. */
void shm_notice_unopened(shm_ctx *ctx, int peer, int channel, const char *reason) {
  char name[64];
  shm_pair_name(name, sizeof name, ctx->args->comm_id, ctx->args->rank, peer, channel);
  size_t head = shm_segment_head();
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return; /* not made: the peer is not waiting on it */
  /* a segment its creator is still sizing: a few milliseconds at most */
  struct stat st = {0};
  for (int tries = 0; tries < 100 && fstat(fd, &st) == 0 && (size_t)st.st_size < head; tries++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  void *p = (size_t)st.st_size >= head
                ? mmap(NULL, head, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return;
  shm_segment *seg = p;
  shm_fifo *to_creator = &seg->fifo[1];
  if (!atomic_load_explicit(&to_creator->aborted, memory_order_relaxed)) {
    snprintf(to_creator->abort_text, sizeof to_creator->abort_text, "%s", reason);
    atomic_store_explicit(&to_creator->aborted, 1, memory_order_release);
  }
  if (atomic_load_explicit(&seg->magic, memory_order_acquire) == SHM_SEG_MAGIC) {
    shm_futex_wake(&to_creator->head);
    shm_futex_wake(&seg->fifo[0].tail);
  }
  munmap(p, head);
}

void shm_conn_notify_abort(shm_conn *c, const char *reason) {
  /* A connection this rank found a stray chunk on (a mismatch) is dead for
   * data, but its segment is still mapped and the peer still reads it: the
   * peer that sent the chunk must get the cause too, not only our exit.
   * Also on a connection that died of the peer's own notice: the peer may
   * still read ours (a timeout's culprit exchange, src/engine/engine.c,
   * needs every rank's notice at every rank). Once per connection. */
  bool up = c->state == SHM_CONN_UP;
  bool mapped_dead = c->state == SHM_CONN_DEAD && c->tx && c->rx && !c->peer_ended &&
                     c->dead_status == WEFT_ERR_MISMATCH;
  bool answering = c->state == SHM_CONN_DEAD && c->tx && c->notice_read;
  if ((!up && !mapped_dead && !answering) ||
      atomic_load_explicit(&c->tx->aborted, memory_order_relaxed))
    return;
  snprintf(c->tx->abort_text, sizeof c->tx->abort_text, "%s", reason);
  atomic_store_explicit(&c->tx->aborted, 1, memory_order_release);
  /* bump both words the peer may sleep on, so it wakes and sees the flag */
  shm_futex_wake(&c->tx->head);
  shm_futex_wake(&c->rx->tail);
  if (!up) return;
  c->state = SHM_CONN_DEAD;
  c->dead_status = WEFT_ERR_ABORTED;
}

void shm_conn_destroy(shm_conn *c) {
  if (c->cma_chunks)
    WEFT_INFO(WEFT_SUBSYS_NET,
              "shm: rank %d took %llu chunks (%.1f MiB) from peer %d by single copy "
              "(%llu process_vm_readv)",
              c->ctx->args->rank, (unsigned long long)c->cma_chunks,
              (double)c->cma_bytes / (1 << 20), c->peer, (unsigned long long)c->cma_reads);
  for (int i = 0; i < c->nmaps; i++) munmap(c->maps[i].base, c->maps[i].bytes);
  if (c->seg) munmap(c->seg, c->seg_bytes);
  shm_conn_unlink(c); /* the peer never mapped it, or this rank never did */
  if (c->pidfd >= 0) close(c->pidfd);
  free(c->rx_peeked);
  free(c);
}

/* ---- liveness ------------------------------------------------------------------ */

static weft_status shm_peer_gone(shm_conn *c) {
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

/* A peer's failure notice, from progress, as tcp's listener gives them: on
 * a pair the current call does not read, and one that came after this rank
 * sent its own (its connection is dead, so no data call reads it any more).
 * Read once; the timeout's culprit exchange (src/engine/engine.c) collects
 * every rank's this way. */
weft_status shm_conn_take_notice(shm_conn *c) {
  if (c->notice_read || !c->rx || !atomic_load_explicit(&c->rx->aborted, memory_order_acquire))
    return WEFT_OK;
  if (c->state == SHM_CONN_UP) return shm_peer_gone(c);
  if (c->state != SHM_CONN_DEAD) return WEFT_OK;
  c->notice_read = true;
  char text[SHM_ABORT_TEXT];
  snprintf(text, sizeof text, "%.*s", SHM_ABORT_TEXT - 1, c->rx->abort_text);
  weft_error_sink_set(c->ctx->args->errors, "peer %d passed on a failure: %s", c->peer, text);
  snprintf(c->ctx->args->errors->origin, sizeof c->ctx->args->errors->origin, "%s", text);
  return WEFT_ERR_PEER_LOST;
}

static weft_status shm_peer_ended(shm_conn *c, const char *needing) {
  weft_status st = shm_peer_gone(c); /* a failure notice says more than the exit */
  if (st) return st;
  return shm_conn_fail(c, WEFT_ERR_PEER_LOST,
                       "peer %d (pid %u) ended or crashed while this rank "
                       "waited for %s",
                       c->peer, c->peer_pid, needing);
}

/* ---- data path ------------------------------------------------------------------ */

static weft_status shm_conn_usable(shm_conn *c) {
  if (c->state == SHM_CONN_UP) return WEFT_OK;
  if (c->state == SHM_CONN_DEAD) return c->dead_status;
  if (c->peer_ended) return shm_peer_ended(c, "its shared memory");
  weft_status st = shm_conn_try_open(c);
  if (st == WEFT_AGAIN) {
    c->ctx->want_conn = c;
    c->ctx->want = SHM_WANT_OPEN;
  }
  return st;
}

/* Room for one more chunk: a cell, and a slot in case it needs one (a
 * sender cannot say which before it posts). The slots of the chunks the
 * peer released came back with them: as many as were taken up to the last
 * released chunk. That chunk is at most SHM_CELLS - 1 behind the newest
 * one here, so its note is still there. */
static bool shm_room(const shm_conn *c) {
  if (c->tx_head - c->tx_tail_seen >= SHM_CELLS) return false;
  uint32_t back = c->tx_slots_after[(c->tx_tail_seen - 1) % SHM_CELLS];
  return c->tx_slots_taken - back < (uint32_t)c->ctx->nslots;
}

static weft_status shm_ready(shm_conn *c) {
  WEFT_STATUS_PASS(shm_conn_usable(c));
  if (atomic_load_explicit(&c->rx->aborted, memory_order_relaxed)) return shm_peer_gone(c);
  if (c->peer_ended) return shm_peer_ended(c, "room to send");
  /* The receiver writes tail on every release; reading it on every send
   * would fetch its line back each time (~0.3 us). The last value seen
   * stays true (tail only grows): read again only when it shows no room. */
  if (shm_room(c)) return WEFT_OK;
  c->tx_tail_seen = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
  if (shm_room(c)) return WEFT_OK;
  c->ctx->want_conn = c;
  c->ctx->want = SHM_WANT_SEND;
  return WEFT_AGAIN;
}

weft_status shm_send_ready(weft_tp_conn *conn) {
  return shm_ready(shm_conn_of(conn));
}

/* ---- single copy ---------------------------------------------------------------- */

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

static void shm_note_large_rx(shm_conn *c, uint32_t seq) {
  shm_large_call *call = shm_large_call_of(c->ctx, seq);
  if (call) call->received = true;
}

static void shm_note_large_tx(shm_conn *c, uint32_t seq) {
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

/* ---- the verdict MIXED: single copy for every other chunk while the slots run slow ----
 *
 * Where process_vm_readv cost 2 memcpy or more when timed (shm_cma_pays),
 * two copies through the slots are the faster way, as long as the sender's
 * copies into them run at memcpy speed. On a 2-vCPU guest they do not
 * always: while the host keeps the two vCPUs apart, writing a slot the peer
 * has just read costs the sender 200-250 ns/KiB instead of 60-66 (a 2-rank
 * broadcast of 2 MiB through the slots: 400-530 us against 70-130), and
 * the host changes that placement while a job runs. Open MPI's single copy
 * took 200-250 us throughout. So the sender times its own copies of large
 * chunks into the slots, and while their recent average costs more than a
 * process_vm_readv of the same bytes (timed at start), every other chunk
 * goes by address: the receiver reads it while the sender copies the next,
 * and the two cores share the work (2 MiB: 170-200 us in that placement).
 * Only where this rank takes no large chunks itself (shm_recent):
 * where it does (allgather, alltoall, a chain's middle ranks) each core
 * already makes both copies, and sending half by address there ran slower
 * than either way alone (2-rank allgather of 2 MiB: 270-290 us); all but
 * one in 8 by address there was no better than the slots (4 and 3
 * alternated runs of allgather and alltoall, 128 KiB-32 MiB). Asked first
 * as "from the peer in this call or the one before", a barrier between two
 * calls hid the other way, and in the slow placement 174-283 of a 2-rank
 * allgather's or alltoall's chunks went by address (none now; either way
 * that placement took 85-98 us at 512 KiB, the near one 25-43). Half, not
 * all: the slots stay in use, so their cost stays measured and the way
 * back is found.
 *
 * Where this rank takes large chunks too, the bar is higher and the share
 * larger: while its copies into the slots cost more than 1.3 reads, 15 of
 * 16 chunks go by address. Half went slower than either way (above), but
 * all but one in 16 is up to twice as fast as the slots in the far
 * placement. The same job switching between the two every 8 calls (2
 * ranks, 6 rounds; allgather and alltoall), in the 5 jobs of 10 that drew
 * that placement: 81-101 against 47-85 us at 512 KiB, 353-373 against
 * 193-256 at 2 MiB, 0.81-1.06x at 8 MiB (where repeats moved 15% either
 * way). There the copies in cost 126-309 ns/KiB against reads timed at
 * 103-161; in the near placement 45-104 against 92-156, and the slots,
 * which keep everything there, ran 1.1-1.2x faster than all by address. */
#define SHM_MIX_BOTH_WAYS_BAR 1.3   /* slot copies over a read, where large chunks come back */
#define SHM_MIX_BOTH_WAYS_SLOTS 16u /* there 1 in this many still goes through the slots */
#define SHM_CMA_TIMED_BYTES (256u << 10)
static double cma_cost_ratio; /* 0: could not be timed */
static double cma_timed_readv_us, cma_timed_copy_us;

double shm_mix_readv_ns_kib(void) {
  double ratio = shm_cma_cost_ratio(); /* times once, if no one has */
  return ratio > 0 ? cma_timed_readv_us * 1000.0 / (SHM_CMA_TIMED_BYTES >> 10) : 0;
}

/* A large chunk copied into slot `slot` in `secs`: folded into the average,
 * unless it wrote past what that slot had held. Those bytes met first-touch
 * page faults (tmpfs pages, ~0.4 GB/s on this VM), which say nothing of the
 * placement. Counting the first 16 copies as the warm-up instead, a call
 * with larger chunks than before (the next size of a sweep) faulted in the
 * slots' next pages at 160-230 ns/KiB, the average crossed the bar, and 15
 * of 16 chunks went by address from then on: a 2-rank allgather or alltoall
 * of 128 KiB to 2 MiB, swept up from 64 KiB, ran at 0.92-1.00 of Open MPI's
 * single copy, and at 1.44-2.31 with those copies left out (2 jobs each).
 * Once over the bar the average met mostly such copies again, so it stayed
 * there. */
static void shm_mix_fold(shm_conn *c, uint32_t slot, size_t bytes, double secs) {
  if (bytes > c->tx_slot_touched[slot]) {
    c->tx_slot_touched[slot] = (uint32_t)bytes;
    return;
  }
  double x = secs * 1e9 / ((double)bytes / 1024.0);
  c->tx_in_ns_kib = c->tx_in_ns_kib > 0 ? (7 * c->tx_in_ns_kib + x) / 8 : x;
}

static bool shm_mix_by_address(shm_conn *c, uint32_t seq) {
  double readv = shm_mix_readv_ns_kib();
  if (readv <= 0) return false;
  bool takes = shm_recent(c->ctx, seq).received;
  if (!(c->tx_in_ns_kib > (takes ? SHM_MIX_BOTH_WAYS_BAR : 1.0) * readv)) return false;
  if (takes) return c->tx_mix_turn++ % SHM_MIX_BOTH_WAYS_SLOTS != 0;
  return (c->tx_mix_turn++ & 1) == 0;
}

/* ---- one-way streams on a pair that reads by single copy ----------------------
 *
 * One reader moves every byte of a single copy alone. While the stream fits
 * in the cache that is the fastest way; once it outgrows it the reader runs
 * at one core's memory speed, and two copies through the slots, one on each
 * core, go twice as fast. On the 16-core machine (process_vm_readv 1.8x a
 * memcpy there, so single copy), a 2-rank broadcast took, single copy
 * against the slots, 24-26 / 43-47 us at 512 KiB, level at 2 MiB, 732-815 /
 * 649-740 at 8 MiB and 6140-6688 / 2544-3912 at 32 MiB. So the part of a
 * call's stream past WEFT_SHM_CMA_STREAM_BYTES goes through the slots, but
 * only where this rank's core has nothing else to do: no large chunk came
 * in on any connection in this call or in its last call that moved large
 * chunks (a chain's middle ranks read and forward; their single copy leaves
 * the next rank to read; allgather and alltoall keep single copy, each core
 * already works), and no other connection sent large chunks then (a
 * scatter's root would copy every piece itself where the readers now copy
 * in parallel). Not "this call or the last": a barrier between two calls
 * (every iteration of a benchmark) would hide the pattern. */

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

/* ---- whether single copy pays ---------------------------------------------------
 *
 * process_vm_readv pins every page it reads, one by one. Where that is cheap
 * it beats two copies through the slots (the sender's copy in, ours out);
 * in some VMs it is not: on a 2-vCPU KVM guest (Firecracker) reading 256 KiB
 * cost 3.0-3.9x a memcpy of it, and a 2-rank broadcast of 2 MiB took
 * 287-290 us by single copy against 94-111 us through the slots. Where every
 * rank sends as much as it receives (allgather, alltoall) each rank makes
 * both copies of its share, so they must cost less than one read: the bar
 * is 2 (WEFT_SHM_CMA=auto; "on" takes single copy wherever it is allowed).
 * The same bar holds where ranks outnumber cores: there CPU time decides, and
 * a read that costs 2 memcpy or more costs more of it than two copies. Kept
 * single copy there before: 4 ranks on the 2 vCPUs (readv 8x a memcpy),
 * allgather, alltoall and broadcast of 32 KiB-64 MiB paired with Open MPI
 * in one job (2 jobs each) read 0.90-3.41 of it by single copy (broadcast
 * 0.90-2.21), 0.94-4.67 with the slots as here (1.62-4.67); 8 ranks
 * 0.73-1.08 against 1.31-1.82 from 2 MiB (allgather, alltoall); 3 ranks
 * level. */
#define SHM_CMA_PAYS_BELOW 2.0 /* readv time over memcpy time */

/* Times both ways of moving SHM_CMA_TIMED_BYTES within this process (a
 * process may read itself), best of eleven each: about a millisecond,
 * once. Fewer tries let one rank of a pair, now and then, take a preempted
 * memcpy for the norm and decide the other way (best of five: 1 pair in
 * about 20 split, and that split pair ran a 2-rank alltoall 2-3x slower
 * than either way alone). */
static void shm_cma_time_once(void) {
  size_t n = SHM_CMA_TIMED_BYTES;
  char *a = mmap(NULL, 2 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) return;
  char *b = a + n;
  memset(a, 1, 2 * n); /* faults stay out of the timing */
  double readv_us = 1e9, copy_us = 1e9;
  for (int i = 0; i < 11; i++) {
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
    cma_timed_readv_us = readv_us;
    cma_timed_copy_us = copy_us;
    cma_cost_ratio = readv_us / copy_us;
  }
}

double shm_cma_cost_ratio(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, shm_cma_time_once);
  return cma_cost_ratio;
}

bool shm_cma_ratio_pays(double ratio) {
  return ratio < SHM_CMA_PAYS_BELOW;
}

/* The pair's ratio is the mean of both ends' timings: each end times its
 * own process, and near the bar the two fell on either side of it (16
 * cores: 1.8-2.0 against 2.0-2.2 in 11 of 12 starts), so one direction
 * read by single copy while the other went through the slots, and a
 * 2-rank alltoall of 2 MiB took 276-305 us, slower than either way alone
 * (166-195 us single copy, 236-272 through the slots). From the same two
 * numbers both receivers of a pair decide alike. */
bool shm_ranks_outnumber_cores(const weft_transport_init_args *args, long *cores) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores) *cores = n;
  return n > 0 && args->local_size > n;
}

bool shm_cma_pays(const shm_ctx *ctx, double peer_ratio, char *why, size_t why_len) {
  double own = shm_cma_cost_ratio();
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
           SHM_CMA_TIMED_BYTES >> 10, cma_timed_readv_us, own, cma_timed_copy_us, peer_ratio, ratio,
           because);
  return pays;
}

/* The receiver's side of the agreement: once the sender has offered its
 * word, read it from the sender's process and say whether that worked.
 * Refusals are ordinary (seccomp in containers, Yama ptrace_scope 2+,
 * another user): the pair keeps two copies, said under NET. */
static void shm_cma_decide(shm_conn *c) {
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

/* Copies the chunks that `n` descriptors point at (remote[], in the peer's
 * process) into dst, one after another (host memory): one process_vm_readv
 * for all of them, more only where one came back short. */
static weft_status shm_cma_readv(shm_conn *c, const struct iovec *remote, size_t n, void *dst,
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

static struct iovec shm_cma_where(const shm_cell *cell, size_t bytes) {
  uint64_t addr;
  memcpy(&addr, cell->data, sizeof addr);
  return (struct iovec){(void *)(uintptr_t)addr, bytes};
}

/* Copies the chunk a descriptor cell points at from the peer's process
 * into dst (host memory). */
static weft_status shm_cma_read(shm_conn *c, const shm_cell *cell, void *dst, size_t bytes) {
  struct iovec remote = shm_cma_where(cell, bytes);
  return shm_cma_readv(c, &remote, 1, dst, bytes);
}

/* ---- sending ------------------------------------------------------------------- */

static weft_status shm_post(shm_conn *c, const void *src, size_t bytes, uint32_t seq,
                            const struct weft_mem_ops *mem, bool for_copy) {
  weft_status st = shm_ready(c);
  if (st) return st == WEFT_AGAIN ? WEFT_ERR_INTERNAL : st;
  if (bytes > c->ctx->args->chunk_bytes) return WEFT_ERR_INVALID;
  bool eligible = for_copy && shm_cma_eligible(c, bytes, mem);
  bool mixed = eligible && c->tx_cma == SHM_CMA_MIXED; /* slots timed, some by address */
  bool by_address = mixed ? shm_mix_by_address(c, seq)
                          : eligible && c->tx_cma == SHM_CMA_YES &&
                                !shm_stream_through_slots(c, bytes, seq);
  if (bytes > SHM_INLINE_BYTES) shm_note_large_tx(c, seq);
  shm_cell *cell = &c->tx->cell[c->tx_head % SHM_CELLS];
  uint32_t number = c->tx_head++;
  /* head is only the futex word (the receiver polls the cell). It moves
   * first: the seq_cst store waits for the store buffer to drain, and here
   * that buffer holds no store to a line the peer is reading; after the cell
   * store it would wait ~0.3 us for the peer to give up the cell's line.
   * seq_cst store then load: either the receiver sees the new head before it
   * sleeps, or we see that it sleeps and wake it (no lost wake-up); a
   * receiver that sees head ahead of a cell not yet ready polls again. */
  atomic_store(&c->tx->head, c->tx_head);
  if (by_address) {
    uint64_t addr = (uint64_t)(uintptr_t)src;
    memcpy(cell->data, &addr, sizeof addr);
    cell->how = SHM_CELL_CMA;
    c->tx_copy_pending = true;
    c->tx_copy_until = c->tx_head; /* complete once the peer released this cell */
  } else {
    double t0 = mixed ? weft_now() : 0;
    void *to = cell->data;
    uint32_t slot = 0;
    if (bytes > SHM_INLINE_BYTES) { /* shm_room kept one free */
      slot = c->tx_slots_taken++ % (uint32_t)c->ctx->nslots;
      to = c->tx_slots + (size_t)slot * c->ctx->args->chunk_bytes;
    }
    mem->copy(to, src, bytes);
    if (mixed) shm_mix_fold(c, slot, bytes, weft_now() - t0);
    cell->how = SHM_CELL_DATA;
  }
  cell->seq = seq;
  cell->len = (uint32_t)bytes;
  c->tx_slots_after[number % SHM_CELLS] = c->tx_slots_taken;
  atomic_store_explicit(&cell->ready, number + 1, memory_order_release);
  if (atomic_load(&c->tx->recv_sleeping)) shm_futex_wake(&c->tx->head);
  return WEFT_OK;
}

/* Stores move at once, so WEFT_SEND_NOW asks nothing more; a chunk taken
 * by copy may go by address (shm_post). */
weft_status shm_send(weft_tp_conn *conn, const void *src, size_t bytes, uint32_t seq,
                     const struct weft_mem_ops *mem, unsigned flags) {
  return shm_post(shm_conn_of(conn), src, bytes, seq, mem, (flags & WEFT_SEND_FOR_COPY) != 0);
}

/* A chunk is complete once copied into the slot; a descriptor's once the
 * peer has copied it and released its cell. */
weft_status shm_send_idle(weft_tp_conn *conn) {
  shm_conn *c = shm_conn_of(conn);
  if (c->state == SHM_CONN_DEAD) return c->dead_status;
  /* Chunks sit in a segment only the peer's mapping can reach: until it has
   * mapped it, they are not delivered (this rank ending now would unlink
   * the segment with them). */
  if (c->creator && c->seg && !atomic_load_explicit(&c->seg->peer_mapped, memory_order_acquire)) {
    if (atomic_load_explicit(&c->rx->aborted, memory_order_acquire)) return shm_peer_gone(c);
    if (c->peer_ended) return shm_peer_ended(c, "it to map the shared memory");
    return WEFT_AGAIN;
  }
  if (c->tx_copy_pending) {
    c->tx_tail_seen = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
    if ((int32_t)(c->tx_tail_seen - c->tx_copy_until) >= 0) {
      c->tx_copy_pending = false;
      return WEFT_OK;
    }
    if (atomic_load_explicit(&c->rx->aborted, memory_order_acquire)) return shm_peer_gone(c);
    if (c->peer_ended) return shm_peer_ended(c, "it to copy what this rank sent");
    c->ctx->want_conn = c;
    c->ctx->want = SHM_WANT_IDLE;
    return WEFT_AGAIN;
  }
  return WEFT_OK;
}

/* ---- receiving ----------------------------------------------------------------- */

/* The oldest chunk's cell once it has arrived, its tag checked (peeked). */
static weft_status shm_arrived(shm_conn *c, uint32_t seq, size_t bytes, shm_cell **out) {
  WEFT_STATUS_PASS(shm_conn_usable(c));
  if (!c->rx_cma_decided) shm_cma_decide(c);
  shm_cell *cell = &c->rx->cell[c->rx_tail % SHM_CELLS];
  if (!c->peeked) {
    if (atomic_load_explicit(&cell->ready, memory_order_acquire) != c->rx_tail + 1) {
      /* A chunk that reaches into the cell's second line: ask for that line
       * on every poll, so once the sender has written it, it travels while
       * the first line is fetched rather than after it. */
      if (bytes > SHM_INLINE_FIRST && bytes <= SHM_INLINE_BYTES)
        __builtin_prefetch(cell->data + SHM_INLINE_FIRST);
      if (atomic_load_explicit(&c->rx->aborted, memory_order_relaxed)) return shm_peer_gone(c);
      if (c->peer_ended) return shm_peer_ended(c, "data");
      c->ctx->want_conn = c;
      c->ctx->want = SHM_WANT_RECV;
      return WEFT_AGAIN;
    }
    weft_error_sink *sink = c->ctx->args->errors;
    if (weft_chunk_check(sink, c->peer, cell->seq, seq, cell->len, bytes))
      return shm_conn_fail(c, WEFT_ERR_MISMATCH, "%s", sink->msg);
    /* a descriptor only ever stands for a chunk that would not fit inline */
    if (cell->how != SHM_CELL_DATA && (cell->how != SHM_CELL_CMA || bytes <= SHM_INLINE_BYTES))
      return shm_conn_fail(c, WEFT_ERR_PROTOCOL,
                           "peer %d posted a chunk of %zu bytes marked %u, which this build "
                           "cannot read",
                           c->peer, bytes, cell->how);
    c->peeked = true;
    c->rx_read = false;
  }
  *out = cell;
  return WEFT_OK;
}

static weft_status shm_peek(shm_conn *c, uint32_t seq, size_t bytes, const void **data) {
  shm_cell *cell = NULL; /* set by shm_arrived on OK (gcc -O3 cannot tell) */
  WEFT_STATUS_PASS(shm_arrived(c, seq, bytes, &cell));
  if (bytes <= SHM_INLINE_BYTES) {
    *data = cell->data;
    return WEFT_OK;
  }
  /* a receiver that peeks a chunk sent for copy reads it into a buffer of
   * its own: the chunk holds no slot (the sender may be filling them all) */
  if (cell->how == SHM_CELL_CMA) {
    if (!c->rx_peeked && !(c->rx_peeked = malloc(c->ctx->args->chunk_bytes)))
      return shm_conn_fail(c, WEFT_ERR_NOMEM,
                           "no memory to read peer %d's chunk of %zu bytes for a peek", c->peer,
                           bytes);
    if (!c->rx_read) WEFT_STATUS_PASS(shm_cma_read(c, cell, c->rx_peeked, bytes));
    c->rx_read = true;
    *data = c->rx_peeked;
    return WEFT_OK;
  }
  /* the length was checked: the chunk is in the next slot in order */
  *data = c->rx_slots +
          (size_t)(c->rx_slots_released % (uint32_t)c->ctx->nslots) * c->ctx->args->chunk_bytes;
  return WEFT_OK;
}

weft_status shm_recv_peek(weft_tp_conn *conn, uint32_t seq, size_t bytes, const void **data) {
  return shm_peek(shm_conn_of(conn), seq, bytes, data);
}

/* Gives back the peeked chunk's cell and the `n` - 1 behind it that a run
 * read with it (shm_recv: descriptors, which hold no slot). */
static weft_status shm_release_cells(shm_conn *c, uint32_t n) {
  if (!c->peeked) return c->state == SHM_CONN_DEAD ? c->dead_status : WEFT_ERR_INTERNAL;
  c->peeked = false;
  const shm_cell *cell = &c->rx->cell[c->rx_tail % SHM_CELLS];
  if (cell->len > SHM_INLINE_BYTES) {
    shm_note_large_rx(c, cell->seq); /* a rank whose core copies what comes in (shm_recent) */
    if (cell->how == SHM_CELL_DATA) c->rx_slots_released++;
  }
  c->rx_tail += n;
  atomic_store(&c->rx->tail, c->rx_tail);
  if (atomic_load(&c->rx->send_sleeping)) shm_futex_wake(&c->rx->tail);
  return WEFT_OK;
}

static weft_status shm_release(shm_conn *c) {
  return shm_release_cells(c, 1);
}

weft_status shm_recv_release(weft_tp_conn *conn) {
  return shm_release(shm_conn_of(conn));
}

static weft_status shm_recv_into(weft_tp_conn *conn, uint32_t seq, size_t bytes, void *dst,
                                 const struct weft_mem_ops *mem) {
  shm_conn *c = shm_conn_of(conn);
  shm_cell *cell = NULL;
  WEFT_STATUS_PASS(shm_arrived(c, seq, bytes, &cell));
  bool host = mem->kind == WEFT_MEMORY_HOST || mem->kind == WEFT_MEMORY_SHARED;
  if (cell->how == SHM_CELL_CMA && !c->rx_read && host) {
    WEFT_STATUS_PASS(shm_cma_read(c, cell, dst, bytes)); /* the single copy */
  } else {
    const void *slot = NULL;
    WEFT_STATUS_PASS(shm_peek(c, seq, bytes, &slot));
    mem->copy(dst, slot, bytes);
  }
  return shm_release(c);
}

/* A run read at once: the oldest chunk (peeked, a descriptor) and those
 * behind it that have arrived as descriptors of the run, tagged and as long
 * as the run says. Anything else ends the run there, and the next call
 * takes it alone (reporting a wrong tag or length). The
 * cells are given back together: the sender's chunks are complete only
 * once all of them are read, which is when it would have learnt it anyway
 * for the last. */
weft_status shm_recv(weft_tp_conn *conn, uint32_t seq, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks) {
  shm_conn *c = shm_conn_of(conn);
  size_t first = bytes < chunk_bytes ? bytes : chunk_bytes;
  shm_cell *cell = NULL;
  *chunks = 0;
  if (first == bytes) { /* one chunk */
    WEFT_STATUS_PASS(shm_recv_into(conn, seq, bytes, dst, mem));
    *chunks = 1;
    return WEFT_OK;
  }
  WEFT_STATUS_PASS(shm_arrived(c, seq, first, &cell));
  bool host = mem->kind == WEFT_MEMORY_HOST || mem->kind == WEFT_MEMORY_SHARED;
  if (cell->how != SHM_CELL_CMA || c->rx_read || !host || first == bytes) {
    WEFT_STATUS_PASS(shm_recv_into(conn, seq, first, dst, mem));
    *chunks = 1;
    return WEFT_OK;
  }
  struct iovec remote[SHM_CELLS];
  size_t n = 0, at = 0;
  remote[n++] = shm_cma_where(cell, first);
  at += first;
  while (at < bytes && n < SHM_CELLS) {
    size_t len = bytes - at < chunk_bytes ? bytes - at : chunk_bytes;
    const shm_cell *next = &c->rx->cell[(c->rx_tail + n) % SHM_CELLS];
    if (atomic_load_explicit(&next->ready, memory_order_acquire) != c->rx_tail + (uint32_t)n + 1 ||
        next->how != SHM_CELL_CMA || next->seq != seq || next->len != len ||
        len <= SHM_INLINE_BYTES)
      break;
    remote[n++] = shm_cma_where(next, len);
    at += len;
  }
  WEFT_STATUS_PASS(shm_cma_readv(c, remote, n, dst, at));
  WEFT_STATUS_PASS(shm_release_cells(c, (uint32_t)n));
  *chunks = n;
  return WEFT_OK;
}

/* ---- the peer's shared buffers ---------------------------------------------- */

/* Opens the peer's memfd through /proc: this needs the right to read the
 * peer's descriptors (same user, dumpable), not ptrace attach, so it works
 * where Yama restricts process_vm_readv. The inode check catches a
 * descriptor number the peer has since reused for something else. */
static weft_status shm_map_open(shm_conn *c, const weft_shared_key *key, shm_peer_map *out) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%u/fd/%d", c->peer_pid, key->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    weft_error_sink_set(c->ctx->args->errors, "cannot open peer %d's shared buffer (%s): %s",
                        c->peer, path, strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  struct stat st;
  if (fstat(fd, &st) || (uint64_t)st.st_ino != key->ino || st.st_size <= 0) {
    close(fd);
    weft_error_sink_set(c->ctx->args->errors,
                        "peer %d's shared buffer %s is not the memory it described (inode %llu)",
                        c->peer, path, (unsigned long long)key->ino);
    return WEFT_ERR_PROTOCOL;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    weft_error_sink_set(c->ctx->args->errors, "mmap of peer %d's shared buffer: %s", c->peer,
                        strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  *out = (shm_peer_map){.ino = key->ino, .bytes = (size_t)st.st_size, .base = p};
  WEFT_INFO(WEFT_SUBSYS_NET, "shm: rank %d mapped %zu bytes that peer %d shares",
            c->ctx->args->rank, out->bytes, c->peer);
  return WEFT_OK;
}

/* Only weft_mem_alloc memory can be described to a peer: nothing is pinned
 * or held, so the handle needs no release. */
weft_status shm_register_mem(weft_tp_ctx *ctx, const weft_mem_region *region, weft_tp_mem *handle,
                             weft_mem_desc *desc) {
  shm_ctx *sc = shm_ctx_of(ctx);
  handle->region = *region;
  handle->priv[0] = handle->priv[1] = 0;
  if (region->kind != WEFT_MEMORY_SHARED) {
    handle->region.kind = WEFT_MEMORY_COUNT;
    return WEFT_ERR_UNSUPPORTED;
  }
  weft_mem_desc scratch;
  if (!weft_shared_mem_describe(region->ptr, region->bytes, desc ? desc : &scratch)) {
    handle->region.kind = WEFT_MEMORY_COUNT;
    weft_error_sink_set(sc->args->errors,
                        "shm: %zu bytes at %p are not inside one weft_mem_alloc allocation",
                        region->bytes, region->ptr);
    return WEFT_ERR_INVALID;
  }
  return WEFT_OK;
}

void shm_deregister_mem(weft_tp_ctx *ctx, weft_tp_mem *handle) {
  (void)ctx;
  handle->region.kind = WEFT_MEMORY_COUNT;
}

weft_status shm_map_peer_mem(weft_tp_conn *conn, const weft_mem_desc *desc, void **local) {
  shm_conn *c = shm_conn_of(conn);
  *local = NULL;
  if (c->state == SHM_CONN_DEAD) return c->dead_status;
  if (desc->version == WEFT_MEM_DESC_VERSION && desc->kind != WEFT_MEMORY_SHARED) {
    weft_error_sink_set(c->ctx->args->errors,
                        "peer %d described memory of kind %u, which shm cannot map", c->peer,
                        desc->kind);
    return WEFT_ERR_UNSUPPORTED;
  }
  weft_shared_key k;
  const weft_shared_key *key = &k;
  if (weft_shared_mem_key(desc, &k)) {
    weft_error_sink_set(c->ctx->args->errors,
                        "peer %d sent a malformed memory descriptor (version %u, kind %u)",
                        c->peer, desc->version, desc->kind);
    return WEFT_ERR_PROTOCOL;
  }
  if (key->pid != c->peer_pid) {
    weft_error_sink_set(c->ctx->args->errors,
                        "peer %d described a buffer of process %u, but it is process %u", c->peer,
                        key->pid, c->peer_pid);
    return WEFT_ERR_PROTOCOL;
  }
  shm_peer_map *m = NULL;
  for (int i = 0; i < c->nmaps && !m; i++)
    if (c->maps[i].ino == key->ino) m = &c->maps[i];
  if (!m) {
    shm_peer_map fresh;
    WEFT_STATUS_PASS(shm_map_open(c, key, &fresh));
    if (c->nmaps == SHM_PEER_MAPS) { /* full: the least recently used goes */
      m = &c->maps[0];
      for (int i = 1; i < c->nmaps; i++)
        if (c->maps[i].used < m->used) m = &c->maps[i];
      munmap(m->base, m->bytes);
    } else {
      m = &c->maps[c->nmaps++];
    }
    *m = fresh;
  }
  m->used = ++c->map_uses;
  /* bounds from what is mapped here, never from the peer's word alone */
  if (key->offset > m->bytes || desc->len > m->bytes - key->offset) {
    weft_error_sink_set(c->ctx->args->errors,
                        "peer %d described bytes %llu..%llu of a %zu-byte shared buffer", c->peer,
                        (unsigned long long)key->offset,
                        (unsigned long long)(key->offset + desc->len), m->bytes);
    return WEFT_ERR_PROTOCOL;
  }
  *local = (char *)m->base + key->offset;
  return WEFT_OK;
}
