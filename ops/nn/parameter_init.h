// How the layers' constructors make their parameters: the dtype and device, and whether the values
// are drawn at random (a new model) or left uninitialised (every one about to be loaded from a
// checkpoint). The default is f32 on the CPU, drawn at random. A scope changes it, as PyTorch's
// `with torch.device(...)` and accelerate's init_empty_weights do:
//
//   {
//     ParameterInitGuard on_gpu(ParameterInit{TensorOptions(DType::bf16).device(Device("cuda"))});
//     Llama model(config, &generator);  // drawn in bf16 on the GPU: no f32 copy anywhere
//   }
//
// An 8B model built the default way is 32 GB of f32 on the host and minutes of drawing; loading a
// checkpoint into it draws every value only to overwrite it.
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace mt::nn {

struct ParameterInit {
  TensorOptions options;  // dtype and device of every parameter a constructor makes
  bool random = true;     // false: uninitialised (to be loaded); the constructors draw nothing
};

// The current scope's (this thread's).
const ParameterInit& parameter_init();

class ParameterInitGuard {
 public:
  explicit ParameterInitGuard(const ParameterInit& init);
  ~ParameterInitGuard();
  ParameterInitGuard(const ParameterInitGuard&) = delete;
  ParameterInitGuard& operator=(const ParameterInitGuard&) = delete;

 private:
  ParameterInit previous_;
};

// The factories of the layers' constructors, in parameter_init()'s dtype and on its device; each an
// uninitialised tensor when parameter_init().random is false.
Tensor init_uniform(const Shape& shape, double low, double high, Generator* generator);
Tensor init_normal(const Shape& shape, double std, Generator* generator);  // N(0, std^2)
Tensor init_constant(const Shape& shape, double value);

}  // namespace mt::nn
