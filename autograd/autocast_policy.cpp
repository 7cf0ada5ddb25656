// The autocast op policy: the one table (see autograd/autocast.h). docs/numerics.md shows
// it; tests/autograd/test_autocast_doc.cpp fails when the two differ.
#include <cstring>

#include "autograd/autocast.h"

namespace mt::autocast {

namespace {
using P = CastPolicy;
struct Entry {
  const char* op;
  CastPolicy policy;
};

constexpr Entry kPolicy[] = {
    // Tensor-core work: the low dtype.
    {"matmul", P::lower_precision},
    {"bmm", P::lower_precision},
    {"linear", P::lower_precision},
    {"linear_gelu", P::lower_precision},
    {"mlp_gelu", P::lower_precision},
    {"lora_linear", P::lower_precision},
    {"fp8_rowwise_linear", P::lower_precision},  // an FP8 GEMM; its output in the low dtype
    {"fp8_lora_linear", P::lower_precision},
    {"linear_cross_entropy", P::lower_precision},  // GEMMs low; its loss is f32 regardless
    {"conv2d", P::lower_precision},
    {"scaled_dot_product_attention", P::lower_precision},
    // Range or accumulation needs f32.
    {"exp", P::fp32},
    {"log", P::fp32},
    {"pow", P::fp32},
    {"rsqrt", P::fp32},
    {"layer_norm", P::fp32},
    {"rms_norm", P::fp32},
    {"add_layer_norm", P::fp32},  // x and the parameters; delta is read as it is
    {"add_rms_norm", P::fp32},
    {"softmax", P::fp32},
    {"log_softmax", P::fp32},
    {"cross_entropy", P::fp32},
    {"sum", P::fp32},
    {"mean", P::fp32},
    {"var", P::fp32},
    // Mixed inputs: the widest.
    {"add", P::promote},
    {"sub", P::promote},
    {"mul", P::promote},
    {"div", P::promote},
    {"cat", P::promote},
    {"stack", P::promote},
    {"where", P::promote},
};
}  // namespace

CastPolicy policy_for(const char* op) {
  for (const Entry& e : kPolicy) {
    if (std::strcmp(e.op, op) == 0) return e.policy;
  }
  return P::none;
}

std::vector<std::pair<const char*, CastPolicy>> policy_table() {
  std::vector<std::pair<const char*, CastPolicy>> table;
  for (const Entry& e : kPolicy) table.emplace_back(e.op, e.policy);
  return table;
}

const char* policy_name(CastPolicy policy) {
  switch (policy) {
    case P::lower_precision:
      return "lower precision (f16/bf16)";
    case P::fp32:
      return "f32";
    case P::promote:
      return "widest input type";
    case P::none:
      return "inputs' dtype";
  }
  return "?";
}

}  // namespace mt::autocast
