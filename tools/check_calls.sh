#!/bin/sh
# check_calls.sh LIBWEFT.a - rejects a call that points up the layers: a
# function of a lower layer calling one defined in a higher layer (the
# include check, tools/check_layers.sh, cannot see a call made through a
# declaration in the public header, or an extern written by hand). Reads the
# symbols of the built static library with nm: an object's undefined symbol
# that another object of the library defines is a call (or a reference) from
# the first to the second. Objects are named by meson after their source
# (src_base_log.c.o, transports_tcp_tcp_conn.c.o), which gives their layer.
# The layer order is the one of tools/check_layers.sh.
# Exit status: 0 clean, 1 an upward call, 2 no library or no nm.
# Run by the test suite (meson test "layers: calls").
set -eu
lib=${1:?usage: check_calls.sh path/to/libweft.a}
command -v nm >/dev/null || { echo "check_calls: nm is not installed"; exit 2; }
[ -f "$lib" ] || { echo "check_calls: no library at $lib"; exit 2; }

nm -A "$lib" | awk '
function layer(obj,    p) {
  if (obj ~ /^transports_/) return "transports"
  if (obj ~ /^src_cuda_/) return "mem" # beside the host memory table (check_layers.sh)
  if (obj ~ /weft_kernels_fatbin/) return "mem" # the kernels nvcc made, embedded (meson.build)
  split(obj, p, "_")
  return p[2]
}
BEGIN {
  n = split("base topo mem transports link algo coll engine elastic comm api grad", order, " ")
  for (i = 1; i <= n; i++) rank[order[i]] = i
}
{
  split($1, where, ":")
  obj = where[2]; sub(/\.c\.o$/, "", obj)
  if ($2 == "U") { nuse++; use_obj[nuse] = obj; use_sym[nuse] = $3; next }
  if ($2 ~ /^[TDBR]$/) def[$3] = obj
}
END {
  bad = 0
  for (k = 1; k <= nuse; k++) {
    s = use_sym[k]
    if (!(s in def)) continue
    from = layer(use_obj[k]); to = layer(def[s])
    if (!(from in rank) || !(to in rank)) {
      printf "%s or %s: in no layer (add its folder to the order)\n", use_obj[k], def[s]
      bad++
      continue
    }
    if (rank[to] > rank[from]) {
      printf "%s (layer %s) calls %s, defined in %s (layer %s), which is above it\n", use_obj[k], from, s, def[s], to
      bad++
    }
  }
  if (bad) { printf "%d upward call(s); a lower layer gets what it needs passed down\n", bad; exit 1 }
  printf "layers: no call points up (%d references between objects checked)\n", nuse
}'
