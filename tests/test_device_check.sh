#!/bin/sh
# test_device_check.sh WEFTRUN DEVICE_CHECK - every collective x dtype x op on
# device buffers (tools/weft_device_check.c) on the CUDA stand-in, whose
# device memory the host cannot touch and whose work runs late: 1, 2 and 3
# ranks over shm, 2 over tcp. WEFT_CUDA_LIBRARY names the stand-in.
set -u
weftrun=$1 check=$2
[ -n "${WEFT_CUDA_LIBRARY:-}" ] || { echo "skipped: no stand-in"; exit 77; }
rc=0
for run in "1 shm" "2 shm" "3 shm --quick" "2 tcp --quick"; do
  set -- $run
  n=$1 tp=$2
  shift 2
  if WEFT_TRANSPORT=$tp "$weftrun" -n "$n" --timeout 240 "$check" "$@" > /tmp/weft-device-check.$$ 2>&1; then
    echo "$n ranks over $tp: $(grep -m1 'rank 0:' /tmp/weft-device-check.$$ | sed 's/.*rank 0: //')"
  else
    echo "$n ranks over $tp: FAILED"
    head -20 /tmp/weft-device-check.$$
    rc=1
  fi
done
rm -f /tmp/weft-device-check.$$
exit $rc
