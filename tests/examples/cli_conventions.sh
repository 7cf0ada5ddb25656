#!/usr/bin/env bash
# The command-line convention of the programs (examples/common/cli.h), on the CPU: every program
# that has a shared flag shows the same default for it in --help; mlp and mt_train resolve
# --device auto and --amp auto alike, print progress lines of one form with the time left, stop
# after --stop-at N (saying so, not that a signal stopped them) or after SIGTERM (naming it), and
# resume the same way. Bad values of the shared flags are bad_cli.sh's.
#   cli_conventions.sh <bin dir> <tools bin dir> <work dir>
set -uo pipefail
bin=$1 tools=$2 w=$3
rm -rf "$w" && mkdir -p "$w"
passed=0 failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }

# default <flag> <value> <programs...>: each program's --help shows the flag with its default,
# as CLI11 writes it: "  --keep INT:POSITIVE=3  ..." (CLI11 2.3) or "  --keep INT:POSITIVE [3]  ..." (2.4).
default() {
  local flag=$1 value=$2 p line
  shift 2
  for p in "$@"; do
    line=$(grep -E -m 1 -- "^ +$flag( |$)" <<<"$("$p" --help 2>&1)")
    if [[ "$line" =~ ^\ +$flag\ [^\ ]*=$value(\ |$) || "$line" =~ ^\ +$flag\ [^\ ]*\ \[$value\](\ |$) ]]; then
      ok "$(basename "$p") $flag defaults to $value"
    else
      bad "$(basename "$p") $flag: expected the default $value; --help says '${line:-nothing}'"
    fi
  done
}
trainers=("$bin/mlp" "$bin/mt_train" "$bin/mt_lora")
default --device auto "${trainers[@]}" "$bin/mt_generate" "$bin/mt_merge" "$tools/gpt_step" "$tools/mlp_step" \
  "$tools/op_bench"
default --amp auto "${trainers[@]}" "$tools/gpt_step"
default --seed 1337 "${trainers[@]}" "$bin/mt_generate"
default --save-every 0 "${trainers[@]}"
default --keep 3 "${trainers[@]}"
default --stop-at 0 "${trainers[@]}"
default --precision amp "$bin/mt_train" "$bin/mt_lora"
default --fp8-recipe current "$bin/mt_train" "$bin/mt_lora"
for p in "${trainers[@]}"; do
  for flag in --save-dir --resume; do
    if grep -q -E -- "^ +$flag( |$)" <<<"$("$p" --help 2>&1)"; then ok "$(basename "$p") has $flag"
    else bad "$(basename "$p") has no $flag"; fi
  done
done

# expect <case> <log> <extended regex>: a line of the log matches.
expect() {
  if grep -q -E -- "$3" "$2"; then ok "$1: $(grep -E -m 1 -- "$3" "$2" | cut -c 1-160)"
  else bad "$1: no line matching '$3' in:"; sed 's/^/    /' "$2" | tail -n 8; fi
}

for i in $(seq 1 100); do echo "line $i of the text the model learns."; done >"$w/a.txt"
"$bin/mt_tokenize" --output "$w/a.tok" "$w/a.txt" >/dev/null || { echo "FAIL: setup: mt_tokenize"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then auto="cuda:0, bf16 autocast"
else auto="cpu, f32"; fi
run_args() {  # run_args <program>: a few quick steps
  case $1 in
    mlp) args=("$bin/mlp" --steps 4 --log-every 2 --points-per-class 20) ;;
    mt_train) args=("$bin/mt_train" --data "$w/a.tok" --out "$w/model" --layers 1 --heads 2 --embd 16 --seq-len 16
                     --batch-size 2 --steps 4 --log-every 2 --sample-tokens 0) ;;
  esac
}
for name in mlp mt_train; do
  run_args $name
  "${args[@]}" >"$w/$name.auto.log" 2>&1 || bad "$name with --device auto --amp auto exited with status $?"
  expect "$name resolves auto" "$w/$name.auto.log" "^$name: .* on $auto"
  expect "$name progress line" "$w/$name.auto.log" "^$name: step +2/4 \| loss [0-9.]+ \| .* \| eta [0-9]+m[0-9]{2}s$"
  "${args[@]}" --device cpu --save-dir "$w/$name.ck" --stop-at 2 >"$w/$name.stop.log" 2>&1 ||
    bad "$name --stop-at 2 exited with status $?"
  expect "$name --stop-at" "$w/$name.stop.log" "^$name: stopped after step 2 \(--stop-at\)$"
  ! grep -q signal "$w/$name.stop.log" || bad "$name --stop-at: claims a signal: $(grep signal "$w/$name.stop.log")"
  "${args[@]}" --device cpu --save-dir "$w/$name.ck" --resume >"$w/$name.resume.log" 2>&1 ||
    bad "$name --resume exited with status $?"
  expect "$name --resume" "$w/$name.resume.log" "^$name: resumed from .*step-000000002\.safetensors at step 2$"
  expect "$name checkpoint after the last step" "$w/$name.resume.log" "^$name: checkpoint .*step-000000004\.safetensors$"

  # SIGTERM with --save-dir: the step finishes, a checkpoint is written, exit 0.
  "${args[@]}" --device cpu --steps 100000000 --log-every 1 --save-dir "$w/$name.term" >"$w/$name.term.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "step .*/" "$w/$name.term.log" && break; sleep 0.05; done
  kill -TERM $pid
  wait $pid
  rc=$?
  ((rc == 0)) && ok "$name SIGTERM: exit 0" || bad "$name SIGTERM: exit status $rc"
  expect "$name SIGTERM" "$w/$name.term.log" "^$name: stopped after step [0-9]+ \(SIGTERM\)$"
  expect "$name SIGTERM checkpoint" "$w/$name.term.log" "^$name: checkpoint .*step-[0-9]+\.safetensors$"
done

# --precision fp8 (the FP8 GEMMs emulated on the CPU): the recipe in the first line (current scaling
# by default), and under delayed scaling the progress lines carry the scales' health (saturated
# casts since the last line, the range of the scales).
run_args mt_train
"${args[@]}" --device cpu --amp bf16 --precision fp8 >"$w/fp8_current.log" 2>&1 || bad "mt_train --precision fp8: status $?"
expect "mt_train --precision fp8 default recipe" "$w/fp8_current.log" \
  "^mt_train: .* on cpu, bf16 autocast, FP8 Linear layers \(current scaling \(margin 0\)\)$"
"${args[@]}" --device cpu --amp bf16 --precision fp8 --fp8-recipe delayed >"$w/fp8.log" 2>&1 ||
  bad "mt_train --precision fp8 --fp8-recipe delayed: status $?"
expect "mt_train --precision fp8 recipe" "$w/fp8.log" \
  "^mt_train: .* on cpu, bf16 autocast, FP8 Linear layers \(delayed scaling \(history 16, amax max, margin 0\)\)$"
expect "mt_train --precision fp8 progress line" "$w/fp8.log" \
  "^mt_train: step +2/4 \| .* \| loss scale off \| fp8 ovf [0-9]+ scale [0-9.e+-]+\.\.[0-9.e+-]+ \| eta [0-9]+m[0-9]{2}s$"

echo "cli_conventions: $passed passed, $failed failed"
((failed == 0)) || exit 1
echo "cli_conventions: PASS"
