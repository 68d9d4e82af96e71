/* shm_settings.h - the shared-memory transport's own settings, as a list that
 * the one settings table (src/base/settings.h, which includes this file;
 * include that one) puts under "shm". Read as weft_settings()->shm.<field>.
 * Declarations only: this file calls nothing. */
#ifndef WEFT_SHM_SETTINGS_H
#define WEFT_SHM_SETTINGS_H

/* The upper bound is SHM_MAX_SLOTS (shm.h): a segment has room for that many. */
#define WEFT_SHM_SETTINGS(X)                                                                     \
  X(SHM_SLOTS, slots, INT, "8", 2, 64, WEFT_NO_WORDS,                                            \
    "chunks in flight per direction between two ranks of one host")

#endif
