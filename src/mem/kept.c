/* kept.c - the ranges of memory the user keeps allocated until it
 * deregisters them (weft_comm_register): kept.h says why. On its own, so
 * the device table asks it without calling back into mem.c. */
#include "src/mem/kept.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept_range {
  uintptr_t lo, hi;
  int refs;
} *kept;
static size_t nkept, kept_cap;
static _Atomic size_t kept_count; /* nkept, read without the lock on describe's path */

weft_status weft_mem_keep(const void *ptr, size_t bytes) {
  uintptr_t lo = (uintptr_t)ptr, hi = lo + bytes;
  weft_status st = WEFT_OK;
  pthread_mutex_lock(&kept_lock);
  size_t i = 0;
  while (i < nkept && !(kept[i].lo == lo && kept[i].hi == hi)) i++;
  if (i < nkept) {
    kept[i].refs++;
  } else {
    if (nkept == kept_cap) {
      size_t cap = kept_cap ? 2 * kept_cap : 8;
      struct kept_range *k = realloc(kept, cap * sizeof *k);
      if (k) {
        kept = k;
        kept_cap = cap;
      }
    }
    if (nkept < kept_cap) {
      kept[nkept++] = (struct kept_range){lo, hi, 1};
      atomic_store(&kept_count, nkept);
    } else {
      st = WEFT_ERR_NOMEM;
    }
  }
  pthread_mutex_unlock(&kept_lock);
  return st;
}

bool weft_mem_unkeep(const void *ptr) {
  bool found = false;
  pthread_mutex_lock(&kept_lock);
  for (size_t i = 0; i < nkept && !found; i++)
    if (kept[i].lo == (uintptr_t)ptr) {
      found = true;
      if (--kept[i].refs == 0) kept[i] = kept[--nkept];
    }
  atomic_store(&kept_count, nkept);
  pthread_mutex_unlock(&kept_lock);
  return found;
}

bool weft_mem_is_kept(const void *ptr, size_t bytes) {
  if (!atomic_load_explicit(&kept_count, memory_order_relaxed)) return false;
  uintptr_t lo = (uintptr_t)ptr, hi = lo + bytes;
  bool in = false;
  pthread_mutex_lock(&kept_lock);
  for (size_t i = 0; i < nkept && !in; i++) in = kept[i].lo <= lo && hi <= kept[i].hi;
  pthread_mutex_unlock(&kept_lock);
  return in;
}
