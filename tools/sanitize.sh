#!/usr/bin/env bash
# Runs the tests of every *_tests executable under compute-sanitizer on the GPU machine; called by
# `tools/device_check.sh --sanitize`:
#   tools/sanitize.sh BUILD_DIR LOG_DIR TOOLS      (TOOLS: memcheck, racecheck or memcheck,racecheck)
# Each test runs in a process of its own, MT_SANITIZE_JOBS of them at a time (default 4 per GPU),
# spread over the GPUs. An instrumented kernel runs up to a thousand times slower, and one test
# can take minutes: this way the slowest test, not a shard of many, bounds the wall time.
#   MT_SANITIZE_FILTER   gtest filter (default every test; the CPU-only ones cost little)
#   MT_SANITIZE_EXES     comma-separated executables to run, e.g. ops_tests (default every one)
#   MT_SANITIZE_FIRST    regex of the tests started first, the slow ones (default below)
#   MT_SANITIZE_DEADLINE seconds after which every test still running is stopped and reported
#                        unfinished (default none), so that a summary is printed in time
#   MT_RACECHECK_EXCLUDE kernels racecheck skips (default kns=cudnn; empty: none)
#   MT_RACECHECK_SKIP    gtest negative filter of tests racecheck does not run (default below;
#                        empty: none); memcheck runs them
# Prints, per tool and executable, the tests passed, failed and unfinished, the errors found and
# the slowest tests; exits 1 if any test failed or did not finish, or any error was reported.
# Logs: LOG_DIR/sanitize-TOOL-EXE.log (every test's, one after another) and .times (test, exit
# status, seconds).
set -euo pipefail
build=$1 out=$2 tool_list=$3
filter="${MT_SANITIZE_FILTER:-*}"

if ! command -v compute-sanitizer >/dev/null; then
  echo "sanitize: compute-sanitizer not found"
  exit 1
fi
mapfile -t exes < <(find "$build/tests" -type f -executable -name '*_tests' 2>/dev/null | sort)
if [[ -n "${MT_SANITIZE_EXES:-}" ]]; then
  IFS=',' read -ra wanted <<<"$MT_SANITIZE_EXES"
  chosen=()
  for exe in "${exes[@]}"; do
    for name in "${wanted[@]}"; do [[ "$(basename "$exe")" == "$name" ]] && chosen+=("$exe"); done
  done
  exes=("${chosen[@]}")
fi
if ((${#exes[@]} == 0)); then
  echo "sanitize: no *_tests executables${MT_SANITIZE_EXES:+ named $MT_SANITIZE_EXES} under $build/tests"
  exit 1
fi
# The GPUs to spread the tests over: CUDA_VISIBLE_DEVICES's list when it is set, else every one.
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=',' read -ra devices <<<"$CUDA_VISIBLE_DEVICES"
else
  mapfile -t devices < <(nvidia-smi -L 2>/dev/null | grep '^GPU ' | sed -E 's/^GPU ([0-9]+):.*/\1/' || true)
fi
((${#devices[@]} >= 1)) || devices=(0)
gpus=${#devices[@]}
max_jobs="${MT_SANITIZE_JOBS:-$((4 * gpus))}"
first="${MT_SANITIZE_FIRST:-Large|Tables|Conv2dCuda|Tf32|F64|Attention|GPT|CudaGraph}"
deadline="${MT_SANITIZE_DEADLINE:-0}"

# The full names ("Suite.Test", "Prefix/Suite.Test/3") of an executable's tests that match the
# filter: --gtest_list_tests prints each suite ("Suite.") and then its tests indented.
list_tests() {
  "$1" --gtest_filter="$tool_filter" --gtest_list_tests 2>/dev/null |
    awk '/^[^ ].*\.( |$)/ { suite = $1; next } /^  [^ ]/ && suite != "" { print suite $1 }'
}

# One test under the sanitizer; its exit status and time go beside its log (124: stopped at the
# deadline). API error codes are not reported: the out-of-memory tests provoke them on purpose.
run_one() {
  local exe=$1 test=$2 gpu=$3 log=$4 limit=$5
  local rc=0 begin=$SECONDS
  local stop=()
  ((limit > 0)) && stop=(timeout --kill-after=10 "$limit")
  CUDA_VISIBLE_DEVICES=$gpu "${stop[@]}" compute-sanitizer "${tool_args[@]}" --report-api-errors no \
    --error-exitcode 1 "$exe" --gtest_filter="$test" </dev/null >"$log" 2>&1 || rc=$?
  # A test that passed or skipped without touching the GPU (a CPU-side check the filter
  # matched) gives the sanitizer nothing to instrument, which it reports as an error of its own.
  if ((rc != 0)) && grep -q 'terminated before first instrumented API call' "$log" &&
    grep -qE '^\[  (PASSED  \]|SKIPPED \]) 1 test' "$log"; then
    rc=0
  fi
  echo "$test $rc $((SECONDS - begin))" >"$log.time"
}

status=0
IFS=',' read -ra tools <<<"$tool_list"
for tool in "${tools[@]}"; do
  tool_filter=$filter
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
      # Conv2dCuda.LargerProblemsMatchTheCpu reaches cuDNN convolution kernels which, with
      # cuDNN's kernels excluded, make racecheck stop on "The Sanitizer failed to handle a
      # hardware exception" (then cudaErrorIllegalAddress) even when it runs alone; without the
      # exclusion it reports mbarrier hazards inside those kernels. Its own work is cuDNN's:
      # the smaller Conv2dCuda tests racecheck the same code of ours, and memcheck runs it.
      skip="${MT_RACECHECK_SKIP-Conv2dCuda.LargerProblemsMatchTheCpu}"
      if [[ -n "$skip" ]]; then
        [[ "$filter" == *-* ]] && tool_filter="$filter:$skip" || tool_filter="$filter-$skip"
        echo "sanitize racecheck: not run under racecheck (MT_RACECHECK_SKIP): $skip"
      fi
      ;;
    *)
      echo "sanitize: unknown tool '$tool' (memcheck or racecheck)"
      status=1
      continue
      ;;
  esac
  tool_start=$SECONDS
  jobs=() later=()  # "exe<TAB>test", the slow ones first
  for exe in "${exes[@]}"; do
    mkdir -p "$out/sanitize-$tool/$(basename "$exe")"
    while IFS= read -r test; do
      if [[ "$test" =~ $first ]]; then jobs+=("$exe"$'\t'"$test"); else later+=("$exe"$'\t'"$test"); fi
    done < <(list_tests "$exe")
  done
  jobs+=("${later[@]}")
  echo "sanitize $tool: ${#jobs[@]} tests, $max_jobs at a time over $gpus GPU(s)"
  running=0 launched=0
  for job in "${jobs[@]}"; do
    exe="${job%%$'\t'*}" test="${job#*$'\t'}"
    if ((running >= max_jobs)); then
      wait -n || true
      running=$((running - 1))
    fi
    log="$out/sanitize-$tool/$(basename "$exe")/${test//\//_}.log"
    limit=0
    if ((deadline > 0)); then
      limit=$((deadline - (SECONDS - tool_start)))
      ((limit > 0)) || limit=1
    fi
    run_one "$exe" "$test" "${devices[$((launched % gpus))]}" "$log" "$limit" &
    running=$((running + 1)) launched=$((launched + 1))
    if ((launched % 100 == 0)); then echo "sanitize $tool: $launched of ${#jobs[@]} started, $((SECONDS - tool_start)) s"; fi
  done
  wait

  # Per executable: tests passed, failed (or stopped by the sanitizer) and unfinished, and the
  # errors of each log's summary line, "ERROR SUMMARY: N errors" (memcheck) or "RACECHECK SUMMARY:
  # N hazards displayed (E errors, W warnings)" (racecheck). The per-test logs are then joined.
  for exe in "${exes[@]}"; do
    name=$(basename "$exe")
    dir="$out/sanitize-$tool/$name"
    compgen -G "$dir/*.log" >/dev/null || { rm -rf "$dir"; continue; }
    log="$out/sanitize-$tool-$name.log" times="$out/sanitize-$tool-$name.times"
    for f in "$dir"/*.log; do
      echo "==== $(cut -d' ' -f1 "$f.time" 2>/dev/null || basename "$f")"
      cat "$f"
    done >"$log"
    cat "$dir"/*.time | sort -k3,3nr >"$times"
    rm -rf "$dir"
    passed=$(grep -c '^\[       OK \]' "$log" || true)
    skipped=$(grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' "$log" || true)
    unfinished=$(awk '$2 == 124 || $2 == 137' "$times" | wc -l)
    failed=$(awk '$2 != 0 && $2 != 124 && $2 != 137' "$times" | wc -l)
    # A test stopped before the sanitizer's summary has none: grep's "no match" is not an error.
    errors=$({ grep -E '(ERROR|RACECHECK) SUMMARY' "$log" || true; } |
      sed -E 's/.*ERROR SUMMARY: ([0-9]+) errors?.*/\1/; s/.*\(([0-9]+) errors?,.*/\1/' | awk '{n += $1} END {print n + 0}')
    verdict=clean
    if ((failed > 0 || unfinished > 0 || errors > 0)); then
      verdict="FAILED (log: $log)"
      status=1
    fi
    echo "sanitize $tool: $name $verdict; $passed tests passed, $skipped skipped, $failed failed," \
      "$unfinished unfinished, $errors errors; slowest: $(head -n 3 "$times" | awk '{printf "%s%s %s s", (NR > 1 ? ", " : ""), $1, $3}')"
    awk '$2 != 0 && ++n <= 5 { print "  " ($2 == 124 || $2 == 137 ? "unfinished" : "failed") ": " $1 }' "$times"
    if ((errors > 0)); then
      grep -m 5 -E '^========= [A-Z]' "$log" | grep -v SUMMARY || true
    fi
  done
  rmdir "$out/sanitize-$tool" 2>/dev/null || true
  echo "sanitize $tool: done in $((SECONDS - tool_start)) s"
done
exit "$status"
