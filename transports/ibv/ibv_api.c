/* ibv_api.c - fills the verbs table from libibverbs.so.1 (or the file
 * WEFT_IB_LIBRARY names) with dlopen and dlvsym, as NCCL's ibvsymbols does:
 * versioned look-ups pick the ABI weft was written against even when a newer
 * library also exports older compatibility versions of a name. */
#include "ibv_api.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "src/base/log.h"
#include "transports/ibv/ibv_settings.h"

#define IBV_API_MAX_LIBS 4

/* verbs.h inlines these three: they reach the provider through the context's
 * ops, which is what the inline versions do, so the call still goes through
 * this table and works with any library that fills the ops. */
static int ibv_api_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                             struct ibv_send_wr **bad_wr) {
  return qp->context->ops.post_send(qp, wr, bad_wr);
}
static int ibv_api_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                             struct ibv_recv_wr **bad_wr) {
  return qp->context->ops.post_recv(qp, wr, bad_wr);
}
static int ibv_api_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
  return cq->context->ops.poll_cq(cq, num_entries, wc);
}

static struct {
  char name[256];
  ibv_api api;
} ibv_api_loaded[IBV_API_MAX_LIBS];
static int ibv_api_nloaded;
static pthread_mutex_t ibv_api_lock = PTHREAD_MUTEX_INITIALIZER;

static void *ibv_api_sym(void *handle, const char *name, const char *version) {
  return dlvsym(handle, name, version);
}

/* Required symbols: a library without one of them is not usable. */
#define IBV_API_REQUIRED(api, handle, member, symbol, version, missing) \
  do {                                                                  \
    *(void **)&(api)->member = ibv_api_sym(handle, symbol, version);    \
    if (!(api)->member && !*(missing)) *(missing) = symbol "@" version; \
  } while (0)

static const char *ibv_api_fill(void *h, ibv_api *api) {
  const char *missing = NULL;
  IBV_API_REQUIRED(api, h, get_device_list, "ibv_get_device_list", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, free_device_list, "ibv_free_device_list", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, get_device_name, "ibv_get_device_name", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, open_device, "ibv_open_device", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, close_device, "ibv_close_device", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, query_device, "ibv_query_device", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, query_port, "ibv_query_port", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, query_gid, "ibv_query_gid", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, reg_mr, "ibv_reg_mr", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, create_cq, "ibv_create_cq", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, create_qp, "ibv_create_qp", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, modify_qp, "ibv_modify_qp", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, get_async_event, "ibv_get_async_event", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, fork_init, "ibv_fork_init", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, wc_status_str, "ibv_wc_status_str", "IBVERBS_1.1", &missing);
  IBV_API_REQUIRED(api, h, event_type_str, "ibv_event_type_str", "IBVERBS_1.1", &missing);
  *(void **)&api->query_gid_ex = ibv_api_sym(h, "_ibv_query_gid_ex", "IBVERBS_1.11");
  *(void **)&api->reg_dmabuf_mr = ibv_api_sym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  *(void **)&api->is_fork_initialized = ibv_api_sym(h, "ibv_is_fork_initialized", "IBVERBS_1.13");
  api->post_send = ibv_api_post_send;
  api->post_recv = ibv_api_post_recv;
  api->poll_cq = ibv_api_poll_cq;
  return missing;
}

/* Registered memory shared with a forked child would be copied on write
 * under the NIC's feet: ask for fork safety before any memory is registered,
 * unless the kernel already provides it (Linux >= 5.13 copies pinned pages). */
static void ibv_api_fork_safety(const ibv_api *api) {
  if (api->is_fork_initialized && api->is_fork_initialized() == IBV_FORK_UNNEEDED) return;
  int rc = api->fork_init();
  if (rc)
    WEFT_WARN(WEFT_SUBSYS_NET,
              "ibv: ibv_fork_init failed (%s): a fork() after registration may corrupt data",
              strerror(rc));
}

const ibv_api *ibv_api_load(weft_error_sink *err) {
  const char *name = ibv_settings()->library;
  if (!*name) name = "libibverbs.so.1";
  const ibv_api *found = NULL;
  pthread_mutex_lock(&ibv_api_lock);
  for (int i = 0; i < ibv_api_nloaded && !found; i++)
    if (!strcmp(ibv_api_loaded[i].name, name)) found = &ibv_api_loaded[i].api;
  if (found) goto done;
  if (ibv_api_nloaded == IBV_API_MAX_LIBS) {
    weft_error_sink_set(err, "ibv: too many different WEFT_IB_LIBRARY values in one process");
    goto done;
  }
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    weft_error_sink_set(err,
                        "ibv: cannot load %s (%s): install rdma-core's libibverbs to use "
                        "RDMA",
                        name, why ? why : "not found");
    goto done;
  }
  ibv_api api = {0};
  const char *missing = ibv_api_fill(h, &api);
  if (missing) {
    weft_error_sink_set(err, "ibv: %s lacks %s: rdma-core is too old or this is not libibverbs",
                        name, missing);
    dlclose(h);
    goto done;
  }
  int slot = ibv_api_nloaded++;
  snprintf(ibv_api_loaded[slot].name, sizeof ibv_api_loaded[slot].name, "%s", name);
  api.library = ibv_api_loaded[slot].name;
  ibv_api_loaded[slot].api = api;
  found = &ibv_api_loaded[slot].api;
  ibv_api_fork_safety(found);
  WEFT_INFO(WEFT_SUBSYS_NET, "ibv: loaded %s", name);
done:
  pthread_mutex_unlock(&ibv_api_lock);
  return found;
}
