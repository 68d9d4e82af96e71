/* ibv_settings.c - the table of ibv_settings.h's list: the registry
 * (src/base/settings.c) reads it from the environment and checks it; the
 * transports hand it over (transports/transport_settings.c). */
#include "transports/ibv/ibv_settings.h"

/* clang-format off */
#define ROW_(...) WEFT_SETTING_SPEC(ibv_settings_values, __VA_ARGS__),
static const weft_setting_spec specs[] = {WEFT_IBV_SETTINGS(ROW_)};
#undef ROW_
/* clang-format on */
static ibv_settings_values values;
static weft_setting_state states[sizeof specs / sizeof specs[0]];

weft_settings_table ibv_settings_table = WEFT_SETTINGS_TABLE("ibv", specs, &values, states);

const ibv_settings_values *ibv_settings(void) {
  return weft_settings_table_values(&ibv_settings_table);
}
