/* transport.c - the stubs of transport.h for members a transport does not
 * support, so the core never tests a member for NULL. */
#include "transports/transport.h"

weft_status weft_tp_no_register(weft_tp_ctx *ctx, const weft_mem_region *region,
                                weft_tp_mem *handle, weft_mem_desc *desc) {
  (void)ctx;
  (void)desc;
  handle->region = *region;
  handle->region.kind = WEFT_MEMORY_COUNT; /* nothing registered: deregister is a no-op */
  handle->priv[0] = handle->priv[1] = 0;
  return WEFT_ERR_UNSUPPORTED;
}

void weft_tp_no_deregister(weft_tp_ctx *ctx, weft_tp_mem *handle) {
  (void)ctx;
  handle->region.kind = WEFT_MEMORY_COUNT;
}

void weft_tp_no_release(weft_tp_conn *conn, bool kept_too) {
  (void)conn;
  (void)kept_too;
}

weft_status weft_tp_no_map(weft_tp_conn *conn, const weft_mem_desc *desc, void **local) {
  (void)conn;
  (void)desc;
  *local = NULL;
  return WEFT_ERR_UNSUPPORTED;
}

bool weft_tp_no_device_channel(const void *peer_addr, size_t addr_len) {
  (void)peer_addr, (void)addr_len;
  return false;
}
