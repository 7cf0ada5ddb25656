#!/usr/bin/env bash
# Rank 1 of 2 fails at step 2 of DDP training; the job must end non-zero within 60 s with an error
# that says what happened, never hang.
#   rank_fault.sh die  <mpirun> <ddp_mpi> [ddp_mpi args]   rank 1 exits abruptly (mpirun ends the job)
#   rank_fault.sh hang <mpirun> <ddp_mpi> [ddp_mpi args]   rank 1 stops answering without dying: rank 0's
#       collective gives up after MT_COLLECTIVE_TIMEOUT_S (3 s here), naming its rank and the collective
set -uo pipefail
mode=$1 mpirun=$2 program=$3
shift 3
export MT_COLLECTIVE_TIMEOUT_S=3
start=$SECONDS
output=$(timeout 90 "$mpirun" --allow-run-as-root --oversubscribe -x MT_COLLECTIVE_TIMEOUT_S \
  -x NCCL_NVLS_ENABLE=0 -np 2 "$program" "--$mode-at-step" 2 "$@" 2>&1)
rc=$?
elapsed=$((SECONDS - start))
echo "$output" | tail -n 15
echo "rank_fault ($mode): exit status $rc after $elapsed s"
if ((rc == 0)); then echo "FAIL: the job succeeded although rank 1 failed"; exit 1; fi
if ((rc == 124)); then echo "FAIL: the job hung (killed by the 90 s timeout)"; exit 1; fi
if ((elapsed > 60)); then echo "FAIL: took $elapsed s to end"; exit 1; fi
case "$mode" in
  die) expected="rank 1 exits abruptly" ;;
  hang) expected="rank 0 of 2 \\(local 0\\): .* (did not finish|could not start) within 3 s" ;;
  *) echo "FAIL: unknown mode $mode"; exit 1 ;;
esac
grep -qE "$expected" <<<"$output" || { echo "FAIL: no line matching '$expected'"; exit 1; }
echo "rank_fault ($mode): PASS"
