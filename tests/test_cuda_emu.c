/* test_cuda_emu.c - the CUDA stand-in (tests/cuda_emu) is as strict as a GPU,
 * so code written without one cannot pass here by luck: a device pointer
 * faults on the host, queued work runs late (never at enqueue) in stream
 * order with cross-stream waits kept, events complete only after their
 * work, an illegal address sticks to its context, kernels come from the
 * module table, IPC crosses processes and refuses freed buffers, pointers
 * are classified, device memory is exported as a dma-buf (GPUDirect RDMA)
 * within the stand-in's limits, and every handle is counted. Loads the stand-in through
 * weft's own driver table (WEFT_CUDA_LIBRARY, src/cuda/cuda_api.c). Cases
 * that need a fresh process (other device counts, the IPC importer) run
 * this program again as a child: CUDA does not survive fork. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda_emu/cuda_emu.h"
#include "src/cuda/cuda_api.h"

#define CU(call) assert_int_equal((call), CUDA_SUCCESS)

static const weft_cuda_api *api;
static weft_cuda_emu_counts_fn counts_fn;
static CUcontext ctx0;
static char self[4096] = "/proc/self/exe"; /* this program, for the children */

/* A fatbin as far as the stand-in looks: the magic, then anything. */
static const uint32_t fake_fatbin[4] = {0xBA55ED50u, 0x00100001u, 0, 0};

static weft_cuda_emu_counters counts(void) {
  weft_cuda_emu_counters c;
  counts_fn(&c);
  return c;
}

/* The table and the counters; NULL when the stand-in cannot be loaded. */
static const weft_cuda_api *load(weft_error_sink *err) {
  const weft_cuda_api *a = weft_cuda_api_load(err);
  const char *lib = getenv("WEFT_CUDA_LIBRARY");
  void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (h) *(void **)&counts_fn = dlsym(h, "weft_cuda_emu_counts");
  return counts_fn ? a : NULL;
}

static int setup(void **state) {
  (void)state;
  weft_error_sink err = {0};
  if (!(api = load(&err))) {
    fprintf(stderr, "WEFT_CUDA_LIBRARY must name the stand-in: %s\n", err.msg);
    return -1;
  }
  CUdevice dev;
  if (api->device_get(&dev, 0) || api->primary_ctx_retain(&ctx0, dev) || api->ctx_set_current(ctx0))
    return -1;
  return 0;
}

/* Runs this program as a child in `mode` (a fresh process: exec, not just
 * fork), with `env` ("NAME=value" or NULL) set; its exit status. */
static int run_child(const char *mode, const char *arg, const char *env) {
  pid_t pid = fork();
  if (pid == 0) {
    if (env) putenv((char *)env);
    execl(self, self, "--child", mode, arg, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
}

/* The last release of device 0's primary context resets it (its sticky
 * error gone, what was left in it freed); then a fresh one. */
static void reset_ctx0(void) {
  while (counts().primary_refs) CU(api->primary_ctx_release(0));
  CU(api->primary_ctx_retain(&ctx0, 0));
  CU(api->ctx_set_current(ctx0));
}

static CUdeviceptr dev_alloc(size_t bytes) {
  CUdeviceptr p = 0;
  CU(api->mem_alloc(&p, bytes));
  return p;
}

/* ---- the driver, devices, contexts ------------------------------------------------------ */

static void *thread_without_context(void *arg) {
  (void)arg;
  CUcontext c = (CUcontext)1;
  CUdeviceptr p;
  CUstream s;
  CUevent e;
  int fails = 0;
  fails += api->ctx_get_current(&c) != CUDA_SUCCESS || c != NULL;
  fails += api->mem_alloc(&p, 64) != CUDA_ERROR_INVALID_CONTEXT;
  fails += api->stream_create(&s, 0) != CUDA_ERROR_INVALID_CONTEXT;
  fails += api->event_create(&e, 0) != CUDA_ERROR_INVALID_CONTEXT;
  fails += api->stream_synchronize(NULL) != CUDA_ERROR_INVALID_CONTEXT;
  fails += api->memset_d8_async(0, 0, 1, NULL) != CUDA_ERROR_INVALID_CONTEXT;
  /* once current here too, the same calls work */
  fails += api->ctx_set_current(ctx0) != CUDA_SUCCESS;
  fails += api->mem_alloc(&p, 64) != CUDA_SUCCESS;
  fails += api->mem_free(p) != CUDA_SUCCESS;
  return (void *)(intptr_t)fails;
}

static void driver_devices_contexts(void **state) {
  (void)state;
  assert_int_equal(api->driver_version, CUDA_VERSION);
  int n = -1;
  CU(api->device_get_count(&n));
  assert_int_equal(n, 1);
  CUdevice dev;
  assert_int_equal(api->device_get(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
  char name[64], bus[32];
  CU(api->device_get_name(name, sizeof name, 0));
  assert_string_equal(name, "weft emulated GPU 0");
  CU(api->device_get_pci_bus_id(bus, sizeof bus, 0));
  assert_string_equal(bus, "0000:00:00.0");
  int v = 0;
  CU(api->device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
  assert_int_equal(v, 1);
  CU(api->device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0));
  assert_int_equal(v, 1024);
  /* the primary context is one per device, refcounted */
  CUcontext again = NULL, cur = NULL;
  int refs = counts().primary_refs;
  CU(api->primary_ctx_retain(&again, 0));
  assert_ptr_equal(again, ctx0);
  assert_int_equal(counts().primary_refs, refs + 1);
  CU(api->primary_ctx_release(0));
  assert_int_equal(counts().primary_refs, refs);
  CU(api->ctx_get_current(&cur));
  assert_ptr_equal(cur, ctx0);
  assert_int_equal(api->ctx_set_current((CUcontext)&v), CUDA_ERROR_INVALID_CONTEXT);
  /* the current context is per thread */
  pthread_t t;
  void *fails;
  assert_int_equal(pthread_create(&t, NULL, thread_without_context, NULL), 0);
  pthread_join(t, &fails);
  assert_int_equal((intptr_t)fails, 0);
  /* other device counts need a process of their own (cuInit once) */
  assert_int_equal(run_child("no-device", NULL, "WEFT_CUDA_EMU_DEVICES=0"), 0);
  assert_int_equal(run_child("two-devices", NULL, "WEFT_CUDA_EMU_DEVICES=2"), 0);
}

static void error_words_for_every_code(void **state) {
  (void)state;
  const CUresult codes[] = {CUDA_SUCCESS,
                            CUDA_ERROR_INVALID_VALUE,
                            CUDA_ERROR_OUT_OF_MEMORY,
                            CUDA_ERROR_NOT_INITIALIZED,
                            CUDA_ERROR_NO_DEVICE,
                            CUDA_ERROR_INVALID_DEVICE,
                            CUDA_ERROR_INVALID_IMAGE,
                            CUDA_ERROR_INVALID_CONTEXT,
                            CUDA_ERROR_INVALID_HANDLE,
                            CUDA_ERROR_NOT_FOUND,
                            CUDA_ERROR_NOT_READY,
                            CUDA_ERROR_ILLEGAL_ADDRESS};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *name = NULL, *text = NULL;
    CU(api->get_error_name(codes[i], &name));
    CU(api->get_error_string(codes[i], &text));
    assert_non_null(name);
    assert_non_null(text);
  }
  const char *name = "x";
  assert_int_equal(api->get_error_name((CUresult)12345, &name), CUDA_ERROR_INVALID_VALUE);
  assert_null(name);
  char words[160];
  weft_cuda_error_words(api, CUDA_ERROR_ILLEGAL_ADDRESS, words, sizeof words);
  assert_string_equal(words,
                      "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)");
}

/* ---- memory --------------------------------------------------------------------------- */

static void host_dereference_of_device_pointer_faults(void **state) {
  (void)state;
  CUdeviceptr p = dev_alloc(4096);
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL); /* not a sanitizer's handler: die of it */
    volatile char *host = (volatile char *)(uintptr_t)p;
    char c = host[100];
    _exit(c == 42 ? 1 : 2);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGSEGV);
  CU(api->mem_free(p));
}

static void pointers_classified(void **state) {
  (void)state;
  CUdeviceptr d = dev_alloc(1000);
  void *pinned = NULL;
  CU(api->mem_host_alloc(&pinned, 100, CU_MEMHOSTALLOC_PORTABLE));
  assert_int_equal((uintptr_t)pinned % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
  char *pageable = malloc(100);
  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT,
                                  CU_POINTER_ATTRIBUTE_IS_MANAGED};
  unsigned int type, managed;
  int ordinal;
  CUcontext ctx;
  void *data[4] = {&type, &ordinal, &ctx, &managed};
  /* device memory, at its base and inside */
  for (size_t off = 0; off < 1000; off += 999) {
    type = 0, ordinal = -1, ctx = NULL, managed = 7;
    CU(api->pointer_get_attributes(4, attrs, data, d + off));
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(ordinal, 0);
    assert_ptr_equal(ctx, ctx0);
    assert_int_equal(managed, 0);
  }
  /* pinned host memory */
  CU(api->pointer_get_attributes(4, attrs, data, (CUdeviceptr)(uintptr_t)pinned + 50));
  assert_int_equal(type, CU_MEMORYTYPE_HOST);
  assert_int_equal(managed, 0);
  /* memory the driver does not know: success, type 0 */
  type = 99, managed = 7;
  CU(api->pointer_get_attributes(4, attrs, data, (CUdeviceptr)(uintptr_t)pageable));
  assert_int_equal(type, 0);
  assert_int_equal(managed, 0);
  assert_ptr_equal(ctx, NULL);
  /* the allocation holding a pointer */
  CUdeviceptr base = 0;
  size_t size = 0;
  CU(api->mem_get_address_range(&base, &size, d + 500));
  assert_true(base == d && size == 1000);
  assert_int_equal(api->mem_get_address_range(&base, &size, d + 1000), CUDA_ERROR_NOT_FOUND);
  assert_int_equal(api->mem_get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)pageable),
                   CUDA_ERROR_NOT_FOUND);
  /* frees: an inner address, memory not ours, twice */
  assert_int_equal(api->mem_free(d + 8), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(api->mem_free((CUdeviceptr)(uintptr_t)pageable), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(api->mem_alloc(&base, 0), CUDA_ERROR_INVALID_VALUE);
  CU(api->mem_free(d));
  assert_int_equal(api->mem_free(d), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(api->mem_free_host(pageable), CUDA_ERROR_INVALID_VALUE);
  CU(api->mem_free_host(pinned));
  assert_int_equal(api->mem_free_host(pinned), CUDA_ERROR_INVALID_VALUE);
  /* a freed device address is nothing now */
  type = 99;
  CU(api->pointer_get_attributes(1, attrs, data, d));
  assert_int_equal(type, 0);
  free(pageable);
}

/* ---- queued work -------------------------------------------------------------------------- */

static void copies_run_late_in_stream_order(void **state) {
  (void)state;
  enum { N = 256 };
  CUstream s;
  CU(api->stream_create(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = dev_alloc(N);
  unsigned char src[N], dst[N];
  memset(src, 1, N);
  memset(dst, 0, N);
  CU(api->memcpy_htod_async(d, src, N, s));
  CU(api->memcpy_dtoh_async(dst, d, N, s));
  assert_int_equal(counts().pending, 2);
  /* nothing ran at enqueue: the destination is stale */
  assert_int_equal(dst[0], 0);
  /* a copy reads its source when it runs, not when it was queued */
  memset(src, 2, N);
  CU(api->stream_synchronize(s));
  assert_int_equal(counts().pending, 0);
  for (int i = 0; i < N; i++) assert_int_equal(dst[i], 2);
  /* fresh device memory is not zeroed */
  CUdeviceptr fresh = dev_alloc(16);
  CU(api->memcpy_dtoh_async(dst, fresh, 16, s));
  CU(api->stream_synchronize(s));
  assert_int_equal(dst[0], 0xff);
  /* stream order: memsets 1..20 in one stream, polled to completion, leave 20 */
  for (int v = 1; v <= 20; v++) CU(api->memset_d8_async(d, (unsigned char)v, N, s));
  CU(api->memcpy_dtoh_async(dst, d, N, s));
  int not_ready = 0;
  CUresult r;
  while ((r = api->stream_query(s)) == CUDA_ERROR_NOT_READY) not_ready++;
  CU(r);
  assert_true(not_ready >= 10); /* at most 2 operations per query */
  assert_int_equal(dst[0], 20);
  assert_int_equal(dst[N - 1], 20);
  CU(api->mem_free(fresh));
  CU(api->mem_free(d));
  CU(api->stream_destroy(s));
}

/* Stream b copies what stream a wrote: with a wait on a's event always the
 * new value; without it, the random order shows the old one sometimes. */
static void cross_stream_waits_kept(void **state) {
  (void)state;
  CUstream a, b;
  CUevent e;
  CU(api->stream_create(&a, CU_STREAM_NON_BLOCKING));
  CU(api->stream_create(&b, CU_STREAM_NON_BLOCKING));
  CU(api->event_create(&e, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr x = dev_alloc(64), y = dev_alloc(64);
  int stale_without_wait = 0;
  for (int round = 0; round < 60; round++) {
    unsigned char out = 0;
    bool wait = round % 2 == 0;
    CU(api->memset_d8_async(x, 0, 64, a));
    CU(api->stream_synchronize(a));
    CU(api->memset_d8_async(x, 1, 64, a));
    CU(api->memset_d8_async(x, 7, 64, a));
    CU(api->event_record(e, a));
    if (wait) CU(api->stream_wait_event(b, e, 0));
    CU(api->memcpy_dtod_async(y, x, 64, b));
    CU(api->memcpy_dtoh_async(&out, y, 1, b));
    while (api->stream_query(b) == CUDA_ERROR_NOT_READY) continue;
    CU(api->stream_synchronize(a));
    if (wait)
      assert_int_equal(out, 7);
    else
      stale_without_wait += out != 7;
  }
  assert_true(stale_without_wait > 0);
  CU(api->event_destroy(e));
  CU(api->stream_destroy(a));
  CU(api->stream_destroy(b));
  CU(api->mem_free(x));
  CU(api->mem_free(y));
}

/* cuStreamWaitValue32 holds its stream until the word meets the value,
 * even where the writer is work another thread queues later (a synchronize
 * lets go of the lock meanwhile); cuStreamWriteValue32 writes it in its
 * stream's order. */
typedef struct {
  CUstream stream;
  CUdeviceptr word;
} value_writer;

static void *write_value_later(void *arg) {
  value_writer *w = arg;
  usleep(50000);
  CU(api->ctx_set_current(ctx0));
  CU(api->stream_write_value32(w->stream, w->word, 5, CU_STREAM_WRITE_VALUE_DEFAULT));
  return NULL;
}

static void stream_wait_value_holds_its_stream(void **state) {
  (void)state;
  CUstream a, b;
  CU(api->stream_create(&a, CU_STREAM_NON_BLOCKING));
  CU(api->stream_create(&b, CU_STREAM_NON_BLOCKING));
  CUdeviceptr word = dev_alloc(64), x = dev_alloc(64);
  for (int round = 0; round < 20; round++) {
    unsigned char out = 0;
    CU(api->memset_d8_async(word, 0, 64, a));
    CU(api->memset_d8_async(x, 1, 64, a));
    CU(api->stream_synchronize(a));
    /* GEQ with wrap-around: 4 is behind 5, 0xfffffff0 is behind 3 */
    CU(api->stream_wait_value32(a, word, 5, CU_STREAM_WAIT_VALUE_GEQ));
    CU(api->memcpy_dtoh_async(&out, x, 1, a));
    for (int i = 0; i < 50; i++) assert_int_equal(api->stream_query(a), CUDA_ERROR_NOT_READY);
    assert_int_equal(out, 0);
    CU(api->stream_write_value32(b, word, 4, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(api->stream_synchronize(b));
    for (int i = 0; i < 50; i++) assert_int_equal(api->stream_query(a), CUDA_ERROR_NOT_READY);
    CU(api->memset_d8_async(x, 9, 64, b));
    if (round % 2) { /* the writer comes later, from another thread */
      value_writer w = {b, word};
      pthread_t t;
      assert_int_equal(pthread_create(&t, NULL, write_value_later, &w), 0);
      CU(api->stream_synchronize(a));
      pthread_join(t, NULL);
    } else { /* queued after the copy on b: the copy runs first */
      CU(api->stream_write_value32(b, word, 5, CU_STREAM_WRITE_VALUE_DEFAULT));
      CU(api->stream_synchronize(a));
    }
    assert_int_equal(out, 9);
    CU(api->stream_synchronize(b));
  }
  /* host memory cannot be waited on unless pinned; odd addresses are refused */
  static uint32_t pageable;
  assert_int_equal(api->stream_wait_value32(a, (CUdeviceptr)(uintptr_t)&pageable, 1, 0),
                   CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(api->stream_write_value32(a, word + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CU(api->stream_destroy(a));
  CU(api->stream_destroy(b));
  CU(api->mem_free(word));
  CU(api->mem_free(x));
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The test-only spin kernel holds its stream for the seconds it is given,
 * as a long kernel does, while other streams go on: the work queued behind
 * it runs no sooner, so a test can show head-of-line blocking as time. */
static void spin_kernel_holds_its_stream(void **state) {
  (void)state;
  CUmodule m;
  CUfunction spin;
  CU(api->module_load_data(&m, fake_fatbin));
  CU(api->module_get_function(&spin, m, "weft_emu_test_spin"));
  CUstream a, b;
  CU(api->stream_create(&a, CU_STREAM_NON_BLOCKING));
  CU(api->stream_create(&b, CU_STREAM_NON_BLOCKING));
  CUdeviceptr x = dev_alloc(64), y = dev_alloc(64);
  unsigned char out_a = 0, out_b = 0;
  double seconds = 0.2, t0 = now_s();
  void *params[] = {&seconds};
  CU(api->launch_kernel(spin, 1, 1, 1, 1, 1, 1, 0, a, params, NULL));
  seconds = 5; /* copied at launch: the kernel holds for 0.2 s */
  CU(api->memset_d8_async(x, 7, 64, a));
  CU(api->memcpy_dtoh_async(&out_a, x, 1, a));
  CU(api->memset_d8_async(y, 9, 64, b));
  CU(api->memcpy_dtoh_async(&out_b, y, 1, b));
  CU(api->stream_synchronize(b)); /* the other stream is not held (a GPU would overlap them) */
  assert_int_equal(out_b, 9);
  CU(api->stream_synchronize(a));
  double took = now_s() - t0;
  assert_int_equal(out_a, 7);
  if (took < 0.19) fail_msg("the spin kernel held its stream %.3f s, not 0.2", took);
  if (took > 4) fail_msg("the spin kernel held its stream %.3f s: its parameter changed after launch", took);
  CU(api->stream_destroy(a));
  CU(api->stream_destroy(b));
  CU(api->mem_free(x));
  CU(api->mem_free(y));
  CU(api->module_unload(m));
}

/* A synchronize behind a wait nothing will ever satisfy aborts, naming the
 * wait, after WEFT_CUDA_EMU_HANG_S: a test fails where a GPU would hang. */
static int child_wait_forever(void) {
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CUdeviceptr word;
  if (api->device_get(&dev, 0) || api->primary_ctx_retain(&ctx, dev) || api->ctx_set_current(ctx) ||
      api->stream_create(&s, CU_STREAM_NON_BLOCKING) || api->mem_alloc(&word, 4) ||
      api->memset_d8_async(word, 0, 4, s) || api->stream_synchronize(s) ||
      api->stream_wait_value32(s, word, 1, CU_STREAM_WAIT_VALUE_GEQ))
    return 1;
  api->stream_synchronize(s);
  return 0; /* not reached: the stand-in aborts */
}

static void hung_synchronize_aborts(void **state) {
  (void)state;
  assert_int_equal(run_child("wait-forever", "", "WEFT_CUDA_EMU_HANG_S=1"), 200 + SIGABRT);
}

/* The NULL stream waits for earlier work of blocking streams (not of
 * non-blocking ones, which nothing here relies on). */
static void legacy_stream_orders_blocking_streams(void **state) {
  (void)state;
  CUstream s;
  CU(api->stream_create(&s, CU_STREAM_DEFAULT));
  CUdeviceptr x = dev_alloc(64);
  for (int round = 0; round < 20; round++) {
    unsigned char out = 0;
    CU(api->memset_d8_async(x, (unsigned char)(round + 1), 64, s));
    CU(api->memcpy_dtoh_async(&out, x, 1, NULL));
    CU(api->stream_synchronize(NULL));
    assert_int_equal(out, round + 1);
  }
  CU(api->stream_synchronize(s));
  CU(api->mem_free(x));
  CU(api->stream_destroy(s));
}

static void events_complete_after_their_work(void **state) {
  (void)state;
  CUstream s;
  CUevent e;
  CU(api->stream_create(&s, CU_STREAM_NON_BLOCKING));
  CU(api->event_create(&e, CU_EVENT_DISABLE_TIMING));
  CU(api->event_query(e)); /* never recorded: complete */
  CUdeviceptr x = dev_alloc(64);
  unsigned char out = 0;
  for (int v = 1; v <= 8; v++) CU(api->memset_d8_async(x, (unsigned char)v, 64, s));
  CU(api->memcpy_dtoh_async(&out, x, 1, s));
  CU(api->event_record(e, s));
  assert_int_equal(api->event_query(e), CUDA_ERROR_NOT_READY); /* 10 operations, at most 2 ran */
  assert_int_equal(out, 0);
  CUresult r;
  int not_ready = 1;
  while ((r = api->event_query(e)) == CUDA_ERROR_NOT_READY) not_ready++;
  CU(r);
  assert_true(not_ready >= 5);
  assert_int_equal(out, 8); /* complete means the work before it ran */
  assert_int_equal(counts().pending, 0);
  /* a synchronize runs what the event waits for */
  CU(api->memset_d8_async(x, 9, 64, s));
  CU(api->memcpy_dtoh_async(&out, x, 1, s));
  CU(api->event_record(e, s));
  CU(api->event_synchronize(e));
  assert_int_equal(out, 9);
  /* an event recorded in the NULL stream */
  CU(api->memset_d8_async(x, 10, 64, NULL));
  CU(api->memcpy_dtoh_async(&out, x, 1, NULL));
  CU(api->event_record(e, NULL));
  CU(api->event_synchronize(e));
  assert_int_equal(out, 10);
  CU(api->event_destroy(e));
  assert_int_equal(api->event_query(e), CUDA_ERROR_INVALID_HANDLE);
  CU(api->mem_free(x));
  CU(api->stream_destroy(s));
  assert_int_equal(api->stream_query(s), CUDA_ERROR_INVALID_HANDLE);
}

/* A copy past the end of an allocation, one from freed memory, one into
 * freed pinned memory, a kernel past its buffers: each fails when it runs, and every later call of
 * the context answers the error until the context is reset. */
static void illegal_address_is_sticky(void **state) {
  (void)state;
  for (int how = 0; how < 4; how++) {
    CUstream s;
    CUevent e;
    CUmodule m;
    CUfunction fn;
    CU(api->stream_create(&s, CU_STREAM_NON_BLOCKING));
    CU(api->event_create(&e, 0));
    CU(api->module_load_data(&m, fake_fatbin));
    CU(api->module_get_function(&fn, m, "weft_emu_test_add_f32"));
    CUdeviceptr x = dev_alloc(64);
    char out[128];
    if (how == 0) {
      CU(api->memcpy_dtoh_async(out, x + 32, 64, s)); /* 32 bytes past the end */
    } else if (how == 1) {
      CUdeviceptr gone = dev_alloc(64);
      CU(api->memcpy_dtoh_async(out, gone, 64, s));
      CU(api->mem_free(gone)); /* before the copy ran: no wait at free */
    } else if (how == 2) {
      void *pinned;
      CU(api->mem_host_alloc(&pinned, 64, 0));
      CU(api->memcpy_dtoh_async(pinned, x, 64, s));
      CU(api->mem_free_host(pinned)); /* the copy's destination, before it ran */
    } else {
      size_t n = 32; /* 128 bytes of floats from 64-byte buffers */
      void *params[] = {&x, &x, &x, &n};
      CU(api->launch_kernel(fn, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
    }
    CU(api->event_record(e, s));
    assert_int_equal(api->stream_synchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(api->event_query(e), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(api->stream_query(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(api->stream_synchronize(NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(api->memset_d8_async(x, 0, 64, s), CUDA_ERROR_ILLEGAL_ADDRESS);
    void *params[] = {&x, &x, &x, &(size_t){1}};
    assert_int_equal(api->launch_kernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
                     CUDA_ERROR_ILLEGAL_ADDRESS);
    CUdeviceptr y;
    assert_int_equal(api->mem_alloc(&y, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(counts().pending, 0); /* the context's queued work is dropped */
    /* only a reset clears it; what was left in the context is reclaimed */
    int reclaimed = counts().reclaimed;
    reset_ctx0();
    assert_int_equal(counts().reclaimed, reclaimed + 4); /* stream, event, module, buffer */
    assert_int_equal(api->stream_query(s), CUDA_ERROR_INVALID_HANDLE);
    CU(api->stream_synchronize(NULL));
  }
}

/* ---- kernels -------------------------------------------------------------------------- */

static void kernel_from_module_table_adds(void **state) {
  (void)state;
  enum { N = 1000 };
  CUmodule m;
  CUfunction fn;
  const char ptx[] = "//\n.version 8.0\n";
  assert_int_equal(api->module_load_data(&m, ptx), CUDA_ERROR_INVALID_IMAGE);
  CU(api->module_load_data(&m, fake_fatbin));
  assert_int_equal(api->module_get_function(&fn, m, "weft_no_such_kernel"), CUDA_ERROR_NOT_FOUND);
  CU(api->module_get_function(&fn, m, "weft_emu_test_add_f32"));
  float a[N], b[N], c[N];
  for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = 0.5f * (float)i;
  CUdeviceptr da = dev_alloc(sizeof a), db = dev_alloc(sizeof b), dc = dev_alloc(sizeof c);
  CUstream s;
  CU(api->stream_create(&s, CU_STREAM_NON_BLOCKING));
  CU(api->memcpy_htod_async(da, a, sizeof a, s));
  CU(api->memcpy_htod_async(db, b, sizeof b, s));
  size_t n = N;
  void *params[] = {&dc, &da, &db, &n};
  /* a block too large, and dynamic shared memory beyond the default limit */
  assert_int_equal(api->launch_kernel(fn, 1, 1, 1, 2048, 1, 1, 0, s, params, NULL),
                   CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(api->launch_kernel(fn, 1, 1, 1, 32, 1, 1, 1 << 20, s, params, NULL),
                   CUDA_ERROR_INVALID_VALUE);
  CU(api->launch_kernel(fn, (N + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
  /* the values were copied at launch: changing them now changes nothing */
  CUdeviceptr out = dc;
  n = 1;
  dc = da;
  CU(api->memcpy_dtoh_async(c, out, sizeof c, s));
  CU(api->stream_synchronize(s));
  for (int i = 0; i < N; i++) assert_true(c[i] == 1.5f * (float)i);
  /* one thread per element: a grid too small leaves the rest as it was */
  CU(api->memset_d8_async(out, 0, sizeof c, s));
  n = N;
  dc = out;
  CU(api->launch_kernel(fn, 1, 1, 1, 256, 1, 1, 0, s, params, NULL));
  CU(api->memcpy_dtoh_async(c, out, sizeof c, s));
  CU(api->stream_synchronize(s));
  assert_true(c[255] == 1.5f * 255);
  assert_true(c[256] == 0.0f);
  /* the parameters through extra's buffer */
  struct {
    CUdeviceptr dst, a, b;
    size_t n;
  } packed = {out, da, da, N};
  size_t packed_size = sizeof packed;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &packed_size, CU_LAUNCH_PARAM_END};
  CU(api->launch_kernel(fn, (N + 127) / 128, 1, 1, 128, 1, 1, 0, s, NULL, extra));
  CU(api->memcpy_dtoh_async(c, out, sizeof c, s));
  CU(api->stream_synchronize(s));
  assert_true(c[N - 1] == 2.0f * (float)(N - 1));
  /* an unloaded module's function is gone */
  CU(api->module_unload(m));
  assert_int_equal(api->launch_kernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
                   CUDA_ERROR_INVALID_HANDLE);
  CU(api->stream_destroy(s));
  CU(api->mem_free(da));
  CU(api->mem_free(db));
  CU(api->mem_free(out));
}

/* ---- IPC ----------------------------------------------------------------------------- */

static void handle_to_hex(const CUipcMemHandle *h, char hex[2 * CU_IPC_HANDLE_SIZE + 1]) {
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h->reserved[i]);
}

static bool hex_to_handle(const char *hex, CUipcMemHandle *h) {
  if (!hex || strlen(hex) != 2 * CU_IPC_HANDLE_SIZE) return false;
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
    unsigned int byte;
    if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return false;
    h->reserved[i] = (char)byte;
  }
  return true;
}

enum { IPC_FLOATS = 1024 };

static void ipc_across_processes(void **state) {
  (void)state;
  size_t bytes = IPC_FLOATS * sizeof(float);
  CUdeviceptr d = dev_alloc(bytes);
  CU(api->memset_d8_async(d, 0, bytes, NULL));
  CU(api->stream_synchronize(NULL));
  CUipcMemHandle h, inner;
  assert_int_equal(api->ipc_get_mem_handle(&inner, d + 4), CUDA_ERROR_INVALID_VALUE);
  CU(api->ipc_get_mem_handle(&h, d));
  /* the exporter itself may not open it */
  CUdeviceptr p;
  assert_int_equal(api->ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                   CUDA_ERROR_INVALID_CONTEXT);
  char hex[2 * CU_IPC_HANDLE_SIZE + 1];
  handle_to_hex(&h, hex);
  /* another process opens it and writes through a copy */
  assert_int_equal(run_child("ipc-write", hex, NULL), 0);
  float got[IPC_FLOATS];
  CU(api->memcpy_dtoh_async(got, d, bytes, NULL));
  CU(api->stream_synchronize(NULL));
  for (int i = 0; i < IPC_FLOATS; i++) assert_true(got[i] == 2.0f * (float)i + 1.0f);
  /* freed: refused */
  CU(api->mem_free(d));
  assert_int_equal(run_child("ipc-refused", hex, NULL), 0);
  /* the same descriptor number now holds a newer buffer of the same size:
   * the serial tells them apart */
  CUdeviceptr d2 = dev_alloc(bytes);
  CUipcMemHandle h2;
  CU(api->ipc_get_mem_handle(&h2, d2));
  assert_memory_equal(h.reserved, h2.reserved, 12); /* magic, pid, descriptor */
  assert_int_equal(run_child("ipc-refused", hex, NULL), 0);
  CU(api->mem_free(d2));
}

static void forked_child_cannot_use_the_driver(void **state) {
  (void)state;
  pid_t pid = fork();
  if (pid == 0) {
    CUdeviceptr p;
    bool refused = api->ctx_set_current(ctx0) == CUDA_ERROR_NOT_INITIALIZED &&
                   api->mem_alloc(&p, 64) == CUDA_ERROR_NOT_INITIALIZED &&
                   api->init(0) == CUDA_ERROR_NOT_INITIALIZED;
    _exit(refused ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- dma-buf (GPUDirect RDMA) ----------------------------------------------------------- */

typedef CUresult (*handle_for_range_fn)(void *, CUdeviceptr, size_t, CUmemRangeHandleType,
                                        unsigned long long);

/* A symbol of the stand-in that weft's table does not hold. */
static void *emu_sym(const char *name) {
  void *h = dlopen(getenv("WEFT_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  return h ? dlsym(h, name) : NULL;
}

static size_t page_size(void) {
  return (size_t)sysconf(_SC_PAGESIZE);
}

/* The descriptor is the allocation's memory from its base: what a copy
 * wrote is in its mapping, what is written there a copy reads; several may
 * be open; each is counted while open, and a number closed and reused for
 * another file is not; the memory outlives cuMemFree behind a descriptor. */
static void dmabuf_export_shares_device_memory(void **state) {
  (void)state;
  handle_for_range_fn export_range;
  *(void **)&export_range = emu_sym("cuMemGetHandleForAddressRange");
  assert_non_null(export_range);
  size_t page = page_size(), bytes = 2 * page + 100, whole = 3 * page;
  weft_cuda_emu_counters before = counts();
  CUdeviceptr d = dev_alloc(bytes);
  unsigned char *v = malloc(bytes), *got = malloc(bytes);
  assert_true(v && got);
  for (size_t i = 0; i < bytes; i++) v[i] = (unsigned char)(i * 7 + 1);
  CU(api->memcpy_htod_async(d, v, bytes, NULL));
  CU(api->stream_synchronize(NULL));
  int fd = -1;
  CU(export_range(&fd, d, whole, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
  assert_true(fd >= 0);
  assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
  weft_cuda_emu_counters c = counts();
  assert_int_equal(c.dmabuf_exported, before.dmabuf_exported + 1);
  assert_int_equal(c.dmabuf_open, before.dmabuf_open + 1);
  unsigned char *m = mmap(NULL, whole, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  assert_memory_equal(m, v, bytes); /* byte 0 is the base */
  /* written through the mapping (a NIC's write): a copy reads it */
  for (size_t i = 0; i < bytes; i++) m[i] = (unsigned char)(255 - v[i]);
  CU(api->memcpy_dtoh_async(got, d, bytes, NULL));
  CU(api->stream_synchronize(NULL));
  for (size_t i = 0; i < bytes; i++) assert_int_equal(got[i], (unsigned char)(255 - v[i]));
  /* a second descriptor, of the first page only: both open, both counted */
  int fd2 = -1;
  CU(export_range(&fd2, d, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
  assert_true(fd2 >= 0 && fd2 != fd);
  c = counts();
  assert_int_equal(c.dmabuf_exported, before.dmabuf_exported + 2);
  assert_int_equal(c.dmabuf_open, before.dmabuf_open + 2);
  /* closed: no longer open, though still exported once */
  assert_int_equal(close(fd2), 0);
  c = counts();
  assert_int_equal(c.dmabuf_exported, before.dmabuf_exported + 2);
  assert_int_equal(c.dmabuf_open, before.dmabuf_open + 1);
  /* freed while a descriptor is open: allowed, the memory lives on behind it */
  CU(api->mem_free(d));
  assert_int_equal(counts().allocations, before.allocations);
  assert_int_equal(counts().dmabuf_open, before.dmabuf_open + 1);
  assert_int_equal(m[0], (unsigned char)(255 - v[0]));
  assert_int_equal(munmap(m, whole), 0);
  /* the number closed and taken by another file: not counted */
  assert_int_equal(close(fd), 0);
  int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  assert_true(other >= 0);
  if (other != fd) {
    assert_int_equal(dup2(other, fd), fd);
    close(other);
  }
  assert_int_equal(counts().dmabuf_open, before.dmabuf_open);
  close(fd);
  free(v);
  free(got);
}

static void *export_without_context(void *arg) {
  handle_for_range_fn export_range = *(handle_for_range_fn *)arg;
  int fd = -1;
  CUresult r = export_range(&fd, 0, page_size(), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  return (void *)(intptr_t)(r == CUDA_ERROR_INVALID_CONTEXT && fd == -1);
}

/* What the stand-in does not export: an inner address, a size not whole
 * pages or past the allocation, flags, another handle type, freed memory
 * (CUDA_ERROR_INVALID_VALUE); cuMemMap'd and pinned host memory
 * (CUDA_ERROR_NOT_SUPPORTED); nothing without a context. No descriptor
 * comes out of a refusal. WEFT_CUDA_EMU_DMABUF=0 in a child: cuInit reads it. */
static void dmabuf_export_refusals(void **state) {
  (void)state;
  handle_for_range_fn export_range;
  *(void **)&export_range = emu_sym("cuMemGetHandleForAddressRange");
  assert_non_null(export_range);
  size_t page = page_size();
  weft_cuda_emu_counters before = counts();
  CUdeviceptr d = dev_alloc(2 * page);
  const CUmemRangeHandleType dmabuf = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
  int fd = -1;
  assert_int_equal(export_range(&fd, d + page, page, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d + 4, page, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d, page + 1, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d, page / 2, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d, 0, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d, 3 * page, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d, page, dmabuf, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE),
                   CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(&fd, d, page, (CUmemRangeHandleType)2, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(export_range(NULL, d, page, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(fd, -1);
  /* the whole allocation is fine (the control), then freed: refused */
  CU(export_range(&fd, d, 2 * page, dmabuf, 0));
  assert_int_equal(close(fd), 0);
  fd = -1;
  CU(api->mem_free(d));
  assert_int_equal(export_range(&fd, d, page, dmabuf, 0), CUDA_ERROR_INVALID_VALUE);
  /* pinned host memory: not exported (HOST_ALLOC_DMA_BUF_SUPPORTED 0) */
  void *pinned;
  CU(api->mem_host_alloc(&pinned, page, 0));
  assert_int_equal(export_range(&fd, (CUdeviceptr)(uintptr_t)pinned, page, dmabuf, 0),
                   CUDA_ERROR_NOT_SUPPORTED);
  CU(api->mem_free_host(pinned));
  /* cuMemMap'd memory: not exported (not made gpuDirectRDMACapable) */
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*address_free)(CUdeviceptr, size_t);
  *(void **)&reserve = emu_sym("cuMemAddressReserve");
  *(void **)&create = emu_sym("cuMemCreate");
  *(void **)&map = emu_sym("cuMemMap");
  *(void **)&unmap = emu_sym("cuMemUnmap");
  *(void **)&release = emu_sym("cuMemRelease");
  *(void **)&address_free = emu_sym("cuMemAddressFree");
  assert_true(reserve && create && map && unmap && release && address_free);
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CUdeviceptr range = 0;
  CUmemGenericAllocationHandle mh;
  CU(reserve(&range, 2 * page, page, 0, 0));
  CU(create(&mh, 2 * page, &prop, 0));
  CU(map(range, 2 * page, 0, mh, 0));
  assert_int_equal(export_range(&fd, range, 2 * page, dmabuf, 0), CUDA_ERROR_NOT_SUPPORTED);
  assert_int_equal(export_range(&fd, range, page, dmabuf, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU(unmap(range, 2 * page));
  CU(release(mh));
  CU(address_free(range, 2 * page));
  assert_int_equal(fd, -1);
  /* a thread without a current context */
  pthread_t t;
  void *ok;
  assert_int_equal(pthread_create(&t, NULL, export_without_context, &export_range), 0);
  pthread_join(t, &ok);
  assert_true((intptr_t)ok);
  weft_cuda_emu_counters c = counts();
  assert_int_equal(c.dmabuf_exported, before.dmabuf_exported + 1); /* the control only */
  assert_int_equal(c.dmabuf_open, before.dmabuf_open);
  /* a driver or kernel without dma-buf */
  assert_int_equal(run_child("dmabuf-off", NULL, "WEFT_CUDA_EMU_DMABUF=0"), 0);
}

/* What a GPUDirect RDMA user asks first: dma-buf and GPUDirect RDMA
 * supported, no cuFlushGPUDirectRDMAWrites, remote writes not ordered for
 * the owner, neither cuMemCreate nor host memory exported. */
static void gpudirect_rdma_attributes(void **state) {
  (void)state;
  const struct {
    CUdevice_attribute attr;
    int value;
  } want[] = {
      {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, 0},
      {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE},
      {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0},
      {CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED, 0},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int v = -1;
    CU(api->device_get_attribute(&v, want[i].attr, 0));
    assert_int_equal(v, want[i].value);
  }
  int v = -1;
  assert_int_equal(api->device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 1),
                   CUDA_ERROR_INVALID_DEVICE);
}

/* The report line at exit (WEFT_CUDA_EMU_REPORT) ends with the dma-buf
 * counters: a child exports twice, closes one, frees the memory, exits. */
static void dmabuf_counters_in_the_report(void **state) {
  (void)state;
  char path[] = "/tmp/weft-cuda-emu-report-XXXXXX";
  int rfd = mkstemp(path);
  assert_true(rfd >= 0);
  close(rfd);
  char env[sizeof path + 32];
  snprintf(env, sizeof env, "WEFT_CUDA_EMU_REPORT=%s", path);
  int status = run_child("dmabuf-report", NULL, env);
  FILE *f = fopen(path, "r");
  char line[512] = "";
  bool read = f && fgets(line, sizeof line, f);
  if (f) fclose(f);
  unlink(path);
  assert_int_equal(status, 0);
  assert_true(read);
  int pid, ipc_opened, ipc_exported, ipc_mappings, allocations, host_allocations, primary_refs;
  int exported = -1, open_now = -1, end = 0;
  long long htod = -1, dtoh = -1;
  assert_int_equal(sscanf(line,
                          "pid %d ipc_opened %d ipc_exported %d ipc_mappings %d allocations %d "
                          "host_allocations %d primary_refs %d dmabuf_exported %d dmabuf_open %d "
                          "htod_bytes %lld dtoh_bytes %lld%n",
                          &pid, &ipc_opened, &ipc_exported, &ipc_mappings, &allocations,
                          &host_allocations, &primary_refs, &exported, &open_now, &htod, &dtoh,
                          &end),
                   11);
  assert_true(htod >= 0 && dtoh >= 0);
  assert_string_equal(line + end, "\n");
  assert_int_equal(allocations, 0);
  assert_int_equal(exported, 2);
  assert_int_equal(open_now, 1);
}

/* ---- counters -------------------------------------------------------------------------- */

static void counters_follow_handles(void **state) {
  (void)state;
  weft_cuda_emu_counters before = counts();
  CUstream s;
  CUevent e;
  CUmodule m;
  void *pinned;
  CU(api->stream_create(&s, 0));
  CU(api->event_create(&e, CU_EVENT_DISABLE_TIMING));
  CU(api->module_load_data(&m, fake_fatbin));
  CU(api->mem_host_alloc(&pinned, 4096, 0));
  CUdeviceptr d = dev_alloc(4096);
  weft_cuda_emu_counters c = counts();
  assert_int_equal(c.streams, before.streams + 1);
  assert_int_equal(c.events, before.events + 1);
  assert_int_equal(c.modules, before.modules + 1);
  assert_int_equal(c.host_allocations, before.host_allocations + 1);
  assert_int_equal(c.allocations, before.allocations + 1);
  CU(api->memset_d8_async(d, 3, 4096, s));
  CU(api->memcpy_dtoh_async(pinned, d, 4096, s));
  CU(api->event_record(e, s));
  assert_int_equal(counts().pending, before.pending + 3);
  /* a stream destroyed with work queued: the handle goes now, the work runs */
  CU(api->stream_destroy(s));
  assert_int_equal(counts().streams, before.streams);
  assert_int_equal(counts().pending, before.pending + 3);
  CU(api->event_synchronize(e));
  assert_int_equal(((unsigned char *)pinned)[4095], 3);
  assert_int_equal(counts().pending, before.pending);
  CU(api->event_destroy(e));
  CU(api->module_unload(m));
  CU(api->mem_free_host(pinned));
  CU(api->mem_free(d));
  c = counts();
  assert_true(c.dtoh_bytes == before.dtoh_bytes + 4096); /* the one copy down, counted when it ran */
  assert_true(c.htod_bytes == before.htod_bytes);
  c.dtoh_bytes = before.dtoh_bytes;
  assert_memory_equal(&c, &before, sizeof c);
}

/* After every case: nothing left behind in this process. */
static int no_leftovers(void **state) {
  (void)state;
  weft_cuda_emu_counters c = counts();
  if (c.allocations || c.host_allocations || c.streams || c.events || c.modules || c.ipc_mappings ||
      c.pending || c.dmabuf_open) {
    fprintf(stderr,
            "left: %d allocations, %d pinned, %d streams, %d events, %d modules, "
            "%d IPC mappings, %d queued, %d dma-buf descriptors\n",
            c.allocations, c.host_allocations, c.streams, c.events, c.modules, c.ipc_mappings,
            c.pending, c.dmabuf_open);
    return -1;
  }
  return 0;
}

/* ---- the children --------------------------------------------------------------------- */

/* The importer: opens the handle (twice: one mapping, counted twice),
 * writes 2i + 1 through a copy, closes. Exit status: which check failed. */
static int child_ipc_write(const char *hex) {
  CUipcMemHandle h;
  CUdevice dev;
  CUcontext ctx;
  if (!hex_to_handle(hex, &h)) return 2;
  if (api->device_get(&dev, 0) || api->primary_ctx_retain(&ctx, dev) || api->ctx_set_current(ctx))
    return 3;
  CUdeviceptr p = 0, q = 0;
  if (api->ipc_open_mem_handle(&p, h, 0) != CUDA_ERROR_INVALID_VALUE) return 4; /* the flag */
  if (api->ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return 5;
  if (api->ipc_open_mem_handle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || q != p) return 6;
  if (counts().ipc_mappings != 2) return 7;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
  unsigned int type = 0;
  void *data = &type;
  if (api->pointer_get_attributes(1, &attr, &data, p + 8) || type != CU_MEMORYTYPE_DEVICE) return 8;
  float v[IPC_FLOATS];
  for (int i = 0; i < IPC_FLOATS; i++) v[i] = 2.0f * (float)i + 1.0f;
  if (api->memcpy_htod_async(p, v, sizeof v, NULL) || api->stream_synchronize(NULL)) return 9;
  if (api->ipc_close_mem_handle(p) || api->ipc_close_mem_handle(p)) return 10;
  if (api->ipc_close_mem_handle(p) != CUDA_ERROR_INVALID_VALUE) return 11;
  if (counts().ipc_mappings != 0) return 12;
  return 0;
}

static int child_ipc_refused(const char *hex) {
  CUipcMemHandle h;
  CUcontext ctx;
  if (!hex_to_handle(hex, &h)) return 2;
  if (api->primary_ctx_retain(&ctx, 0) || api->ctx_set_current(ctx)) return 3;
  CUdeviceptr p = 0;
  CUresult r = api->ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  return r == CUDA_ERROR_INVALID_VALUE && counts().ipc_mappings == 0 ? 0 : 4;
}

/* WEFT_CUDA_EMU_DEVICES=0: weft's table reports CUDA_ERROR_NO_DEVICE, the
 * driver counts no device. */
static int child_no_device(void) {
  weft_error_sink err = {0};
  if (weft_cuda_api_load(&err)) return 2;
  if (!strstr(err.msg, "CUDA_ERROR_NO_DEVICE")) return 3;
  void *lib = dlopen(getenv("WEFT_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  CUresult (*get_count)(int *);
  CUresult (*get)(CUdevice *, int);
  if (!lib) return 4;
  *(void **)&get_count = dlsym(lib, "cuDeviceGetCount");
  *(void **)&get = dlsym(lib, "cuDeviceGet");
  int n = -1;
  CUdevice dev;
  if (get_count(&n) != CUDA_SUCCESS || n != 0) return 5;
  if (get(&dev, 0) != CUDA_ERROR_NOT_INITIALIZED) return 6;
  return 0;
}

/* WEFT_CUDA_EMU_DEVICES=2: copies cross devices, a kernel may not touch
 * the other device's memory, and its error stays in its own context. */
static int child_two_devices(void) {
  int n = 0, can = -1;
  char bus[32];
  if (api->device_get_count(&n) || n != 2) return 2;
  if (api->device_get_pci_bus_id(bus, sizeof bus, 1) || strcmp(bus, "0000:01:00.0")) return 3;
  if (api->device_can_access_peer(&can, 0, 1) || can != 1) return 4;
  if (api->device_can_access_peer(&can, 1, 1) || can != 0) return 5;
  CUcontext c0, c1;
  if (api->primary_ctx_retain(&c0, 0) || api->primary_ctx_retain(&c1, 1) || c0 == c1) return 6;
  CUdeviceptr d0, d1;
  if (api->ctx_set_current(c1) || api->mem_alloc(&d1, 64)) return 7;
  if (api->ctx_set_current(c0) || api->mem_alloc(&d0, 64)) return 8;
  float v[16], out[16];
  for (int i = 0; i < 16; i++) v[i] = (float)i;
  if (api->memcpy_htod_async(d0, v, sizeof v, NULL) ||
      api->memcpy_dtod_async(d1, d0, sizeof v, NULL) || api->stream_synchronize(NULL))
    return 9;
  int ordinal = -1;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (api->pointer_get_attributes(1, &attr, &data, d1) || ordinal != 1) return 10;
  CUmodule m;
  CUfunction fn;
  if (api->module_load_data(&m, fake_fatbin) ||
      api->module_get_function(&fn, m, "weft_emu_test_add_f32"))
    return 11;
  size_t count = 16;
  void *params[] = {&d1, &d0, &d0, &count};
  /* device 0's module while device 1 is current */
  if (api->ctx_set_current(c1) ||
      api->launch_kernel(fn, 1, 1, 1, 16, 1, 1, 0, NULL, params, NULL) != CUDA_ERROR_INVALID_HANDLE)
    return 12;
  if (api->memcpy_dtoh_async(out, d1, sizeof out, NULL) || api->stream_synchronize(NULL) ||
      memcmp(out, v, sizeof v))
    return 13;
  /* a kernel of device 0 writing device 1's memory: illegal, and sticky on 0 only */
  if (api->ctx_set_current(c0) || api->launch_kernel(fn, 1, 1, 1, 16, 1, 1, 0, NULL, params, NULL))
    return 14;
  if (api->stream_synchronize(NULL) != CUDA_ERROR_ILLEGAL_ADDRESS) return 15;
  if (api->ctx_set_current(c1) || api->stream_synchronize(NULL)) return 16;
  return 0;
}

/* WEFT_CUDA_EMU_DMABUF=0: no dma-buf (the attribute says 0, every export
 * is refused), GPUDirect RDMA still said to be there. */
static int child_dmabuf_off(void) {
  handle_for_range_fn export_range;
  *(void **)&export_range = emu_sym("cuMemGetHandleForAddressRange");
  CUcontext ctx;
  int v = -1, fd = -1;
  if (!export_range) return 2;
  if (api->primary_ctx_retain(&ctx, 0) || api->ctx_set_current(ctx)) return 3;
  if (api->device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0) || v != 0) return 4;
  if (api->device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0) || v != 1)
    return 5;
  CUdeviceptr d;
  size_t page = page_size();
  if (api->mem_alloc(&d, page)) return 6;
  if (export_range(&fd, d, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) != CUDA_ERROR_NOT_SUPPORTED ||
      fd != -1)
    return 7;
  if (counts().dmabuf_exported != 0 || counts().dmabuf_open != 0) return 8;
  if (api->mem_free(d)) return 9;
  return 0;
}

/* Two exports, one closed, the memory freed with the other open: the
 * report line at exit says 2 exported, 1 open, no allocation. */
static int child_dmabuf_report(void) {
  handle_for_range_fn export_range;
  *(void **)&export_range = emu_sym("cuMemGetHandleForAddressRange");
  CUcontext ctx;
  int fd1 = -1, fd2 = -1;
  if (!export_range) return 2;
  if (api->primary_ctx_retain(&ctx, 0) || api->ctx_set_current(ctx)) return 3;
  CUdeviceptr d;
  size_t page = page_size();
  if (api->mem_alloc(&d, page)) return 4;
  if (export_range(&fd1, d, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ||
      export_range(&fd2, d, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0))
    return 5;
  if (close(fd1) || api->mem_free(d)) return 6;
  return 0;
}

static int child_main(const char *mode, const char *arg) {
  if (!strcmp(mode, "no-device")) return child_no_device();
  weft_error_sink err = {0};
  if (!(api = load(&err))) {
    fprintf(stderr, "child %s: %s\n", mode, err.msg);
    return 1;
  }
  if (!strcmp(mode, "ipc-write")) return child_ipc_write(arg);
  if (!strcmp(mode, "ipc-refused")) return child_ipc_refused(arg);
  if (!strcmp(mode, "two-devices")) return child_two_devices();
  if (!strcmp(mode, "wait-forever")) return child_wait_forever();
  if (!strcmp(mode, "dmabuf-off")) return child_dmabuf_off();
  if (!strcmp(mode, "dmabuf-report")) return child_dmabuf_report();
  return 1;
}

/* A context of the process's own (cuCtxCreate): current once made, its
 * own NULL stream, an event of the primary context refused on its streams,
 * and gone with cuCtxDestroy (the primary context unchanged). */
static void created_context_is_apart(void **state) {
  (void)state;
  const char *lib = getenv("WEFT_CUDA_LIBRARY");
  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  CUresult (*create)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
  CUresult (*destroy)(CUcontext);
  *(void **)&create = dlsym(h, "cuCtxCreate_v4");
  *(void **)&destroy = dlsym(h, "cuCtxDestroy_v2");
  assert_true(create && destroy);
  CUevent primary_event;
  CU(api->event_create(&primary_event, CU_EVENT_DISABLE_TIMING));
  CUcontext own = NULL, cur = NULL;
  CU(create(&own, NULL, 0, 0));
  CU(api->ctx_get_current(&cur));
  assert_ptr_equal(cur, own);
  assert_ptr_not_equal(own, ctx0);
  /* the primary context's event on this context's NULL stream: refused */
  assert_int_equal(api->event_record(primary_event, NULL), CUDA_ERROR_INVALID_HANDLE);
  CUevent own_event;
  CU(api->event_create(&own_event, CU_EVENT_DISABLE_TIMING));
  CU(api->event_record(own_event, NULL));
  CU(api->event_synchronize(own_event));
  CU(api->event_destroy(own_event));
  CU(destroy(own));
  assert_int_equal(api->ctx_set_current(own), CUDA_ERROR_INVALID_CONTEXT);
  CU(api->ctx_set_current(ctx0));
  CU(api->event_record(primary_event, NULL));
  CU(api->event_synchronize(primary_event));
  CU(api->event_destroy(primary_event));
}

/* cuMemCreate memory as PyTorch's expandable segments use it: mapped into a
 * reserved range, no legacy IPC handle (the attribute says 0 and
 * cuIpcGetMemHandle refuses), not cuMemFree's to free, and once unmapped its
 * address holds nothing until another handle is mapped there, whose
 * memory is other memory (issue 45: "a freed block handed out again at the
 * same address"). */
static void vmm_memory_has_no_legacy_handle(void **state) {
  (void)state;
  const char *lib = getenv("WEFT_CUDA_LIBRARY");
  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  *(void **)&reserve = dlsym(h, "cuMemAddressReserve");
  *(void **)&create = dlsym(h, "cuMemCreate");
  *(void **)&map = dlsym(h, "cuMemMap");
  *(void **)&set_access = dlsym(h, "cuMemSetAccess");
  *(void **)&unmap = dlsym(h, "cuMemUnmap");
  *(void **)&release = dlsym(h, "cuMemRelease");
  *(void **)&address_free = dlsym(h, "cuMemAddressFree");
  *(void **)&granularity = dlsym(h, "cuMemGetAllocationGranularity");
  assert_true(reserve && create && map && set_access && unmap && release && address_free && granularity);
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  size_t grain = 0;
  CU(granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  assert_true(grain > 0);
  CUdeviceptr range = 0;
  CU(reserve(&range, 4 * grain, grain, 0, 0));
  CUmemGenericAllocationHandle a, b;
  CU(create(&a, grain, &prop, 0));
  CU(map(range + grain, grain, 0, a, 0));
  CUmemAccessDesc rw = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU(set_access(range + grain, grain, &rw, 1));
  /* a second mapping over the first is refused */
  assert_int_equal(map(range + grain, grain, 0, a, 0), CUDA_ERROR_INVALID_VALUE);
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  unsigned int type = 0, legacy = 1;
  void *data[2] = {&type, &legacy};
  CU(api->pointer_get_attributes(2, attrs, data, range + grain + 8));
  assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
  assert_int_equal(legacy, 0);
  CUipcMemHandle ipc;
  assert_int_equal(api->ipc_get_mem_handle(&ipc, range + grain), CUDA_ERROR_NOT_SUPPORTED);
  assert_int_equal(api->mem_free(range + grain), CUDA_ERROR_INVALID_VALUE);
  /* it holds what is written to it */
  uint32_t v = 0xabcd1234, got = 0;
  CU(api->memcpy_htod_async(range + grain, &v, 4, NULL));
  CU(api->memcpy_dtoh_async(&got, range + grain, 4, NULL));
  CU(api->stream_synchronize(NULL));
  assert_int_equal(got, v);
  /* unmapped: nothing there; mapped again to other memory (zeroed) */
  CU(unmap(range + grain, grain));
  type = 1;
  CU(api->pointer_get_attributes(1, attrs, data, range + grain));
  assert_int_equal(type, 0);
  CU(create(&b, grain, &prop, 0));
  CU(map(range + grain, grain, 0, b, 0));
  CU(api->memcpy_dtoh_async(&got, range + grain, 4, NULL));
  CU(api->stream_synchronize(NULL));
  assert_int_equal(got, 0);
  /* the range goes only once nothing is mapped in it */
  assert_int_equal(address_free(range, 4 * grain), CUDA_ERROR_INVALID_VALUE);
  CU(unmap(range + grain, grain));
  CU(release(a));
  CU(release(b));
  CU(address_free(range, 4 * grain));
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--child")) return child_main(argv[2], argv[3]);
  /* argv[0] rather than /proc/self/exe: under valgrind that is valgrind */
  if (strchr(argv[0], '/') && !realpath(argv[0], self)) snprintf(self, sizeof self, "%s", argv[0]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(driver_devices_contexts, no_leftovers),
      cmocka_unit_test_teardown(error_words_for_every_code, no_leftovers),
      cmocka_unit_test_teardown(host_dereference_of_device_pointer_faults, no_leftovers),
      cmocka_unit_test_teardown(pointers_classified, no_leftovers),
      cmocka_unit_test_teardown(copies_run_late_in_stream_order, no_leftovers),
      cmocka_unit_test_teardown(cross_stream_waits_kept, no_leftovers),
      cmocka_unit_test_teardown(stream_wait_value_holds_its_stream, no_leftovers),
      cmocka_unit_test_teardown(hung_synchronize_aborts, no_leftovers),
      cmocka_unit_test_teardown(spin_kernel_holds_its_stream, no_leftovers),
      cmocka_unit_test_teardown(legacy_stream_orders_blocking_streams, no_leftovers),
      cmocka_unit_test_teardown(events_complete_after_their_work, no_leftovers),
      cmocka_unit_test_teardown(illegal_address_is_sticky, no_leftovers),
      cmocka_unit_test_teardown(kernel_from_module_table_adds, no_leftovers),
      cmocka_unit_test_teardown(ipc_across_processes, no_leftovers),
      cmocka_unit_test_teardown(forked_child_cannot_use_the_driver, no_leftovers),
      cmocka_unit_test_teardown(counters_follow_handles, no_leftovers),
      cmocka_unit_test_teardown(vmm_memory_has_no_legacy_handle, no_leftovers),
      cmocka_unit_test_teardown(created_context_is_apart, no_leftovers),
      cmocka_unit_test_teardown(gpudirect_rdma_attributes, no_leftovers),
      cmocka_unit_test_teardown(dmabuf_export_shares_device_memory, no_leftovers),
      cmocka_unit_test_teardown(dmabuf_export_refusals, no_leftovers),
      cmocka_unit_test_teardown(dmabuf_counters_in_the_report, no_leftovers),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
