/* test_cuda_fatbin.c - the kernels' fatbin that nvcc made at build time is in
 * the library, whole, with the code the loader will look for: real code for
 * sm_75, sm_80 and sm_90 and PTX for compute_90 (meson.build's -gencode list).
 * No GPU needed: the container is read here, and by cuobjdump when the
 * toolkit has it (WEFT_TEST_CUOBJDUMP, set by tests/meson.build).
 *
 * The container's layout is not in the toolkit's headers (fatbinary_section.h
 * has only the wrapper's magic, 0x466243B1); what is read here is what nvcc
 * writes and cuobjdump reads, all little endian:
 *   header: u32 magic 0xBA55ED50, u16 version 1, u16 header size, u64 size
 *           of the entries that follow;
 *   entry:  u16 kind (1 PTX, 2 ELF), u16, u32 entry header size, u64 payload
 *           size, ..., u32 arch at byte 28 (75, 80, 90); the payload follows
 *           the entry's header, the next entry follows the payload.
 * An ELF payload is a cubin (e_machine EM_CUDA, 190), unless compressed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "src/cuda/kernels.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_KIND_PTX 1
#define FATBIN_KIND_ELF 2
#define EM_CUDA 190

static uint16_t le16(const unsigned char *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16;
}

static uint64_t le64(const unsigned char *p) {
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void header_is_a_fatbin(void **state) {
  (void)state;
  const unsigned char *f = weft_cuda_fatbin;
  assert_true(weft_cuda_fatbin_len > 16);
  assert_int_equal((uintptr_t)f % 8, 0); /* the driver reads the header as 64-bit words */
  if (le32(f) != FATBIN_MAGIC)
    fail_msg("the embedded fatbin starts with %08x, not the magic %08x", le32(f), FATBIN_MAGIC);
  assert_int_equal(le16(f + 4), 1);
  /* the entries fill the rest exactly: nothing cut off, nothing appended */
  assert_int_equal(le16(f + 6) + le64(f + 8), weft_cuda_fatbin_len);
}

/* Lists the entries and checks each fits; then that the archs built are there. */
static void entries_have_the_archs_built(void **state) {
  (void)state;
  const unsigned char *f = weft_cuda_fatbin;
  size_t len = weft_cuda_fatbin_len, off = le16(f + 6);
  bool elf[128] = {false}, ptx[128] = {false};
  int entries = 0;
  while (off < len) {
    if (len - off < 32)
      fail_msg("entry at %zu: %zu bytes left, less than its header", off, len - off);
    const unsigned char *e = f + off;
    uint16_t kind = le16(e);
    uint32_t head = le32(e + 4), arch = le32(e + 28);
    uint64_t payload = le64(e + 8);
    if (head < 32 || head > len - off || payload > len - off - head)
      fail_msg("entry at %zu (header %u, payload %llu) runs past the end (%zu)", off, head,
               (unsigned long long)payload, len);
    const unsigned char *p = e + head;
    static const unsigned char elf_magic[4] = {0x7f, 'E', 'L', 'F'};
    bool cubin = payload >= 20 && !memcmp(p, elf_magic, 4);
    const char *kind_name = kind == FATBIN_KIND_ELF ? "ELF" : kind == FATBIN_KIND_PTX ? "PTX" : "?";
    printf("# entry %d: %s arch %u, %llu bytes%s\n", entries, kind_name, arch,
           (unsigned long long)payload, cubin ? " (cubin)" : "");
    if (kind == FATBIN_KIND_ELF && cubin && le16(p + 18) != EM_CUDA)
      fail_msg("entry %d: an ELF for machine %u, not EM_CUDA (%d)", entries, le16(p + 18), EM_CUDA);
    if (arch < 128 && kind == FATBIN_KIND_ELF) elf[arch] = true;
    if (arch < 128 && kind == FATBIN_KIND_PTX) ptx[arch] = true;
    off += head + payload;
    entries++;
  }
  static const int real[] = {75, 80, 90};
  for (size_t i = 0; i < sizeof real / sizeof real[0]; i++)
    if (!elf[real[i]]) fail_msg("no sm_%d code in the fatbin (meson.build builds it)", real[i]);
  if (!ptx[90]) fail_msg("no compute_90 PTX in the fatbin: GPUs after sm_90 would have no code");
}

/* Whether cuobjdump's listing (`what`) of `file` has a line containing
 * `want`; 0 yes, else a reason in `why`. Asserts nothing: the caller removes
 * the file first. */
static int cuobjdump_lists(const char *tool, const char *file, const char *what, const char *want,
                           char *why, size_t why_len) {
  char cmd[4096], line[512];
  snprintf(cmd, sizeof cmd, "'%s' %s '%s' 2>&1", tool, what, file);
  FILE *p = popen(cmd, "r");
  if (!p) return snprintf(why, why_len, "popen(%s) failed", cmd), -1;
  bool found = false;
  while (fgets(line, sizeof line, p)) {
    printf("# %s", line);
    if (strstr(line, want)) found = true;
  }
  int rc = pclose(p);
  if (rc != 0) return snprintf(why, why_len, "%s exited with %d", cmd, rc), -1;
  if (!found) return snprintf(why, why_len, "%s lists no %s", cmd, want), -1;
  return 0;
}

static void cuobjdump_agrees(void **state) {
  (void)state;
  const char *tool = getenv("WEFT_TEST_CUOBJDUMP");
  if (!tool || !*tool || access(tool, X_OK)) {
    printf("# skipped: cuobjdump is not in the toolkit (WEFT_TEST_CUOBJDUMP is '%s')\n",
           tool ? tool : "");
    skip();
  }
  char file[] = "/tmp/weft_fatbin_XXXXXX", why[4200] = "";
  int fd = mkstemp(file);
  assert_true(fd >= 0);
  ssize_t n = write(fd, weft_cuda_fatbin, weft_cuda_fatbin_len);
  close(fd);
  int st = n == (ssize_t)weft_cuda_fatbin_len ? 0 : (snprintf(why, sizeof why, "short write"), -1);
  if (!st) st = cuobjdump_lists(tool, file, "--list-elf", "sm_90", why, sizeof why);
  if (!st) st = cuobjdump_lists(tool, file, "--list-ptx", "sm_90", why, sizeof why);
  unlink(file);
  if (st) fail_msg("%s", why);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(header_is_a_fatbin),
      cmocka_unit_test(entries_have_the_archs_built),
      cmocka_unit_test(cuobjdump_agrees),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
