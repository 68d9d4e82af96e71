/* bytes.h - fixed-width integers in and out of messages, little-endian
 * whatever the host's order: the control plane's frames (src/elastic), the
 * agreement's and the recovery's payloads (src/comm). */
#ifndef WEFT_BYTES_H
#define WEFT_BYTES_H

#include <stdint.h>

static inline void weft_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t weft_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline void weft_put64(uint8_t *p, uint64_t v) {
  weft_put32(p, (uint32_t)v);
  weft_put32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t weft_get64(const uint8_t *p) {
  return weft_get32(p) | (uint64_t)weft_get32(p + 4) << 32;
}

#endif
