#!/bin/sh
# check_doc_pointers.sh - every pointer a comment in src/ or transports/ makes
# into docs/tuning.md names a heading that exists there.
#
# Comments keep why and point at docs/tuning.md for the figures, as
# (docs/tuning.md, "Title"), a title that may run over several comment
# lines; choose.c's rules name theirs as .why = "Title". Each title must be
# the exact text of a ##, ### or #### heading of docs/tuning.md, or the
# pointer leads nowhere once a heading is renamed.
#
# Usage: sh tools/check_doc_pointers.sh [TREE]
# TREE defaults to this script's tree. Prints each dangling pointer as
# file: "title"; exit status 0 when none, 1 otherwise, 2 without the doc.
set -eu

tree=${1:-$(dirname "$0")/..}
doc="$tree/docs/tuning.md"
[ -r "$doc" ] || { echo "check_doc_pointers: cannot read $doc" >&2; exit 2; }

headings=$(sed -n 's/^###* \(.*[^ ]\) *$/\1/p' "$doc")

bad=0
pointers=$(find "$tree/src" "$tree/transports" -type f \( -name '*.c' -o -name '*.h' \) | sort |
  while IFS= read -r f; do
    # One line per file: comment prefixes ("/*", " * ", "//") dropped, lines
    # joined with a space, so a title that wraps reads whole.
    awk -v file="${f#"$tree"/}" '
      { line = $0
        sub(/^[ \t]*(\/\*+|\*+|\/\/+)?[ \t]*/, "", line)
        sub(/[ \t]+$/, "", line)
        all = all " " line }
      END {
        gsub(/[ \t]+/, " ", all)
        rest = all
        while (match(rest, /docs\/tuning\.md, "[^"]*"/)) {
          t = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
          sub(/^[^"]*"/, "", t); sub(/"$/, "", t)
          print file "\t" t
        }
        rest = all
        while (match(rest, /\.why = "[^"]*"/)) {
          t = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
          sub(/^[^"]*"/, "", t); sub(/"$/, "", t)
          print file "\t" t
        }
      }' "$f"
  done)

n=0
tab=$(printf '\t')
while IFS="$tab" read -r file title; do
  [ -n "$file" ] || continue
  n=$((n + 1))
  if ! printf '%s\n' "$headings" | grep -Fqx -- "$title"; then
    echo "$file: \"$title\" is no heading of docs/tuning.md"
    bad=1
  fi
done <<EOF
$pointers
EOF

if [ "$bad" -ne 0 ]; then exit 1; fi
echo "check_doc_pointers: $n pointers into docs/tuning.md, each names a heading"
