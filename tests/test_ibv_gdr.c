/* test_ibv_gdr.c - GPUDirect RDMA on the verbs transport's device channel,
 * over the verbs emulator (WEFT_IB_LIBRARY) and the CUDA stand-in
 * (WEFT_CUDA_LIBRARY), both set by meson. Two ranks of one communicator in
 * one process, one thread driving both. Each case sends chunks of device
 * memory with random sizes and contents and checks every byte on arrival,
 * through the device pointer recv_peek hands over and through recv into a
 * device buffer:
 *  - registered (dma-buf): the NIC reads the sender's buffer and writes the
 *    receiver's GPU ring, nothing copied through host memory, and the flush
 *    read is what makes the data visible (the emulator holds a write into
 *    GPU memory until a read flushes it, as PCIe may);
 *  - without the flush (WEFT_IB_GDR_FLUSH=0) the data handed over is stale;
 *  - refused (the emulator's no_dmabuf, WEFT_IB_GDR=off): both ends stage,
 *    one warning, same results;
 *  - a buffer freed and allocated again is registered again, never found
 *    stale in the cache; every registration and exported fd is released at
 *    fini (the emulator's and the stand-in's counts). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cuda_emu/cuda_emu.h"
#include "harness.h"
#include "ibv_emu/ibv_emu.h"
#include "src/base/auth.h"
#include "src/base/net.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "src/mem/mem.h"
#include "src/topo/select.h"
#include "transports/ibv/ibv.h"

static const weft_mem_ops *dev;

static ibv_emu_counters emu_now(void) {
  ibv_emu_counters c;
  memset(&c, 0, sizeof c);
  void *h = dlopen(getenv("WEFT_IB_LIBRARY"), RTLD_NOW); /* the instance weft loads */
  ibv_emu_stats_fn fn = h ? (ibv_emu_stats_fn)dlsym(h, "ibv_emu_stats") : NULL;
  assert_non_null(fn);
  fn(&c);
  return c;
}

static weft_cuda_emu_counters cuda_now(void) {
  weft_cuda_emu_counters c;
  memset(&c, 0, sizeof c);
  void *h = dlopen(getenv("WEFT_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  weft_cuda_emu_counts_fn fn = h ? (weft_cuda_emu_counts_fn)dlsym(h, "weft_cuda_emu_counts") : NULL;
  assert_non_null(fn);
  fn(&c);
  return c;
}

typedef struct pair {
  weft_transport_init_args args[2];
  weft_tp_ctx *ctx[2];
  weft_error_sink sink[2];
  weft_place place;
  weft_auth_key key;
  weft_tp_conn *tx, *rx; /* rank 0 -> 1 on the device channel */
  weft_mem_stream *stream[2];
} pair;

static void drive(pair *p) {
  bool moved;
  weft_transport_ibv.progress(p->ctx[1], &moved);
  weft_transport_ibv.progress(p->ctx[0], &moved);
}

static void pair_open(pair *p, size_t chunk_bytes) {
  setenv("WEFT_TRANSPORT", "ibv", 1);
  weft_settings_reload();
  memset(p, 0, sizeof *p);
  weft_place_here(NULL, &p->place);
  weft_auth_key_for_job(NULL, 0, &p->key);
  uint8_t addr[2][WEFT_TRANSPORT_ADDR_MAX];
  size_t alen[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(dev->stream_create(&p->stream[r], &p->sink[r]), WEFT_OK);
    p->args[r] = (weft_transport_init_args){.rank = r,
                                            .size = 2,
                                            .comm_id = 0x4744,
                                            .chunk_bytes = chunk_bytes,
                                            .timeout_s = 5,
                                            .wake_fd = -1,
                                            .errors = &p->sink[r],
                                            .place = &p->place,
                                            .auth = &p->key,
                                            .local_size = 2,
                                            .device = 0,
                                            .device_stream = p->stream[r]};
    struct sockaddr_in *lo = (struct sockaddr_in *)&p->args[r].local_addr;
    lo->sin_family = AF_INET;
    lo->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    p->args[r].local_addr_len = sizeof *lo;
    assert_int_equal(weft_transport_ibv.init(&p->args[r], &p->ctx[r], addr[r], &alen[r]), WEFT_OK);
  }
  assert_int_equal(
      weft_transport_ibv.connect(p->ctx[1], 0, WEFT_TP_CHANNEL_DEVICE, addr[0], alen[0], &p->rx),
      WEFT_OK);
  assert_int_equal(
      weft_transport_ibv.connect(p->ctx[0], 1, WEFT_TP_CHANNEL_DEVICE, addr[1], alen[1], &p->tx),
      WEFT_OK);
  double deadline = harness_now() + 5;
  while (weft_transport_ibv.send_ready(p->tx) == WEFT_AGAIN && harness_now() < deadline) drive(p);
  assert_int_equal(weft_transport_ibv.send_ready(p->tx), WEFT_OK);
}

static void pair_close(pair *p) {
  for (int i = 0; i < 200 && weft_transport_ibv.send_idle(p->tx) == WEFT_AGAIN; i++) drive(p);
  weft_transport_ibv.fini(p->ctx[0]);
  weft_transport_ibv.fini(p->ctx[1]);
  dev->stream_destroy(p->stream[0]);
  dev->stream_destroy(p->stream[1]);
}

static void to_host(pair *p, void *host, const void *device, size_t bytes) {
  weft_mem_token t = 0;
  assert_int_equal(dev->copy_to_host(host, device, bytes, p->stream[1], &t), WEFT_OK);
  weft_status st;
  while ((st = dev->poll(p->stream[1], t)) == WEFT_AGAIN) {
  }
  assert_int_equal(st, WEFT_OK);
}

static void *device_with(pair *p, const void *host, size_t bytes) {
  void *d = dev->alloc_on(0, bytes);
  assert_non_null(d);
  weft_mem_token t = 0;
  assert_int_equal(dev->copy_from_host(d, host, bytes, p->stream[0], &t), WEFT_OK);
  while (dev->poll(p->stream[0], t) == WEFT_AGAIN) {
  }
  return d;
}

/* `n` chunks of random sizes from one device buffer, half taken by
 * recv_peek (the device pointer, read back to the host), half by recv into
 * a device buffer. The number of chunks whose bytes differ. */
static int send_chunks(pair *p, void *src_dev, const unsigned char *src, size_t chunk_bytes, int n,
                       uint64_t seed) {
  unsigned char *got = malloc(chunk_bytes);
  void *dst_dev = dev->alloc_on(0, chunk_bytes);
  assert_non_null(dst_dev);
  int wrong = 0;
  for (int k = 0; k < n; k++) {
    uint64_t x = harness_seed(seed, k, 0);
    size_t bytes = 1 + (size_t)(x % chunk_bytes),
           off = (size_t)(x >> 20) % (chunk_bytes - bytes + 1);
    weft_tag tag = weft_tag_make((uint32_t)k, 0x5eed);
    double deadline = harness_now() + 5;
    weft_status st;
    while ((st = weft_transport_ibv.send_ready(p->tx)) == WEFT_AGAIN && harness_now() < deadline)
      drive(p);
    assert_int_equal(st, WEFT_OK);
    if (weft_transport_ibv.send(p->tx, (const char *)src_dev + off, bytes, tag, dev, 0) != WEFT_OK)
      fail_msg("send %d: %s", k, p->sink[0].msg);
    if (k % 2 == 0) {
      const void *data = NULL;
      while ((st = weft_transport_ibv.recv_peek(p->rx, tag, bytes, &data)) == WEFT_AGAIN &&
             harness_now() < deadline)
        drive(p);
      if (st != WEFT_OK) fail_msg("recv_peek %d: %s", k, p->sink[1].msg);
      assert_int_equal(dev->kind, weft_mem_kind_of(data, NULL)); /* handed over in GPU memory */
      to_host(p, got, data, bytes);
      assert_int_equal(weft_transport_ibv.recv_release(p->rx), WEFT_OK);
    } else {
      size_t chunks = 0;
      while ((st = weft_transport_ibv.recv(p->rx, tag, bytes, bytes, dst_dev, dev, &chunks)) ==
                 WEFT_AGAIN &&
             harness_now() < deadline)
        drive(p);
      if (st != WEFT_OK) fail_msg("recv %d: %s", k, p->sink[1].msg);
      assert_int_equal(chunks, 1);
      to_host(p, got, dst_dev, bytes);
    }
    if (memcmp(got, src + off, bytes)) {
      size_t at = 0;
      while (got[at] == src[off + at]) at++;
      if (getenv("WEFT_TEST_VERBOSE"))
        printf("# chunk %d (%zu bytes at %zu, %s): first wrong byte %zu: %02x, not %02x\n", k,
               bytes, off, k % 2 ? "recv" : "peek", at, got[at], src[off + at]);
      wrong++;
    }
  }
  dev->free_scratch(dst_dev);
  free(got);
  return wrong;
}

static void *random_device(pair *p, unsigned char **host, size_t bytes, uint64_t seed) {
  *host = malloc(bytes);
  harness_fill(*host, bytes / 4, WEFT_I32, WEFT_SUM, seed);
  return device_with(p, *host, bytes);
}

/* dma-buf registration: the NIC at both ends, flushed; the cache finds the
 * source's registration after the first chunk. */
static void registered_both_ends(void **state) {
  (void)state;
  ibv_emu_counters e0 = emu_now();
  weft_cuda_emu_counters c0 = cuda_now();
  pair p;
  size_t chunk = 65536;
  pair_open(&p, chunk);
  ibv_conn *rx = (ibv_conn *)p.rx, *tx = (ibv_conn *)p.tx;
  assert_non_null(rx->rx_dev); /* the receiver's ring is GPU memory the NIC writes */
  assert_non_null(rx->flush_qp);
  assert_true(tx->r_gdr);
  unsigned char *src;
  void *src_dev = random_device(&p, &src, 4 * chunk, 31);
  assert_int_equal(send_chunks(&p, src_dev, src, chunk, 40, 32), 0);
  ibv_ctx *ctx0 = (ibv_ctx *)p.ctx[0];
  assert_int_equal(tx->staged_sends, 0); /* every chunk straight from the GPU */
  assert_int_equal(ctx0->gdr.misses, 2); /* its ring and the source buffer */
  assert_true(ctx0->gdr.hits >= 39);
  ibv_emu_counters e1 = emu_now();
  printf("# 40 chunks GPU to GPU: %llu flush reads, %llu bytes made visible by them\n",
         (unsigned long long)(e1.flushes - e0.flushes),
         (unsigned long long)(e1.pending_applied_bytes - e0.pending_applied_bytes));
  assert_true(e1.flushes > e0.flushes);
  /* what a registered buffer costs a chunk: the cache's lookup (one pointer
   * query of the driver, here the stand-in's, and a scan of the entries) */
  int lookups = 20000;
  double t0 = harness_now();
  for (int i = 0; i < lookups; i++) {
    ibv_gdr_entry *e = NULL;
    assert_int_equal(ibv_gdr_get(&ctx0->gdr, (char *)src_dev + i % 1000, 4096, &e), WEFT_OK);
    ibv_gdr_put(&ctx0->gdr, e);
  }
  printf(
      "# registration cache: %.2f us per lookup of a registered buffer (%d lookups, 2 entries)\n",
      (harness_now() - t0) * 1e6 / lookups, lookups);
  /* freed and allocated again: a new buffer ID, a new registration */
  dev->free_scratch(src_dev);
  unsigned char *src2;
  void *src2_dev = random_device(&p, &src2, 4 * chunk, 33);
  assert_int_equal(send_chunks(&p, src2_dev, src2, chunk, 6, 34), 0);
  assert_int_equal(ctx0->gdr.misses, 3);
  pair_close(&p);
  dev->free_scratch(src2_dev);
  free(src);
  free(src2);
  ibv_emu_counters e2 = emu_now();
  weft_cuda_emu_counters c2 = cuda_now();
  assert_int_equal(e2.mrs_live, e0.mrs_live);
  assert_int_equal(e2.dmabuf_mrs_live, e0.dmabuf_mrs_live);
  assert_int_equal(c2.dmabuf_open, c0.dmabuf_open);
  assert_int_equal(c2.allocations, c0.allocations);
  printf("# after fini: %llu MRs, %llu dma-buf MRs, %d exported fds open (as before)\n",
         (unsigned long long)e2.mrs_live, (unsigned long long)e2.dmabuf_mrs_live, c2.dmabuf_open);
}

/* Without the flush, a kernel (here: the copy back) reads the GPU ring
 * before the NIC's writes are visible. */
static void missing_flush_is_stale(void **state) {
  (void)state;
  setenv("WEFT_IB_GDR_FLUSH", "0", 1);
  pair p;
  size_t chunk = 65536;
  pair_open(&p, chunk);
  assert_null(((ibv_conn *)p.rx)->flush_qp);
  unsigned char *src;
  void *src_dev = random_device(&p, &src, 4 * chunk, 41);
  int wrong = send_chunks(&p, src_dev, src, chunk, 8, 42);
  printf("# without the flush: %d of 8 chunks stale\n", wrong);
  assert_true(wrong > 0);
  pair_close(&p);
  dev->free_scratch(src_dev);
  free(src);
  unsetenv("WEFT_IB_GDR_FLUSH");
  weft_settings_reload();
}

/* Registration refused (run with IBV_EMU_CONFIG=no_dmabuf: a NIC without
 * dma-buf) or turned off (WEFT_IB_GDR=off otherwise): each end stages by
 * itself, and every byte is still right. */
static void staged_when_refused(void **state) {
  (void)state;
  const char *cfg = getenv("IBV_EMU_CONFIG");
  bool refused = cfg && strstr(cfg, "no_dmabuf");
  if (!refused) setenv("WEFT_IB_GDR", "off", 1);
  pair p;
  size_t chunk = 16384;
  pair_open(&p, chunk);
  ibv_conn *rx = (ibv_conn *)p.rx, *tx = (ibv_conn *)p.tx;
  assert_null(rx->rx_dev);
  assert_non_null(rx->rx_mirror);
  assert_false(tx->r_gdr);
  unsigned char *src;
  void *src_dev = random_device(&p, &src, 4 * chunk, 51);
  assert_int_equal(send_chunks(&p, src_dev, src, chunk, 20, 52), 0);
  assert_int_equal(tx->staged_sends, 20);
  printf("# %s: 20 chunks staged at both ends, all right\n",
         refused ? "the NIC refuses dma-buf" : "WEFT_IB_GDR=off");
  pair_close(&p);
  dev->free_scratch(src_dev);
  free(src);
  unsetenv("WEFT_IB_GDR");
  weft_settings_reload();
}

int main(void) {
  if (!getenv("WEFT_IB_LIBRARY") || !getenv("WEFT_CUDA_LIBRARY")) {
    fprintf(stderr, "WEFT_IB_LIBRARY and WEFT_CUDA_LIBRARY must name the emulator and stand-in\n");
    return 1;
  }
  dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
  if (!dev) {
    fprintf(stderr, "the CUDA stand-in is not usable\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(registered_both_ends),
      cmocka_unit_test(missing_flush_is_stale),
      cmocka_unit_test(staged_when_refused),
  };
  if (getenv("WEFT_TEST_FILTER")) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
