#!/usr/bin/env bash
# Builds and tests on the GPU machine. Run from the repository root there:
#   tools/device_check.sh [--skip-tests] [--sanitize] [--bench] [--parity] [--loss-curve] [--demo]
#     --skip-tests  build only, no ctest (for a run that measures)
#     --sanitize[=TOOLS]  also run every test of the *_tests executables under compute-sanitizer,
#                 each in a process of its own (tools/sanitize.sh: MT_SANITIZE_FILTER, MT_SANITIZE_JOBS,
#                 MT_RACECHECK_EXCLUDE); TOOLS is memcheck, racecheck or memcheck,racecheck (the default).
#     --bench     also run tools/bench/run_all.sh
#     --parity    also run the PyTorch parity scripts in tools/parity/ (GPT-2, the Llama family)
#     --loss-curve  also train GPT-2 124M and a Llama of SmolLM2-135M's shape for 50 steps each
#                 beside PyTorch from the same weights and batches (tools/parity/loss_curve.py,
#                 bf16) and compare the losses; then FP8 against bf16 from the same weights and batches,
#                 300 steps at GPT-2 124M's shape and a 300-step LoRA over an FP8 base against a bf16 one
#                 (tools/parity/fp8_convergence.py); and a 200-step LoRA fine-tune of a small Llama
#                 with 2 micro-batches and the --max-memory plan against the plain run, bf16
#                 (tools/parity/lora_mechanisms.py, within 2%)
#     --demo      also run the main job, tools/demo.sh, on the GPU
# That machine has no network and nothing can be installed on it, so tools/setup.sh is not called:
# everything is already there except cudnn-frontend's headers, which travel in third_party/ (carry it).
# Full logs go to $OUT (default build-device/); the screen gets a short report whose LAST line is
# ctest's summary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

sanitize=0 sanitize_tools="memcheck,racecheck" bench=0 parity=0 loss_curve=0 demo=0 skip_tests=0
for arg in "$@"; do
  case "$arg" in
    --skip-tests) skip_tests=1 ;;
    --sanitize) sanitize=1 ;;
    --sanitize=*) sanitize=1 sanitize_tools="${arg#--sanitize=}" ;;
    --bench) bench=1 ;;
    --parity) parity=1 ;;
    --loss-curve) loss_curve=1 ;;
    --demo) demo=1 ;;
    *)
      echo "usage: tools/device_check.sh [--skip-tests] [--sanitize[=TOOLS]] [--bench] [--parity] [--loss-curve] [--demo]" >&2
      exit 2
      ;;
  esac
done

# NVLink multicast (NVLS) must stay off on that machine; mpirun needs `-x NAME` for each of these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# nvcc and compute-sanitizer live here, and PATH need not include it.
if [[ -d /usr/local/cuda/bin ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

build="build-device"
out="${OUT:-$build}"
mkdir -p "$out"
jobs="$(nproc)"

nvidia-smi -L || echo "device_check: WARNING: nvidia-smi lists no GPU"
if [[ -f third_party/cudnn-frontend/include/cudnn_frontend.h ]]; then
  echo "device_check: cudnn-frontend headers present"
else
  echo "device_check: no cudnn-frontend headers (carry third_party/); cuDNN frontend path disabled"
fi

if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
       >"$out/configure.log" 2>&1; then
  tail -n 30 "$out/configure.log"
  echo "device_check: configure FAILED (full log: $out/configure.log)"
  exit 1
fi
# A build that silently fell back to CPU-only would make every GPU test skip and look green.
cuda_compiler=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
case "$cuda_compiler" in
  "" | *NOTFOUND) echo "device_check: WARNING: CMake found no CUDA compiler; this is a CPU-only build" ;;
  *) echo "device_check: CUDA compiler $cuda_compiler" ;;
esac

if ! cmake --build "$build" -j"$jobs" >"$out/build.log" 2>&1; then
  grep -m 30 -E 'error|FAILED:' "$out/build.log" || tail -n 30 "$out/build.log"
  echo "device_check: build FAILED (full log: $out/build.log)"
  exit 1
fi
echo "device_check: built in $((SECONDS - start)) s"

# A per-test timeout, so that one hung collective cannot eat the whole call.
test_start=$SECONDS
ctest_rc=0
if ((skip_tests)); then
  echo "device_check: tests skipped (--skip-tests)" >"$out/ctest.log"
else
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs" --timeout "${MT_TEST_TIMEOUT:-300}" \
    >"$out/ctest.log" 2>&1 || ctest_rc=$?
  echo "device_check: tests ran in $((SECONDS - test_start)) s (full log: $out/ctest.log)"
fi

sanitize_rc=0
if ((sanitize)); then
  tools/sanitize.sh "$build" "$out" "$sanitize_tools" || sanitize_rc=$?
fi

bench_rc=0
if ((bench)); then
  if [[ -f tools/bench/run_all.sh ]]; then
    BUILD="$build" bash tools/bench/run_all.sh >"$out/bench.log" 2>&1 || bench_rc=$?
    tail -n 40 "$out/bench.log"
    ((bench_rc == 0)) || echo "bench: FAILED (exit $bench_rc, log: $out/bench.log)"
  else
    echo "bench: no benchmarks yet"
  fi
fi

parity_rc=0
if ((parity)); then
  python3 tools/parity/gpt2_parity.py --bin "$build/tools/gpt_logits" --device cuda --workdir "$build/parity" \
    >"$out/parity.log" 2>&1 || parity_rc=$?
  grep -E '^(transformers|base logits|LoRA logits|trainable params|gpt2_parity)' "$out/parity.log" || tail -n 20 "$out/parity.log"
  python3 tools/parity/llama_parity.py --bin "$build/tools/llama_logits" --devices cuda >"$out/llama_parity.log" 2>&1 ||
    parity_rc=$?
  tail -n 12 "$out/llama_parity.log"
  # The NaN/inf table that tests/ops/test_nan_inf.cpp holds the ops to, against this machine's torch.
  python3 tools/parity/nan_inf_reference.py --check tests/ops/nan_inf_reference.inc >>"$out/parity.log" 2>&1 ||
    parity_rc=$?
  grep '^nan_inf_reference' "$out/parity.log" || true
  ((parity_rc == 0)) || echo "parity: FAILED (exit $parity_rc, log: $out/parity.log)"
fi

loss_curve_rc=0
# One curve beside PyTorch's: loss_curve_run NAME [loss_curve.py flags]; every fifth step and the
# verdict on the screen, the whole table in $out/loss_curve_NAME.log.
loss_curve_run() {
  local name=$1 log="$out/loss_curve_$1.log" rc=0
  shift
  python3 tools/parity/loss_curve.py --bin "$build/tools/train_steps" --device cuda \
    --workdir "$build/loss_curve/$name" "$@" >"$log" 2>&1 || rc=$?
  grep -E '^(torch|loss_curve)|^ *[0-9]+ ' "$log" | awk 'NR <= 2 || /^loss_curve/ || $1 % 5 == 0' || tail -n 20 "$log"
  ((rc == 0)) || { echo "loss curve $name: FAILED (exit $rc, log: $log)"; loss_curve_rc=$rc; }
}
if ((loss_curve)); then
  loss_curve_run gpt2 --model gpt2 --shape gpt2-124m --batch 16 --seq 1024
  loss_curve_run smollm2 --model llama --shape smollm2-135m --batch 8 --seq 512
  fp8_rc=0
  python3 tools/parity/fp8_convergence.py --bin "$build/examples" --workdir "$build/fp8_convergence" \
    >"$out/fp8_convergence.log" 2>&1 || fp8_rc=$?
  grep -E '^(final|divergence|fp8 overflows|PASS|FAIL)' "$out/fp8_convergence.log" || tail -n 20 "$out/fp8_convergence.log"
  ((fp8_rc == 0)) || { echo "fp8 convergence: FAILED (exit $fp8_rc, log: $out/fp8_convergence.log)"; loss_curve_rc=$fp8_rc; }
  mech_rc=0
  # bf16 autocast: accumulation reorders bf16 sums, so the runs agree to bf16's noise, not f32's.
  python3 tools/parity/lora_mechanisms.py --bin "$build/examples" --device cuda --steps 200 --tolerance 0.02 \
    --workdir "$build/lora_mechanisms" README.md docs/*.md >"$out/lora_mechanisms.log" 2>&1 || mech_rc=$?
  grep -E 'memory plan|largest relative gap' "$out/lora_mechanisms.log" || tail -n 20 "$out/lora_mechanisms.log"
  ((mech_rc == 0)) || { echo "lora mechanisms: FAILED (exit $mech_rc, log: $out/lora_mechanisms.log)"; loss_curve_rc=$mech_rc; }
fi

demo_rc=0
if ((demo)); then
  demo_start=$SECONDS
  MT_SETUP_SKIP=1 MT_BUILD_DIR="$build" tools/demo.sh >"$out/demo.log" 2>&1 || demo_rc=$?
  grep -E 'step .*/|validation loss|trainable params|loss .* -> |done in' "$out/demo.log" | tail -n 30
  echo "demo: $((SECONDS - demo_start)) s (full log: $out/demo.log)"
  ((demo_rc == 0)) || { tail -n 20 "$out/demo.log"; echo "demo: FAILED (exit $demo_rc)"; }
fi

# ctest lists failed and skipped tests in tab-indented blocks after these headers.
awk '/^The following tests (FAILED|did not run):/ {p = 1; print; next} p && /^\t/ {print; next} {p = 0}' \
  "$out/ctest.log"
summary=$(grep -E '^[0-9]+% tests passed' "$out/ctest.log" | tail -n 1 || true)
if [[ -z "$summary" ]]; then
  tail -n 15 "$out/ctest.log"
  summary="ctest printed no summary (exit $ctest_rc)"
fi
echo "$summary"

((ctest_rc == 0 && sanitize_rc == 0 && bench_rc == 0 && parity_rc == 0 && loss_curve_rc == 0 && demo_rc == 0))
