#!/bin/sh
# test.sh - the README's second command (and what .ci/run calls): install
# what is missing, build with warnings as errors, run the whole suite, then
# print one closing line "weft: N passed, M failed".
set -u
cd "$(dirname "$0")/.."
sh tools/setup-debian.sh || exit 1
dir=build-test
[ -d "$dir" ] || meson setup "$dir" --buildtype=debugoptimized -Dwerror=true -Dtests=true >/dev/null || exit 1
ninja -C "$dir" || exit 1
meson test -C "$dir" --print-errorlogs --num-processes 1 "$@"
rc=$?
log="$dir/meson-logs/testlog.json"
if [ -f "$log" ]; then
  passed=$(grep -c '"result": "OK"' "$log")
  failed=$(grep -c '"result": "\(FAIL\|TIMEOUT\|ERROR\)"' "$log")
  skipped=$(grep -c '"result": "SKIP"' "$log")
  echo "weft: $passed passed, $failed failed, $skipped skipped"
fi
exit $rc
