/* cuda_mem.c - the device memory table (mem.h) on the CUDA driver table:
 * pointer classification, a stream per communicator whose completion tokens
 * are events the engine polls (never a stream synchronize per chunk), copies
 * between device memory and pinned host memory, pinned slots and device
 * scratch. Every driver call runs in the primary context of the buffer's
 * device, made current first: the engine's progress thread has none of its
 * own. Every failure names the driver call, the device and the buffer. */
#include "src/cuda/cuda_mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error_sink.h"
#include "src/base/log.h"
#include "src/base/net.h"
#include "src/base/status.h"
#include "src/cuda/cuda_api.h"
#include "src/cuda/kernels.h"
#include "src/mem/kept.h"

/* ---- the driver, once per process ----------------------------------------- */

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int cuda_state; /* 0: not asked yet, 1: usable, -1: not */
static const weft_cuda_api *cuda;
static char cuda_why[512];
/* device 0's primary context, for calls that need a context but no device in
 * particular on a thread that has none current: retained on first such need,
 * never at load (enter_any_context) */
static CUcontext cuda_any_ctx;

static bool cuda_load(void) {
  int state = atomic_load_explicit(&cuda_state, memory_order_acquire);
  if (state) return state > 0;
  pthread_mutex_lock(&cuda_lock);
  if (!atomic_load(&cuda_state)) {
    weft_error_sink err = {0};
    const weft_cuda_api *api = weft_cuda_api_load(&err);
    int count = 0;
    CUdevice dev;
    CUresult r;
    if (!api) {
      snprintf(cuda_why, sizeof cuda_why, "%s", err.msg);
    } else if ((r = api->device_get_count(&count)) != CUDA_SUCCESS || count < 1) {
      char words[160] = "no device";
      if (r != CUDA_SUCCESS) weft_cuda_error_words(api, r, words, sizeof words);
      snprintf(cuda_why, sizeof cuda_why, "cuda: %s loaded, but cuDeviceGetCount: %s",
               api->library, words);
    } else if ((r = api->device_get(&dev, 0)) != CUDA_SUCCESS) {
      char words[160];
      weft_cuda_error_words(api, r, words, sizeof words);
      snprintf(cuda_why, sizeof cuda_why, "cuda: cuDeviceGet(0): %s", words);
    } else {
      /* no context here: classifying a pointer needs none, and a process
       * that passes host memory only must not hold one on any GPU (about
       * 500 MB of its memory, and a line in nvidia-smi) */
      cuda = api;
      snprintf(cuda_why, sizeof cuda_why, "cuda: %s, %d device%s, driver for CUDA %d.%d",
               api->library, count, count > 1 ? "s" : "", api->driver_version / 1000,
               api->driver_version % 1000 / 10);
    }
    atomic_store_explicit(&cuda_state, cuda ? 1 : -1, memory_order_release);
  }
  pthread_mutex_unlock(&cuda_lock);
  return cuda != NULL;
}

bool weft_cuda_usable(char *why, size_t why_len) {
  bool usable = cuda_load();
  if (why && why_len) snprintf(why, why_len, "%s", cuda_why);
  return usable;
}

weft_memory weft_cuda_pointer_kind(const void *ptr, int *ordinal) {
  if (!ptr || !cuda_load()) return WEFT_MEMORY_HOST;
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  CU_POINTER_ATTRIBUTE_IS_MANAGED};
  unsigned int type = 0;
  int device = -2;
  unsigned int managed = 0;
  void *data[3] = {&type, &device, &managed};
  /* memory the driver does not know (pageable host) answers with type 0 */
  if (cuda->pointer_get_attributes(3, attrs, data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
    return WEFT_MEMORY_HOST;
  /* managed memory is reachable from the host: its pages migrate */
  if (type != CU_MEMORYTYPE_DEVICE || managed) return WEFT_MEMORY_HOST;
  if (ordinal) *ordinal = device;
  return WEFT_MEMORY_DEVICE;
}

/* ---- the caller's context ------------------------------------------------------
 *
 * Every driver call runs in the primary context of the buffer's device, made
 * current on the calling thread. On a user's thread the context that was
 * current before goes back when the weft call returns (weft_cuda_thread_
 * restore, from the API layer), so a process that drives several GPUs, or a
 * context of its own, finds its context as it left it. The first switch of
 * a call (after weft_cuda_thread_enter, at its entry) remembers it; the
 * progress thread, weft's own, never restores. */
static __thread bool caller_saved;
static __thread CUcontext caller_ctx;

static CUresult switch_context(CUcontext target) {
  if (!caller_saved) {
    CUcontext now = NULL;
    if (cuda->ctx_get_current(&now) == CUDA_SUCCESS && now == target) return CUDA_SUCCESS;
    caller_ctx = now;
    caller_saved = true;
  }
  return cuda->ctx_set_current(target);
}

void weft_cuda_thread_enter(void) {
  caller_saved = false; /* whatever was remembered belongs to no call of the user's */
}

void weft_cuda_thread_restore(void) {
  if (!caller_saved) return;
  caller_saved = false;
  if (cuda) cuda->ctx_set_current(caller_ctx);
}

/* A context current on this thread for a call that needs one but no device
 * in particular (pinned host memory, PORTABLE to every context): the one
 * current already (a communicator's stream made its device's current on the
 * threads that use it), else device 0's primary context, retained once. */
static bool enter_any_context(void) {
  CUcontext ctx = NULL;
  if (!cuda_load()) return false;
  if (cuda->ctx_get_current(&ctx) == CUDA_SUCCESS && ctx) return true;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&cuda_lock);
  if (!cuda_any_ctx) {
    CUdevice dev;
    r = cuda->device_get(&dev, 0);
    if (r == CUDA_SUCCESS) r = cuda->primary_ctx_retain(&cuda_any_ctx, dev);
  }
  pthread_mutex_unlock(&cuda_lock);
  return r == CUDA_SUCCESS && switch_context(cuda_any_ctx) == CUDA_SUCCESS;
}

/* ---- errors ------------------------------------------------------------------ */

/* Words for a failed driver call into `errors` (may be NULL: logged only);
 * returns the status the caller reports. */
static weft_status cuda_fail(weft_error_sink *errors, CUresult r, const char *call, int device,
                             const void *buffer, size_t bytes) {
  char words[160];
  weft_cuda_error_words(cuda, r, words, sizeof words);
  char what[400];
  if (buffer)
    snprintf(what, sizeof what, "cuda: %s on device %d, buffer %p (%zu bytes): %s", call, device,
             buffer, bytes, words);
  else
    snprintf(what, sizeof what, "cuda: %s on device %d: %s", call, device, words);
  if (errors) weft_error_sink_set(errors, "%s", what);
  WEFT_WARN(WEFT_SUBSYS_COLL, "%s", what);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? WEFT_ERR_NOMEM : WEFT_ERR_SYSTEM;
}

/* Makes device `ordinal`'s primary context current on this thread (the
 * engine's progress thread has none of its own); false when it cannot. */
static bool enter_device(int ordinal) {
  CUdevice dev;
  CUcontext ctx;
  if (cuda->device_get(&dev, ordinal) != CUDA_SUCCESS ||
      cuda->primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS)
    return false;
  cuda->primary_ctx_release(dev); /* a stream or the buffer keeps it alive */
  return switch_context(ctx) == CUDA_SUCCESS;
}

bool weft_cuda_caller_context_foreign(int ordinal) {
  if (!cuda) return false;
  CUcontext caller = NULL;
  if (caller_saved)
    caller = caller_ctx;
  else if (cuda->ctx_get_current(&caller) != CUDA_SUCCESS)
    return false;
  if (!caller) return false;
  /* the buffer's device's first (the usual case), then the others': a
   * process driving several GPUs may have another device's current */
  int n = 0;
  if (cuda->device_get_count(&n) != CUDA_SUCCESS) return false;
  for (int k = -1; k < n; k++) {
    int o = k < 0 ? ordinal : k;
    if (k == ordinal) continue;
    CUdevice dev;
    CUcontext primary;
    if (cuda->device_get(&dev, o) != CUDA_SUCCESS || cuda->primary_ctx_retain(&primary, dev) != CUDA_SUCCESS)
      continue;
    cuda->primary_ctx_release(dev);
    if (caller == primary) return false;
  }
  return true;
}

/* The device a buffer is on (0 for memory the driver does not know). */
static int device_of(const void *ptr) {
  int ordinal = 0;
  weft_cuda_pointer_kind(ptr, &ordinal);
  return ordinal;
}

/* ---- a communicator's stream and its tokens ----------------------------------- */

/* Tokens in flight per stream at first. The ring doubles when every event
 * in it is still needed: weft.h puts no limit on calls in flight short of
 * memory (a backward pass issues one call per gradient tensor). */
#define CUDA_EVENTS_FIRST 256

struct weft_mem_stream {
  int ordinal;
  CUdevice device;
  CUcontext ctx;
  CUstream stream;
  /* The tokens: recorded at issue on the caller's thread and polled on the
   * progress thread, so the ring, which moves when it grows, is theirs under
   * the lock (uncontended but for those two). */
  pthread_mutex_t lock;
  CUevent *events;   /* token t is events[t % nevents]; created on first use */
  size_t nevents;    /* a power of two */
  uint64_t recorded; /* tokens issued (the last one's number) */
  uint64_t done;     /* every token up to this one is complete */
  CUevent user_before; /* the link from the user's stream (stream_after_user) */
  /* The word the user's streams wait on (user_wait_signal), written by this
   * stream's work (signal): device memory of its context, made on first
   * use. The user streams that wait on it are kept, so that it is freed
   * only once each has passed its waits. */
  CUdeviceptr signal;
  CUstream *waiters;
  size_t nwaiters, waiters_cap;
  weft_error_sink *errors;
};

/* How long stream_destroy waits for the user's streams to pass their waits
 * on the signal word before it leaves the word allocated (a stream blocked
 * by the user's own work must not make weft_comm_destroy hang). */
#define CUDA_SIGNAL_RELEASE_S 10.0

static CUresult cuda_enter(const weft_mem_stream *s) {
  return switch_context(s->ctx);
}

weft_status weft_cuda_stream_create(int ordinal, weft_mem_stream **out, void *errors) {
  *out = NULL;
  if (!cuda_load()) {
    if (errors) weft_error_sink_set(errors, "%s", cuda_why);
    return WEFT_ERR_UNSUPPORTED;
  }
  weft_mem_stream *s = calloc(1, sizeof *s);
  CUevent *events = calloc(CUDA_EVENTS_FIRST, sizeof *events);
  if (!s || !events) {
    free(s);
    free(events);
    return WEFT_ERR_NOMEM;
  }
  s->events = events;
  s->nevents = CUDA_EVENTS_FIRST;
  pthread_mutex_init(&s->lock, NULL);
  s->ordinal = ordinal;
  s->errors = errors;
  CUresult r;
  const char *call = "cuDeviceGet";
  if ((r = cuda->device_get(&s->device, ordinal)) != CUDA_SUCCESS) goto fail;
  call = "cuDevicePrimaryCtxRetain";
  if ((r = cuda->primary_ctx_retain(&s->ctx, s->device)) != CUDA_SUCCESS) goto fail;
  call = "cuCtxSetCurrent";
  if ((r = cuda_enter(s)) != CUDA_SUCCESS) goto fail;
  call = "cuStreamCreate";
  if ((r = cuda->stream_create(&s->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) goto fail;
  call = "cuEventCreate";
  if ((r = cuda->event_create(&s->user_before, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) goto fail;
  *out = s;
  return WEFT_OK;
fail:;
  weft_status st = cuda_fail(errors, r, call, ordinal, NULL, 0);
  weft_cuda_stream_destroy(s);
  return st;
}

/* Every user stream that waited on the signal word has passed those waits
 * (an event recorded on each now completes), within CUDA_SIGNAL_RELEASE_S.
 * False when one has not, or cannot be asked (a stream the user destroyed:
 * its queued work still runs). */
static bool waiters_passed(weft_mem_stream *s) {
  CUevent passed = NULL;
  if (cuda->event_create(&passed, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
  bool ok = true;
  for (size_t i = 0; i < s->nwaiters && ok; i++) {
    ok = cuda->event_record(passed, s->waiters[i]) == CUDA_SUCCESS;
    double deadline = weft_now() + CUDA_SIGNAL_RELEASE_S;
    CUresult r = CUDA_ERROR_NOT_READY;
    while (ok && (r = cuda->event_query(passed)) == CUDA_ERROR_NOT_READY && weft_now() < deadline)
      usleep(100);
    ok = ok && r == CUDA_SUCCESS;
  }
  cuda->event_destroy(passed);
  return ok;
}

/* The signal word goes once nothing can read it any more; else it stays
 * allocated (a few bytes), said at INFO, rather than read after free. */
static void signal_free(weft_mem_stream *s) {
  if (!s->signal) return;
  if (waiters_passed(s))
    cuda->mem_free(s->signal);
  else
    WEFT_INFO(WEFT_SUBSYS_COLL,
              "cuda: device %d: a stream of the user's still waits for weft's signal word (or was "
              "destroyed) after %.0f s; the word stays allocated",
              s->ordinal, CUDA_SIGNAL_RELEASE_S);
  s->signal = 0;
}

void weft_cuda_stream_destroy(weft_mem_stream *s) {
  if (!s) return;
  if (s->ctx && cuda_enter(s) == CUDA_SUCCESS) {
    /* nothing of ours may run on after this: the buffers may be freed */
    if (s->stream) cuda->stream_synchronize(s->stream);
    for (size_t i = 0; i < s->nevents; i++)
      if (s->events[i]) cuda->event_destroy(s->events[i]);
    if (s->user_before) cuda->event_destroy(s->user_before);
    if (s->stream) cuda->stream_destroy(s->stream);
    signal_free(s);
  }
  free(s->waiters);
  if (s->ctx) cuda->primary_ctx_release(s->device);
  pthread_mutex_destroy(&s->lock);
  free(s->events);
  free(s);
}

/* The table's stream_create: the device of the calling thread's context,
 * else device 0 (src/coll asks weft_cuda_stream_create with the buffer's). */
static weft_status device_stream_create(weft_mem_stream **stream, void *errors) {
  int ordinal = 0;
  CUcontext ctx = NULL;
  if (cuda_load() && cuda->ctx_get_current(&ctx) == CUDA_SUCCESS && ctx) {
    /* the current context's device: its primary context is the one we use */
    CUdevice dev;
    for (int i = 0; cuda->device_get(&dev, i) == CUDA_SUCCESS; i++) {
      CUcontext primary = NULL;
      if (cuda->primary_ctx_retain(&primary, dev) != CUDA_SUCCESS) break;
      cuda->primary_ctx_release(dev);
      if (primary == ctx) {
        ordinal = i;
        break;
      }
    }
  }
  return weft_cuda_stream_create(ordinal, stream, errors);
}

static weft_status device_stream_after_user(weft_mem_stream *s, void *user_stream) {
  CUresult r;
  const char *call = "cuCtxSetCurrent";
  if ((r = cuda_enter(s)) != CUDA_SUCCESS) goto fail;
  call = "cuEventRecord (the user's stream)";
  if ((r = cuda->event_record(s->user_before, (CUstream)user_stream)) != CUDA_SUCCESS) goto fail;
  call = "cuStreamWaitEvent";
  if ((r = cuda->stream_wait_event(s->stream, s->user_before, 0)) != CUDA_SUCCESS) goto fail;
  return WEFT_OK;
fail:
  return cuda_fail(s->errors, r, call, s->ordinal, NULL, 0);
}

/* The user's stream waits at the point of issue for a value this stream
 * writes later (signal): the call's work is queued only when it runs, so no
 * event of it exists yet to wait for. GEQ compares with wrap-around, so a
 * 32-bit count of calls never runs out. */
/* The signal word, made on first use: it starts at 0, so every value from
 * 1 is still to come. The caller entered the stream's context. */
static CUresult signal_word(weft_mem_stream *s, const char **call) {
  if (s->signal) return CUDA_SUCCESS;
  CUresult r;
  *call = "cuMemAlloc (the signal word)";
  if ((r = cuda->mem_alloc(&s->signal, sizeof(uint32_t))) != CUDA_SUCCESS) return r;
  *call = "cuMemsetD8Async (the signal word)";
  if ((r = cuda->memset_d8_async(s->signal, 0, sizeof(uint32_t), s->stream)) != CUDA_SUCCESS ||
      (r = cuda->stream_synchronize(s->stream)) != CUDA_SUCCESS) {
    cuda->mem_free(s->signal);
    s->signal = 0;
  }
  return r;
}

weft_status weft_cuda_signal_prepare(weft_mem_stream *s) {
  const char *call = "cuCtxSetCurrent";
  CUresult r = cuda_enter(s);
  if (r == CUDA_SUCCESS) r = signal_word(s, &call);
  return r == CUDA_SUCCESS ? WEFT_OK : cuda_fail(s->errors, r, call, s->ordinal, NULL, 0);
}

static weft_status device_user_wait_signal(void *user_stream, weft_mem_stream *s, uint32_t value) {
  CUresult r;
  const char *call = "cuCtxSetCurrent";
  if ((r = cuda_enter(s)) != CUDA_SUCCESS) goto fail;
  if ((r = signal_word(s, &call)) != CUDA_SUCCESS) goto fail;
  size_t i = 0;
  while (i < s->nwaiters && s->waiters[i] != (CUstream)user_stream) i++;
  if (i == s->nwaiters) {
    if (s->nwaiters == s->waiters_cap) {
      size_t cap = s->waiters_cap ? 2 * s->waiters_cap : 4;
      CUstream *w = realloc(s->waiters, cap * sizeof *w);
      if (!w) return WEFT_ERR_NOMEM;
      s->waiters = w;
      s->waiters_cap = cap;
    }
    s->waiters[s->nwaiters++] = (CUstream)user_stream;
  }
  call = "cuStreamWaitValue32 (the user's stream)";
  if ((r = cuda->stream_wait_value32((CUstream)user_stream, s->signal, value,
                                     CU_STREAM_WAIT_VALUE_GEQ)) != CUDA_SUCCESS)
    goto fail;
  return WEFT_OK;
fail:
  return cuda_fail(s->errors, r, call, s->ordinal, NULL, 0);
}

/* Queued on this stream: the signal word becomes `value` once the work
 * before it is done. Nothing where no user stream ever waited. */
static weft_status device_signal(weft_mem_stream *s, uint32_t value) {
  if (!s->signal) return WEFT_OK;
  CUresult r = cuda_enter(s);
  if (r == CUDA_SUCCESS)
    r = cuda->stream_write_value32(s->stream, s->signal, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) return cuda_fail(s->errors, r, "cuStreamWriteValue32", s->ordinal, NULL, 0);
  return WEFT_OK;
}

static weft_status poll_locked(weft_mem_stream *s, weft_mem_token token) {
  if (token <= s->done) return WEFT_OK;
  CUresult r = cuda_enter(s);
  if (r != CUDA_SUCCESS) return cuda_fail(s->errors, r, "cuCtxSetCurrent", s->ordinal, NULL, 0);
  /* tokens complete in the order they were issued on one stream */
  while (s->done < token) {
    r = cuda->event_query(s->events[(s->done + 1) % s->nevents]);
    if (r == CUDA_ERROR_NOT_READY) return WEFT_AGAIN;
    if (r != CUDA_SUCCESS)
      return cuda_fail(s->errors, r, "cuEventQuery (work of this rank's stream)", s->ordinal,
                       NULL, 0);
    s->done++;
  }
  return WEFT_OK;
}

/* Doubles the ring: the tokens in flight (done+1 .. recorded) keep their
 * events, moved to where their numbers fall in the larger ring; the idle
 * events fill other slots, to be reused. */
static weft_status events_grow(weft_mem_stream *s) {
  size_t n = s->nevents * 2;
  CUevent *grown = calloc(n, sizeof *grown);
  if (!grown) {
    if (s->errors)
      weft_error_sink_set(s->errors, "no memory for %zu CUDA events (calls in flight on one stream)", n);
    return WEFT_ERR_NOMEM;
  }
  for (uint64_t t = s->done + 1; t <= s->recorded; t++) {
    grown[t % n] = s->events[t % s->nevents];
    s->events[t % s->nevents] = NULL;
  }
  size_t free_slot = 0;
  for (size_t i = 0; i < s->nevents; i++) {
    if (!s->events[i]) continue;
    while (grown[free_slot]) free_slot++; /* n > tokens in flight + idle events: a slot is free */
    grown[free_slot] = s->events[i];
  }
  free(s->events);
  s->events = grown;
  s->nevents = n;
  return WEFT_OK;
}

static weft_status device_poll(weft_mem_stream *s, weft_mem_token token) {
  pthread_mutex_lock(&s->lock);
  weft_status st = poll_locked(s, token);
  pthread_mutex_unlock(&s->lock);
  return st;
}

static weft_status record_locked(weft_mem_stream *s, weft_mem_token *token) {
  if (s->recorded - s->done >= s->nevents - 1) {
    weft_status st = poll_locked(s, s->done + 1);
    if (st < 0) return st;
    /* the oldest token is not done: its event is still needed, so the ring grows */
    if (st == WEFT_AGAIN) WEFT_CHECK(events_grow(s));
  }
  CUresult r = cuda_enter(s);
  if (r != CUDA_SUCCESS) return cuda_fail(s->errors, r, "cuCtxSetCurrent", s->ordinal, NULL, 0);
  CUevent *ev = &s->events[(s->recorded + 1) % s->nevents];
  if (!*ev && (r = cuda->event_create(ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
    return cuda_fail(s->errors, r, "cuEventCreate", s->ordinal, NULL, 0);
  if ((r = cuda->event_record(*ev, s->stream)) != CUDA_SUCCESS)
    return cuda_fail(s->errors, r, "cuEventRecord", s->ordinal, NULL, 0);
  *token = ++s->recorded;
  return WEFT_OK;
}

static weft_status device_record(weft_mem_stream *s, weft_mem_token *token) {
  pthread_mutex_lock(&s->lock);
  weft_status st = record_locked(s, token);
  pthread_mutex_unlock(&s->lock);
  return st;
}

static weft_status device_copy_to_host(void *host, const void *src, size_t bytes,
                                       weft_mem_stream *s, weft_mem_token *token) {
  *token = 0;
  if (!bytes) return WEFT_OK;
  CUresult r = cuda_enter(s);
  if (r == CUDA_SUCCESS)
    r = cuda->memcpy_dtoh_async(host, (CUdeviceptr)(uintptr_t)src, bytes, s->stream);
  if (r != CUDA_SUCCESS) return cuda_fail(s->errors, r, "cuMemcpyDtoHAsync", s->ordinal, src, bytes);
  return device_record(s, token);
}

static weft_status device_copy_from_host(void *dst, const void *host, size_t bytes,
                                         weft_mem_stream *s, weft_mem_token *token) {
  *token = 0;
  if (!bytes) return WEFT_OK;
  CUresult r = cuda_enter(s);
  if (r == CUDA_SUCCESS)
    r = cuda->memcpy_htod_async((CUdeviceptr)(uintptr_t)dst, host, bytes, s->stream);
  if (r != CUDA_SUCCESS) return cuda_fail(s->errors, r, "cuMemcpyHtoDAsync", s->ordinal, dst, bytes);
  return device_record(s, token);
}

static weft_status device_copy_async(void *dst, const void *src, size_t bytes, weft_mem_stream *s,
                                     weft_mem_token *token) {
  *token = 0;
  if (!bytes || dst == src) return WEFT_OK;
  CUresult r = cuda_enter(s);
  if (r == CUDA_SUCCESS)
    r = cuda->memcpy_dtod_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                                s->stream);
  if (r != CUDA_SUCCESS) return cuda_fail(s->errors, r, "cuMemcpyDtoDAsync", s->ordinal, dst, bytes);
  return device_record(s, token);
}

/* ---- allocation ------------------------------------------------------------------ */

/* Pinned host memory: any device's context will do (PORTABLE). */
static void *device_alloc_slots(size_t bytes) {
  void *p = NULL;
  if (!enter_any_context()) return NULL;
  CUresult r = cuda->mem_host_alloc(&p, bytes ? bytes : 1, CU_MEMHOSTALLOC_PORTABLE);
  if (r != CUDA_SUCCESS) {
    cuda_fail(NULL, r, "cuMemHostAlloc", 0, NULL, bytes);
    return NULL;
  }
  return p;
}

void *weft_cuda_alloc_shared_pinned(size_t bytes) {
  void *p = NULL;
  if (!enter_any_context() || weft_mem_alloc(bytes ? bytes : 1, &p) != WEFT_OK) return NULL;
  CUresult r = cuda->mem_host_register(p, bytes ? bytes : 1, CU_MEMHOSTREGISTER_PORTABLE);
  if (r != CUDA_SUCCESS) {
    cuda_fail(NULL, r, "cuMemHostRegister (shared staging)", 0, p, bytes);
    weft_mem_free(p);
    return NULL;
  }
  return p;
}

void weft_cuda_free_shared_pinned(void *ptr) {
  if (!ptr) return;
  if (cuda && enter_any_context()) cuda->mem_host_unregister(ptr);
  weft_mem_free(ptr);
}

static void device_free_slots(void *ptr, size_t bytes) {
  (void)bytes;
  if (ptr && cuda && enter_any_context()) cuda->mem_free_host(ptr);
}

/* Device memory of the calling thread's current device (device 0 if none). */
static void *device_alloc_scratch(size_t bytes) {
  if (!cuda_load()) return NULL;
  if (!enter_any_context()) return NULL;
  CUdeviceptr p = 0;
  CUresult r = cuda->mem_alloc(&p, bytes ? bytes : 1);
  if (r != CUDA_SUCCESS) {
    cuda_fail(NULL, r, "cuMemAlloc", 0, NULL, bytes);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

static void device_free_scratch(void *ptr) {
  if (ptr && cuda && enter_device(device_of(ptr))) cuda->mem_free((CUdeviceptr)(uintptr_t)ptr);
}

void *weft_cuda_alloc_on(int ordinal, size_t bytes) {
  if (!cuda_load() || !enter_device(ordinal)) return NULL;
  CUdeviceptr p = 0;
  CUresult r = cuda->mem_alloc(&p, bytes ? bytes : 1);
  if (r != CUDA_SUCCESS) {
    cuda_fail(NULL, r, "cuMemAlloc", ordinal, NULL, bytes);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

static void *device_alloc(size_t bytes) {
  void *p = device_alloc_scratch(bytes);
  if (!p) return NULL;
  if (cuda->memset_d8_async((CUdeviceptr)(uintptr_t)p, 0, bytes, NULL) != CUDA_SUCCESS ||
      cuda->stream_synchronize(NULL) != CUDA_SUCCESS) {
    device_free_scratch(p);
    return NULL;
  }
  return p;
}

/* ---- the synchronous members ----------------------------------------------------- */

/* The synchronous members run on the legacy default stream, unless the
 * calling thread said otherwise (weft_cuda_sync_begin): an algorithm that
 * works on device buffers over the device channel runs them on the
 * communicator's stream, which does not wait for the user's streams as the
 * legacy one does (a user stream may wait for this very call's signal). */
static __thread weft_mem_stream *sync_on;
static __thread weft_status sync_error;

void weft_cuda_sync_begin(weft_mem_stream *s) {
  sync_on = s;
  sync_error = WEFT_OK;
}

weft_status weft_cuda_sync_end(void) {
  weft_status st = sync_error;
  sync_on = NULL;
  sync_error = WEFT_OK;
  return st;
}

static CUstream sync_stream(void) {
  return sync_on ? sync_on->stream : NULL;
}

/* A failed synchronous member: said, and kept for weft_cuda_sync_end. */
static void sync_fail(CUresult r, const char *what, int device, const void *dst, size_t n) {
  weft_status st = cuda_fail(sync_on ? sync_on->errors : NULL, r, what, device, dst, n);
  if (sync_on && !sync_error) sync_error = st;
}

/* A copy within device memory, done when it returns. */
static void device_copy(void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src || !cuda || !enter_device(device_of(dst))) return;
  CUresult r = cuda->memcpy_dtod_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                       bytes, sync_stream());
  if (r == CUDA_SUCCESS) r = cuda->stream_synchronize(sync_stream());
  if (r != CUDA_SUCCESS) sync_fail(r, "cuMemcpyDtoDAsync", device_of(dst), dst, bytes);
}

/* ---- the kernels (kernels.cu, kernels.h) ----------------------------------------- */

#define CUDA_MAX_DEVICES 64

/* One device's module and functions, loaded on first use. */
typedef struct cuda_kernels {
  bool tried, loaded;
  CUmodule module;
  CUfunction reduce[WEFT_DTYPE_COUNT], finish[WEFT_DTYPE_COUNT], scale[WEFT_DTYPE_COUNT];
  CUfunction direct[WEFT_DTYPE_COUNT], pieces[WEFT_DTYPE_COUNT];
  CUfunction narrow, widen, wire_reduce;
} cuda_kernels;

static cuda_kernels cuda_kernels_of[CUDA_MAX_DEVICES];
static pthread_mutex_t cuda_kernels_lock = PTHREAD_MUTEX_INITIALIZER;

/* The kernels of device `ordinal`, its primary context made current; NULL
 * with the reason in `errors` (NULL: logged) when there are none. */
static const cuda_kernels *kernels_for(int ordinal, weft_error_sink *errors) {
  if (!cuda_load() || ordinal < 0 || ordinal >= CUDA_MAX_DEVICES) return NULL;
  if (!enter_device(ordinal)) {
    if (errors)
      weft_error_sink_set(errors, "cuda: device %d's context cannot be made current", ordinal);
    return NULL;
  }
  CUresult r;
  cuda_kernels *k = &cuda_kernels_of[ordinal];
  pthread_mutex_lock(&cuda_kernels_lock);
  if (!k->tried) {
    k->tried = true;
#ifdef WEFT_HAVE_CUDA_KERNELS
    static const char *const names[] = WEFT_CUDA_DTYPE_NAMES;
    char name[64];
    r = cuda->module_load_data(&k->module, weft_cuda_fatbin);
    for (int d = 0; r == CUDA_SUCCESS && d < WEFT_DTYPE_COUNT; d++) {
      snprintf(name, sizeof name, "weft_k_reduce_%s", names[d]);
      r = cuda->module_get_function(&k->reduce[d], k->module, name);
      snprintf(name, sizeof name, "weft_k_finish_%s", names[d]);
      if (r == CUDA_SUCCESS) r = cuda->module_get_function(&k->finish[d], k->module, name);
      snprintf(name, sizeof name, "weft_k_scale_%s", names[d]);
      if (r == CUDA_SUCCESS) r = cuda->module_get_function(&k->scale[d], k->module, name);
      snprintf(name, sizeof name, "weft_k_direct_%s", names[d]);
      if (r == CUDA_SUCCESS) r = cuda->module_get_function(&k->direct[d], k->module, name);
      snprintf(name, sizeof name, "weft_k_pieces_%s", names[d]);
      if (r == CUDA_SUCCESS) r = cuda->module_get_function(&k->pieces[d], k->module, name);
    }
    if (r == CUDA_SUCCESS) r = cuda->module_get_function(&k->narrow, k->module, "weft_k_wire_narrow");
    if (r == CUDA_SUCCESS) r = cuda->module_get_function(&k->widen, k->module, "weft_k_wire_widen");
    if (r == CUDA_SUCCESS)
      r = cuda->module_get_function(&k->wire_reduce, k->module, "weft_k_wire_reduce");
    k->loaded = r == CUDA_SUCCESS;
    if (!k->loaded) cuda_fail(errors, r, "cuModuleLoadData (weft's kernels)", ordinal, NULL, 0);
#else
    if (errors) weft_error_sink_set(errors, "cuda: this build of weft has no kernels (no nvcc)");
#endif
  }
  pthread_mutex_unlock(&cuda_kernels_lock);
  return k->loaded ? k : NULL;
}

/* One launch over n elements on `stream`. */
static CUresult launch(CUfunction fn, size_t n, CUstream stream, void **params) {
  size_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096; /* grid-stride loops take the rest */
  if (blocks == 0) blocks = 1;
  return cuda->launch_kernel(fn, (unsigned)blocks, 1, 1, 256, 1, 1, 0, stream, params, NULL);
}

/* A synchronous member: launch (on sync_stream), wait for it. */
static void launch_sync(CUfunction fn, size_t n, void **params, const char *what, const void *dst) {
  CUresult r = launch(fn, n, sync_stream(), params);
  if (r == CUDA_SUCCESS) r = cuda->stream_synchronize(sync_stream());
  if (r != CUDA_SUCCESS) sync_fail(r, what, device_of(dst), dst, n);
}

static void device_reduce(void *dst, const void *a, const void *b, size_t count, weft_dtype dtype,
                          weft_op op, int postdiv) {
  const cuda_kernels *k = count ? kernels_for(device_of(dst), sync_on ? sync_on->errors : NULL) : NULL;
  if (count && !k && sync_on && !sync_error) sync_error = WEFT_ERR_UNSUPPORTED;
  if (!k || (unsigned)dtype >= WEFT_DTYPE_COUNT) return;
  int op_i = (int)op;
  void *params[] = {&dst, &a, &b, &count, &op_i, &postdiv};
  launch_sync(k->reduce[dtype], count, params, "cuLaunchKernel (weft_k_reduce)", dst);
}

static void device_finish(void *dst, const void *src, size_t count, weft_dtype dtype, weft_op op,
                          int postdiv) {
  if (!count || (unsigned)dtype >= WEFT_DTYPE_COUNT) return;
  if (op != WEFT_AVG || postdiv <= 1) {
    device_copy(dst, src, count * weft_dtype_size(dtype));
    return;
  }
  const cuda_kernels *k = kernels_for(device_of(dst), NULL);
  if (!k) return;
  void *params[] = {&dst, &src, &count, &postdiv};
  launch_sync(k->finish[dtype], count, params, "cuLaunchKernel (weft_k_finish)", dst);
}

static void device_scale(void *buf, size_t count, weft_dtype dtype, double factor) {
  const cuda_kernels *k = count ? kernels_for(device_of(buf), NULL) : NULL;
  if (!k || (unsigned)dtype >= WEFT_DTYPE_COUNT) return;
  void *params[] = {&buf, &count, &factor};
  launch_sync(k->scale[dtype], count, params, "cuLaunchKernel (weft_k_scale)", buf);
}

static void device_narrow(void *dst, const void *src, size_t count, weft_dtype wire) {
  const cuda_kernels *k = count ? kernels_for(device_of(dst), NULL) : NULL;
  if (!k) return;
  int w = (int)wire;
  void *params[] = {&dst, &src, &count, &w};
  launch_sync(k->narrow, count, params, "cuLaunchKernel (weft_k_wire_narrow)", dst);
}

static void device_widen(void *dst, const void *src, size_t count, weft_dtype wire) {
  const cuda_kernels *k = count ? kernels_for(device_of(dst), NULL) : NULL;
  if (!k) return;
  int w = (int)wire;
  void *params[] = {&dst, &src, &count, &w};
  launch_sync(k->widen, count, params, "cuLaunchKernel (weft_k_wire_widen)", dst);
}

static void device_reduce_wire(void *dst, const void *a, const void *b, size_t count,
                               weft_dtype wire, weft_op op, int postdiv, void *stage) {
  const cuda_kernels *k = count ? kernels_for(device_of(dst), NULL) : NULL;
  if (!k) return;
  int w = (int)wire, op_i = (int)op;
  void *params[] = {&dst, &a, &b, &count, &w, &op_i, &postdiv, &stage};
  launch_sync(k->wire_reduce, count, params, "cuLaunchKernel (weft_k_wire_reduce)", dst);
}

/* The reduction queued on the communicator's stream; `b` may be pinned host
 * memory (a receive slot), which the GPU reads over the bus. */
static weft_status device_reduce_async(void *dst, const void *a, const void *b, size_t count,
                                       weft_dtype dtype, weft_op op, int postdiv,
                                       weft_mem_stream *s, weft_mem_token *token) {
  *token = 0;
  if (!count) return WEFT_OK;
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT) return WEFT_ERR_INVALID;
  const cuda_kernels *k = kernels_for(s->ordinal, s->errors);
  if (!k) return WEFT_ERR_UNSUPPORTED;
  int op_i = (int)op;
  void *params[] = {&dst, &a, &b, &count, &op_i, &postdiv};
  CUresult r = launch(k->reduce[dtype], count, s->stream, params);
  if (r != CUDA_SUCCESS)
    return cuda_fail(s->errors, r, "cuLaunchKernel (weft_k_reduce)", s->ordinal, dst, count);
  return device_record(s, token);
}

static weft_status device_reduce_all_async(void *const *outs, const void *const *ins, int n,
                                           size_t count, weft_dtype dtype, weft_op op, int postdiv,
                                           weft_mem_stream *s, weft_mem_token *token) {
  *token = 0;
  if (!count) return WEFT_OK;
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT || n < 2 || n > WEFT_K_MEMBERS) return WEFT_ERR_UNSUPPORTED;
  const cuda_kernels *k = kernels_for(s->ordinal, s->errors);
  if (!k) return WEFT_ERR_UNSUPPORTED;
  weft_k_members m = {{0}, {0}};
  uintptr_t all = 0;
  for (int p = 0; p < n; p++) {
    m.in[p] = (uintptr_t)ins[p];
    m.out[p] = (uintptr_t)outs[p];
    all |= (uintptr_t)ins[p] | (uintptr_t)outs[p];
  }
  int op_i = (int)op, vec16 = (all & 15) == 0;
  size_t threads = vec16 ? (count * weft_dtype_size(dtype) + 15) / 16 : count;
  void *params[] = {&m, &n, &count, &op_i, &postdiv, &vec16};
  CUresult r = launch(k->direct[dtype], threads, s->stream, params);
  if (r != CUDA_SUCCESS)
    return cuda_fail(s->errors, r, "cuLaunchKernel (weft_k_direct)", s->ordinal, outs[0], count);
  return device_record(s, token);
}

/* ---- CUDA IPC: a peer of this host reaches the buffer ----------------------------- */

/* A DEVICE descriptor's body (mem.h): the IPC handle of the buffer's
 * allocation, the device it is on and the buffer's offset in it. */
typedef struct cuda_ipc_body {
  CUipcMemHandle handle;
  int32_t ordinal;
  uint32_t reserved; /* 0 */
  uint64_t offset;
} cuda_ipc_body;
_Static_assert(sizeof(cuda_ipc_body) <= WEFT_MEM_DESC_BODY, "an IPC descriptor fits the body");

/* The IPC handles this process exported, by the allocation's buffer ID: a
 * training loop describes the same buffers every call (ResNet-50: 161 per
 * step), and cuIpcGetMemHandle is a driver call each time where the ID, a
 * base and a size come from the one attribute query the call makes anyway.
 * The driver gives every allocation a new ID, so memory freed and allocated
 * again at the same address never finds the old handle. */
#define CUDA_EXPORTS 512
static struct {
  unsigned long long id; /* 0: empty */
  CUdeviceptr base;
  CUipcMemHandle handle;
} cuda_exports[CUDA_EXPORTS];
static pthread_mutex_t cuda_exports_lock = PTHREAD_MUTEX_INITIALIZER;

/* The allocation holding `buf`: device, buffer ID, base and size, and
 * whether it has a legacy IPC handle, in one query; false for anything but
 * device memory (managed memory included). */
static bool device_range(const void *buf, int *ordinal, unsigned long long *id, CUdeviceptr *base,
                         size_t *size, bool *legacy_ipc) {
  CUpointer_attribute attrs[7] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  unsigned int type = 0, managed = 0, capable = 1;
  void *data[7] = {&type, ordinal, &managed, id, base, size, &capable};
  *legacy_ipc = true;
  if (cuda->pointer_get_attributes(7, attrs, data, (CUdeviceptr)(uintptr_t)buf) == CUDA_SUCCESS) {
    *legacy_ipc = capable != 0;
    return type == CU_MEMORYTYPE_DEVICE && !managed;
  }
  /* a driver without the range attributes: the two calls they replace */
  *id = 0;
  return weft_cuda_pointer_kind(buf, ordinal) == WEFT_MEMORY_DEVICE &&
         cuda->mem_get_address_range(base, size, (CUdeviceptr)(uintptr_t)buf) == CUDA_SUCCESS;
}

bool weft_cuda_ipc_exportable(const void *buf) {
  int ordinal = 0;
  unsigned long long id = 0;
  CUdeviceptr base = 0;
  size_t size = 0;
  bool legacy_ipc = true;
  if (!cuda_load() || !device_range(buf, &ordinal, &id, &base, &size, &legacy_ipc)) return true;
  return legacy_ipc;
}

static bool device_describe(const void *buf, size_t bytes, weft_mem_desc *desc) {
  int ordinal = 0;
  unsigned long long id = 0;
  CUdeviceptr base = 0;
  size_t size = 0;
  bool legacy_ipc = true;
  if (!cuda_load() || !device_range(buf, &ordinal, &id, &base, &size, &legacy_ipc)) return false;
  if (!legacy_ipc) {
    /* cuMemCreate's memory (PyTorch's expandable segments, cudaMallocAsync
     * pools): no handle to ask for, every call with it is staged; said once
     * per process, then at INFO (once per call would flood a training log) */
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
      WEFT_WARN(WEFT_SUBSYS_COLL,
                "cuda: device %d: %zu bytes at %p have no legacy IPC handle (cuMemCreate memory: "
                "PyTorch's expandable segments, cudaMallocAsync pools): calls on such buffers are "
                "staged through host memory (said once)",
                ordinal, bytes, buf);
    else
      WEFT_INFO(WEFT_SUBSYS_COLL, "cuda: device %d: %zu bytes at %p: no legacy IPC handle, staged",
                ordinal, bytes, buf);
    return false;
  }
  cuda_ipc_body body = {.ordinal = ordinal};
  CUresult r = (uintptr_t)buf - base + bytes > size ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  unsigned slot = (unsigned)(id % CUDA_EXPORTS);
  bool known = false;
  if (r == CUDA_SUCCESS && id) {
    pthread_mutex_lock(&cuda_exports_lock);
    if (cuda_exports[slot].id == id && cuda_exports[slot].base == base) {
      body.handle = cuda_exports[slot].handle;
      known = true;
    }
    pthread_mutex_unlock(&cuda_exports_lock);
  }
  if (r == CUDA_SUCCESS && !known) {
    r = enter_device(ordinal) ? cuda->ipc_get_mem_handle(&body.handle, base)
                              : CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS && id) {
      pthread_mutex_lock(&cuda_exports_lock);
      cuda_exports[slot].id = id;
      cuda_exports[slot].base = base;
      cuda_exports[slot].handle = body.handle;
      pthread_mutex_unlock(&cuda_exports_lock);
    }
  }
  if (r != CUDA_SUCCESS) {
    /* memory from another allocator (cuMemCreate, a pool) has no legacy
     * handle: the call stages instead */
    cuda_fail(NULL, r, "cuIpcGetMemHandle", ordinal, buf, bytes);
    return false;
  }
  body.offset = (uint64_t)((uintptr_t)buf - base);
  memset(desc, 0, sizeof *desc);
  desc->version = WEFT_MEM_DESC_VERSION;
  desc->kind = WEFT_MEMORY_DEVICE;
  desc->body_len = (uint16_t)sizeof body;
  desc->len = bytes;
  /* registered: the owner keeps it, the peers may keep their mappings */
  if (weft_mem_is_kept(buf, bytes)) desc->flags |= WEFT_MEM_DESC_KEEP;
  memcpy(desc->body, &body, sizeof body);
  return true;
}

/* ---- GPUDirect RDMA: an allocation as a dma-buf -------------------------------- */

static bool device_range_of(const void *buf, size_t bytes, weft_mem_range *out) {
  int ordinal = 0;
  unsigned long long id = 0;
  CUdeviceptr base = 0;
  size_t size = 0;
  bool legacy_ipc = true;
  if (!cuda_load() || !device_range(buf, &ordinal, &id, &base, &size, &legacy_ipc)) return false;
  if ((uintptr_t)buf - base + bytes > size) return false;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  *out = (weft_mem_range){.base = (void *)(uintptr_t)base,
                          .bytes = (size + page - 1) / page * page,
                          .buffer_id = id,
                          .device = ordinal};
  return true;
}

static bool device_dmabuf_supported(int device, char *why, size_t why_len) {
  char unused[8];
  if (!why) why = unused, why_len = sizeof unused;
  if (!cuda_load()) {
    snprintf(why, why_len, "%s", cuda_why);
    return false;
  }
  if (!cuda->mem_get_handle_for_address_range) {
    snprintf(why, why_len, "the driver (%s) has no cuMemGetHandleForAddressRange (CUDA >= 11.7)",
             cuda->library);
    return false;
  }
  CUdevice dev;
  int dmabuf = 0;
  if (cuda->device_get(&dev, device) != CUDA_SUCCESS ||
      cuda->device_get_attribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) !=
          CUDA_SUCCESS) {
    snprintf(why, why_len, "device %d: its dma-buf attribute cannot be read", device);
    return false;
  }
  if (!dmabuf) {
    snprintf(why, why_len,
             "device %d: the driver says no dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0: "
             "an open kernel module and Linux >= 5.12 are needed)",
             device);
    return false;
  }
  snprintf(why, why_len, "device %d exports dma-bufs", device);
  return true;
}

static weft_status device_export_dmabuf(const weft_mem_range *range, int *fd, void *errors) {
  weft_error_sink *sink = errors;
  char why[200];
  *fd = -1;
  if (!device_dmabuf_supported(range->device, why, sizeof why)) {
    if (sink) weft_error_sink_set(sink, "cuda: %s", why);
    return WEFT_ERR_UNSUPPORTED;
  }
  if (!enter_device(range->device)) {
    if (sink)
      weft_error_sink_set(sink, "cuda: device %d's context cannot be made current", range->device);
    return WEFT_ERR_SYSTEM;
  }
  int out = -1;
  CUresult r = cuda->mem_get_handle_for_address_range(
      &out, (CUdeviceptr)(uintptr_t)range->base, range->bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
      0);
  if (r != CUDA_SUCCESS) {
    char words[160];
    weft_cuda_error_words(cuda, r, words, sizeof words);
    if (sink)
      weft_error_sink_set(sink,
                          "cuda: cuMemGetHandleForAddressRange of device %d's allocation at %p "
                          "(%zu bytes): %s",
                          range->device, range->base, range->bytes, words);
    return r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE ? WEFT_ERR_UNSUPPORTED
                                                                          : WEFT_ERR_SYSTEM;
  }
  *fd = out;
  return WEFT_OK;
}

/* The process's IPC mappings: a handle is opened once and shared by every
 * descriptor of its allocation (the driver refuses a second open of one
 * handle, or counts it), closed when its last user unmaps it. */
#define CUDA_IPC_MAPS 256
static struct {
  CUipcMemHandle handle;
  CUdeviceptr base;
  int refs;
} cuda_ipc_maps[CUDA_IPC_MAPS];
static pthread_mutex_t cuda_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

/* Opened in the calling thread's current context: the device whose stream
 * runs the kernels that read it (the direct allreduce made it current). */
static CUresult ipc_open(const CUipcMemHandle *handle, CUdeviceptr *out) {
  pthread_mutex_lock(&cuda_ipc_lock);
  int free_at = -1;
  for (int i = 0; i < CUDA_IPC_MAPS; i++) {
    if (!cuda_ipc_maps[i].refs) {
      if (free_at < 0) free_at = i;
      continue;
    }
    if (!memcmp(&cuda_ipc_maps[i].handle, handle, sizeof *handle)) {
      cuda_ipc_maps[i].refs++;
      *out = cuda_ipc_maps[i].base;
      pthread_mutex_unlock(&cuda_ipc_lock);
      return CUDA_SUCCESS;
    }
  }
  CUresult r = free_at < 0 ? CUDA_ERROR_OUT_OF_MEMORY
                           : cuda->ipc_open_mem_handle(out, *handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r == CUDA_SUCCESS) {
    cuda_ipc_maps[free_at].handle = *handle;
    cuda_ipc_maps[free_at].base = *out;
    cuda_ipc_maps[free_at].refs = 1;
  }
  pthread_mutex_unlock(&cuda_ipc_lock);
  return r;
}

/* true when this was the last user: the caller closes it */
static bool ipc_release(CUdeviceptr base) {
  bool last = false;
  pthread_mutex_lock(&cuda_ipc_lock);
  for (int i = 0; i < CUDA_IPC_MAPS; i++)
    if (cuda_ipc_maps[i].refs && cuda_ipc_maps[i].base == base) {
      last = --cuda_ipc_maps[i].refs == 0;
      break;
    }
  pthread_mutex_unlock(&cuda_ipc_lock);
  return last;
}

static weft_status device_map_peer(const weft_mem_desc *desc, void **base, void **local,
                                   void *errors) {
  *base = *local = NULL;
  cuda_ipc_body body;
  if (desc->version != WEFT_MEM_DESC_VERSION || desc->kind != WEFT_MEMORY_DEVICE ||
      desc->body_len != sizeof body) {
    if (errors)
      weft_error_sink_set(errors, "a malformed device memory descriptor (version %u, kind %u, %u bytes)",
                          desc->version, desc->kind, desc->body_len);
    return WEFT_ERR_PROTOCOL;
  }
  memcpy(&body, desc->body, sizeof body);
  if (!cuda_load()) {
    if (errors) weft_error_sink_set(errors, "%s", cuda_why);
    return WEFT_ERR_UNSUPPORTED;
  }
  if (!enter_any_context())
    return cuda_fail(errors, CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", body.ordinal, NULL, 0);
  CUdeviceptr p = 0, range_base = 0;
  size_t size = 0;
  CUresult r = ipc_open(&body.handle, &p);
  if (r != CUDA_SUCCESS) {
    /* the caller stages instead (the direct rounds' fall-back), every call
     * alike where GPUs cannot reach each other: a warning once per
     * process, then the same words at INFO */
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    char words[160];
    weft_cuda_error_words(cuda, r, words, sizeof words);
    if (errors)
      weft_error_sink_set(errors, "cuda: cuIpcOpenMemHandle (a peer's buffer) on device %d: %s",
                          body.ordinal, words);
    if (!atomic_flag_test_and_set(&warned))
      WEFT_WARN(WEFT_SUBSYS_COLL,
                "cuda: cuIpcOpenMemHandle (a peer's buffer) on device %d: %s; such calls are "
                "staged through host memory (said once)",
                body.ordinal, words);
    else
      WEFT_INFO(WEFT_SUBSYS_COLL, "cuda: cuIpcOpenMemHandle (a peer's buffer) on device %d: %s",
                body.ordinal, words);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? WEFT_ERR_NOMEM : WEFT_ERR_SYSTEM;
  }
  /* bounds from what is mapped here, never from the peer's word alone */
  r = cuda->mem_get_address_range(&range_base, &size, p);
  if (r != CUDA_SUCCESS || body.offset > size || desc->len > size - body.offset) {
    if (ipc_release(p)) cuda->ipc_close_mem_handle(p);
    if (errors)
      weft_error_sink_set(errors,
                          "a peer described bytes %llu..%llu of a device allocation of %zu bytes",
                          (unsigned long long)body.offset,
                          (unsigned long long)(body.offset + desc->len), size);
    return WEFT_ERR_PROTOCOL;
  }
  *base = (void *)(uintptr_t)p;
  *local = (char *)(uintptr_t)p + body.offset;
  return WEFT_OK;
}

/* In the primary context of the device it was opened on (the thread that
 * closes it, at weft_comm_destroy, may have another current). */
static void device_unmap_peer(void *base) {
  if (!base || !cuda || !ipc_release((CUdeviceptr)(uintptr_t)base) ||
      !enter_device(device_of(base)))
    return;
  CUresult r = cuda->ipc_close_mem_handle((CUdeviceptr)(uintptr_t)base);
  if (r != CUDA_SUCCESS) cuda_fail(NULL, r, "cuIpcCloseMemHandle", device_of(base), base, 0);
}

/* ---- a gradient set's work on the user's stream (mem.h) ----------------------- */

static void *device_pieces_create(const void *bucket, const weft_mem_piece *pieces, int n) {
  int ordinal = device_of(bucket);
  if (n <= 0 || !cuda_load() || !enter_device(ordinal)) return NULL;
  weft_k_piece *host = malloc(sizeof *host * (size_t)n);
  if (!host) return NULL;
  for (int i = 0; i < n; i++)
    host[i] = (weft_k_piece){(unsigned long long)(uintptr_t)pieces[i].tensor, pieces[i].offset,
                             pieces[i].count};
  size_t bytes = sizeof *host * (size_t)n;
  CUdeviceptr table = 0;
  /* written once, at the set's finalize: a wait here costs nothing per step */
  CUresult r = cuda->mem_alloc(&table, bytes);
  if (r == CUDA_SUCCESS) r = cuda->memcpy_htod_async(table, host, bytes, NULL);
  if (r == CUDA_SUCCESS) r = cuda->stream_synchronize(NULL);
  free(host);
  if (r != CUDA_SUCCESS) {
    cuda_fail(NULL, r, "a gradient bucket's piece table (cuMemAlloc, cuMemcpyHtoDAsync)", ordinal, NULL, bytes);
    if (table) cuda->mem_free(table);
    return NULL;
  }
  return (void *)(uintptr_t)table;
}

static void device_pieces_destroy(void *table) {
  device_free_scratch(table);
}

static weft_status device_pieces_move(void *bucket, const void *table, int n, size_t most,
                                      weft_dtype dtype, double factor, bool to_bucket,
                                      void *user_stream, void *errors) {
  if (n <= 0 || !most) return WEFT_OK;
  int ordinal = device_of(bucket);
  const cuda_kernels *k = (unsigned)dtype < WEFT_DTYPE_COUNT ? kernels_for(ordinal, errors) : NULL;
  if (!k) return WEFT_ERR_UNSUPPORTED;
  size_t blocks = (most + 255) / 256;
  if (blocks > 1024) blocks = 1024; /* grid-stride loops take the rest */
  unsigned gy = n < 65535 ? (unsigned)n : 65535u;
  int to = to_bucket;
  void *params[] = {&bucket, &table, &n, &factor, &to};
  CUresult r = cuda->launch_kernel(k->pieces[dtype], (unsigned)blocks, gy, 1, 256, 1, 1, 0,
                                   (CUstream)user_stream, params, NULL);
  if (r != CUDA_SUCCESS)
    return cuda_fail(errors, r, to_bucket ? "cuLaunchKernel (weft_k_pieces, a bucket's pack)"
                                          : "cuLaunchKernel (weft_k_pieces, a bucket's unpack)",
                     ordinal, bucket, most);
  return WEFT_OK;
}

static weft_status device_scale_on(void *buf, size_t count, weft_dtype dtype, double factor,
                                   void *user_stream, void *errors) {
  if (!count) return WEFT_OK;
  int ordinal = device_of(buf);
  const cuda_kernels *k = (unsigned)dtype < WEFT_DTYPE_COUNT ? kernels_for(ordinal, errors) : NULL;
  if (!k) return WEFT_ERR_UNSUPPORTED;
  void *params[] = {&buf, &count, &factor};
  CUresult r = launch(k->scale[dtype], count, (CUstream)user_stream, params);
  if (r != CUDA_SUCCESS) return cuda_fail(errors, r, "cuLaunchKernel (weft_k_scale)", ordinal, buf, count);
  return WEFT_OK;
}

/* A mark: an event of one device's primary context. */
typedef struct cuda_mark {
  CUevent event;
  int ordinal;
} cuda_mark;

static weft_status device_mark_create(const void *near, void **out, void *errors) {
  *out = NULL;
  cuda_mark *m = calloc(1, sizeof *m);
  if (!m) return WEFT_ERR_NOMEM;
  m->ordinal = device_of(near);
  CUresult r = cuda_load() && enter_device(m->ordinal) ? cuda->event_create(&m->event, CU_EVENT_DISABLE_TIMING)
                                                       : CUDA_ERROR_INVALID_CONTEXT;
  if (r != CUDA_SUCCESS) {
    free(m);
    return cuda_fail(errors, r, "cuEventCreate (a gradient set's mark)", device_of(near), NULL, 0);
  }
  *out = m;
  return WEFT_OK;
}

static void device_mark_destroy(void *mark) {
  cuda_mark *m = mark;
  if (!m) return;
  if (m->event && enter_device(m->ordinal)) cuda->event_destroy(m->event);
  free(m);
}

static weft_status device_mark_record(void *mark, void *user_stream, void *errors) {
  cuda_mark *m = mark;
  CUresult r = enter_device(m->ordinal) ? cuda->event_record(m->event, (CUstream)user_stream)
                                        : CUDA_ERROR_INVALID_CONTEXT;
  return r == CUDA_SUCCESS ? WEFT_OK
                           : cuda_fail(errors, r, "cuEventRecord (the gradient set's stream)", m->ordinal, NULL, 0);
}

static weft_status device_mark_poll(void *mark, void *errors) {
  cuda_mark *m = mark;
  CUresult r = enter_device(m->ordinal) ? cuda->event_query(m->event) : CUDA_ERROR_INVALID_CONTEXT;
  if (r == CUDA_ERROR_NOT_READY) return WEFT_AGAIN;
  return r == CUDA_SUCCESS ? WEFT_OK
                           : cuda_fail(errors, r, "cuEventQuery (work of the gradient set's stream)", m->ordinal, NULL, 0);
}

static void device_stream_destroy(weft_mem_stream *s) {
  weft_cuda_stream_destroy(s);
}

const weft_mem_ops weft_mem_device = {
    .kind = WEFT_MEMORY_DEVICE,
    .name = "cuda",
    .copy = device_copy,
    .reduce = device_reduce,
    .finish = device_finish,
    .scale = device_scale,
    .narrow = device_narrow,
    .widen = device_widen,
    .reduce_wire = device_reduce_wire,
    .alloc = device_alloc,
    .release = device_free_scratch,
    .stream_create = device_stream_create,
    .stream_destroy = device_stream_destroy,
    .stream_after_user = device_stream_after_user,
    .user_wait_signal = device_user_wait_signal,
    .signal = device_signal,
    .record = device_record,
    .poll = device_poll,
    .copy_async = device_copy_async,
    .reduce_async = device_reduce_async,
    .copy_to_host = device_copy_to_host,
    .copy_from_host = device_copy_from_host,
    .alloc_slots = device_alloc_slots,
    .free_slots = device_free_slots,
    .alloc_scratch = device_alloc_scratch,
    .free_scratch = device_free_scratch,
    .alloc_on = weft_cuda_alloc_on,
    .describe = device_describe,
    .reduce_all_async = device_reduce_all_async,
    .map_peer = device_map_peer,
    .unmap_peer = device_unmap_peer,
    .range_of = device_range_of,
    .export_dmabuf = device_export_dmabuf,
    .dmabuf_supported = device_dmabuf_supported,
    .pieces_create = device_pieces_create,
    .pieces_destroy = device_pieces_destroy,
    .pieces_move = device_pieces_move,
    .scale_on = device_scale_on,
    .mark_create = device_mark_create,
    .mark_destroy = device_mark_destroy,
    .mark_record = device_mark_record,
    .mark_poll = device_mark_poll,
};
