// Op-contract cases for the element-wise, reduction and shape families, plus
// behaviour the contract does not cover (broadcast errors, promotion).
#include <cmath>
#include <functional>

#include "autograd/node.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

using In = std::vector<Tensor>;

// ---- element-wise ----
MT_OP_CASE(OpCase("add", "add_broadcast").inputs({{2, 3}, {3}}).compute([](const In& x) { return x[0] + x[1]; }));
MT_OP_CASE(OpCase("add", "add_scalar").inputs({{4}}).compute([](const In& x) { return x[0] + 2.5; }));
MT_OP_CASE(OpCase("sub", "sub_broadcast").inputs({{2, 1, 3}, {4, 1}}).compute([](const In& x) { return x[0] - x[1]; }));
MT_OP_CASE(OpCase("mul", "mul_broadcast").inputs({{3, 4}, {3, 1}}).compute([](const In& x) { return x[0] * x[1]; }));
MT_OP_CASE(OpCase("mul", "mul_self").inputs({{3, 4}}).compute([](const In& x) { return x[0] * x[0]; }));
MT_OP_CASE(OpCase("mul", "mul_scalar").inputs({{5}}).compute([](const In& x) { return x[0] * -3.0; }));
MT_OP_CASE(OpCase("div", "div_broadcast").inputs({{2, 3}, {3}}).draw(Values::positive).compute([](const In& x) {
  return x[0] / x[1];
}));
MT_OP_CASE(OpCase("div", "rdiv_scalar").inputs({{4}}).draw(Values::positive).compute([](const In& x) {
  return 2.0 / x[0];
}));
MT_OP_CASE(OpCase("neg", "neg").inputs({{2, 3}}).compute([](const In& x) { return -x[0]; }));
MT_OP_CASE(OpCase("exp", "exp").inputs({{2, 3}}).compute([](const In& x) { return exp(x[0]); }));
MT_OP_CASE(OpCase("log", "log").inputs({{2, 3}}).draw(Values::positive).compute([](const In& x) { return log(x[0]); }));
MT_OP_CASE(OpCase("sqrt", "sqrt").inputs({{2, 3}}).draw(Values::positive).compute([](const In& x) {
  return sqrt(x[0]);
}));
MT_OP_CASE(OpCase("rsqrt", "rsqrt").inputs({{2, 3}}).draw(Values::positive).compute([](const In& x) {
  return rsqrt(x[0]);
}));
MT_OP_CASE(OpCase("pow", "pow_2_5").inputs({{2, 3}}).draw(Values::positive).compute([](const In& x) {
  return pow(x[0], 2.5);
}));
MT_OP_CASE(OpCase("abs", "abs").inputs({{2, 3}}).draw(Values::away_from_zero).compute([](const In& x) {
  return abs(x[0]);
}));
MT_OP_CASE(OpCase("tanh", "tanh").inputs({{2, 3}}).compute([](const In& x) { return tanh(x[0]); }));
MT_OP_CASE(OpCase("sigmoid", "sigmoid").inputs({{2, 3}}).compute([](const In& x) { return sigmoid(x[0]); }));
MT_OP_CASE(OpCase("relu", "relu").inputs({{2, 3}}).draw(Values::away_from_zero).compute([](const In& x) {
  return relu(x[0]);
}));
MT_OP_CASE(OpCase("silu", "silu").inputs({{2, 3}}).compute([](const In& x) { return silu(x[0]); }));
MT_OP_CASE(OpCase("gelu_erf", "gelu_erf").inputs({{2, 3}}).compute([](const In& x) { return gelu(x[0]); }));
MT_OP_CASE(OpCase("gelu_tanh", "gelu_tanh").inputs({{2, 3}}).compute([](const In& x) {
  return gelu(x[0], GeluApproximation::tanh);
}));

// ---- reductions ----
MT_OP_CASE(OpCase("sum", "sum_all").inputs({{3, 4}}).compute([](const In& x) { return sum(x[0]); }));
MT_OP_CASE(OpCase("sum", "sum_dims_keepdim").inputs({{2, 3, 4}}).compute([](const In& x) {
  return sum(x[0], {0, 2}, true);
}));
// Sums over leading dims take the CUDA column kernel: 200 rows make 3 row groups
// (partials, then a second pass), 41 columns a partial tile (and no 16-byte rows, so the
// element-wise kernel; Reduction.CudaColumnSumsOfTallMatricesMatchTheCpu has the packed one); [2, 40, 33] over
// {0, 1} merges the reduced dims into one stride; an expanded input re-reads rows.
MT_OP_CASE(OpCase("sum", "sum_leading_dim_row_groups").inputs({{200, 41}}).compute([](const In& x) {
  return sum(x[0], {0});
}));
MT_OP_CASE(OpCase("sum", "sum_two_leading_dims").inputs({{2, 40, 33}}).compute([](const In& x) {
  return sum(x[0], {0, 1});
}));
MT_OP_CASE(OpCase("sum", "sum_expanded_leading_dim").inputs({{3, 5}}).compute([](const In& x) {
  return sum(x[0].expand({130, 3, 5}), {0});
}));
MT_OP_CASE(OpCase("max", "max_leading_dim_row_groups")
               .inputs({{150, 7}})
               .draw(Values::away_from_zero)
               .compute([](const In& x) { return max(x[0], 0); }));
MT_OP_CASE(OpCase("mean", "mean_dim").inputs({{3, 5}}).compute([](const In& x) { return mean(x[0], {-1}); }));
MT_OP_CASE(OpCase("max", "max_dim").inputs({{3, 5}}).draw(Values::away_from_zero).compute([](const In& x) {
  return max(x[0], 1);
}));
MT_OP_CASE(OpCase("var", "var_dim").inputs({{4, 6}}).compute([](const In& x) { return var(x[0], {1}); }));

// ---- shape ----
MT_OP_CASE(OpCase("reshape", "reshape").inputs({{2, 6}}).compute([](const In& x) {
  return x[0].reshape({3, 4}) * 2.0;
}));
MT_OP_CASE(OpCase("transpose", "transpose").inputs({{2, 3}}).compute([](const In& x) {
  return x[0].transpose(0, 1).contiguous();
}));
MT_OP_CASE(OpCase("permute", "permute").inputs({{2, 3, 4}}).compute([](const In& x) {
  return x[0].permute({2, 0, 1});
}));
MT_OP_CASE(OpCase("slice", "slice_step").inputs({{6, 3}}).compute([](const In& x) { return x[0].slice(0, 1, 6, 2); }));
MT_OP_CASE(OpCase("slice", "narrow").inputs({{4, 5}}).compute([](const In& x) { return x[0].narrow(1, 1, 3); }));
MT_OP_CASE(OpCase("expand", "expand").inputs({{3, 1}}).compute([](const In& x) { return x[0].expand({2, 3, 4}); }));
MT_OP_CASE(OpCase("reshape", "squeeze_unsqueeze").inputs({{3, 1}}).compute([](const In& x) {
  return x[0].squeeze(1).unsqueeze(0) * x[0].squeeze(1).unsqueeze(0);
}));
MT_OP_CASE(OpCase("cast", "cast_to_f64")
               .inputs({{2, 3}})
               .compute([](const In& x) { return x[0].to(DType::f64) * 1.5; })
               .no_gradcheck("a 1e-6 perturbation does not survive rounding to a narrower dtype; "
                             "Shape.CastGradientKeepsSourceDtype checks the gradient"));

TEST(Elementwise, BroadcastErrorNamesOpAndShapes) {
  try {
    add(ones({2, 3}), ones({4}));
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
}

TEST(Elementwise, MixedDtypesPromoteToTheWiderType) {
  const Tensor a = ones({2}, DType::f16), b = ones({2}, DType::f32);
  EXPECT_EQ((a + b).dtype(), DType::f32);
  EXPECT_EQ((a * ones({2}, DType::bf16)).dtype(), DType::f32);
}

TEST(Elementwise, GradientOfPromotedInputKeepsItsDtype) {
  Tensor a = ones({2}, DType::f16).requires_grad_();
  Tensor b = ones({2}, DType::f32).requires_grad_();
  sum(a * b).backward();
  EXPECT_EQ(a.grad().dtype(), DType::f16);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
}

// mul(x, x) records one node with one edge (one backward kernel): its output and x's gradient
// must equal those of x times an equal but separate leaf y, x.grad + y.grad, bit for bit, but
// for a gradient whose g x is subnormal (f16: below 2^-14), which may differ by 2^-24.
void expect_square_equals_product_of_two_leaves(Device device) {
  Generator gen(17);
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor values = randn({1037}, DType::f32, &gen).to(dtype).to(device);
    const Tensor dy = randn({1037}, DType::f32, &gen).to(dtype).to(device);
    Tensor x = values.clone().requires_grad_();
    const Tensor square = mul(x, x);
    square.backward(dy);
    Tensor a = values.clone().requires_grad_(), b = values.clone().requires_grad_();
    const Tensor product = mul(a, b);
    product.backward(dy);
    EXPECT_EQ(square.grad_fn()->next_edges.size(), 1u);
    EXPECT_EQ(square.to_vector<double>(), product.to_vector<double>()) << dtype_name(dtype) << " on " << device.str();
    const std::vector<double> got = x.grad().to_vector<double>();
    const std::vector<double> want = add(a.grad(), b.grad()).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    const double subnormal_step = dtype == DType::f16 ? std::ldexp(1.0, -24) : 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(std::fabs(got[i] - want[i]), std::fabs(want[i]) < std::ldexp(1.0, -13) ? subnormal_step : 0.0)
          << dtype_name(dtype) << " on " << device.str() << " [" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
}

TEST(Elementwise, ATensorTimesItselfEqualsTheProductOfTwoEqualLeaves) {
  expect_square_equals_product_of_two_leaves(Device("cpu"));
}

TEST(Elementwise, CudaATensorTimesItselfEqualsTheProductOfTwoEqualLeaves) {
  MT_SKIP_WITHOUT_CUDA();
  expect_square_equals_product_of_two_leaves(cuda_device(0));
}

// On CUDA an f32 with an f16/bf16 operand of the same shape runs one kernel that widens
// the half input in registers: the values must be those of widening it first, in either
// operand order, with a tail of a partial pack, and for a misaligned view (which takes
// the general path).
TEST(Elementwise, CudaF32WithHalfOperandEqualsWideningItFirst) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(31);
  const Device cuda = cuda_device(0);
  using Fn = Tensor (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, Fn> ops[] = {{"add", &add}, {"sub", &sub}, {"mul", &mul}, {"div", &div}};
  for (const DType half : {DType::bf16, DType::f16}) {
    const Tensor wide = uniform({1038}, 0.5, 2.0, DType::f32, &gen).to(cuda);
    const Tensor narrow_base = uniform({1038}, 0.5, 2.0, half, &gen).to(cuda);
    for (const int64_t offset : {0, 1}) {  // 1: a view the packs cannot read
      const Tensor a = wide.narrow(0, offset, 1037), b = narrow_base.narrow(0, offset, 1037);
      for (const auto& [name, op] : ops) {
        const Tensor b32 = b.to(DType::f32);
        EXPECT_EQ(op(a, b).to_vector<double>(), op(a, b32).to_vector<double>())
            << name << " f32 with " << dtype_name(half) << ", offset " << offset;
        EXPECT_EQ(op(b, a).to_vector<double>(), op(b32, a).to_vector<double>())
            << name << " " << dtype_name(half) << " with f32, offset " << offset;
        EXPECT_EQ(op(b, a).dtype(), DType::f32);
      }
    }
  }
  // The half operand's gradient comes back in its dtype.
  Tensor x = randn({64}, DType::f32, &gen).to(cuda).requires_grad_();
  Tensor h = randn({64}, DType::bf16, &gen).to(cuda).requires_grad_();
  sum(add(x, h)).backward();
  EXPECT_EQ(h.grad().dtype(), DType::bf16);
  EXPECT_EQ(h.grad().to_vector<double>(), std::vector<double>(64, 1.0));
}

// On CUDA an operand repeated along the output's leading dims (a bias, a position table over a
// batch) takes a kernel that reads its period once per thread, in either operand order: the
// values equal the CPU's bit for bit, for periods of whole packs (f32, f16, bf16), a period of
// one pack, more repeats than the grid has rows of blocks (70000 x 8: each thread loops over
// repeats), and a period that is not whole packs (which takes the general path).
TEST(Elementwise, CudaRepeatedOperandMatchesTheCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(37);
  const Device cuda = cuda_device(0);
  using Fn = Tensor (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, Fn> ops[] = {{"add", &add}, {"sub", &sub}, {"mul", &mul}, {"div", &div}};
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{9, 7, 16}, {7, 16}}, {{300, 8}, {8}}, {{70000, 8}, {8}}, {{5, 3, 40}, {1, 3, 40}}, {{6, 5, 3}, {5, 3}}};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const auto& [big, small] : shapes) {
      const Tensor x = uniform(big, 0.5, 2.0, dtype, &gen), p = uniform(small, 0.5, 2.0, dtype, &gen);
      const Tensor xg = x.to(cuda), pg = p.to(cuda);
      for (const auto& [name, op] : ops) {
        const std::string what =
            std::string(name) + " " + dtype_name(dtype) + " " + shape_str(big) + " and " + shape_str(small);
        EXPECT_EQ(op(xg, pg).to_vector<double>(), op(x, p).to_vector<double>()) << what;
        EXPECT_EQ(op(pg, xg).to_vector<double>(), op(p, x).to_vector<double>()) << what << ", swapped";
      }
    }
  }
  // A period of more packs than the grid has threads (each thread loops over the period too).
  const Tensor x = uniform({2, 4400000}, 0.5, 2.0, DType::f32, &gen),
               p = uniform({4400000}, 0.5, 2.0, DType::f32, &gen);
  EXPECT_EQ(add(x.to(cuda), p.to(cuda)).to_vector<float>(), add(x, p).to_vector<float>());
}

// The CPU element loops run dense operands laid out alike as one vectorised loop (ops/loops.h) and
// anything else as the strided walk: the same values through both, bit for bit, in every floating
// dtype, forward and backward. The strided operands are transposed views of transposed copies;
// [300, 257] is several parallel chunks, and the values (|x| up to 4) reach both of tanh's ranges.
TEST(Elementwise, CpuDenseAndStridedLoopsGiveTheSameBits) {
  Generator gen(61);
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const Tensor a0 = uniform({300, 257}, -4.0, 4.0, dtype, &gen), b0 = uniform({300, 257}, 0.5, 2.0, dtype, &gen);
    const Tensor dy = uniform({300, 257}, -1.0, 1.0, dtype, &gen);
    const auto strided = [](const Tensor& t) { return t.transpose(0, 1).contiguous().transpose(0, 1); };
    const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
        {"gelu tanh", [](const Tensor& a, const Tensor&) { return gelu(a, GeluApproximation::tanh); }},
        {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }},
        {"sigmoid", [](const Tensor& a, const Tensor&) { return sigmoid(a); }},
        {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
        {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
        {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
    };
    for (const auto& [name, op] : ops) {
      const std::string what = std::string(name) + " " + dtype_name(dtype);
      Tensor a = a0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      Tensor as = strided(a0).detach().requires_grad_(), bs = strided(b0).detach().requires_grad_();
      ASSERT_FALSE(as.is_contiguous()) << what;
      const Tensor dense_out = op(a, b), strided_out = op(as, bs);
      EXPECT_EQ(dense_out.to_vector<double>(), strided_out.to_vector<double>()) << what;
      dense_out.backward(dy);
      strided_out.backward(strided(dy));
      EXPECT_EQ(a.grad().to_vector<double>(), as.grad().to_vector<double>()) << what << " (input gradient)";
    }
  }
}

TEST(Elementwise, ValuesMatchTheFormulas) {
  const Tensor x = from_vector({-1.0, 0.5, 2.0}, {3}, DType::f64);
  const std::vector<double> g = gelu(x).to_vector<double>();
  EXPECT_NEAR(g[2], 2.0 * 0.5 * (1 + std::erf(2.0 / std::sqrt(2.0))), 1e-12);
  const std::vector<double> s = silu(x).to_vector<double>();
  EXPECT_NEAR(s[0], -1.0 / (1 + std::exp(1.0)), 1e-12);
  EXPECT_EQ(relu(x).to_vector<double>(), (std::vector<double>{0.0, 0.5, 2.0}));
}

TEST(Reduction, SumMeanMaxVarValues) {
  const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  EXPECT_EQ(sum(x, {1}).to_vector<double>(), (std::vector<double>{6, 15}));
  EXPECT_EQ(mean(x, {0}).to_vector<double>(), (std::vector<double>{2.5, 3.5, 4.5}));
  EXPECT_EQ(max(x, 1).to_vector<double>(), (std::vector<double>{3, 6}));
  EXPECT_EQ(max(x).item(), 6.0);
  EXPECT_NEAR(var(x).item(), 3.5, 1e-12);
  EXPECT_EQ(sum(x, {0}, true).shape(), (Shape{1, 3}));
}

// The CPU reduction of `values` (row-major over `shape`, f32) over `dims` as a plain loop: each
// output combines its elements one after another in index order, in f32.
std::vector<double> reduce_in_index_order(const std::vector<double>& values, const Shape& shape,
                                          const std::vector<int64_t>& dims, bool is_max) {
  std::vector<bool> reduced(shape.size(), false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
  std::vector<size_t> kept_axes, reduced_axes;
  for (size_t d = 0; d < shape.size(); ++d) (reduced[d] ? reduced_axes : kept_axes).push_back(d);
  auto count = [&](const std::vector<size_t>& axes) {
    int64_t n = 1;
    for (size_t d : axes) n *= shape[d];
    return n;
  };
  // The flat row-major index of the element at kept index k and reduced index r.
  auto flat_index = [&](int64_t k, int64_t r) {
    std::vector<int64_t> index(shape.size());
    for (size_t a = kept_axes.size(); a-- > 0;) index[kept_axes[a]] = k % shape[kept_axes[a]], k /= shape[kept_axes[a]];
    for (size_t a = reduced_axes.size(); a-- > 0;) {
      index[reduced_axes[a]] = r % shape[reduced_axes[a]], r /= shape[reduced_axes[a]];
    }
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
    return static_cast<size_t>(flat);
  };
  std::vector<double> out;
  for (int64_t k = 0; k < count(kept_axes); ++k) {
    float acc = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
    for (int64_t r = 0; r < count(reduced_axes); ++r) {
      const auto v = static_cast<float>(values[flat_index(k, r)]);
      acc = is_max ? ((acc > v || acc != acc) ? acc : v) : acc + v;
    }
    out.push_back(acc);
  }
  return out;
}

// CPU sums and maxima combine each output's elements in index order whatever the layout
// (contiguous, permuted, expanded, narrowed) and however many threads share the outputs: equal
// to a plain loop bit for bit. The shapes give outputs adjacent in memory (rows added into
// running outputs) and apart (each output walked), over more elements than one thread takes.
TEST(Reduction, CpuReductionsCombineInIndexOrderWhateverTheLayout) {
  Generator gen(47);
  const Tensor base = randn({64, 3, 200}, DType::f32, &gen);
  const Tensor row = randn({1, 5, 70}, DType::f32, &gen);
  const std::vector<std::pair<const char*, Tensor>> views = {
      {"contiguous", base},
      {"permuted", base.permute({2, 0, 1})},
      {"transposed", base.transpose(0, 2)},
      {"narrowed", base.narrow(2, 3, 150)},
      {"expanded", row.expand({300, 5, 70})},
  };
  const std::vector<std::vector<int64_t>> dim_sets = {{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (const auto& [name, x] : views) {
    const std::vector<double> values = x.contiguous().to_vector<double>();
    for (const auto& dims : dim_sets) {
      std::string what = std::string(name) + " over {";
      for (int64_t d : dims) what += std::to_string(d) + ",";
      what += "}";
      EXPECT_EQ(sum(x, dims).to_vector<double>(), reduce_in_index_order(values, x.shape(), dims, false))
          << "sum, " << what;
      if (dims.size() == 1) {
        EXPECT_EQ(max(x, dims[0]).to_vector<double>(), reduce_in_index_order(values, x.shape(), dims, true))
            << "max, " << what;
      }
    }
  }
}

// fn on x (rounded to its dtype) on CUDA against fn on the same values in f64 on the CPU, within
// tol relative.
using ReductionFn = std::function<Tensor(const Tensor&)>;
void expect_cuda_reduction_matches_f64_cpu(const char* what, const Tensor& x, double tol, const ReductionFn& fn) {
  const std::vector<double> want = fn(x.to(DType::f64)).to_vector<double>();
  const std::vector<double> got = fn(x.to(cuda_device(0))).to_vector<double>();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i])))
        << what << " " << dtype_name(x.dtype()) << " [" << i << "]";
  }
}

// Long rows of a contiguous input take the split-row kernels on CUDA (partials, then their
// reduction): a full sum and mean of 65536 elements, sums and maxima of rows of 20001 (a partial
// last split), against the f64 CPU within 1e-5 relative (f32) or 1e-2 (bf16); and short rows,
// which keep one block per output.
TEST(Reduction, CudaLongRowsMatchTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(41);
  const Tensor flat = randn({64, 1024}, DType::f64, &gen) + 0.5;
  const Tensor rows = randn({3, 20001}, DType::f64, &gen);
  const Tensor short_rows = randn({5, 700}, DType::f64, &gen);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
    auto check = [&](const char* what, const Tensor& x, const ReductionFn& fn) {
      expect_cuda_reduction_matches_f64_cpu(what, x.to(dtype), tol, fn);
    };
    check("sum of all", flat, [](const Tensor& x) { return sum(x); });
    check("mean of all", flat, [](const Tensor& x) { return mean(x); });
    check("row sums", rows, [](const Tensor& x) { return sum(x, {1}); });
    check("row maxima", rows, [](const Tensor& x) { return max(x, 1); });
    check("short row sums", short_rows, [](const Tensor& x) { return sum(x, {1}); });
  }
}

// Sums and maxima over the rows of tall matrices take the CUDA column kernels: [1501, 776] the
// packed one (16-byte reads of 8 bf16/f16, 4 f32 or 2 f64 columns) over 5 row groups, the last
// one short, and then their partials; [1501, 100] the packed one in f32 and f64 and the
// element-wise one in bf16/f16 (100 is not a multiple of 8); a view one column into rows of 784
// (strides of whole packs, but rows not 16-byte aligned) the element-wise one; a row expanded to
// 600 rows (row stride 0) the packed one. Against the f64 CPU within 1e-5 relative (f32), 1e-2
// (bf16, f16) or 1e-10 (f64).
TEST(Reduction, CudaColumnSumsOfTallMatricesMatchTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(43);
  const Tensor wide = randn({1501, 776}, DType::f64, &gen);
  const Tensor narrow = randn({1501, 100}, DType::f64, &gen);
  const Tensor offset = randn({1501, 784}, DType::f64, &gen);
  const Tensor row = randn({16}, DType::f64, &gen);
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : dtype == DType::f64 ? 1e-10 : 1e-2;
    auto check = [&](const char* what, const Tensor& x, const ReductionFn& fn) {
      expect_cuda_reduction_matches_f64_cpu(what, x.to(dtype), tol, fn);
    };
    check("packed column sums", wide, [](const Tensor& x) { return sum(x, {0}); });
    check("packed column maxima", wide, [](const Tensor& x) { return max(x, 0); });
    check("narrow column sums", narrow, [](const Tensor& x) { return sum(x, {0}); });
    check("unaligned column sums", offset, [](const Tensor& x) { return sum(x.narrow(1, 1, 776), {0}); });
    check("expanded row sums", row, [](const Tensor& x) { return sum(x.expand({600, 16}), {0}); });
  }
}

TEST(Reduction, MaxGradientIsSharedAmongTies) {
  Tensor x = from_vector({1, 3, 3}, {3}, DType::f64).requires_grad_();
  max(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5}));
}

TEST(Shape, ViewsShareStorageAndGradientsFlowBack) {
  Tensor x = arange(6, DType::f64).requires_grad_();
  Tensor y = x.reshape({2, 3}).transpose(0, 1);
  EXPECT_TRUE(y.shares_storage_with(x));
  sum(y * y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 2, 4, 6, 8, 10}));
}

TEST(Shape, CastGradientKeepsSourceDtype) {
  Tensor x = from_vector({1.0, 2.0, 3.0}, {3}).requires_grad_();  // f32
  const Tensor w = from_vector({0.5, -1.0, 2.0}, {3}, DType::f16);
  sum(x.to(DType::f16) * w).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0.5, -1.0, 2.0}));
}

}  // namespace
}  // namespace mt::testing
