/* log.h - logging by subsystem, off by default. WEFT_DEBUG picks the level
 * (NONE, WARN, INFO, TRACE); WEFT_DEBUG_SUBSYS picks subsystems
 * ("INIT,NET", "^COLL" excludes). Lines go to stderr with host, pid and rank. */
#ifndef WEFT_LOG_H
#define WEFT_LOG_H

enum weft_log_level { WEFT_LOG_NONE = 0, WEFT_LOG_WARN = 1, WEFT_LOG_INFO = 2, WEFT_LOG_TRACE = 3 };

/* Subsystems are bits so a filter is one AND. */
enum weft_subsys {
  WEFT_SUBSYS_INIT = 1 << 0,  /* communicator creation, environment, topology */
  WEFT_SUBSYS_BOOT = 1 << 1,  /* rendezvous */
  WEFT_SUBSYS_NET = 1 << 2,   /* transports, connections */
  WEFT_SUBSYS_COLL = 1 << 3,  /* collectives, algorithm choice */
  WEFT_SUBSYS_GRAD = 1 << 4,  /* gradient buckets, parameter and metric sync */
  WEFT_SUBSYS_ALL = 0xffff,
};

#include <stdatomic.h>

/* Resolved lazily by whichever thread logs first (the rendezvous thread may):
 * atomics, read relaxed, so a disabled log still costs one load. */
extern _Atomic int weft_log_level_now;
extern _Atomic int weft_log_subsys_now;
void weft_log_init(void);
void weft_log_write(int level, int subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Rank shown in log lines of this thread (-1 = unknown). */
void weft_log_set_rank(int rank);

#define WEFT_LOG_(lvl, sub, ...)                                                      \
  do {                                                                               \
    int log_level_ = atomic_load_explicit(&weft_log_level_now, memory_order_relaxed); \
    if (log_level_ < 0) {                                                            \
      weft_log_init();                                                               \
      log_level_ = atomic_load_explicit(&weft_log_level_now, memory_order_relaxed);  \
    }                                                                                \
    if (log_level_ >= (lvl) &&                                                       \
        (atomic_load_explicit(&weft_log_subsys_now, memory_order_relaxed) & (sub)))  \
      weft_log_write((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__);                 \
  } while (0)
#define WEFT_WARN(sub, ...) WEFT_LOG_(WEFT_LOG_WARN, sub, __VA_ARGS__)
#define WEFT_INFO(sub, ...) WEFT_LOG_(WEFT_LOG_INFO, sub, __VA_ARGS__)
#define WEFT_TRACE(sub, ...) WEFT_LOG_(WEFT_LOG_TRACE, sub, __VA_ARGS__)

#endif
