/* fuzz_shm_segment.c - the header of a pair segment as the opening rank
 * reads it from shared memory its peer wrote (shm_segment_parse,
 * shm_segment_check). Input: 1 byte of slot count, then the header. */
#include <stdint.h>
#include <string.h>

#include "transports/shm/shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint32_t nslots = 2 + data[0] % (SHM_MAX_SLOTS - 1);
  uint64_t slot_bytes = 4096;
  shm_segment_info info;
  if (shm_segment_parse(data + 1, size - 1, &info) != WEFT_OK) return 0;
  size_t mapped = shm_segment_bytes((int)nslots, slot_bytes);
  if (!shm_segment_check(&info, nslots, slot_bytes, mapped)) {
    /* accepted: the FIFOs it describes lie inside the mapping */
    if (info.nslots == 0 || info.nslots > SHM_MAX_SLOTS ||
        shm_segment_bytes((int)info.nslots, info.slot_bytes) > mapped)
      __builtin_trap();
  }
  return 0;
}
