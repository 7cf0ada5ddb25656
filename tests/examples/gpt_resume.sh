#!/usr/bin/env bash
# Training checkpoints, with mt_train (on the CPU, or on a GPU with --deterministic):
#  1. resume: 12 steps straight vs 6 steps + resume to 12 (dropout on): the loss lines of steps
#     7-12 and the final model are bit-identical;
#  2. SIGTERM: the run finishes its step, writes a checkpoint and exits 0; resuming it completes;
#  3. crash: RUNS runs killed with SIGKILL at random moments while writing a checkpoint every
#     step; after each, the newest checkpoint loads and the run resumes.
#   gpt_resume.sh <bin dir> <work dir> [RUNS, default 100] [DEVICE, default cpu]
set -uo pipefail
bin=$1 work=$2 runs=${3:-100} device=${4:-cpu}
# On a GPU the run must use repeatable kernels for the resume to be bit-exact.
extra=()
[[ "$device" == cpu ]] || extra=(--deterministic)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 1 200); do echo "line $i of the text the model learns, with words that repeat and repeat."; done \
  >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt" >/dev/null || fail "tokenize"
train=("$bin/mt_train" --device "$device" "${extra[@]}" --data "$work/a.tok" --layers 2 --heads 2 --embd 32 --seq-len 32
       --batch-size 4 --dropout 0.1 --lr 3e-3 --log-every 1 --sample-tokens 0)
steps() { grep -E "step +[0-9]+/" "$1" | sed -E 's/ \| [0-9,]+ tok\/s.*//'; }  # step, loss, lr

# 1. resume is exact.
"${train[@]}" --steps 12 --out "$work/straight" >"$work/straight.log" || fail "straight run"
"${train[@]}" --steps 12 --stop-at 6 --out "$work/split" --save-dir "$work/ck" >"$work/first.log" ||
  fail "first half"
"${train[@]}" --steps 12 --out "$work/split" --save-dir "$work/ck" --resume >"$work/second.log" ||
  fail "resumed half"
grep -q "stopped after step 6 (--stop-at)" "$work/first.log" || fail "no '--stop-at' stop message"
! grep -q "signal" "$work/first.log" || fail "a --stop-at run claims a signal stopped it"
grep -q "resumed from .*step-000000006.safetensors at step 6" "$work/second.log" || fail "did not resume at step 6"
diff <(steps "$work/straight.log" | sed -n '7,12p') <(steps "$work/second.log") >"$work/diff.txt" ||
  { cat "$work/diff.txt"; fail "the resumed loss curve differs"; }
cmp "$work/straight/model.safetensors" "$work/split/model.safetensors" || fail "the final models differ"
echo "gpt_resume: resume after 6 of 12 steps: steps 7-12 and the final model bit-identical"

# 2. SIGTERM finishes the step, checkpoints, exits 0; the checkpoint resumes.
rm -rf "$work/ck2"
"${train[@]}" --steps 100000 --out "$work/term" --save-dir "$work/ck2" >"$work/term.log" &
pid=$!
for _ in $(seq 1 600); do grep -q "step    3/" "$work/term.log" && break; sleep 0.05; done
kill -TERM $pid
wait $pid
rc=$?
((rc == 0)) || fail "SIGTERM: exit status $rc"
grep -q "stopped after step [0-9]* (SIGTERM)" "$work/term.log" || fail "SIGTERM: no stop message naming SIGTERM"
stopped=$(sed -nE 's/.*stopped after step ([0-9]+) \(SIGTERM\).*/\1/p' "$work/term.log")
"${train[@]}" --steps $((stopped + 2)) --out "$work/term" --save-dir "$work/ck2" --resume >"$work/term2.log" ||
  fail "resume after SIGTERM"
grep -q "resumed from .* at step $stopped" "$work/term2.log" || fail "SIGTERM: did not resume at step $stopped"
echo "gpt_resume: SIGTERM after step $stopped: exit 0, checkpoint written, resumed"

# 3. SIGKILL during checkpoint writes never leaves an unloadable newest checkpoint.
rm -rf "$work/ck3"
"${train[@]}" --steps 2 --out "$work/crash" --save-dir "$work/ck3" --save-every 1 >/dev/null || fail "crash setup"
ok=0
for run in $(seq 1 "$runs"); do
  "${train[@]}" --steps 1000000 --out "$work/crash" --save-dir "$work/ck3" --save-every 1 --keep 2 --resume \
    >"$work/crash.log" 2>&1 &
  pid=$!
  sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
  kill -KILL $pid 2>/dev/null
  wait $pid 2>/dev/null
  # The newest checkpoint must load: resume for one more step.
  last=$(ls "$work/ck3" | grep -E '^step-[0-9]+\.safetensors$' | tail -n 1)
  n=$((10#$(sed -E 's/step-0*([0-9]+)\.safetensors/\1/' <<<"${last:-step-0.safetensors}")))
  "${train[@]}" --steps $((n + 1)) --out "$work/crash" --save-dir "$work/ck3" --save-every 1 --keep 2 --resume \
    >"$work/check.log" 2>&1 || { cat "$work/check.log"; fail "run $run: the newest checkpoint ($last) did not resume"; }
  ok=$((ok + 1))
done
echo "gpt_resume: $ok of $runs runs killed with SIGKILL resumed from their newest checkpoint"
echo "gpt_resume: PASS"
