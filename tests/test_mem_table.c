/* test_mem_table.c - the memory table's members beyond copy and reduce, on
 * the host table: kinds, the asynchronous members (done at once, token 0,
 * polled done), copies between kinds, and allocation of slots and scratch.
 * Results are checked against sums computed here, not by the kernels. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "src/mem/mem.h"

static void kinds(void **state) {
  (void)state;
  assert_ptr_equal(weft_mem_by_kind(WEFT_MEMORY_HOST), &weft_mem_host);
  assert_ptr_equal(weft_mem_by_kind(WEFT_MEMORY_SHARED), &weft_mem_host); /* host to the CPU */
  assert_null(weft_mem_by_kind(WEFT_MEMORY_DEVICE)); /* no CUDA table in this build */
  assert_null(weft_mem_by_kind(WEFT_MEMORY_DMABUF));
  assert_int_equal(weft_mem_host.kind, WEFT_MEMORY_HOST);
  assert_int_equal(WEFT_MEMORY_BIT(WEFT_MEMORY_SHARED), 4);
}

static void async_members(void **state) {
  (void)state;
  const weft_mem_ops *m = &weft_mem_host;
  weft_mem_stream *s = (weft_mem_stream *)1; /* must be overwritten */
  assert_int_equal(m->stream_create(&s, NULL), WEFT_OK);
  assert_null(s);
  assert_int_equal(m->stream_after_user(s, NULL), WEFT_OK);
  float a[100], b[100], out[100];
  for (int i = 0; i < 100; i++) {
    a[i] = (float)i;
    b[i] = (float)(3 * i + 1);
  }
  weft_mem_token t = 99;
  assert_int_equal(m->reduce_async(out, a, b, 100, WEFT_F32, WEFT_SUM, 1, s, &t), WEFT_OK);
  assert_int_equal(t, 0);
  assert_int_equal(m->poll(s, t), WEFT_OK);
  for (int i = 0; i < 100; i++) assert_true(out[i] == (float)(4 * i + 1));
  assert_int_equal(m->reduce_async(out, a, b, 100, WEFT_F32, WEFT_AVG, 2, s, &t), WEFT_OK);
  for (int i = 0; i < 100; i++) assert_true(out[i] == (float)(4 * i + 1) / 2);
  float c[100];
  t = 7;
  assert_int_equal(m->copy_async(c, a, sizeof a, s, &t), WEFT_OK);
  assert_int_equal(t, 0);
  assert_memory_equal(c, a, sizeof a);
  memset(c, 0, sizeof c);
  assert_int_equal(m->copy_to_host(c, b, sizeof b, s, &t), WEFT_OK);
  assert_memory_equal(c, b, sizeof b);
  memset(out, 0, sizeof out);
  assert_int_equal(m->copy_from_host(out, c, sizeof c, s, &t), WEFT_OK);
  assert_memory_equal(out, b, sizeof b);
  assert_int_equal(m->record(s, &t), WEFT_OK);
  assert_int_equal(m->poll(s, t), WEFT_OK);
  assert_int_equal(m->user_wait_signal(NULL, s, 1), WEFT_OK);
  assert_int_equal(m->signal(s, 1), WEFT_OK);
  m->stream_destroy(s);
}

static void allocation(void **state) {
  (void)state;
  const weft_mem_ops *m = &weft_mem_host;
  size_t sizes[] = {0, 1, 4096, 262144 + 8};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *p = m->alloc_slots(sizes[i]);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 4096, 0);
    memset(p, 0xab, sizes[i]); /* all of it is writable */
    m->free_slots(p, sizes[i]);
    unsigned char *q = m->alloc_scratch(sizes[i]);
    assert_non_null(q);
    memset(q, 0xcd, sizes[i]);
    m->free_scratch(q);
  }
  m->free_scratch(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(kinds),
      cmocka_unit_test(async_members),
      cmocka_unit_test(allocation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
