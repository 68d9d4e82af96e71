/* test_transport_contract.c - the transport contract's newer members, run on
 * every transport built (two contexts of one communicator in this process,
 * driven by one thread): channels to one peer are independent streams,
 * connect refuses an unknown channel, send_depth and probe answer, and
 * memory registration by kind (shm maps a peer's weft_mem_alloc buffer from
 * its descriptor; every kind a transport cannot map is refused); and tcp
 * leaves large chunks for its progress to write, and answers a dial left
 * in its listener's queue with the failure it passes on. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "src/base/auth.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "src/mem/shared_mem.h"
#include "src/topo/select.h"
#include "transports/transport.h"

#define CHUNK 4096

/* The channels of host chunks (COLL, P2P); the device channel's chunks
 * are device memory (transport.h), checked in test_ibv_gdr.c. */
#define HOST_CHANNELS WEFT_TP_HOST_CHANNELS

typedef struct pair {
  const weft_transport *tp;
  weft_place place;
  weft_auth_key key;
  weft_error_sink sink[2];
  weft_transport_init_args args[2];
  uint8_t addr[2][WEFT_TRANSPORT_ADDR_MAX];
  size_t alen[2];
  weft_tp_ctx *ctx[2];
  weft_tp_conn *tx[WEFT_TP_CHANNELS]; /* rank 0 -> 1 */
  weft_tp_conn *rx[WEFT_TP_CHANNELS]; /* rank 1's end of the same channel */
} pair;

static void drive(pair *p) {
  bool moved;
  p->tp->progress(p->ctx[0], &moved);
  p->tp->progress(p->ctx[1], &moved);
}

/* Both contexts, not yet connected. false: this transport cannot run here
 * (ibv without the emulator) */
static bool pair_init(pair *p, const weft_transport *tp, size_t chunk_bytes) {
  memset(p, 0, sizeof *p);
  p->tp = tp;
  setenv("WEFT_TRANSPORT", tp->name, 1); /* verbs: same-host peers through the NIC */
  weft_settings_reload();
  weft_place_here(NULL, &p->place);
  weft_auth_key_for_job(NULL, 0, &p->key);
  /* a fresh id per pair: shm names its segments by it */
  static uint64_t pairs_made;
  uint64_t comm_id = ((uint64_t)getpid() << 24) ^ ++pairs_made;
  for (int r = 0; r < 2; r++) {
    p->args[r] = (weft_transport_init_args){.rank = r,
                                            .size = 2,
                                            .comm_id = comm_id,
                                            .chunk_bytes = chunk_bytes,
                                            .timeout_s = 5,
                                            .wake_fd = -1,
                                            .errors = &p->sink[r],
                                            .place = &p->place,
                                            .auth = &p->key,
                                            .local_size = 2};
    struct sockaddr_in *lo = (struct sockaddr_in *)&p->args[r].local_addr;
    lo->sin_family = AF_INET;
    lo->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    p->args[r].local_addr_len = sizeof *lo;
    weft_status st = tp->init(&p->args[r], &p->ctx[r], p->addr[r], &p->alen[r]);
    if (st == WEFT_ERR_UNSUPPORTED && r == 0) {
      printf("# %s: not here (%s)\n", tp->name, p->sink[r].msg);
      return false;
    }
    if (st) fail_msg("%s init rank %d: %s", tp->name, r, p->sink[r].msg);
  }
  return true;
}

static bool pair_open_chunk(pair *p, const weft_transport *tp, size_t chunk_bytes) {
  if (!pair_init(p, tp, chunk_bytes)) return false;
  /* channel 1 first: the order of connects must not matter */
  for (int ch = HOST_CHANNELS - 1; ch >= 0; ch--) {
    assert_int_equal(tp->connect(p->ctx[1], 0, ch, p->addr[0], p->alen[0], &p->rx[ch]), WEFT_OK);
    assert_int_equal(tp->connect(p->ctx[0], 1, ch, p->addr[1], p->alen[1], &p->tx[ch]), WEFT_OK);
  }
  for (int ch = 0; ch < HOST_CHANNELS; ch++) {
    weft_tp_conn *again;
    assert_int_equal(tp->connect(p->ctx[0], 1, ch, p->addr[1], p->alen[1], &again), WEFT_OK);
    assert_ptr_equal(again, p->tx[ch]);
    double deadline = harness_now() + 5;
    while (tp->send_ready(p->tx[ch]) == WEFT_AGAIN && harness_now() < deadline) drive(p);
    if (tp->send_ready(p->tx[ch]) != WEFT_OK)
      fail_msg("%s channel %d never came up: %s", tp->name, ch, p->sink[0].msg);
  }
  assert_ptr_not_equal(p->tx[0], p->tx[1]);
  return true;
}

static bool pair_open(pair *p, const weft_transport *tp) {
  return pair_open_chunk(p, tp, CHUNK);
}

static void pair_close(pair *p) {
  p->tp->fini(p->ctx[0]);
  p->tp->fini(p->ctx[1]);
  unsetenv("WEFT_TRANSPORT");
  weft_settings_reload();
}

static void fill(unsigned char *buf, size_t n, int ch, uint32_t seq) {
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 7 + seq * 13 + (unsigned)ch * 101);
}

static void send_one(pair *p, int ch, uint32_t seq, size_t bytes, unsigned char *buf) {
  fill(buf, bytes, ch, seq);
  double deadline = harness_now() + 5;
  weft_status st;
  while ((st = p->tp->send_ready(p->tx[ch])) == WEFT_AGAIN && harness_now() < deadline) drive(p);
  if (st || p->tp->send(p->tx[ch], buf, bytes, seq, &weft_mem_host, 0))
    fail_msg("%s: send on channel %d, #%u: %s", p->tp->name, ch, seq, p->sink[0].msg);
}

static void recv_one(pair *p, int ch, uint32_t seq, size_t bytes, bool into) {
  unsigned char want[CHUNK], got[CHUNK];
  fill(want, bytes, ch, seq);
  double deadline = harness_now() + 5;
  weft_status st;
  const void *data = NULL;
  do {
    st = into ? p->tp->recv(p->rx[ch], seq, bytes, bytes, got, &weft_mem_host, &(size_t){0})
              : p->tp->recv_peek(p->rx[ch], seq, bytes, &data);
    if (st == WEFT_AGAIN) drive(p);
  } while (st == WEFT_AGAIN && harness_now() < deadline);
  if (st) fail_msg("%s: receive on channel %d, #%u: %s", p->tp->name, ch, seq, p->sink[1].msg);
  if (!into) {
    memcpy(got, data, bytes);
    assert_int_equal(p->tp->recv_release(p->rx[ch]), WEFT_OK);
  }
  if (memcmp(got, want, bytes))
    fail_msg("%s: channel %d, #%u: another stream's bytes", p->tp->name, ch, seq);
}

/* Chunks of both channels are in flight at once, with their own sequence
 * numbers and sizes; each channel's receiver gets exactly its own, in its
 * order, whichever channel is read first. One stream under both would hand
 * channel 0's reader channel 1's chunk: a mismatch. */
static void channels_on(const weft_transport *tp) {
  pair p;
  if (!pair_open(&p, tp)) {
    skip();
    return;
  }
  static unsigned char buf[2][4][CHUNK]; /* sources stay put until read */
  int depth = tp->send_depth(p.ctx[0]);
  assert_true(depth >= 4 && depth <= 64);
  for (uint32_t k = 0; k < 4; k++) {
    send_one(&p, 1, 1000 + k, 100 + 1000 * k, buf[1][k]); /* channel 1 first */
    send_one(&p, 0, k, 3000 - 500 * k, buf[0][k]);
  }
  for (uint32_t k = 0; k < 4; k++) recv_one(&p, 0, k, 3000 - 500 * k, k % 2);
  for (uint32_t k = 0; k < 4; k++) recv_one(&p, 1, 1000 + k, 100 + 1000 * k, k % 2 == 0);
  /* the other way too: rank 1 sends on its ends */
  weft_tp_conn *swap[WEFT_TP_CHANNELS];
  memcpy(swap, p.tx, sizeof swap);
  memcpy(p.tx, p.rx, sizeof swap);
  memcpy(p.rx, swap, sizeof swap);
  send_one(&p, 1, 7, 64, buf[1][0]);
  send_one(&p, 0, 7, 4096, buf[0][0]);
  recv_one(&p, 1, 7, 64, false);
  recv_one(&p, 0, 7, 4096, true);
  weft_tp_conn *c;
  assert_int_equal(tp->connect(p.ctx[0], 1, WEFT_TP_CHANNELS, p.addr[1], p.alen[1], &c),
                   WEFT_ERR_INVALID);
  assert_int_equal(tp->connect(p.ctx[0], 1, -1, p.addr[1], p.alen[1], &c), WEFT_ERR_INVALID);
  for (int ch = 0; ch < HOST_CHANNELS; ch++) {
    double deadline = harness_now() + 5;
    while (tp->send_idle(p.tx[ch]) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
    assert_int_equal(tp->send_idle(p.tx[ch]), WEFT_OK);
  }
  pair_close(&p);
}

/* A sender that filled channel 1's slots (nobody reads them) still sends on
 * channel 0: credits are per channel. Only where credits are slots the peer
 * gives back (shm, ibv); tcp's depth is its own queue, drained by the socket. */
static void credits_on(const weft_transport *tp) {
  pair p;
  if (!pair_open(&p, tp)) {
    skip();
    return;
  }
  int depth = tp->send_depth(p.ctx[0]);
  static unsigned char buf[65][64];
  for (int k = 0; k < depth; k++) send_one(&p, 1, (uint32_t)k, 64, buf[k]);
  drive(&p);
  assert_int_equal(tp->send_ready(p.tx[1]), WEFT_AGAIN);
  send_one(&p, 0, 0, 64, buf[64]);
  recv_one(&p, 0, 0, 64, false);
  for (int k = 0; k < depth; k++) recv_one(&p, 1, (uint32_t)k, 64, false);
  pair_close(&p);
}

/* WEFT_SEND_FOR_COPY on every transport: the chunk arrives whole whether
 * the receiver takes it with recv or peeks it, and it is complete once the
 * receiver took it. On shm (threshold 0, WEFT_SHM_CMA=on here) chunks past
 * the first go by single copy; tcp and ibv send them as any chunk. */
static void for_copy_on(const weft_transport *tp) {
  setenv("WEFT_SHM_CMA_MIN_BYTES", "0", 1);
  setenv("WEFT_SHM_CMA", "on", 1); /* auto may keep the slots where single copy costs more */
  pair p;
  bool open = pair_open(&p, tp);
  unsetenv("WEFT_SHM_CMA_MIN_BYTES");
  unsetenv("WEFT_SHM_CMA");
  if (!open) {
    skip();
    return;
  }
  static unsigned char buf[5][CHUNK];
  for (uint32_t k = 0; k < 5; k++) {
    size_t bytes = k == 0 ? 8 : k == 1 ? 100 : CHUNK - k;
    fill(buf[k], bytes, 0, 50 + k);
    double deadline = harness_now() + 5;
    weft_status st;
    while ((st = tp->send_ready(p.tx[0])) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
    if (st || tp->send(p.tx[0], buf[k], bytes, 50 + k, &weft_mem_host, WEFT_SEND_FOR_COPY))
      fail_msg("%s: send for copy #%u: %s", tp->name, 50 + k, p.sink[0].msg);
    recv_one(&p, 0, 50 + k, bytes, k != 3);
    while (tp->send_idle(p.tx[0]) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
    assert_int_equal(tp->send_idle(p.tx[0]), WEFT_OK);
  }
  /* A run of chunks for copy, taken with recv (shm: the descriptors in one
   * read; tcp and ibv: a chunk at a time): every call takes at least one
   * whole chunk, never more than were sent, and they add up to the run. */
  static unsigned char run[4 * CHUNK], got[4 * CHUNK];
  int posted = tp->send_depth(p.ctx[0]) < 4 ? tp->send_depth(p.ctx[0]) : 4;
  size_t bytes = (size_t)(posted - 1) * CHUNK + CHUNK / 2 + 3, taken = 0;
  fill(run, bytes, 0, 60);
  memset(got, 0, sizeof got);
  for (size_t at = 0; at < bytes; at += CHUNK) {
    double deadline = harness_now() + 5;
    weft_status st;
    while ((st = tp->send_ready(p.tx[0])) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
    size_t len = bytes - at < CHUNK ? bytes - at : CHUNK;
    if (st || tp->send(p.tx[0], run + at, len, 60, &weft_mem_host, WEFT_SEND_FOR_COPY))
      fail_msg("%s: send for copy of the run at %zu: %s", tp->name, at, p.sink[0].msg);
  }
  double deadline = harness_now() + 5;
  while (taken < bytes && harness_now() < deadline) {
    size_t chunks = 0;
    weft_status st =
        tp->recv(p.rx[0], 60, CHUNK, bytes - taken, got + taken, &weft_mem_host, &chunks);
    if (st == WEFT_AGAIN) {
      drive(&p);
      continue;
    }
    if (st) fail_msg("%s: the run at %zu: %s", tp->name, taken, p.sink[1].msg);
    assert_true(chunks >= 1 && chunks <= (size_t)posted);
    for (size_t c = 0; c < chunks; c++) taken += bytes - taken < CHUNK ? bytes - taken : CHUNK;
  }
  assert_int_equal(taken, bytes);
  assert_memory_equal(got, run, bytes);
  while (tp->send_idle(p.tx[0]) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
  assert_int_equal(tp->send_idle(p.tx[0]), WEFT_OK);
  pair_close(&p);
}

static void for_copy_shm(void **state) {
  (void)state;
  for_copy_on(&weft_transport_shm);
}
static void for_copy_tcp(void **state) {
  (void)state;
  for_copy_on(&weft_transport_tcp);
}
#ifdef WEFT_HAVE_IBV
static void for_copy_ibv(void **state) {
  (void)state;
  for_copy_on(&weft_transport_ibv);
}
#endif

/* tcp writes a large chunk (TCP_DEFER_MIN, 64 KiB, and up) at the next
 * progress or send_idle, so that one sendmsg carries every chunk an
 * algorithm posted; a small one at once. Here: two large chunks posted and
 * the sender not driven, the receiver gets none of them; a small one on
 * the other channel arrives; then the sender's progress delivers both large
 * ones intact, and send_idle reports them complete. */
#define LARGE (64u << 10)
static void tcp_writes_large_chunks_at_progress(void **state) {
  (void)state;
  pair p;
  assert_true(pair_open_chunk(&p, &weft_transport_tcp, 2 * LARGE));
  const weft_transport *tp = p.tp;
  static unsigned char big[2][LARGE], got[LARGE], small[1000], small_got[1000];
  for (uint32_t k = 0; k < 2; k++) {
    fill(big[k], LARGE, 0, 70 + k);
    assert_int_equal(tp->send_ready(p.tx[0]), WEFT_OK);
    assert_int_equal(tp->send(p.tx[0], big[k], LARGE, 70 + k, &weft_mem_host, 0), WEFT_OK);
  }
  fill(small, sizeof small, 1, 80);
  assert_int_equal(tp->send(p.tx[1], small, sizeof small, 80, &weft_mem_host, 0), WEFT_OK);
  /* only the receiver moves: the small chunk arrives, the large ones do not */
  bool moved;
  weft_status st;
  double deadline = harness_now() + 5;
  while ((st = tp->recv(p.rx[1], 80, sizeof small, sizeof small, small_got, &weft_mem_host,
                        &(size_t){0})) == WEFT_AGAIN &&
         harness_now() < deadline)
    tp->progress(p.ctx[1], &moved);
  assert_int_equal(st, WEFT_OK);
  assert_memory_equal(small_got, small, sizeof small);
  for (double until = harness_now() + 0.05; harness_now() < until;) {
    tp->progress(p.ctx[1], &moved);
    assert_int_equal(tp->recv(p.rx[0], 70, LARGE, LARGE, got, &weft_mem_host, &(size_t){0}),
                     WEFT_AGAIN);
  }
  /* the sender's progress writes them */
  for (uint32_t k = 0; k < 2; k++) {
    deadline = harness_now() + 5;
    while ((st = tp->recv(p.rx[0], 70 + k, LARGE, LARGE, got, &weft_mem_host, &(size_t){0})) ==
               WEFT_AGAIN &&
           harness_now() < deadline)
      drive(&p);
    assert_int_equal(st, WEFT_OK);
    assert_memory_equal(got, big[k], LARGE);
  }
  deadline = harness_now() + 5;
  while ((st = tp->send_idle(p.tx[0])) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
  assert_int_equal(st, WEFT_OK);
  pair_close(&p);
}

/* WEFT_SEND_NOW: a large chunk on a pipeline's path, and the deferred one
 * posted before it, move at once: the receiver gets both with the sender
 * never driven again. */
static void tcp_writes_a_chunk_sent_now_at_once(void **state) {
  (void)state;
  pair p;
  assert_true(pair_open_chunk(&p, &weft_transport_tcp, 2 * LARGE));
  const weft_transport *tp = p.tp;
  static unsigned char big[2][LARGE], got[LARGE];
  for (uint32_t k = 0; k < 2; k++) {
    fill(big[k], LARGE, 0, 90 + k);
    assert_int_equal(tp->send_ready(p.tx[0]), WEFT_OK);
    assert_int_equal(
        tp->send(p.tx[0], big[k], LARGE, 90 + k, &weft_mem_host, k ? WEFT_SEND_NOW : 0u), WEFT_OK);
  }
  bool moved;
  for (uint32_t k = 0; k < 2; k++) {
    weft_status st;
    double deadline = harness_now() + 5;
    while ((st = tp->recv(p.rx[0], 90 + k, LARGE, LARGE, got, &weft_mem_host, &(size_t){0})) ==
               WEFT_AGAIN &&
           harness_now() < deadline)
      tp->progress(p.ctx[1], &moved);
    assert_int_equal(st, WEFT_OK);
    assert_memory_equal(got, big[k], LARGE);
  }
  pair_close(&p);
}

/* Rank 0 dials rank 1 and sends it a chunk; rank 1 never accepts (it
 * waits on a third rank, say). Rank 1 then hears of a failure elsewhere
 * (errors->origin), passes it on and ends. Rank 0, waiting on that
 * connection, must learn the first cause, not only that the connection was
 * reset when rank 1's listener closed with the dial in its queue. */
static void tcp_passes_a_failure_to_a_waiting_dial(void **state) {
  (void)state;
  pair p;
  assert_true(pair_init(&p, &weft_transport_tcp, CHUNK));
  const weft_transport *tp = p.tp;
  assert_true(tp->can_reach(p.ctx[0], 1, p.addr[1], p.alen[1], (char[128]){0}, 128));
  weft_tp_conn *conn;
  assert_int_equal(tp->connect(p.ctx[0], 1, WEFT_TP_CHANNEL_COLL, p.addr[1], p.alen[1], &conn),
                   WEFT_OK);
  static unsigned char chunk[CHUNK], reply[CHUNK];
  fill(chunk, sizeof chunk, 0, 1);
  weft_status st = tp->send_ready(conn);
  bool moved;
  for (double until = harness_now() + 5; st == WEFT_AGAIN && harness_now() < until;) {
    tp->progress(p.ctx[0], &moved);
    st = tp->send_ready(conn);
  }
  assert_int_equal(st, WEFT_OK);
  assert_int_equal(tp->send(conn, chunk, sizeof chunk, 1, &weft_mem_host, 0), WEFT_OK);
  snprintf(p.sink[1].origin, sizeof p.sink[1].origin, "rank 2 failed: its own cause");
  tp->abort_all(p.ctx[1], "rank 1 passes on: rank 2 failed: its own cause");
  tp->fini(p.ctx[1]);
  double deadline = harness_now() + 5;
  while ((st = tp->recv(conn, 1, sizeof reply, sizeof reply, reply, &weft_mem_host,
                        &(size_t){0})) == WEFT_AGAIN &&
         harness_now() < deadline)
    tp->progress(p.ctx[0], &moved);
  assert_int_equal(st, WEFT_ERR_PEER_LOST);
  if (!strstr(p.sink[0].msg, "its own cause"))
    fail_msg("rank 0 does not name the first cause: %s", p.sink[0].msg);
  tp->fini(p.ctx[0]);
  unsetenv("WEFT_TRANSPORT");
  weft_settings_reload();
}

static void probe_and_depth(void **state) {
  (void)state;
  const weft_transport *all[] = {&weft_transport_shm, &weft_transport_tcp,
#ifdef WEFT_HAVE_IBV
                                 &weft_transport_ibv
#endif
  };
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    char why[256] = "";
    weft_status st = all[i]->probe(why, sizeof why);
    printf("# %s probe: %s: %s\n", all[i]->name, weft_status_name(st), why);
    assert_true(st == WEFT_OK || st == WEFT_ERR_UNSUPPORTED);
    assert_true(why[0] != 0); /* a sentence either way */
    assert_int_equal(all[i]->abi_version, WEFT_TRANSPORT_ABI);
    /* every transport reads and writes host memory; none maps it from a peer */
    assert_true(all[i]->caps.send_kinds & WEFT_MEMORY_BIT(WEFT_MEMORY_HOST));
    assert_true(all[i]->caps.recv_kinds & WEFT_MEMORY_BIT(WEFT_MEMORY_HOST));
    assert_false(all[i]->caps.map_kinds & WEFT_MEMORY_BIT(WEFT_MEMORY_HOST));
  }
}

static void channels_shm(void **state) {
  (void)state;
  channels_on(&weft_transport_shm);
}
static void channels_tcp(void **state) {
  (void)state;
  channels_on(&weft_transport_tcp);
}
static void credits_shm(void **state) {
  (void)state;
  credits_on(&weft_transport_shm);
}
#ifdef WEFT_HAVE_IBV
static void channels_ibv(void **state) {
  (void)state;
  channels_on(&weft_transport_ibv);
}
static void credits_ibv(void **state) {
  (void)state;
  credits_on(&weft_transport_ibv);
}
#endif

/* send_released (optional): AGAIN while a chunk posted is not released,
 * however long the sender drives (send_idle may say OK long before: a copy
 * into a slot satisfies it), and while the receiver holds it peeked; OK once
 * every chunk is released. Where a transport leaves it NULL (tcp, ibv), a
 * sender that lends memory cannot learn when the peer is done with it, so
 * p2p.c never lends over it. */
static void released_shm(void **state) {
  (void)state;
  const weft_transport *tp = &weft_transport_shm;
  assert_non_null(tp->send_released);
  assert_null(weft_transport_tcp.send_released);
  pair p;
  if (!pair_open(&p, tp)) {
    skip();
    return;
  }
  static unsigned char buf[2][CHUNK];
  send_one(&p, 1, 0, 96, buf[0]);
  send_one(&p, 1, 1, 4096, buf[1]);
  for (int k = 0; k < 50; k++) drive(&p);
  assert_int_equal(tp->send_released(p.tx[1]), WEFT_AGAIN);
  const void *data = NULL;
  double deadline = harness_now() + 5;
  weft_status st;
  while ((st = tp->recv_peek(p.rx[1], 0, 96, &data)) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
  assert_int_equal(st, WEFT_OK);
  for (int k = 0; k < 50; k++) drive(&p);
  assert_int_equal(tp->send_released(p.tx[1]), WEFT_AGAIN); /* peeked, held */
  assert_int_equal(tp->recv_release(p.rx[1]), WEFT_OK);
  assert_int_equal(tp->send_released(p.tx[1]), WEFT_AGAIN); /* the second is not taken */
  recv_one(&p, 1, 1, 4096, false);
  while ((st = tp->send_released(p.tx[1])) == WEFT_AGAIN && harness_now() < deadline) drive(&p);
  assert_int_equal(st, WEFT_OK);
  pair_close(&p);
}
#ifdef WEFT_HAVE_IBV
static void released_ibv_absent(void **state) {
  (void)state;
  assert_null(weft_transport_ibv.send_released);
}
#endif

/* shm maps what a peer registered as SHARED, from the descriptor alone, and
 * refuses what it cannot map with a status that says which refusal. */
static void registration_shm(void **state) {
  (void)state;
  pair p;
  assert_true(pair_open(&p, &weft_transport_shm));
  const weft_transport *tp = p.tp;
  uint32_t *buf = NULL;
  assert_int_equal(weft_mem_alloc(1 << 16, (void **)&buf), WEFT_OK);
  for (int i = 0; i < 1 << 14; i++) buf[i] = (uint32_t)i * 2654435761u;
  weft_tp_mem h;
  weft_mem_desc d;
  weft_mem_region r = {.kind = WEFT_MEMORY_SHARED, .ptr = buf + 16, .bytes = 4096, .dmabuf_fd = -1};
  assert_int_equal(tp->register_mem(p.ctx[0], &r, &h, &d), WEFT_OK);
  assert_int_equal(h.region.kind, WEFT_MEMORY_SHARED);
  assert_int_equal(d.kind, WEFT_MEMORY_SHARED);
  assert_int_equal(d.version, WEFT_MEM_DESC_VERSION);
  assert_int_equal(d.len, 4096);
  void *local = NULL;
  assert_int_equal(tp->map_peer_mem(p.rx[0], &d, &local), WEFT_OK);
  assert_ptr_not_equal(local, buf + 16); /* its own mapping of the same pages */
  assert_memory_equal(local, buf + 16, 4096);
  ((uint32_t *)local)[3] = 0xfeedbeef;
  assert_int_equal(buf[19], 0xfeedbeef);
  /* the same buffer through the other channel: a mapping of that connection */
  void *local1 = NULL;
  assert_int_equal(tp->map_peer_mem(p.rx[1], &d, &local1), WEFT_OK);
  assert_int_equal(((uint32_t *)local1)[3], 0xfeedbeef);
  /* release_peer_mem closes device memory only: a SHARED mapping outlives
   * its owner's unmapping, so it stays, even with kept_too */
  tp->release_peer_mem(p.rx[0], false);
  tp->release_peer_mem(p.rx[0], true);
  ((uint32_t *)local)[4] = 0xabad1dea;
  assert_int_equal(buf[20], 0xabad1dea);
  void *again = NULL;
  assert_int_equal(tp->map_peer_mem(p.rx[0], &d, &again), WEFT_OK);
  assert_ptr_equal(again, local); /* still the cached mapping */
  tp->deregister_mem(p.ctx[0], &h);
  assert_int_equal(h.region.kind, WEFT_MEMORY_COUNT);

  /* what shm cannot register or map */
  static uint32_t plain[1024];
  weft_mem_region host = {
      .kind = WEFT_MEMORY_HOST, .ptr = plain, .bytes = sizeof plain, .dmabuf_fd = -1};
  assert_int_equal(tp->register_mem(p.ctx[0], &host, &h, &d), WEFT_ERR_UNSUPPORTED);
  tp->deregister_mem(p.ctx[0], &h); /* a refused handle: no-op */
  weft_mem_region not_alloc = {
      .kind = WEFT_MEMORY_SHARED, .ptr = plain, .bytes = sizeof plain, .dmabuf_fd = -1};
  assert_int_equal(tp->register_mem(p.ctx[0], &not_alloc, &h, &d), WEFT_ERR_INVALID);
  assert_non_null(strstr(p.sink[0].msg, "weft_mem_alloc"));
  weft_mem_region beyond = {
      .kind = WEFT_MEMORY_SHARED, .ptr = buf, .bytes = (1 << 16) + 4096, .dmabuf_fd = -1};
  assert_int_equal(tp->register_mem(p.ctx[0], &beyond, &h, &d), WEFT_ERR_INVALID);
  assert_int_equal(tp->register_mem(p.ctx[0], &r, &h, &d), WEFT_OK);
  weft_mem_desc bad = d;
  bad.kind = WEFT_MEMORY_DEVICE;
  assert_int_equal(tp->map_peer_mem(p.rx[0], &bad, &local), WEFT_ERR_UNSUPPORTED);
  bad = d;
  bad.version = WEFT_MEM_DESC_VERSION + 1;
  assert_int_equal(tp->map_peer_mem(p.rx[0], &bad, &local), WEFT_ERR_PROTOCOL);
  bad = d;
  bad.body_len = 3;
  assert_int_equal(tp->map_peer_mem(p.rx[0], &bad, &local), WEFT_ERR_PROTOCOL);
  bad = d;
  bad.len = 1ull << 40; /* more than the peer's memfd holds */
  assert_int_equal(tp->map_peer_mem(p.rx[0], &bad, &local), WEFT_ERR_PROTOCOL);
  /* a failed map leaves the connection usable */
  static unsigned char msg[64];
  send_one(&p, 0, 5, 64, msg);
  recv_one(&p, 0, 5, 64, false);
  assert_int_equal(weft_mem_free(buf), WEFT_OK);
  pair_close(&p);
}

/* The transports that cannot map refuse every kind through the stub. */
static void registration_refused(void **state) {
  (void)state;
  const weft_transport *none[] = {&weft_transport_tcp,
#ifdef WEFT_HAVE_IBV
                                  &weft_transport_ibv
#endif
  };
  static uint32_t plain[1024];
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    assert_int_equal(none[i]->caps.map_kinds, 0);
    for (int k = 0; k < WEFT_MEMORY_COUNT; k++) {
      weft_mem_region r = {
          .kind = (weft_memory)k, .ptr = plain, .bytes = sizeof plain, .dmabuf_fd = -1};
      weft_tp_mem h;
      weft_mem_desc d;
      memset(&d, 0, sizeof d);
      assert_int_equal(none[i]->register_mem(NULL, &r, &h, &d), WEFT_ERR_UNSUPPORTED);
      none[i]->deregister_mem(NULL, &h);
      void *local = plain;
      assert_int_equal(none[i]->map_peer_mem(NULL, &d, &local), WEFT_ERR_UNSUPPORTED);
      assert_null(local);
      none[i]->release_peer_mem(NULL, true); /* nothing mapped: nothing to do */
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(probe_and_depth),
      cmocka_unit_test(channels_shm),
      cmocka_unit_test(channels_tcp),
      cmocka_unit_test(credits_shm),
      cmocka_unit_test(released_shm),
#ifdef WEFT_HAVE_IBV
      cmocka_unit_test(channels_ibv),
      cmocka_unit_test(credits_ibv),
      cmocka_unit_test(released_ibv_absent),
#endif
      cmocka_unit_test(registration_shm),
      cmocka_unit_test(registration_refused),
      cmocka_unit_test(for_copy_shm),
      cmocka_unit_test(for_copy_tcp),
#ifdef WEFT_HAVE_IBV
      cmocka_unit_test(for_copy_ibv),
#endif
      cmocka_unit_test(tcp_writes_large_chunks_at_progress),
      cmocka_unit_test(tcp_writes_a_chunk_sent_now_at_once),
      cmocka_unit_test(tcp_passes_a_failure_to_a_waiting_dial),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
