/* tcp_settings.c - the table of tcp_settings.h's list: the registry
 * (src/base/settings.c) reads it from the environment and checks it; the
 * transports hand it over (transports/transport_settings.c). */
#include "transports/tcp/tcp_settings.h"

/* clang-format off */
#define ROW_(...) WEFT_SETTING_SPEC(tcp_settings_values, __VA_ARGS__),
static const weft_setting_spec specs[] = {WEFT_TCP_SETTINGS(ROW_)};
#undef ROW_
/* clang-format on */
static tcp_settings_values values;
static weft_setting_state states[sizeof specs / sizeof specs[0]];

weft_settings_table tcp_settings_table = WEFT_SETTINGS_TABLE("tcp", specs, &values, states);

const tcp_settings_values *tcp_settings(void) {
  return weft_settings_table_values(&tcp_settings_table);
}
