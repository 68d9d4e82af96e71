/* comm.h - the communicator: the core the layers below it read (who the
 * ranks are, how to reach each peer, the failure state that makes every
 * later call fail fast with the first cause), the engine's part, and what
 * making and ending communicators needs besides. */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "src/base/auth.h"
#include "src/coll/core.h"
#include "src/comm/bootstrap.h"
#include "src/elastic/ctl.h"
#include "src/engine/engine_state.h"
#include "src/topo/select.h"
#include "transports/transport.h"
#include "weft.h"

#define WEFT_COMM_MAGIC 0x5745464343u /* "WEFCC" */

/* What this rank learned of a peer at the rendezvous. */
typedef struct weft_peer {
  boot_rank_info info; /* host, pid, transport addresses */
  char why[192];       /* why its transport was chosen */
} weft_peer;

/* A communicator: the core the layers below read (src/coll/core.h: ranks,
 * hosts, the peer table of src/link, the failure state, the call counter,
 * the algorithm choice, the recorder), the engine's part
 * (src/engine/engine_state.h), and what only this layer uses: how the
 * communicator was made and how to make its transports. Point-to-point
 * messages run on a channel of the same transports (src/engine/p2p.h). */
struct weft_comm {
  uint64_t magic;
  weft_core core;     /* core.engine points at `engine` */
  weft_engine engine; /* the queue and its driver */
  int local_rank;
  uint64_t id;
  weft_place place;                 /* where this rank runs */
  weft_auth_key auth_key;           /* what network connections of this job prove */
  weft_transport_init_args tp_args; /* the transport keeps a pointer to it */
  weft_peer *peers;                 /* by rank: what each published; core.links.peers
                                       point at their addresses */
  /* buffers registered on it (weft_comm_register), each also in the
   * process's kept ranges (mem.h), given back at deregister or destroy */
  const void **registered;
  size_t nregistered, registered_cap;
  /* recovery (recover.c): the control plane (NULL for a single rank), and
   * how many agreements this rank made on the communicator (the survivors
   * count alike: it numbers them) */
  weft_ctl *ctl;
  pthread_mutex_t ctl_lock; /* the control plane's user: a recovery, or the probe
                               (from the progress thread; it skips when taken) */
  uint32_t agreements;
  /* guests that asked in (weft_comm_join) and were not admitted yet:
   * their control-plane guest index, pid and host (recover.c) */
  struct weft_guest *guests;
  int nguests;
  /* the stall probe (probe.c): the call it last asked about, and when */
  uint32_t probe_seq;
  double probe_asked_at;
};

/* The stall probe (probe.c), installed on a communicator of several ranks
 * when WEFT_STALL_PROBE is not 0: core.stall_probe. */
weft_status weft_comm_stall_probe(weft_core *core, const weft_coll *head, int waits_on,
                                  double idle_s);

/* The entry of the published addresses that holds the control plane's
 * listener (the transports' entries are their built-in index). */
#define WEFT_COMM_CTL_ADDR_ID 0xC7

/* A failure's sentence on a communicator is weft_core_error (core.h); this
 * is the one for failures before a communicator exists, or on a handle that
 * is not one (thread-local: weft_last_error(NULL) reads it). */
weft_status weft_init_error(weft_status st, int rank, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Making a communicator out of a live one (weft_comm_split, and
 * weft_comm_shrink in recover.c): child_start makes rank `rank` of `size`
 * with the parent's place, key and local address, and starts its
 * transports and control plane; *mine gets what it publishes. Once every
 * member's is known (all, by new rank), child_finish learns them and makes
 * it live under `id` (weft_comm_derive_id: the same on every member).
 * child_drop frees one that never went live. Errors are also written to
 * the parent's last_error. */
weft_status weft_comm_child_start(weft_comm *parent, int rank, int size, const char *call,
                                  weft_comm **out, boot_rank_info *mine);
weft_status weft_comm_child_finish(weft_comm *parent, weft_comm *comm, const boot_rank_info *all,
                                   uint64_t id, const char *call);
void weft_comm_child_drop(weft_comm *comm);
/* This process's host identity, as a communicator publishes it
 * (WEFT_HOST_ID, else hostname and boot id): what a joining process tells
 * the members before it has a communicator. */
void weft_comm_host_here(char *out, size_t len);
/* The same for a process that joins (weft_comm_join) and has no parent:
 * rank `rank` of `size`, its transports' local address and the job key
 * given. child_finish with parent NULL then makes it live. */
weft_status weft_comm_guest_start(int rank, int size, double timeout_s,
                                  const struct sockaddr_storage *local, socklen_t local_len,
                                  const weft_auth_key *key, const char *call, weft_comm **out,
                                  boot_rank_info *mine);
uint64_t weft_comm_derive_id(const weft_comm *parent, uint64_t salt);

/* The address `peer` published for built-in transport `builtin` (NULL, 0 if none). */
void weft_comm_peer_address(const weft_comm *comm, int peer, int builtin, const void **addr,
                            size_t *len);

/* "shm (built, usable here), tcp (built, usable here)": for weft-info. */
void weft_transports_describe(char *buf, size_t len);

/* Prints every live communicator's flight recorder to stderr. */
void weft_comm_dump_all(const char *why);

/* Validates a handle from the user against the live set. */
bool weft_comm_is_live(const weft_comm *comm);

/* Environment parsing (env.c). */
typedef struct weft_env_job {
  int rank, size, local_rank;
  char rendezvous[256]; /* host:port, "" if none given */
  const char *source;   /* which convention supplied rank/size */
} weft_env_job;
weft_status weft_env_read(weft_env_job *job, char *why, size_t why_len);

/* A blocking call about to wait: the thread that started the communicator
 * steps back onto the CPU the start-up spread chose, when it is elsewhere
 * (comm.c says why; at most every 50 ms, nothing when no spread was done). */
void weft_spread_keep(void);

#endif
