/* call_tag.h - what every data chunk says about the call it belongs to: its
 * tag. The low 32 bits are the call's number on its communicator (its
 * sequence number, the same on every rank for the same call); the high 32
 * bits are the call's signature: which collective, the dtype, the op, the
 * wire dtype, the root (or a gradient bucket's step) and whether it works on
 * device buffers in place (CUDA IPC). A receiver compares
 * the whole tag with its own call's and fails with WEFT_ERR_MISMATCH naming
 * both calls (weft_chunk_check, error_sink.h), so ranks that disagree on any
 * of these never return OK together, at no cost but four bytes per chunk and
 * no extra message (issue 39). Transports carry the tag whole and compare it
 * whole; only this file knows what its bits mean. */
#ifndef WEFT_CALL_TAG_H
#define WEFT_CALL_TAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft.h"

typedef uint64_t weft_tag;

/* What called: the high 4 bits' meaning. 0 is a point-to-point message or a
 * chunk of a library's own exchange, which carries no signature. */
enum weft_sig_kind {
  WEFT_SIG_NONE = 0,
  WEFT_SIG_BARRIER,
  WEFT_SIG_ALLREDUCE,
  WEFT_SIG_BROADCAST,
  WEFT_SIG_REDUCE,
  WEFT_SIG_ALLGATHER,
  WEFT_SIG_REDUCE_SCATTER,
  WEFT_SIG_GATHER,
  WEFT_SIG_SCATTER,
  WEFT_SIG_ALLTOALL,
  WEFT_SIG_CHECK,       /* WEFT_CHECK's fingerprint exchange: the same on every rank */
  WEFT_SIG_GRAD_BUCKET, /* a gradient set's bucket allreduce; `root` holds its step */
};

/* The signature's fields. Unused fields are zero; dtype, op and wire are
 * stored + 1 so that zero means "none"; root (or step) is kept modulo 2^16,
 * enough to tell any two roots of a communicator up to 65536 ranks apart.
 * in_place_device: the call runs on device buffers where they lie (CUDA
 * IPC, the direct rounds), which a rank decides from its own buffers' kind:
 * a rank passing host memory where the others pass device memory sends
 * other first messages, and the bit names why (issue 37). */
typedef struct weft_call_sig {
  enum weft_sig_kind kind;
  int dtype; /* weft_dtype, or -1 */
  int op;    /* weft_op, or -1 */
  int wire;  /* the wire dtype, or -1 when off */
  uint32_t root;
  bool in_place_device;
} weft_call_sig;

#define WEFT_SIG_ROOT_BITS 16
#define WEFT_SIG_IN_PLACE_DEVICE (1u << 15) /* the in_place_device bit */
#define WEFT_SIG_ROOT_SHIFT 16

static inline uint32_t weft_sig_pack(weft_call_sig s) {
  return ((uint32_t)s.kind & 0xfu) | ((uint32_t)(s.dtype + 1) & 0xfu) << 4 |
         ((uint32_t)(s.op + 1) & 0x7u) << 8 | ((uint32_t)(s.wire + 1) & 0xfu) << 11 |
         (s.in_place_device ? WEFT_SIG_IN_PLACE_DEVICE : 0) |
         (s.root & ((1u << WEFT_SIG_ROOT_BITS) - 1)) << WEFT_SIG_ROOT_SHIFT;
}

static inline weft_call_sig weft_sig_unpack(uint32_t sig) {
  return (weft_call_sig){.kind = (enum weft_sig_kind)(sig & 0xfu),
                         .dtype = (int)(sig >> 4 & 0xfu) - 1,
                         .op = (int)(sig >> 8 & 0x7u) - 1,
                         .wire = (int)(sig >> 11 & 0xfu) - 1,
                         .in_place_device = (sig & WEFT_SIG_IN_PLACE_DEVICE) != 0,
                         .root = sig >> WEFT_SIG_ROOT_SHIFT};
}

/* The signature less a gradient bucket's step: what stays the same when a
 * training loop makes the same call on the same buffers step after step
 * (the direct rounds compare their messages with the last call's). */
static inline uint32_t weft_sig_shape(uint32_t sig) {
  uint32_t below_root = (1u << WEFT_SIG_ROOT_SHIFT) - 1;
  return weft_sig_unpack(sig).kind == WEFT_SIG_GRAD_BUCKET ? sig & below_root : sig;
}

static inline weft_tag weft_tag_make(uint32_t seq, uint32_t sig) {
  return (weft_tag)seq | (weft_tag)sig << 32;
}
static inline uint32_t weft_tag_seq(weft_tag tag) { return (uint32_t)tag; }
static inline uint32_t weft_tag_sig(weft_tag tag) { return (uint32_t)(tag >> 32); }

/* "weft_allreduce(f32, max)", "weft_broadcast(i32, root=1)", "a gradient
 * bucket's allreduce (f32, avg) in step 5": the call a signature stands for. */
void weft_sig_describe(uint32_t sig, char *buf, size_t len);

#endif
