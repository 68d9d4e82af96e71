/* ibv_mr.c - the registration cache for user buffers sent without a copy:
 * page-aligned regions, reference-counted while work requests use them, kept
 * after use (least recently used go first past a budget) and dropped when
 * their pages go away. A hit first checks that the range is still mapped
 * (msync answers ENOMEM for an unmapped page); a region freed and mapped
 * again at the same address is not visible from here (rdma-core has no
 * notifier without ODP), which is why zero-copy is opt-in (README). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ibv.h"
#include "src/base/log.h"
#include "src/base/status.h"

#define IBV_MR_PAGE 4096u

static uintptr_t ibv_mr_floor(uintptr_t a) {
  return a & ~(uintptr_t)(IBV_MR_PAGE - 1);
}
static uintptr_t ibv_mr_ceil(uintptr_t a) {
  return (a + IBV_MR_PAGE - 1) & ~(uintptr_t)(IBV_MR_PAGE - 1);
}

static bool ibv_mr_mapped(uintptr_t start, uintptr_t end) {
  return msync((void *)start, end - start, MS_ASYNC) == 0 || errno != ENOMEM;
}

/* Entries never move: posted writes hold pointers to them. */
static void ibv_mr_drop(ibv_mr_cache *cache, int i) {
  ibv_mr_entry *e = &cache->e[i];
  cache->api->dereg_mr(e->mr);
  cache->bytes -= e->end - e->start;
  memset(e, 0, sizeof *e);
}

void ibv_mr_cache_invalidate(ibv_mr_cache *cache, const void *addr, size_t len) {
  uintptr_t s = (uintptr_t)addr, t = s + len;
  for (int i = 0; i < IBV_MR_MAX_ENTRIES; i++) {
    ibv_mr_entry *e = &cache->e[i];
    if (!e->mr || e->end <= s || e->start >= t) continue;
    cache->invalidations++;
    if (e->refs == 0)
      ibv_mr_drop(cache, i);
    else
      e->stale = true; /* in use by a posted write: dropped when released */
  }
}

/* Unreferenced regions, least recently used first, until under budget. */
static int ibv_mr_free_slot(const ibv_mr_cache *cache) {
  for (int i = 0; i < IBV_MR_MAX_ENTRIES; i++)
    if (!cache->e[i].mr) return i;
  return -1;
}

static void ibv_mr_evict(ibv_mr_cache *cache, size_t incoming) {
  while (cache->bytes + incoming > cache->max_bytes || ibv_mr_free_slot(cache) < 0) {
    int victim = -1;
    for (int i = 0; i < IBV_MR_MAX_ENTRIES; i++)
      if (cache->e[i].mr && cache->e[i].refs == 0 &&
          (victim < 0 || cache->e[i].last_use < cache->e[victim].last_use))
        victim = i;
    if (victim < 0) return;
    ibv_mr_drop(cache, victim);
  }
}

weft_status ibv_mr_cache_get(ibv_mr_cache *cache, const void *addr, size_t len,
                             ibv_mr_entry **out) {
  uintptr_t s = (uintptr_t)addr, t = s + (len ? len : 1);
  for (int i = 0; i < IBV_MR_MAX_ENTRIES; i++) {
    ibv_mr_entry *e = &cache->e[i];
    if (!e->mr || e->stale || e->start > s || e->end < t) continue;
    if (!ibv_mr_mapped(e->start, e->end)) { /* freed since: never reuse it */
      ibv_mr_cache_invalidate(cache, (void *)e->start, e->end - e->start);
      break;
    }
    e->refs++;
    e->last_use = ++cache->clock;
    cache->hits++;
    *out = e;
    return WEFT_OK;
  }
  uintptr_t start = ibv_mr_floor(s), end = ibv_mr_ceil(t);
  ibv_mr_evict(cache, end - start);
  int slot = ibv_mr_free_slot(cache);
  if (slot < 0) return WEFT_AGAIN; /* all in use: copy instead */
  struct ibv_mr *mr =
      cache->api->reg_mr(cache->pd, (void *)start, end - start, IBV_ACCESS_LOCAL_WRITE);
  if (!mr) return errno == ENOMEM ? WEFT_ERR_NOMEM : WEFT_ERR_SYSTEM;
  cache->misses++;
  ibv_mr_entry *e = &cache->e[slot];
  *e = (ibv_mr_entry){.start = start, .end = end, .mr = mr, .refs = 1, .last_use = ++cache->clock};
  cache->bytes += end - start;
  *out = e;
  return WEFT_OK;
}

void ibv_mr_cache_put(ibv_mr_cache *cache, ibv_mr_entry *e) {
  if (--e->refs == 0 && e->stale) ibv_mr_drop(cache, (int)(e - cache->e));
}

void ibv_mr_cache_fini(ibv_mr_cache *cache) {
  for (int i = 0; i < IBV_MR_MAX_ENTRIES; i++)
    if (cache->e[i].mr) ibv_mr_drop(cache, i);
}
