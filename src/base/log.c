/* log.c - subsystem-filtered logging to stderr. The level and filter are
 * resolved once from the settings, which sit below the log (they never log;
 * a reload tells the log through a listener); a disabled log costs one compare. */
#include "src/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/base/settings.h"

_Atomic int weft_log_level_now = -1;
_Atomic int weft_log_subsys_now = WEFT_SUBSYS_ALL;
static _Thread_local int log_rank = -1;

static const struct {
  const char *name;
  int bit;
} subsys_names[] = {{"INIT", WEFT_SUBSYS_INIT}, {"BOOT", WEFT_SUBSYS_BOOT},
                    {"NET", WEFT_SUBSYS_NET},   {"COLL", WEFT_SUBSYS_COLL},
                    {"GRAD", WEFT_SUBSYS_GRAD},
                    {"ALL", WEFT_SUBSYS_ALL}};

_Static_assert((int)WEFT_DEBUG_NONE == WEFT_LOG_NONE && (int)WEFT_DEBUG_WARN == WEFT_LOG_WARN &&
                   (int)WEFT_DEBUG_INFO == WEFT_LOG_INFO && (int)WEFT_DEBUG_TRACE == WEFT_LOG_TRACE,
               "WEFT_DEBUG's words are the log levels, in order");
_Static_assert(1 << WEFT_DEBUG_SUBSYS_INIT == WEFT_SUBSYS_INIT &&
                   1 << WEFT_DEBUG_SUBSYS_BOOT == WEFT_SUBSYS_BOOT &&
                   1 << WEFT_DEBUG_SUBSYS_NET == WEFT_SUBSYS_NET &&
                   1 << WEFT_DEBUG_SUBSYS_COLL == WEFT_SUBSYS_COLL &&
                   1 << WEFT_DEBUG_SUBSYS_GRAD == WEFT_SUBSYS_GRAD,
               "WEFT_DEBUG_SUBSYS's words are the subsystem bits, in order");

/* The settings changed (reload, fork): resolve again at the next line. */
static void log_settings_stale(void) {
  atomic_store(&weft_log_level_now, -1);
}

void weft_log_init(void) {
  weft_settings_on_reload(log_settings_stale);
  const weft_settings_values *s = weft_settings();
  /* the filter first: a thread that sees the level also sees its filter */
  atomic_store(&weft_log_subsys_now, (int)s->debug_subsys);
  atomic_store(&weft_log_level_now, s->debug);
}

void weft_log_set_rank(int rank) { log_rank = rank; }

void weft_log_write(int level, int subsys, const char *file, int line, const char *fmt, ...) {
  static const char *level_names[] = {"", "WARN", "INFO", "TRACE"};
  const char *sub = "ALL";
  for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
    if (subsys == subsys_names[i].bit) sub = subsys_names[i].name;
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  /* one fprintf so lines of concurrent ranks/threads do not interleave */
  fprintf(stderr, "%s:%d:%d weft %s %s %s (%s:%d)\n", host, (int)getpid(), log_rank,
          level_names[level], sub, msg, base ? base + 1 : file, line);
}
