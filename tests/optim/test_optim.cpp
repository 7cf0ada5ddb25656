// Optimizers and the loss scaler: every branch of the scaler's policy is reached
// (skip, back off, grow, limits), AdamW matches a hand-written reference, and
// the CUDA kernels match the CPU ones.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/view.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

namespace mt {
namespace {

// Reference AdamW for one scalar parameter, in double.
struct ScalarAdamW {
  double p, m = 0, v = 0;
  int t = 0;
  void step(double g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    p -= lr * wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

TEST(AdamW, MatchesTheReferenceFormula) {
  Tensor w = from_vector({0.5, -1.5}, {2}, DType::f64).requires_grad_();
  AdamW opt({w}, AdamWOptions(0.1).weight_decay(0.01));
  ScalarAdamW r0{0.5}, r1{-1.5};
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    sum(w * w * w).backward();  // g = 3 w^2
    const std::vector<double> p = w.to_vector<double>();
    r0.step(3 * p[0] * p[0], 0.1, 0.9, 0.999, 1e-8, 0.01);
    r1.step(3 * p[1] * p[1], 0.1, 0.9, 0.999, 1e-8, 0.01);
    opt.step();
  }
  EXPECT_NEAR(w.to_vector<double>()[0], r0.p, 1e-12);
  EXPECT_NEAR(w.to_vector<double>()[1], r1.p, 1e-12);
  EXPECT_EQ(opt.steps_taken(), 5);
}

TEST(SGD, MomentumAndNesterovFollowTorch) {
  Tensor w = from_vector({1.0}, {1}, DType::f64).requires_grad_();
  SGD opt({w}, SGDOptions(0.1).momentum(0.9).nesterov(true));
  // g = 2w; buf1 = g1; update = g1 + 0.9 buf1
  sum(w * w).backward();
  opt.step();
  EXPECT_NEAR(w.item(), 1.0 - 0.1 * (2.0 + 0.9 * 2.0), 1e-12);
  EXPECT_THROW(SGD({w}, SGDOptions(0.1).nesterov(true)), Error);
}

// A tiny problem whose gradient can be made infinite on demand.
struct ScalerFixture {
  Tensor w;
  explicit ScalerFixture(Device d) : w(full({3}, 1.0, TensorOptions().device(d)).requires_grad_()) {}
  Tensor loss(bool poison) const {
    Tensor l = sum(w * w);
    return poison ? l * std::numeric_limits<double>::infinity() : l;
  }
};

void scaler_contract(Device device) {
  ScalerFixture f(device);
  AdamW opt({f.w}, AdamWOptions(0.01));
  GradScaler scaler(device, GradScalerOptions().growth_interval(3));
  EXPECT_EQ(scaler.get_scale(), 65536.0);

  // A clean step: gradients unscaled exactly, the step taken.
  scaler.scale(f.loss(false)).backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(opt.steps_taken(), 1);
  const std::vector<float> after_clean = f.w.to_vector<float>();
  const std::vector<float> m_before = opt.state(0, 0).exp_avg.to_vector<float>();

  // An injected inf: the step is skipped, weights and state unchanged, scale halved.
  opt.zero_grad();
  scaler.scale(f.loss(true)).backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(f.w.to_vector<float>(), after_clean);
  EXPECT_EQ(opt.state(0, 0).exp_avg.to_vector<float>(), m_before);
  EXPECT_EQ(opt.steps_taken(), 1);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.consecutive_skips(), 1);

  // growth_interval clean steps in a row double it.
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    scaler.scale(f.loss(false)).backward();
    scaler.step(opt);
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.consecutive_skips(), 0);
  EXPECT_EQ(opt.steps_taken(), 4);

  // State round-trips.
  GradScaler copy(device);
  copy.load_state_dict(scaler.state_dict());
  EXPECT_EQ(copy.state_dict(), scaler.state_dict());
}

TEST(GradScaler, SkipBackoffGrowthAndStateOnCpu) { scaler_contract(kCPU); }

TEST(GradScaler, SkipBackoffGrowthAndStateOnCuda) {
  MT_SKIP_WITHOUT_CUDA();
  scaler_contract(cuda_device(0));
}

TEST(GradScaler, DefaultIntervalDoublesAfter2000CleanSteps) {
  ScalerFixture f(kCPU);
  SGD opt({f.w}, SGDOptions(0.0));
  GradScaler scaler(kCPU);  // the defaults: 65536, growth 2, interval 2000
  for (int step = 1; step <= 2000; ++step) {
    opt.zero_grad();
    scaler.scale(f.loss(false)).backward();
    scaler.step(opt);
    scaler.update();
    if (step == 1999) EXPECT_EQ(scaler.get_scale(), 65536.0);
  }
  EXPECT_EQ(scaler.get_scale(), 131072.0);
}

TEST(GradScaler, UnscaleGivesTheTrueGradient) {
  Tensor w = full({2}, 3.0).requires_grad_();
  SGD opt({w}, SGDOptions(0.0));
  GradScaler scaler(kCPU, GradScalerOptions().init_scale(1024));
  scaler.scale(sum(w * w)).backward();
  EXPECT_EQ(w.grad().to_vector<float>()[0], 6.0f * 1024);
  scaler.unscale_(opt);
  EXPECT_EQ(w.grad().to_vector<float>()[0], 6.0f);
  EXPECT_THROW(scaler.unscale_(opt), Error);  // twice before update()
}

// Runs ten steps whose gradients are all inf and returns the error the scaler
// raised (empty if none).
std::string error_after_ten_poisoned_steps(const GradScalerOptions& options) {
  ScalerFixture f(kCPU);
  SGD opt({f.w}, SGDOptions(0.1));
  GradScaler scaler(kCPU, options);
  try {
    for (int i = 0; i < 10; ++i) {
      opt.zero_grad();
      scaler.scale(f.loss(true)).backward();
      scaler.step(opt);
      scaler.update();
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GradScaler, ConsecutiveSkipLimitRaisesAClearError) {
  const std::string msg = error_after_ten_poisoned_steps(GradScalerOptions().max_consecutive_skips(3).min_scale(1e-30));
  EXPECT_NE(msg.find("3 optimizer steps in a row were skipped"), std::string::npos) << msg;
}

TEST(GradScaler, MinimumScaleRaisesAClearError) {
  const std::string msg =
      error_after_ten_poisoned_steps(GradScalerOptions().init_scale(4).min_scale(1).max_consecutive_skips(1000));
  EXPECT_NE(msg.find("below min_scale"), std::string::npos) << msg;
}

// Least squares with the weights stored in `dtype`; returns the final loss.
double train_regression(DType dtype, bool master_weights, Device device) {
  Generator gen(11);
  const Tensor x = raw::to(randn({64, 8}, DType::f32, &gen), device);
  const Tensor w_true = randn({8, 1}, DType::f32, &gen);
  const Tensor y = matmul(x, raw::to(w_true, device));
  Tensor w = raw::to(raw::to(w_true, device) + 0.5, dtype).requires_grad_();  // start 0.5 away
  AdamW opt({w}, AdamWOptions(1e-3).weight_decay(0).master_weights(master_weights));
  double loss_value = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    const Tensor loss = mean(pow(matmul(x, w.to(DType::f32)) - y, 2.0));  // math in f32, storage in dtype
    loss.backward();
    opt.step();
    loss_value = loss.item();
  }
  return loss_value;
}

TEST(AdamW, MasterWeightsTrackTheF32Run) {
  // Adam moves each weight by about lr = 1e-3 per step; bf16 spacing near 1 is
  // 2^-7 = 7.8e-3, so without master weights most updates round away.
  const double f32 = train_regression(DType::f32, /*master_weights=*/false, kCPU);
  const double master = train_regression(DType::bf16, /*master_weights=*/true, kCPU);
  const double plain = train_regression(DType::bf16, /*master_weights=*/false, kCPU);
  std::printf("[ master weights ] final loss: f32 %.4f, bf16 + f32 master %.4f, bf16 alone %.4f\n", f32, master, plain);
  EXPECT_LE(std::fabs(master - f32), 0.05 * f32 + 1e-3);
  EXPECT_GT(plain, 1.5 * f32);
}

TEST(AdamW, MasterWeightsTrackTheF32RunOnCuda) {
  MT_SKIP_WITHOUT_CUDA();
  const double f32 = train_regression(DType::f32, false, cuda_device(0));
  const double master = train_regression(DType::bf16, true, cuda_device(0));
  EXPECT_LE(std::fabs(master - f32), 0.05 * f32 + 1e-3);
}

// AdamWOptions::autocast_copies: the step writes each f32 parameter's bf16 copy and autocast
// serves it, so that from the second step on the linear layers cast no weight. Every loss and
// parameter equals, bit for bit, the run that casts them; an in-place change of one weight
// makes that one be cast again, with its new values. On `device`; the CUDA copies come from
// the fused kernel (mixed sizes: one parameter spans several chunks, one is an odd view length).
void expect_autocast_copies_serve_the_next_forward(Device device) {
  Generator gen(31);
  const TensorOptions on = TensorOptions().device(device);
  const Tensor x = randn({24, 40}, on, &gen), target = randn({24, 5}, on, &gen);
  const std::vector<Tensor> init = {randn({300, 40}, on, &gen) * 0.1, randn({300}, on, &gen) * 0.1,
                                    randn({5, 300}, on, &gen) * 0.1, randn({5}, on, &gen) * 0.1};
  struct Run {
    std::vector<Tensor> params;
    std::unique_ptr<AdamW> opt;
  };
  const auto make = [&](bool copies) {
    Run run;
    for (const Tensor& t : init) run.params.push_back(raw::clone(t).requires_grad_());
    AdamWOptions options(1e-2);
    if (copies) options.autocast_copies(DType::bf16);
    run.opt = std::make_unique<AdamW>(run.params, options);
    return run;
  };
  // One step: the loss, and the casts it made.
  const auto step = [&](Run& run) {
    run.opt->zero_grad();
    Tensor loss;
    const uint64_t before = autocast::cast_count();
    {
      AutocastGuard amp(device.type, DType::bf16);
      const Tensor& w1 = run.params[0];
      const Tensor diff = sub(linear(gelu(linear(x, w1, run.params[1])), run.params[2], run.params[3]), target);
      loss = mean(mul(diff, diff));
    }
    const uint64_t casts = autocast::cast_count() - before;
    loss.backward();
    run.opt->step();
    return std::make_pair(loss.item(), casts);
  };
  Run cast = make(false), copied = make(true);
  for (int i = 0; i < 5; ++i) {
    if (i == 3) {  // an in-place change between steps, in both runs
      NoGradGuard no_grad;
      cast.params[2].copy_(cast.params[2] * 0.5);
      copied.params[2].copy_(copied.params[2] * 0.5);
    }
    const auto [cast_loss, cast_casts] = step(cast);
    const auto [copied_loss, copied_casts] = step(copied);
    EXPECT_EQ(copied_loss, cast_loss) << "step " << i;
    // The weights' casts saved (the input and the loss's casts are made either way).
    EXPECT_EQ(cast_casts - copied_casts, i == 0   ? 0u
                                         : i == 3 ? 3u
                                                  : 4u)
        << "step " << i << " (3: the changed weight is cast again)";
  }
  for (size_t k = 0; k < init.size(); ++k) {
    EXPECT_EQ(copied.params[k].to_vector<float>(), cast.params[k].to_vector<float>()) << "parameter " << k;
    EXPECT_EQ(copied.opt->autocast_copy(0, k).to_vector<float>(), cast.params[k].to(DType::bf16).to_vector<float>())
        << "parameter " << k << "'s copy is its cast";
  }
}

TEST(AdamW, AutocastCopiesServeTheNextForwardWithoutACast) { expect_autocast_copies_serve_the_next_forward(kCPU); }

TEST(AdamW, CudaAutocastCopiesServeTheNextForwardWithoutACast) {
  MT_SKIP_WITHOUT_CUDA();
  expect_autocast_copies_serve_the_next_forward(cuda_device(0));
}

// A step the scaler skips (found_inf set) leaves the parameters as they are, and the copies it
// writes are still their casts: at the first step, the copies are new memory.
TEST(AdamW, CudaASkippedStepStillWritesTheCopies) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(33);
  const Tensor w = (randn({1000}, TensorOptions().device(cuda_device(0)), &gen)).detach().requires_grad_();
  const std::vector<float> before = w.to_vector<float>();
  AdamW opt({w}, AdamWOptions(1e-2).autocast_copies(DType::f16));
  sum(mul(w, w)).backward();
  opt.step_unless(ones({1}, TensorOptions().device(cuda_device(0))));
  EXPECT_EQ(w.to_vector<float>(), before);
  EXPECT_EQ(opt.autocast_copy(0, 0).to_vector<float>(), w.to(DType::f16).to_vector<float>());
}

TEST(AdamW, AutocastCopiesMustBeAHalfDtype) {
  const Tensor w = zeros({3}).requires_grad_();
  EXPECT_THROW(AdamW({w}, AdamWOptions().autocast_copies(DType::f32)), DTypeError);
}

TEST(AdamW, CudaMatchesCpuOver100Steps) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(7);
  const Tensor init = randn({257}, DType::f32, &gen);
  const Tensor target = randn({257}, DType::f32, &gen);
  Tensor cpu_w = raw::clone(init).requires_grad_();
  Tensor gpu_w = raw::to(init, cuda_device(0)).requires_grad_();
  AdamW cpu_opt({cpu_w}, AdamWOptions(1e-2)), gpu_opt({gpu_w}, AdamWOptions(1e-2));
  const Tensor gpu_target = raw::to(target, cuda_device(0));
  for (int i = 0; i < 100; ++i) {
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    sum(pow(cpu_w - target, 2.0)).backward();
    sum(pow(gpu_w - gpu_target, 2.0)).backward();
    cpu_opt.step();
    gpu_opt.step();
  }
  // Relative norm of the difference (METHOD's metric): the GPU fuses multiply-adds
  // where the CPU rounds twice, so single elements differ in their last bits.
  const std::vector<float> a = cpu_w.to_vector<float>(), b = gpu_w.to_vector<float>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(a[i]) * a[i];
  }
  const double relative = std::sqrt(diff / norm);
  std::printf("[ adamw ] CUDA vs CPU after 100 f32 steps: relative difference %.2e (tolerance 1e-6)\n", relative);
  EXPECT_LE(relative, 1e-6);
}

TEST(AdamW, CudaMultiTensorStepMatchesCpuOnManyParameters) {
  // 70 parameters (more than one launch table holds), mixed sizes (one spans
  // several chunks), f32 and bf16-with-master: the fused multi-tensor step must
  // match the CPU's per-parameter loop.
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(21);
  std::vector<Tensor> cpu_params, gpu_params;
  for (int i = 0; i < 70; ++i) {
    const int64_t n = i == 5 ? 200000 : 1 + (i * 37) % 513;
    const DType dtype = i % 3 == 0 ? DType::bf16 : DType::f32;
    const Tensor init = raw::to(randn({n}, DType::f32, &gen), dtype);
    cpu_params.push_back(raw::clone(init).requires_grad_());
    gpu_params.push_back(raw::to(init, cuda_device(0)).requires_grad_());
  }
  AdamW cpu_opt(cpu_params, AdamWOptions(1e-2).master_weights(true));
  AdamW gpu_opt(gpu_params, AdamWOptions(1e-2).master_weights(true));
  for (int step = 0; step < 10; ++step) {
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      const Tensor g = randn(cpu_params[i].shape(), cpu_params[i].dtype(), &gen);
      cpu_params[i].set_grad(g);
      gpu_params[i].set_grad(raw::to(g, cuda_device(0)));
    }
    cpu_opt.step();
    gpu_opt.step();
  }
  double diff = 0, norm = 0;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    const Tensor a =
        raw::to(cpu_opt.state(0, i).master.defined() ? cpu_opt.state(0, i).master : cpu_params[i], DType::f64);
    const Tensor b =
        raw::to(gpu_opt.state(0, i).master.defined() ? gpu_opt.state(0, i).master : gpu_params[i], kCPU, DType::f64);
    const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) {
      diff += (x[k] - y[k]) * (x[k] - y[k]);
      norm += x[k] * x[k];
    }
  }
  const double relative = std::sqrt(diff / norm);
  std::printf("[ adamw ] multi-tensor CUDA vs CPU, 70 parameters, 10 steps: relative difference %.2e (tol 1e-6)\n",
              relative);
  EXPECT_LE(relative, 1e-6);
  EXPECT_EQ(gpu_opt.steps_taken(), 10);
}

// zero_grad(set_to_none=false) on the GPU zeroes every gradient in one launch per dtype: each
// keeps its buffer (a captured step's kernels hold the address), reads 0 everywhere and has a new
// version, as after zero_(); a parameter without a gradient keeps none.
TEST(Optimizer, CudaZeroGradZeroesEveryGradientInItsOwnBuffer) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(5);
  std::vector<Tensor> params;
  for (int i = 0; i < 40; ++i) {
    const int64_t n = i == 7 ? 300001 : 1 + (i * 53) % 700;
    const DType dtype = i % 3 == 0 ? DType::bf16 : i % 3 == 1 ? DType::f16 : DType::f32;
    params.push_back(raw::to(randn({n}, dtype, &gen), cuda_device(0)).requires_grad_());
    if (i != 11) params.back().set_grad(raw::to(randn({n}, dtype, &gen) + 3.0, cuda_device(0)));
  }
  SGD opt(params, SGDOptions(0.1));
  std::vector<const void*> buffers;
  std::vector<uint64_t> versions;
  for (const Tensor& p : params) {
    buffers.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
    versions.push_back(p.grad().defined() ? p.grad().version() : 0);
  }
  opt.zero_grad(/*set_to_none=*/false);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (i == 11) {
      EXPECT_FALSE(g.defined());
      continue;
    }
    ASSERT_TRUE(g.defined()) << "parameter " << i;
    EXPECT_EQ(g.data_ptr(), buffers[i]) << "parameter " << i;
    EXPECT_GT(g.version(), versions[i]) << "parameter " << i;
    const std::vector<double> values = g.to_vector<double>();
    EXPECT_EQ(std::count(values.begin(), values.end(), 0.0), static_cast<std::ptrdiff_t>(values.size()))
        << "parameter " << i << " of " << values.size() << " elements";
  }
}

TEST(GradScaler, CudaFusedUnscaleFindsOneInfAmongManyGradients) {
  MT_SKIP_WITHOUT_CUDA();
  std::vector<Tensor> params;
  for (int i = 0; i < 150; ++i) params.push_back(ones({64 + i}, "cuda").requires_grad_());
  AdamW opt(params, AdamWOptions(1e-2));
  GradScaler scaler(cuda_device(0), GradScalerOptions().init_scale(8));
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(full({64 + static_cast<int64_t>(i)}, 8.0, "cuda"));
  scaler.unscale_(opt);
  EXPECT_EQ(params[149].grad().to_vector<float>()[0], 1.0f);  // unscaled, in the last launch
  const std::vector<float> before = params[77].to_vector<float>();
  params[77].grad().narrow(0, 3, 1).fill_(std::numeric_limits<double>::infinity());
  opt.zero_grad();
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(full({64 + static_cast<int64_t>(i)}, 8.0, "cuda"));
  params[120].grad().narrow(0, 5, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  GradScaler fresh(cuda_device(0), GradScalerOptions().init_scale(8));
  fresh.step(opt);  // unscale_ finds the NaN: the step is skipped on the device
  fresh.update();
  EXPECT_EQ(params[77].to_vector<float>(), before);
  EXPECT_EQ(fresh.get_scale(), 4.0);
  EXPECT_EQ(opt.steps_taken(), 0);
}

// The contract of optim/optimizer.h that DistributedDataParallel::step relies on: a parameter
// without a gradient is skipped (value, version and state as they were), and two steps that each
// see the gradients of one part of the parameters give exactly what one step over all of them gives.
struct OptimizerCase {
  const char* name;
  DType dtype;  // of the parameters
  std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)> make;
};

std::vector<OptimizerCase> optimizer_cases() {
  return {
      {"SGD with momentum and weight decay", DType::f32,
       [](std::vector<Tensor> p) {
         return std::make_unique<SGD>(std::move(p), SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
       }},
      {"AdamW", DType::f32,
       [](std::vector<Tensor> p) { return std::make_unique<AdamW>(std::move(p), AdamWOptions(0.01)); }},
      {"AdamW with bf16 autocast copies", DType::f32,
       [](std::vector<Tensor> p) {
         return std::make_unique<AdamW>(std::move(p), AdamWOptions(0.01).autocast_copies(DType::bf16));
       }},
      {"AdamW with master weights", DType::bf16,
       [](std::vector<Tensor> p) {
         return std::make_unique<AdamW>(std::move(p), AdamWOptions(0.01).master_weights(true));
       }},
  };
}

std::vector<Tensor> contract_params(const Device& device, DType dtype) {
  Generator gen(5);
  std::vector<Tensor> params;
  for (const Shape& shape : {Shape{7}, Shape{3, 4}, Shape{5}}) {
    Tensor p = raw::to(randn(shape, TensorOptions().device(device), &gen), dtype);
    params.push_back(p.requires_grad_());
  }
  return params;
}

// The optimizer's state on the host, entry by entry; only parameter `index`'s with index >= 0.
std::map<std::string, std::vector<double>> host_state(const Optimizer& opt, int index = -1) {
  const std::string prefix = index < 0 ? "" : "g0.p" + std::to_string(index) + ".";
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : opt.state_dict()) {
    if (name.rfind(prefix, 0) == 0) out[name] = t.to_vector<double>();
  }
  return out;
}

void expect_skips_parameters_without_gradients(const OptimizerCase& c, const Device& device) {
  SCOPED_TRACE(c.name);
  std::vector<Tensor> whole = contract_params(device, c.dtype), split = contract_params(device, c.dtype);
  const std::unique_ptr<Optimizer> one = c.make(whole), two = c.make(split);
  Generator gen(9);
  constexpr size_t kSecondPart = 1;  // parameter 1 steps second; parameters 0 and 2 first
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> grads;
    for (const Tensor& p : whole) grads.push_back(randn(p.shape(), TensorOptions().device(device), &gen));
    for (size_t i = 0; i < whole.size(); ++i) whole[i].set_grad(grads[i].clone());
    one->step();

    for (size_t i = 0; i < split.size(); ++i) split[i].set_grad(i == kSecondPart ? Tensor() : grads[i].clone());
    const std::vector<double> value = split[kSecondPart].to_vector<double>();
    const uint64_t version = split[kSecondPart].version();
    const auto state = host_state(*two, kSecondPart);
    two->step();
    EXPECT_EQ(split[kSecondPart].to_vector<double>(), value) << "step " << step;
    EXPECT_EQ(split[kSecondPart].version(), version) << "step " << step;
    EXPECT_EQ(host_state(*two, kSecondPart), state) << "step " << step;

    for (size_t i = 0; i < split.size(); ++i) split[i].set_grad(i == kSecondPart ? grads[i].clone() : Tensor());
    two->step();
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(split[i].to_vector<double>(), whole[i].to_vector<double>()) << "parameter " << i;
  }
  EXPECT_EQ(host_state(*two), host_state(*one));
}

TEST(Optimizer, SkipsAParameterWithoutAGradient) {
  for (const OptimizerCase& c : optimizer_cases()) expect_skips_parameters_without_gradients(c, kCPU);
}

TEST(Optimizer, CudaSkipsAParameterWithoutAGradient) {
  MT_SKIP_WITHOUT_CUDA();
  for (const OptimizerCase& c : optimizer_cases()) expect_skips_parameters_without_gradients(c, cuda_device(0));
}

}  // namespace
}  // namespace mt
