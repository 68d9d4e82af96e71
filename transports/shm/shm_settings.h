/* shm_settings.h - the shared-memory transport's own settings: the list, the
 * values it makes (read as shm_settings()-><field>) and the table
 * shm_settings.c defines, which the transports hand to the registry in
 * src/base/settings.h (transports/transport_settings.c); weft-info lists it
 * under "shm". */
#ifndef WEFT_SHM_SETTINGS_H
#define WEFT_SHM_SETTINGS_H

#include "src/base/settings.h"

/* WEFT_SHM_CMA's words: single copy where it is allowed and pays (auto),
 * wherever it is allowed (on), off (0), or, for tests, a probe that fails as
 * a refusing kernel's would. */
#define WEFT_SHM_CMA_WORDS(W)                                                        \
  W(WEFT_SHM_CMA_AUTO, "auto") W(WEFT_SHM_CMA_OFF, "0") W(WEFT_SHM_CMA_ON, "on") \
  W(WEFT_SHM_CMA_TEST_REFUSED, "test-refused")

/* The upper bound is SHM_MAX_SLOTS (shm.h): a segment has room for that many. */
#define WEFT_SHM_SETTINGS(X)                                                                       \
  X(SHM_SLOTS, slots, INT, "8", 2, 64, WEFT_NO_WORDS,                                              \
    "slots per direction between two ranks of one host: chunks above 112 bytes sent through "      \
    "shared memory in flight (chunks by single copy and inline ones take none; 64 chunks in "      \
    "flight in all)")                                                                              \
  X(SHM_CMA, cma, ENUM, "auto", 0, 0, WEFT_SHM_CMA_WORDS,                                          \
    "single copy between ranks of one host: a receiver reads a large chunk of allgather, "         \
    "alltoall, broadcast, gather or scatter straight from the sender's buffer (process_vm_readv) " \
    "instead of through the shared slot; on: where a probe at connection shows the kernel allows " \
    "it (not under seccomp, Yama ptrace_scope 2+, other users); auto: there too, unless "          \
    "process_vm_readv costs 2 memcpy of the same bytes or more (timed once per communicator: "     \
    "page pinning is slow in some VMs), where chunks go through the slots but every other chunk "  \
    "of one-way traffic goes by single copy while the sender's copies into the slots cost more "   \
    "than a read; 0: never (also no PR_SET_PTRACER); test-refused: for tests, the probe fails")    \
  X(SHM_CMA_MIN_BYTES, cma_min_bytes, BYTES, "16384", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,       \
    "chunks of at least this many bytes (and above 112, which travel inline) go by single copy "   \
    "where WEFT_SHM_CMA allows")                                                                   \
  X(SHM_CMA_STREAM_BYTES, cma_stream_bytes, BYTES, "1048576", 0, WEFT_SETTING_NO_MAX,              \
    WEFT_NO_WORDS,                                                                                 \
    "with WEFT_SHM_CMA=auto reading by single copy and a core per rank: a rank whose only large "  \
    "traffic in a call is one stream to one peer (a 2-rank broadcast or gather) sends the part "   \
    "of it past this many bytes through the slots, so that its own core makes half of the "        \
    "copying; 0 = never")

enum weft_shm_cma_choice { WEFT_SHM_CMA_WORDS(WEFT_SETTING_WORD_ENUM) };

typedef struct shm_settings_values {
  WEFT_SHM_SETTINGS(WEFT_SETTING_FIELD)
} shm_settings_values;

/* The values, parsed and checked (a refused one holds its default). Valid
 * until the next reload (weft_settings_reload). */
const shm_settings_values *shm_settings(void);
/* Setting WEFT_<ID> of the list as text, as weft_setting_str: SHM_SETTING_<ID>. */
enum shm_setting_id {
#define SHM_SETTING_ID_(id, field, type, dflt, lo, hi, words, help) SHM_SETTING_##id,
  WEFT_SHM_SETTINGS(SHM_SETTING_ID_)
#undef SHM_SETTING_ID_
};
const char *shm_setting_str(enum shm_setting_id id);
/* The table, for the registry (weft_settings_register). */
extern weft_settings_table shm_settings_table;

#endif
