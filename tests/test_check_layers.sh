#!/bin/sh
# test_check_layers.sh - the layer check can fail: on a small tree of its own
# it must pass a downward include and a known (listed) upward one, and reject
# an unlisted upward include (exit 1, naming file:line and both layers), a
# file in no layer (exit 2), a circle of includes, and, on a library built
# from the tree, a circle of calls between two files of one layer (exit 1,
# naming both files and the symbols).
# Usage: test_check_layers.sh CHECK_LAYERS.SH
set -u
check=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$tmp/src/base" "$tmp/src/comm" "$tmp/src/coll" "$tmp/transports/tcp" "$tmp/tools"
echo '#include "weft.h"' > "$tmp/src/base/a.h"
printf '#include "src/base/a.h"\n#include "tcp.h"\n' > "$tmp/transports/tcp/tcp_conn.c"
echo '#include "transports/tcp/tcp.h"' > "$tmp/transports/tcp/tcp.h"
echo '#include "src/coll/c.h"' > "$tmp/src/comm/b.h"
echo '' > "$tmp/src/coll/c.h"
: > "$tmp/tools/check_layers.allow"
sh "$check" "$tmp" > "$tmp/out" 2>&1 || fail "a clean tree was rejected: $(cat "$tmp/out")"

# a planted upward include
echo '#include "src/comm/b.h"' >> "$tmp/src/coll/c.h"
sh "$check" "$tmp" > "$tmp/out" 2>&1
[ $? -eq 1 ] || fail "an upward include passed: $(cat "$tmp/out")"
grep -q 'src/coll/c.h:2: .*layer coll.*src/comm/b.h (layer comm)' "$tmp/out" ||
  fail "the message does not name file:line and both layers: $(cat "$tmp/out")"

echo 'src/coll/c.h src/comm/b.h listed for the test' > "$tmp/tools/check_layers.allow"
sh "$check" "$tmp" > "$tmp/out" 2>&1 || fail "a listed include was rejected: $(cat "$tmp/out")"

echo '#include "src/base/a.h"' > "$tmp/transports/tcp/tcp_transport.c"
echo '#include "transports/tcp/tcp.h"' >> "$tmp/src/base/a.h"
sh "$check" "$tmp" > "$tmp/out" 2>&1
[ $? -eq 1 ] || fail "base including a transport passed: $(cat "$tmp/out")"
echo '#include "weft.h"' > "$tmp/src/base/a.h"
sh "$check" "$tmp" > "$tmp/out" 2>&1 || fail "the tree, put back, was rejected: $(cat "$tmp/out")"

# a planted circle of includes within one layer (guards make it compile)
printf '#include "src/coll/d.h"\n' > "$tmp/src/coll/e.h"
printf '#include "src/coll/c.h"\n#include "src/coll/e.h"\n' > "$tmp/src/coll/d.h"
echo '#include "src/coll/d.h"' >> "$tmp/src/coll/c.h"
sh "$check" "$tmp" > "$tmp/out" 2>&1
[ $? -eq 1 ] || fail "a circle of includes passed: $(cat "$tmp/out")"
grep -q 'circle of includes among 3 files: src/coll/c.h src/coll/d.h src/coll/e.h' "$tmp/out" ||
  fail "the circle of includes is not named with its files: $(cat "$tmp/out")"
grep -q 'src/coll/d.h -> src/coll/c.h (#include at line 1)' "$tmp/out" ||
  fail "the way around the circle is not shown: $(cat "$tmp/out")"
rm "$tmp/src/coll/e.h" "$tmp/src/coll/d.h"
printf '\n#include "src/comm/b.h"\n' > "$tmp/src/coll/c.h"

mkdir -p "$tmp/src/nowhere"
: > "$tmp/src/nowhere/x.c"
sh "$check" "$tmp" > "$tmp/out" 2>&1
[ $? -eq 2 ] || fail "a file in no layer passed: $(cat "$tmp/out")"
rm -r "$tmp/src/nowhere"

# a planted circle of calls: two files of one layer, each calling the other,
# built as meson would name their objects. The include graph has no circle
# (each declares what it uses by hand), so only the library shows it.
cc=${CC:-cc}
for tool in "$cc" ar nm; do
  command -v "$tool" >/dev/null || { echo "SKIP: no $tool: the circle of calls is not tested"; exit 77; }
done
build="$tmp/build"
mkdir -p "$build"
cat > "$tmp/src/coll/ask.c" <<'C'
int coll_answer(int x);
int coll_ask(int x) { return x > 0 ? coll_answer(x - 1) : 0; }
C
cat > "$tmp/src/coll/answer.c" <<'C'
int coll_ask(int x);
int coll_answer(int x) { return coll_ask(x); }
C
cat > "$tmp/src/comm/user.c" <<'C'
int coll_ask(int x);
int comm_user(void) { return coll_ask(3); }
C
objects() {
  rm -f "$build"/*.o "$build/libweft.a"
  for f in "$@"; do
    o=$(echo "$f" | tr / _).o
    (cd "$tmp" && "$cc" -c "$f" -o "$build/$o") || fail "could not compile $f"
  done
  ar rcs "$build/libweft.a" "$build"/*.o
}
objects src/coll/ask.c src/comm/user.c
sh "$check" "$tmp" "$build/libweft.a" > "$tmp/out" 2>&1 ||
  fail "a library with calls pointing one way was rejected: $(cat "$tmp/out")"
grep -q 'no circle of calls' "$tmp/out" || fail "the calls were not searched: $(cat "$tmp/out")"
objects src/coll/ask.c src/coll/answer.c src/comm/user.c
sh "$check" "$tmp" "$build" > "$tmp/out" 2>&1
[ $? -eq 1 ] || fail "a circle of calls passed: $(cat "$tmp/out")"
grep -q 'circle of calls among 2 files: src/coll/answer.c src/coll/ask.c' "$tmp/out" ||
  fail "the circle of calls is not named with its files: $(cat "$tmp/out")"
grep -q 'src/coll/ask.c -> src/coll/answer.c (coll_answer)' "$tmp/out" &&
  grep -q 'src/coll/answer.c -> src/coll/ask.c (coll_ask)' "$tmp/out" ||
  fail "the circle's steps do not name the symbols: $(cat "$tmp/out")"
sh "$check" "$tmp" "$build/nothing.a" > "$tmp/out" 2>&1
[ $? -eq 2 ] || fail "a missing library passed: $(cat "$tmp/out")"
echo "ok"
