/* settings.c - the one table of WEFT_* settings and the only place that reads
 * them from the environment. Values are captured once (or on reload), so a
 * setting cannot change under a running collective. */
#include "src/base/settings.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/log.h"
#include "weft.h"

struct setting {
  const char *name;
  const char *deflt;
  const char *help;
  char *value; /* owned copy of the environment's value, or NULL for the default */
};

static struct setting settings_table[WEFT_SETTING_COUNT] = {
#define WEFT_SETTING_ROW_(id, dflt, help) [WEFT_SETTING_##id] = {"WEFT_" #id, dflt, help, NULL},
    WEFT_SETTINGS_MAP(WEFT_SETTING_ROW_)
#undef WEFT_SETTING_ROW_
};

static pthread_mutex_t settings_lock = PTHREAD_MUTEX_INITIALIZER;
static int settings_loaded;
static void settings_mark_stale(void);
static void weft_settings_register_fork(void) { pthread_atfork(NULL, NULL, settings_mark_stale); }

static void settings_load_locked(void) {
  for (int i = 0; i < WEFT_SETTING_COUNT; i++) {
    free(settings_table[i].value);
    const char *env = getenv(settings_table[i].name);
    settings_table[i].value = env ? strdup(env) : NULL;
  }
  settings_loaded = 1;
}

/* A forked child (a rank started by a launcher or a test) reads its own
 * environment, not the parent's snapshot. */
static void settings_mark_stale(void) {
  pthread_mutex_init(&settings_lock, NULL); /* the fork may have copied it held */
  settings_loaded = 0;
  atomic_store(&weft_log_level_now, -1);
}

static void settings_ensure(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, weft_settings_register_fork);
  pthread_mutex_lock(&settings_lock);
  if (!settings_loaded) settings_load_locked();
  pthread_mutex_unlock(&settings_lock);
}

void weft_settings_reload(void) {
  pthread_mutex_lock(&settings_lock);
  settings_load_locked();
  pthread_mutex_unlock(&settings_lock);
  atomic_store(&weft_log_level_now, -1); /* the log re-reads its level lazily */
}

const char *weft_setting_str(enum weft_setting_id id) {
  if (id < 0 || id >= WEFT_SETTING_COUNT) return "";
  settings_ensure();
  const struct setting *s = &settings_table[id];
  return s->value ? s->value : s->deflt;
}

double weft_setting_double(enum weft_setting_id id, double fallback) {
  const char *text = weft_setting_str(id);
  if (!*text) return fallback;
  char *end;
  double v = strtod(text, &end);
  if (end == text || *end) {
    WEFT_WARN(WEFT_SUBSYS_INIT, "%s=\"%s\" is not a number; using %g", settings_table[id].name,
              text, fallback);
    return fallback;
  }
  return v;
}

long long weft_setting_ll(enum weft_setting_id id, long long fallback) {
  const char *text = weft_setting_str(id);
  if (!*text) return fallback;
  char *end;
  long long v = strtoll(text, &end, 0);
  if (end == text || *end) {
    WEFT_WARN(WEFT_SUBSYS_INIT, "%s=\"%s\" is not an integer; using %lld",
              settings_table[id].name, text, fallback);
    return fallback;
  }
  return v;
}

weft_status weft_setting_describe(int index, weft_setting_desc *desc) {
  if (index < 0 || index >= WEFT_SETTING_COUNT || !desc) return WEFT_ERR_INVALID;
  settings_ensure();
  const struct setting *s = &settings_table[index];
  desc->name = s->name;
  desc->deflt = s->deflt;
  desc->value = s->value ? s->value : s->deflt;
  desc->help = s->help;
  return WEFT_OK;
}
