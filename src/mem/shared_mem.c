/* shared_mem.c - weft_mem_alloc / weft_mem_free and the registry of what
 * they handed out. Each allocation is one memfd mapped MAP_SHARED: a peer of
 * the same host maps the same pages through /proc/<pid>/fd/<fd>, which needs
 * only the permission to read this process's descriptors (not ptrace
 * attach, which Yama often forbids). The descriptor stays open for the
 * allocation's life; the pages live on in a peer's cached mapping after a
 * free, so a late peer never touches unmapped memory. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/log.h"
#include "src/mem/shared_mem.h"
#include "weft.h"

typedef struct shared_alloc {
  char *base;
  size_t bytes; /* mapped length (whole pages) */
  int fd;
  uint64_t ino;
} shared_alloc;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static shared_alloc *registry;
static size_t registry_len, registry_cap;

weft_status weft_mem_alloc(size_t bytes, void **ptr) {
  if (!ptr) return WEFT_ERR_INVALID;
  *ptr = NULL;
  if (bytes == 0 || bytes > SIZE_MAX - 4096) return WEFT_ERR_INVALID;
  size_t len = (bytes + 4095) & ~(size_t)4095;
  int fd = memfd_create("weft-shared", MFD_CLOEXEC);
  if (fd < 0) {
    WEFT_WARN(WEFT_SUBSYS_INIT, "weft_mem_alloc: memfd_create: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  /* fallocate, not ftruncate: running out of memory is an error now, not a
   * SIGBUS when a page is first touched */
  int rc = posix_fallocate(fd, 0, (off_t)len);
  struct stat st;
  if (rc || fstat(fd, &st)) {
    close(fd);
    WEFT_WARN(WEFT_SUBSYS_INIT, "weft_mem_alloc: %zu bytes: %s", len, strerror(rc ? rc : errno));
    return rc == ENOSPC || rc == ENOMEM ? WEFT_ERR_NOMEM : WEFT_ERR_SYSTEM;
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return WEFT_ERR_NOMEM;
  }
  pthread_mutex_lock(&registry_lock);
  if (registry_len == registry_cap) {
    size_t cap = registry_cap ? 2 * registry_cap : 16;
    shared_alloc *grown = realloc(registry, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&registry_lock);
      munmap(p, len);
      close(fd);
      return WEFT_ERR_NOMEM;
    }
    registry = grown;
    registry_cap = cap;
  }
  registry[registry_len++] = (shared_alloc){p, len, fd, (uint64_t)st.st_ino};
  pthread_mutex_unlock(&registry_lock);
  *ptr = p;
  return WEFT_OK;
}

weft_status weft_mem_free(void *ptr) {
  if (!ptr) return WEFT_OK;
  pthread_mutex_lock(&registry_lock);
  for (size_t i = 0; i < registry_len; i++) {
    if (registry[i].base != ptr) continue;
    shared_alloc a = registry[i];
    registry[i] = registry[--registry_len];
    pthread_mutex_unlock(&registry_lock);
    munmap(a.base, a.bytes);
    close(a.fd);
    return WEFT_OK;
  }
  pthread_mutex_unlock(&registry_lock);
  return WEFT_ERR_INVALID;
}

bool weft_shared_mem_describe(const void *ptr, size_t len, weft_mem_desc *desc) {
  if (!ptr || len == 0) return false;
  uintptr_t p = (uintptr_t)ptr;
  bool found = false;
  weft_shared_key key = {0};
  pthread_mutex_lock(&registry_lock);
  for (size_t i = 0; i < registry_len && !found; i++) {
    uintptr_t b = (uintptr_t)registry[i].base;
    if (p < b || p - b > registry[i].bytes || len > registry[i].bytes - (p - b)) continue;
    key = (weft_shared_key){.pid = (uint32_t)getpid(),
                            .fd = registry[i].fd,
                            .ino = registry[i].ino,
                            .offset = p - b};
    found = true;
  }
  pthread_mutex_unlock(&registry_lock);
  if (!found) return false;
  memset(desc, 0, sizeof *desc);
  desc->version = WEFT_MEM_DESC_VERSION;
  desc->kind = WEFT_MEMORY_SHARED;
  desc->body_len = sizeof key;
  desc->len = len;
  memcpy(desc->body, &key, sizeof key);
  return true;
}

_Static_assert(sizeof(weft_shared_key) <= WEFT_MEM_DESC_BODY, "a shared key fits a descriptor");

weft_status weft_shared_mem_key(const weft_mem_desc *desc, weft_shared_key *key) {
  if (desc->version != WEFT_MEM_DESC_VERSION || desc->kind != WEFT_MEMORY_SHARED ||
      desc->body_len != sizeof *key)
    return WEFT_ERR_PROTOCOL;
  memcpy(key, desc->body, sizeof *key);
  return WEFT_OK;
}
