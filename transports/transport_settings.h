/* transport_settings.h - the transports' part in the settings registry: each
 * built-in transport keeps its settings in its own folder (NAME_settings.h)
 * and this layer hands their tables to src/base/settings, which names no
 * transport. */
#ifndef WEFT_TRANSPORT_SETTINGS_H
#define WEFT_TRANSPORT_SETTINGS_H

/* Registers every built-in transport's settings table (tcp, shm, ibv: weft-info's
 * order), once; later calls return at once. Whoever checks or lists the
 * settings calls it first: communicator creation, weft_setting_describe,
 * weft-info. A transport reads its own values without it. */
void weft_transport_settings_register(void);

#endif
