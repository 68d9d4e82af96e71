/* weft-info - what this build of weft has and how it is set: version,
 * transports, and every WEFT_* setting with its default, current value and
 * help line (the one settings table, through the public API). */
#include <stdio.h>
#include <string.h>

#include "weft.h"

int main(int argc, char **argv) {
  int settings_only = argc > 1 && !strcmp(argv[1], "-s");
  if (argc > 1 && !settings_only) {
    fprintf(stderr, "usage: weft-info [-s]   (-s: settings only)\n");
    return 2;
  }
  if (!settings_only) {
    printf("weft %s\n", weft_version_string());
    printf("transports: tcp (built, usable)\n");
    printf("dtypes: f32 f64 f16 bf16 i8 u8 i32 i64; ops: sum prod min max avg\n\n");
  }
  printf("%-24s %-10s %-12s %s\n", "setting", "default", "value", "help");
  weft_setting_desc d;
  for (int i = 0; weft_setting_describe(i, &d) == WEFT_OK; i++)
    printf("%-24s %-10s %-12s %s\n", d.name, *d.deflt ? d.deflt : "-", *d.value ? d.value : "-",
           d.help);
  return 0;
}
