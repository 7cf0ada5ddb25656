// Autocast: region state, the op policy, the cast cache.
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/fp8/fp8_rowwise.h"
#include "ops/ops.h"
#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

namespace mt {
namespace {

TEST(Autocast, RegionsNestAndRestore) {
  EXPECT_FALSE(autocast::is_enabled(DeviceType::cpu));
  {
    AutocastGuard outer(DeviceType::cpu, DType::bf16);
    EXPECT_TRUE(autocast::is_enabled(DeviceType::cpu));
    EXPECT_EQ(autocast::dtype(DeviceType::cpu), DType::bf16);
    EXPECT_FALSE(autocast::is_enabled(DeviceType::cuda));
    {
      AutocastGuard inner(DeviceType::cpu, DType::f16);
      EXPECT_EQ(autocast::dtype(DeviceType::cpu), DType::f16);
      {
        AutocastGuard off(DeviceType::cpu, /*enabled=*/false);
        EXPECT_FALSE(autocast::is_enabled(DeviceType::cpu));
      }
      EXPECT_TRUE(autocast::is_enabled(DeviceType::cpu));
    }
    EXPECT_EQ(autocast::dtype(DeviceType::cpu), DType::bf16);
  }
  EXPECT_FALSE(autocast::is_enabled(DeviceType::cpu));
}

TEST(Autocast, RejectsNonHalfDtypes) { EXPECT_THROW(AutocastGuard(DeviceType::cpu, DType::f32), DTypeError); }

TEST(Autocast, Fp32OpsUpcastHalfInputs) {
  for (DType low : {DType::f16, DType::bf16}) {
    AutocastGuard amp(DeviceType::cpu, low);
    const Tensor h = ones({4}, low);
    EXPECT_EQ(exp(h).dtype(), DType::f32);
    EXPECT_EQ(log(h).dtype(), DType::f32);
    EXPECT_EQ(pow(h, 2.0).dtype(), DType::f32);
    EXPECT_EQ(rsqrt(h).dtype(), DType::f32);
    EXPECT_EQ(sum(h).dtype(), DType::f32);
    EXPECT_EQ(mean(h).dtype(), DType::f32);
    EXPECT_EQ(var(h).dtype(), DType::f32);
    // Not in the table: runs in the input dtype.
    EXPECT_EQ(relu(h).dtype(), low);
    EXPECT_EQ(tanh(h).dtype(), low);
    // Widest type for mixed inputs.
    EXPECT_EQ((h + ones({4})).dtype(), DType::f32);
  }
}

TEST(Autocast, NeverTouchesF64OrOtherDevices) {
  AutocastGuard amp(DeviceType::cuda, DType::f16);  // a CUDA region does not affect CPU tensors
  EXPECT_EQ(exp(ones({2}, DType::f16)).dtype(), DType::f16);
  AutocastGuard cpu_amp(DeviceType::cpu, DType::f16);
  EXPECT_EQ(exp(ones({2}, DType::f64)).dtype(), DType::f64);
}

TEST(Autocast, GradientOfACastInputComesBackInItsDtype) {
  Tensor x = ones({3}, DType::bf16).requires_grad_();
  Tensor loss;
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    loss = sum(exp(x));  // exp runs in f32
  }
  EXPECT_EQ(loss.dtype(), DType::f32);
  loss.backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
}

TEST(Autocast, PolicyTableNamesEveryRequiredOp) {
  const char* lower[] = {"matmul",   "bmm",         "linear", "linear_gelu",
                         "mlp_gelu", "lora_linear", "conv2d", "scaled_dot_product_attention"};
  const char* fp32[] = {
      "exp",          "log",     "pow",         "rsqrt",         "layer_norm", "rms_norm", "add_layer_norm",
      "add_rms_norm", "softmax", "log_softmax", "cross_entropy", "sum",        "mean",     "var"};
  const char* promote[] = {"add", "sub", "mul", "div", "cat", "where"};
  for (const char* op : lower) EXPECT_EQ(autocast::policy_for(op), autocast::CastPolicy::lower_precision) << op;
  for (const char* op : fp32) EXPECT_EQ(autocast::policy_for(op), autocast::CastPolicy::fp32) << op;
  for (const char* op : promote) EXPECT_EQ(autocast::policy_for(op), autocast::CastPolicy::promote) << op;
  EXPECT_EQ(autocast::policy_for("relu"), autocast::CastPolicy::none);
}

// One row per op of the policy table: the dtype its output has inside a region.
struct PolicyRow {
  const char* op;
  std::function<Tensor(DType low)> run;  // builds inputs (f32 or `low` as the row needs) and runs the op
  bool expect_low;                       // true: the region's dtype; false: f32
};

std::vector<PolicyRow> policy_rows() {
  const auto f32 = [](const Shape& s) { return ones(s, DType::f32); };
  const auto half = [](const Shape& s, DType low) { return ones(s, low); };
  const Tensor ids = from_vector({0, 1}, {2}, DType::i64);
  const Tensor mask = from_vector({1, 0}, {2}, DType::boolean);
  return {
      {"matmul",
       [=](DType) {
         return matmul(f32({2, 3}), f32({3, 2}));
       },
       true},
      {"bmm",
       [=](DType) {
         return bmm(f32({1, 2, 3}), f32({1, 3, 2}));
       },
       true},
      {"linear",
       [=](DType) {
         return linear(f32({2, 3}), f32({4, 3}), f32({4}));
       },
       true},
      {"linear_gelu",
       [=](DType) {
         return linear_gelu(f32({2, 3}), f32({4, 3}), f32({4}));
       },
       true},
      {"mlp_gelu",
       [=](DType) {
         return mlp_gelu(f32({2, 3}), f32({4, 3}), f32({4}), f32({5, 4}), f32({5}));
       },
       true},
      {"lora_linear",
       [=](DType) {
         return lora_linear(f32({2, 3}), f32({2, 3}), f32({4, 3}), f32({4}), f32({2, 3}), f32({4, 2}), 2.0);
       },
       true},
      {"fp8_rowwise_linear",
       [=](DType) {
         const Fp8RowQuantized w = quantize_fp8_rows(f32({16, 16}));
         return fp8_rowwise_linear(f32({2, 16}), w.data, w.scale_inv, f32({16}));
       },
       true},
      {"fp8_lora_linear",
       [=](DType) {
         const Fp8RowQuantized w = quantize_fp8_rows(f32({16, 16}));
         return fp8_lora_linear(f32({2, 16}), f32({2, 16}), w.data, w.scale_inv, f32({16}), f32({2, 16}), f32({16, 2}),
                                2.0);
       },
       true},
      {"conv2d",
       [=](DType) {
         return conv2d(f32({1, 1, 3, 3}), f32({1, 1, 2, 2}));
       },
       true},
      {"scaled_dot_product_attention",
       [=](DType) {
         return scaled_dot_product_attention(f32({1, 1, 2, 4}), f32({1, 1, 2, 4}), f32({1, 1, 2, 4}));
       },
       true},
      {"exp", [=](DType low) { return exp(half({2}, low)); }, false},
      {"log", [=](DType low) { return log(half({2}, low)); }, false},
      {"pow", [=](DType low) { return pow(half({2}, low), 2.0); }, false},
      {"rsqrt", [=](DType low) { return rsqrt(half({2}, low)); }, false},
      {"layer_norm",
       [=](DType low) {
         return layer_norm(half({2, 4}, low), half({4}, low), half({4}, low));
       },
       false},
      {"rms_norm",
       [=](DType low) {
         return rms_norm(half({2, 4}, low), half({4}, low));
       },
       false},
      // x goes to f32; the half delta is read beside it, and the sum and the norm are f32.
      {"add_layer_norm",
       [=](DType low) {
         return add_layer_norm(half({2, 4}, low), half({2, 4}, low), half({4}, low), half({4}, low)).normed;
       },
       false},
      {"add_rms_norm",
       [=](DType low) {
         return add_rms_norm(half({2, 4}, low), half({2, 4}, low), half({4}, low)).sum;
       },
       false},
      {"softmax",
       [=](DType low) {
         return softmax(half({2, 4}, low));
       },
       false},
      {"log_softmax",
       [=](DType low) {
         return log_softmax(half({2, 4}, low));
       },
       false},
      {"cross_entropy",
       [=](DType low) {
         return cross_entropy(half({2, 4}, low), ids);
       },
       false},
      // Its GEMMs run in the low dtype (LinearCrossEntropy.UnderAutocastMatchesLinearThenCrossEntropy);
      // the loss it returns is f32, as every loss.
      {"linear_cross_entropy",
       [=](DType) {
         return linear_cross_entropy(f32({2, 4}), f32({3, 4}), ids);
       },
       false},
      {"sum", [=](DType low) { return sum(half({2}, low)); }, false},
      {"mean", [=](DType low) { return mean(half({2}, low)); }, false},
      {"var", [=](DType low) { return var(half({2}, low)); }, false},
      {"add", [=](DType low) { return add(half({2}, low), f32({2})); }, false},
      {"sub", [=](DType low) { return sub(half({2}, low), f32({2})); }, false},
      {"mul", [=](DType low) { return mul(half({2}, low), f32({2})); }, false},
      {"div", [=](DType low) { return div(half({2}, low), f32({2})); }, false},
      {"cat",
       [=](DType low) {
         return cat({half({2}, low), f32({2})}, 0);
       },
       false},
      {"stack",
       [=](DType low) {
         return stack({half({2}, low), f32({2})}, 0);
       },
       false},
      {"where", [=](DType low) { return where(mask, half({2}, low), f32({2})); }, false},
  };
}

TEST(AutocastPolicy, EveryTableOpProducesTheTableDtype) {
  const std::vector<PolicyRow> rows = policy_rows();
  for (DType low : {DType::f16, DType::bf16}) {
    AutocastGuard amp(DeviceType::cpu, low);
    for (const PolicyRow& row : rows) {
      const DType want = row.expect_low ? low : DType::f32;
      EXPECT_EQ(row.run(low).dtype(), want) << row.op << " under " << dtype_name(low) << " autocast";
    }
  }
  // Every op the table names has a row here.
  std::set<std::string> tested;
  for (const PolicyRow& row : rows) tested.insert(row.op);
  for (const auto& [op, policy] : autocast::policy_table()) {
    const std::string name = op;
    EXPECT_TRUE(tested.count(name)) << "no policy test row for " << name;
  }
}

TEST(AutocastPolicy, DisabledRegionRunsInInputDtypes) {
  AutocastGuard amp(DeviceType::cpu, DType::bf16);
  AutocastGuard off(DeviceType::cpu, /*enabled=*/false);
  EXPECT_EQ(matmul(ones({2, 2}), ones({2, 2})).dtype(), DType::f32);
  EXPECT_EQ(exp(ones({2}, DType::bf16)).dtype(), DType::bf16);
}

TEST(AutocastCache, AParameterUsedTwiceIsCastOnceAndAnInPlaceUpdateRecasts) {
  Tensor w = ones({4}).requires_grad_();  // an f32 leaf parameter
  AutocastGuard amp(DeviceType::cpu, DType::bf16);
  const uint64_t before = autocast::cast_count();
  const Tensor a = autocast::cast_input("matmul", w);
  const Tensor b = autocast::cast_input("matmul", w);
  EXPECT_EQ(a.dtype(), DType::bf16);
  EXPECT_EQ(autocast::cast_count() - before, 1u);
  EXPECT_EQ(a.impl(), b.impl());
  {
    NoGradGuard no_grad;
    w.fill_(2.0);  // an optimizer step inside the region
  }
  const Tensor c = autocast::cast_input("matmul", w);
  EXPECT_EQ(autocast::cast_count() - before, 2u);
  EXPECT_EQ(c.to_vector<double>()[0], 2.0);
}

// A linear layer's f32 parameters under autocast: the node records them directly (no Cast
// node), and their gradients come straight from the GEMM in f32, never rounded to bf16.
TEST(Autocast, LinearWritesItsF32ParametersGradientsInF32WithoutACastNode) {
  Generator gen(5);
  const Tensor x = randn({16, 24}, DType::f32, &gen).to(DType::bf16);
  const Tensor w = randn({8, 24}, DType::f32, &gen).requires_grad_();
  const Tensor b = randn({8}, DType::f32, &gen).requires_grad_();
  const Tensor dy = randn({16, 8}, DType::f32, &gen).to(DType::bf16);
  Tensor y;
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    y = linear(x, w, b);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  ASSERT_EQ(y.grad_fn()->name(), "LinearBackward");
  for (size_t i : {1u, 2u}) EXPECT_EQ(y.grad_fn()->next_edges[i].fn->name(), "AccumulateGrad") << "input " << i;
  y.backward(dy);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  // dW = dy^T x from the bf16 operands, summed and kept in f32: within f32 rounding of the f64
  // product, while rounding it to bf16 (as a bf16 GEMM output would be) is ~1e-3 away.
  const std::vector<double> want = matmul(dy.to(DType::f64).transpose(0, 1), x.to(DType::f64)).to_vector<double>();
  const std::vector<double> got = w.grad().to_vector<double>();
  const std::vector<double> rounded = from_vector(want, {8, 24}).to(DType::bf16).to_vector<double>();
  double err = 0, rounding = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    rounding = std::max(rounding, std::abs(rounded[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LE(err, 1e-6 * scale);
  EXPECT_GT(rounding, 100 * err);  // the check above would notice a bf16 dW
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().to_vector<double>(), sum(dy.to(DType::f64), {0}).to(DType::f32).to_vector<double>());
}

// mlp_gelu records its four f32 parameters as linear does: no Cast nodes, and gradients in f32.
TEST(Autocast, MlpGeluWritesItsF32ParametersGradientsInF32WithoutCastNodes) {
  Generator gen(6);
  const Tensor x = randn({16, 24}, DType::f32, &gen).to(DType::bf16);
  std::vector<Tensor> params = {randn({32, 24}, DType::f32, &gen), randn({32}, DType::f32, &gen),
                                randn({8, 32}, DType::f32, &gen), randn({8}, DType::f32, &gen)};
  for (Tensor& p : params) p.requires_grad_();
  Tensor y;
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    y = mlp_gelu(x, params[0], params[1], params[2], params[3]);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  ASSERT_EQ(y.grad_fn()->name(), "MlpGeluBackward");
  for (size_t i = 1; i <= 4; ++i) EXPECT_EQ(y.grad_fn()->next_edges[i].fn->name(), "AccumulateGrad") << "input " << i;
  y.backward(ones({16, 8}, DType::bf16));
  for (const Tensor& p : params) EXPECT_EQ(p.grad().dtype(), DType::f32);
}

TEST(AutocastCache, OperandCopiesAreCachedApartFromRecordedCasts) {
  Tensor w = ones({4}).requires_grad_();
  AutocastGuard amp(DeviceType::cpu, DType::bf16);
  const uint64_t before = autocast::cast_count();
  const Tensor copy = autocast::operand_copies("linear", {w})[0];
  const Tensor again = autocast::operand_copies("linear", {w})[0];
  const Tensor recorded = autocast::cast_input("linear", w);
  EXPECT_EQ(copy.impl(), again.impl());
  EXPECT_NE(copy.impl(), recorded.impl());
  EXPECT_EQ(autocast::cast_count() - before, 2u);
  EXPECT_EQ(copy.dtype(), DType::bf16);
  EXPECT_FALSE(copy.requires_grad());     // a plain copy: it records nothing
  EXPECT_TRUE(recorded.requires_grad());  // a Cast node's output
}

// A frozen weight (an f32 leaf that does not require grad, as a LoRA base's) is copied once for
// all regions while it is unchanged and frozen: a later step reuses the copy; an in-place
// change, or unfreezing it, makes a new one (and the unfrozen weight gets its gradient).
TEST(AutocastCache, FrozenOperandCopiesOutliveTheRegionUntilTheWeightChanges) {
  Tensor w = ones({3, 4});  // frozen
  const Tensor x = ones({2, 4}, DType::bf16);
  const auto step = [&] {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    const uint64_t before = autocast::cast_count();
    const Tensor y = linear(x, w);
    return std::make_pair(autocast::cast_count() - before, y);
  };
  EXPECT_EQ(step().first, 1u);
  EXPECT_EQ(step().first, 0u) << "the second region reuses the frozen weight's copy";
  {
    NoGradGuard no_grad;
    w.fill_(2.0);  // the version changes
  }
  const auto [casts, y] = step();
  EXPECT_EQ(casts, 1u);
  EXPECT_EQ(y.to_vector<double>()[0], 8.0);  // 4 x (1 x 2): the new values, not the stale copy
  w.requires_grad_();
  const auto [casts_trainable, y_trainable] = step();
  EXPECT_EQ(casts_trainable, 1u) << "a trainable weight is not served the frozen copy";
  sum(y_trainable).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
}

TEST(AutocastCache, NonParametersAreNotCached) {
  const Tensor activation = ones({4});  // does not require grad
  AutocastGuard amp(DeviceType::cpu, DType::f16);
  const uint64_t before = autocast::cast_count();
  autocast::cast_input("matmul", activation);
  autocast::cast_input("matmul", activation);
  EXPECT_EQ(autocast::cast_count() - before, 2u);
}

TEST(AutocastCache, ClearedWhenTheOutermostRegionExits) {
  Tensor w = ones({4}).requires_grad_();
  uint64_t before = 0;
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    before = autocast::cast_count();
    autocast::cast_input("matmul", w);
  }
  AutocastGuard again(DeviceType::cpu, DType::bf16);
  autocast::cast_input("matmul", w);
  EXPECT_EQ(autocast::cast_count() - before, 2u);
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// cross_entropy reads f16/bf16 logits directly (no f32 copy of [N, V]); widening is exact,
// so loss and gradient equal those of the cast-to-f32 route bit for bit.
TEST(Autocast, CrossEntropyOnLowPrecisionLogitsEqualsTheF32Route) {
  for (DType low : {DType::bf16, DType::f16}) {
    Generator gen(12);
    const Tensor base = randn({8, 50}, DType::f32, &gen).to(low);
    const Tensor target = from_vector({1, 4, 9, 49, 0, 3, 3, 17}, {8}, DType::i64);
    const Tensor direct = base.detach().requires_grad_(), routed = base.detach().requires_grad_();
    Tensor a;
    {
      AutocastGuard amp(DeviceType::cpu, low);
      a = cross_entropy(direct, target);
    }
    const Tensor b = cross_entropy(cast(routed, DType::f32), target);
    EXPECT_EQ(a.dtype(), DType::f32);
    EXPECT_EQ(a.item(), b.item()) << dtype_name(low);
    a.backward();
    b.backward();
    EXPECT_EQ(direct.grad().dtype(), low);
    EXPECT_EQ(direct.grad().to_vector<float>(), routed.grad().to_vector<float>()) << dtype_name(low);
  }
}

}  // namespace
}  // namespace mt
