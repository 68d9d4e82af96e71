/* transport.c - the helpers transport.h declares for every transport. */
#include "transports/transport.h"

weft_status weft_transport_no_map(weft_conn *conn, const weft_mem_key *key, void **local) {
  (void)conn;
  (void)key;
  *local = NULL;
  return WEFT_ERR_UNSUPPORTED;
}
