/* test_device_table.c - the device memory table (src/cuda/cuda_mem.c) on
 * the CUDA stand-in (tests/cuda_emu, WEFT_CUDA_LIBRARY): what a pointer
 * is; the kernels every dtype x op launches through the driver against the
 * host kernels; the asynchronous reduction and its token, which completes
 * only when the stand-in ran the work; and that a communicator gives back
 * every stream, event and buffer of its device calls at weft_comm_destroy. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_emu/cuda_emu.h"
#include "harness.h"
#include "src/base/error_sink.h"
#include "src/base/status.h"
#include "src/cuda/cuda_api.h"
#include "src/cuda/cuda_mem.h"
#include "src/mem/mem.h"
#include "src/mem/reduce.h"

#define N 5003

static uint64_t rng = 88172645463325252ull;

static weft_cuda_emu_counters counts(void) {
  weft_cuda_emu_counters c = {0};
  void *h = dlopen(getenv("WEFT_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  weft_cuda_emu_counts_fn fn = h ? (weft_cuda_emu_counts_fn)dlsym(h, "weft_cuda_emu_counts") : NULL;
  if (fn) fn(&c);
  if (h) dlclose(h);
  return c;
}

static void usable(void **state) {
  (void)state;
  char why[512];
  if (!weft_cuda_usable(why, sizeof why)) fail_msg("the stand-in is not usable: %s", why);
  void *d = weft_mem_device.alloc_scratch(64);
  assert_non_null(d);
  int ordinal = -1, host_var = 0;
  assert_int_equal(weft_mem_kind_of(d, &ordinal), WEFT_MEMORY_DEVICE);
  assert_int_equal(ordinal, 0);
  assert_int_equal(weft_mem_kind_of(&host_var, NULL), WEFT_MEMORY_HOST);
  assert_ptr_equal(weft_mem_for(d), &weft_mem_device);
  assert_ptr_equal(weft_mem_for(&host_var), &weft_mem_host);
  weft_mem_device.free_scratch(d);
}

/* Host data up to the device and back, through a stream, waited for. */
static void put(weft_mem_stream *s, void *dev, const void *host, size_t bytes) {
  weft_mem_token t;
  assert_int_equal(weft_mem_device.copy_from_host(dev, host, bytes, s, &t), WEFT_OK);
  weft_status st;
  while ((st = weft_mem_device.poll(s, t)) == WEFT_AGAIN) {
  }
  assert_int_equal(st, WEFT_OK);
}

static void get(weft_mem_stream *s, void *host, const void *dev, size_t bytes) {
  weft_mem_token t;
  assert_int_equal(weft_mem_device.copy_to_host(host, dev, bytes, s, &t), WEFT_OK);
  weft_status st;
  while ((st = weft_mem_device.poll(s, t)) == WEFT_AGAIN) {
  }
  assert_int_equal(st, WEFT_OK);
}

static void kernels_equal_host(void **state) {
  (void)state;
  weft_error_sink errors = {0};
  weft_mem_stream *s;
  assert_int_equal(weft_cuda_stream_create(0, &s, &errors), WEFT_OK);
  int bad = 0;
  for (int dt = 0; dt < WEFT_DTYPE_COUNT; dt++) {
    size_t esz = weft_dtype_size((weft_dtype)dt), bytes = N * esz;
    unsigned char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
    /* small values: sums, products and means stay in every dtype's range */
    for (size_t i = 0; i < N; i++) {
      double x = (double)(harness_rng(&rng) % 9) - 4, y = (double)(harness_rng(&rng) % 9) - 4;
      if (dt == WEFT_U8) x = x < 0 ? -x : x, y = y < 0 ? -y : y;
      float fx = (float)x, fy = (float)y;
      switch (dt) {
        case WEFT_F32: ((float *)a)[i] = fx, ((float *)b)[i] = fy; break;
        case WEFT_F64: ((double *)a)[i] = x, ((double *)b)[i] = y; break;
        case WEFT_F16: ((uint16_t *)a)[i] = 0x3c00 + (uint16_t)(harness_rng(&rng) % 2048), ((uint16_t *)b)[i] = 0xbc00 + (uint16_t)(harness_rng(&rng) % 2048); break;
        case WEFT_BF16: ((uint16_t *)a)[i] = 0x3f80 + (uint16_t)(harness_rng(&rng) % 128), ((uint16_t *)b)[i] = 0x4000 + (uint16_t)(harness_rng(&rng) % 128); break;
        case WEFT_I8: ((int8_t *)a)[i] = (int8_t)x, ((int8_t *)b)[i] = (int8_t)y; break;
        case WEFT_U8: ((uint8_t *)a)[i] = (uint8_t)x, ((uint8_t *)b)[i] = (uint8_t)y; break;
        case WEFT_I32: ((int32_t *)a)[i] = (int32_t)harness_rng(&rng), ((int32_t *)b)[i] = (int32_t)harness_rng(&rng); break;
        case WEFT_I64: ((int64_t *)a)[i] = (int64_t)harness_rng(&rng), ((int64_t *)b)[i] = (int64_t)harness_rng(&rng); break;
      }
    }
    void *da = weft_mem_device.alloc_scratch(bytes), *db = weft_mem_device.alloc_scratch(bytes);
    void *dd = weft_mem_device.alloc_scratch(bytes);
    assert_true(da && db && dd);
    put(s, da, a, bytes);
    put(s, db, b, bytes);
    for (int op = 0; op < WEFT_OP_COUNT; op++) {
      int postdiv = op == WEFT_AVG ? 3 : 1;
      weft_reduce_kernel(want, a, b, N, (weft_dtype)dt, (weft_op)op, postdiv);
      weft_mem_device.reduce(dd, da, db, N, (weft_dtype)dt, (weft_op)op, postdiv);
      get(s, got, dd, bytes);
      if (memcmp(want, got, bytes) && bad++ < 8)
        fprintf(stderr, "%s %s: the device's result differs from the host's\n",
                weft_dtype_name((weft_dtype)dt), weft_op_name((weft_op)op));
      /* the same, queued on the stream: done only once its token is */
      memset(got, 0, bytes);
      put(s, dd, got, bytes);
      weft_mem_token t;
      assert_int_equal(weft_mem_device.reduce_async(dd, da, db, N, (weft_dtype)dt, (weft_op)op,
                                                    postdiv, s, &t),
                       WEFT_OK);
      weft_status st;
      while ((st = weft_mem_device.poll(s, t)) == WEFT_AGAIN) {
      }
      assert_int_equal(st, WEFT_OK);
      get(s, got, dd, bytes);
      if (memcmp(want, got, bytes) && bad++ < 8)
        fprintf(stderr, "%s %s (queued): the device's result differs from the host's\n",
                weft_dtype_name((weft_dtype)dt), weft_op_name((weft_op)op));
    }
    /* the avg's division and scale */
    weft_reduce_finish(want, a, N, (weft_dtype)dt, WEFT_AVG, 3);
    weft_mem_device.finish(dd, da, N, (weft_dtype)dt, WEFT_AVG, 3);
    get(s, got, dd, bytes);
    if (memcmp(want, got, bytes) && bad++ < 8)
      fprintf(stderr, "%s finish: differs\n", weft_dtype_name((weft_dtype)dt));
    memcpy(want, a, bytes);
    weft_mem_host.scale(want, N, (weft_dtype)dt, 0.5);
    weft_mem_device.scale(da, N, (weft_dtype)dt, 0.5);
    get(s, got, da, bytes);
    if (memcmp(want, got, bytes) && bad++ < 8)
      fprintf(stderr, "%s scale: differs\n", weft_dtype_name((weft_dtype)dt));
    weft_mem_device.free_scratch(da);
    weft_mem_device.free_scratch(db);
    weft_mem_device.free_scratch(dd);
    free(a), free(b), free(want), free(got);
  }
  weft_cuda_stream_destroy(s);
  if (bad) fail_msg("%d results of the device kernels differ from the host kernels", bad);
}

/* Small values of dtype `dt`: sums, products and means of a few stay in
 * range. */
static void fill_small(unsigned char *buf, size_t count, int dt) {
  for (size_t i = 0; i < count; i++) {
    double x = (double)(harness_rng(&rng) % 9) - 4;
    switch (dt) {
      case WEFT_F32: ((float *)buf)[i] = (float)x; break;
      case WEFT_F64: ((double *)buf)[i] = x; break;
      case WEFT_F16: ((uint16_t *)buf)[i] = (uint16_t)(0x3800 + harness_rng(&rng) % 2048); break;
      case WEFT_BF16: ((uint16_t *)buf)[i] = (uint16_t)(0x3f00 + harness_rng(&rng) % 256); break;
      case WEFT_I8: ((int8_t *)buf)[i] = (int8_t)x; break;
      case WEFT_U8: ((uint8_t *)buf)[i] = (uint8_t)(x < 0 ? -x : x); break;
      case WEFT_I32: ((int32_t *)buf)[i] = (int32_t)harness_rng(&rng); break;
      case WEFT_I64: ((int64_t *)buf)[i] = (int64_t)harness_rng(&rng); break;
    }
  }
}

/* The direct allreduce's one pass (reduce_all_async, weft_k_direct_X) gives
 * the bits of the pairwise host steps in the same order, in every output,
 * for every dtype and op, 2 to 8 members, 16-byte aligned buffers (the
 * kernel's 16-byte loads, which the stand-in checks it may take) and
 * buffers one element off (element by element), counts with a tail, and in
 * place (member 0's output is its input). */
static void one_pass_equals_pairwise(void **state) {
  (void)state;
  weft_error_sink errors = {0};
  weft_mem_stream *s;
  assert_int_equal(weft_cuda_stream_create(0, &s, &errors), WEFT_OK);
  int bad = 0, runs = 0;
  const int members[] = {2, 3, 4, 8};
  for (int dt = 0; dt < WEFT_DTYPE_COUNT; dt++) {
    size_t esz = weft_dtype_size((weft_dtype)dt);
    for (int mi = 0; mi < 4; mi++) {
      int n = members[mi];
      for (int shift = 0; shift < 2; shift++) {
        size_t count = 1000 + (size_t)shift * 37, bytes = (count + 1) * esz;
        unsigned char *in[8], *want = malloc(bytes), *got = malloc(bytes);
        void *din[8], *dout[8];
        for (int p = 0; p < n; p++) {
          in[p] = malloc(bytes);
          fill_small(in[p], count + 1, dt);
          din[p] = weft_mem_device.alloc_scratch(bytes);
          dout[p] = p == 0 ? din[0] : weft_mem_device.alloc_scratch(bytes); /* member 0 in place */
        }
        for (int op = 0; op < WEFT_OP_COUNT; op++) {
          int postdiv = op == WEFT_AVG ? n : 1;
          /* the host's pairwise steps, as direct_reduce makes them */
          weft_reduce_kernel(want, in[0] + shift * esz, in[1] + shift * esz, count, (weft_dtype)dt,
                             (weft_op)op, n == 2 ? postdiv : 1);
          for (int p = 2; p < n; p++)
            weft_reduce_kernel(want, want, in[p] + shift * esz, count, (weft_dtype)dt, (weft_op)op,
                               p == n - 1 ? postdiv : 1);
          void *outs[8];
          const void *ins[8];
          for (int p = 0; p < n; p++) {
            put(s, din[p], in[p], bytes);
            ins[p] = (char *)din[p] + shift * esz;
            outs[p] = (char *)dout[p] + shift * esz;
          }
          weft_mem_token t;
          assert_int_equal(weft_mem_device.reduce_all_async(outs, ins, n, count, (weft_dtype)dt,
                                                            (weft_op)op, postdiv, s, &t),
                           WEFT_OK);
          weft_status st;
          while ((st = weft_mem_device.poll(s, t)) == WEFT_AGAIN) {
          }
          assert_int_equal(st, WEFT_OK);
          for (int p = 0; p < n; p++) {
            get(s, got, outs[p], count * esz);
            runs++;
            if (memcmp(want, got, count * esz) && bad++ < 8)
              fprintf(stderr, "%s %s, %d members, %s: output %d differs from the pairwise steps\n",
                      weft_dtype_name((weft_dtype)dt), weft_op_name((weft_op)op), n,
                      shift ? "one element off" : "aligned", p);
          }
        }
        for (int p = 0; p < n; p++) {
          if (p) weft_mem_device.free_scratch(dout[p]);
          weft_mem_device.free_scratch(din[p]);
          free(in[p]);
        }
        free(want), free(got);
      }
    }
  }
  weft_cuda_stream_destroy(s);
  if (bad) fail_msg("%d of %d outputs of the one pass differ from the pairwise steps", bad, runs);
}

/* One rank: a device allreduce makes the communicator's stream and its
 * events; destroy gives every one back, and the pool's pinned buffers. */
static void destroy_gives_back(void **state) {
  (void)state;
  weft_cuda_emu_counters before = counts();
  weft_unique_id id;
  assert_int_equal(weft_get_unique_id(&id), WEFT_OK);
  weft_comm *comm;
  assert_int_equal(weft_comm_init_rank(&comm, &id, 0, 1), WEFT_OK);
  float *d = weft_mem_device.alloc_scratch(1000 * sizeof(float));
  float host[1000], back[1000];
  for (int i = 0; i < 1000; i++) host[i] = (float)i;
  weft_error_sink errors = {0};
  weft_mem_stream *s;
  assert_int_equal(weft_cuda_stream_create(0, &s, &errors), WEFT_OK);
  put(s, d, host, sizeof host);
  assert_int_equal(weft_allreduce(comm, d, d, 1000, WEFT_F32, WEFT_SUM), WEFT_OK);
  get(s, back, d, sizeof back);
  assert_memory_equal(back, host, sizeof host);
  weft_cuda_stream_destroy(s);
  weft_cuda_emu_counters during = counts();
  assert_true(during.streams > before.streams); /* the communicator's own */
  assert_int_equal(weft_comm_destroy(comm), WEFT_OK);
  weft_mem_device.free_scratch(d);
  weft_cuda_emu_counters after = counts();
  assert_int_equal(after.streams, before.streams);
  assert_int_equal(after.events, before.events);
  assert_int_equal(after.allocations, before.allocations);
  assert_int_equal(after.host_allocations, before.host_allocations);
  assert_int_equal(after.pending, 0);
}

/* A buffer shorter than the count: the copy off the device faults (an
 * illegal address, as on a GPU), and the call fails with the driver's words
 * instead of crashing or waiting. Last: the fault stays with the context. */
static void illegal_address_fails_the_call(void **state) {
  (void)state;
  weft_unique_id id;
  assert_int_equal(weft_get_unique_id(&id), WEFT_OK);
  weft_comm *comm;
  assert_int_equal(weft_comm_init_rank(&comm, &id, 0, 1), WEFT_OK);
  float *d = weft_mem_device.alloc_scratch(1000 * sizeof(float));
  weft_status st = weft_allreduce(comm, d, d, 1000000, WEFT_F32, WEFT_SUM);
  assert_true(st < 0);
  const char *why = weft_last_error(comm);
  if (!strstr(why, "CUDA_ERROR_ILLEGAL_ADDRESS")) fail_msg("the sentence: %s", why);
  weft_comm_destroy(comm);
}

/* A weft call leaves the caller's current context as it found it (issue
 * 45): a caller whose current context is device 1's makes calls on device
 * 0's buffers (weft switches to device 0's primary context to queue them)
 * and finds device 1's current after each: a blocking allreduce, a
 * non-blocking one, its wait, the destroy. A caller with none current finds
 * none. Before, device 0's context stayed current, and the caller's next
 * allocation went to the wrong GPU. */
static void caller_context_restored(void **state) {
  (void)state;
  weft_error_sink err = {0};
  const weft_cuda_api *cu = weft_cuda_api_load(&err);
  assert_non_null(cu);
  int n = 0;
  assert_int_equal(cu->device_get_count(&n), CUDA_SUCCESS);
  if (n < 2) fail_msg("the stand-in has %d device (WEFT_CUDA_EMU_DEVICES=2 wanted)", n);
  CUcontext c0, c1, now;
  assert_int_equal(cu->primary_ctx_retain(&c0, 0), CUDA_SUCCESS);
  assert_int_equal(cu->primary_ctx_retain(&c1, 1), CUDA_SUCCESS);
  assert_int_equal(cu->ctx_set_current(c0), CUDA_SUCCESS);
  CUdeviceptr d;
  assert_int_equal(cu->mem_alloc(&d, 4000), CUDA_SUCCESS);
  void *buf = (void *)(uintptr_t)d;
  weft_unique_id id;
  assert_int_equal(weft_get_unique_id(&id), WEFT_OK);
  weft_comm *comm;
  assert_int_equal(weft_comm_init_rank(&comm, &id, 0, 1), WEFT_OK);
  for (int round = 0; round < 2; round++) {
    CUcontext mine = round == 0 ? c1 : NULL;
    assert_int_equal(cu->ctx_set_current(mine), CUDA_SUCCESS);
    assert_int_equal(weft_allreduce(comm, buf, buf, 1000, WEFT_F32, WEFT_SUM), WEFT_OK);
    assert_int_equal(cu->ctx_get_current(&now), CUDA_SUCCESS);
    assert_ptr_equal(now, mine);
    weft_request *req = NULL;
    assert_int_equal(weft_iallreduce(comm, buf, buf, 1000, WEFT_F32, WEFT_SUM, &req), WEFT_OK);
    assert_int_equal(cu->ctx_get_current(&now), CUDA_SUCCESS);
    assert_ptr_equal(now, mine);
    assert_int_equal(weft_wait(&req), WEFT_OK);
    assert_int_equal(cu->ctx_get_current(&now), CUDA_SUCCESS);
    assert_ptr_equal(now, mine);
  }
  assert_int_equal(cu->ctx_set_current(c1), CUDA_SUCCESS);
  assert_int_equal(weft_comm_destroy(comm), WEFT_OK);
  assert_int_equal(cu->ctx_get_current(&now), CUDA_SUCCESS);
  assert_ptr_equal(now, c1);
  assert_int_equal(cu->ctx_set_current(c0), CUDA_SUCCESS);
  assert_int_equal(cu->mem_free(d), CUDA_SUCCESS);
  assert_int_equal(cu->primary_ctx_release(1), CUDA_SUCCESS);
  assert_int_equal(cu->primary_ctx_release(0), CUDA_SUCCESS);
}

/* weft_comm_register and weft_comm_deregister refuse what they cannot
 * take, naming it, and take host and device buffers; a buffer inside a
 * registered one is described as kept (WEFT_MEM_DESC_KEEP), one outside not,
 * and after the deregistration neither. */
static void register_and_deregister(void **state) {
  (void)state;
  weft_unique_id id;
  assert_int_equal(weft_get_unique_id(&id), WEFT_OK);
  weft_comm *comm;
  assert_int_equal(weft_comm_init_rank(&comm, &id, 0, 1), WEFT_OK);
  char *d = weft_mem_device.alloc_scratch(4096), *other = weft_mem_device.alloc_scratch(64);
  static char host[64];
  assert_int_equal(weft_comm_register(comm, NULL, 64), WEFT_ERR_INVALID);
  assert_non_null(strstr(weft_last_error(comm), "weft_comm_register"));
  assert_int_equal(weft_comm_register(comm, d, 0), WEFT_ERR_INVALID);
  assert_int_equal(weft_comm_deregister(comm, d), WEFT_ERR_INVALID);
  assert_non_null(strstr(weft_last_error(comm), "was not registered"));
  weft_mem_desc desc;
  assert_true(weft_mem_device.describe(d + 100, 200, &desc));
  assert_int_equal(desc.flags & WEFT_MEM_DESC_KEEP, 0);
  assert_int_equal(weft_comm_register(comm, d, 4096), WEFT_OK);
  assert_int_equal(weft_comm_register(comm, host, sizeof host), WEFT_OK);
  assert_true(weft_mem_device.describe(d + 100, 200, &desc));
  assert_int_equal(desc.flags & WEFT_MEM_DESC_KEEP, WEFT_MEM_DESC_KEEP);
  assert_true(weft_mem_device.describe(other, 64, &desc));
  assert_int_equal(desc.flags & WEFT_MEM_DESC_KEEP, 0);
  assert_int_equal(weft_comm_deregister(comm, d), WEFT_OK);
  assert_int_equal(weft_comm_deregister(comm, NULL), WEFT_OK); /* a rank with none to give back */
  assert_true(weft_mem_device.describe(d + 100, 200, &desc));
  assert_int_equal(desc.flags & WEFT_MEM_DESC_KEEP, 0);
  assert_int_equal(weft_comm_deregister(comm, d), WEFT_ERR_INVALID); /* once only */
  assert_int_equal(weft_comm_destroy(comm), WEFT_OK); /* takes the host buffer's registration */
  weft_mem_device.free_scratch(d);
  weft_mem_device.free_scratch(other);
}

int main(void) {
  if (!getenv("WEFT_CUDA_LIBRARY")) {
    printf("skipped: WEFT_CUDA_LIBRARY names no stand-in\n");
    return 77;
  }
  setenv("WEFT_CUDA_EMU_DEVICES", "2", 0); /* read at cuInit: caller_context_restored */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(usable),
      cmocka_unit_test(kernels_equal_host),
      cmocka_unit_test(one_pass_equals_pairwise),
      cmocka_unit_test(destroy_gives_back),
      cmocka_unit_test(caller_context_restored),
      cmocka_unit_test(register_and_deregister),
      cmocka_unit_test(illegal_address_fails_the_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
