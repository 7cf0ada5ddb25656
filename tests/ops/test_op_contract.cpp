// Instantiates the op contract (tests/ops/op_contract.h) for every registered case:
// a float64 gradient check on the CPU and CUDA-vs-CPU per dtype.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/view.h"
#include "ops/backends.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/test_util.h"

namespace mt::testing {

std::vector<OpCase>& op_cases() {
  static std::vector<OpCase> cases;
  return cases;
}

namespace {

constexpr uint64_t kSeed = 1234;

// Floating inputs of a case, on the CPU in f64, drawn as the case asks.
std::vector<Tensor> make_inputs(const OpCase& c) {
  Generator gen(kSeed);
  std::vector<Tensor> inputs;
  for (const Shape& shape : c.shapes) {
    const TensorOptions f64 = TensorOptions().dtype(DType::f64);
    Tensor t;
    switch (c.values) {
      case Values::normal:
        t = randn(shape, f64, &gen);
        break;
      case Values::positive:
        t = uniform(shape, 0.5, 2.0, f64, &gen);
        break;
      case Values::away_from_zero: {
        NoGradGuard no_grad;
        const Tensor sign = uniform(shape, -1.0, 1.0, f64, &gen);
        const Tensor magnitude = abs(randn(shape, f64, &gen)) + 0.1;
        std::vector<double> s = sign.to_vector<double>(), m = magnitude.to_vector<double>();
        for (size_t i = 0; i < s.size(); ++i) s[i] = s[i] < 0 ? -m[i] : m[i];
        t = from_vector(s, shape, f64);
        break;
      }
    }
    inputs.push_back(t);
  }
  return inputs;
}

std::vector<Tensor> with_extra(const OpCase& c, std::vector<Tensor> floating, Device device) {
  if (c.extra_inputs) {
    for (const Tensor& e : c.extra_inputs()) floating.push_back(raw::to(e, device));
  }
  return floating;
}

// A fixed random weighting of the output, so that every output element matters.
Tensor weights_for(const Tensor& out) {
  Generator gen(kSeed + 1);
  return randn(out.shape(), TensorOptions().dtype(DType::f64), &gen);
}

double weighted_sum(const Tensor& out, const Tensor& w) {
  NoGradGuard no_grad;
  return sum(mul(raw::to(out, kCPU, DType::f64), w)).item();
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) { return op_cases()[info.param].name; }

class OpContract : public ::testing::TestWithParam<size_t> {
 protected:
  const OpCase& op_case() const { return op_cases()[GetParam()]; }
};

TEST_P(OpContract, GradcheckF64) {
  const OpCase& c = op_case();
  if (!c.gradcheck_skip_reason.empty()) GTEST_SKIP() << c.gradcheck_skip_reason;
  std::vector<Tensor> inputs = make_inputs(c);
  for (Tensor& t : inputs) t.requires_grad_(true);
  const std::vector<Tensor> all = with_extra(c, inputs, kCPU);
  const Tensor out = c.fn(all);
  const Tensor w = weights_for(out);
  sum(mul(out, w)).backward();

  constexpr double eps = 1e-6, atol = 1e-6, rtol = 1e-4;
  for (size_t k = 0; k < inputs.size(); ++k) {
    ASSERT_TRUE(inputs[k].grad().defined()) << c.name << ": input " << k << " received no gradient";
    const std::vector<double> analytic = inputs[k].grad().to_vector<double>();
    std::vector<double> values = inputs[k].to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) {
      auto loss_at = [&](double v) {
        std::vector<double> shifted = values;
        shifted[i] = v;
        std::vector<Tensor> probe = inputs;
        probe[k] = from_vector(shifted, inputs[k].shape(), TensorOptions().dtype(DType::f64));
        NoGradGuard no_grad;
        return weighted_sum(c.fn(with_extra(c, probe, kCPU)), w);
      };
      const double numeric = (loss_at(values[i] + eps) - loss_at(values[i] - eps)) / (2 * eps);
      ASSERT_NEAR(analytic[i], numeric, atol + rtol * std::fabs(numeric))
          << c.name << ": gradient of input " << k << " element " << i;
    }
  }
}

double relative_error(const Tensor& got, const Tensor& ref) {
  const std::vector<double> a = got.to_vector<double>(), b = ref.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

class OpContractCuda : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

TEST_P(OpContractCuda, CudaMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const OpCase& c = op_cases()[std::get<0>(GetParam())];
  const DType dtype = std::get<1>(GetParam());
  if (!c.cuda) GTEST_SKIP() << c.cuda_skip_reason;
  backends::TF32Guard exact_f32(/*matmul=*/false, /*conv=*/false);  // f32 is held to f32 accuracy here
  const double tol = dtype == DType::f32    ? (c.tol_f32 ? c.tol_f32 : kTolF32)
                     : dtype == DType::bf16 ? (c.tol_bf16 ? c.tol_bf16 : kTolBF16)
                                            : (c.tol_f16 ? c.tol_f16 : kTolF16);

  // The reference sees exactly the rounded inputs the GPU sees.
  std::vector<Tensor> ref_inputs, gpu_inputs;
  for (const Tensor& t : make_inputs(c)) {
    const Tensor rounded = raw::to(t, dtype);
    ref_inputs.push_back(raw::to(rounded, DType::f64).requires_grad_(true));
    gpu_inputs.push_back(raw::to(rounded, cuda_device(0)).requires_grad_(true));
  }
  const Tensor ref_out = c.fn(with_extra(c, ref_inputs, kCPU));
  const Tensor gpu_out = c.fn(with_extra(c, gpu_inputs, cuda_device(0)));
  ASSERT_EQ(gpu_out.shape(), ref_out.shape()) << c.name;
  ASSERT_TRUE(gpu_out.is_cuda()) << c.name << ": output left the GPU";

  const double out_err = relative_error(gpu_out, ref_out);
  EXPECT_LE(out_err, tol) << c.name << " " << dtype_name(dtype) << ": forward relative error";

  const Tensor w = raw::to(weights_for(ref_out), dtype);  // both sides weight by the same rounded values
  sum(mul(ref_out, raw::to(w, DType::f64))).backward();
  sum(mul(gpu_out, raw::to(w, cuda_device(0)))).backward();
  for (size_t k = 0; k < gpu_inputs.size(); ++k) {
    ASSERT_TRUE(gpu_inputs[k].grad().defined()) << c.name << ": no gradient for input " << k;
    const double grad_err = relative_error(gpu_inputs[k].grad(), ref_inputs[k].grad());
    EXPECT_LE(grad_err, tol) << c.name << " " << dtype_name(dtype) << ": gradient of input " << k;
  }
  std::printf("[ cuda-vs-cpu ] %-28s %-5s forward %.2e (tol %.0e)\n", c.name.c_str(), dtype_name(dtype), out_err, tol);
}

// ---- NaN and inf ----
// Note [NaN and inf in the op contract]: PyTorch's ops let a NaN through to every output that
// depends on it (relu(NaN) = NaN, max over a NaN is NaN, dropout multiplies by its mask), so that
// an fp16 overflow is seen by the loss scaler and by anomaly detection; a select such as
// `x > 0 ? x : 0` would hide it. Element-wise values and gradients at NaN and +-inf are held to
// PyTorch's own in test_nan_inf.cpp; here every registered case is held to the rule above: with
// one input element set to NaN, each output element that depends on it (one that moves when the
// element moves by +-3) must be NaN. On CUDA, for a NaN and for an inf input element, the outputs
// and gradients must be NaN where the f64 CPU reference is NaN, non-finite where it is +-inf (a
// GEMM may meet the inf with a zero the CPU's does not, and make NaN of it: the overflow shows
// either way) and finite where it is finite; a case whose CUDA path multiplies other zeros than
// the CPU's (cuda_nonfinite_may_differ) is held to the dependency rule on CUDA instead.

// One element of input k (its middle one) is the probe.
int64_t probed_element(const Tensor& t) { return t.numel() / 2; }

std::vector<Tensor> with_element(const std::vector<Tensor>& inputs, size_t k, double value) {
  std::vector<Tensor> out = inputs;
  std::vector<double> v = inputs[k].to_vector<double>();
  v[probed_element(inputs[k])] = value;
  out[k] = from_vector(v, inputs[k].shape(), TensorOptions().dtype(inputs[k].dtype()));
  return out;
}

std::vector<double> output_of(const OpCase& c, const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;
  return raw::to(c.fn(with_extra(c, inputs, kCPU)), kCPU, DType::f64).to_vector<double>();
}

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Which output elements move when input k's probed element moves by +-3.
std::vector<bool> dependents_of(const OpCase& c, const std::vector<Tensor>& inputs, size_t k) {
  const std::vector<double> base = output_of(c, inputs);
  const double value = inputs[k].to_vector<double>()[probed_element(inputs[k])];
  std::vector<bool> depends(base.size(), false);
  for (const double delta : {3.0, -3.0}) {
    const std::vector<double> moved = output_of(c, with_element(inputs, k, value + delta));
    for (size_t i = 0; i < base.size(); ++i) depends[i] = depends[i] || !same_value(moved[i], base[i]);
  }
  return depends;
}

// Each output element in `depends` is NaN in `with_nan`. An input element no output reads (an
// embedding row no id picks) asks nothing.
void expect_nan_where_dependent(const std::vector<double>& with_nan, const std::vector<bool>& depends,
                                const std::string& what) {
  ASSERT_EQ(with_nan.size(), depends.size()) << what;
  for (size_t i = 0; i < depends.size(); ++i) {
    if (depends[i]) {
      EXPECT_TRUE(std::isnan(with_nan[i]))
          << what << ": output element " << i << " depends on the NaN input element but came out as " << with_nan[i];
    }
  }
}

std::string probe_name(const OpCase& c, const std::vector<Tensor>& inputs, size_t k) {
  return c.name + ": input " + std::to_string(k) + " element " + std::to_string(probed_element(inputs[k]));
}

TEST_P(OpContract, NanReachesEveryDependentOutput) {
  const OpCase& c = op_case();
  const std::vector<Tensor> inputs = make_inputs(c);
  for (size_t k = 0; k < inputs.size(); ++k) {
    expect_nan_where_dependent(output_of(c, with_element(inputs, k, NAN)), dependents_of(c, inputs, k),
                               probe_name(c, inputs, k) + " set to NaN");
  }
}

enum class Kind { nan, pos_inf, neg_inf, finite };
Kind kind_of(double v) {
  if (std::isnan(v)) return Kind::nan;
  if (std::isinf(v)) return v > 0 ? Kind::pos_inf : Kind::neg_inf;
  return Kind::finite;
}
const char* kind_name(Kind k) {
  static const char* const names[] = {"NaN", "+inf", "-inf", "finite"};  // in Kind's order
  return names[static_cast<int>(k)];
}

// NaN where ref is NaN (or either infinity when inf_for_nan), non-finite where it is +-inf (the same
// infinity or NaN), finite where it is finite.
void expect_same_kinds(const Tensor& got, const Tensor& ref, const std::string& what, bool inf_for_nan) {
  const std::vector<double> a = got.to_vector<double>(), b = ref.to_vector<double>();
  ASSERT_EQ(a.size(), b.size()) << what;
  int shown = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const Kind want = kind_of(b[i]), have = kind_of(a[i]);
    if (have == want || (have == Kind::nan && (want == Kind::pos_inf || want == Kind::neg_inf))) continue;
    if (inf_for_nan && want == Kind::nan && (have == Kind::pos_inf || have == Kind::neg_inf)) continue;
    ADD_FAILURE() << what << " element " << i << ": CUDA gives " << a[i] << " (" << kind_name(have)
                  << "), the f64 CPU reference " << b[i] << " (" << kind_name(want) << ")";
    if (++shown == 4) return;
  }
}

TEST_P(OpContractCuda, NonFiniteWhereTheCpuIsNonFinite) {
  MT_SKIP_WITHOUT_CUDA();
  const OpCase& c = op_cases()[std::get<0>(GetParam())];
  const DType dtype = std::get<1>(GetParam());
  if (!c.cuda) GTEST_SKIP() << c.cuda_skip_reason;
  backends::TF32Guard exact_f32(/*matmul=*/false, /*conv=*/false);
  std::vector<Tensor> inputs;  // as the GPU sees them, in f64 on the CPU
  for (const Tensor& t : make_inputs(c)) inputs.push_back(raw::to(raw::to(t, dtype), DType::f64));
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!c.cuda_nonfinite_reason.empty()) {
      const std::vector<Tensor> probed = with_element(inputs, k, NAN);
      std::vector<Tensor> gpu_inputs;
      for (const Tensor& t : probed) gpu_inputs.push_back(raw::to(t, cuda_device(0), dtype));
      NoGradGuard no_grad;
      const Tensor gpu_out = c.fn(with_extra(c, gpu_inputs, cuda_device(0)));
      expect_nan_where_dependent(raw::to(gpu_out, kCPU, DType::f64).to_vector<double>(), dependents_of(c, inputs, k),
                                 probe_name(c, inputs, k) + " set to NaN, " + dtype_name(dtype) + " on CUDA (" +
                                     c.cuda_nonfinite_reason + ")");
      continue;
    }
    for (const double special : {static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
      const std::string what = probe_name(c, inputs, k) + " = " + (std::isnan(special) ? "NaN" : "inf") + ", " +
                               dtype_name(dtype) + " on CUDA";
      std::vector<Tensor> ref_inputs, gpu_inputs;
      for (const Tensor& t : with_element(inputs, k, special)) {
        ref_inputs.push_back(t.detach().requires_grad_(true));
        gpu_inputs.push_back(raw::to(t, cuda_device(0), dtype).requires_grad_(true));
      }
      const Tensor ref_out = c.fn(with_extra(c, ref_inputs, kCPU));
      const Tensor gpu_out = c.fn(with_extra(c, gpu_inputs, cuda_device(0)));
      const bool inf_for_nan = !c.cuda_inf_for_nan_reason.empty();
      expect_same_kinds(gpu_out, ref_out, what + ": output", inf_for_nan);
      const Tensor w = raw::to(weights_for(ref_out), dtype);
      sum(mul(ref_out, raw::to(w, DType::f64))).backward();
      sum(mul(gpu_out, raw::to(w, cuda_device(0)))).backward();
      for (size_t j = 0; j < gpu_inputs.size(); ++j) {
        ASSERT_TRUE(gpu_inputs[j].grad().defined()) << what << ": no gradient for input " << j;
        expect_same_kinds(gpu_inputs[j].grad(), ref_inputs[j].grad(), what + ": gradient of input " + std::to_string(j),
                          inf_for_nan);
      }
    }
  }
}

std::vector<size_t> all_cases() {
  std::vector<size_t> ids(op_cases().size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  return ids;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpContract, ::testing::ValuesIn(all_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Ops, OpContractCuda,
                         ::testing::Combine(::testing::ValuesIn(all_cases()),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, DType>>& info) {
                           return op_cases()[std::get<0>(info.param)].name + "_" + dtype_name(std::get<1>(info.param));
                         });

// Every differentiable op named by the op library must have at least one case.
TEST(OpContractCoverage, EveryDifferentiableOpIsChecked) {
  const std::vector<std::string> required = {"add",           "sub",         "mul",         "div",
                                             "neg",           "exp",         "log",         "sqrt",
                                             "rsqrt",         "pow",         "abs",         "tanh",
                                             "sigmoid",       "relu",        "gelu_erf",    "gelu_tanh",
                                             "silu",          "sum",         "mean",        "max",
                                             "var",           "reshape",     "transpose",   "permute",
                                             "slice",         "expand",      "cast",        "matmul",
                                             "bmm",           "linear",      "softmax",     "log_softmax",
                                             "cross_entropy", "layer_norm",  "rms_norm",    "embedding",
                                             "dropout",       "where",       "masked_fill", "cat",
                                             "stack",         "split",       "sdpa",        "linear_cross_entropy",
                                             "sdpa_causal",   "conv2d",      "max_pool2d",  "avg_pool2d",
                                             "lora_linear",   "linear_gelu", "mlp_gelu",    "add_layer_norm",
                                             "add_rms_norm",  "sdpa_gqa",    "rope",        "swiglu",
                                             "sdpa_masked"};
  std::set<std::string> covered;
  size_t gradchecked = 0;
  for (const OpCase& c : op_cases()) {
    covered.insert(c.op);
    if (c.gradcheck_skip_reason.empty()) {
      ++gradchecked;
    } else {
      std::printf("[ coverage ] %s: f64 gradcheck skipped: %s\n", c.name.c_str(), c.gradcheck_skip_reason.c_str());
    }
  }
  std::vector<std::string> missing;
  for (const std::string& op : required) {
    if (!covered.count(op)) missing.push_back(op);
  }
  std::printf("[ coverage ] %zu op cases over %zu ops; %zu of them gradient-checked in f64\n", op_cases().size(),
              covered.size(), gradchecked);
  std::string list;
  for (const std::string& m : missing) list += " " + m;
  EXPECT_TRUE(missing.empty()) << "ops without a gradient-check case:" << list;
}

}  // namespace
}  // namespace mt::testing
