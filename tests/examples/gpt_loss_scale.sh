#!/usr/bin/env bash
# The loss scale in mt_train's progress lines, below 1: an fp16 run on the CPU with a learning
# rate so large that after a step or two every forward overflows f16, so every step is skipped
# and the loss scaler halves its scale each time (65536 -> 2^-k). Each logged scale must be the
# real value (a positive number, never more than the one before), and the last one below 1.
#   gpt_loss_scale.sh <bin dir> <work dir>
set -uo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 1 100); do echo "line $i of the text the model learns."; done >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt" >/dev/null || fail "mt_tokenize"
"$bin/mt_train" --device cpu --amp fp16 --data "$work/a.tok" --layers 1 --heads 2 --embd 16 --seq-len 16 \
  --batch-size 2 --steps 24 --warmup 0 --lr 1e4 --log-every 1 --sample-tokens 0 --out "$work/model" \
  >"$work/train.log" 2>&1 || { tail -n 5 "$work/train.log"; fail "mt_train exited with status $?"; }
sed -nE 's/.*\| loss scale ([^ |]+) .*/\1/p' "$work/train.log" >"$work/scales.txt"
(($(wc -l <"$work/scales.txt") == 24)) || { cat "$work/train.log"; fail "expected 24 progress lines with a loss scale"; }
awk '
  $1 !~ /^[0-9.]+(e-?[0-9]+)?$/ || $1 + 0 <= 0 { print "FAIL: step " NR ": loss scale \"" $1 "\" is not a positive number"; bad = 1; exit }
  NR > 1 && $1 + 0 > previous { print "FAIL: step " NR ": loss scale " $1 " grew from " previous; bad = 1; exit }
  { previous = $1 + 0 }
  END { if (!bad && previous >= 1) { print "FAIL: the loss scale ended at " previous ", not below 1"; bad = 1 }
        exit bad }' "$work/scales.txt" || { grep "loss scale" "$work/train.log" | tail -n 4; exit 1; }
echo "gpt_loss_scale: loss scale $(head -n 1 "$work/scales.txt") at step 1, $(tail -n 1 "$work/scales.txt") at step 24"
echo "gpt_loss_scale: PASS"
