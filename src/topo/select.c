/* select.c - the transport selection rules: where a rank runs (host, /dev/shm
 * mount, pid namespace, RDMA devices), whether shared memory or verbs can
 * reach a peer from those facts alone, and the order to ask the transports. */
#include "src/topo/select.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "src/base/settings.h"

/* ---- where this rank runs ----------------------------------------------- */

/* Two containers on one host may each mount their own /dev/shm: the mount's
 * device and inode tell whether a segment one creates is visible to the other. */
static uint64_t place_shm_namespace(void) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) return 0;
  return ((uint64_t)st.st_dev << 32) ^ (uint64_t)st.st_ino;
}

/* Shared memory needs to see the peer's pid to notice its death. */
static uint64_t place_pid_namespace(void) {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return (uint64_t)st.st_ino;
}

void weft_place_here(const weft_topo *topo, weft_place *out) {
  memset(out, 0, sizeof *out);
  /* WEFT_HOST_ID lets tests and containers say which ranks share a host;
   * weft_host_identity alone cannot know it. */
  const char *host_id = weft_setting_str(WEFT_SETTING_HOST_ID);
  if (*host_id)
    snprintf(out->host_id, sizeof out->host_id, "%s", host_id);
  else
    weft_host_identity(out->host_id, sizeof out->host_id);
  out->shm_ns = place_shm_namespace();
  out->pid_ns = place_pid_namespace();
  out->rdma_devices = topo ? topo->n_rdma : 0;
}

/* ---- can a transport reach the peer ------------------------------------- */

/* A peer's place arrives over the wire: never trust its string to end. */
#define PLACE_HOST_LEN ((int)sizeof(((weft_place *)0)->host_id))

static bool place_same_host(const weft_place *a, const weft_place *b) {
  return strncmp(a->host_id, b->host_id, sizeof a->host_id) == 0;
}

bool weft_select_shm_reaches(const weft_place *self, const weft_place *peer, char *why,
                             size_t len) {
  const char *reason = NULL;
  if (!place_same_host(self, peer)) {
    snprintf(why, len, "different host (%.*s vs %.*s)", PLACE_HOST_LEN, self->host_id,
             PLACE_HOST_LEN, peer->host_id);
    return false;
  }
  if (self->shm_ns == 0 || peer->shm_ns == 0)
    reason = "same host but no usable /dev/shm on both ranks";
  else if (self->shm_ns != peer->shm_ns)
    reason = "same host but a different /dev/shm (another container?)";
  else if (self->pid_ns == 0 || peer->pid_ns == 0)
    reason = "same host but the pid namespace is unknown, so the peer's death could go unnoticed";
  else if (self->pid_ns != peer->pid_ns)
    reason = "same host but another pid namespace";
  if (reason) {
    snprintf(why, len, "%s", reason);
    return false;
  }
  snprintf(why, len, "same host %.*s, shared /dev/shm", PLACE_HOST_LEN, self->host_id);
  return true;
}

bool weft_select_ibv_reaches(const weft_place *self, const weft_place *peer, char *why,
                             size_t len) {
  if (place_same_host(self, peer)) {
    snprintf(why, len, "same host %.*s: verbs is for peers on other hosts", PLACE_HOST_LEN,
             self->host_id);
    return false;
  }
  if (self->rdma_devices <= 0) {
    snprintf(why, len, "no RDMA device on this rank");
    return false;
  }
  if (peer->rdma_devices <= 0) {
    snprintf(why, len, "no RDMA device on the peer (%.*s)", PLACE_HOST_LEN, peer->host_id);
    return false;
  }
  snprintf(why, len, "other host %.*s, RDMA devices on both", PLACE_HOST_LEN, peer->host_id);
  return true;
}

/* ---- the order to ask the transports ------------------------------------ */

static bool order_is_built(const char *name, const char *const *built, int nbuilt) {
  for (int i = 0; i < nbuilt; i++)
    if (built[i] && !strcmp(built[i], name)) return true;
  return false;
}

static void order_join(const char *const *names, int n, char *out, size_t len) {
  size_t used = 0;
  out[0] = 0;
  for (int i = 0; i < n && used < len; i++) {
    int w = snprintf(out + used, len - used, "%s%s", i ? ", " : "", names[i] ? names[i] : "?");
    if (w < 0) break;
    used += (size_t)w;
  }
}

static int order_forced(const char *forced, const char *const *built, int nbuilt,
                        const char **order, char *why, size_t len) {
  if (!order_is_built(forced, built, nbuilt)) {
    char have[128];
    order_join(built, nbuilt, have, sizeof have);
    snprintf(why, len, "WEFT_TRANSPORT=%s: this build has %s", forced, nbuilt ? have : "none");
    return WEFT_ERR_INVALID;
  }
  for (int i = 0; i < nbuilt; i++)
    if (built[i] && !strcmp(built[i], forced)) order[0] = built[i];
  snprintf(why, len, "forced by WEFT_TRANSPORT=%s", forced);
  return 1;
}

int weft_select_order(const weft_topo *topo, const char *const *built, int nbuilt,
                      const char *forced, const char **order, char *why, size_t len) {
  if (forced && *forced) return order_forced(forced, built, nbuilt, order, why, len);
  bool rdma = topo && topo->n_rdma > 0;
  /* Cheapest first: memory on the host, then verbs, then sockets that reach anything. */
  const char *preferred[] = {"shm", "ibv", "tcp"};
  int n = 0;
  for (size_t i = 0; i < sizeof preferred / sizeof preferred[0]; i++) {
    if (!strcmp(preferred[i], "ibv") && !rdma) continue;
    for (int b = 0; b < nbuilt; b++)
      if (built[b] && !strcmp(built[b], preferred[i])) order[n++] = built[b];
  }
  char names[64];
  order_join(order, n, names, sizeof names);
  snprintf(why, len, "order %s (%s)", n ? names : "empty: no transport built",
           rdma ? "RDMA device found" : "no RDMA device");
  return n;
}
