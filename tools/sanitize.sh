#!/usr/bin/env bash
# Runs the tests of every *_tests executable under compute-sanitizer on the GPU machine; called by
# `tools/device_check.sh --sanitize`:
#   tools/sanitize.sh BUILD_DIR LOG_DIR TOOLS      (TOOLS: memcheck, racecheck or memcheck,racecheck)
# Each test runs in a process of its own, MT_SANITIZE_JOBS of them at a time (default 8 per GPU),
# spread over the GPUs. An instrumented kernel runs up to a thousand times slower, and one test
# can take minutes: this way the slowest test, not a shard of many, bounds the wall time.
#   MT_SANITIZE_FILTER   gtest filter (default every test; the CPU-only ones cost little)
#   MT_RACECHECK_EXCLUDE kernels racecheck skips (default kns=cudnn; empty: none)
# Prints, per tool and executable, the tests passed and the errors found; exits 1 if any test
# failed or any error was reported. Each test's log is LOG_DIR/sanitize-TOOL/EXE/TEST.log.
set -euo pipefail
build=$1 out=$2 tool_list=$3
filter="${MT_SANITIZE_FILTER:-*}"

if ! command -v compute-sanitizer >/dev/null; then
  echo "sanitize: compute-sanitizer not found"
  exit 1
fi
mapfile -t exes < <(find "$build/tests" -type f -executable -name '*_tests' 2>/dev/null | sort)
if ((${#exes[@]} == 0)); then
  echo "sanitize: no *_tests executables under $build/tests"
  exit 1
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
((gpus >= 1)) || gpus=1
max_jobs="${MT_SANITIZE_JOBS:-$((8 * gpus))}"

# The full names ("Suite.Test", "Prefix/Suite.Test/3") of an executable's tests that match the
# filter: --gtest_list_tests prints each suite ("Suite.") and then its tests indented.
list_tests() {
  "$1" --gtest_filter="$filter" --gtest_list_tests 2>/dev/null |
    awk '/^[^ ].*\.( |$)/ { suite = $1; next } /^  [^ ]/ && suite != "" { print suite $1 }'
}

# One test under the sanitizer; its exit status goes beside its log. API error codes are not
# reported: the out-of-memory tests provoke them on purpose.
run_one() {
  local exe=$1 test=$2 gpu=$3 log=$4
  local rc=0
  CUDA_VISIBLE_DEVICES=$gpu compute-sanitizer "${tool_args[@]}" --report-api-errors no --error-exitcode 1 \
    "$exe" --gtest_filter="$test" </dev/null >"$log" 2>&1 || rc=$?
  echo "$rc" >"$log.rc"
}

status=0
IFS=',' read -ra tools <<<"$tool_list"
for tool in "${tools[@]}"; do
  case "$tool" in
    memcheck) tool_args=(--tool memcheck) ;;
    # cuDNN's Hopper kernels (generated attention, precompiled sm90_xmma convolutions, their
    # names all hold "cudnn") order shared memory through mbarriers and TMA, which racecheck
    # does not model: it reports thousands of hazards in them. They are left out
    # (MT_RACECHECK_EXCLUDE='' puts them back); every kernel of ours is checked.
    racecheck)
      tool_args=(--tool racecheck --racecheck-report all)
      exclude="${MT_RACECHECK_EXCLUDE-kns=cudnn}"
      [[ -n "$exclude" ]] && tool_args+=(--kernel-name-exclude "$exclude")
      ;;
    *)
      echo "sanitize: unknown tool '$tool' (memcheck or racecheck)"
      status=1
      continue
      ;;
  esac
  tool_start=$SECONDS
  jobs=()  # "exe<TAB>test"
  for exe in "${exes[@]}"; do
    mkdir -p "$out/sanitize-$tool/$(basename "$exe")"
    while IFS= read -r test; do jobs+=("$exe"$'\t'"$test"); done < <(list_tests "$exe")
  done
  echo "sanitize $tool: ${#jobs[@]} tests, $max_jobs at a time over $gpus GPU(s)"
  running=0 launched=0
  for job in "${jobs[@]}"; do
    exe="${job%%$'\t'*}" test="${job#*$'\t'}"
    if ((running >= max_jobs)); then
      wait -n || true
      running=$((running - 1))
    fi
    log="$out/sanitize-$tool/$(basename "$exe")/${test//\//_}.log"
    run_one "$exe" "$test" $((launched % gpus)) "$log" &
    running=$((running + 1)) launched=$((launched + 1))
    if ((launched % 100 == 0)); then echo "sanitize $tool: $launched of ${#jobs[@]} started, $((SECONDS - tool_start)) s"; fi
  done
  wait

  # Per executable: tests passed, tests failed (or stopped by the sanitizer), and the errors of
  # each log's summary line, "ERROR SUMMARY: N errors" (memcheck) or "RACECHECK SUMMARY: N hazards
  # displayed (E errors, W warnings)" (racecheck).
  for exe in "${exes[@]}"; do
    name=$(basename "$exe")
    dir="$out/sanitize-$tool/$name"
    compgen -G "$dir/*.log" >/dev/null || continue
    passed=$(cat "$dir"/*.log | grep -c '^\[       OK \]' || true)
    skipped=$(cat "$dir"/*.log | grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' || true)
    failed=$(cat "$dir"/*.rc | grep -vc '^0$' || true)
    errors=$(cat "$dir"/*.log | grep -E '(ERROR|RACECHECK) SUMMARY' |
      sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/; s/.*\(([0-9]+) errors.*/\1/' | awk '{n += $1} END {print n + 0}')
    verdict=clean
    if ((failed > 0 || errors > 0)); then
      verdict="FAILED (logs: $dir)"
      status=1
    fi
    echo "sanitize $tool: $name $verdict; $passed tests passed, $skipped skipped, $failed failed, $errors errors"
    if ((failed > 0)); then
      grep -l -v '^0$' "$dir"/*.rc | head -n 5 | sed 's/\.rc$//; s/^/  failed: /'
    fi
    if ((errors > 0)); then
      grep -h -m 3 -E '^========= [A-Z]' "$dir"/*.log | grep -v SUMMARY | head -n 5 || true
    fi
  done
  echo "sanitize $tool: done in $((SECONDS - tool_start)) s"
done
exit "$status"
