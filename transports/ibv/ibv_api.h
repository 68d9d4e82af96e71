/* ibv_api.h - every verbs call weft makes, through one table filled at run
 * time by dlopen of libibverbs.so.1 (or WEFT_IB_LIBRARY, the tests' emulator)
 * and dlvsym by symbol version. Nothing links -libverbs, so one build runs on
 * nodes without rdma-core and there reports verbs as unavailable. The data
 * path calls that verbs.h inlines (post_send, post_recv, poll_cq) go through
 * the table too: they call the provider's ops as the inline versions do. */
#ifndef WEFT_IBV_API_H
#define WEFT_IBV_API_H

#include <infiniband/verbs.h>

#include "transports/transport.h"

typedef struct ibv_api {
  const char *library; /* the file name that was opened */
  struct ibv_device **(*get_device_list)(int *num_devices);
  void (*free_device_list)(struct ibv_device **list);
  const char *(*get_device_name)(struct ibv_device *device);
  struct ibv_context *(*open_device)(struct ibv_device *device);
  int (*close_device)(struct ibv_context *context);
  int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
  int (*query_port)(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
  int (*query_gid)(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid);
  /* optional (rdma-core >= 29): the GID's type; NULL falls back to sysfs */
  int (*query_gid_ex)(struct ibv_context *context, uint32_t port, uint32_t index,
                      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
  int (*dealloc_pd)(struct ibv_pd *pd);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
  int (*dereg_mr)(struct ibv_mr *mr);
  struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                              struct ibv_comp_channel *channel, int comp_vector);
  int (*destroy_cq)(struct ibv_cq *cq);
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  int (*destroy_qp)(struct ibv_qp *qp);
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
  int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
  void (*ack_async_event)(struct ibv_async_event *event);
  int (*fork_init)(void);
  /* optional (rdma-core >= 35): whether the kernel makes fork safe anyway */
  enum ibv_fork_status (*is_fork_initialized)(void);
  const char *(*wc_status_str)(enum ibv_wc_status status);
  const char *(*event_type_str)(enum ibv_event_type event);
  /* optional (rdma-core >= 34, IBVERBS_1.12): device memory by its dma-buf
   * (GPUDirect RDMA without nvidia-peermem); NULL where the library lacks it */
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
                                  uint64_t iova, int fd, int access);
  /* the inline data path */
  int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
  int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
  int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
} ibv_api;

/* The table for the library WEFT_IB_LIBRARY names (default libibverbs.so.1),
 * loaded once per process and name, with fork safety set up before any
 * device is opened. NULL with the reason in `err` when the library or one of
 * its required symbols is missing. */
const ibv_api *ibv_api_load(weft_error_sink *err);

#endif
