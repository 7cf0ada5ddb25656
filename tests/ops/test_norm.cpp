// The norm family (ops/norm): op-contract cases for layer_norm, rms_norm and their residual
// forms add_layer_norm / add_rms_norm, plus behaviour the contract does not cover: the half
// output against a cast, the CUDA kernels at every row width and layout, chains of norms launched
// as programmatic dependents (eagerly and from CUDA Graphs), the per-stream partial-row workspace,
// the residual forms bit for bit against add() then the norm, statistics of the normalised rows,
// NaN rows, and the errors. Large CUDA shapes: test_softmax_loss_norm_large.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "autograd/engine.h"
#include "core/cuda/dependent_launch.h"
#include "core/view.h"
#include "ops/norm/norm.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// ---- norms (weight and bias are floating inputs, so their gradients are checked too) ----
MT_OP_CASE(OpCase("layer_norm", "layer_norm_affine").inputs({{3, 6}, {6}, {6}}).compute([](const In& x) {
  return layer_norm(x[0], x[1], x[2]);
}));
// 150 rows make 3 row groups of partial parameter gradients on CUDA, 36 columns a
// partial column tile: the final per-column sum is exercised across both.
MT_OP_CASE(
    OpCase("layer_norm", "layer_norm_affine_row_groups").inputs({{150, 36}, {36}, {36}}).compute([](const In& x) {
      return layer_norm(x[0], x[1], x[2]);
    }));
MT_OP_CASE(OpCase("layer_norm", "layer_norm_no_affine").inputs({{3, 6}}).compute([](const In& x) {
  return layer_norm(x[0], Tensor(), Tensor());
}));
MT_OP_CASE(OpCase("layer_norm", "layer_norm_weight_only_3d").inputs({{2, 3, 4}, {4}}).compute([](const In& x) {
  return layer_norm(x[0], x[1], Tensor(), 1e-3);
}));
MT_OP_CASE(OpCase("layer_norm", "layer_norm_bias_only").inputs({{4, 5}, {5}}).compute([](const In& x) {
  return layer_norm(x[0], Tensor(), x[1]);
}));
// The residual variants: both outputs, the sum and the norm, joined so that one weighted sum
// checks every gradient path (x and delta get the sum's gradient plus the norm's).
MT_OP_CASE(
    OpCase("add_layer_norm", "add_layer_norm_affine").inputs({{3, 6}, {3, 6}, {6}, {6}}).compute([](const In& x) {
      const AddNorm r = add_layer_norm(x[0], x[1], x[2], x[3]);
      return cat({r.sum, r.normed}, 0);
    }));
MT_OP_CASE(OpCase("add_layer_norm", "add_layer_norm_row_groups_3d")
               .inputs({{3, 50, 36}, {3, 50, 36}, {36}, {36}})
               .compute([](const In& x) {
                 const AddNorm r = add_layer_norm(x[0], x[1], x[2], x[3]);
                 return cat({r.sum, r.normed}, 0);
               }));
// Past 1024 columns CUDA takes the block-per-row kernels (the others, one warp per row).
MT_OP_CASE(OpCase("add_layer_norm", "add_layer_norm_wide_rows")
               .inputs({{5, 1100}, {5, 1100}, {1100}, {1100}})
               .compute([](const In& x) {
                 const AddNorm r = add_layer_norm(x[0], x[1], x[2], x[3]);
                 return cat({r.sum, r.normed}, 0);
               })
               .no_gradcheck("add_layer_norm_affine checks the same formulas in f64; this case sizes the CUDA kernel"));
MT_OP_CASE(
    OpCase("add_rms_norm", "add_rms_norm_weight_3d").inputs({{2, 3, 5}, {2, 3, 5}, {5}}).compute([](const In& x) {
      const AddNorm r = add_rms_norm(x[0], x[1], x[2], 1e-5);
      return cat({r.sum, r.normed}, 0);
    }));
MT_OP_CASE(OpCase("rms_norm", "rms_norm_weight").inputs({{3, 6}, {6}}).compute([](const In& x) {
  return rms_norm(x[0], x[1]);
}));
MT_OP_CASE(OpCase("rms_norm", "rms_norm_no_weight_3d").inputs({{2, 2, 5}}).compute([](const In& x) {
  return rms_norm(x[0], Tensor(), 1e-5);
}));

// layer_norm / rms_norm with a half out_dtype against the f32 op followed by a cast:
// the output and every gradient (from the same half upstream gradient) bit for bit.
// On CUDA this compares the fused kernel (half y written from registers, half dy read)
// with the f32 kernels and separate casts.
void expect_half_output_equals_cast(Device device) {
  Generator gen(21);
  for (const bool rms : {false, true}) {
    for (const DType half : {DType::bf16, DType::f16}) {
      const Tensor x0 = raw::to(randn({150, 36}, DType::f32, &gen) * 2.0 + 0.5, device);
      const Tensor w0 = raw::to(randn({36}, DType::f32, &gen), device);
      const Tensor b0 = raw::to(randn({36}, DType::f32, &gen), device);
      const Tensor dy = raw::to(randn({150, 36}, half, &gen), device);
      std::vector<std::vector<double>> results[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
        Tensor y;
        if (rms) {
          y = fused ? rms_norm(x, w, 1e-5, half) : rms_norm(x, w, 1e-5).to(half);
        } else {
          y = fused ? layer_norm(x, w, b, 1e-5, half) : layer_norm(x, w, b, 1e-5).to(half);
        }
        ASSERT_EQ(y.dtype(), half);
        y.backward(dy);
        results[fused] = {y.to_vector<double>(), x.grad().to_vector<double>(), w.grad().to_vector<double>()};
        if (!rms) results[fused].push_back(b.grad().to_vector<double>());
      }
      const char* names[] = {"y", "dx", "dweight", "dbias"};
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_EQ(results[1][i], results[0][i])
            << (rms ? "rms_norm " : "layer_norm ") << dtype_name(half) << " " << names[i] << " on " << device.str();
      }
    }
  }
}

TEST(LayerNorm, HalfOutputEqualsTheCastOfTheF32OutputWithTheSameGradients) {
  expect_half_output_equals_cast(Device("cpu"));
}

TEST(LayerNorm, CudaHalfOutputEqualsTheCastOfTheF32OutputWithTheSameGradients) {
  MT_SKIP_WITHOUT_CUDA();
  expect_half_output_equals_cast(cuda_device(0));
}

// Narrow rows, GPT-2 small's 768 and its neighbours, and rows past 1024 columns: the widths at
// which a row kernel's layout changes (a warp-per-row kernel holds up to 32 elements per lane,
// in packs of 8 columns when the width is a multiple of 8 and the rows are aligned: 768 and 1000
// columns; 36, 38 and 700 columns, or an x that starts one element into its storage, take one
// element per access).
// Output and every gradient against the CPU in f32, relative L2 within 1e-5.
TEST(LayerNorm, CudaMatchesCpuAtEveryKernelWidth) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(31);
  for (const int64_t width : {36, 38, 700, 768, 1000, 1500}) {
    for (const bool rms : {false, true}) {
      // One element more, so that x can also start one element in (an unaligned view).
      const bool offset = width == 768 && rms;
      const Tensor stored = randn({67 * width + 1}, DType::f32, &gen) * 1.5 + 0.25;
      const int64_t first = offset ? 1 : 0;
      const Tensor w0 = randn({width}, DType::f32, &gen), b0 = randn({width}, DType::f32, &gen);
      const Tensor dy = randn({67, width}, DType::f32, &gen);
      std::vector<std::vector<double>> results[2];
      for (const int on_cuda : {0, 1}) {
        const Device device = on_cuda ? cuda_device(0) : Device("cpu");
        Tensor x = raw::to(stored, device).narrow(0, first, 67 * width).view({67, width}).requires_grad_();
        Tensor w = raw::to(w0, device).requires_grad_();
        Tensor b = raw::to(b0, device).requires_grad_();
        const Tensor y = rms ? rms_norm(x, w, 1e-5) : layer_norm(x, w, b, 1e-5);
        y.backward(raw::to(dy, device));
        results[on_cuda] = {y.to_vector<double>(), x.grad().to_vector<double>(), w.grad().to_vector<double>()};
        if (!rms) results[on_cuda].push_back(b.grad().to_vector<double>());
      }
      const char* names[] = {"y", "dx", "dweight", "dbias"};
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_LE(relative_l2(results[1][i], results[0][i]), 1e-5)
            << (rms ? "rms_norm " : "layer_norm ") << "width " << width << " " << names[i];
      }
    }
  }
}

// A chain of norms, each reading the last one's output (every other one the residual form,
// x added back), then its backward: with the dependent launch on (sm_90) every norm kernel
// starts as a programmatic dependent of the kernel before it, and must wait for it before
// reading its output or writing memory it may still read; the residual backward reads the sum
// its forward wrote. bf16 rows of 768 columns, enough that every warp reuses its ring. On the
// GPU eagerly, and replayed from a CUDA Graph for two different inputs written between the
// replays (a replay that read its predecessor's memory early would see the previous replay's
// values); against the same chain on the CPU: the output and every gradient within 2e-2
// relative L2 (bf16 roundings in a different order). With the dependent launch off and on.
struct NormChain {
  static constexpr int kNorms = 6;
  Tensor x;  // the leaf the chain starts from
  std::vector<Tensor> weights, biases;

  NormChain(const Tensor& x0, const std::vector<Tensor>& w0, const std::vector<Tensor>& b0, const Device& device) {
    x = raw::to(x0, device).requires_grad_();
    for (int k = 0; k < kNorms; ++k) {
      weights.push_back(raw::to(w0[k], device).requires_grad_());
      biases.push_back(raw::to(b0[k], device).requires_grad_());
    }
  }
  // y, dx and every dweight and dbias of one forward and backward, the gradients cleared after.
  std::vector<Tensor> run(const Tensor& dy) {
    Tensor y = x;
    for (int k = 0; k < kNorms; ++k) {
      if (k % 2 == 0) {
        y = layer_norm(y, weights[k], biases[k], 1e-5);
      } else {  // the residual form, whose backward reads the sum its forward wrote
        const AddNorm r = add_layer_norm(y, x, weights[k], biases[k], 1e-5, y.dtype());
        y = add(r.normed, r.sum);
      }
    }
    y.backward(dy);
    std::vector<Tensor> out = {y.detach(), x.grad()};
    for (int k = 0; k < kNorms; ++k) {
      out.push_back(weights[k].grad());
      out.push_back(biases[k].grad());
    }
    x.set_grad(Tensor());
    for (int k = 0; k < kNorms; ++k) weights[k].set_grad(Tensor()), biases[k].set_grad(Tensor());
    return out;
  }
};

void expect_chain_matches(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& how) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(relative_l2(got[i].to_vector<double>(), want[i].to_vector<double>()), 2e-2)
        << how << ": "
        << (i == 0       ? "y"
            : i == 1     ? "dx"
            : i % 2 == 0 ? "dweight"
                         : "dbias")
        << (i >= 2 ? " of norm " + std::to_string((i - 2) / 2) : "");
  }
}

class CudaNormChain : public ::testing::TestWithParam<bool> {};  // dependent launch on or off

TEST_P(CudaNormChain, MatchesTheCpuEagerlyAndInAGraph) {
  MT_SKIP_WITHOUT_CUDA();
  const cuda::DependentLaunchGuard dependent_launch(GetParam());
  const int64_t rows = 4099, width = 768;
  Generator gen(43);
  std::vector<Tensor> w0, b0;
  for (int k = 0; k < NormChain::kNorms; ++k) {
    w0.push_back(randn({width}, DType::bf16, &gen));
    b0.push_back(randn({width}, DType::bf16, &gen));
  }
  const Tensor inputs[2] = {randn({rows, width}, DType::bf16, &gen), randn({rows, width}, DType::bf16, &gen) * 3.0};
  const Tensor dy = randn({rows, width}, DType::bf16, &gen);
  const Device gpu = cuda_device(0);
  std::vector<Tensor> want[2];
  for (int i = 0; i < 2; ++i) want[i] = NormChain(inputs[i], w0, b0, Device("cpu")).run(dy);

  NormChain eager(inputs[0], w0, b0, gpu);
  expect_chain_matches(eager.run(raw::to(dy, gpu)), want[0], "eager");

  // The graph writes its results into tensors made before the capture (it may keep none of its own).
  NormChain captured(inputs[0], w0, b0, gpu);
  const Tensor dy_gpu = raw::to(dy, gpu);
  std::vector<Tensor> results;
  for (const Tensor& t : captured.run(dy_gpu)) results.push_back(empty_like(t));
  const cuda::Stream stream = cuda::current_stream(gpu.index);
  cuda::Graph graph;
  graph.capture(stream, [&] {
    const std::vector<Tensor> out = captured.run(dy_gpu);
    for (size_t i = 0; i < out.size(); ++i) results[i].copy_(out[i]);
  });
  for (int i = 0; i < 2; ++i) {
    captured.x.detach().copy_(raw::to(inputs[i], gpu));
    graph.replay(stream);
    expect_chain_matches(results, want[i], "graph replay " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(LayerNorm, CudaNormChain, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& p) {
  return p.param ? "DependentLaunch" : "PlainLaunch";
});

// The warp-per-row backward's final sum reads the parameter gradients' partial rows as the
// backward writes them, from a workspace that each stream makes at its first backward outside a
// capture (where the dependent launch is on, sm_90); a capture on a stream without one sums rows
// of its own after the backward has ended. Both must give the gradients of the eager run bit for
// bit (the sums keep one order, whenever each partial row arrives), over replays with new inputs
// and with rows of several sizes in turn on one workspace (a word left unmarked would be summed
// as the next backward's): bf16 layer norms of 768 and 100 columns, then an RMS norm (no dbias
// rows). Against the CPU within 2e-2 relative L2.
TEST(LayerNorm, CudaGraphsWithAndWithoutTheStreamsPartialRowWorkspaceGiveTheEagerGradients) {
  MT_SKIP_WITHOUT_CUDA();
  const cuda::DependentLaunchGuard dependent_launch(true);
  const Device gpu = cuda_device(0);
  const cuda::Stream fresh = cuda::Stream::create(gpu.index);  // no norm has run on it yet
  const cuda::StreamGuard on_fresh(fresh);
  Generator gen(47);
  struct Case {
    int64_t width, rows;
    bool rms;
  };
  for (const Case& c : {Case{768, 20011, false}, Case{100, 300, false}, Case{768, 4099, true}}) {
    const Tensor inputs[2] = {randn({c.rows, c.width}, DType::bf16, &gen),
                              randn({c.rows, c.width}, DType::bf16, &gen) * 2.0};
    const Tensor w0 = randn({c.width}, DType::bf16, &gen), b0 = randn({c.width}, DType::bf16, &gen);
    const Tensor dy_cpu = randn({c.rows, c.width}, DType::bf16, &gen);
    // dx, dweight and (layer norm) dbias of one forward and backward, the gradients cleared after.
    const auto grads_of = [&](Tensor& x, Tensor& w, Tensor& b, const Tensor& dy) {
      (c.rms ? rms_norm(x, w, 1e-5) : layer_norm(x, w, b, 1e-5)).backward(dy);
      std::vector<Tensor> grads = {x.grad(), w.grad()};
      if (!c.rms) grads.push_back(b.grad());
      x.set_grad(Tensor()), w.set_grad(Tensor()), b.set_grad(Tensor());
      return grads;
    };
    const Tensor dy = raw::to(dy_cpu, gpu);
    Tensor x = raw::to(inputs[0], gpu).requires_grad_();
    Tensor w = raw::to(w0, gpu).requires_grad_(), b = raw::to(b0, gpu).requires_grad_();
    const auto run = [&] { return grads_of(x, w, b, dy); };
    const auto capture = [&](std::vector<Tensor>& results) {  // results: made beforehand, as a graph needs
      results = {empty_like(x), empty_like(w)};
      if (!c.rms) results.push_back(empty_like(b));
      cuda::Graph graph;
      graph.capture(fresh, [&] {
        const std::vector<Tensor> grads = run();
        for (size_t i = 0; i < grads.size(); ++i) results[i].copy_(grads[i]);
      });
      return graph;
    };
    std::vector<Tensor> own_rows, workspace_rows;
    // The first case's capture comes before any backward on the stream: rows of their own.
    std::unique_ptr<cuda::Graph> first_capture;
    if (c.width == 768 && !c.rms) first_capture = std::make_unique<cuda::Graph>(capture(own_rows));
    const std::vector<Tensor> eager = run();  // makes the workspace (the first case) or reuses it
    cuda::Graph with_workspace = capture(workspace_rows);
    for (int i = 0; i < 2; ++i) {
      x.detach().copy_(raw::to(inputs[i], gpu));
      Tensor xc = inputs[i].clone().requires_grad_(), wc = w0.clone().requires_grad_(),
             bc = b0.clone().requires_grad_();
      const std::vector<Tensor> want = grads_of(xc, wc, bc, dy_cpu);
      const std::vector<Tensor> again = run();
      with_workspace.replay(fresh);
      if (first_capture) first_capture->replay(fresh);
      const char* names[] = {"dx", "dweight", "dbias"};
      for (size_t g = 0; g < want.size(); ++g) {
        const std::string what = std::string(c.rms ? "rms_norm " : "layer_norm ") + names[g] + ", width " +
                                 std::to_string(c.width) + ", input " + std::to_string(i);
        EXPECT_LE(relative_l2(again[g].to_vector<double>(), want[g].to_vector<double>()), 2e-2) << what;
        EXPECT_EQ(workspace_rows[g].to_vector<double>(), again[g].to_vector<double>()) << what << ", workspace graph";
        if (first_capture) EXPECT_EQ(own_rows[g].to_vector<double>(), again[g].to_vector<double>()) << what;
        if (i == 0) EXPECT_EQ(eager[g].to_vector<double>(), again[g].to_vector<double>()) << what << ", eager";
      }
    }
  }
}

// add_layer_norm / add_rms_norm against add() and then the norm: both outputs and every
// gradient, from the same upstream gradients of both, bit for bit. The residual stream's case:
// an f32 x, a bf16/f16 delta (a GEMM's output) and a half normed output; and all-f32.
void expect_add_norm_equals_add_then_norm(Device device, int64_t rows = 67,
                                          std::vector<int64_t> widths = {36, 768, 1100}) {
  Generator gen(23);
  for (const int64_t width : widths) {  // by default warp-per-row kernels, and past them on CUDA
    for (const bool rms : {false, true}) {
      for (const DType low : {DType::bf16, DType::f16, DType::f32}) {
        const Tensor x0 = raw::to(randn({rows, width}, DType::f32, &gen) * 2.0 + 0.5, device);
        const Tensor d0 = raw::to(randn({rows, width}, low, &gen), device);
        const Tensor w0 = raw::to(randn({width}, DType::f32, &gen), device);
        const Tensor b0 = raw::to(randn({width}, DType::f32, &gen), device);
        const Tensor dsum = raw::to(randn({rows, width}, DType::f32, &gen), device);
        const Tensor dy = raw::to(randn({rows, width}, low, &gen), device);
        std::vector<std::vector<double>> results[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor x = x0.clone().requires_grad_(), delta = d0.clone().requires_grad_();
          Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
          AddNorm r;
          if (fused) {
            r = rms ? add_rms_norm(x, delta, w, 1e-5, low) : add_layer_norm(x, delta, w, b, 1e-5, low);
          } else {
            r.sum = add(x, delta);
            r.normed = rms ? rms_norm(r.sum, w, 1e-5, low) : layer_norm(r.sum, w, b, 1e-5, low);
          }
          ASSERT_EQ(r.sum.dtype(), DType::f32);
          ASSERT_EQ(r.normed.dtype(), low);
          autograd::run_backward({r.sum, r.normed}, {dsum, dy}, /*retain_graph=*/false);
          ASSERT_EQ(delta.grad().dtype(), low);
          results[fused] = {r.sum.to_vector<double>(), r.normed.to_vector<double>(), x.grad().to_vector<double>(),
                            delta.grad().to_vector<double>(), w.grad().to_vector<double>()};
          if (!rms) results[fused].push_back(b.grad().to_vector<double>());
        }
        const char* names[] = {"sum", "normed", "dx", "ddelta", "dweight", "dbias"};
        for (size_t i = 0; i < results[0].size(); ++i) {
          EXPECT_EQ(results[1][i], results[0][i])
              << (rms ? "add_rms_norm " : "add_layer_norm ") << "width " << width << " delta " << dtype_name(low) << " "
              << names[i] << " on " << device.str();
        }
      }
    }
  }
}

TEST(AddLayerNorm, EqualsAddThenTheNormBitForBit) { expect_add_norm_equals_add_then_norm(Device("cpu")); }

TEST(AddLayerNorm, CudaEqualsAddThenTheNormBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  expect_add_norm_equals_add_then_norm(cuda_device(0));
}

// Enough rows that every warp of the CUDA kernels visits several, so that each warp's ring of
// staged rows is reused (the warp-per-row kernels' shared-memory staging).
TEST(AddLayerNorm, CudaEqualsAddThenTheNormBitForBitOverManyRows) {
  MT_SKIP_WITHOUT_CUDA();
  expect_add_norm_equals_add_then_norm(cuda_device(0), 20011, {64, 768});
}

// The same kernel launched with the residual's extra row (in f32, the backward's staging passes the
// default 48 KiB of shared memory) and without it, then with it again: a launch that needs less
// must not shrink what a later, larger one may take.
TEST(AddLayerNorm, CudaLaunchesOfEveryStagingSizeInTurn) {
  MT_SKIP_WITHOUT_CUDA();
  expect_add_norm_equals_add_then_norm(cuda_device(0), 67, {64, 64});
}

TEST(AddLayerNorm, BadDeltasNameTheOpAndTheShapes) {
  const Tensor x = randn({2, 4}), w = randn({4}), b = randn({4});
  expect_contains(error_of([&] {
                    add_layer_norm(x, randn({1, 4}), w, b);
                  }),
                  {"add_layer_norm", "delta f32[1, 4]", "shape of x f32[2, 4]", "broadcast"});
  expect_contains(error_of([&] {
                    add_rms_norm(x.to(DType::bf16), randn({2, 4}), w.to(DType::bf16));
                  }),
                  {"add_rms_norm", "delta", "f32", "dtype of x", "bf16"});
  expect_contains(error_of([&] {
                    add_layer_norm(x, randn({2, 4}), randn({5}), b);
                  }),
                  {"add_layer_norm", "weight", "[4]"});
}

TEST(LayerNorm, OutputDtypeMustBeFloating) {
  const Tensor x = randn({2, 4});
  expect_contains(error_of([&] { layer_norm(x, Tensor(), Tensor(), 1e-5, DType::i64); }),
                  {"layer_norm", "output dtype", "i64"});
}

TEST(LayerNorm, RowsHaveZeroMeanAndUnitVarianceWithoutAffine) {
  Generator gen(10);
  for (DType dtype : {DType::f64, DType::f32}) {
    const Tensor x = raw::to(randn({4, 16}, DType::f64, &gen) * 3.0 + 5.0, dtype);
    const std::vector<double> y = layer_norm(x, Tensor(), Tensor(), /*eps=*/0.0).to_vector<double>();
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    for (int r = 0; r < 4; ++r) {
      double m = 0, v = 0;
      for (int c = 0; c < 16; ++c) m += y[r * 16 + c] / 16;
      for (int c = 0; c < 16; ++c) v += (y[r * 16 + c] - m) * (y[r * 16 + c] - m) / 16;
      EXPECT_NEAR(m, 0.0, tol) << dtype_name(dtype) << " row " << r;
      EXPECT_NEAR(v, 1.0, 10 * tol) << dtype_name(dtype) << " row " << r;
    }
  }
}

TEST(LayerNorm, AffineValuesMatchTheFormula) {
  const Tensor x = from_vector({1, 2, 3, 4}, {1, 4}, DType::f64);
  const Tensor w = from_vector({1, 2, 0.5, -1}, {4}, DType::f64);
  const Tensor b = from_vector({0, 1, 0, -2}, {4}, DType::f64);
  const double eps = 1e-5, rs = 1.0 / std::sqrt(1.25 + eps);  // mean 2.5, var 1.25
  const std::vector<double> y = layer_norm(x, w, b, eps).to_vector<double>();
  const std::vector<double> want = {-1.5 * rs, 2 * -0.5 * rs + 1, 0.5 * 0.5 * rs, -1.5 * rs - 2};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want[i], 1e-12) << i;
}

TEST(LayerNorm, ParameterGradientsWithoutInputGradient) {
  Generator gen(11);
  const Tensor x = randn({5, 3}, DType::f64, &gen);  // no grad
  Tensor w = ones({3}, DType::f64).requires_grad_();
  Tensor b = zeros({3}, DType::f64).requires_grad_();
  const Tensor dy = randn({5, 3}, DType::f64, &gen);
  const Tensor y = layer_norm(x, w, b);
  sum(y * dy).backward();
  // With w = 1, b = 0: dweight = sum_rows(dy * y), dbias = sum_rows(dy).
  const std::vector<double> gw = w.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
  const std::vector<double> want_w = sum(y.detach() * dy, {0}).to_vector<double>();
  const std::vector<double> want_b = sum(dy, {0}).to_vector<double>();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(gw[i], want_w[i], 1e-12);
    EXPECT_NEAR(gb[i], want_b[i], 1e-12);
  }
  EXPECT_FALSE(x.grad().defined());
}

TEST(LayerNorm, BiasOnlyGradient) {
  const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  Tensor b = zeros({3}).requires_grad_();
  sum(layer_norm(x, Tensor(), b) * 2.0).backward();
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{4, 4, 4}));
}

TEST(RmsNorm, ValuesMatchTheFormula) {
  const Tensor x = from_vector({3, 4, -1, 1}, {2, 2}, DType::f64);
  const Tensor w = from_vector({2, 0.5}, {2}, DType::f64);
  const double eps = 1e-6;
  const double r0 = 1 / std::sqrt(12.5 + eps), r1 = 1 / std::sqrt(1.0 + eps);
  const std::vector<double> y = rms_norm(x, w, eps).to_vector<double>();
  EXPECT_NEAR(y[0], 3 * r0 * 2, 1e-12);
  EXPECT_NEAR(y[1], 4 * r0 * 0.5, 1e-12);
  EXPECT_NEAR(y[2], -1 * r1 * 2, 1e-12);
  EXPECT_NEAR(y[3], 1 * r1 * 0.5, 1e-12);
  // Without a weight: mean of squares of the output is 1 (up to eps).
  const std::vector<double> z = rms_norm(x, Tensor(), 0.0).to_vector<double>();
  EXPECT_NEAR(z[0] * z[0] + z[1] * z[1], 2.0, 1e-12);
}

TEST(Norm, HalfInputsKeepTheirDtype) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Tensor x = from_vector({1, 2, 3, 4}, {2, 2}, dtype);
    EXPECT_EQ(layer_norm(x, ones({2}, dtype), zeros({2}, dtype)).dtype(), dtype);
    EXPECT_EQ(rms_norm(x, Tensor()).dtype(), dtype);
    EXPECT_NEAR(layer_norm(x, Tensor(), Tensor()).to_vector<double>()[1], 1.0, 1e-2);
  }
}

TEST(Norm, ErrorsNameTheOpShapesAndDtypes) {
  const Tensor x = zeros({2, 4});
  try {
    layer_norm(x, ones({5}), Tensor());
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    expect_contains(e.what(), {"layer_norm", "weight", "f32[5]", "[2, 4]", "[4]"});
  }
  try {
    rms_norm(x, ones({4}, DType::f64));
    FAIL() << "expected a DTypeError";
  } catch (const DTypeError& e) {
    expect_contains(e.what(), {"rms_norm", "f64[4]", "f32[2, 4]"});
  }
  expect_contains(error_of([&] { layer_norm(x, Tensor(), ones({2, 2})); }), {"layer_norm", "bias", "[2, 2]"});
  expect_contains(error_of([] { layer_norm(zeros({3, 0}), Tensor(), Tensor()); }), {"layer_norm", "[3, 0]"});
  expect_contains(error_of([] { rms_norm(ones({2}, DType::i32), Tensor()); }), {"rms_norm", "i32"});
}

// bf16 rows of GPT-2 small's and medium's widths, enough of them that every warp of the staged
// norm kernels reuses its ring of rows (forward and backward), against f64 on the CPU.
TEST(LayerNorm, CudaStagedBf16RowsMatchF64Cpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(41);
  for (const auto& [rows, width] : {std::pair<int64_t, int64_t>{10007, 768}, {7001, 1024}}) {
    const Tensor x = randn({rows, width}, DType::f64, &gen) * 2.0 + 0.5;
    const Tensor w = randn({width}, DType::f64, &gen), b = randn({width}, DType::f64, &gen);
    const std::string shape = std::to_string(rows) + " x " + std::to_string(width);
    expect_cuda_matches_f64("layer_norm " + shape, {x, w, b}, Tensor(), DType::bf16, tolerance_for(DType::bf16),
                            [](const In& t) { return layer_norm(t[0], t[1], t[2]); });
    expect_cuda_matches_f64("rms_norm " + shape, {x, w}, Tensor(), DType::bf16, tolerance_for(DType::bf16),
                            [](const In& t) { return rms_norm(t[0], t[1]); });
  }
}

// A NaN in one row of a bf16 input, rows of GPT-2 small's 768 columns (the warp kernels' rows
// without predicates, which test a lane's whole row for NaN once and then convert it two values
// per instruction, or element by element when it holds one): that row's output and input
// gradient are NaN, the other rows match the CPU (relative L2 within 1e-2, bf16), dweight is NaN
// in every column and dbias, which does not read x, is not.
TEST(LayerNorm, CudaNanStaysInItsRow) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(43);
  const int64_t rows = 64, width = 768, nan_row = 5;
  std::vector<double> values = randn({rows, width}, DType::f32, &gen).to_vector<double>();
  values[nan_row * width + 100] = std::numeric_limits<double>::quiet_NaN();
  const Tensor x0 = from_vector(values, {rows, width}, DType::bf16);
  const Tensor w0 = randn({width}, DType::bf16, &gen), b0 = randn({width}, DType::bf16, &gen);
  const Tensor dy = randn({rows, width}, DType::bf16, &gen);
  std::vector<Tensor> results[2];  // y, dx, dweight, dbias on the CPU and on CUDA
  for (const int on_cuda : {0, 1}) {
    const Device device = on_cuda ? cuda_device(0) : Device("cpu");
    Tensor x = raw::to(x0, device).requires_grad_(), w = raw::to(w0, device).requires_grad_();
    Tensor b = raw::to(b0, device).requires_grad_();
    const Tensor y = layer_norm(x, w, b);
    y.backward(raw::to(dy, device));
    results[on_cuda] = {raw::to(y, Device("cpu")), raw::to(x.grad(), Device("cpu")), raw::to(w.grad(), Device("cpu")),
                        raw::to(b.grad(), Device("cpu"))};
  }
  const auto nans = [](const Tensor& t) {
    const std::vector<double> v = t.to_vector<double>();
    return std::count_if(v.begin(), v.end(), [](double e) { return std::isnan(e); });
  };
  const char* names[] = {"y", "dx", "dweight", "dbias"};
  const int64_t expected_nans[] = {width, width, width, 0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(nans(results[1][i]), expected_nans[i]) << names[i];
    EXPECT_LE(relative_norm_error(results[1][i], results[0][i]), 1e-2) << names[i];
  }
  EXPECT_EQ(nans(results[1][0].narrow(0, nan_row, 1)), width) << "y's NaNs are the NaN row";
}

}  // namespace
}  // namespace mt::testing
