/* harness_recorder.h - what the tests read from a communicator's flight
 * recorder (internal: link weft_internal_dep). */
#ifndef WEFT_TEST_HARNESS_RECORDER_H
#define WEFT_TEST_HARNESS_RECORDER_H

#include "src/comm/comm.h"

/* The algorithm the communicator's last finished call ran, "?" when the
 * recorder is off or empty. */
static inline const char *harness_last_algo(const weft_comm *comm) {
  const weft_recorder *rec = &comm->core.recorder;
  if (!rec->cap || !rec->next) return "?";
  const char *a = rec->ring[(rec->next - 1) % rec->cap].algo;
  return a ? a : "?";
}

#endif
