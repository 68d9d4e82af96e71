/* comm.h - the communicator: who the ranks are, how to reach each peer, the
 * transport context, and the failure state that makes every later call fail
 * fast with the first cause once anything went wrong. */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "src/base/auth.h"
#include "src/coll/choose.h"
#include "src/coll/recorder.h"
#include "src/comm/bootstrap.h"
#include "src/engine/engine_state.h"
#include "src/topo/select.h"
#include "transports/transport.h"
#include "weft.h"

#define WEFT_COMM_MAGIC 0x5745464343u /* "WEFCC" */

#define WEFT_MAX_TRANSPORTS 3
/* Address entries a lane publishes carry the transport index | this bit. */
#define LANE_ADDR_TAG 0x80

/* A transport running in this communicator. */
typedef struct weft_comm_transport {
  const weft_transport *ops;
  weft_tp_ctx *ctx;
  int builtin; /* index in the built-in table (the id peers publish) */
} weft_comm_transport;

typedef struct weft_peer {
  boot_rank_info info;    /* host, pid, transport addresses */
  int tp;                 /* index into comm->tps; -1 for this rank */
  char why[192];          /* why that transport was chosen */
  weft_tp_conn *conn;     /* NULL until first used */
  uint32_t last_send_seq; /* last collective that sent to this peer */
  bool is_active;         /* on the comm's list of peers touched by the current call */
} weft_peer;

/* A communicator: this layer's own part (who the ranks are, how to reach
 * each peer, the failure state) and the parts each layer below owns, each
 * defined in its layer's header: the algorithm choice (src/coll/choose.h),
 * the flight recorder (src/coll/recorder.h), the engine's queue and driver
 * (src/engine/engine_state.h). */
struct weft_comm {
  /* identity */
  uint64_t magic;
  int rank;
  int size;
  int local_rank;
  int local_size;
  uint64_t id;
  double timeout_s;
  /* hosts, for hierarchical algorithms: ranks in ascending order */
  int nhosts;
  int *host_members; /* the ranks on this rank's host (local_size of them) */
  int host_index;    /* this rank's index there; 0: the host's leader */
  int *leaders;      /* the lowest rank of every host (nhosts of them) */
  int leader_index;  /* this host's index among the leaders */

  /* transports and peers */
  weft_comm_transport tps[WEFT_MAX_TRANSPORTS]; /* in selection order */
  int ntps;
  weft_place place;                 /* where this rank runs */
  weft_auth_key auth_key;           /* what network connections of this job prove */
  weft_transport_init_args tp_args; /* the transport keeps a pointer to it */
  weft_peer *peers;                 /* by rank; own entry unused */
  int *active;                      /* ranks touched by the current call */
  int nactive;
  size_t chunk_bytes;
  uint64_t events; /* completed sends/receives, counted by the links: the
                      engine's sign of progress, for the timeout */

  /* failure: sticky, so every later call fails fast with the first cause */
  atomic_int aborted;
  weft_status failed;   /* sticky first failure, 0 while healthy */
  weft_error_sink sink; /* transport error sentences land here */
  char last_error[768];

  /* calls (src/coll) */
  uint32_t seq;             /* collective call counter, the same on every rank */
  bool check_calls;         /* WEFT_CHECK: compare fingerprints before every collective */
  weft_choice_state choice; /* algorithm choice: its settings and memory */
  weft_recorder recorder;   /* the last calls, for the flight recorder */

  /* the engine (src/engine) */
  weft_engine engine;
  /* the point-to-point lane: a hidden communicator with the same ranks (p2p.h) */
  struct weft_p2p_lane *lane; /* set on a lane */
  struct weft_comm *p2p;      /* a user's communicator: its lane for send/recv */
  struct weft_comm *owner;    /* a lane: the user's communicator it serves */
  uint8_t addr_tag;           /* 0, or LANE_ADDR_TAG on a lane: which published addresses are its */
};

/* Records a failure on `comm` with the sentence the user reads: it starts
 * with the rank and the call. Returns st. */
weft_status weft_comm_error(weft_comm *comm, weft_status st, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same for failures before a communicator exists (thread-local). */
weft_status weft_init_error(weft_status st, int rank, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

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
