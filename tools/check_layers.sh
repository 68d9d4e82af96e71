#!/bin/sh
# check_layers.sh - rejects an #include that points up the layers, and any
# circle among files: of includes, or of calls in the built library.
#
# The library is built in layers, each a folder, lowest first:
#   base < topo < mem < transports < link < algo < coll < engine < elastic < comm < api < grad
# A file may include its own layer and the layers below it, and weft.h (the
# public header) from anywhere; a lower layer that needs something from a
# higher one gets it passed down (a function pointer), never by #include.
# tools/, tests/ and examples/ sit above everything and are not scanned.
#
# Every #include "..." in src/ and transports/ (.c, .h and .cu: src/cuda/ sits
# at the mem layer, kernels.cu included) is checked; a violation prints
# file:line, what it includes and both layers. Pairs listed in
# tools/check_layers.allow (file, included file, reason) are reported as
# known and tolerated until the work that removes them lands; a listed pair
# that no longer occurs is reported so the list only shrinks.
#
# Within a layer too, uses point one way: two files that need each other
# are one design split in two (a third file takes the shared part, or one
# gets a function pointer). Two graphs are searched for circles:
#  - includes among the files of src/ and transports/ (from the scan above);
#  - "file A uses a symbol file B defines", from nm on the built static
#    library (LIBRARY; a build directory stands for its libweft.a). nm sees
#    what the linker sees: every call and reference between objects, whatever
#    header declared it, an extern written by hand, a function an X-macro
#    made; a scan of the sources would have to guess which .c defines what a
#    header declares. Static functions and static inline ones in headers make
#    no edge (they belong to their file), nor do sources this build leaves
#    out. meson names an object after its source (src/engine/p2p.c becomes
#    src_engine_p2p.c.o), which gives back the file.
# Each circle is printed with its files, one path around it and what each
# step uses (the include's line, or the symbols).
#
# Usage: sh tools/check_layers.sh [TREE [LIBRARY]]
# TREE defaults to this script's tree; without LIBRARY the circles of calls
# are not searched (said on the last line). The test suite passes both
# (meson test layers); tests/test_check_layers.sh runs it on planted trees.
# Exit status: 0 clean, 1 an upward include or a circle, 2 a file in no
# layer, or a LIBRARY that cannot be read.
set -eu

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
lib=${2:-}
if [ -n "$lib" ]; then
  [ -d "$lib" ] && lib=$lib/libweft.a
  case $lib in /*) ;; *) lib=$(pwd)/$lib ;; esac
  [ -f "$lib" ] || { echo "check_layers: no library at $lib"; exit 2; }
  command -v nm >/dev/null || { echo "check_layers: nm is not installed (binutils)"; exit 2; }
fi
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
find src transports -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | LC_ALL=C sort > "$tmp/files"

# ---- upward includes (and the include graph, for the circles) -------------
status=0
awk -v allow_file="tools/check_layers.allow" -v edges="$tmp/edges" '
function layer_of(path,    parts) {
  if (path == "weft.h" || path == "include/weft.h") return "public"
  if (path ~ /^transports\//) return "transports"
  # the CUDA driver table and device memory sit beside the host memory table
  if (path ~ /^src\/cuda\//) return "mem"
  if (path ~ /^src\//) { split(path, parts, "/"); return parts[2] }
  return ""
}
function exists(path,    line, r) {
  r = (getline line < path)
  if (r >= 0) close(path)
  return r >= 0
}
BEGIN {
  n = split("base topo mem transports link algo coll engine elastic comm api grad", order, " ")
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
  key = file " " target
  # a listed (tolerated) include is reported as known below, not again as a circle
  if (to != "public" && target != file && !(key in allowed))
    printf "%s %s #include at line %d\n", file, target, FNR > edges
  if (!(from in rank) || rank[to] <= rank[from]) next
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
}' $(cat "$tmp/files") || status=$?
[ -f "$tmp/edges" ] || : > "$tmp/edges"

# ---- circles ---------------------------------------------------------------
# One graph per run of the awk below: lines "FROM TO LABEL...", sorted so
# that what it prints does not depend on awk's order of keys.
circles() { # KIND FILE: exit 1 when the graph in FILE has a circle
  LC_ALL=C sort -u "$2" | awk -v kind="$1" '
  # Tarjan: each strongly connected component of more than one file is a circle.
  function strong(v,    i, w, n, comp) {
    ix[v] = low[v] = ++count
    stack[++sp] = v; on[v] = 1
    for (i = 1; i <= deg[v]; i++) {
      w = adj[v, i]
      if (!(w in ix)) { strong(w); if (low[w] < low[v]) low[v] = low[w] }
      else if (on[w] && ix[w] < low[v]) low[v] = ix[w]
    }
    if (low[v] != ix[v]) return
    n = 0
    do { w = stack[sp--]; on[w] = 0; comp[++n] = w } while (w != v)
    if (n > 1) report(comp, n)
  }
  # Prints the circle: its files, and the shortest way around it from the
  # first of them (breadth first, within the circle).
  function report(comp, n,    i, s, q, head, tail, v, w, prev, inside, path, names, k) {
    found++
    s = comp[1]
    for (i = 1; i <= n; i++) { inside[comp[i]] = 1; if (comp[i] < s) s = comp[i] }
    # sorted, so that the message is the same in every run
    for (i = 2; i <= n; i++)
      for (k = i; k > 1 && comp[k] < comp[k - 1]; k--) { v = comp[k]; comp[k] = comp[k - 1]; comp[k - 1] = v }
    names = ""
    for (i = 1; i <= n; i++) names = names " " comp[i]
    printf "circle of %s among %d files:%s\n", kind, n, names
    head = 1; tail = 0; q[++tail] = s
    while (head <= tail) {
      v = q[head++]
      for (i = 1; i <= deg[v]; i++) {
        w = adj[v, i]
        if (!(w in inside)) continue
        if (w == s) { prev[s] = v; head = tail + 1; break }
        if (w in prev) continue
        prev[w] = v; q[++tail] = w
      }
    }
    # prev leads backwards from s around to s: path[1] = s, path[2] the
    # file before s, ...; forwards that is s, path[k], ..., path[2], s
    k = 0; v = s
    do { path[++k] = v; v = prev[v] } while (v != s)
    for (i = 1; i <= k; i++) {
      v = i == 1 ? s : path[k - i + 2]
      w = i == k ? s : path[k - i + 1]
      printf "  %s -> %s (%s)\n", v, w, label[v, w]
    }
  }
  {
    from = $1; to = $2
    if (from == to) next
    what = $0; sub(/^[^ ]+ [^ ]+ /, "", what)
    if (!((from, to) in label)) {
      adj[from, ++deg[from]] = to
      label[from, to] = what
      if (!(from in node)) { node[from] = 1; nodes[++nn] = from }
      if (!(to in node)) { node[to] = 1; nodes[++nn] = to }
    } else if (length(label[from, to]) < 120) {
      label[from, to] = label[from, to] ", " what
    }
  }
  END {
    for (i = 1; i <= nn; i++) if (!(nodes[i] in ix)) strong(nodes[i])
    if (found) printf "%d circle(s) of %s: a third file takes the shared part, or one side gets a function pointer\n", found, kind
    else printf "layers: no circle of %s (%d files)\n", kind, nn
    exit found ? 1 : 0
  }'
}

circles includes "$tmp/edges" || [ "$status" -ne 0 ] || status=1

if [ -n "$lib" ]; then
  # object name -> file: src/engine/p2p.c is src_engine_p2p.c.o
  awk '/\.c$/ { o = $0; gsub(/\//, "_", o); print o ".o", $0 }' "$tmp/files" > "$tmp/objects"
  nm -A "$lib" 2>/dev/null | awk -v objects="$tmp/objects" '
  BEGIN { while ((getline line < objects) > 0) { split(line, f, " "); file[f[1]] = f[2] } }
  {
    # "LIB:OBJECT:ADDRESS TYPE SYMBOL", or "LIB:OBJECT: U SYMBOL" for a use
    head = $1; sub(/:[^:]*$/, "", head); obj = head; sub(/^.*:/, "", obj)
    if (obj in file) obj = file[obj]
    if ($2 == "U") { nuse++; use_obj[nuse] = obj; use_sym[nuse] = $3; next }
    if ($2 ~ /^[TDBRGSCVW]$/) def[$3] = obj
  }
  END {
    for (k = 1; k <= nuse; k++) {
      s = use_sym[k]
      if ((s in def) && def[s] != use_obj[k]) print use_obj[k], def[s], s
    }
  }' > "$tmp/calls"
  [ -s "$tmp/calls" ] || { echo "check_layers: no references between objects in $lib"; exit 2; }
  circles calls "$tmp/calls" || [ "$status" -ne 0 ] || status=1
else
  echo "layers: circles of calls not searched (pass the built libweft.a or its build directory)"
fi
exit $status
