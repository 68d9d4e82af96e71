/* settings.c - the registry of WEFT_* settings: the core's table, made from
 * the list in settings.h, and every table a layer above hands over
 * (weft_settings_register); the only place that reads them from the
 * environment. Values are parsed and checked once (or on reload), so a
 * setting cannot change under a running collective. Nothing here logs: a
 * refused value is kept as a sentence that weft_settings_check hands to the
 * caller. */
#include "src/base/settings.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* clang-format off */
#define CORE_SPEC_(...) WEFT_SETTING_SPEC(weft_settings_values, __VA_ARGS__),
static const weft_setting_spec core_specs[WEFT_SETTING_COUNT] = {
    WEFT_CORE_SETTINGS(CORE_SPEC_)
};
#undef CORE_SPEC_
/* clang-format on */
static weft_settings_values core_values;
static weft_setting_state core_states[WEFT_SETTING_COUNT];
/* The core's table heads the list: weft-info lists it first. */
static weft_settings_table core_table =
    WEFT_SETTINGS_TABLE("weft", core_specs, &core_values, core_states);

static const char *const type_names[] = {
    [WEFT_SETTING_INT] = "integer",     [WEFT_SETTING_INT_OR_AUTO] = "integer",
    [WEFT_SETTING_BYTES] = "bytes",     [WEFT_SETTING_BYTES_OR_0] = "bytes",
    [WEFT_SETTING_SECONDS] = "seconds", [WEFT_SETTING_BOOL] = "bool",
    [WEFT_SETTING_ENUM] = "word",       [WEFT_SETTING_ENUM_ANYCASE] = "word",
    [WEFT_SETTING_WORD_SET] = "words",  [WEFT_SETTING_STRING] = "text",
};

/* One setting's parse: whichever member its type uses. */
typedef struct parsed {
  long long i;
  double d;
  const char *s;
} parsed;

static pthread_mutex_t settings_lock = PTHREAD_MUTEX_INITIALIZER;
/* The registered tables, the core's first; guarded by settings_lock. */
static weft_settings_table *tables = &core_table, **tables_end = &core_table.next;
/* Which reading of the environment is current: a table whose loaded_at
 * differs reads it again on its next use. A reload or a fork moves it on. */
static unsigned reading = 1;

static void (*listeners[4])(void);
static int nlisteners;

/* ---- rules ---------------------------------------------------------------- */

static void rule_phrase(const weft_setting_spec *s, char *out, size_t len) {
  long long lo = (long long)s->lo, hi = (long long)s->hi;
  bool open = s->hi >= WEFT_SETTING_NO_MAX;
  switch (s->type) {
    case WEFT_SETTING_INT: snprintf(out, len, "an integer from %lld to %lld", lo, hi); return;
    case WEFT_SETTING_INT_OR_AUTO:
      snprintf(out, len, "auto or an integer from %lld to %lld", lo, hi);
      return;
    case WEFT_SETTING_BYTES:
    case WEFT_SETTING_BYTES_OR_0: {
      const char *zero = s->type == WEFT_SETTING_BYTES_OR_0 ? "0 or " : "";
      const char *units = " (K, M, G: times 1024, 1024^2, 1024^3)";
      if (open && lo == 0)
        snprintf(out, len, "any byte count%s", units);
      else if (open)
        snprintf(out, len, "%sa byte count of at least %lld%s", zero, lo, units);
      else
        snprintf(out, len, "%sa byte count from %lld to %lld%s", zero, lo, hi, units);
      return;
    }
    case WEFT_SETTING_SECONDS:
      snprintf(out, len, "a number of seconds from %g to %g", s->lo, s->hi);
      return;
    case WEFT_SETTING_BOOL: snprintf(out, len, "0 or 1 (or no/yes, false/true, off/on)"); return;
    case WEFT_SETTING_ENUM:
    case WEFT_SETTING_ENUM_ANYCASE: {
      size_t used = (size_t)snprintf(out, len, "one of");
      for (int w = 0; s->words[w] && used < len; w++)
        used += (size_t)snprintf(out + used, len - used, "%s %s", w ? "," : "", s->words[w]);
      if (s->type == WEFT_SETTING_ENUM_ANYCASE && used < len)
        snprintf(out + used, len - used, " (any case)");
      return;
    }
    case WEFT_SETTING_WORD_SET: {
      size_t used = (size_t)snprintf(out, len, "ALL or a comma list of");
      for (int w = 0; s->words[w] && used < len; w++)
        used += (size_t)snprintf(out + used, len - used, "%s %s", w ? "," : "", s->words[w]);
      if (used < len) snprintf(out + used, len - used, " (any case; ^ first excludes them)");
      return;
    }
    case WEFT_SETTING_STRING: snprintf(out, len, "any text"); return;
  }
}

static bool parse_integer(const char *text, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 0);
  if (end == text || *end || errno == ERANGE) return false;
  *out = v;
  return true;
}

/* A byte count: decimal digits, then optionally K, M or G (also KiB, MiB,
 * GiB; any case), powers of 1024 as weft-bench's sizes. Hexadecimal too, as
 * for integers. Anything else after the number is refused, not ignored. */
static bool parse_bytes(const char *text, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 0);
  if (end == text || errno == ERANGE || v < 0) return false;
  if (!*end) return *out = v, true;
  static const char units[] = "kmg";
  const char *u = strchr(units, tolower((unsigned char)*end));
  if (!u || !*u) return false;
  if (end[1] && strcasecmp(end + 1, "ib")) return false;
  int shift = 10 * (int)(u - units + 1);
  if (v > (LLONG_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

static bool parse_bool(const char *text, long long *out) {
  static const char *const no[] = {"0", "no", "false", "off"};
  static const char *const yes[] = {"1", "yes", "true", "on"};
  for (int i = 0; i < 4; i++) {
    if (!strcasecmp(text, no[i])) return *out = 0, true;
    if (!strcasecmp(text, yes[i])) return *out = 1, true;
  }
  return false;
}

/* ALL, or words joined by commas, ^ first excluding them: bit i for word i. */
static bool parse_word_set(const weft_setting_spec *s, const char *text, long long *out) {
  unsigned all = 0;
  for (int w = 0; s->words[w]; w++) all |= 1u << w;
  if (!strcasecmp(text, "ALL")) return *out = all, true;
  bool exclude = text[0] == '^';
  unsigned mask = 0;
  for (const char *tok = text + exclude;;) {
    size_t n = strcspn(tok, ",");
    int w = 0;
    while (s->words[w] && (strlen(s->words[w]) != n || strncasecmp(tok, s->words[w], n))) w++;
    if (!s->words[w]) return false; /* unknown or empty */
    mask |= 1u << w;
    if (!tok[n]) break;
    tok += n + 1;
  }
  *out = exclude ? all & ~mask : mask;
  return true;
}

/* Parses `text` by the rules of `s`: true with *out set, or false. */
static bool parse_value(const weft_setting_spec *s, const char *text, parsed *out) {
  out->s = text;
  switch (s->type) {
    case WEFT_SETTING_INT_OR_AUTO:
      if (!strcmp(text, "auto")) return out->i = WEFT_SETTING_AUTO, true;
      /* fall through */
    case WEFT_SETTING_INT:
      if (!parse_integer(text, &out->i)) return false;
      return (double)out->i >= s->lo && (double)out->i <= s->hi;
    case WEFT_SETTING_BYTES:
    case WEFT_SETTING_BYTES_OR_0:
      if (!parse_bytes(text, &out->i)) return false;
      if (s->type == WEFT_SETTING_BYTES_OR_0 && out->i == 0) return true;
      return (double)out->i >= s->lo && (double)out->i <= s->hi;
    case WEFT_SETTING_SECONDS: {
      char *end;
      double v = strtod(text, &end);
      /* inf would disable the timeout, nan would compare false everywhere */
      if (end == text || *end || !isfinite(v) || v < s->lo || v > s->hi) return false;
      out->d = v;
      return true;
    }
    case WEFT_SETTING_BOOL: return parse_bool(text, &out->i);
    case WEFT_SETTING_ENUM:
    case WEFT_SETTING_ENUM_ANYCASE:
      for (int w = 0; s->words[w]; w++)
        if (s->type == WEFT_SETTING_ENUM ? !strcmp(text, s->words[w])
                                         : !strcasecmp(text, s->words[w]))
          return out->i = w, true;
      return false;
    case WEFT_SETTING_WORD_SET: return parse_word_set(s, text, &out->i);
    case WEFT_SETTING_STRING: return true;
  }
  return false;
}

/* ---- loading ---------------------------------------------------------------- */

static const char *setting_text(const weft_settings_table *t, int i) {
  const char *env = t->states[i].env;
  return env && *env ? env : t->specs[i].deflt;
}

/* Copies a parse into its typed field (strings point at the text: the
 * environment's copy or the default). */
static void value_store(const weft_setting_spec *s, void *values, const parsed *p) {
  char *at = (char *)values + s->offset;
  switch (s->type) {
    case WEFT_SETTING_INT:
    case WEFT_SETTING_INT_OR_AUTO: *(long long *)at = p->i; return;
    case WEFT_SETTING_BYTES:
    case WEFT_SETTING_BYTES_OR_0: *(size_t *)at = (size_t)p->i; return;
    case WEFT_SETTING_SECONDS: *(double *)at = p->d; return;
    case WEFT_SETTING_BOOL: *(bool *)at = p->i != 0; return;
    case WEFT_SETTING_ENUM:
    case WEFT_SETTING_ENUM_ANYCASE: *(int *)at = (int)p->i; return;
    case WEFT_SETTING_WORD_SET: *(unsigned *)at = (unsigned)p->i; return;
    case WEFT_SETTING_STRING: *(const char **)at = p->s; return;
  }
}

static void table_load_locked(weft_settings_table *t) {
  for (int i = 0; i < t->count; i++) {
    const weft_setting_spec *s = &t->specs[i];
    weft_setting_state *st = &t->states[i];
    free(st->env);
    const char *env = getenv(s->name);
    st->env = env ? strdup(env) : NULL;
    st->refused[0] = 0;
    parsed p;
    if (!parse_value(s, setting_text(t, i), &p)) {
      char rule[160];
      rule_phrase(s, rule, sizeof rule);
      snprintf(st->refused, sizeof st->refused, "%s=\"%.64s\" is refused: it must be %s", s->name,
               setting_text(t, i), rule);
      /* a refused value holds its default; a default that fails its own rule
       * is a bug in the lists, which the settings test catches */
      if (!parse_value(s, s->deflt, &p)) memset(&p, 0, sizeof p);
    }
    value_store(s, t->values, &p);
  }
  t->loaded_at = reading;
}

static void table_ensure_locked(weft_settings_table *t) {
  if (t->loaded_at != reading) table_load_locked(t);
}

static void settings_tell_listeners(void) {
  for (int i = 0; i < nlisteners; i++) listeners[i]();
}

/* A forked child (a rank started by a launcher or a test) reads its own
 * environment, not the parent's snapshot. */
static void settings_mark_stale(void) {
  pthread_mutex_init(&settings_lock, NULL); /* the fork may have copied it held */
  reading++;
  settings_tell_listeners();
}

static void settings_register_fork(void) {
  pthread_atfork(NULL, NULL, settings_mark_stale);
}

/* Takes the lock with `t` (and, with t NULL, every registered table) read
 * at the current reading. The caller unlocks. */
static void settings_lock_loaded(weft_settings_table *t) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, settings_register_fork);
  pthread_mutex_lock(&settings_lock);
  if (t) {
    table_ensure_locked(t);
    return;
  }
  for (weft_settings_table *r = tables; r; r = r->next) table_ensure_locked(r);
}

void weft_settings_reload(void) {
  settings_lock_loaded(NULL); /* registers the fork handler on a first call */
  reading++;
  for (weft_settings_table *r = tables; r; r = r->next) table_load_locked(r);
  pthread_mutex_unlock(&settings_lock);
  settings_tell_listeners();
}

void weft_settings_on_reload(void (*fn)(void)) {
  pthread_mutex_lock(&settings_lock);
  bool known = false;
  for (int i = 0; i < nlisteners; i++) known |= listeners[i] == fn;
  if (!known && nlisteners < (int)(sizeof listeners / sizeof listeners[0]))
    listeners[nlisteners++] = fn;
  pthread_mutex_unlock(&settings_lock);
}

void weft_settings_register(weft_settings_table *table) {
  pthread_mutex_lock(&settings_lock);
  if (!table->registered && table != &core_table) {
    table->registered = true;
    table->next = NULL;
    *tables_end = table;
    tables_end = &table->next;
  }
  pthread_mutex_unlock(&settings_lock);
}

/* ---- reading ------------------------------------------------------------------ */

const void *weft_settings_table_values(weft_settings_table *table) {
  settings_lock_loaded(table);
  pthread_mutex_unlock(&settings_lock);
  return table->values;
}

const char *weft_settings_table_text(weft_settings_table *table, int index) {
  if (index < 0 || index >= table->count) return "";
  settings_lock_loaded(table);
  const char *text = setting_text(table, index);
  pthread_mutex_unlock(&settings_lock);
  return text;
}

const weft_settings_values *weft_settings(void) {
  return weft_settings_table_values(&core_table);
}

const char *weft_setting_str(enum weft_setting_id id) {
  return weft_settings_table_text(&core_table, (int)id);
}

weft_status weft_settings_check(char *why, size_t len) {
  settings_lock_loaded(NULL);
  const char *first = NULL;
  int more = 0;
  for (const weft_settings_table *t = tables; t; t = t->next)
    for (int i = 0; i < t->count; i++) {
      if (!t->states[i].refused[0]) continue;
      if (!first)
        first = t->states[i].refused;
      else
        more++;
    }
  if (!first) {
    if (len) why[0] = 0;
  } else if (more) {
    snprintf(why, len, "%s (and %d more refused setting%s: weft-info -s lists them)", first, more,
             more > 1 ? "s" : "");
  } else {
    snprintf(why, len, "%s", first);
  }
  pthread_mutex_unlock(&settings_lock);
  return first ? WEFT_ERR_INVALID : WEFT_OK;
}

/* Setting `id` counted over every registered table, the core's first: its
 * table and index there, or NULL past the last. Under the lock. */
static weft_settings_table *table_of_locked(int id, int *index) {
  if (id < 0) return NULL;
  for (weft_settings_table *t = tables; t; t = t->next) {
    if (id < t->count) return *index = id, t;
    id -= t->count;
  }
  return NULL;
}

weft_status weft_setting_get_info(int id, weft_setting_info *info) {
  if (!info) return WEFT_ERR_INVALID;
  settings_lock_loaded(NULL);
  int i;
  weft_settings_table *t = table_of_locked(id, &i);
  if (t) {
    const weft_setting_spec *s = &t->specs[i];
    info->name = s->name;
    info->group = t->group;
    info->type = s->type;
    info->type_name = type_names[s->type];
    info->deflt = s->deflt;
    info->value = setting_text(t, i);
    info->help = s->help;
    rule_phrase(s, info->rule, sizeof info->rule);
    snprintf(info->refused, sizeof info->refused, "%s", t->states[i].refused);
  }
  pthread_mutex_unlock(&settings_lock);
  return t ? WEFT_OK : WEFT_ERR_INVALID;
}

weft_status weft_settings_describe(int id, weft_setting_desc *desc) {
  if (!desc) return WEFT_ERR_INVALID;
  settings_lock_loaded(NULL);
  int i;
  weft_settings_table *t = table_of_locked(id, &i);
  if (t) {
    desc->name = t->specs[i].name;
    desc->deflt = t->specs[i].deflt;
    desc->value = setting_text(t, i);
    desc->help = t->specs[i].help;
  }
  pthread_mutex_unlock(&settings_lock);
  return t ? WEFT_OK : WEFT_ERR_INVALID;
}
