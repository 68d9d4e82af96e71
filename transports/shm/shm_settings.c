/* shm_settings.c - the table of shm_settings.h's list: the registry
 * (src/base/settings.c) reads it from the environment and checks it; the
 * transports hand it over (transports/transport_settings.c). */
#include "transports/shm/shm_settings.h"

/* clang-format off */
#define ROW_(...) WEFT_SETTING_SPEC(shm_settings_values, __VA_ARGS__),
static const weft_setting_spec specs[] = {WEFT_SHM_SETTINGS(ROW_)};
#undef ROW_
/* clang-format on */
static shm_settings_values values;
static weft_setting_state states[sizeof specs / sizeof specs[0]];

weft_settings_table shm_settings_table = WEFT_SETTINGS_TABLE("shm", specs, &values, states);

const shm_settings_values *shm_settings(void) {
  return weft_settings_table_values(&shm_settings_table);
}

const char *shm_setting_str(enum shm_setting_id id) {
  return weft_settings_table_text(&shm_settings_table, (int)id);
}
