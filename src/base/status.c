/* status.c - names and sentences for every weft_status, generated from the
 * one list in weft.h, and the errno conversion used at the system edge. */
#include <errno.h>

#include "src/base/status.h"

#include <string.h>

const char *weft_strerror(weft_status status) {
  switch (status) {
#define WEFT_STATUS_MSG_(name, value, msg) \
  case WEFT_##name:                        \
    return msg;
    WEFT_STATUS_MAP(WEFT_STATUS_MSG_)
#undef WEFT_STATUS_MSG_
  }
  return "unknown status code";
}

const char *weft_status_name(weft_status status) {
  switch (status) {
#define WEFT_STATUS_NAME_(name, value, msg) \
  case WEFT_##name:                         \
    return "WEFT_" #name;
    WEFT_STATUS_MAP(WEFT_STATUS_NAME_)
#undef WEFT_STATUS_NAME_
  }
  return "WEFT_UNKNOWN_STATUS";
}

weft_status weft_status_from_errno(int err) {
  switch (err) {
    case 0: return WEFT_OK;
    case EAGAIN: return WEFT_AGAIN;
    case ENOMEM: return WEFT_ERR_NOMEM;
    case ECONNRESET: case EPIPE: case ECONNABORTED: case ENOTCONN: case EHOSTUNREACH:
    case ENETUNREACH: case ENETDOWN: case ETIMEDOUT:
      return WEFT_ERR_PEER_LOST;
    case EINVAL: return WEFT_ERR_INVALID;
    default: return WEFT_ERR_SYSTEM;
  }
}

#include <stdarg.h>
#include <stdio.h>

#include "src/base/error_sink.h"

void weft_error_sink_set(weft_error_sink *sink, const char *fmt, ...) {
  if (!sink) return;
  sink->origin[0] = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sink->msg, sizeof sink->msg, fmt, ap);
  va_end(ap);
}

void weft_appendf(char *buf, size_t len, size_t *used, const char *fmt, ...) {
  if (*used >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, len - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = *used + (size_t)n < len ? *used + (size_t)n : len - 1;
}

weft_status weft_status_revoked_or(weft_status st, const char *words) {
  return st == WEFT_ERR_PEER_LOST && words && strstr(words, WEFT_REVOKED_WORDS) ? WEFT_ERR_REVOKED
                                                                               : st;
}
