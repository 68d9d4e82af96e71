/* test_algo_fake.c - every algorithm on fake links, without a communicator:
 * N members (1..9) in one thread, each a weft_coll whose links (link.h) are
 * FIFOs of chunks per ordered pair, with a bounded number of slots (credits)
 * and the tags checked as the transports check them (seq and length; a
 * mismatch is WEFT_ERR_MISMATCH). An adversarial scheduler, driven by one
 * seed, advances the members in a random order every round, answers
 * WEFT_AGAIN at random where a link may, and holds deliveries back at
 * random: a sent chunk is copied from its source only when delivered, so an
 * algorithm that changes a source before send_idle (or before the peer
 * released it) hands over wrong data. Chunks are a few elements, so
 * pipelines run many chunks. Every member's result is checked against a
 * serial reference in double / wide integers (harness.h), results the
 * algorithm promises bitwise equal are compared across members, and every
 * FIFO must be empty at the end. WEFT_TEST_SEED repeats a run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
// cmocka needs the three above first
#include <cmocka.h>

#include "harness.h"
#include "src/base/call_tag.h"
#include "src/algo/algo.h"
#include "src/mem/shared_mem.h"

#define MAX_N 9
#define MAX_SLOTS 8

static uint64_t base_seed;

/* ---- the fake links ----------------------------------------------------- */

typedef struct fake_chunk {
  const void *src;     /* the sender's memory, copied only on delivery */
  unsigned char *data; /* the copy, once delivered */
  size_t bytes;
  weft_tag seq;
  bool for_copy; /* sent with WEFT_SEND_FOR_COPY: read from src only by recv, as shm's
                    single copy does, and complete only once received */
} fake_chunk;

/* Chunks from one member to another, oldest first: [0, delivered) have
 * arrived (the receiver may see them), the rest are still in flight. */
typedef struct fake_pipe {
  fake_chunk q[MAX_SLOTS];
  int head, count, delivered;
  bool peeked;
} fake_pipe;

/* A registered shared buffer (weft_mem_alloc memory): what map_peer_mem
 * hands back for a key, since every member lives in this process. */
typedef struct fake_shared {
  weft_mem_desc key;
  void *ptr;
} fake_shared;

typedef struct fake_world {
  int n, credits;
  int again_pct, hold_pct; /* chance of a spurious WEFT_AGAIN / of holding a delivery back */
  bool no_runs;            /* recv takes a run a chunk at a time (as tcp and ibv do) */
  uint64_t rng;
  uint64_t events;              /* anything moved: a hang is many rounds without one */
  fake_pipe pipe[MAX_N][MAX_N]; /* [from][to] */
  char error[512];              /* the first misuse or mismatch seen */
  fake_shared shared[2 * MAX_N];
  int nshared;
  int now_calls[MAX_N]; /* sends with WEFT_SEND_NOW by each member: chunks it passed on */
} fake_world;

typedef struct fake_end {
  fake_world *w;
  int me;
  bool cannot_map; /* map_peer_mem refuses (the kernel's refusal, another transport) */
  char sink[256];
} fake_end;

static uint64_t rnd(fake_world *w) {
  return harness_rng(&w->rng);
}

static int pct(fake_world *w, int p) {
  return (int)(rnd(w) % 100) < p;
}

static weft_status misuse(fake_world *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static weft_status misuse(fake_world *w, const char *fmt, ...) {
  if (!w->error[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
  }
  return WEFT_ERR_INTERNAL;
}

static fake_end *end_of(void *ctx) {
  return (fake_end *)ctx;
}

/* The pipe from `from` to `to`, after checking that `peer` is another member. */
static fake_pipe *pipe_of(fake_end *e, int peer, bool outgoing, const char *op) {
  fake_world *w = e->w;
  if (peer < 0 || peer >= w->n || peer == e->me) {
    misuse(w, "member %d: %s with member %d (of %d)", e->me, op, peer, w->n);
    return NULL;
  }
  return outgoing ? &w->pipe[e->me][peer] : &w->pipe[peer][e->me];
}

static fake_chunk *at(fake_pipe *p, int i) {
  return &p->q[(p->head + i) % MAX_SLOTS];
}

static void deliver_one(fake_world *w, fake_pipe *p) {
  fake_chunk *c = at(p, p->delivered);
  if (!c->for_copy) { /* a chunk for copy stays at its source until recv */
    c->data = malloc(c->bytes ? c->bytes : 1);
    if (c->bytes) memcpy(c->data, c->src, c->bytes);
  }
  p->delivered++;
  w->events++;
}

static weft_status fake_send_ready(void *ctx, int peer) {
  fake_end *e = end_of(ctx);
  fake_pipe *p = pipe_of(e, peer, true, "send_ready");
  if (!p) return WEFT_ERR_INTERNAL;
  if (pct(e->w, e->w->again_pct) || p->count >= e->w->credits) return WEFT_AGAIN;
  return WEFT_OK;
}

static weft_status fake_send(void *ctx, int peer, const void *src, size_t bytes, weft_tag seq,
                             const weft_mem_ops *mem, unsigned flags) {
  fake_end *e = end_of(ctx);
  fake_pipe *p = pipe_of(e, peer, true, "send");
  if (!p) return WEFT_ERR_INTERNAL;
  if (mem != &weft_mem_host) return misuse(e->w, "member %d: send with another memory", e->me);
  if (flags & ~(unsigned)(WEFT_SEND_FOR_COPY | WEFT_SEND_NOW))
    return misuse(e->w, "member %d: send to %d with unknown flags 0x%x", e->me, peer, flags);
  if (p->count >= e->w->credits)
    return misuse(e->w, "member %d: send to %d without room (send_ready not asked)", e->me, peer);
  *at(p, p->count++) = (fake_chunk){
      .src = src, .bytes = bytes, .seq = seq, .for_copy = (flags & WEFT_SEND_FOR_COPY) != 0};
  if (flags & WEFT_SEND_NOW) e->w->now_calls[e->me]++;
  e->w->events++;
  return WEFT_OK;
}

static weft_status fake_send_idle(void *ctx, int peer) {
  fake_end *e = end_of(ctx);
  fake_pipe *p = pipe_of(e, peer, true, "send_idle");
  if (!p) return WEFT_ERR_INTERNAL;
  if (pct(e->w, e->w->again_pct)) return WEFT_AGAIN;
  /* complete: every chunk was copied out of its source */
  if (p->delivered < p->count) {
    if (!pct(e->w, e->w->hold_pct)) deliver_one(e->w, p);
    return WEFT_AGAIN;
  }
  /* a chunk for copy is read from its source by the receiver's recv */
  for (int i = 0; i < p->count; i++)
    if (at(p, i)->for_copy) return WEFT_AGAIN;
  return WEFT_OK;
}

/* The oldest arrived chunk from `peer`, its tag checked. */
static weft_status arrived(fake_end *e, int peer, weft_tag seq, size_t bytes, fake_pipe **out) {
  fake_pipe *p = pipe_of(e, peer, false, "a receive");
  if (!p) return WEFT_ERR_INTERNAL;
  if (pct(e->w, e->w->again_pct) || p->delivered == 0) return WEFT_AGAIN;
  const fake_chunk *c = at(p, 0);
  if (c->seq != seq || c->bytes != bytes) {
    snprintf(e->sink, sizeof e->sink,
             "member %d: chunk from %d is (seq %llu, %zu bytes), expected "
             "(seq %llu, %zu bytes)",
             e->me, peer, (unsigned long long)c->seq, c->bytes, (unsigned long long)seq, bytes);
    if (!e->w->error[0]) snprintf(e->w->error, sizeof e->w->error, "%s", e->sink);
    return WEFT_ERR_MISMATCH;
  }
  *out = p;
  return WEFT_OK;
}

static weft_status fake_recv_peek(void *ctx, int peer, weft_tag seq, size_t bytes,
                                  const void **data) {
  fake_end *e = end_of(ctx);
  fake_pipe *p;
  weft_status st = arrived(e, peer, seq, bytes, &p);
  if (st) return st;
  if (at(p, 0)->for_copy)
    return misuse(e->w,
                  "member %d: peeked a chunk that member %d sent for copy (only recv may "
                  "take it)",
                  e->me, peer);
  p->peeked = true;
  *data = at(p, 0)->data;
  return WEFT_OK;
}

static void pop(fake_world *w, fake_pipe *p) {
  fake_chunk *c = at(p, 0);
  /* scribble over the slot: a reader that kept its pointer sees garbage */
  if (c->bytes && c->data) memset(c->data, 0xA5, c->bytes);
  free(c->data);
  *c = (fake_chunk){0};
  p->head = (p->head + 1) % MAX_SLOTS;
  p->count--;
  p->delivered--;
  p->peeked = false;
  w->events++;
}

static weft_status fake_recv_release(void *ctx, int peer) {
  fake_end *e = end_of(ctx);
  fake_pipe *p = pipe_of(e, peer, false, "recv_release");
  if (!p) return WEFT_ERR_INTERNAL;
  if (!p->peeked) return misuse(e->w, "member %d: release from %d without a peek", e->me, peer);
  pop(e->w, p);
  return WEFT_OK;
}

/* One chunk copied out (the first of any receive). */
static weft_status fake_recv_one(void *ctx, int peer, weft_tag seq, size_t bytes, void *dst,
                                 const weft_mem_ops *mem) {
  fake_end *e = end_of(ctx);
  fake_pipe *p;
  if (mem != &weft_mem_host) return misuse(e->w, "member %d: receive into another memory", e->me);
  weft_status st = arrived(e, peer, seq, bytes, &p);
  if (st) return st;
  if (p->peeked) return misuse(e->w, "member %d: recv from %d after a peek", e->me, peer);
  const fake_chunk *c = at(p, 0);
  if (bytes) memcpy(dst, c->for_copy ? c->src : c->data, bytes);
  pop(e->w, p);
  return WEFT_OK;
}

/* A receive (link.h, recv): the first chunk, then, for a run and where the
 * world takes runs at once, a random number of those delivered behind it
 * that continue the run, each checked as the first; a chunk that does not
 * continue it (another call's, a wrong length) is left for the next
 * receive, which reports it. */
static weft_status fake_recv(void *ctx, int peer, weft_tag seq, size_t chunk_bytes, size_t bytes,
                             void *dst, const weft_mem_ops *mem, size_t *chunks) {
  fake_end *e = end_of(ctx);
  *chunks = 0;
  if (chunk_bytes == 0 && bytes)
    return misuse(e->w, "member %d: a run of %zu bytes in chunks of %zu from %d", e->me, bytes,
                  chunk_bytes, peer);
  size_t first = bytes < chunk_bytes ? bytes : chunk_bytes;
  weft_status st = fake_recv_one(ctx, peer, seq, first, dst, mem);
  if (st) return st;
  fake_pipe *p = &e->w->pipe[peer][e->me];
  size_t at_byte = first, n = 1;
  int more = e->w->no_runs ? 0 : (int)(rnd(e->w) % (MAX_SLOTS + 1));
  while (at_byte < bytes && more-- > 0 && p->delivered > 0) {
    size_t len = bytes - at_byte < chunk_bytes ? bytes - at_byte : chunk_bytes;
    const fake_chunk *c = at(p, 0);
    if (c->seq != seq || c->bytes != len) break;
    memcpy((char *)dst + at_byte, c->for_copy ? c->src : c->data, len);
    pop(e->w, p);
    at_byte += len;
    n++;
  }
  *chunks = n;
  return WEFT_OK;
}

/* Host memory only here (weft_mem_alloc's): nothing is lent per call. */
static void fake_release_peer_mem(void *ctx, int peer) {
  (void)ctx;
  (void)peer;
}

static weft_status fake_map_peer_mem(void *ctx, int peer, const weft_mem_desc *desc, void **local) {
  fake_end *e = end_of(ctx);
  if (!pipe_of(e, peer, true, "map_peer_mem")) return WEFT_ERR_INTERNAL;
  if (e->cannot_map) {
    snprintf(e->sink, sizeof e->sink, "member %d: cannot map member %d's memory", e->me, peer);
    return WEFT_ERR_UNSUPPORTED;
  }
  for (int i = 0; i < e->w->nshared; i++) {
    const weft_mem_desc *k = &e->w->shared[i].key;
    if (!memcmp(k, desc, sizeof *k)) { /* described alike: zero-filled, then the same fields */
      *local = e->w->shared[i].ptr;
      return WEFT_OK;
    }
  }
  snprintf(e->sink, sizeof e->sink, "member %d: no shared buffer of %llu bytes described so",
           e->me, (unsigned long long)desc->len);
  return WEFT_ERR_UNSUPPORTED;
}

static void fake_progressed(void *ctx) {
  end_of(ctx)->w->events++;
}

static int fake_rank_of(void *ctx, int member) {
  (void)ctx;
  return member;
}

static const char *fake_last_error(void *ctx) {
  return end_of(ctx)->sink;
}

static void fake_set_error(void *ctx, const char *sentence) {
  fake_end *e = end_of(ctx);
  snprintf(e->sink, sizeof e->sink, "%s", sentence);
}

static const weft_link_ops fake_ops = {
    .send_ready = fake_send_ready,
    .send = fake_send,
    .send_idle = fake_send_idle,
    .recv_peek = fake_recv_peek,
    .recv_release = fake_recv_release,
    .recv = fake_recv,
    .map_peer_mem = fake_map_peer_mem,
    .release_peer_mem = fake_release_peer_mem,
    .progressed = fake_progressed,
    .rank_of = fake_rank_of,
    .last_error = fake_last_error,
    .set_error = fake_set_error,
};

/* ---- one run: members, scheduler ------------------------------------------ */

typedef enum {
  ALGO_RING,
  ALGO_RD,
  ALGO_EXCHANGE,
  ALGO_EXCHANGE_ASKING,
  ALGO_DIRECT,
  ALGO_HIER,
  ALGO_BCAST,
  ALGO_REDUCE,
  ALGO_REDUCE_SCATTER,
  ALGO_ALLGATHER,
  ALGO_GATHER,
  ALGO_SCATTER,
  ALGO_ALLTOALL,
  ALGO_COUNT
} algo_id;

static const char *const algo_names[] = {"ring allreduce",
                                         "recursive doubling",
                                         "exchange",
                                         "exchange (asking)",
                                         "direct",
                                         "hier",
                                         "tree broadcast",
                                         "tree reduce",
                                         "ring reduce-scatter",
                                         "ring allgather",
                                         "flat gather",
                                         "flat scatter",
                                         "pairwise alltoall"};

/* What one run does. Members of the algorithm are members of the group:
 * group member g is fake member members[g] (a permutation, or a subset in
 * any order), so a tree whose root is not 0 runs on a group that is not the
 * identity. */
typedef struct run_case {
  algo_id algo;
  int n;     /* fake members */
  int gsize; /* group members (<= n) */
  int members[MAX_N];
  size_t count;
  weft_dtype dt;
  weft_op op;
  int root, fanout;
  bool confirmed; /* a broadcast as users call it: descriptors confirmed, fanout 0 binomial */
  bool pairwise;  /* an allgather pairwise (every block from its owner), not around the ring */
  /* log2(size) rounds on the whole buffer, which fits one chunk: an
   * allgather by Bruck, a reduce-scatter by recursive doubling */
  bool log_rounds;
  bool halving; /* a reduce-scatter by recursive halving (a power-of-two group) */
  bool in_place;
  size_t chunk_bytes;
  int tag;
  int nhosts, host_of[MAX_N];       /* hier */
  bool shared;                      /* direct: weft_mem_alloc buffers */
  int cannot_map;                   /* direct: this member's map_peer_mem fails (-1: none) */
  bool stores[MAX_N];               /* exchange asking: each member's word */
  size_t rd_max_bytes, chain_bytes; /* hier: the hints, the same on every member */
  bool nan_payloads;                /* inputs hold NaNs of other signs and payloads per member:
                                       only agreement across members is checked */
  weft_dtype wire;                  /* f32 on the wire as bf16 / f16 (algo.h); WEFT_F32: off */
} run_case;

typedef struct member {
  weft_coll coll;
  fake_end end;
  weft_group_links group;
  unsigned char *in, *out;
  size_t in_bytes, out_bytes;
  bool done;
  /* hier */
  int host_members[MAX_N], leaders[MAX_N], index_peers[MAX_N];
} member;

static void describe(const run_case *c, char *buf, size_t len) {
  char grp[64] = "";
  int at = 0;
  for (int g = 0; g < c->gsize && at < (int)sizeof grp - 4; g++)
    at += snprintf(grp + at, sizeof grp - (size_t)at, "%s%d", g ? "," : "", c->members[g]);
  snprintf(buf, len,
           "%s%s: %d members, group [%s], count %zu %s %s, root %d, fanout %d, %s, chunk %zu "
           "bytes, %d hosts%s%s (seed %llu)",
           algo_names[c->algo],
           c->confirmed    ? " (confirmed)"
           : c->pairwise   ? " (pairwise)"
           : c->halving    ? " (recursive halving)"
           : c->log_rounds ? " (log2 rounds)"
                           : "",
           c->n, grp, c->count, weft_dtype_name(c->dt), weft_op_name(c->op), c->root, c->fanout,
           c->in_place ? "in place" : "out of place", c->chunk_bytes, c->nhosts,
           c->shared ? ", shared buffers" : "", c->cannot_map >= 0 ? ", one member cannot map" : "",
           (unsigned long long)base_seed);
}

/* Group member g's block b of this case. */
static void fill_block(void *buf, const run_case *c, int g, int b) {
  harness_fill(buf, c->count, c->dt, c->op, harness_seed(base_seed, g, c->tag * 64 + b));
  if (!c->nan_payloads) return;
  /* every other element a NaN whose sign and payload depend on the member:
   * x86 keeps the first operand's NaN, so partners that combine in opposite
   * orders end with other bits */
  for (size_t i = 0; i < c->count; i += 2) {
    uint64_t payload = (uint64_t)(g + 1) * 0x101 + i;
    bool neg = (g + (int)i) % 2;
    switch (c->dt) {
      case WEFT_F32: {
        uint32_t v = 0x7fc00000u | (uint32_t)(payload & 0x3fffff) | (neg ? 0x80000000u : 0);
        memcpy((char *)buf + i * 4, &v, 4);
        break;
      }
      case WEFT_F64: {
        uint64_t v = 0x7ff8000000000000ull | (payload & 0xfffffffffffull) | (neg ? 1ull << 63 : 0);
        memcpy((char *)buf + i * 8, &v, 8);
        break;
      }
      case WEFT_F16: {
        uint16_t v = (uint16_t)(0x7e00u | (payload & 0x1ff) | (neg ? 0x8000u : 0));
        memcpy((char *)buf + i * 2, &v, 2);
        break;
      }
      case WEFT_BF16: {
        uint16_t v = (uint16_t)(0x7fc0u | (payload & 0x3f) | (neg ? 0x8000u : 0));
        memcpy((char *)buf + i * 2, &v, 2);
        break;
      }
      default: break;
    }
  }
}

typedef struct contrib {
  const run_case *c;
  int b;
} contrib;

static void fill_contrib(void *buf, size_t count, int g, void *ctx) {
  (void)count;
  const contrib *k = ctx;
  fill_block(buf, k->c, g, k->b);
}

static bool is_reduction(algo_id a) {
  return a <= ALGO_HIER || a == ALGO_REDUCE || a == ALGO_REDUCE_SCATTER;
}

/* Blocks in the input and output of group member g. */
static void blocks_of(const run_case *c, int g, size_t *in_blocks, size_t *out_blocks) {
  size_t n = (size_t)c->gsize;
  bool root = g == c->root;
  switch (c->algo) {
    case ALGO_BCAST:
      *in_blocks = root;
      *out_blocks = 1;
      break;
    case ALGO_REDUCE:
      *in_blocks = 1;
      *out_blocks = root;
      break;
    case ALGO_REDUCE_SCATTER:
      *in_blocks = n;
      *out_blocks = 1;
      break;
    case ALGO_ALLGATHER:
      *in_blocks = 1;
      *out_blocks = n;
      break;
    case ALGO_GATHER:
      *in_blocks = 1;
      *out_blocks = root ? n : 0;
      break;
    case ALGO_SCATTER:
      *in_blocks = root ? n : 0;
      *out_blocks = 1;
      break;
    case ALGO_ALLTOALL:
      *in_blocks = n;
      *out_blocks = n;
      break;
    default:
      *in_blocks = 1;
      *out_blocks = 1;
      break;
  }
}

static weft_status start(member *m, const run_case *c) {
  weft_coll *coll = &m->coll;
  switch (c->algo) {
    case ALGO_RING: return weft_ring_allreduce_start(coll);
    case ALGO_RD: return weft_rd_allreduce_start(coll);
    case ALGO_EXCHANGE: return weft_exchange_allreduce_start(coll, false);
    case ALGO_EXCHANGE_ASKING: return weft_exchange_allreduce_start(coll, true);
    case ALGO_DIRECT: return weft_direct_allreduce_start(coll);
    case ALGO_HIER: return weft_hier_allreduce_start(coll);
    case ALGO_BCAST:
      return c->confirmed ? weft_confirmed_broadcast_start(coll, c->fanout)
                          : weft_tree_broadcast_start(coll, c->fanout);
    case ALGO_REDUCE: return weft_tree_reduce_start(coll, c->fanout);
    case ALGO_REDUCE_SCATTER:
      if (c->halving) return weft_halving_reduce_scatter_start(coll);
      return c->log_rounds ? weft_rd_reduce_scatter_start(coll)
                           : weft_ring_reduce_scatter_start(coll);
    case ALGO_ALLGATHER:
      if (c->log_rounds) return weft_bruck_allgather_start(coll);
      return c->pairwise ? weft_pairwise_allgather_start(coll) : weft_ring_allgather_start(coll);
    case ALGO_GATHER: return weft_flat_gather_start(coll);
    case ALGO_SCATTER: return weft_flat_scatter_start(coll);
    case ALGO_ALLTOALL: return weft_pairwise_alltoall_start(coll);
    default: return WEFT_ERR_INTERNAL;
  }
}

/* The hosts of a hierarchical run: ranks (fake members; the group is the
 * identity) in ascending order on each host, the lowest one its leader. */
static void hier_hosts(member *m, const run_case *c, int r) {
  weft_hosts *h = &m->coll.hosts;
  int k = 0, nl = 0;
  *h = (weft_hosts){.nhosts = c->nhosts};
  for (int q = 0; q < c->n; q++) {
    if (c->host_of[q] == c->host_of[r]) {
      if (q == r) h->host_index = k;
      m->host_members[k++] = q;
    }
  }
  for (int host = 0; host < c->nhosts; host++)
    for (int q = 0; q < c->n; q++)
      if (c->host_of[q] == host) {
        if (host == c->host_of[r]) h->leader_index = nl;
        m->leaders[nl++] = q;
        break;
      }
  h->local_size = k;
  h->host_members = m->host_members;
  h->leaders = m->leaders;
  /* hosts of equal sizes: the split form's index groups (comm.c) */
  for (int host = 0; host < c->nhosts; host++) {
    int seen = 0;
    m->index_peers[host] = -1;
    for (int q = 0; q < c->n; q++)
      if (c->host_of[q] == host && seen++ == h->host_index) m->index_peers[host] = q;
    if (seen != k) return;
  }
  h->index_peers = m->index_peers;
}

static void *alloc_buf(size_t bytes, bool shared) {
  void *p = NULL;
  if (shared) {
    if (weft_mem_alloc(bytes ? bytes : 1, &p)) return NULL;
    return p;
  }
  return malloc(bytes ? bytes : 1);
}

static void free_buf(void *p, bool shared) {
  if (shared)
    weft_mem_free(p);
  else
    free(p);
}

static void register_shared(fake_world *w, void *ptr, size_t bytes) {
  weft_mem_desc key;
  if (bytes && weft_shared_mem_describe(ptr, bytes, &key))
    w->shared[w->nshared++] = (fake_shared){key, ptr};
}

/* A reduction's result with the wire dtype on: within n * u * (the sum of
 * |x|) of the exact value, plus f32's own (docs/tuning.md). */
static int check_wire(const void *res, const run_case *c, contrib *k, const char *what) {
  int n = c->gsize, bad = 0;
  float *x = malloc(sizeof(float) * (c->count + 1));
  double *want = calloc(c->count + 1, sizeof(double)), *mag = calloc(c->count + 1, sizeof(double));
  for (int q = 0; q < n; q++) {
    fill_contrib(x, c->count, q, k);
    for (size_t i = 0; i < c->count; i++) {
      want[i] += x[i];
      mag[i] += fabs((double)x[i]);
    }
  }
  double u = c->wire == WEFT_BF16 ? ldexp(1, -8) : ldexp(1, -11);
  for (size_t i = 0; i < c->count && bad < 3; i++) {
    double d = c->op == WEFT_AVG ? n : 1, got = ((const float *)res)[i];
    double tol = (n * u * (1 + n * u) + (n + 2) * ldexp(1, -24)) * mag[i] / d;
    if (!(fabs(got - want[i] / d) <= tol)) {
      fprintf(stderr, "%s count=%zu wire %s %s: element %zu is %.9g, reference %.9g, bound %.3g\n",
              what, c->count, weft_dtype_name(c->wire), weft_op_name(c->op), i, got, want[i] / d,
              tol);
      bad++;
    }
  }
  free(x);
  free(want);
  free(mag);
  return bad;
}

static int check_any(const void *res, const run_case *c, contrib *k, const char *what) {
  if (c->wire != WEFT_F32) return check_wire(res, c, k, what);
  return harness_check_reduced(res, c->count, c->dt, c->op, c->gsize, fill_contrib, k, what);
}

/* Whether member g, done, left a chunk in flight that still reads its
 * scratch (`bytes` of it): the call frees the scratch when it ends. */
static int scratch_still_read(const fake_world *w, const run_case *c, const member *m, int g,
                              size_t bytes, const char *what) {
  const char *lo = m->coll.scratch, *hi = lo + bytes;
  int r = c->members[g];
  for (int b = 0; b < c->n; b++) {
    const fake_pipe *p = &w->pipe[r][b];
    for (int i = 0; i < p->count; i++) {
      const fake_chunk *k = &p->q[(p->head + i) % MAX_SLOTS];
      const char *src = k->src;
      if ((i >= p->delivered || k->for_copy) && src >= lo && src < hi) {
        fprintf(stderr,
                "%s\n  member %d was done while a chunk to member %d still read its scratch\n",
                what, g, b);
        return 1;
      }
    }
  }
  return 0;
}

/* members that ran the hierarchical allreduce's split form: its test
 * fails if none did (the cases would not reach it) */
static long hier_split_runs;

/* Runs one case to the end under the adversarial scheduler; returns the
 * number of problems found (each printed). */
static int run_one(const run_case *c, uint64_t sched_seed) {
  char what[400];
  describe(c, what, sizeof what);
  fake_world *w = calloc(1, sizeof *w);
  member *ms = calloc((size_t)c->gsize, sizeof *ms);
  uint64_t s = sched_seed;
  w->n = c->n;
  w->rng = harness_rng(&s) | 1;
  w->credits = 2 + (int)(rnd(w) % (MAX_SLOTS - 1));
  w->again_pct = (int)(rnd(w) % 50);
  w->hold_pct = (int)(rnd(w) % 90);
  w->no_runs = rnd(w) % 2;
  size_t esz = weft_dtype_size(c->dt);
  int bad = 0;
  fake_end ends[MAX_N];

  for (int g = 0; g < c->gsize; g++) {
    member *m = &ms[g];
    size_t ib, ob;
    blocks_of(c, g, &ib, &ob);
    m->in_bytes = ib * c->count * esz;
    m->out_bytes = ob * c->count * esz;
    bool in_place = c->in_place && ib && ob;
    if (in_place && c->algo != ALGO_ALLTOALL) {
      /* in place: one buffer, the input where the call reads it */
      size_t both = m->in_bytes > m->out_bytes ? m->in_bytes : m->out_bytes;
      m->out = alloc_buf(both, c->shared);
      m->in = m->out;
      size_t in_at = 0;
      if (c->algo == ALGO_ALLGATHER || c->algo == ALGO_GATHER) in_at = (size_t)g * c->count * esz;
      m->in = m->out + in_at;
      for (size_t b = 0; b < ib; b++) fill_block(m->in + b * c->count * esz, c, g, (int)b);
      if (c->shared) register_shared(w, m->out, both);
      if (c->algo == ALGO_REDUCE_SCATTER) m->out = m->in + (size_t)g * c->count * esz;
      if (c->algo == ALGO_SCATTER) m->out = m->in + (size_t)g * c->count * esz;
    } else {
      m->in = alloc_buf(m->in_bytes, c->shared);
      m->out = alloc_buf(m->out_bytes, c->shared);
      for (size_t b = 0; b < ib; b++) fill_block(m->in + b * c->count * esz, c, g, (int)b);
      memset(m->out, 0xEE, m->out_bytes ? m->out_bytes : 1);
      if (c->shared) {
        register_shared(w, m->in, m->in_bytes);
        register_shared(w, m->out, m->out_bytes);
      }
    }
  }
  for (int r = 0; r < c->n; r++)
    ends[r] = (fake_end){.w = w, .me = r, .cannot_map = r == c->cannot_map};
  /* the identity group runs straight on the fake; others through a group's links */
  bool identity = c->gsize == c->n;
  for (int q = 0; q < c->gsize; q++) identity = identity && c->members[q] == q;

  /* The direct allreduce on shared buffers runs twice on the same buffers:
   * the second call is told the first one's agreed messages and skips the
   * verdict round. */
  int passes = c->algo == ALGO_DIRECT && c->shared && c->cannot_map < 0 ? 2 : 1;
  void *agreed = NULL;
  for (int pass = 0; pass < passes && !bad; pass++) {
    if (pass > 0) {
      for (int g = 0; g < c->gsize; g++) {
        member *m = &ms[g];
        weft_coll_scratch_release(&m->coll); /* the call layer's, when a call ends */
        m->done = false;
        fill_block(m->in, c, g, 0); /* in place, the first call overwrote it */
        if (m->out != m->in) memset(m->out, 0xEE, m->out_bytes);
      }
    }
    int started = 0;
    for (int g = 0; g < c->gsize; g++) {
      member *m = &ms[g];
      int r = c->members[g];
      weft_link link = {.ops = &fake_ops, .ctx = &ends[r]};
      if (!identity) link = weft_group_links_init(&m->group, link, c->members);
      m->coll = (weft_coll){.rank = g,
                            .size = c->gsize,
                            .link = link,
                            .avg_div = c->gsize,
                            .call = "test",
                            .sendbuf = m->in_bytes ? m->in : NULL,
                            .recvbuf = m->out_bytes ? m->out : NULL,
                            .count = c->count,
                            .dtype = c->dt,
                            .op = c->op,
                            .root = c->root,
                            .elem = esz,
                            .chunk_bytes = c->chunk_bytes,
                            .mem = &weft_mem_host,
                            .seq = (uint32_t)(c->tag + pass),
                            /* the direct passes as a gradient bucket's steps: the
                             * step changes, the rounds' messages must not */
                            .sig = c->algo != ALGO_DIRECT ? 0
                                   : weft_sig_pack((weft_call_sig){.kind = WEFT_SIG_GRAD_BUCKET,
                                                                   .dtype = (int)c->dt,
                                                                   .op = (int)c->op,
                                                                   .wire = -1,
                                                                   .root = (uint32_t)pass}),
                            .fail_peer = -1};
      if (c->algo == ALGO_BCAST && g == c->root && c->in_place) m->coll.sendbuf = m->coll.recvbuf;
      m->coll.hint = (weft_algo_hint){.sends_are_stores = c->stores[g],
                                      .rd_max_bytes = c->rd_max_bytes,
                                      .bcast_chain_bytes = c->chain_bytes,
                                      .direct_agreed = &agreed};
      if (c->algo == ALGO_HIER) hier_hosts(m, c, r);
      if (c->wire != WEFT_F32) { /* the stage the call layer allocates (coll.c) */
        m->coll.wire = c->wire;
        m->coll.wire_stage = malloc(weft_wire_stage_bytes(&m->coll));
      }
      weft_status st = start(m, c);
      if (st < 0) {
        fprintf(stderr, "%s\n  member %d: start failed: %s\n", what, g, weft_status_name(st));
        bad++;
        break;
      }
      started++;
      if (m->coll.algo && !strcmp(m->coll.algo, "hier-split")) hier_split_runs++;
    }

    /* the scheduler: every round, the members in a random order, deliveries
     * held back at random between them */
    int order[MAX_N], left = started == c->gsize ? c->gsize : 0;
    uint64_t last_events = w->events;
    long idle_rounds = 0;
    while (left > 0 && !bad) {
      for (int g = 0; g < c->gsize; g++) order[g] = g;
      for (int g = c->gsize - 1; g > 0; g--) {
        int k = (int)(rnd(w) % (uint64_t)(g + 1)), t = order[g];
        order[g] = order[k];
        order[k] = t;
      }
      for (int i = 0; i < c->gsize && !bad; i++) {
        member *m = &ms[order[i]];
        for (int a = 0; a < c->n; a++)
          for (int b = 0; b < c->n; b++) {
            fake_pipe *p = &w->pipe[a][b];
            while (p->delivered < p->count && !pct(w, w->hold_pct)) deliver_one(w, p);
          }
        if (m->done) continue;
        weft_status st = m->coll.advance(&m->coll);
        /* the direct rounds' fall-back (algo.h): its caller's part, as coll.c
         * plays it for host buffers: the ring allreduce in the same call */
        if (st == WEFT_ALGO_FALL_BACK) {
          st = weft_ring_allreduce_start(&m->coll);
          if (st == WEFT_OK) st = m->coll.advance(&m->coll);
        }
        if (st == WEFT_OK) {
          m->done = true;
          left--;
          if ((c->log_rounds || c->halving) && m->coll.scratch)
            bad += scratch_still_read(w, c, m, order[i], (size_t)c->gsize * c->count * esz, what);
        } else if (st != WEFT_AGAIN) {
          fprintf(stderr, "%s\n  member %d failed: %s (%s; link says: %s)\n", what, order[i],
                  weft_status_name(st), w->error, ends[c->members[order[i]]].sink);
          bad++;
        }
      }
      if (w->error[0] && !bad) {
        fprintf(stderr, "%s\n  %s\n", what, w->error);
        bad++;
      }
      if (w->events != last_events) {
        last_events = w->events;
        idle_rounds = 0;
      } else if (++idle_rounds > 20000) {
        fprintf(stderr, "%s\n  hangs: %d members not done, nothing moved in 20000 rounds\n", what,
                left);
        bad++;
      }
    }

    /* every chunk sent was received */
    for (int a = 0; a < c->n && !bad; a++)
      for (int b = 0; b < c->n; b++)
        if (w->pipe[a][b].count) {
          fprintf(stderr, "%s\n  %d chunks from member %d to %d were never received\n", what,
                  w->pipe[a][b].count, a, b);
          bad++;
        }

    /* chunks passed on start at once (WEFT_SEND_NOW): every member of
     * a ring of 3 or more passes chunks on, and a tree's root never does
     * (its own chunks may go out together) */
    if (!bad && identity && c->algo == ALGO_RING && c->gsize >= 3 && c->wire == WEFT_F32 &&
        c->count >= (size_t)c->gsize)
      for (int g = 0; g < c->gsize && !bad; g++)
        if (w->now_calls[g] == 0) {
          fprintf(stderr, "%s\n  member %d passed chunks on without WEFT_SEND_NOW\n", what, g);
          bad++;
        }
    if (!bad && identity && c->algo == ALGO_BCAST && !c->confirmed) {
      int forwarders = 0;
      for (int g = 0; g < c->gsize; g++) forwarders += w->now_calls[g] > 0;
      if (w->now_calls[c->root] || (c->fanout == 1 && c->gsize >= 3 && c->count && !forwarders)) {
        fprintf(stderr, "%s\n  WEFT_SEND_NOW: the root sent %d so, %d members forwarded\n", what,
                w->now_calls[c->root], forwarders);
        bad++;
      }
    }

    /* results against the serial reference */
    uint64_t first_hash = 0;
    int verdict = 0;
    for (int g = 0; g < c->gsize && !bad; g++) {
      member *m = &ms[g];
      char label[480];
      snprintf(label, sizeof label, "%s\n  member %d:", what, g);
      size_t block = c->count * esz;
      unsigned char *want = malloc(block ? block : 1);
      switch (c->algo) {
        case ALGO_RING:
        case ALGO_RD:
        case ALGO_EXCHANGE:
        case ALGO_EXCHANGE_ASKING:
        case ALGO_DIRECT:
        case ALGO_HIER: {
          contrib k = {c, 0};
          if (!c->nan_payloads) bad += check_any(m->out, c, &k, label);
          /* every member ends with the same bits, NaNs included: pairs
           * combine in one order, the lower member's value first */
          uint64_t h = harness_hash(1469598103934665603ULL, m->out, block);
          if (g == 0) first_hash = h;
          if (h != first_hash) {
            fprintf(stderr, "%s results differ from member 0's in some bits\n", label);
            bad++;
          }
          if (c->algo == ALGO_EXCHANGE_ASKING) {
            bool all = true;
            for (int q = 0; q < c->gsize; q++) all = all && c->stores[q];
            int v = m->coll.outcome.exchange_verdict;
            if (v != (all ? 1 : -1) || (g && v != verdict)) {
              fprintf(stderr, "%s exchange verdict %d, expected %d\n", label, v, all ? 1 : -1);
              bad++;
            }
            verdict = v;
          }
          if (c->algo == ALGO_DIRECT) {
            /* the keys round says shared or not every time; the first call
             * agrees (remember), the second, told that agreement, keeps it
             * (0) and skips the verdict round; a member that cannot map
             * sends every rank to the ring (as good as ordinary buffers) */
            const weft_algo_outcome *o = &m->coll.outcome;
            bool direct = c->shared && c->cannot_map < 0;
            int want_shared = direct ? 1 : -1, want_agreed = pass ? 0 : direct;
            if (o->direct_shared != want_shared || o->direct_agreed != want_agreed ||
                strcmp(m->coll.algo, direct ? "direct" : "ring")) {
              fprintf(stderr,
                      "%s call %d: direct outcome shared %d, agreed %d (%s), expected %d, %d\n",
                      label, pass + 1, o->direct_shared, o->direct_agreed, m->coll.algo,
                      want_shared, want_agreed);
              bad++;
            }
            if (!pass && direct && g == 0 && (agreed = malloc(o->direct_msgs_bytes)))
              memcpy(agreed, o->direct_msgs, o->direct_msgs_bytes);
          }
          break;
        }
        case ALGO_REDUCE:
          if (g == c->root) {
            contrib k = {c, 0};
            bad += check_any(m->out, c, &k, label);
          }
          break;
        case ALGO_REDUCE_SCATTER: {
          contrib k = {c, g};
          bad += check_any(m->out, c, &k, label);
          break;
        }
        default: {
          /* moved bytes: which member's block b each output block must hold */
          size_t ib, ob;
          blocks_of(c, g, &ib, &ob);
          for (size_t b = 0; b < ob; b++) {
            int from, src_block;
            switch (c->algo) {
              case ALGO_BCAST: from = c->root, src_block = 0; break;
              case ALGO_ALLGATHER:
              case ALGO_GATHER: from = (int)b, src_block = 0; break;
              case ALGO_SCATTER: from = c->root, src_block = g; break;
              default: from = (int)b, src_block = g; break; /* alltoall */
            }
            fill_block(want, c, from, src_block);
            if (block && memcmp(m->out + b * block, want, block)) {
              size_t i = 0;
              while (m->out[b * block + i] == want[i]) i++;
              fprintf(stderr, "%s output block %zu, byte %zu differs from member %d's block %d\n",
                      label, b, i, from, src_block);
              bad++;
              break;
            }
          }
        }
      }
      free(want);
    }
  } /* passes */
  free(agreed);

  for (int g = 0; g < c->gsize; g++) {
    member *m = &ms[g];
    if (m->coll.cleanup) m->coll.cleanup(&m->coll);
    weft_coll_scratch_release(&m->coll);
    free(m->coll.wire_stage);
    bool one_buffer = c->in_place && m->in_bytes && m->out_bytes && c->algo != ALGO_ALLTOALL;
    if (one_buffer) {
      unsigned char *base = m->in < m->out ? m->in : m->out;
      free_buf(base, c->shared);
    } else {
      free_buf(m->in, c->shared);
      free_buf(m->out, c->shared);
    }
  }
  for (int a = 0; a < c->n; a++)
    for (int b = 0; b < c->n; b++)
      while (w->pipe[a][b].count) {
        fake_pipe *p = &w->pipe[a][b];
        if (p->delivered == 0) deliver_one(w, p);
        pop(w, p);
      }
  free(ms);
  free(w);
  return bad;
}

/* ---- the cases -------------------------------------------------------------- */

static const weft_dtype dtypes[] = {WEFT_F32, WEFT_F64, WEFT_F16, WEFT_BF16,
                                    WEFT_I8,  WEFT_U8,  WEFT_I32, WEFT_I64};
static const weft_op ops[] = {WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX, WEFT_AVG};

/* A random case of `algo` on n members; `tag` tells cases apart. */
static run_case random_case(algo_id algo, int n, int tag, uint64_t *s) {
  run_case c = {.algo = algo, .n = n, .gsize = n, .tag = tag, .nhosts = 1};
  for (int g = 0; g < n; g++) c.members[g] = g;
  c.dt = dtypes[harness_rng(s) % 8];
  c.op = is_reduction(algo) ? ops[harness_rng(s) % 5] : WEFT_SUM;
  /* an i8, u8 or i32 avg never reaches an algorithm: the call sums it in i64
   * (src/coll), and test_reduce_gather_scatter_alltoall checks that; here it is an i64 avg */
  if (c.op == WEFT_AVG && (c.dt == WEFT_I8 || c.dt == WEFT_U8 || c.dt == WEFT_I32)) c.dt = WEFT_I64;
  size_t esz = weft_dtype_size(c.dt);
  c.count = 1 + harness_rng(s) % 97;
  c.chunk_bytes = esz * (1 + harness_rng(s) % 7) + (harness_rng(s) & 1 ? esz / 2 : 0);
  c.in_place = harness_rng(s) & 1;
  if (algo == ALGO_RD || algo == ALGO_EXCHANGE || algo == ALGO_EXCHANGE_ASKING)
    c.chunk_bytes = c.count * esz + harness_rng(s) % 16; /* the whole buffer in one chunk */
  c.cannot_map = -1;
  if (algo == ALGO_DIRECT) c.shared = harness_rng(s) & 1;
  if (c.shared && harness_rng(s) % 3 == 0) c.cannot_map = (int)(harness_rng(s) % (uint64_t)n);
  for (int g = 0; g < n; g++) c.stores[g] = harness_rng(s) % 4 != 0;
  c.rd_max_bytes = harness_rng(s) & 1 ? SIZE_MAX : 0;
  c.chain_bytes = (size_t)(harness_rng(s) % 64) * esz;
  if (algo == ALGO_HIER) {
    c.nhosts = 1 + (int)(harness_rng(s) % (uint64_t)n);
    int perm[MAX_N];
    for (int r = 0; r < n; r++) perm[r] = r;
    for (int r = n - 1; r > 0; r--) {
      int k = (int)(harness_rng(s) % (uint64_t)(r + 1)), t = perm[r];
      perm[r] = perm[k];
      perm[k] = t;
    }
    /* every host has a rank; which ranks share one is random. Half the
     * cases with hosts of equal sizes (the split form), when n allows */
    bool equal = harness_rng(s) & 1;
    if (equal)
      while (n % c.nhosts) c.nhosts--;
    for (int i = 0; i < n; i++)
      c.host_of[perm[i]] = equal ? i % c.nhosts
                           : i < c.nhosts ? i
                                          : (int)(harness_rng(s) % (uint64_t)c.nhosts);
  }
  bool rooted =
      algo == ALGO_BCAST || algo == ALGO_REDUCE || algo == ALGO_GATHER || algo == ALGO_SCATTER;
  if (rooted && harness_rng(s) % 3) {
    /* a group that is not the identity: a random subset in a random order */
    int perm[MAX_N];
    for (int r = 0; r < n; r++) perm[r] = r;
    for (int r = n - 1; r > 0; r--) {
      int k = (int)(harness_rng(s) % (uint64_t)(r + 1)), t = perm[r];
      perm[r] = perm[k];
      perm[k] = t;
    }
    c.gsize = n < 2 ? 1 : 2 + (int)(harness_rng(s) % (uint64_t)(n - 1));
    for (int g = 0; g < c.gsize; g++) c.members[g] = perm[g];
  }
  if (rooted) c.root = (int)(harness_rng(s) % (uint64_t)c.gsize);
  static const int fanouts[] = {1, 2, 3, 4, 8};
  c.fanout = fanouts[harness_rng(s) % 5];
  if (algo == ALGO_BCAST) c.confirmed = harness_rng(s) & 1;
  if (algo == ALGO_ALLGATHER) c.pairwise = harness_rng(s) & 1;
  if (c.confirmed && harness_rng(s) % 2) c.fanout = 0;
  return c;
}

/* Members an algorithm runs on: allreduces and rings need two at least
 * (the call layer answers one member itself), trees and flat calls not. */
static int min_members(algo_id algo) {
  return algo == ALGO_BCAST || algo == ALGO_GATHER || algo == ALGO_SCATTER || algo == ALGO_HIER ? 1
                                                                                                : 2;
}

static int cases_per_size = 60;

static void run_algo(algo_id algo) {
  uint64_t s = harness_seed(base_seed, (int)algo, 7);
  int bad = 0, tag = 1;
  for (int n = min_members(algo); n <= MAX_N; n++)
    for (int i = 0; i < cases_per_size && bad < 3; i++) {
      run_case c = random_case(algo, n, tag++, &s);
      bad += run_one(&c, harness_rng(&s));
    }
  if (bad)
    fail_msg("%s: %d runs failed (seed %llu)", algo_names[algo], bad,
             (unsigned long long)base_seed);
  if (algo == ALGO_HIER && hier_split_runs == 0)
    fail_msg("hier: no case ran the split form (seed %llu)", (unsigned long long)base_seed);
}

#define ALGO_TEST(name, id)        \
  static void name(void **state) { \
    (void)state;                   \
    run_algo(id);                  \
  }
ALGO_TEST(ring_allreduce, ALGO_RING)
ALGO_TEST(rd_allreduce, ALGO_RD)

/* The small allgather and reduce-scatter (Bruck, recursive doubling on the
 * whole input): every size from 2 (powers of two and not), the whole buffer
 * in one chunk as the call layer gives them. */
static void run_log_rounds(algo_id algo) {
  uint64_t s = harness_seed(base_seed, (int)algo, 11);
  int bad = 0, tag = 3000;
  for (int n = 2; n <= MAX_N; n++)
    for (int i = 0; i < cases_per_size && bad < 3; i++) {
      run_case c = random_case(algo, n, tag++, &s);
      c.pairwise = false;
      c.log_rounds = true;
      c.chunk_bytes = (size_t)n * c.count * weft_dtype_size(c.dt) + harness_rng(&s) % 16;
      bad += run_one(&c, harness_rng(&s));
    }
  if (bad)
    fail_msg("%s in log2 rounds: %d runs failed (seed %llu)", algo_names[algo], bad,
             (unsigned long long)base_seed);
}

/* Recursive halving: power-of-two groups, the first round's half (half
 * the input) in one chunk, sometimes just so. */
static void halving_reduce_scatter(void **state) {
  (void)state;
  uint64_t s = harness_seed(base_seed, (int)ALGO_REDUCE_SCATTER, 13);
  int bad = 0, tag = 5000;
  for (int n = 2; n <= MAX_N; n *= 2)
    for (int i = 0; i < 4 * cases_per_size && bad < 3; i++) {
      run_case c = random_case(ALGO_REDUCE_SCATTER, n, tag++, &s);
      c.halving = true;
      size_t half = (size_t)(n / 2) * c.count * weft_dtype_size(c.dt);
      c.chunk_bytes = half + (harness_rng(&s) & 1 ? 0 : harness_rng(&s) % (half + 16));
      if (c.chunk_bytes < 4) c.chunk_bytes = 4;
      bad += run_one(&c, harness_rng(&s));
    }
  if (bad)
    fail_msg("reduce-scatter by recursive halving: %d runs failed (seed %llu)", bad,
             (unsigned long long)base_seed);
}

static void bruck_allgather(void **state) {
  (void)state;
  run_log_rounds(ALGO_ALLGATHER);
}

static void rd_reduce_scatter(void **state) {
  (void)state;
  run_log_rounds(ALGO_REDUCE_SCATTER);
}
ALGO_TEST(exchange_allreduce, ALGO_EXCHANGE)
ALGO_TEST(exchange_allreduce_asking, ALGO_EXCHANGE_ASKING)
ALGO_TEST(direct_allreduce, ALGO_DIRECT)
ALGO_TEST(hier_allreduce, ALGO_HIER)
ALGO_TEST(tree_broadcast, ALGO_BCAST)
ALGO_TEST(tree_reduce, ALGO_REDUCE)
ALGO_TEST(ring_reduce_scatter, ALGO_REDUCE_SCATTER)
ALGO_TEST(ring_allgather, ALGO_ALLGATHER)
ALGO_TEST(flat_gather, ALGO_GATHER)
ALGO_TEST(flat_scatter, ALGO_SCATTER)
ALGO_TEST(pairwise_alltoall, ALGO_ALLTOALL)

/* The case the tree bug hid: a tree whose root is not member 0, on a group
 * of fewer members than the links below it, in another order. Every
 * fan-out and root, both directions. */
static void tree_root_not_zero_on_a_group(void **state) {
  (void)state;
  uint64_t s = harness_seed(base_seed, 99, 7);
  int bad = 0, tag = 5000;
  static const int members[] = {6, 2, 7, 0, 4}; /* group of 5 over 8 fake members */
  for (int algo = ALGO_BCAST; algo <= ALGO_REDUCE; algo++)
    for (int root = 1; root < 5; root++)
      for (int fanout = 1; fanout <= 4; fanout++) {
        run_case c = random_case((algo_id)algo, 8, tag++, &s);
        c.gsize = 5;
        memcpy(c.members, members, sizeof members);
        c.root = root;
        c.fanout = fanout;
        bad += run_one(&c, harness_rng(&s));
      }
  if (bad)
    fail_msg("trees with root != 0 on a group: %d runs failed (seed %llu)", bad,
             (unsigned long long)base_seed);
}

/* Issue: with two different NaNs, partners of recursive doubling that each
 * combined "own op received" ended with different sign bits (x86 keeps the
 * first operand's NaN). Every allreduce algorithm must give every member the
 * same bits; recursive doubling (and hier through it) combines the lower
 * member's value first. */
static void nan_bits_agree_across_members(void **state) {
  (void)state;
  uint64_t s = harness_seed(base_seed, 98, 3);
  static const weft_dtype fdt[] = {WEFT_F32, WEFT_F64, WEFT_F16, WEFT_BF16};
  int bad = 0, tag = 6000;
  for (int algo = ALGO_RING; algo <= ALGO_HIER; algo++)
    for (int n = 2; n <= 8; n++)
      for (size_t d = 0; d < sizeof fdt / sizeof fdt[0]; d++)
        for (int op = WEFT_SUM; op <= WEFT_MAX; op++) {
          if (n < min_members((algo_id)algo)) continue;
          run_case c = random_case((algo_id)algo, n, tag++, &s);
          c.dt = fdt[d];
          c.op = (weft_op)op;
          c.nan_payloads = true;
          size_t bytes = c.count * weft_dtype_size(c.dt); /* the case was drawn for another dtype */
          if ((algo == ALGO_RD || algo == ALGO_EXCHANGE || algo == ALGO_EXCHANGE_ASKING) &&
              c.chunk_bytes < bytes)
            c.chunk_bytes = bytes;
          bad += run_one(&c, harness_rng(&s));
        }
  if (bad)
    fail_msg("NaN bits differ across members in %d runs (seed %llu)", bad,
             (unsigned long long)base_seed);
}

/* f32 on the wire as bf16 / f16 (algo.h): every algorithm that carries it,
 * 2..8 members, tiny chunks, under the adversarial scheduler: the steps
 * that wait for the stage re-enter like the others, every member of an
 * allreduce ends with the same bits, and the error stays within the bound.
 * The exchange runs too: it must turn the wire dtype off (not send f32 where
 * a peer expects half). */
static void wire_dtype_every_reduction(void **state) {
  (void)state;
  uint64_t s = harness_seed(base_seed, 97, 5);
  static const algo_id algos[] = {ALGO_RING, ALGO_RD, ALGO_HIER, ALGO_REDUCE, ALGO_REDUCE_SCATTER,
                                  ALGO_EXCHANGE};
  int bad = 0, tag = 7000;
  for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
    for (int n = 2; n <= MAX_N; n++)
      for (int i = 0; i < 12 && bad < 3; i++) {
        run_case c = random_case(algos[a], n, tag++, &s);
        c.dt = WEFT_F32;
        c.op = i % 2 ? WEFT_AVG : WEFT_SUM;
        c.wire = i % 3 ? WEFT_BF16 : WEFT_F16;
        c.count = 1 + harness_rng(&s) % 97;
        c.chunk_bytes = 4 * (1 + harness_rng(&s) % 7) + (harness_rng(&s) & 1 ? 2 : 0);
        if (algos[a] == ALGO_RD || algos[a] == ALGO_EXCHANGE) c.chunk_bytes = c.count * 4;
        bad += run_one(&c, harness_rng(&s));
      }
  if (bad)
    fail_msg("f32 on the wire: %d runs failed (seed %llu)", bad, (unsigned long long)base_seed);
}

/* The fake itself catches a wrong length and a wrong call: tags checked as
 * the transports check them. */
static weft_status fake_alone_advance(weft_coll *coll) {
  const void *d;
  /* member 1 expects 8 bytes of call 3, member 0 sends 4 bytes of call 3 */
  if (coll->rank == 0) return weft_step_send(coll, 1, "abcd", 4, 0);
  return weft_link_recv_peek(coll, 0, 8, &d);
}

static void fake_catches_mismatch(void **state) {
  (void)state;
  fake_world *w = calloc(1, sizeof *w);
  *w = (fake_world){.n = 2, .credits = 2, .rng = 1};
  fake_end ends[2] = {{.w = w, .me = 0}, {.w = w, .me = 1}};
  weft_coll colls[2];
  for (int r = 0; r < 2; r++)
    colls[r] = (weft_coll){.rank = r,
                           .size = 2,
                           .link = {&fake_ops, &ends[r]},
                           .seq = 3,
                           .mem = &weft_mem_host,
                           .elem = 1};
  assert_int_equal(fake_alone_advance(&colls[0]), WEFT_OK);
  deliver_one(w, &w->pipe[0][1]);
  assert_int_equal(fake_alone_advance(&colls[1]), WEFT_ERR_MISMATCH);
  assert_non_null(strstr(ends[1].sink, "expected (seq 3, 8 bytes)"));
  pop(w, &w->pipe[0][1]);
  free(w);
}

int main(void) {
  const char *fixed = getenv("WEFT_TEST_SEED");
  base_seed = fixed ? strtoull(fixed, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  printf("# seed %llu (set WEFT_TEST_SEED to repeat)\n", (unsigned long long)base_seed);
  if (getenv("WEFT_TEST_CASES")) cases_per_size = atoi(getenv("WEFT_TEST_CASES"));
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fake_catches_mismatch),
      cmocka_unit_test(wire_dtype_every_reduction),
      cmocka_unit_test(ring_allreduce),
      cmocka_unit_test(rd_allreduce),
      cmocka_unit_test(exchange_allreduce),
      cmocka_unit_test(exchange_allreduce_asking),
      cmocka_unit_test(direct_allreduce),
      cmocka_unit_test(hier_allreduce),
      cmocka_unit_test(tree_broadcast),
      cmocka_unit_test(tree_reduce),
      cmocka_unit_test(tree_root_not_zero_on_a_group),
      cmocka_unit_test(nan_bits_agree_across_members),
      cmocka_unit_test(ring_reduce_scatter),
      cmocka_unit_test(ring_allgather),
      cmocka_unit_test(bruck_allgather),
      cmocka_unit_test(rd_reduce_scatter),
      cmocka_unit_test(halving_reduce_scatter),
      cmocka_unit_test(flat_gather),
      cmocka_unit_test(flat_scatter),
      cmocka_unit_test(pairwise_alltoall),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
