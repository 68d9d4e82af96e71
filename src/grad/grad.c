/* grad.c - what a data-parallel optimizer needs around its step: gradients
 * fused into buckets and reduced while backward runs (DDP's reducer, Horovod's
 * fusion, MegEngine's AllreduceCallback), parameters broadcast, buffers and
 * metrics synchronised. Written only against the public non-blocking calls
 * and src/api/support.h (error sentences, the memory table, opaque), so it
 * runs unchanged on the progress engine and on device memory once those
 * exist; from below it takes only src/base's logging and settings. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/api/support.h"
#include "src/base/log.h"
#include "src/base/settings.h"
#include "src/base/status.h"
#include "weft.h"

#define GRAD_MAGIC 0x6772616477656674ull /* "gradweft" */
/* Every tensor starts on a 64-byte boundary of its bucket: views handed to a
 * framework suit any vector width; the padding (zeros) costs a few KiB. */
#define GRAD_ALIGN 64
/* params/buffers: tensors from this size up are broadcast in place (a copy
 * would cost more than the call it saves); smaller ones are packed into
 * messages of up to PACK_CAP bytes. */
#define PACK_INPLACE_BYTES (1u << 20)
#define PACK_CAP_BYTES (4u << 20)

typedef struct grad_bucket {
  weft_dtype dtype;
  weft_memory memory;
  const weft_api_mem *mem;
  int *members; /* tensor ids in fill order */
  int nmembers;
  size_t count; /* elements reduced, padding between tensors included */
  void *flat;   /* what is reduced: weft's buffer, or the single tensor's own */
  int staged;   /* flat is weft's staging buffer: copy in at ready, out at wait */
  int owned;    /* flat was allocated here (owned storage or staging) */
  int shared;   /* ... by weft_mem_alloc: peers of this host reach it (direct allreduce) */
  int pending;  /* members not ready yet in this step */
  int launched;
  weft_request *req; /* may outlive its step: a step ended by weft_grad_wait_stream leaves it
                        for the next launch of this bucket (reap) to free */
  uint64_t req_step; /* the step req belongs to */
  /* device copy mode: the members as the pack/unpack kernel reads them */
  void *pieces;
  size_t most;     /* the largest member's count */
  uint32_t signal; /* its allreduce's value for streams that wait on it (device sets) */
} grad_bucket;

struct weft_grad {
  uint64_t magic;
  weft_comm *comm;
  weft_grad_options opts;
  int check_every_step;

  weft_tensor *regs; /* as registered; ptr is the bucket view once owned */
  int ntensors, cap_tensors;
  int *bucket_of;
  size_t *offset_of;     /* elements into the bucket */
  uint64_t *ready_stamp; /* step + 1 when marked ready in the current step */
  int *order;            /* fill order from weft_grad_set_order, or NULL */
  weft_tensor *params;
  int nparams;

  grad_bucket *buckets;
  int nbuckets;
  int finalized;
  weft_status broken; /* sticky: a mismatch or a communicator failure */

  /* a set of device tensors: its work is queued on `stream` (named with
   * weft_grad_set_stream; else the communicator's at each launch) */
  int device;
  int stream_named;
  void *stream;
  const weft_api_mem *mem; /* the set's memory table (its mark) */
  void *drained;           /* the host form's wait for its unpacks */
  int unpacks_on_stream;   /* the last step ended with weft_grad_wait_stream: its unpacks,
                              queued on the program's stream, end at `drained` */

  uint64_t step;    /* steps completed */
  int in_step;      /* a weft_grad_ready came since the last wait */
  int step_checked; /* the per-step agreement ran for this step */
  int sync;
  int next_launch;
  weft_grad_stats stats;
};

/* ---- errors ---------------------------------------------------------------- */

static int grad_ok(const weft_grad *g) {
  return g && g->magic == GRAD_MAGIC;
}

static weft_status bad_handle(const char *call) {
  return weft_api_handle_error(WEFT_ERR_INVALID, call, "the gradient set is NULL or destroyed");
}

static weft_status comm_check(weft_comm *comm, const char *call) {
  if (!weft_api_comm_live(comm))
    return weft_api_handle_error(WEFT_ERR_INVALID, call, "comm is not a live communicator");
  return WEFT_OK;
}

/* Re-states an error the library already described, prefixed with our context. */
static weft_status wrap_error(weft_comm *comm, weft_status st, const char *call, const char *ctx) {
  char prev[768];
  snprintf(prev, sizeof prev, "%s", weft_last_error(comm));
  return weft_api_error(comm, st, call, "%s: %s", ctx, prev);
}

static const char *memory_name(weft_memory m) {
  return m == WEFT_MEMORY_HOST ? "host" : m == WEFT_MEMORY_DEVICE ? "device" : "unknown";
}

/* The table for a tensor: by its pointer where there is one (a CUDA build asks
 * the driver), else by its declared kind. NULL: this build has no such memory. */
static const weft_api_mem *mem_of(const weft_tensor *t) {
  return weft_api_mem_of(t->ptr, t->memory);
}

/* Checks one tensor description; fills `why` and returns non-zero if bad. */
static int tensor_invalid(const weft_tensor *t, int need_ptr, char *why, size_t len) {
  if ((unsigned)t->dtype >= WEFT_DTYPE_COUNT) {
    snprintf(why, len, "unknown dtype %d", (int)t->dtype);
    return 1;
  }
  if ((unsigned)t->memory >= WEFT_MEMORY_COUNT) {
    snprintf(why, len, "unknown memory kind %d", (int)t->memory);
    return 1;
  }
  if (t->count > SIZE_MAX / 16) {
    snprintf(why, len, "count %zu is too large", t->count);
    return 1;
  }
  if (need_ptr && !t->ptr && t->count) {
    snprintf(why, len, "ptr is NULL but count is %zu", t->count);
    return 1;
  }
  return 0;
}

/* ---- agreement: every rank passed the same things (never a hang) ----------- */

/* A fixed-size fingerprint per rank, allgathered: ranks whose lists differ
 * still make the same calls. On a difference every rank sees the same
 * fingerprints and so takes the same further steps: a binary search over
 * prefix hashes (one 8-byte allgather a round) finds the first differing
 * entry, and one more allgather shows it from every rank. */
enum { FP_CALL, FP_LOCAL_ERROR, FP_N, FP_HASH, FP_FIXED };
#define FP_FIELDS 12
#define FP_LEN (FP_FIXED + FP_FIELDS)

typedef struct agree_spec {
  const char *call; /* named in messages and hashed: ranks in different calls differ */
  const char *noun; /* "tensor", "parameter", "buffer" */
  const weft_tensor *list;
  int n;
  int local_error; /* this rank refused its own input (its message is set) */
  int nfields;
  const char *field_name[FP_FIELDS];
  uint64_t field[FP_FIELDS];
} agree_spec;

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ULL;
  return h;
}

static uint64_t fnv_str(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

static uint64_t list_hash(const weft_tensor *list, int upto) {
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < upto; i++) {
    h = fnv_u64(h, list[i].count);
    h = fnv_u64(h, (uint64_t)list[i].dtype);
    h = fnv_u64(h, (uint64_t)list[i].memory);
  }
  return h;
}

/* "1,3,5" for the ranks whose word k differs from rank 0's (at most 8 named). */
static int ranks_differing(const uint64_t *all, int size, int stride, int k, char *buf,
                           size_t len) {
  int found = 0;
  size_t used = 0;
  buf[0] = 0;
  for (int r = 1; r < size; r++) {
    if (all[(size_t)r * stride + k] == all[k]) continue;
    if (found < 8 && used < len)
      used += snprintf(buf + used, len - used, "%s%d", found ? "," : "", r);
    else if (found == 8 && used < len)
      used += snprintf(buf + used, len - used, ",...");
    found++;
  }
  return found;
}

static weft_status agree_list(weft_comm *comm, const agree_spec *s, const uint64_t *all, int size,
                              char *msg, size_t len) {
  int min_n = s->n;
  for (int r = 0; r < size; r++)
    if ((int)all[(size_t)r * FP_LEN + FP_N] < min_n) min_n = (int)all[(size_t)r * FP_LEN + FP_N];
  /* the longest prefix every rank has in common */
  int lo = 0, hi = min_n;
  uint64_t *h = malloc(sizeof(uint64_t) * (size_t)size);
  uint64_t *e = malloc(sizeof(uint64_t) * 3 * (size_t)size);
  weft_status st = h && e ? WEFT_OK : WEFT_ERR_NOMEM;
  while (!st && lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    uint64_t mine = list_hash(s->list, mid);
    st = weft_allgather(comm, &mine, h, 1, WEFT_I64);
    int eq = 1;
    for (int r = 1; r < size && !st; r++) eq &= h[r] == h[0];
    if (eq)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (!st && lo < min_n) {
    uint64_t mine[3] = {s->list[lo].count, (uint64_t)s->list[lo].dtype,
                        (uint64_t)s->list[lo].memory};
    st = weft_allgather(comm, mine, e, 3, WEFT_I64);
    if (!st) {
      size_t used = snprintf(msg, len, "%s %d differs: rank 0 has %llu %s (%s)", s->noun, lo,
                             (unsigned long long)e[0], weft_dtype_name((weft_dtype)e[1]),
                             memory_name((weft_memory)e[2]));
      int shown = 0;
      for (int r = 1; r < size && used < len; r++) {
        if (!memcmp(e + 3 * (size_t)r, e, 3 * sizeof *e)) continue;
        if (shown++ == 4) {
          used += snprintf(msg + used, len - used, ", ...");
          break;
        }
        used += snprintf(msg + used, len - used, ", rank %d has %llu %s (%s)", r,
                         (unsigned long long)e[3 * r], weft_dtype_name((weft_dtype)e[3 * r + 1]),
                         memory_name((weft_memory)e[3 * r + 2]));
      }
      if (used < len) snprintf(msg + used, len - used, " (the %d before agree)", lo);
    }
  } else if (!st) {
    char who[96];
    ranks_differing(all, size, FP_LEN, FP_N, who, sizeof who);
    snprintf(msg, len, "rank 0 has %llu %ss, rank(s) %s a different number (the first %d agree)",
             (unsigned long long)all[FP_N], s->noun, who, min_n);
  }
  free(h);
  free(e);
  return st;
}

/* WEFT_OK when every rank agrees; else WEFT_ERR_MISMATCH on every rank with
 * the first difference in weft_last_error (kept as it is on a rank that
 * refused its own input), or the communicator's error. */
static weft_status agree(weft_comm *comm, const agree_spec *s) {
  int size = weft_comm_size(comm);
  uint64_t mine[FP_LEN] = {0};
  mine[FP_CALL] = fnv_str(s->call);
  mine[FP_LOCAL_ERROR] = s->local_error != 0;
  mine[FP_N] = s->local_error ? 0 : (uint64_t)s->n;
  mine[FP_HASH] = s->local_error ? 0 : list_hash(s->list, s->n);
  for (int i = 0; i < s->nfields; i++) mine[FP_FIXED + i] = s->field[i];
  uint64_t *all = malloc(sizeof(uint64_t) * FP_LEN * (size_t)size);
  if (!all) return weft_api_error(comm, WEFT_ERR_NOMEM, s->call, "no memory for the check");
  weft_status st = weft_allgather(comm, mine, all, FP_LEN, WEFT_I64);
  if (st) {
    free(all);
    return wrap_error(comm, st, s->call, "checking that every rank agrees");
  }
  char who[96], msg[512] = "";
  int differ;
  if ((differ = ranks_differing(all, size, FP_LEN, FP_CALL, who, sizeof who))) {
    if (all[FP_CALL] == mine[FP_CALL])
      snprintf(msg, sizeof msg, "rank(s) %s are in another call than %s (rank 0 is in %s)", who,
               s->call, s->call);
    else
      snprintf(msg, sizeof msg,
               "this rank is in %s, rank 0 in another call (ranks differing "
               "from rank 0: %s)",
               s->call, who);
  } else {
    int bad = 0;
    who[0] = 0;
    for (int r = 0; r < size; r++)
      if (all[(size_t)r * FP_LEN + FP_LOCAL_ERROR]) {
        if (bad < 8)
          snprintf(who + strlen(who), sizeof who - strlen(who), "%s%d", bad ? "," : "", r);
        bad++;
      }
    if (bad) {
      if (s->local_error) {
        free(all);
        return WEFT_ERR_MISMATCH; /* the caller keeps this rank's own message */
      }
      snprintf(msg, sizeof msg,
               "rank(s) %s refused their own arguments (their weft_last_error "
               "says why)",
               who);
    } else if (ranks_differing(all, size, FP_LEN, FP_N, who, sizeof who) ||
               ranks_differing(all, size, FP_LEN, FP_HASH, who, sizeof who)) {
      st = agree_list(comm, s, all, size, msg, sizeof msg);
    } else {
      for (int i = 0; i < s->nfields && !msg[0]; i++)
        if (ranks_differing(all, size, FP_LEN, FP_FIXED + i, who, sizeof who)) {
          int r = atoi(who);
          snprintf(msg, sizeof msg, "%s differs: rank 0 has %llu, rank(s) %s not (rank %d: %llu)",
                   s->field_name[i], (unsigned long long)all[FP_FIXED + i], who, r,
                   (unsigned long long)all[(size_t)r * FP_LEN + FP_FIXED + i]);
        }
    }
  }
  free(all);
  if (st) return wrap_error(comm, st, s->call, "finding where the ranks differ");
  if (!msg[0]) return WEFT_OK;
  WEFT_WARN(WEFT_SUBSYS_GRAD, "%s: %s", s->call, msg);
  return weft_api_error(comm, WEFT_ERR_MISMATCH, s->call, "%s", msg);
}

static uint64_t double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

/* ---- fused broadcast / average of tensor lists ------------------------------ */

/* One message of a fused call: a packed staging buffer, or one tensor in place. */
typedef struct fuse_msg {
  void *buf;
  const weft_api_mem *mem;
  size_t bytes;
  weft_dtype dtype; /* U8 for broadcasts (bytes are bytes) */
  int staged;
  int average; /* allreduce avg, else broadcast */
  weft_request *req;
} fuse_msg;

enum fuse_kind { FUSE_SKIP = 0, FUSE_BCAST, FUSE_AVG };

/* Moves every tensor whose kind[i] is not FUSE_SKIP: broadcast from root, or
 * averaged over ranks. Small tensors of one memory kind (and one dtype for
 * averages) share messages; messages are issued non-blocking, then waited in
 * order. Every rank forms the same messages from the same list (agreed
 * before). */
static weft_status fuse_run(weft_comm *comm, const char *call, const weft_tensor *t, int n,
                            const unsigned char *kind, int root) {
  int rank = weft_comm_rank(comm);
  fuse_msg *msgs = calloc((size_t)n + 1, sizeof *msgs);
  int *msg_of = malloc(sizeof(int) * ((size_t)n + 1));
  size_t *off = malloc(sizeof(size_t) * ((size_t)n + 1));
  int open[3][WEFT_DTYPE_COUNT][WEFT_MEMORY_COUNT];
  for (int a = 0; a < 3; a++)
    for (int d = 0; d < WEFT_DTYPE_COUNT; d++)
      for (int m = 0; m < WEFT_MEMORY_COUNT; m++) open[a][d][m] = -1;
  weft_status st = msgs && msg_of && off ? WEFT_OK : WEFT_ERR_NOMEM;
  int nmsgs = 0;
  for (int i = 0; i < n && !st; i++) {
    msg_of[i] = -1;
    if (kind[i] == FUSE_SKIP || !t[i].count) continue;
    size_t bytes = t[i].count * weft_dtype_size(t[i].dtype);
    weft_dtype dt = kind[i] == FUSE_AVG ? t[i].dtype : WEFT_U8;
    int *slot = &open[kind[i]][dt][t[i].memory];
    /* device tensors are never packed: each is its own call, ordered on
     * the communicator's stream, and done when waited for (a packing copy
     * would have to be queued on that stream too) */
    if (bytes >= PACK_INPLACE_BYTES || t[i].memory == WEFT_MEMORY_DEVICE) {
      msgs[nmsgs] = (fuse_msg){t[i].ptr, mem_of(&t[i]), bytes, dt, 0, kind[i] == FUSE_AVG, NULL};
      msg_of[i] = nmsgs++;
      off[i] = 0;
      continue;
    }
    if (*slot >= 0 && msgs[*slot].bytes + bytes > PACK_CAP_BYTES) *slot = -1;
    if (*slot < 0) {
      msgs[nmsgs] = (fuse_msg){NULL, mem_of(&t[i]), 0, dt, 1, kind[i] == FUSE_AVG, NULL};
      *slot = nmsgs++;
    }
    msg_of[i] = *slot;
    off[i] = msgs[*slot].bytes;
    msgs[*slot].bytes += bytes;
  }
  for (int k = 0; k < nmsgs && !st; k++)
    if (msgs[k].staged && !(msgs[k].buf = weft_api_mem_alloc(msgs[k].mem, msgs[k].bytes)))
      st = WEFT_ERR_NOMEM;
  if (st) {
    /* locally out of memory: the others wait for this rank until their timeout */
    st = weft_api_error(comm, st, call, "no memory for %d fused messages", nmsgs);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (msg_of[i] < 0 || !msgs[msg_of[i]].staged) continue;
    if (kind[i] == FUSE_AVG || rank == root)
      weft_api_mem_copy(msgs[msg_of[i]].mem, (char *)msgs[msg_of[i]].buf + off[i], t[i].ptr,
                        t[i].count * weft_dtype_size(t[i].dtype));
  }
  for (int k = 0; k < nmsgs && !st; k++) {
    fuse_msg *m = &msgs[k];
    size_t count = m->bytes / weft_dtype_size(m->dtype);
    st = m->average ? weft_iallreduce(comm, m->buf, m->buf, count, m->dtype, WEFT_AVG, &m->req)
                    : weft_ibroadcast(comm, m->buf, m->buf, count, m->dtype, root, &m->req);
  }
  weft_status first = st;
  for (int k = 0; k < nmsgs; k++) {
    weft_status s = weft_wait(&msgs[k].req);
    if (s && !first) first = s;
  }
  if (first) {
    st = wrap_error(comm, first, call, "moving the tensors");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (msg_of[i] < 0 || !msgs[msg_of[i]].staged) continue;
    if (kind[i] == FUSE_AVG || rank != root)
      weft_api_mem_copy(msgs[msg_of[i]].mem, t[i].ptr, (char *)msgs[msg_of[i]].buf + off[i],
                        t[i].count * weft_dtype_size(t[i].dtype));
  }
out:
  for (int k = 0; msgs && k < nmsgs; k++)
    if (msgs[k].staged && msgs[k].mem) weft_api_mem_release(msgs[k].mem, msgs[k].buf);
  free(msgs);
  free(msg_of);
  free(off);
  return st;
}

/* Checks a list passed to a params/buffers call; on a bad entry records the
 * message (naming the entry) and returns WEFT_ERR_INVALID. */
static weft_status check_list(weft_comm *comm, const char *call, const weft_tensor *t, int n,
                              int root) {
  if (root < 0 || root >= weft_comm_size(comm))
    return weft_api_error(comm, WEFT_ERR_INVALID, call, "root %d is out of range (size %d)", root,
                          weft_comm_size(comm));
  if (n < 0) return weft_api_error(comm, WEFT_ERR_INVALID, call, "n is %d", n);
  if (n > 0 && !t) return weft_api_error(comm, WEFT_ERR_INVALID, call, "tensors is NULL, n %d", n);
  char why[128];
  for (int i = 0; i < n; i++) {
    if (tensor_invalid(&t[i], 1, why, sizeof why))
      return weft_api_error(comm, WEFT_ERR_INVALID, call, "tensor %d: %s", i, why);
    /* host or device memory, as declared (device tensors move one call each) */
    if (t[i].count && ((t[i].memory != WEFT_MEMORY_HOST && t[i].memory != WEFT_MEMORY_DEVICE) ||
                       !mem_of(&t[i])))
      return weft_api_error(
          comm, t[i].memory == WEFT_MEMORY_DEVICE ? WEFT_ERR_UNSUPPORTED : WEFT_ERR_INVALID, call,
          "tensor %d: declared %s memory, but %s", i, memory_name(t[i].memory),
          t[i].memory == WEFT_MEMORY_HOST ? "the pointer is device memory"
          : t[i].memory == WEFT_MEMORY_DEVICE ? "this build or machine has no usable GPU, or the pointer "
                                                "is host memory"
                                              : "parameter and buffer lists take host or device tensors");
  }
  return WEFT_OK;
}

static weft_status list_call(weft_comm *comm, const char *call, const weft_tensor *t, int n,
                             int root, int mode) {
  WEFT_CHECK(comm_check(comm, call));
  weft_status local = check_list(comm, call, t, n, root);
  agree_spec s = {.call = call,
                  .noun = "tensor",
                  .list = t,
                  .n = n,
                  .local_error = local != 0,
                  .nfields = 2,
                  .field_name = {"root", "mode"},
                  .field = {(uint64_t)root, (uint64_t)mode}};
  weft_status st = agree(comm, &s);
  if (local) return local;
  if (st) return st;
  unsigned char *kind = malloc((size_t)n + 1);
  if (!kind) return weft_api_error(comm, WEFT_ERR_NOMEM, call, "no memory");
  for (int i = 0; i < n; i++) {
    int is_float = t[i].dtype <= WEFT_BF16;
    kind[i] = mode == WEFT_SYNC_AVERAGE && is_float ? FUSE_AVG : FUSE_BCAST;
  }
  st = weft_comm_size(comm) > 1 ? fuse_run(comm, call, t, n, kind, root) : WEFT_OK;
  free(kind);
  return st;
}

WEFT_API weft_status weft_params_broadcast(weft_comm *comm, const weft_tensor *tensors, int n,
                                           int root) {
  return list_call(comm, "weft_params_broadcast", tensors, n, root, WEFT_SYNC_BROADCAST);
}

WEFT_API weft_status weft_buffers_sync(weft_comm *comm, const weft_tensor *tensors, int n,
                                       weft_sync_mode mode, int root) {
  WEFT_CHECK(comm_check(comm, "weft_buffers_sync"));
  if (mode != WEFT_SYNC_AVERAGE && mode != WEFT_SYNC_BROADCAST) {
    /* still join the check, so the other ranks hear of it instead of waiting */
    agree_spec s = {.call = "weft_buffers_sync", .local_error = 1};
    agree(comm, &s);
    return weft_api_error(comm, WEFT_ERR_INVALID, "weft_buffers_sync", "unknown mode %d",
                          (int)mode);
  }
  return list_call(comm, "weft_buffers_sync", tensors, n, root, mode);
}

/* ---- metrics ---------------------------------------------------------------- */

WEFT_API weft_status weft_metrics_average(weft_comm *comm, double *values, double *counts, int n) {
  static const char call[] = "weft_metrics_average";
  WEFT_CHECK(comm_check(comm, call));
  weft_status local = WEFT_OK;
  if (n < 0)
    local = weft_api_error(comm, WEFT_ERR_INVALID, call, "n is %d", n);
  else if (n > 0 && !values)
    local = weft_api_error(comm, WEFT_ERR_INVALID, call, "values is NULL, n %d", n);
  for (int i = 0; i < n && !local && counts; i++)
    if (!(counts[i] >= 0) || isinf(counts[i]))
      local = weft_api_error(comm, WEFT_ERR_INVALID, call,
                             "counts[%d] is %g (must be finite and >= 0)", i, counts[i]);
  /* agree on n first (one small allgather): a sum of differently sized
   * buffers would fail differently on different ranks */
  agree_spec s = {.call = call,
                  .noun = "metric",
                  .local_error = local != 0,
                  .nfields = 1,
                  .field_name = {"the number of metrics"},
                  .field = {(uint64_t)n}};
  weft_status st = agree(comm, &s);
  if (local) return local;
  if (st) return st;
  /* [value*count..., count...]: one sum does it all */
  double *buf = calloc(2 * (size_t)n + 1, sizeof *buf);
  if (!buf) return weft_api_error(comm, WEFT_ERR_NOMEM, call, "no memory");
  for (int i = 0; i < n; i++) {
    double c = counts ? counts[i] : 1.0;
    buf[i] = c ? values[i] * c : 0.0; /* a zero weight drops even a NaN value */
    buf[n + i] = c;
  }
  st = weft_allreduce(comm, buf, buf, 2 * (size_t)n, WEFT_F64, WEFT_SUM);
  if (st) {
    free(buf);
    return wrap_error(comm, st, call, "summing the metrics");
  }
  for (int i = 0; i < n; i++) {
    values[i] = buf[n + i] > 0 ? buf[i] / buf[n + i] : NAN;
    if (counts) counts[i] = buf[n + i];
  }
  free(buf);
  return WEFT_OK;
}

/* ---- the gradient set: creation and registration --------------------------- */

WEFT_API void weft_grad_options_init(weft_grad_options *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->version = WEFT_GRAD_OPTIONS_VERSION;
  opts->bucket_cap_bytes = 25u << 20;
  opts->first_bucket_cap_bytes = 1u << 20;
  opts->inplace_min_bytes = 1u << 20;
  opts->op = WEFT_AVG;
  opts->bcast_period = 0;
  opts->bcast_root = 0;
  opts->wire_dtype = -1;
}

static weft_status check_options(weft_comm *comm, const weft_grad_options *o) {
  static const char call[] = "weft_grad_create";
  if (o->version != WEFT_GRAD_OPTIONS_VERSION)
    return weft_api_error(comm, WEFT_ERR_INVALID, call,
                          "options version %u, this library has %u (call weft_grad_options_init)",
                          o->version, WEFT_GRAD_OPTIONS_VERSION);
  if (!o->bucket_cap_bytes)
    return weft_api_error(comm, WEFT_ERR_INVALID, call, "bucket_cap_bytes is 0");
  if (o->op != WEFT_AVG && o->op != WEFT_SUM)
    return weft_api_error(comm, WEFT_ERR_INVALID, call, "op %s (%d): gradients take avg or sum",
                          weft_op_name(o->op), (int)o->op);
  if (!(o->prediv >= 0) || isinf(o->prediv))
    return weft_api_error(comm, WEFT_ERR_INVALID, call, "prediv %g is not finite and >= 0",
                          o->prediv);
  if (o->bcast_period < -1)
    return weft_api_error(comm, WEFT_ERR_INVALID, call, "bcast_period %d (-1, 0 or > 0)",
                          o->bcast_period);
  if (o->wire_dtype != -1 && o->wire_dtype != WEFT_F32 && o->wire_dtype != WEFT_BF16 &&
      o->wire_dtype != WEFT_F16)
    return weft_api_error(comm, WEFT_ERR_INVALID, call,
                          "wire_dtype %d: -1 (the communicator's), WEFT_F32, WEFT_BF16 or WEFT_F16",
                          o->wire_dtype);
  if (o->bcast_root < 0 || o->bcast_root >= weft_comm_size(comm))
    return weft_api_error(comm, WEFT_ERR_INVALID, call, "bcast_root %d is out of range (size %d)",
                          o->bcast_root, weft_comm_size(comm));
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_create(weft_comm *comm, const weft_grad_options *opts,
                                      weft_grad **grad) {
  static const char call[] = "weft_grad_create";
  WEFT_CHECK(comm_check(comm, call));
  if (!grad) return weft_api_error(comm, WEFT_ERR_INVALID, call, "grad is NULL");
  *grad = NULL;
  weft_grad_options defaults;
  weft_grad_options_init(&defaults);
  if (!opts) opts = &defaults;
  WEFT_CHECK(check_options(comm, opts));
  weft_grad *g = calloc(1, sizeof *g);
  if (!g) return weft_api_error(comm, WEFT_ERR_NOMEM, call, "no memory");
  g->magic = GRAD_MAGIC;
  g->comm = comm;
  g->opts = *opts;
  if (!g->opts.first_bucket_cap_bytes) g->opts.first_bucket_cap_bytes = g->opts.bucket_cap_bytes;
  g->check_every_step = opts->check_every_step || weft_settings()->grad_check;
  g->sync = 1;
  *grad = g;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_register(weft_grad *g, const weft_tensor *t, int *index) {
  static const char call[] = "weft_grad_register";
  if (!grad_ok(g)) return bad_handle(call);
  if (index) *index = -1;
  if (g->finalized)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d registered after weft_grad_finalize", g->ntensors);
  if (!t) return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "tensor is NULL");
  if (g->order)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d registered after weft_grad_set_order (set the order last)",
                          g->ntensors);
  char why[128];
  if (tensor_invalid(t, !g->opts.owned_storage, why, sizeof why))
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "tensor %d: %s", g->ntensors, why);
  if (t->memory != WEFT_MEMORY_HOST && t->memory != WEFT_MEMORY_DEVICE)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d: %s memory: a gradient set takes host or device tensors", g->ntensors,
                          memory_name(t->memory));
  const char *why_not = NULL;
  if (t->memory == WEFT_MEMORY_DEVICE && !weft_memory_usable(WEFT_MEMORY_DEVICE, &why_not))
    return weft_api_error(g->comm, WEFT_ERR_UNSUPPORTED, call, "tensor %d: device memory: %s", g->ntensors,
                          why_not);
  /* one kind per set: its buckets, its stream order and its copies are all of one kind */
  if (g->ntensors && t->memory != g->regs[0].memory)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d is %s memory but tensor 0 is %s memory: a gradient set holds one "
                          "memory kind (make one set per kind)",
                          g->ntensors, memory_name(t->memory), memory_name(g->regs[0].memory));
  if (g->ntensors == g->cap_tensors) {
    int cap = g->cap_tensors ? 2 * g->cap_tensors : 64;
    weft_tensor *regs = realloc(g->regs, sizeof *regs * (size_t)cap);
    if (!regs) return weft_api_error(g->comm, WEFT_ERR_NOMEM, call, "no memory");
    g->regs = regs;
    g->cap_tensors = cap;
  }
  g->regs[g->ntensors] = *t;
  if (g->opts.owned_storage) g->regs[g->ntensors].ptr = NULL;
  if (index) *index = g->ntensors;
  g->ntensors++;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_set_order(weft_grad *g, const int *order, int n) {
  static const char call[] = "weft_grad_set_order";
  if (!grad_ok(g)) return bad_handle(call);
  if (g->finalized)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "called after weft_grad_finalize");
  if (n != g->ntensors || (n && !order))
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "the order has %d entries, %d tensors are registered", n, g->ntensors);
  char *seen = calloc((size_t)n + 1, 1);
  int *copy = malloc(sizeof(int) * ((size_t)n + 1));
  if (!seen || !copy) {
    free(seen);
    free(copy);
    return weft_api_error(g->comm, WEFT_ERR_NOMEM, call, "no memory");
  }
  for (int i = 0; i < n; i++) {
    if (order[i] < 0 || order[i] >= n || seen[order[i]]) {
      weft_status st =
          weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                         "order[%d] = %d: not a permutation of 0..%d", i, order[i], n - 1);
      free(seen);
      free(copy);
      return st;
    }
    seen[order[i]] = 1;
    copy[i] = order[i];
  }
  free(seen);
  free(g->order);
  g->order = copy;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_set_params(weft_grad *g, const weft_tensor *params, int n) {
  static const char call[] = "weft_grad_set_params";
  if (!grad_ok(g)) return bad_handle(call);
  if (g->finalized)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "called after weft_grad_finalize");
  if (n < 0 || (n && !params))
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "params %p, n %d", (void *)params, n);
  weft_tensor *copy = malloc(sizeof *copy * ((size_t)n + 1));
  if (!copy) return weft_api_error(g->comm, WEFT_ERR_NOMEM, call, "no memory");
  if (n) memcpy(copy, params, sizeof *copy * (size_t)n);
  free(g->params);
  g->params = copy;
  g->nparams = n;
  return WEFT_OK;
}

/* ---- bucket formation -------------------------------------------------------- */

static size_t align_up(size_t bytes) {
  return (bytes + GRAD_ALIGN - 1) / GRAD_ALIGN * GRAD_ALIGN;
}

/* DDP's assignment with a strict cap: walk the fill order; each (dtype,
 * memory) key has one open bucket; a tensor that does not fit closes it and
 * opens the next; the first bucket of a key has the smaller cap. In copy
 * mode a tensor of inplace_min_bytes or more gets a bucket of its own.
 * Buckets are numbered as they open, i.e. by when their first gradient is
 * expected. */
static weft_status form_buckets(weft_grad *g) {
  int n = g->ntensors;
  g->bucket_of = malloc(sizeof(int) * ((size_t)n + 1));
  g->offset_of = malloc(sizeof(size_t) * ((size_t)n + 1));
  g->ready_stamp = calloc((size_t)n + 1, sizeof(uint64_t));
  g->buckets = calloc((size_t)n + 1, sizeof *g->buckets);
  if (!g->bucket_of || !g->offset_of || !g->ready_stamp || !g->buckets) return WEFT_ERR_NOMEM;
  int open[WEFT_DTYPE_COUNT][WEFT_MEMORY_COUNT];
  size_t used[WEFT_DTYPE_COUNT][WEFT_MEMORY_COUNT] = {{0}};
  size_t open_cap[WEFT_DTYPE_COUNT][WEFT_MEMORY_COUNT] = {{0}};
  int formed[WEFT_DTYPE_COUNT][WEFT_MEMORY_COUNT] = {{0}};
  for (int d = 0; d < WEFT_DTYPE_COUNT; d++)
    for (int m = 0; m < WEFT_MEMORY_COUNT; m++) open[d][m] = -1;
  for (int k = 0; k < n; k++) {
    int i = g->order ? g->order[k] : n - 1 - k;
    const weft_tensor *t = &g->regs[i];
    size_t esz = weft_dtype_size(t->dtype), bytes = t->count * esz;
    int *b = &open[t->dtype][t->memory];
    if (!g->opts.owned_storage && g->opts.inplace_min_bytes && bytes >= g->opts.inplace_min_bytes) {
      /* large: reduced where it lies; the open bucket closes so that buckets
       * keep backward's order (a later-filling bucket never holds it up) */
      *b = -1;
      grad_bucket *nb = &g->buckets[g->nbuckets];
      nb->dtype = t->dtype;
      nb->memory = t->memory;
      nb->members = malloc(sizeof(int));
      if (!nb->members) return WEFT_ERR_NOMEM;
      nb->members[nb->nmembers++] = i;
      nb->count = t->count;
      g->bucket_of[i] = g->nbuckets++;
      g->offset_of[i] = 0;
      continue;
    }
    size_t *u = &used[t->dtype][t->memory], *cap = &open_cap[t->dtype][t->memory];
    if (*b >= 0 && *u + bytes > *cap) *b = -1;
    if (*b < 0) {
      *b = g->nbuckets++;
      *cap =
          formed[t->dtype][t->memory]++ ? g->opts.bucket_cap_bytes : g->opts.first_bucket_cap_bytes;
      grad_bucket *nb = &g->buckets[*b];
      nb->dtype = t->dtype;
      nb->memory = t->memory;
      nb->members = malloc(sizeof(int) * ((size_t)n + 1));
      if (!nb->members) return WEFT_ERR_NOMEM;
      *u = 0;
    }
    grad_bucket *bk = &g->buckets[*b];
    g->bucket_of[i] = *b;
    g->offset_of[i] = *u / esz;
    bk->members[bk->nmembers++] = i;
    bk->count = *u / esz + t->count;
    *u += align_up(bytes);
    if (*u >= *cap) *b = -1; /* full (or one tensor over the cap): nothing more joins */
  }
  return WEFT_OK;
}

/* Owned storage or staging buffers, and each bucket's memory table. */
static weft_status place_buckets(weft_grad *g) {
  for (int b = 0; b < g->nbuckets; b++) {
    grad_bucket *bk = &g->buckets[b];
    const weft_tensor *first = &g->regs[bk->members[0]];
    bk->mem = g->opts.owned_storage ? weft_api_mem_of(NULL, first->memory) : mem_of(first);
    if (!bk->mem) return WEFT_ERR_UNSUPPORTED;
    bk->pending = bk->nmembers;
    bk->staged = !g->opts.owned_storage && bk->nmembers > 1;
    if (!g->opts.owned_storage && !bk->staged) {
      bk->flat = first->ptr; /* one tensor: reduced where it lies, no copy */
      continue;
    }
    size_t bytes = bk->count * weft_dtype_size(bk->dtype);
    /* All ranks on one host: shareable memory, so every rank's bucket can
     * be reduced in one pass straight through the others' (weft_mem_alloc).
     * Ordinary memory if the kernel will not give it: the ring still works. */
    bk->shared = weft_api_mem_is_host(bk->mem) && weft_api_one_host(g->comm) && bytes > 0 &&
                 weft_mem_alloc(bytes, &bk->flat) == WEFT_OK;
    if (!bk->shared) bk->flat = weft_api_mem_alloc(bk->mem, bytes);
    if (!bk->flat) return WEFT_ERR_NOMEM;
    bk->owned = 1;
    if (g->opts.owned_storage)
      for (int k = 0; k < bk->nmembers; k++) {
        int i = bk->members[k];
        g->regs[i].ptr = (char *)bk->flat + g->offset_of[i] * weft_dtype_size(bk->dtype);
      }
    if (bk->staged && !weft_api_mem_is_host(bk->mem)) {
      /* device copy mode: one kernel packs every member, one unpacks */
      weft_api_piece *pc = malloc(sizeof *pc * (size_t)bk->nmembers);
      if (!pc) return WEFT_ERR_NOMEM;
      for (int k = 0; k < bk->nmembers; k++) {
        int i = bk->members[k];
        pc[k] = (weft_api_piece){g->regs[i].ptr, g->offset_of[i], g->regs[i].count};
        if (g->regs[i].count > bk->most) bk->most = g->regs[i].count;
      }
      bk->pieces = weft_api_pieces_create(bk->mem, bk->flat, pc, bk->nmembers);
      free(pc);
      if (!bk->pieces) return WEFT_ERR_NOMEM;
    }
  }
  if (g->device) {
    g->mem = g->buckets[0].mem;
    if (weft_api_mark_create(g->comm, "weft_grad_finalize", g->mem, g->buckets[0].flat, &g->drained))
      return WEFT_ERR_SYSTEM;
  }
  return WEFT_OK;
}

static uint64_t order_hash(const weft_grad *g) {
  uint64_t h = 1469598103934665603ULL;
  for (int k = 0; g->order && k < g->ntensors; k++) h = fnv_u64(h, (uint64_t)g->order[k]);
  return h;
}

static void grad_fill_spec(const weft_grad *g, agree_spec *s, const char *call) {
  *s = (agree_spec){.call = call, .noun = "tensor", .list = g->regs, .n = g->ntensors};
  const weft_grad_options *o = &g->opts;
  const char *names[] = {"bucket_cap_bytes",
                         "first_bucket_cap_bytes",
                         "inplace_min_bytes",
                         "op",
                         "prediv (bits)",
                         "owned_storage",
                         "check_every_step",
                         "bcast_period",
                         "bcast_root",
                         "fill order",
                         "number of parameters (weft_grad_set_params)",
                         "wire_dtype"};
  uint64_t vals[] = {o->bucket_cap_bytes,
                     o->first_bucket_cap_bytes,
                     o->owned_storage ? 0 : o->inplace_min_bytes,
                     (uint64_t)o->op,
                     double_bits(o->prediv > 1 ? o->prediv : 1),
                     (uint64_t)(o->owned_storage != 0),
                     (uint64_t)g->check_every_step,
                     (uint64_t)(int64_t)o->bcast_period,
                     (uint64_t)o->bcast_root,
                     order_hash(g),
                     (uint64_t)g->nparams,
                     (uint64_t)(int64_t)o->wire_dtype};
  s->nfields = (int)(sizeof vals / sizeof vals[0]);
  for (int i = 0; i < s->nfields; i++) {
    s->field_name[i] = names[i];
    s->field[i] = vals[i];
  }
}

/* The stream a device set's work is queued on. */
static void *set_stream(const weft_grad *g) {
  return g->stream_named ? g->stream : weft_api_comm_stream(g->comm);
}

/* The device work a set queued that may still read its buckets and piece
 * tables: the unpacks the last weft_grad_wait_stream queued on the
 * program's stream, and the packs on the set's stream (a bucket whose call
 * then failed to start has its pack still queued). True once both are done,
 * within the communicator's timeout; false (the memory must stay) when not. */
static bool device_idle(weft_grad *g) {
  static const char call[] = "weft_grad_destroy";
  if (!g->mem || !g->drained) return true;
  if (g->unpacks_on_stream &&
      weft_api_mark_wait(g->comm, call, "the last step's unpack kernels", g->mem, g->drained))
    return false;
  g->unpacks_on_stream = 0;
  return !weft_api_mark_record(g->comm, call, g->mem, g->drained, set_stream(g)) &&
         !weft_api_mark_wait(g->comm, call, "the work queued on the set's stream", g->mem, g->drained);
}

/* A set that failed keeps its device buckets allocated: a peer whose call
 * failed part-way may still have one open over CUDA IPC (its context may be
 * unable to close it after a kernel fault), and freeing memory another
 * process has open is undefined. So does a set whose queued kernels did not
 * finish (they read the buckets and the piece tables). They go with the
 * process. */
static void free_buckets(weft_grad *g) {
  int kept = 0;
  bool idle = !g->device || device_idle(g);
  for (int b = 0; g->buckets && b < g->nbuckets; b++) {
    grad_bucket *bk = &g->buckets[b];
    if (bk->req) weft_wait(&bk->req);
    if (idle) weft_api_pieces_destroy(bk->mem, bk->pieces);
    if (bk->owned && bk->shared)
      weft_mem_free(bk->flat);
    else if (bk->owned && bk->mem && g->device && (g->broken || !idle))
      kept++;
    else if (bk->owned && bk->mem)
      weft_api_mem_release(bk->mem, bk->flat);
    free(bk->members);
  }
  /* an event may go while work it was recorded after is pending (CUDA
   * releases it once that completes) */
  if (g->mem) weft_api_mark_destroy(g->mem, g->drained);
  g->drained = NULL;
  g->mem = NULL;
  if (kept)
    WEFT_INFO(WEFT_SUBSYS_GRAD,
              "%d device buckets of a set that %s stay allocated until the process ends", kept,
              idle ? "failed (a peer may still map them)" : "has kernels still queued");
  free(g->buckets);
  free(g->bucket_of);
  free(g->offset_of);
  free(g->ready_stamp);
  g->buckets = NULL;
  g->bucket_of = NULL;
  g->offset_of = NULL;
  g->ready_stamp = NULL;
  g->nbuckets = 0;
}

WEFT_API weft_status weft_grad_finalize(weft_grad *g) {
  static const char call[] = "weft_grad_finalize";
  if (!grad_ok(g)) return bad_handle(call);
  if (g->finalized)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "the set is already finalized");
  g->device = g->ntensors && g->regs[0].memory == WEFT_MEMORY_DEVICE;
  weft_status local = form_buckets(g);
  if (!local) local = place_buckets(g);
  if (local)
    weft_api_error(g->comm, local, call, "forming %d buckets of %d tensors failed", g->nbuckets,
                   g->ntensors);
  agree_spec s;
  grad_fill_spec(g, &s, call);
  s.local_error = local != 0;
  weft_status st = agree(g->comm, &s);
  if (local || st) {
    free_buckets(g);
    if (g->opts.owned_storage)
      for (int i = 0; i < g->ntensors; i++) g->regs[i].ptr = NULL;
    return local ? local : st;
  }
  g->finalized = 1;
  WEFT_INFO(WEFT_SUBSYS_GRAD, "%d tensors in %d buckets (cap %zu, first %zu, %s%s)", g->ntensors,
            g->nbuckets, g->opts.bucket_cap_bytes, g->opts.first_bucket_cap_bytes,
            g->opts.owned_storage ? "owned storage" : "copies",
            g->check_every_step ? ", checked every step" : "");
  if (g->nparams && g->opts.bcast_period >= 0) {
    st = weft_params_broadcast(g->comm, g->params, g->nparams, g->opts.bcast_root);
    if (st) return g->broken = st;
    g->stats.params_broadcasts++;
  }
  return WEFT_OK;
}

/* ---- a step ------------------------------------------------------------------ */

static weft_status step_begin(weft_grad *g, const char *call) {
  if (g->step_checked) return WEFT_OK;
  g->step_checked = 1;
  if (!g->check_every_step) return WEFT_OK;
  agree_spec s = {.call = "weft_grad step check",
                  .noun = "tensor",
                  .list = g->regs,
                  .n = g->ntensors,
                  .nfields = 2,
                  .field_name = {"the step number", "synchronisation on (weft_grad_set_sync)"},
                  .field = {g->step, (uint64_t)g->sync}};
  weft_status st = agree(g->comm, &s);
  if (st) {
    g->broken = st;
    return wrap_error(g->comm, st, call, "the per-step check");
  }
  return WEFT_OK;
}

/* "bucket 3 of 7 (4096 f32 elements, 5 tensors from tensor 12) in step 9" */
static void bucket_words(const weft_grad *g, int b, uint64_t step, char *buf, size_t len) {
  const grad_bucket *bk = &g->buckets[b];
  snprintf(buf, len, "bucket %d of %d (%zu %s elements, %d tensors from tensor %d) in step %llu", b,
           g->nbuckets, bk->count, weft_dtype_name(bk->dtype), bk->nmembers, bk->members[0],
           (unsigned long long)step);
}

/* Frees bucket b's request of an earlier step (one weft_grad_wait_stream
 * ended without the host waiting): its result was linked into a stream, so
 * it is over on the GPU once that stream passed it; the host hears how it
 * ended here, at the latest when the bucket leaves again. */
static weft_status reap(weft_grad *g, int b, const char *call) {
  grad_bucket *bk = &g->buckets[b];
  if (!bk->req) return WEFT_OK;
  uint64_t step = bk->req_step;
  weft_status st = weft_wait(&bk->req);
  if (!st) return WEFT_OK;
  char ctx[220];
  bucket_words(g, b, step, ctx, sizeof ctx);
  g->broken = st;
  return wrap_error(g->comm, st, call, ctx);
}

static weft_status launch(weft_grad *g, int b, const char *call) {
  grad_bucket *bk = &g->buckets[b];
  weft_op op = g->opts.op;
  size_t bytes = bk->count * weft_dtype_size(bk->dtype);
  WEFT_CHECK(reap(g, b, call));
  double pre = g->opts.prediv > 1 ? 1.0 / g->opts.prediv : 1.0;
  if (pre != 1.0) op = WEFT_SUM;
  weft_api_bucket_stream on = {set_stream(g), 0};
  weft_status st = WEFT_OK;
  char ctx[220];
  bucket_words(g, b, g->step, ctx, sizeof ctx);
  if (g->device) {
    /* stream order: after the kernels that made the gradients, queued
     * before the last ready (and, weft.h's rule, after the work of the
     * stream the last weft_grad_wait_stream linked: its unpacks) */
    if (bk->staged) {
      st = weft_api_pieces_move(g->comm, call, ctx, bk->mem, bk->flat, bk->pieces, bk->nmembers,
                                bk->most, bk->dtype, pre, true, on.stream);
      for (int k = 0; k < bk->nmembers; k++)
        g->stats.bytes_copied += g->regs[bk->members[k]].count * weft_dtype_size(bk->dtype);
    } else if (pre != 1.0) {
      st = weft_api_scale_on(g->comm, call, ctx, bk->mem, bk->flat, bk->count, bk->dtype, pre, on.stream);
    }
    if (st) return g->broken = st;
    if (pre != 1.0) g->stats.bytes_scaled += bytes;
  } else if (pre != 1.0) {
    weft_api_mem_scale(bk->mem, bk->flat, bk->count, bk->dtype, pre);
    g->stats.bytes_scaled += bytes;
  }
  bk->launched = 1;
  WEFT_TRACE(WEFT_SUBSYS_GRAD, "step %llu: bucket %d launched (%zu %s)",
             (unsigned long long)g->step, b, bk->count, weft_dtype_name(bk->dtype));
  /* a device set's bucket is ordered after the set's stream without making
   * that stream wait for it: the backward kernels queued after it go on */
  st = weft_api_ibucket_allreduce(g->comm, bk->flat, bk->flat, bk->count, bk->dtype, op,
                                  g->opts.wire_dtype, g->step, g->device ? &on : NULL, &bk->req);
  bk->signal = on.signal;
  bk->req_step = g->step;
  g->stats.buckets_launched++;
  g->stats.bytes_reduced += bytes;
  if (st) {
    char launching[260];
    snprintf(launching, sizeof launching, "launching %s", ctx);
    g->broken = st;
    return wrap_error(g->comm, st, call, launching);
  }
  return WEFT_OK;
}

/* Buckets leave strictly in index order: a full bucket waits for the ones
 * before it, so every rank issues the same sequence of allreduces. */
static weft_status launch_in_order(weft_grad *g, const char *call) {
  while (g->next_launch < g->nbuckets && g->buckets[g->next_launch].pending == 0)
    WEFT_CHECK(launch(g, g->next_launch++, call));
  return WEFT_OK;
}

/* A host set's copy into its bucket, at ready; a device set packs the whole
 * bucket with one kernel as it launches. */
static void copy_in(weft_grad *g, int i) {
  grad_bucket *bk = &g->buckets[g->bucket_of[i]];
  if (!bk->staged || g->device) return;
  size_t esz = weft_dtype_size(bk->dtype), bytes = g->regs[i].count * esz;
  weft_api_mem_copy(bk->mem, (char *)bk->flat + g->offset_of[i] * esz, g->regs[i].ptr, bytes);
  g->stats.bytes_copied += bytes;
}

static weft_status usable(weft_grad *g, const char *call) {
  if (!grad_ok(g)) return bad_handle(call);
  if (!g->finalized)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "the set is not finalized (call weft_grad_finalize first)");
  if (g->broken)
    return weft_api_error(g->comm, g->broken, call,
                          "the gradient set failed earlier (%s); destroy it",
                          weft_status_name(g->broken));
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_ready(weft_grad *g, int index) {
  static const char call[] = "weft_grad_ready";
  WEFT_CHECK(usable(g, call));
  if (index < 0 || index >= g->ntensors)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d is out of range (%d registered)", index, g->ntensors);
  if (g->ready_stamp[index] == g->step + 1)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d was already marked ready in step %llu", index,
                          (unsigned long long)g->step);
  WEFT_CHECK(step_begin(g, call));
  g->in_step = 1;
  g->ready_stamp[index] = g->step + 1;
  if (!g->sync) return WEFT_OK;
  copy_in(g, index);
  grad_bucket *bk = &g->buckets[g->bucket_of[index]];
  if (--bk->pending == 0) return launch_in_order(g, call);
  return WEFT_OK;
}

static void step_reset(weft_grad *g) {
  for (int b = 0; b < g->nbuckets; b++) {
    g->buckets[b].pending = g->buckets[b].nmembers;
    g->buckets[b].launched = 0;
  }
  g->next_launch = 0;
  g->in_step = 0;
  g->step_checked = 0;
  g->step++;
}

/* The factor a bucket's result is multiplied by after its allreduce: the
 * pre-division undone (avg: and the mean taken). 1: none. */
static double post_factor(const weft_grad *g) {
  if (!(g->opts.prediv > 1)) return 1.0;
  return g->opts.op == WEFT_AVG ? g->opts.prediv / weft_comm_size(g->comm) : g->opts.prediv;
}

/* After a bucket's allreduce: undo the pre-division, hand results back. A
 * device set queues both on `stream` as one kernel per bucket (the unpack
 * with the factor fused in, or the scaling of a bucket that is reduced
 * where it lies); a host set does them now. */
static weft_status bucket_finish(weft_grad *g, int b, void *stream, const char *call) {
  grad_bucket *bk = &g->buckets[b];
  size_t esz = weft_dtype_size(bk->dtype);
  double post = post_factor(g);
  if (g->device) {
    char ctx[220];
    bucket_words(g, b, g->step, ctx, sizeof ctx);
    weft_status st = WEFT_OK;
    if (bk->staged)
      st = weft_api_pieces_move(g->comm, call, ctx, bk->mem, bk->flat, bk->pieces, bk->nmembers, bk->most,
                                bk->dtype, post, false, stream);
    else if (post != 1.0)
      st = weft_api_scale_on(g->comm, call, ctx, bk->mem, bk->flat, bk->count, bk->dtype, post, stream);
    if (st) return g->broken = st;
    if (post != 1.0) g->stats.bytes_scaled += bk->count * esz;
    for (int k = 0; bk->staged && k < bk->nmembers; k++)
      g->stats.bytes_copied += g->regs[bk->members[k]].count * esz;
    return WEFT_OK;
  }
  if (post != 1.0) {
    weft_api_mem_scale(bk->mem, bk->flat, bk->count, bk->dtype, post);
    g->stats.bytes_scaled += bk->count * esz;
  }
  if (!bk->staged) return WEFT_OK;
  for (int k = 0; k < bk->nmembers; k++) {
    int i = bk->members[k];
    size_t bytes = g->regs[i].count * esz;
    weft_api_mem_copy(bk->mem, g->regs[i].ptr, (char *)bk->flat + g->offset_of[i] * esz, bytes);
    g->stats.bytes_copied += bytes;
  }
  return WEFT_OK;
}

/* Launches what the step has not: tensors never marked ready go in as they
 * are. */
static weft_status flush(weft_grad *g, const char *call) {
  weft_status st = WEFT_OK;
  for (int b = g->next_launch; b < g->nbuckets && !st; b++) {
    grad_bucket *bk = &g->buckets[b];
    for (int k = 0; k < bk->nmembers && bk->pending; k++) {
      int i = bk->members[k];
      if (g->ready_stamp[i] == g->step + 1) continue;
      copy_in(g, i);
      bk->pending--;
    }
    st = launch_in_order(g, call);
  }
  return st;
}

/* The end of a step that reduced (or did not): counters, and the parameter
 * broadcast every bcast_period synchronised steps. */
static weft_status step_end(weft_grad *g, int synced) {
  g->stats.steps++;
  if (!synced) return WEFT_OK;
  g->stats.synced_steps++;
  if (g->nparams && g->opts.bcast_period > 0 &&
      g->stats.synced_steps % (uint64_t)g->opts.bcast_period == 0) {
    weft_status st = weft_params_broadcast(g->comm, g->params, g->nparams, g->opts.bcast_root);
    if (st) return g->broken = st;
    g->stats.params_broadcasts++;
  }
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_wait(weft_grad *g) {
  static const char call[] = "weft_grad_wait";
  weft_status st = usable(g, call);
  if (st) {
    /* never leave requests behind, even on a set that failed */
    for (int b = 0; grad_ok(g) && g->finalized && b < g->nbuckets; b++)
      if (g->buckets[b].req) weft_wait(&g->buckets[b].req);
    return st;
  }
  st = step_begin(g, call);
  if (!st && g->sync) st = flush(g, call);
  int failed_bucket = -1, finished = 0;
  weft_status first = WEFT_OK;
  for (int b = 0; b < g->nbuckets; b++) {
    grad_bucket *bk = &g->buckets[b];
    if (!bk->launched) continue;
    weft_status s = weft_wait(&bk->req);
    if (s && !first) {
      first = s;
      failed_bucket = b;
    }
    if (!s && !first && !st) {
      st = bucket_finish(g, b, set_stream(g), call);
      finished++;
    }
  }
  if (first && !st) {
    char ctx[220];
    bucket_words(g, failed_bucket, g->step, ctx, sizeof ctx);
    st = g->broken = wrap_error(g->comm, first, call, ctx);
  }
  /* a device set's unpacks and scalings were queued on its stream: the
   * host form returns once they are done, so the gradients may be read
   * from any stream or copied to the host */
  if (!st && g->device && finished && (post_factor(g) != 1.0 || !g->opts.owned_storage)) {
    st = weft_api_mark_record(g->comm, call, g->mem, g->drained, set_stream(g));
    char what[160];
    snprintf(what, sizeof what, "the unpack and scaling kernels of buckets 0 to %d (of %d) in step %llu",
             g->nbuckets - 1, g->nbuckets, (unsigned long long)g->step);
    if (!st) st = weft_api_mark_wait(g->comm, call, what, g->mem, g->drained);
    if (st) g->broken = st;
  }
  int synced = g->sync;
  step_reset(g);
  if (st) return st;
  return step_end(g, synced);
}

WEFT_API weft_status weft_grad_wait_stream(weft_grad *g, void *stream) {
  static const char call[] = "weft_grad_wait_stream";
  if (grad_ok(g) && g->finalized && !g->device) return weft_grad_wait(g); /* host memory has no stream */
  WEFT_CHECK(usable(g, call));
  weft_status st = step_begin(g, call);
  if (!st && g->sync) st = flush(g, call);
  /* the buckets' signals are written in issue order: waiting for the last
   * launched covers them all */
  uint32_t last = 0;
  for (int b = 0; b < g->nbuckets; b++)
    if (g->buckets[b].launched && g->buckets[b].signal) last = g->buckets[b].signal;
  if (!st && last) st = weft_api_stream_after_buckets(g->comm, stream, last);
  for (int b = 0; b < g->nbuckets && !st; b++)
    if (g->buckets[b].launched) st = bucket_finish(g, b, stream, call);
  if (!st && g->sync) {
    st = weft_api_mark_record(g->comm, call, g->mem, g->drained, stream);
    g->unpacks_on_stream = !st;
  }
  if (st) g->broken = st;
  int synced = g->sync;
  step_reset(g);
  if (st) return st;
  return step_end(g, synced);
}

WEFT_API weft_status weft_grad_set_stream(weft_grad *g, void *stream) {
  static const char call[] = "weft_grad_set_stream";
  if (!grad_ok(g)) return bad_handle(call);
  if (g->in_step)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "called in the middle of step %llu (between steps only)",
                          (unsigned long long)g->step);
  g->stream = stream;
  g->stream_named = 1;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_bucket_test(weft_grad *g, int bucket, int *done) {
  static const char call[] = "weft_grad_bucket_test";
  if (done) *done = 0;
  WEFT_CHECK(usable(g, call));
  if (!done || bucket < 0 || bucket >= g->nbuckets)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "bucket %d (%d buckets), done %p", bucket,
                          g->nbuckets, (void *)done);
  grad_bucket *bk = &g->buckets[bucket];
  if (!bk->launched) return WEFT_OK;
  if (!bk->req) {
    *done = 1;
    return WEFT_OK;
  }
  weft_status st = weft_test(&bk->req, done);
  if (!st) return WEFT_OK;
  char ctx[220];
  bucket_words(g, bucket, g->step, ctx, sizeof ctx);
  g->broken = st;
  return wrap_error(g->comm, st, call, ctx);
}

WEFT_API weft_status weft_grad_set_sync(weft_grad *g, int sync) {
  static const char call[] = "weft_grad_set_sync";
  if (!grad_ok(g)) return bad_handle(call);
  if (g->in_step)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "called in the middle of step %llu (between steps only)",
                          (unsigned long long)g->step);
  g->sync = sync != 0;
  return WEFT_OK;
}

/* ---- queries and the end ------------------------------------------------------- */

WEFT_API weft_status weft_grad_tensor_ptr(const weft_grad *g, int index, void **ptr) {
  static const char call[] = "weft_grad_tensor_ptr";
  if (!grad_ok(g)) return bad_handle(call);
  if (!ptr) return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "ptr is NULL");
  *ptr = NULL;
  if (!g->finalized || !g->opts.owned_storage)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call, "%s",
                          !g->finalized ? "the set is not finalized yet"
                                        : "the set does not own its storage (owned_storage 0)");
  if (index < 0 || index >= g->ntensors)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d is out of range (%d registered)", index, g->ntensors);
  *ptr = g->regs[index].ptr;
  return WEFT_OK;
}

WEFT_API int weft_grad_bucket_count(const weft_grad *g) {
  return grad_ok(g) && g->finalized ? g->nbuckets : -1;
}

WEFT_API weft_status weft_grad_bucket_info(const weft_grad *g, int bucket,
                                           weft_grad_bucket_desc *d) {
  static const char call[] = "weft_grad_bucket_info";
  if (!grad_ok(g)) return bad_handle(call);
  if (!d || !g->finalized || bucket < 0 || bucket >= g->nbuckets)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "bucket %d (%d buckets, finalized %d, desc %p)", bucket, g->nbuckets,
                          g->finalized, (void *)d);
  const grad_bucket *bk = &g->buckets[bucket];
  d->dtype = bk->dtype;
  d->memory = bk->memory;
  d->count = bk->count;
  d->bytes = bk->count * weft_dtype_size(bk->dtype);
  d->ntensors = bk->nmembers;
  d->first_tensor = bk->members[0];
  d->state = bk->launched       ? WEFT_GRAD_BUCKET_LAUNCHED
             : bk->pending == 0 ? WEFT_GRAD_BUCKET_FULL
                                : WEFT_GRAD_BUCKET_FILLING;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_tensor_place(const weft_grad *g, int index, int *bucket,
                                            size_t *offset) {
  static const char call[] = "weft_grad_tensor_place";
  if (!grad_ok(g)) return bad_handle(call);
  if (!g->finalized || index < 0 || index >= g->ntensors || !bucket || !offset)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, call,
                          "tensor %d (%d registered, finalized %d)", index, g->ntensors,
                          g->finalized);
  *bucket = g->bucket_of[index];
  *offset = g->offset_of[index];
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_get_stats(const weft_grad *g, weft_grad_stats *stats) {
  if (!grad_ok(g)) return bad_handle("weft_grad_get_stats");
  if (!stats)
    return weft_api_error(g->comm, WEFT_ERR_INVALID, "weft_grad_get_stats", "stats is NULL");
  *stats = g->stats;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_rebind(weft_grad *g, weft_comm *comm) {
  static const char call[] = "weft_grad_rebind";
  if (!grad_ok(g)) return bad_handle(call);
  WEFT_CHECK(comm_check(comm, call));
  if (!g->finalized)
    return weft_api_error(comm, WEFT_ERR_INVALID, call,
                          "the set is not finalized (call weft_grad_finalize first)");
  /* the failed step's requests end with the old communicator's failure */
  for (int b = 0; b < g->nbuckets; b++)
    if (g->buckets[b].req) (void)weft_wait(&g->buckets[b].req);
  if (g->in_step) step_reset(g);
  g->comm = comm;
  g->broken = WEFT_OK;
  return WEFT_OK;
}

WEFT_API weft_status weft_grad_destroy(weft_grad *g) {
  if (!g) return WEFT_OK;
  if (!grad_ok(g)) return bad_handle("weft_grad_destroy");
  free_buckets(g);
  free(g->regs);
  free(g->order);
  free(g->params);
  g->magic = 0;
  free(g);
  return WEFT_OK;
}
