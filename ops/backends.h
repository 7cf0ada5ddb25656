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
