/* core.c - the sentence a failure leaves on a communicator (core.h): every
 * layer from call setup up writes it here, so the user reads one format. */
#include "src/coll/core.h"

#include <stdarg.h>
#include <stdio.h>

#include "src/base/log.h"
#include "src/base/status.h"

weft_status weft_core_error(weft_core *core, weft_status st, const char *call, const char *fmt,
                            ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(core->fail.last_error, sizeof core->fail.last_error, "weft rank %d/%d %s: %s (%s)",
           core->rank, core->size, call, what, weft_status_name(st));
  WEFT_WARN(WEFT_SUBSYS_COLL, "%s", core->fail.last_error);
  return st;
}
