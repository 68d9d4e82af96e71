/* select.h - which transport reaches a peer, and why: the rules as pure
 * functions of facts each rank publishes, so they can be tested on saved
 * topologies. Selection is a list and a question: transports in order
 * (the topology decides the order), each asked "can you reach this peer?",
 * first yes wins. */
#ifndef WEFT_SELECT_H
#define WEFT_SELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/topo/topo.h"

/* What a rank publishes about where it runs (inside transport addresses). */
typedef struct weft_place {
  char host_id[64];     /* WEFT_HOST_ID, else hostname + kernel boot id */
  uint64_t shm_ns;      /* identity of the /dev/shm mount (dev, inode); 0 = none usable */
  uint64_t pid_ns;      /* inode of /proc/self/ns/pid; 0 = unknown */
  int rdma_devices;     /* usable RDMA devices (from the topology) */
} weft_place;

/* Fills this process's place from the environment and the topology. */
void weft_place_here(const weft_topo *topo, weft_place *out);

/* Shared memory reaches a peer on the same host that sees the same /dev/shm
 * and the same process ids (to notice its death). Writes the reason. */
bool weft_select_shm_reaches(const weft_place *self, const weft_place *peer, char *why, size_t len);
/* Verbs reaches a peer on another host when both have an RDMA device. */
bool weft_select_ibv_reaches(const weft_place *self, const weft_place *peer, char *why, size_t len);

/* Transport names in the order to ask them, given the topology and the
 * transports this build has ("shm", "ibv", "tcp"). `forced` (WEFT_TRANSPORT,
 * may be NULL or "") leaves only that one; an unknown or unbuilt name is
 * WEFT_ERR_INVALID with a sentence in why. `order` has room for nbuilt
 * names; only built names are written. Returns the count written; on success
 * `why` says why this order (for the INIT log). */
int weft_select_order(const weft_topo *topo, const char *const *built, int nbuilt,
                      const char *forced, const char **order, char *why, size_t len);

#endif
