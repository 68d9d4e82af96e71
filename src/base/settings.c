/* settings.c - the one table of WEFT_* settings, made from the lists in
 * settings.h, and the only place that reads them from the environment.
 * Values are parsed and checked once (or on reload), so a setting cannot
 * change under a running collective. Nothing here logs: a refused value is
 * kept as a sentence that weft_settings_check hands to the caller. */
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

struct setting_spec {
  const char *name;
  const char *group;
  enum weft_setting_type type;
  const char *deflt;
  double lo, hi;
  const char *const *words; /* NULL-terminated; used by the ENUM types and WORD_SET */
  const char *help;
};

/* clang-format off */
static const struct setting_spec specs[WEFT_SETTING_COUNT] = {
#define WEFT_WORD_TEXT_(constant, word) word,
#define SPEC_ROW_(id, field, type, dflt, lo, hi, words, help)                                    \
  [WEFT_SETTING_##id] = {"WEFT_" #id, spec_group_, WEFT_SETTING_##type, dflt, lo, hi,            \
                         (const char *const[]){words(WEFT_WORD_TEXT_) NULL}, help},
#define spec_group_ "weft"
    WEFT_CORE_SETTINGS(SPEC_ROW_)
#undef spec_group_
#define spec_group_ "tcp"
    WEFT_TCP_SETTINGS(SPEC_ROW_)
#undef spec_group_
#define spec_group_ "shm"
    WEFT_SHM_SETTINGS(SPEC_ROW_)
#undef spec_group_
#define spec_group_ "ibv"
    WEFT_IBV_SETTINGS(SPEC_ROW_)
#undef spec_group_
#undef SPEC_ROW_
#undef WEFT_WORD_TEXT_
};
/* clang-format on */

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

struct setting_state {
  char *env;         /* owned copy of the environment's value, or NULL when unset */
  char refused[256]; /* why the environment's value was refused; "" when accepted */
};

static struct setting_state states[WEFT_SETTING_COUNT];
static weft_settings_values values;
static pthread_mutex_t settings_lock = PTHREAD_MUTEX_INITIALIZER;
static int settings_loaded;

static void (*listeners[4])(void);
static int nlisteners;

/* ---- rules ---------------------------------------------------------------- */

static void rule_phrase(const struct setting_spec *s, char *out, size_t len) {
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
static bool parse_word_set(const struct setting_spec *s, const char *text, long long *out) {
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
static bool parse_value(const struct setting_spec *s, const char *text, parsed *out) {
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

static const char *setting_text(int id) {
  const char *env = states[id].env;
  return env && *env ? env : specs[id].deflt;
}

/* Copies each parse into its typed field (strings point at the text: the
 * environment's copy or the default). */
#define STORE_INT(dst, q) dst = (q).i;
#define STORE_INT_OR_AUTO(dst, q) dst = (q).i;
#define STORE_BYTES(dst, q) dst = (size_t)(q).i;
#define STORE_BYTES_OR_0(dst, q) dst = (size_t)(q).i;
#define STORE_SECONDS(dst, q) dst = (q).d;
#define STORE_BOOL(dst, q) dst = (q).i != 0;
#define STORE_ENUM(dst, q) dst = (int)(q).i;
#define STORE_ENUM_ANYCASE(dst, q) dst = (int)(q).i;
#define STORE_WORD_SET(dst, q) dst = (unsigned)(q).i;
#define STORE_STRING(dst, q) dst = (q).s;
static void values_store(const parsed *p) {
#define STORE_CORE_(id, field, type, dflt, lo, hi, words, help) \
  STORE_##type(values.field, p[WEFT_SETTING_##id])
#define STORE_TCP_(id, field, type, dflt, lo, hi, words, help) \
  STORE_##type(values.tcp.field, p[WEFT_SETTING_##id])
#define STORE_SHM_(id, field, type, dflt, lo, hi, words, help) \
  STORE_##type(values.shm.field, p[WEFT_SETTING_##id])
#define STORE_IBV_(id, field, type, dflt, lo, hi, words, help) \
  STORE_##type(values.ibv.field, p[WEFT_SETTING_##id])
  WEFT_CORE_SETTINGS(STORE_CORE_)
  WEFT_TCP_SETTINGS(STORE_TCP_)
  WEFT_SHM_SETTINGS(STORE_SHM_)
  WEFT_IBV_SETTINGS(STORE_IBV_)
#undef STORE_CORE_
#undef STORE_TCP_
#undef STORE_SHM_
#undef STORE_IBV_
}

static void settings_load_locked(void) {
  parsed p[WEFT_SETTING_COUNT];
  for (int i = 0; i < WEFT_SETTING_COUNT; i++) {
    struct setting_state *st = &states[i];
    free(st->env);
    const char *env = getenv(specs[i].name);
    st->env = env ? strdup(env) : NULL;
    st->refused[0] = 0;
    if (parse_value(&specs[i], setting_text(i), &p[i])) continue;
    char rule[160];
    rule_phrase(&specs[i], rule, sizeof rule);
    snprintf(st->refused, sizeof st->refused, "%s=\"%.64s\" is refused: it must be %s",
             specs[i].name, setting_text(i), rule);
    /* a refused value holds its default; a default that fails its own rule
     * is a bug in the lists, which the settings test catches */
    if (!parse_value(&specs[i], specs[i].deflt, &p[i])) memset(&p[i], 0, sizeof p[i]);
  }
  values_store(p);
  settings_loaded = 1;
}

static void settings_tell_listeners(void) {
  for (int i = 0; i < nlisteners; i++) listeners[i]();
}

/* A forked child (a rank started by a launcher or a test) reads its own
 * environment, not the parent's snapshot. */
static void settings_mark_stale(void) {
  pthread_mutex_init(&settings_lock, NULL); /* the fork may have copied it held */
  settings_loaded = 0;
  settings_tell_listeners();
}

static void settings_register_fork(void) {
  pthread_atfork(NULL, NULL, settings_mark_stale);
}

static void settings_ensure(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, settings_register_fork);
  pthread_mutex_lock(&settings_lock);
  if (!settings_loaded) settings_load_locked();
  pthread_mutex_unlock(&settings_lock);
}

void weft_settings_reload(void) {
  pthread_mutex_lock(&settings_lock);
  settings_load_locked();
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

/* ---- reading ------------------------------------------------------------------ */

const weft_settings_values *weft_settings(void) {
  settings_ensure();
  return &values;
}

const char *weft_setting_str(enum weft_setting_id id) {
  if (id < 0 || id >= WEFT_SETTING_COUNT) return "";
  settings_ensure();
  return setting_text(id);
}

weft_status weft_settings_check(char *why, size_t len) {
  settings_ensure();
  int first = -1, more = 0;
  for (int i = 0; i < WEFT_SETTING_COUNT; i++) {
    if (!states[i].refused[0]) continue;
    if (first < 0)
      first = i;
    else
      more++;
  }
  if (first < 0) {
    if (len) why[0] = 0;
    return WEFT_OK;
  }
  if (more)
    snprintf(why, len, "%s (and %d more refused setting%s: weft-info -s lists them)",
             states[first].refused, more, more > 1 ? "s" : "");
  else
    snprintf(why, len, "%s", states[first].refused);
  return WEFT_ERR_INVALID;
}

weft_status weft_setting_get_info(int id, weft_setting_info *info) {
  if (id < 0 || id >= WEFT_SETTING_COUNT || !info) return WEFT_ERR_INVALID;
  settings_ensure();
  const struct setting_spec *s = &specs[id];
  info->name = s->name;
  info->group = s->group;
  info->type = s->type;
  info->type_name = type_names[s->type];
  info->deflt = s->deflt;
  info->value = setting_text(id);
  info->help = s->help;
  rule_phrase(s, info->rule, sizeof info->rule);
  snprintf(info->refused, sizeof info->refused, "%s", states[id].refused);
  return WEFT_OK;
}

weft_status weft_setting_describe(int index, weft_setting_desc *desc) {
  if (index < 0 || index >= WEFT_SETTING_COUNT || !desc) return WEFT_ERR_INVALID;
  settings_ensure();
  const struct setting_spec *s = &specs[index];
  desc->name = s->name;
  desc->deflt = s->deflt;
  desc->value = setting_text(index);
  desc->help = s->help;
  return WEFT_OK;
}
