// Process-wide numeric switches, as torch.backends.cuda.matmul.allow_tf32 and
// torch.backends.cudnn.allow_tf32:
//   TF32 for f32 matmuls: off by default (f32 GEMMs keep f32 accuracy);
//   TF32 for f32 convolutions: on by default.
// TF32 rounds GEMM inputs to a 10-bit mantissa (relative error ~1e-3) in
// exchange for tensor-core speed. f16/bf16/f64 are unaffected.
#pragma once

namespace mt::backends {

bool allow_tf32_matmul();
void set_allow_tf32_matmul(bool allow);
bool allow_tf32_conv();
void set_allow_tf32_conv(bool allow);

// Deterministic algorithms (as torch.use_deterministic_algorithms): off by default.
// On, every kernel whose default gives run-to-run differences picks a repeatable
// one, so that a resumed run repeats an uninterrupted one bit for bit on the GPU
// too: today that is cuDNN's fused attention backward (its default adds dQ with
// atomics). Everything else mixtrain runs is deterministic anyway (the embedding
// backward sorts instead of using atomics; cuBLASLt keeps one algorithm per shape).
bool deterministic_algorithms();
void set_deterministic_algorithms(bool on);

// GEMM autotuning (as torch.backends.cudnn.benchmark, for cuBLASLt): off by default. On, the
// first GEMM of each problem (shapes, layouts, dtypes, epilogue) times the best few algorithms
// cuBLASLt's heuristic lists and keeps the fastest for the process; off, it keeps the
// heuristic's first. The timing makes that first call slower and synchronises with the device,
// and two processes may time different winners, whose results can differ in the last bits: so
// while deterministic_algorithms() is on every problem takes the heuristic's first (also one
// tuned before), and a problem first met during CUDA Graph capture takes it for that capture.
bool matmul_autotune();
void set_matmul_autotune(bool on);

// Sets the switch for a scope, and puts the old value back.
class DeterministicGuard {
 public:
  explicit DeterministicGuard(bool on = true);
  ~DeterministicGuard();
  DeterministicGuard(const DeterministicGuard&) = delete;
  DeterministicGuard& operator=(const DeterministicGuard&) = delete;

 private:
  bool was_;
};

// Sets both switches for a scope (tests compare against f64 with TF32 off).
class TF32Guard {
 public:
  TF32Guard(bool matmul, bool conv);
  ~TF32Guard();
  TF32Guard(const TF32Guard&) = delete;
  TF32Guard& operator=(const TF32Guard&) = delete;

 private:
  bool matmul_, conv_;
};

}  // namespace mt::backends
