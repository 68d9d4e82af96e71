/* agree.h - a fault-tolerant agreement over the control plane (ctl.h):
 * the ranks that are alive agree on the bitwise or of a flag word, on the
 * set of lost ranks, and on one payload from each survivor (the new
 * addresses of a shrink). Every survivor that returns WEFT_OK returns the
 * same outcome, even when ranks die during the agreement, the coordinator
 * among them.
 *
 * The protocol: the lowest rank not known lost coordinates. Every other
 * rank sends it a proposal (its flags, the ranks it knows lost, its
 * payload). The coordinator dials every rank it waits for, so a dead one
 * shows at once (its listener refuses). Once it holds a proposal from every
 * rank not lost, it decides. Whoever holds a decision (the coordinator, or
 * a rank that received one) sends it to every survivor but itself, waits
 * until their kernels took it, and returns: so a decision that one rank
 * returned has reached every live rank still in the agreement, whatever
 * dies next, and a rank that becomes coordinator after a death adopts it
 * rather than deciding anew (it drains what arrived before it decides). A
 * rank whose coordinator dies sends its proposal to the next one.
 *
 * A rank that another rank reports lost is lost for everyone (the union):
 * a rank the decision counts as lost fails, even if it is alive (a cut
 * link). That costs n*(n-1) small messages per agreement, which is fine to
 * hundreds of ranks; a tree (ULFM's ERA) is the way past that. */
#ifndef WEFT_ELASTIC_AGREE_H
#define WEFT_ELASTIC_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/error_sink.h"
#include "src/elastic/ctl.h"
#include "weft.h"

typedef struct weft_agreement {
  uint32_t flags;        /* the bitwise or over the survivors' flags */
  int size;              /* the communicator's size */
  int nlost;             /* how many of its ranks are lost */
  uint8_t *lost;         /* by rank: 1 when lost */
  const uint8_t **data;  /* by rank: its payload (NULL for a lost one) */
  uint32_t *data_len;    /* by rank */
  int coordinator;       /* who decided (for messages) */
  uint8_t *decision;     /* the bytes it is parsed from */
} weft_agreement;

/* Agreement number `epoch` (every survivor counts its agreements on the
 * communicator alike) with this rank's `flags` and `payload`. WEFT_OK with
 * *out filled; WEFT_ERR_TIMEOUT past `deadline`, naming whom it waited for;
 * WEFT_ERR_REVOKED when the decision counts this rank as lost. */
weft_status weft_agree(weft_ctl *ctl, uint32_t epoch, uint32_t flags, const void *payload,
                       size_t len, double deadline, weft_agreement *out, weft_error_sink *err);
void weft_agreement_free(weft_agreement *a);

#endif
