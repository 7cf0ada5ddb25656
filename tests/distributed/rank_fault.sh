#!/usr/bin/env bash
# Rank 1 of 2 exits abruptly at step 2; the job must end non-zero, within 60 s, saying which
# rank died (the launcher's report), never hang.
#   rank_dies.sh <mpirun> <ddp_mpi>
set -uo pipefail
start=$SECONDS
output=$(timeout 90 "$1" --allow-run-as-root --oversubscribe -np 2 "$2" --die-at-step 2 2>&1)
rc=$?
elapsed=$((SECONDS - start))
echo "$output" | tail -n 15
echo "rank_dies: exit status $rc after $elapsed s"
if ((rc == 0)); then echo "FAIL: the job succeeded although rank 1 died"; exit 1; fi
if ((rc == 124)); then echo "FAIL: the job hung (killed by the 90 s timeout)"; exit 1; fi
if ((elapsed > 60)); then echo "FAIL: took $elapsed s to end"; exit 1; fi
grep -q "rank 1 exits abruptly" <<<"$output" || { echo "FAIL: rank 1's message is missing"; exit 1; }
echo "rank_dies: PASS"
