/* hier_allreduce.c - allreduce for ranks spread over several hosts, in one
 * of two forms. Both run ordinary algorithms (ring, recursive doubling,
 * trees) as phases on groups' links, and both sum within a host and divide
 * for avg once, by the whole communicator's size, in the network phase. A
 * wire dtype (algo.h) is the network phases' only: within a host the data
 * moves in f32.
 *
 * The split form, when every host holds the same number L > 1 of ranks and
 * the buffer is at least L chunks: every rank of a host crosses the network
 * with its share, so all of them, their streams and their cores, carry the
 * traffic at once (one leader per host left the others idle and its one
 * connection the only one on the network). The buffer is cut into segments
 * (up to HIER_SEGMENTS); each goes through
 *   RS(s)  a ring reduce-scatter within the host: member i holds the host's
 *          sum of part i of segment s
 *   AR(s)  an allreduce of part i among the ranks of index i on every host
 *          (hosts.index_peers), in place
 *   AG(s)  a ring allgather within the host
 * and the phases of different segments overlap: two chains run at once, each
 * one phase at a time, the host chain RS0 RS1 AG0 RS2 AG1 .. AG(S-1) on the
 * host's links and the network chain AR0 AR1 .. on the index group's. The
 * two chains share no link, and each walks its fixed order on every rank, so
 * both ends of a link see the same order of chunks under the call's one
 * sequence tag. AR(s) waits for RS(s), AG(s) for AR(s); the host chain
 * running one segment ahead is what hides its phases behind the network's.
 * The last count % L elements (fewer than L) follow in the leader form.
 *
 * The leader form, otherwise (hosts of unequal sizes, small buffers): reduce
 * within each host to its leader (its lowest rank) over the fast local
 * transport, allreduce among the leaders across hosts, broadcast within each
 * host. Only one rank per host sends across hosts, so the network carries
 * 2(h-1)/h of the buffer per host instead of per rank. */
#include <stdlib.h>
#include <string.h>

#include "src/algo/algo.h"

/* Enough to hide the host phases behind the network's (each is one segment
 * long at the pipeline's ends) without a segment so short that its ring
 * steps' latency shows. */
#define HIER_SEGMENTS 8

/* One chain of phases: an ordinary weft_coll on its group's links. */
typedef struct hier_chain {
  weft_coll inner;       /* the phase in progress, while `running` */
  weft_group_links group; /* the phase's links: its group's members on the call's links */
  bool running;
  size_t next; /* the leader form: its phase; host chain: its step; network chain: its segment */
} hier_chain;

/* What either form keeps besides algo_state: host memory, whatever the
 * call's buffers are (it is control state, read by this rank only). */
typedef struct hier_ctl {
  hier_chain host, net; /* the leader form uses `host` for all three phases */
  /* the split form */
  size_t seg_elems; /* a multiple of L */
  size_t segs;
  size_t body;             /* elements the segments cover: count rounded down to L */
  size_t rs_done, ar_done; /* phases finished, in segment order */
  int wire_sent_to;        /* the network chain's wire stage, from one phase to the next */
  weft_coll tail;          /* the last count - body elements, in the leader form */
  bool tail_started;       /* `tail` is set up (its own ctl to free) */
  void *spent[2 * HIER_SEGMENTS + 3]; /* finished phases' scratch: their last sends may read it */
  int nspent;
} hier_ctl;

typedef struct hier_state {
  hier_ctl *ctl;
} hier_state;
_Static_assert(sizeof(hier_state) <= WEFT_ALGO_STATE_BYTES, "hier_state fits weft_coll.algo_state");

/* The phases' scratch is freed by the cleanup hook whether the call
 * completes or fails: only then, after the call's flush, are the sends
 * that read it complete. (A phase ends when its last send is posted, and a
 * transport may read the source until the send completes: TCP writes from
 * it later when the socket is full. Freed at the next phase's start, a tree
 * reduce's partial sum went out as garbage; test_algo_fake found it.) */
static void ctl_free(weft_coll *coll, hier_ctl *ctl) {
  for (int i = 0; i < ctl->nspent; i++) weft_coll_scratch_free(coll, ctl->spent[i]);
  hier_chain *chains[2] = {&ctl->host, &ctl->net};
  for (int c = 0; c < 2; c++) weft_coll_scratch_free(coll, chains[c]->inner.scratch);
  if (ctl->tail_started) {
    hier_ctl *tail = WEFT_ALGO_STATE(&ctl->tail, hier_state)->ctl;
    if (tail) ctl_free(&ctl->tail, tail);
  }
  free(ctl);
}

static void hier_cleanup(weft_coll *coll) {
  hier_state *hs = WEFT_ALGO_STATE(coll, hier_state);
  if (hs->ctl) ctl_free(coll, hs->ctl);
  hs->ctl = NULL;
}

/* Sets the chain's phase up as an `size`-member run of `coll` on the ranks
 * `group` (this rank is `rank`), `count` elements from `src` into `dst`. */
static weft_coll *phase_init(weft_coll *coll, hier_chain *ch, const int *group, int rank, int size,
                             const void *src, void *dst, size_t count, int avg_div,
                             bool across_hosts) {
  weft_coll *inner = weft_coll_phase(&ch->inner, coll, &ch->group, group, rank, size, src, dst,
                                     count, avg_div);
  if (across_hosts) { /* the call's stage: it lives until the call's flush */
    inner->wire = coll->wire;
    inner->wire_stage = coll->wire_stage;
  }
  ch->running = true;
  return inner;
}

/* Advances the chain's phase: OK once it is done (its scratch kept for
 * the cleanup), AGAIN while it waits, or its error. */
static weft_status chain_step(hier_ctl *ctl, hier_chain *ch) {
  weft_status st = ch->inner.advance(&ch->inner);
  if (st != WEFT_OK) return st;
  if (ch->inner.scratch) {
    /* at most a reduce-scatter and an allreduce per segment, or 3 phases */
    if (ctl->nspent == (int)(sizeof ctl->spent / sizeof *ctl->spent)) return WEFT_ERR_INTERNAL;
    ctl->spent[ctl->nspent++] = ch->inner.scratch;
  }
  ch->inner.scratch = NULL;
  ch->running = false;
  return WEFT_OK;
}

/* Recursive doubling for a buffer of one chunk up to the rd hint, else the ring. */
static weft_status net_allreduce_start(weft_coll *inner, const weft_coll *coll) {
  size_t bytes = inner->count * inner->elem;
  bool rd = bytes <= coll->chunk_bytes && bytes <= coll->hint.rd_max_bytes;
  return rd ? weft_rd_allreduce_start(inner) : weft_ring_allreduce_start(inner);
}

/* ---- the leader form ---------------------------------------------------- */

static weft_status leader_advance(weft_coll *coll) {
  hier_ctl *ctl = WEFT_ALGO_STATE(coll, hier_state)->ctl;
  hier_chain *ch = &ctl->host;
  const weft_hosts *h = &coll->hosts;
  size_t bytes = coll->count * coll->elem;
  int fanout = bytes >= coll->hint.bcast_chain_bytes ? 1 : 2;
  for (;;) {
    if (ch->running) {
      WEFT_STEP(chain_step(ctl, ch));
      ch->next++;
    }
    switch (ch->next) {
      case 0: /* reduce to the leader */
        if (h->local_size > 1) {
          weft_coll *in = phase_init(coll, ch, h->host_members, h->host_index, h->local_size,
                                     coll->sendbuf, coll->recvbuf, coll->count, 1, false);
          WEFT_CHECK(weft_tree_reduce_start(in, fanout));
          continue;
        }
        /* alone on its host: the leaders' allreduce reads sendbuf itself */
        if (h->nhosts == 1 && coll->recvbuf != coll->sendbuf)
          coll->mem->copy(coll->recvbuf, coll->sendbuf, bytes);
        ch->next++;
        continue;
      case 1: /* allreduce among the leaders, into recvbuf; avg divides by the call's */
        if (h->host_index == 0 && h->nhosts > 1) {
          const void *from = h->local_size > 1 ? coll->recvbuf : coll->sendbuf;
          weft_coll *in = phase_init(coll, ch, h->leaders, h->leader_index, h->nhosts, from,
                                     coll->recvbuf, coll->count, coll->avg_div, true);
          WEFT_CHECK(net_allreduce_start(in, coll));
          continue;
        }
        if (h->host_index == 0) /* one host: the leader divides for avg */
          coll->mem->finish(coll->recvbuf, coll->recvbuf, coll->count, coll->dtype, coll->op,
                            coll->avg_div);
        ch->next++;
        continue;
      case 2: /* broadcast from the leader */
        if (h->local_size > 1) {
          weft_coll *in = phase_init(coll, ch, h->host_members, h->host_index, h->local_size,
                                     coll->recvbuf, coll->recvbuf, coll->count, 1, false);
          WEFT_CHECK(weft_tree_broadcast_start(in, fanout));
          continue;
        }
        ch->next++;
        continue;
      default: return WEFT_OK;
    }
  }
}

/* ---- the split form ----------------------------------------------------- */

/* Segment s: its first element and its length (a multiple of L). */
static void segment(const hier_ctl *ctl, size_t s, size_t *off, size_t *cnt) {
  *off = s * ctl->seg_elems;
  *cnt = ctl->body - *off < ctl->seg_elems ? ctl->body - *off : ctl->seg_elems;
}

/* The host chain's step k: RS0, then RS(s+1) and AG(s) in turn. *seg past
 * the last segment: a step to skip. */
static bool host_step_is_rs(size_t k, size_t *seg) {
  if (k == 0 || k % 2) {
    *seg = (k + 1) / 2;
    return true;
  }
  *seg = k / 2 - 1;
  return false;
}

/* Starts the host chain's next step if its segment is there and ready.
 * OK: started or nothing to start now. */
static weft_status host_next(weft_coll *coll, hier_ctl *ctl, bool *started) {
  const weft_hosts *h = &coll->hosts;
  hier_chain *ch = &ctl->host;
  int L = h->local_size;
  *started = false;
  while (ch->next <= 2 * ctl->segs) {
    size_t s, off, cnt;
    bool rs = host_step_is_rs(ch->next, &s);
    if (s >= ctl->segs) { /* RS(S): none */
      ch->next++;
      continue;
    }
    if (!rs && ctl->ar_done <= s) return WEFT_OK; /* AG(s) waits for AR(s) */
    segment(ctl, s, &off, &cnt);
    size_t part = cnt / (size_t)L;
    const char *src = (const char *)coll->sendbuf + off * coll->elem;
    char *dst = (char *)coll->recvbuf + off * coll->elem;
    char *mine = dst + (size_t)h->host_index * part * coll->elem;
    if (rs) {
      weft_coll *in =
          phase_init(coll, ch, h->host_members, h->host_index, L, src, mine, part, 1, false);
      WEFT_CHECK(weft_ring_reduce_scatter_start(in));
    } else {
      /* In place, RS(s) sent the other parts of this segment from the
       * buffer AG(s) now writes: those sends must be complete (on tcp,
       * written out) before it may. */
      if (coll->sendbuf == coll->recvbuf)
        for (int m = 0; m < L; m++)
          if (m != h->host_index) {
            weft_status st = coll->link.ops->send_idle(coll->link.ctx, h->host_members[m]);
            if (st != WEFT_OK) return st == WEFT_AGAIN ? WEFT_OK : st;
          }
      weft_coll *in =
          phase_init(coll, ch, h->host_members, h->host_index, L, mine, dst, part, 1, false);
      WEFT_CHECK(weft_ring_allgather_start(in));
    }
    ch->next++;
    *started = true;
    return WEFT_OK;
  }
  return WEFT_OK;
}

/* Starts the network chain's next AR once its RS is done. */
static weft_status net_next(weft_coll *coll, hier_ctl *ctl, bool *started) {
  const weft_hosts *h = &coll->hosts;
  hier_chain *ch = &ctl->net;
  *started = false;
  size_t s = ch->next;
  if (s >= ctl->segs || ctl->rs_done <= s) return WEFT_OK;
  size_t off, cnt;
  segment(ctl, s, &off, &cnt);
  size_t part = cnt / (size_t)h->local_size;
  char *mine = (char *)coll->recvbuf + (off + (size_t)h->host_index * part) * coll->elem;
  weft_coll *in = phase_init(coll, ch, h->index_peers, h->leader_index, h->nhosts, mine, mine, part,
                             coll->avg_div, true);
  in->wire_sent_to = ctl->wire_sent_to; /* the last phase's send may still read the stage */
  WEFT_CHECK(net_allreduce_start(in, coll));
  ch->next++;
  *started = true;
  return WEFT_OK;
}

/* The tail, after everything else: a call of its own shape (the whole
 * communicator, the last count - body elements) in the leader form. */
static weft_status tail_start(weft_coll *coll, hier_ctl *ctl) {
  size_t skip = ctl->body * coll->elem;
  weft_coll *t = &ctl->tail;
  *t = (weft_coll){.link = coll->link,
                   .call = coll->call,
                   .rank = coll->rank,
                   .size = coll->size,
                   .avg_div = coll->avg_div,
                   .sendbuf = (const char *)coll->sendbuf + skip,
                   .recvbuf = (char *)coll->recvbuf + skip,
                   .count = coll->count - ctl->body,
                   .dtype = coll->dtype,
                   .op = coll->op,
                   .elem = coll->elem,
                   .chunk_bytes = coll->chunk_bytes,
                   .mem = coll->mem,
                   .seq = coll->seq,
                       .sig = coll->sig,
                   .hint = coll->hint,
                   .hosts = coll->hosts,
                   .wire = coll->wire,
                   .wire_stage = coll->wire_stage,
                   .wire_sent_to = 0, /* its leaders' group numbers members otherwise */
                   .fail_peer = -1};
  hier_ctl *tc = calloc(1, sizeof *tc);
  if (!tc) return WEFT_ERR_NOMEM;
  WEFT_ALGO_STATE(t, hier_state)->ctl = tc;
  t->advance = leader_advance;
  ctl->tail_started = true;
  return WEFT_OK;
}

static weft_status split_advance(weft_coll *coll) {
  hier_ctl *ctl = WEFT_ALGO_STATE(coll, hier_state)->ctl;
  const weft_hosts *h = &coll->hosts;
  for (;;) {
    bool moved = false, started;
    if (ctl->host.running) {
      weft_status st = chain_step(ctl, &ctl->host);
      if (st < 0) return st;
      if (st == WEFT_OK) {
        moved = true;
        size_t s;
        if (host_step_is_rs(ctl->host.next - 1, &s)) ctl->rs_done = s + 1;
      }
    }
    if (ctl->net.running) {
      weft_status st = chain_step(ctl, &ctl->net);
      if (st < 0) return st;
      if (st == WEFT_OK) {
        moved = true;
        ctl->wire_sent_to = ctl->net.inner.wire_sent_to;
        ctl->ar_done = ctl->net.next;
      }
    }
    if (!ctl->host.running) {
      WEFT_CHECK(host_next(coll, ctl, &started));
      moved |= started;
    }
    if (!ctl->net.running) {
      WEFT_CHECK(net_next(coll, ctl, &started));
      moved |= started;
    }
    if (moved) continue;
    bool body_done = !ctl->host.running && !ctl->net.running && ctl->host.next > 2 * ctl->segs &&
                     ctl->ar_done == ctl->segs;
    if (!body_done) return WEFT_AGAIN;
    if (ctl->body == coll->count) return WEFT_OK;
    if (!ctl->tail_started) {
      /* the network chain's wire stage: its last sends must be done
       * before the tail's leaders (other member numbers) may write it */
      for (int k = 0; k < h->nhosts; k++)
        if (k != h->leader_index) {
          weft_status st = coll->link.ops->send_idle(coll->link.ctx, h->index_peers[k]);
          if (st != WEFT_OK) return st;
        }
      WEFT_CHECK(tail_start(coll, ctl));
    }
    return ctl->tail.advance(&ctl->tail);
  }
}

/* Whether the split form runs this call: hosts of equal sizes, a buffer of
 * at least one chunk per member of a host. */
static bool split_fits(const weft_coll *coll) {
  const weft_hosts *h = &coll->hosts;
  size_t L = (size_t)h->local_size;
  return h->index_peers && h->nhosts > 1 && L > 1 && coll->count >= L &&
         coll->count * coll->elem >= L * coll->chunk_bytes;
}

weft_status weft_hier_allreduce_start(weft_coll *coll) {
  hier_state *hs = WEFT_ALGO_STATE(coll, hier_state);
  hier_ctl *ctl = calloc(1, sizeof *ctl);
  if (!ctl) return WEFT_ERR_NOMEM;
  hs->ctl = ctl;
  coll->algo = "hier";
  coll->cleanup = hier_cleanup;
  if (!split_fits(coll)) {
    coll->advance = leader_advance;
    return WEFT_OK;
  }
  size_t L = (size_t)coll->hosts.local_size;
  ctl->body = coll->count - coll->count % L;
  size_t least = L * weft_chunk_elems(coll); /* a chunk per member */
  size_t seg = (ctl->body + HIER_SEGMENTS - 1) / HIER_SEGMENTS;
  seg = seg < least ? least : seg;
  ctl->seg_elems = (seg + L - 1) / L * L;
  ctl->segs = (ctl->body + ctl->seg_elems - 1) / ctl->seg_elems;
  coll->algo = "hier-split";
  coll->advance = split_advance;
  return WEFT_OK;
}
