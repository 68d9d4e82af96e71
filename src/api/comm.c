/* api/comm.c - the public calls that only read a communicator or fill a
 * caller's struct. Creation, destroy and abort live with the communicators
 * (src/comm/comm.c): they own the list of live ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/api/api.h"
#include "src/api/support.h"
#include "src/base/settings.h"
#include "src/comm/comm.h"
#include "src/mem/kept.h"
#include "transports/transport_settings.h"
#include "weft.h"
#ifdef WEFT_HAVE_CUDA
#include "src/cuda/cuda_mem.h"
#endif

WEFT_API int weft_comm_rank(const weft_comm *comm) {
  return weft_comm_is_live(comm) ? comm->core.rank : -1;
}
WEFT_API int weft_comm_size(const weft_comm *comm) {
  return weft_comm_is_live(comm) ? comm->core.size : -1;
}
WEFT_API int weft_comm_local_rank(const weft_comm *comm) {
  return weft_comm_is_live(comm) ? comm->local_rank : -1;
}
WEFT_API int weft_comm_local_size(const weft_comm *comm) {
  return weft_comm_is_live(comm) ? comm->core.hosts.local_size : -1;
}

WEFT_API weft_status weft_comm_peer_transport(const weft_comm *comm, int peer,
                                              const char **transport, const char **reason) {
  if (!weft_comm_is_live(comm) || peer < 0 || peer >= comm->core.size || !transport || !reason)
    return WEFT_ERR_INVALID;
  int tp = comm->core.links.peers[peer].tp;
  *transport = tp < 0 ? "self" : comm->core.links.tps[tp].ops->name;
  *reason = tp < 0 ? "this rank" : comm->peers[peer].why;
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_set_wire_dtype(weft_comm *comm, weft_dtype wire) {
  WEFT_API_LIVE(comm, "weft_comm_set_wire_dtype");
  if (wire != WEFT_F32 && wire != WEFT_BF16 && wire != WEFT_F16)
    return weft_core_error(&comm->core, WEFT_ERR_INVALID, "weft_comm_set_wire_dtype",
                           "wire dtype %s (%d): f32 data travels as f32, bf16 or f16",
                           weft_dtype_name(wire), (int)wire);
  comm->core.wire = wire; /* calls read it at setup, on the caller's thread */
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_set_stream(weft_comm *comm, void *cuda_stream) {
  WEFT_API_LIVE(comm, "weft_comm_set_stream");
#ifndef WEFT_HAVE_CUDA
  if (cuda_stream)
    return weft_core_error(&comm->core, WEFT_ERR_UNSUPPORTED, "weft_comm_set_stream",
                           "this build of weft has no CUDA support (weft-info says why)");
#endif
  comm->core.user_stream = cuda_stream; /* calls read it at setup, on the caller's thread */
  return WEFT_OK;
}

static weft_status register_body(weft_comm *comm, const void *buf, size_t bytes) {
  if (!buf || !bytes)
    return weft_core_error(&comm->core, WEFT_ERR_INVALID, "weft_comm_register",
                           "buf is %p and bytes %zu: a buffer of at least one byte", buf, bytes);
  if (comm->nregistered == comm->registered_cap) {
    size_t cap = comm->registered_cap ? 2 * comm->registered_cap : 16;
    const void **r = realloc(comm->registered, cap * sizeof *r);
    if (!r) return weft_core_error(&comm->core, WEFT_ERR_NOMEM, "weft_comm_register", "no memory");
    comm->registered = r;
    comm->registered_cap = cap;
  }
  weft_status st = weft_mem_keep(buf, bytes);
  if (st) return weft_core_error(&comm->core, st, "weft_comm_register", "no memory");
  comm->registered[comm->nregistered++] = buf;
  return WEFT_OK;
}

WEFT_API weft_status weft_comm_register(weft_comm *comm, const void *buf, size_t bytes) {
  WEFT_API_CALL(comm, "weft_comm_register", register_body(comm, buf, bytes));
}

/* Collective: a barrier (every earlier call of this rank complete, so none
 * uses a mapping), every rank closes its mappings of the peers' device
 * memory, a barrier (every rank closed them): then `buf`, here or on any
 * rank, is mapped nowhere. Registered buffers of other ranks are opened
 * again at their next use. */
static weft_status deregister_body(weft_comm *comm, const void *buf) {
  size_t i = 0;
  while (buf && i < comm->nregistered && comm->registered[i] != buf) i++;
  if (buf && i == comm->nregistered)
    return weft_core_error(&comm->core, WEFT_ERR_INVALID, "weft_comm_deregister",
                           "%p was not registered on this communicator (weft_comm_register)", buf);
  weft_status st = weft_api_barrier(comm, "weft_comm_deregister");
  if (st) return st;
  weft_peer_table_release_mem(&comm->core.links, comm->core.size, true);
  st = weft_api_barrier(comm, "weft_comm_deregister");
  if (buf) { /* given back once no peer maps it: after the second barrier */
    weft_mem_unkeep(buf);
    comm->registered[i] = comm->registered[--comm->nregistered];
  }
  return st;
}

WEFT_API weft_status weft_comm_deregister(weft_comm *comm, const void *buf) {
  WEFT_API_CALL(comm, "weft_comm_deregister", deregister_body(comm, buf));
}

WEFT_API int weft_memory_usable(weft_memory memory, const char **why) {
  static _Thread_local char words[512];
  int usable = 0;
  if (memory == WEFT_MEMORY_HOST || memory == WEFT_MEMORY_SHARED) {
    usable = 1;
    snprintf(words, sizeof words, "host memory: always");
  } else if (memory == WEFT_MEMORY_DEVICE) {
#ifdef WEFT_HAVE_CUDA
    char w[480];
    usable = weft_cuda_usable(w, sizeof w);
    snprintf(words, sizeof words, "%s", w);
#else
    snprintf(words, sizeof words,
             "this build of weft has no CUDA support (configure with -Dcuda=enabled where the "
             "CUDA headers are; pip: -Csetup-args=-Dcuda=enabled)");
#endif
  } else {
    snprintf(words, sizeof words, "memory kind %d is not one a collective takes", (int)memory);
  }
  if (why) *why = words;
  return usable;
}

#define WEFT_STR2_(x) #x
#define WEFT_STR_(x) WEFT_STR2_(x)
WEFT_API const char *weft_version_string(void) {
  return WEFT_STR_(WEFT_VERSION_MAJOR) "." WEFT_STR_(WEFT_VERSION_MINOR) "." WEFT_STR_(
      WEFT_VERSION_PATCH);
}

/* Every setting, the transports' too: their tables are handed to the
 * registry before the first is counted. */
WEFT_API weft_status weft_setting_describe(int index, weft_setting_desc *desc) {
  weft_transport_settings_register();
  return weft_settings_describe(index, desc);
}

WEFT_API void weft_config_init(weft_config *cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->version = WEFT_CONFIG_VERSION;
  cfg->rank = -1;
  cfg->local_rank = -1;
}
