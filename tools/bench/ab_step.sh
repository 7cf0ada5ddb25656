#!/usr/bin/env bash
# The GPT step of two builds (before and after a change), in alternating processes on one GPU, so that
# both see the same clocks and neighbours; prints every run's step line and each build's median.
#   tools/bench/ab_step.sh BUILD_A BUILD_B [ROUNDS] [-- gpt_step arguments]
# BUILD_A and BUILD_B are build folders holding tools/gpt_step (e.g. one built from `git archive BASE`).
# Defaults: 3 rounds of `--device cuda --checkpoint off --lora-r 0` (GPT-2 124M, B=16, T=1024, bf16).
set -euo pipefail
usage() { echo "usage: tools/bench/ab_step.sh BUILD_A BUILD_B [ROUNDS] [-- gpt_step arguments]" >&2; exit 2; }
(($# >= 2)) || usage
a="$1" b="$2"
shift 2
rounds=3
if (($#)) && [[ "$1" != "--" ]]; then rounds="$1"; shift; fi
if (($#)); then [[ "$1" == "--" ]] || usage; shift; fi
args=("$@")
((${#args[@]})) || args=(--device cuda --checkpoint off --lora-r 0)
for build in "$a" "$b"; do
  [[ -x "$build/tools/gpt_step" ]] || { echo "ab_step: no $build/tools/gpt_step" >&2; exit 1; }
done

declare -A times
for ((round = 1; round <= rounds; ++round)); do
  for build in "$a" "$b"; do
    # The mode's line: "<mode> <peak GiB (Nx less)> <ms> (<ratio>x) <tokens/s> <loss>": the step time is the
    # number before the one "(<ratio>x)" token.
    line=$("$build/tools/gpt_step" "${args[@]}" | awk '$1 == "off" || $1 == "blocks" || $1 == "selective"' | head -n 1)
    echo "ab_step: round $round $build: $line"
    ms=$(awk '{ for (i = 2; i <= NF; ++i) if ($i ~ /^\([0-9.]+x\)$/) { print $(i - 1); exit } }' <<<"$line")
    times[$build]+="$ms "
  done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ma=$(median <<<"${times[$a]}")
mb=$(median <<<"${times[$b]}")
echo "ab_step: median step ms: $a $ma, $b $mb (B/A $(awk -v x="$mb" -v y="$ma" 'BEGIN { printf "%.3f", x / y }'))"
