#!/usr/bin/env bash
# Builds the libFuzzer targets of the file readers (clang, AddressSanitizer + UBSan, CPU-only)
# and runs each on a copy of its seed corpus; exits non-zero if any target finds a crash, a
# leak or a sanitizer report.
#   tools/fuzz.sh               1,000,000 runs per target
#   tools/fuzz.sh --runs N      N runs per target
#   tools/fuzz.sh --time S      S seconds per target
#   tools/fuzz.sh ... NAME...   only the targets named (fuzz_token_file, fuzz_tokenizer_json, ...)
#   MT_FUZZ_BUILD_DIR  build folder (default: build-fuzz)
#   MT_FUZZ_JOBS       parallel compile jobs (default: nproc)
# Prints one line per target: "fuzz.sh: <target>: <N> runs in <S> s: no crash", or what failed,
# where the input that triggered it was saved, and the end of the report.
# Exits 77 when clang is missing, so a caller can report the fuzzing as skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  echo "usage: tools/fuzz.sh [--time SECONDS | --runs N] [TARGET...]" >&2
  exit 2
}
limit=(-runs=1000000)
case "${1:-}" in
  --runs) [[ "${2:-}" =~ ^[0-9]+$ ]] || usage; limit=(-runs="$2"); shift 2 ;;
  --time) [[ "${2:-}" =~ ^[0-9]+$ ]] || usage; limit=(-max_total_time="$2"); shift 2 ;;
  -*) usage ;;
esac

if ! command -v clang++ >/dev/null || ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang is not installed (tools/setup.sh installs it); skipping"
  exit 77
fi

build="${MT_FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${MT_FUZZ_JOBS:-$(nproc)}"
targets=(fuzz_safetensors fuzz_adapter_config fuzz_token_file fuzz_tokenizer_json fuzz_gpt2_files fuzz_tokenizer_encode
         fuzz_finetune_jsonl fuzz_model_config)
if (($# > 0)); then
  for name in "$@"; do
    [[ " ${targets[*]} " == *" $name "* ]] || { echo "fuzz.sh: no target '$name' (targets: ${targets[*]})" >&2; exit 2; }
  done
  targets=("$@")
fi

# Ninja only for a fresh build folder: CMake refuses to switch generators in an existing one.
generator=()
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
# Only the fuzz targets are built, so the tests and examples (and what they need) stay out.
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S . -B "$build" "${generator[@]}" -DMT_ENABLE_CUDA=OFF -DMT_BUILD_FUZZERS=ON \
  -DMT_BUILD_TESTS=OFF -DMT_BUILD_EXAMPLES=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

# The fuzzer adds what it finds to the corpus folder it is given: it gets a copy, so the
# seeds in the repository stay as they are. The targets rewrite a scratch file in $TMPDIR for
# every input; pointing TMPDIR at this folder (in memory where /dev/shm is) keeps that off the
# disk and removes the file even when a target crashes.
base="${TMPDIR:-/tmp}"
if [[ -z "${TMPDIR:-}" && -d /dev/shm && -w /dev/shm ]]; then base=/dev/shm; fi
scratch=$(mktemp -d "$base/mt-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
logs="$build/fuzz-logs"
artifacts="$build/fuzz-artifacts"
mkdir -p "$logs" "$artifacts"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

# run_target NAME: runs one target; prints its summary line and returns non-zero on a finding.
run_target() {
  local name="$1" short="${1#fuzz_}"
  local corpus="$scratch/$short" log="$logs/$name.log"
  cp -r "tests/fuzz/corpus/$short" "$corpus"
  local dict=()
  if [[ -f "tests/fuzz/$short.dict" ]]; then dict=(-dict="tests/fuzz/$short.dict"); fi
  local rc=0
  # -timeout: an input that takes a minute is a hang, and a finding too.
  TMPDIR="$scratch" "$build/tests/fuzz/$name" "${limit[@]}" -detect_leaks=1 -timeout=60 "${dict[@]}" \
    -artifact_prefix="$artifacts/$name-" "$corpus" >"$log" 2>&1 || rc=$?
  # libFuzzer ends a clean run with "Done 1000000 runs in 412 second(s)".
  local done_line
  done_line=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)
  if ((rc == 0)) && [[ -n "$done_line" ]]; then
    read -r _ runs _ _ seconds _ <<<"$done_line"
    echo "fuzz.sh: $name: $runs runs in $seconds s: no crash"
    return 0
  fi
  local finding artifact
  # The most telling line: UBSan's or the target's own message, an escaped exception, then the
  # sanitizer's summary.
  finding=$(grep -E -m1 'runtime error:|terminate called|^fuzz target:' "$log" || grep -E -m1 '^SUMMARY: ' "$log" ||
    grep -E -m1 'ERROR: ' "$log" || true)
  artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)
  echo "fuzz.sh: $name: FAILED (exit $rc): ${finding:-no report; see the log}"
  echo "fuzz.sh:   input: ${artifact:-none saved}; log: $log"
  tail -n 40 "$log" | sed 's/^/fuzz.sh:   | /'
  return 1
}

failed=0
for name in "${targets[@]}"; do
  run_target "$name" || failed=1
done
exit "$failed"
