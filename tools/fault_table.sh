#!/bin/sh
# fault_table.sh [BUILD_DIR] - the fault table of the reliability work, from
# real runs: every scenario of tests/test_faults.c over tcp and shm, the
# link-down test (down, tbf, delete) and strangers at the rendezvous and
# data ports (tests/foreign_client.c). Prints a markdown table: what was
# injected, what each rank returned and after how long, whether the
# scenario's test passed, and what was left behind (weft segments in
# /dev/shm, processes of the test still alive). Needs a build with tests.
set -u
cd "$(dirname "$0")/.."
b=${1:-build-test}
[ -x "$b/tests/test_faults" ] || { echo "fault_table: build $b first (meson setup $b -Dtests=true)"; exit 1; }
segs() { ls /dev/shm 2>/dev/null | grep -c '^weft-'; }
alive() { pgrep -f "$(pwd)/$b/tests/$1" | wc -l; }
what() {
  case $1 in
    peer_dies_before_the_call) echo "rank 2 of 3 exits after init, before the first allreduce" ;;
    peer_killed_during_allreduce) echo "SIGKILL to rank 1 of 4 during the 6th 4 MiB allreduce" ;;
    rank_never_arrives) echo "1 of 3 ranks never calls init" ;;
    wrong_world_size) echo "ranks disagree on the world size" ;;
    busy_port) echo "the rendezvous port is already taken" ;;
    rendezvous_unreachable) echo "nothing listens at the rendezvous address" ;;
    counts_differ_small) echo "ranks pass different counts (small)" ;;
    counts_differ_large) echo "ranks pass different counts (large)" ;;
    rank_skips_a_call) echo "one rank skips a collective" ;;
    abort_releases_a_blocked_call) echo "weft_comm_abort from another thread during a blocked call" ;;
    silent_peer_times_out) echo "a peer stalls (never enters the call), WEFT_TIMEOUT=1" ;;
    config_over_ipv6) echo "(control) explicit config over IPv6 loopback" ;;
    strangers_are_rejected) echo "junk, silence, hello-sized lie, cut-off hello at the rendezvous; junk and silence at a data port" ;;
    wrong_token_is_refused) echo "rank 1 has another WEFT_AUTH_TOKEN" ;;
  esac
}
echo "| scenario | transport | injected | each rank returned (after s: message) | test | left behind |"
echo "|---|---|---|---|---|---|"
tests=$(sed -n 's/^ *cmocka_unit_test(\([a-z_0-9]*\)),*$/\1/p' tests/test_faults.c)
for tp in tcp shm; do
  for t in $tests; do
    before=$(segs)
    out=$(WEFT_FAULT_TABLE=1 WEFT_TEST_FILTER=$t WEFT_TRANSPORT=$tp WEFT_DEBUG=NONE \
      CMOCKA_MESSAGE_OUTPUT=stdout timeout 300 "$b/tests/test_faults" 2>&1)
    verdict=$(echo "$out" | grep -q '\[  PASSED  \] 1 test' && echo pass ||
      (echo "$out" | grep -q '\[  SKIPPED \]' && echo skipped || echo FAIL))
    ranks=$(echo "$out" | sed -n 's/^  rank \([0-9]*\) -> \([A-Z_]*\) after \([0-9.]*\) s: \(.*\)$/r\1 \2 \3 s: \4/p' |
      sed 's/ (WEFT_[A-Z_]*)$//; s/weft rank [0-9]*\/[0-9]* //; s/|/\//g' | cut -c1-170 | tr '\n' '~' | sed 's/~$//; s/~/<br>/g')
    left="/dev/shm +$(($(segs) - before)), processes $(alive test_faults)"
    echo "| $t | $tp | $(what "$t") | ${ranks:-(no rank reached a call)} | $verdict | $left |"
  done
done
for mode in down tbf delete; do
  before=$(segs)
  out=$(LINKDOWN_MODE=$mode sh tests/test_linkdown.sh "$b/tests/linkdown_rank" 2>&1)
  verdict=$(echo "$out" | grep -q '^ok - ' && echo pass || (echo "$out" | grep -q '^SKIP' && echo skipped || echo FAIL))
  ranks=$(echo "$out" | sed -n 's/^\[\([0-9]\)\] rank [0-9]* FAILED \([A-Z_]*\) after \([0-9.]*\) s: .*call #[0-9]*: \(.*\) (WEFT_[A-Z_]*) (ended <= \([0-9]*\) ms after the cut)$/r\1 \2 \3 s (exit \5 ms after the cut): \4/p' |
    cut -c1-170 | tr '\n' '~' | sed 's/~$//; s/~/<br>/g')
  echo "| link $mode mid-run (4 ranks, 2 netns, 64 MiB allreduces) | tcp across, shm within | $mode of the veth link after 2 calls, WEFT_TIMEOUT=5 | ${ranks:-$(echo "$out" | tail -1)} | $verdict | /dev/shm +$(($(segs) - before)), processes $(alive linkdown_rank) |"
done
before=$(segs)
"$b/tests/foreign_client" 2>/dev/null | while IFS= read -r row; do
  echo "$row" | sed 's/^| \([^|]*\)| \([^|]*\)| \(.*\) |$/| \1| tcp | \2| \3 | (both ranks OK = pass) | see the last row |/'
done
echo "| (strangers, after the run) | | | | | /dev/shm +$(($(segs) - before)), processes $(alive foreign_client) |"
