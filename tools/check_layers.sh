#!/bin/sh
# check_layers.sh - rejects an #include that points up the layers.
#
# The library is built in layers, each a folder, lowest first:
#   base < topo < mem < transports < link < algo < coll < engine < comm < api < grad
# A file may include its own layer and the layers below it, and weft.h (the
# public header) from anywhere; a lower layer that needs something from a
# higher one gets it passed down (a function pointer), never by #include.
# tools/, tests/ and examples/ sit above everything and are not scanned.
#
# Every #include "..." in src/ and transports/ is checked; a violation prints
# file:line, what it includes and both layers. Pairs listed in
# tools/check_layers.allow (file, included file, reason) are reported as
# known and tolerated until the work that removes them lands; a listed pair
# that no longer occurs is reported so the list only shrinks.
# Exit status: 0 clean, 1 a violation, 2 a file in no layer.
# Run by the test suite (meson test layers) and by hand: sh tools/check_layers.sh
# An argument names another tree to check (tests/test_check_layers.sh does).
set -eu

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

awk -v allow_file="tools/check_layers.allow" '
function layer_of(path,    parts) {
  if (path == "weft.h" || path == "include/weft.h") return "public"
  if (path ~ /^transports\//) return "transports"
  if (path ~ /^src\//) { split(path, parts, "/"); return parts[2] }
  return ""
}
function exists(path,    line, r) {
  r = (getline line < path)
  if (r >= 0) close(path)
  return r >= 0
}
BEGIN {
  n = split("base topo mem transports link algo coll engine comm api grad", order, " ")
  for (i = 1; i <= n; i++) rank[order[i]] = i
  rank["public"] = 0
  while ((getline line < allow_file) > 0) {
    if (line ~ /^[ \t]*(#|$)/) continue
    split(line, f, /[ \t]+/)
    allowed[f[1] " " f[2]] = 1
  }
  bad = 0; unplaced = 0; known = 0
  for (i = 1; i < ARGC; i++) if (!(layer_of(ARGV[i]) in rank)) {
    printf "%s: in no layer (add its folder to the order in tools/check_layers.sh)\n", ARGV[i]
    unplaced = 1
  }
}
FNR == 1 {
  file = FILENAME
  dir = file; sub(/\/[^\/]*$/, "", dir)
  from = layer_of(file)
}
/^[ \t]*#[ \t]*include[ \t]*"/ {
  inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
  target = inc
  if (inc != "weft.h" && !exists(inc) && exists(dir "/" inc)) target = dir "/" inc
  to = layer_of(target)
  if (!(to in rank)) {
    printf "%s:%d: includes \"%s\", which is in no layer\n", file, FNR, inc
    unplaced = 1
    next
  }
  if (!(from in rank) || rank[to] <= rank[from]) next
  key = file " " target
  if (key in allowed) {
    seen[key] = 1
    printf "%s:%d: known: %s (%s) includes %s (%s)\n", file, FNR, file, from, target, to
    known++
    next
  }
  printf "%s:%d: %s (layer %s) includes %s (layer %s), which is above it\n", file, FNR, file, from, target, to
  bad++
}
END {
  for (k in allowed) if (!(k in seen))
    printf "tools/check_layers.allow: \"%s\" no longer occurs: remove it\n", k
  if (bad) printf "%d upward include(s); a lower layer gets what it needs passed down\n", bad
  else printf "layers: no new upward include (%d known, listed in %s)\n", known, allow_file
  exit unplaced ? 2 : bad ? 1 : 0
}' $(find src transports -type f \( -name '*.c' -o -name '*.h' \) | LC_ALL=C sort)
