/* dtype.c - what the public element types and operations are called and how
 * large an element is. Public (weft.h), and here at the bottom because every
 * layer above asks. */
#include "weft.h"

WEFT_API size_t weft_dtype_size(weft_dtype dtype) {
  static const size_t sizes[WEFT_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8};
  return (unsigned)dtype < WEFT_DTYPE_COUNT ? sizes[dtype] : 0;
}

WEFT_API const char *weft_dtype_name(weft_dtype dtype) {
  static const char *names[WEFT_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16",
                                                "i8",  "u8",  "i32", "i64"};
  return (unsigned)dtype < WEFT_DTYPE_COUNT ? names[dtype] : "unknown";
}

WEFT_API const char *weft_op_name(weft_op op) {
  static const char *names[WEFT_OP_COUNT] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < WEFT_OP_COUNT ? names[op] : "unknown";
}
