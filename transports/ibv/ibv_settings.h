/* ibv_settings.h - the verbs transport's own settings: the list, the values it
 * makes (read as ibv_settings()-><field>) and the table ibv_settings.c
 * defines, which the transports hand to the registry in src/base/settings.h
 * (transports/transport_settings.c), also in builds without verbs: weft-info
 * lists it under "ibv". */
#ifndef WEFT_IBV_SETTINGS_H
#define WEFT_IBV_SETTINGS_H

#include "src/base/settings.h"

/* QPS_PER_PEER's upper bound is IBV_MAX_QPS (ibv.h); TIMEOUT and RETRY_CNT
 * are the widths of the fields verbs has for them. */
/* WEFT_IB_GDR's words (GPUDirect RDMA, ibv_gdr.c) */
#define WEFT_IBV_GDR_WORDS(W) \
  W(IBV_GDR_AUTO, "auto") W(IBV_GDR_DMABUF, "dmabuf") W(IBV_GDR_PEERMEM, "peermem") W(IBV_GDR_OFF, "off")

#define WEFT_IBV_SETTINGS(X)                                                                     \
  X(IB_HCA, hca, STRING, "", 0, 0, WEFT_NO_WORDS,                                                \
    "RDMA devices/ports for verbs: mlx5 (prefix), =mlx5_0 (exact), mlx5_0:1 (port), ^mlx5_1 (exclude)") \
  X(IB_GID_INDEX, gid_index, INT_OR_AUTO, "auto", 0, 65535, WEFT_NO_WORDS,                       \
    "RoCE GID index to use; auto: RoCE v2, IPv4-mapped first, as NCCL and perftest")             \
  X(IB_QPS_PER_PEER, qps_per_peer, INT, "1", 1, 8, WEFT_NO_WORDS,                                \
    "RC queue pairs per peer for verbs; chunks go round-robin over them")                        \
  X(IB_ZCOPY_BYTES, zcopy_bytes, BYTES, "0", 0, WEFT_SETTING_NO_MAX, WEFT_NO_WORDS,              \
    "verbs chunks of at least this many bytes are sent from the user's buffer (registration cache); 0 = always copy (see README)") \
  X(IB_TIMEOUT, timeout, INT, "18", 1, 31, WEFT_NO_WORDS,                                        \
    "verbs ACK timeout exponent: 4.096 us * 2^N per try")                                        \
  X(IB_RETRY_CNT, retry_cnt, INT, "7", 0, 7, WEFT_NO_WORDS,                                      \
    "verbs transport retries before a work request fails")                                       \
  X(IB_GDR, gdr, ENUM_ANYCASE, "auto", 0, 0, WEFT_IBV_GDR_WORDS,                                 \
    "GPUDirect RDMA for device buffers over verbs: auto (dma-buf, else nvidia-peermem, else staged), dmabuf, peermem, off (staged through host memory)") \
  X(IB_GDR_FLUSH, gdr_flush, BOOL, "1", 0, 0, WEFT_NO_WORDS,                                     \
    "for tests: 0 leaves out the RDMA-read flush that makes a NIC's writes visible to the GPU (results then go wrong on the emulator, as they may on a GPU)") \
  X(IB_LIBRARY, library, STRING, "", 0, 0, WEFT_NO_WORDS,                                        \
    "for tests: the verbs library to dlopen instead of libibverbs.so.1 (the in-tree emulator)")

enum ibv_gdr_choice { WEFT_IBV_GDR_WORDS(WEFT_SETTING_WORD_ENUM) };

typedef struct ibv_settings_values {
  WEFT_IBV_SETTINGS(WEFT_SETTING_FIELD)
} ibv_settings_values;

/* The values, parsed and checked (a refused one holds its default). Valid
 * until the next reload (weft_settings_reload). */
const ibv_settings_values *ibv_settings(void);
/* The table, for the registry (weft_settings_register). */
extern weft_settings_table ibv_settings_table;

#endif
