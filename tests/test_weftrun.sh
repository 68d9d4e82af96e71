#!/bin/sh
# test_weftrun.sh - checks the weftrun launcher from the outside, as a user
# sees it: rank environment, output prefixes, exit statuses, signal forwarding,
# --timeout and usage errors. Every run is bounded by `timeout 20`.
# Usage: sh tests/test_weftrun.sh PATH/TO/weftrun

WEFTRUN=${1:?usage: sh tests/test_weftrun.sh PATH/TO/weftrun}
if [ ! -x "$WEFTRUN" ]; then
    echo "not ok - $WEFTRUN is not an executable file"
    exit 1
fi
case $WEFTRUN in /*) ;; *) WEFTRUN=$PWD/$WEFTRUN ;; esac
# A rendezvous from the caller's environment would be kept, not chosen.
unset WEFT_RENDEZVOUS
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0

pass() {
    echo "ok - $1"
}

# fail NAME: also shows what weftrun said, which is what one needs to debug it.
fail() {
    echo "not ok - $1 (exit $rc, ${elapsed}s)"
    sed 's/^/#   stdout: /' "$TMP/out" | head -20
    sed 's/^/#   stderr: /' "$TMP/err" | head -20
    failures=$((failures + 1))
}

# check NAME CONDITION...: CONDITION is a command; its success is the check.
check() {
    name=$1
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}

# run ARGS...: runs weftrun; sets $rc and $elapsed (seconds), output in out/err.
# -k 5: a weftrun that forwards SIGTERM to ranks ignoring it would outlive a
# plain `timeout 20`.
run() {
    start=$(date +%s)
    timeout -k 5 20 "$WEFTRUN" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    elapsed=$(($(date +%s) - start))
}

# same FILE TEXT: the lines of FILE, sorted, are exactly TEXT.
same_sorted() {
    sort "$1" >"$TMP/sorted"
    printf '%s\n' "$2" | cmp -s - "$TMP/sorted"
}

# ---- environment ----

env_is_right() {
    [ "$rc" = 0 ] || return 1
    # Fields: WEFT_RANK WEFT_SIZE WEFT_RENDEZVOUS RANK MASTER_PORT.
    sed 's/^\[[ 0-9]*\] //' "$TMP/out" | sort -n | awk '
        { if ($1 != NR - 1 || $2 != 4 || $4 != $1) bad = 1
          if (NR == 1) rendezvous = $3
          if ($3 != rendezvous) bad = 1
          if (split($3, host_port, ":") != 2 || host_port[1] != "127.0.0.1") bad = 1
          if (host_port[2] !~ /^[0-9]+$/ || $5 != host_port[2]) bad = 1 }
        END { exit bad || NR != 4 }'
}
run -n 4 sh -c 'echo $WEFT_RANK $WEFT_SIZE $WEFT_RENDEZVOUS $RANK $MASTER_PORT'
check "4 ranks see WEFT_RANK 0..3, WEFT_SIZE 4, one 127.0.0.1 rendezvous, RANK, MASTER_PORT" \
    env_is_right

run -n 3 sh -c 'echo $WEFT_LOCAL_RANK $WEFT_LOCAL_SIZE $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR'
check "local and torchrun variables are set" same_sorted "$TMP/out" "[0] 0 3 0 3 3 127.0.0.1
[1] 1 3 1 3 3 127.0.0.1
[2] 2 3 2 3 3 127.0.0.1"

export WEFT_RENDEZVOUS=10.1.2.3:4567
run -n 2 sh -c 'echo $WEFT_RENDEZVOUS $MASTER_ADDR $MASTER_PORT'
unset WEFT_RENDEZVOUS
check "a preset WEFT_RENDEZVOUS is kept and gives MASTER_ADDR/MASTER_PORT" \
    same_sorted "$TMP/out" "[0] 10.1.2.3:4567 10.1.2.3 4567
[1] 10.1.2.3:4567 10.1.2.3 4567"

for form in "-n4" "-n 4" "--np 4" "--np=4"; do
    # $form is split into words on purpose.
    run $form sh -c 'echo $WEFT_SIZE'
    check "'$form' starts 4 ranks" same_sorted "$TMP/out" "[0] 4
[1] 4
[2] 4
[3] 4"
done

run -n 2 -- sh -c 'printf "%s\n" "$1"' prog -n
check "options after PROG and after -- are PROG's" same_sorted "$TMP/out" "[0] -n
[1] -n"

run true
check "without -n one rank runs, and all-zero exits give 0" \
    [ "$rc" = 0 -a ! -s "$TMP/out" -a ! -s "$TMP/err" ]

# ---- output ----

run -n 11 sh -c 'echo "line $WEFT_RANK"; echo "err $WEFT_RANK" >&2'
awk 'BEGIN { for (r = 0; r < 11; r++) printf "[%2d] line %d\n", r, r }' | sort >"$TMP/want"
check "stdout lines carry the rank prefix, padded to the width of N-1" \
    same_sorted "$TMP/out" "$(cat "$TMP/want")"
awk 'BEGIN { for (r = 0; r < 11; r++) printf "[%2d] err %d\n", r, r }' | sort >"$TMP/want"
check "stderr lines carry the rank prefix too" same_sorted "$TMP/err" "$(cat "$TMP/want")"

lines_never_mix() {
    [ "$rc" = 0 ] && awk '
        { rank = substr($0, 2, 1)
          if ($0 !~ /^\[[0-3]\] rank [0-3] line [0-9]+$/ || $3 != rank) bad = 1
          if ($5 != next_line[rank] + 0) bad = 1
          next_line[rank]++ }
        END { exit bad || NR != 2000 }' "$TMP/out"
}
run -n 4 sh -c 'i=0; while [ $i -lt 500 ]; do echo "rank $WEFT_RANK line $i"; i=$((i + 1)); done'
check "lines of ranks writing at once never mix, and none is lost" lines_never_mix

run -n 2 --no-prefix sh -c 'echo "plain $WEFT_RANK"'
check "--no-prefix writes lines as they are" same_sorted "$TMP/out" "plain 0
plain 1"

run -n 2 sh -c 'printf "tail $WEFT_RANK"'
check "a last line without newline is still written, with its prefix" \
    same_sorted "$TMP/out" "[0] tail 0
[1] tail 1"

long_line_is_split() {
    [ "$rc" = 0 ] && awk '
        { if (substr($0, 1, 4) != "[0] " || substr($0, 5) !~ /^x+$/) bad = 1
          total += length($0) - 4 }
        END { exit bad || total != 50000 || NR < 2 }' "$TMP/out"
}
run sh -c "awk 'BEGIN { for (i = 0; i < 50000; i++) printf \"x\"; print \"\" }'"
check "a 50000-byte line is split into prefixed pieces, nothing lost" long_line_is_split

# ---- failures ----

# Under 4 s, not just under 10: it is SIGTERM that stops the sleepers, not
# the SIGKILL that follows 5 s later.
rank_failure_stops_the_rest() {
    [ "$rc" = 3 ] && [ "$elapsed" -lt 4 ] &&
        grep -q '^weftrun: rank 1 exited with status 3' "$TMP/err"
}
run -n 3 sh -c 'if [ "$WEFT_RANK" = 1 ]; then exit 3; fi; exec sleep 100'
check "rank 1 exiting 3 gives exit 3, and the sleeping ranks are stopped in < 4 s" \
    rank_failure_stops_the_rest

# The sleepers ignore SIGTERM (exec keeps it ignored): only the SIGKILL 5 s
# later ends them. Rank 1 fails only once they are ready, or SIGTERM could
# come before their trap.
export READY_DIR="$TMP"
rm -f "$TMP"/ready.*
run -n 3 sh -c 'trap "" TERM
    if [ "$WEFT_RANK" = 1 ]; then
        until [ -e "$READY_DIR/ready.0" ] && [ -e "$READY_DIR/ready.2" ]; do sleep 0.05; done
        exit 3
    fi
    touch "$READY_DIR/ready.$WEFT_RANK"
    exec sleep 100'
check "ranks that ignore SIGTERM are killed 5 s later" \
    [ "$rc" = 3 -a "$elapsed" -ge 4 -a "$elapsed" -lt 10 ]

run -n 2 sh -c 'if [ "$WEFT_RANK" = 0 ]; then kill -KILL $$; fi; exec sleep 100'
check "a rank killed by SIGKILL gives 128+9, and the rest stop in < 4 s" \
    [ "$rc" = 137 -a "$elapsed" -lt 4 ]
check "the signal death is named on stderr" \
    grep -q '^weftrun: rank 0 was killed by signal 9' "$TMP/err"

run -n 2 /nonexistent/weftrun-test-program
check "a missing program gives 127" [ "$rc" = 127 ]
check "a missing program is named on stderr" \
    grep -q 'weftrun: cannot run /nonexistent/weftrun-test-program: ' "$TMP/err"
run weftrun-test-program-not-on-path
check "a program not on PATH gives 127" [ "$rc" = 127 ]

# ---- signals ----

# A rank that says which signal reached it, then exits 0: a failing rank
# would make weftrun send SIGTERM to the others, mixing up what they saw.
# READY_DIR is exported.
cat >"$TMP/trapper.sh" <<'EOF'
trap 'echo "got TERM"; kill $sleeper 2>/dev/null; exit 0' TERM
trap 'echo "got USR1"; kill $sleeper 2>/dev/null; exit 0' USR1
sleep 100 &
sleeper=$!
touch "$READY_DIR/ready.$WEFT_RANK"
wait
EOF

# forward_check SIGNAL: sends SIGNAL to weftrun alone (not its process group,
# which `timeout` would do), once all 3 ranks have their traps set.
forward_check() {
    rm -f "$TMP"/ready.* "$TMP/pid"
    start=$(date +%s)
    # KILL, not TERM, on timeout: TERM to the process group would reach the
    # ranks without weftrun's help.
    timeout -s KILL 20 sh -c 'echo $$ >"$0"; exec "$@"' "$TMP/pid" \
        "$WEFTRUN" -n 3 sh "$TMP/trapper.sh" >"$TMP/out" 2>"$TMP/err" &
    job=$!
    tries=0
    while [ "$(ls "$TMP" | grep -c '^ready\.')" -lt 3 ] && [ $tries -lt 100 ]; do
        sleep 0.1
        tries=$((tries + 1))
    done
    kill -"$1" "$(cat "$TMP/pid")"
    wait $job
    rc=$?
    elapsed=$(($(date +%s) - start))
    check "SIG$1 sent to weftrun reaches every rank" same_sorted "$TMP/out" "[0] got $1
[1] got $1
[2] got $1"
    check "after SIG$1 the ranks end, and weftrun with them, exit 0 in < 10 s" \
        [ "$rc" = 0 -a "$elapsed" -lt 10 ]
}
forward_check TERM
forward_check USR1

# ---- timeout ----

run --timeout 1 -n 2 sleep 100
check "--timeout 1 stops a job of sleepers with 124 in < 5 s" [ "$rc" = 124 -a "$elapsed" -lt 5 ]
check "the timeout is named on stderr" grep -q 'timeout' "$TMP/err"

run --timeout=10 -n 2 true
check "a job that ends before --timeout exits 0 at once" [ "$rc" = 0 -a "$elapsed" -lt 5 ]

# ---- job token ----

run -n 3 sh -c 'echo "$WEFT_AUTH_TOKEN"'
check "every rank gets the same non-empty WEFT_AUTH_TOKEN" \
    [ "$(sed 's/^\[.\] //' "$TMP/out" | sort -u | wc -l)" = 1 -a \
      "$(sed 's/^\[.\] //' "$TMP/out" | sort -u | wc -c)" -gt 16 ]
first=$(sed 's/^\[.\] //' "$TMP/out" | sort -u)
run -n 1 sh -c 'echo "$WEFT_AUTH_TOKEN"'
check "each job gets a fresh token" [ "$(sed 's/^\[.\] //' "$TMP/out")" != "$first" ]
WEFT_AUTH_TOKEN=mine run -n 2 sh -c 'echo "$WEFT_AUTH_TOKEN"'
check "a preset WEFT_AUTH_TOKEN is kept" [ "$(sed 's/^\[.\] //' "$TMP/out" | sort -u)" = mine ]

# ---- binding ----

cpus_allowed='grep Cpus_allowed_list /proc/self/status | cut -f2'
ncpu=$(nproc)
if [ "$ncpu" -ge 2 ]; then
    run -n 2 sh -c "$cpus_allowed"
    check "with ranks <= CPUs each rank is bound to its own single CPU" \
        [ "$(sed 's/^\[.\] //' "$TMP/out" | sort -u | wc -l)" = 2 -a \
          "$(grep -c -- '[-,]' "$TMP/out")" = 0 ]
fi
run -n 2 --bind none sh -c "$cpus_allowed"
check "--bind none leaves the ranks' CPUs alone" \
    [ "$(sed 's/^\[.\] //' "$TMP/out" | sort -u)" = "$(sh -c "$cpus_allowed")" ]
run -n $((ncpu + 1)) sh -c "$cpus_allowed"
check "oversubscribed ranks are not bound by default" \
    [ "$(sed 's/^\[.*\] //' "$TMP/out" | sort -u)" = "$(sh -c "$cpus_allowed")" ]

# ---- usage ----

for args in "" "-n 0 true" "-n 4097 true" "-n abc true" "-n" "--bogus true" \
    "-x true" "--timeout 0 true" "--timeout soon true" "--bind socket true"; do
    run $args
    check "bad usage '$args' gives 2 and a usage message" \
        [ "$rc" = 2 -a "$(grep -c '^usage: weftrun' "$TMP/err")" = 1 ]
done

if [ "$failures" -ne 0 ]; then
    echo "# $failures check(s) failed"
    exit 1
fi
echo "# all checks passed"
