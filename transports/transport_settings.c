/* transport_settings.c - hands the built-in transports' settings tables to
 * the registry (src/base/settings.h), in weft-info's order. ibv's is handed
 * over in builds without verbs too, so weft-info lists every setting. */
#include "transports/transport_settings.h"

#include <pthread.h>

#include "transports/ibv/ibv_settings.h"
#include "transports/shm/shm_settings.h"
#include "transports/tcp/tcp_settings.h"

static void register_builtin(void) {
  weft_settings_table *const builtin[] = {&tcp_settings_table, &shm_settings_table,
                                          &ibv_settings_table};
  for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
    weft_settings_register(builtin[i]);
}

void weft_transport_settings_register(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_builtin);
}
