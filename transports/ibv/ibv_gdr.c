/* ibv_gdr.c - GPUDirect RDMA: device memory registered with the NIC, so
 * that a chunk leaves a GPU and lands in another without a copy through
 * host memory. Two ways in, tried in the order the drivers allow (as NCCL
 * does):
 *  1. dma-buf: the device table exports the allocation
 *     (cuMemGetHandleForAddressRange) and ibv_reg_dmabuf_mr registers the fd;
 *     needs CUDA >= 11.7, an open GPU kernel module, Linux >= 5.12 and
 *     rdma-core >= 34;
 *  2. nvidia-peermem: ibv_reg_mr on the device address itself, which the
 *     peer-memory module resolves; needs the module loaded;
 *  3. neither: the caller stages through host memory, as before.
 * WEFT_IB_GDR narrows the choice (auto, dmabuf, peermem, off).
 *
 * Registrations are kept per allocation, looked up by the driver's buffer ID
 * (one pointer query per call, as the IPC exports are): memory freed and
 * allocated again at the same address has a new ID, so it is registered
 * again and a stale registration is never used for it. An entry not in use
 * is dropped least recently used first past IBV_GDR_ENTRIES or
 * IBV_GDR_MAX_BYTES (a registration holds the GPU memory: the driver frees
 * an allocation only once its dma-buf is unregistered), and all are at fini. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ibv.h"
#include "src/base/log.h"
#include "transports/ibv/ibv_settings.h"

#define IBV_GDR_MAX_BYTES ((size_t)64 << 30) /* registered and unused, per context */

/* The peer-memory module's marks, as NCCL looks for them. */
static bool ibv_gdr_peermem_loaded(void) {
  return access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
         access("/sys/module/nvidia_peermem/version", F_OK) == 0 ||
         access("/sys/module/nv_peer_mem/version", F_OK) == 0;
}

int ibv_gdr_choose(const ibv_api *api, int device, char *why, size_t why_len) {
  int setting = (int)ibv_settings()->gdr;
  const weft_mem_ops *dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
  if (setting == IBV_GDR_OFF) {
    snprintf(why, why_len, "WEFT_IB_GDR=off: device buffers are staged through host memory");
    return IBV_GDR_OFF;
  }
  if (!dev) {
    snprintf(why, why_len, "no usable CUDA driver here: device buffers cannot exist");
    return IBV_GDR_OFF;
  }
  char dmabuf_why[200] = "";
  if (setting != IBV_GDR_PEERMEM) {
    bool driver = dev->dmabuf_supported(device, dmabuf_why, sizeof dmabuf_why);
    if (driver && api->reg_dmabuf_mr) {
      snprintf(why, why_len, "dma-buf (%s; %s has ibv_reg_dmabuf_mr)", dmabuf_why, api->library);
      return IBV_GDR_DMABUF;
    }
    if (driver)
      snprintf(dmabuf_why, sizeof dmabuf_why, "%s lacks ibv_reg_dmabuf_mr (rdma-core >= 34)",
               api->library);
    if (setting == IBV_GDR_DMABUF) {
      snprintf(why, why_len, "WEFT_IB_GDR=dmabuf but %s: staged through host memory", dmabuf_why);
      return IBV_GDR_OFF;
    }
  }
  if (ibv_gdr_peermem_loaded()) {
    snprintf(why, why_len, "nvidia-peermem (loaded)%s%s", *dmabuf_why ? "; no dma-buf: " : "",
             dmabuf_why);
    return IBV_GDR_PEERMEM;
  }
  snprintf(why, why_len, "%s%s%snvidia-peermem is not loaded: staged through host memory",
           *dmabuf_why ? "no dma-buf (" : "", dmabuf_why, *dmabuf_why ? "), and " : "");
  return IBV_GDR_OFF;
}

void ibv_gdr_init(ibv_gdr *g, const ibv_api *api, struct ibv_pd *pd) {
  memset(g, 0, sizeof *g);
  g->api = api;
  g->pd = pd;
  g->device = -1;
}

/* Entries never move: posted writes hold pointers to them. */
static void ibv_gdr_drop(ibv_gdr *g, ibv_gdr_entry *e) {
  g->api->dereg_mr(e->mr);
  g->bytes -= e->bytes;
  g->live--;
  memset(e, 0, sizeof *e);
}

static ibv_gdr_entry *ibv_gdr_room(ibv_gdr *g, size_t incoming) {
  for (;;) {
    ibv_gdr_entry *free_entry = NULL, *victim = NULL;
    for (int i = 0; i < IBV_GDR_ENTRIES; i++) {
      ibv_gdr_entry *e = &g->e[i];
      if (!e->mr) {
        if (!free_entry) free_entry = e;
      } else if (e->refs == 0 && (!victim || e->last_use < victim->last_use)) {
        victim = e;
      }
    }
    if (free_entry && g->bytes + incoming <= IBV_GDR_MAX_BYTES) return free_entry;
    if (!victim) return free_entry; /* all in use: over the budget rather than fail */
    ibv_gdr_drop(g, victim);
  }
}

/* Decided once per context, for the first device it sees (a communicator's
 * device buffers are of one GPU: weft.h); warned once when it stages. */
static void ibv_gdr_decide(ibv_gdr *g, int device) {
  if (g->device >= 0) return;
  g->device = device;
  g->mode = ibv_gdr_choose(g->api, device, g->why, sizeof g->why);
  WEFT_INFO(WEFT_SUBSYS_NET, "ibv: GPUDirect RDMA for device %d: %s", device, g->why);
}

weft_status ibv_gdr_get(ibv_gdr *g, const void *buf, size_t bytes, ibv_gdr_entry **out) {
  *out = NULL;
  const weft_mem_ops *dev = weft_mem_by_kind(WEFT_MEMORY_DEVICE);
  weft_mem_range range;
  if (!dev || !dev->range_of(buf, bytes, &range)) return WEFT_ERR_UNSUPPORTED;
  ibv_gdr_decide(g, range.device);
  if (g->mode == IBV_GDR_OFF || range.device != g->device) return WEFT_ERR_UNSUPPORTED;
  for (int i = 0; i < IBV_GDR_ENTRIES; i++) {
    ibv_gdr_entry *e = &g->e[i];
    if (e->mr && e->buffer_id == range.buffer_id && e->base == (uintptr_t)range.base &&
        e->bytes == range.bytes && range.buffer_id) {
      e->refs++;
      e->last_use = ++g->clock;
      g->hits++;
      *out = e;
      return WEFT_OK;
    }
  }
  ibv_gdr_entry *e = ibv_gdr_room(g, range.bytes);
  if (!e) return WEFT_ERR_UNSUPPORTED; /* every entry in use: this chunk stages */
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  struct ibv_mr *mr = NULL;
  char why[sizeof((weft_error_sink *)0)->msg] = "";
  if (g->mode == IBV_GDR_DMABUF) {
    weft_error_sink sink = {{0}, {0}};
    int fd = -1;
    weft_status st = dev->export_dmabuf(&range, &fd, &sink);
    if (st == WEFT_OK) {
      mr =
          g->api->reg_dmabuf_mr(g->pd, 0, range.bytes, (uint64_t)(uintptr_t)range.base, fd, access);
      if (!mr)
        snprintf(why, sizeof why, "ibv_reg_dmabuf_mr of %zu bytes: %s", range.bytes,
                 strerror(errno));
      close(fd); /* the registration holds the dma-buf */
    } else {
      snprintf(why, sizeof why, "%s", sink.msg);
    }
  } else {
    mr = g->api->reg_mr(g->pd, range.base, range.bytes, access);
    if (!mr)
      snprintf(why, sizeof why, "ibv_reg_mr (nvidia-peermem) of %zu bytes: %s", range.bytes,
               strerror(errno));
  }
  if (!mr) {
    g->refused++;
    if (!g->warned) {
      g->warned = true;
      WEFT_WARN(WEFT_SUBSYS_NET,
                "ibv: GPUDirect RDMA refused for device %d (%s): %s; its chunks are staged "
                "through host memory (said once)",
                range.device, g->mode == IBV_GDR_DMABUF ? "dma-buf" : "nvidia-peermem", why);
    } else {
      WEFT_INFO(WEFT_SUBSYS_NET, "ibv: GPUDirect RDMA refused for device %d: %s", range.device,
                why);
    }
    return WEFT_ERR_UNSUPPORTED;
  }
  *e = (ibv_gdr_entry){.buffer_id = range.buffer_id,
                       .base = (uintptr_t)range.base,
                       .bytes = range.bytes,
                       .mr = mr,
                       .refs = 1,
                       .last_use = ++g->clock};
  g->bytes += range.bytes;
  g->live++;
  g->misses++;
  *out = e;
  return WEFT_OK;
}

void ibv_gdr_put(ibv_gdr *g, ibv_gdr_entry *e) {
  (void)g;
  if (e && e->refs > 0) e->refs--;
}

void ibv_gdr_forget(ibv_gdr *g, const void *buf, size_t bytes) {
  uintptr_t s = (uintptr_t)buf, t = s + bytes;
  for (int i = 0; i < IBV_GDR_ENTRIES; i++) {
    ibv_gdr_entry *e = &g->e[i];
    if (e->mr && e->refs == 0 && e->base < t && e->base + e->bytes > s) ibv_gdr_drop(g, e);
  }
}

void ibv_gdr_fini(ibv_gdr *g) {
  for (int i = 0; i < IBV_GDR_ENTRIES; i++)
    if (g->e[i].mr) ibv_gdr_drop(g, &g->e[i]);
}
