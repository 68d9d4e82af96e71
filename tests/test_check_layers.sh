#!/bin/sh
# test_check_layers.sh - the layer check can fail: on a small tree of its own
# it must pass a downward include and a known (listed) upward one, and reject
# an unlisted upward include (exit 1, naming file:line and both layers) and a
# file in no layer (exit 2).
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

mkdir -p "$tmp/src/nowhere"
: > "$tmp/src/nowhere/x.c"
sh "$check" "$tmp" > "$tmp/out" 2>&1
[ $? -eq 2 ] || fail "a file in no layer passed: $(cat "$tmp/out")"
echo "ok"
