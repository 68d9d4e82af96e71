/* shm_conn.c - one shared-memory connection: the pair segment (created by the
 * lower rank, unlinked by the higher as soon as it has mapped it, and by
 * whichever side gives up on the pair before that, so a crash leaves no name
 * behind), the FIFO data path with its slots and descriptors, futex sleeping,
 * and noticing a dead peer through its pidfd. Whether a chunk goes by single
 * copy (process_vm_readv), and the read itself, are shm_cma.c's. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
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
  shm_cma_offer(c); /* single copy: shm_fifo says how the pair agrees */
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
  /* the context's timing, which the offer publishes: here in connect, so that
   * no data call (an opener maps its FIFOs in one) pays for it */
  if (ctx->cma_mode == WEFT_SHM_CMA_AUTO) shm_cma_cost_ratio(&ctx->cma_timing);
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
  /* a segment its creator is still sizing: wait for it, 100 ms at most */
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

static void shm_map_close(shm_peer_map *m);

void shm_conn_destroy(shm_conn *c) {
  if (c->cma_chunks)
    WEFT_INFO(WEFT_SUBSYS_NET,
              "shm: rank %d took %llu chunks (%.1f MiB) from peer %d by single copy "
              "(%llu process_vm_readv)",
              c->ctx->args->rank, (unsigned long long)c->cma_chunks,
              (double)c->cma_bytes / (1 << 20), c->peer, (unsigned long long)c->cma_reads);
  for (int i = 0; i < c->nmaps; i++) shm_map_close(&c->maps[i]);
  if (c->seg) munmap(c->seg, c->seg_bytes);
  shm_conn_unlink(c); /* the peer never mapped it, or this rank never did */
  if (c->pidfd >= 0) close(c->pidfd);
  free(c->rx_peeked);
  free(c);
}

/* ---- liveness (the peer's end itself: shm_peer.c) -------------------------------- */



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
   * would fetch its line back each time (docs/tuning.md, "The ring's cache
   * lines"). The last value seen stays true (tail only grows): read again
   * only when it shows no room. */
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

/* ---- sending ------------------------------------------------------------------- */

static weft_status shm_post(shm_conn *c, const void *src, size_t bytes, weft_tag tag,
                            const struct weft_mem_ops *mem, bool for_copy) {
  weft_status st = shm_ready(c);
  if (st) return st == WEFT_AGAIN ? WEFT_ERR_INTERNAL : st;
  if (bytes > c->ctx->args->chunk_bytes) return WEFT_ERR_INVALID;
  enum shm_send_way way = for_copy ? shm_cma_send_way(c, bytes, weft_tag_seq(tag), mem) : SHM_SEND_COPY;
  bool by_address = way == SHM_SEND_BY_ADDRESS, timed = way == SHM_SEND_COPY_TIMED;
  if (bytes > SHM_INLINE_BYTES) shm_note_large_tx(c, weft_tag_seq(tag));
  shm_cell *cell = &c->tx->cell[c->tx_head % SHM_CELLS];
  uint32_t number = c->tx_head++;
  /* head is only the futex word (the receiver polls the cell). It moves
   * first: the seq_cst store waits for the store buffer to drain, and here
   * that buffer holds no store to a line the peer is reading; after the cell
   * store it would wait for the peer to give up the cell's line
   * (docs/tuning.md, "The ring's cache lines").
   * seq_cst store then load: either the receiver sees the new head before it
   * sleeps, or we see that it sleeps and wake it (no lost wake-up); a
   * receiver that sees head ahead of a cell not yet ready polls again. */
  atomic_store(&c->tx->head, c->tx_head);
  enum shm_cell_how how = SHM_CELL_DATA;
  if (by_address) {
    uint64_t addr = (uint64_t)(uintptr_t)src;
    memcpy(cell->data, &addr, sizeof addr);
    how = SHM_CELL_CMA;
    c->tx_copy_pending = true;
    c->tx_copy_until = c->tx_head; /* complete once the peer released this cell */
  } else {
    double t0 = timed ? weft_now() : 0;
    void *to = cell->data;
    uint32_t slot = 0;
    if (bytes > SHM_INLINE_BYTES) { /* shm_room kept one free */
      slot = c->tx_slots_taken++ % (uint32_t)c->ctx->nslots;
      to = c->tx_slots + (size_t)slot * c->ctx->args->chunk_bytes;
    }
    mem->copy(to, src, bytes);
    if (timed) shm_mix_fold(c, slot, bytes, weft_now() - t0);
  }
  cell->seq = weft_tag_seq(tag);
  cell->sig = weft_tag_sig(tag);
  shm_cell_set(cell, bytes, how);
  c->tx_slots_after[number % SHM_CELLS] = c->tx_slots_taken;
  atomic_store_explicit(&cell->ready, number + 1, memory_order_release);
  if (atomic_load(&c->tx->recv_sleeping)) shm_futex_wake(&c->tx->head);
  return WEFT_OK;
}

/* Stores move at once, so WEFT_SEND_NOW asks nothing more; a chunk taken
 * by copy may go by address (shm_post). */
weft_status shm_send(weft_tp_conn *conn, const void *src, size_t bytes, weft_tag tag,
                     const struct weft_mem_ops *mem, unsigned flags) {
  return shm_post(shm_conn_of(conn), src, bytes, tag, mem, (flags & WEFT_SEND_FOR_COPY) != 0);
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

/* Every cell posted here released by the peer: its released count (tail)
 * caught up with what was posted (head). */
weft_status shm_send_released(weft_tp_conn *conn) {
  shm_conn *c = shm_conn_of(conn);
  if (c->state == SHM_CONN_DEAD) return c->dead_status;
  c->tx_tail_seen = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
  if ((int32_t)(c->tx_tail_seen - c->tx_head) >= 0) return WEFT_OK;
  if (atomic_load_explicit(&c->rx->aborted, memory_order_acquire)) return shm_peer_gone(c);
  if (c->peer_ended) return shm_peer_ended(c, "it to take what this rank lent");
  c->ctx->want_conn = c;
  c->ctx->want = SHM_WANT_IDLE;
  return WEFT_AGAIN;
}

/* ---- receiving ----------------------------------------------------------------- */

/* The oldest chunk's cell once it has arrived, its tag checked (peeked). */
static weft_status shm_arrived(shm_conn *c, weft_tag tag, size_t bytes, shm_cell **out) {
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
    if (weft_chunk_check(sink, c->peer, weft_tag_make(cell->seq, cell->sig), tag, shm_cell_len(cell), bytes))
      return shm_conn_fail(c, WEFT_ERR_MISMATCH, "%s", sink->msg);
    /* a descriptor only ever stands for a chunk that would not fit inline */
    if (shm_cell_how(cell) != SHM_CELL_DATA && (shm_cell_how(cell) != SHM_CELL_CMA || bytes <= SHM_INLINE_BYTES))
      return shm_conn_fail(c, WEFT_ERR_PROTOCOL,
                           "peer %d posted a chunk of %zu bytes marked %u, which this build "
                           "cannot read",
                           c->peer, bytes, shm_cell_how(cell));
    c->peeked = true;
    c->rx_read = false;
  }
  *out = cell;
  return WEFT_OK;
}

static weft_status shm_peek(shm_conn *c, weft_tag tag, size_t bytes, const void **data) {
  shm_cell *cell = NULL; /* set by shm_arrived on OK (gcc -O3 cannot tell) */
  WEFT_STATUS_PASS(shm_arrived(c, tag, bytes, &cell));
  if (bytes <= SHM_INLINE_BYTES) {
    *data = cell->data;
    return WEFT_OK;
  }
  /* a receiver that peeks a chunk sent for copy reads it into a buffer of
   * its own: the chunk holds no slot (the sender may be filling them all) */
  if (shm_cell_how(cell) == SHM_CELL_CMA) {
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

weft_status shm_recv_peek(weft_tp_conn *conn, weft_tag tag, size_t bytes, const void **data) {
  return shm_peek(shm_conn_of(conn), tag, bytes, data);
}

/* Gives back the peeked chunk's cell and the `n` - 1 behind it that a run
 * read with it (shm_recv: descriptors, which hold no slot). */
static weft_status shm_release_cells(shm_conn *c, uint32_t n) {
  if (!c->peeked) return c->state == SHM_CONN_DEAD ? c->dead_status : WEFT_ERR_INTERNAL;
  c->peeked = false;
  const shm_cell *cell = &c->rx->cell[c->rx_tail % SHM_CELLS];
  if (shm_cell_len(cell) > SHM_INLINE_BYTES) {
    shm_note_large_rx(c, cell->seq); /* a rank whose core copies what comes in (shm_recent) */
    if (shm_cell_how(cell) == SHM_CELL_DATA) c->rx_slots_released++;
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

static weft_status shm_recv_into(weft_tp_conn *conn, weft_tag tag, size_t bytes, void *dst,
                                 const struct weft_mem_ops *mem) {
  shm_conn *c = shm_conn_of(conn);
  shm_cell *cell = NULL;
  WEFT_STATUS_PASS(shm_arrived(c, tag, bytes, &cell));
  bool host = mem->kind == WEFT_MEMORY_HOST || mem->kind == WEFT_MEMORY_SHARED;
  if (shm_cell_how(cell) == SHM_CELL_CMA && !c->rx_read && host) {
    WEFT_STATUS_PASS(shm_cma_read(c, cell, dst, bytes)); /* the single copy */
  } else {
    const void *slot = NULL;
    WEFT_STATUS_PASS(shm_peek(c, tag, bytes, &slot));
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
weft_status shm_recv(weft_tp_conn *conn, weft_tag tag, size_t chunk_bytes, size_t bytes, void *dst,
                     const struct weft_mem_ops *mem, size_t *chunks) {
  shm_conn *c = shm_conn_of(conn);
  size_t first = bytes < chunk_bytes ? bytes : chunk_bytes;
  shm_cell *cell = NULL;
  *chunks = 0;
  if (first == bytes) { /* one chunk */
    WEFT_STATUS_PASS(shm_recv_into(conn, tag, bytes, dst, mem));
    *chunks = 1;
    return WEFT_OK;
  }
  WEFT_STATUS_PASS(shm_arrived(c, tag, first, &cell));
  bool host = mem->kind == WEFT_MEMORY_HOST || mem->kind == WEFT_MEMORY_SHARED;
  if (shm_cell_how(cell) != SHM_CELL_CMA || c->rx_read || !host || first == bytes) {
    WEFT_STATUS_PASS(shm_recv_into(conn, tag, first, dst, mem));
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
        shm_cell_how(next) != SHM_CELL_CMA || weft_tag_make(next->seq, next->sig) != tag || shm_cell_len(next) != len ||
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
/* Gives back one mapping of the connection's cache. */
static void shm_map_close(shm_peer_map *m) {
  if (m->kind == WEFT_MEMORY_DEVICE) {
    const weft_mem_ops *dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
    if (dev) dev->unmap_peer(m->base);
  } else {
    munmap(m->base, m->bytes);
  }
  m->base = NULL;
}

/* A free entry of the cache: the least recently used goes when it is full. */
static shm_peer_map *shm_map_slot(shm_conn *c) {
  if (c->nmaps < SHM_PEER_MAPS) return &c->maps[c->nmaps++];
  shm_peer_map *m = &c->maps[0];
  for (int i = 1; i < c->nmaps; i++)
    if (c->maps[i].used < m->used) m = &c->maps[i];
  if (m->kind == WEFT_MEMORY_DEVICE && m->lent) c->nlent--;
  shm_map_close(m);
  return m;
}

/* A peer's device buffer (CUDA IPC), mapped by the memory table. A buffer
 * the peer registered (WEFT_MEM_DESC_KEEP) stays mapped here until the
 * connection ends or the peer deregisters it: a training loop's buffers are
 * mapped in the first step and looked up after. Any other is lent for the
 * call: closed by release_peer_mem before this rank tells the peer its
 * call is done, since the peer may free it then. */
static weft_status shm_map_device(shm_conn *c, const weft_mem_desc *desc, void **local) {
  shm_peer_map *m = NULL;
  for (int i = 0; i < c->nmaps && !m; i++)
    if (c->maps[i].kind == WEFT_MEMORY_DEVICE && c->maps[i].len == desc->len &&
        !memcmp(c->maps[i].body, desc->body, sizeof desc->body))
      m = &c->maps[i];
  if (!m) {
    const weft_mem_ops *dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
    if (!dev) {
      weft_error_sink_set(c->ctx->args->errors,
                          "peer %d described device memory, but this build or host has no "
                          "usable CUDA driver",
                          c->peer);
      return WEFT_ERR_UNSUPPORTED;
    }
    void *base, *at;
    WEFT_STATUS_PASS(dev->map_peer(desc, &base, &at, c->ctx->args->errors));
    m = shm_map_slot(c);
    *m = (shm_peer_map){.kind = WEFT_MEMORY_DEVICE, .base = base, .local = at, .len = desc->len,
                        .lent = !(desc->flags & WEFT_MEM_DESC_KEEP)};
    c->nlent += m->lent;
    memcpy(m->body, desc->body, sizeof m->body);
    WEFT_TRACE(WEFT_SUBSYS_NET, "shm: rank %d mapped %llu bytes of peer %d's device memory (CUDA IPC)",
              c->ctx->args->rank, (unsigned long long)desc->len, c->peer);
  }
  m->used = ++c->map_uses;
  *local = m->local;
  return WEFT_OK;
}

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
  *out = (shm_peer_map){
      .kind = WEFT_MEMORY_SHARED, .ino = key->ino, .bytes = (size_t)st.st_size, .base = p};
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

void shm_release_peer_mem(weft_tp_conn *conn, bool kept_too) {
  shm_conn *c = shm_conn_of(conn);
  /* every call over IPC asks, twice on success (its done round, its end):
   * nothing to look through where nothing is lent */
  if (!kept_too && !c->nlent) return;
  for (int i = 0; i < c->nmaps;) {
    shm_peer_map *m = &c->maps[i];
    if (m->kind != WEFT_MEMORY_DEVICE || !(m->lent || kept_too)) {
      i++;
      continue;
    }
    c->nlent -= m->lent;
    shm_map_close(m);
    c->maps[i] = c->maps[--c->nmaps]; /* the last entry fills the hole */
  }
}

weft_status shm_map_peer_mem(weft_tp_conn *conn, const weft_mem_desc *desc, void **local) {
  shm_conn *c = shm_conn_of(conn);
  *local = NULL;
  if (c->state == SHM_CONN_DEAD) return c->dead_status;
  if (desc->version == WEFT_MEM_DESC_VERSION && desc->kind == WEFT_MEMORY_DEVICE)
    return shm_map_device(c, desc, local);
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
    if (c->maps[i].kind == WEFT_MEMORY_SHARED && c->maps[i].ino == key->ino) m = &c->maps[i];
  if (!m) {
    shm_peer_map fresh;
    WEFT_STATUS_PASS(shm_map_open(c, key, &fresh));
    m = shm_map_slot(c);
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
