// The end-of-run report (train/report.h): every label a real training step puts in the op
// profiler has an op family, the memory breakdown counts the state's bytes exactly, and the
// report's family shares add up to the whole step.
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/profiler.h"
#include "core/random.h"
#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "tests/test_util.h"
#include "train/report.h"

namespace mt::testing {
namespace {

using train::MemoryBreakdown;
using train::op_family;

// The nn tests' small GPT: 2 layers, width 24, 3 heads, 37 tokens, context 16.
nn::GPTConfig tiny_config() {
  nn::GPTConfig c;
  c.vocab_size = 37;
  c.n_positions = 16;
  c.n_embd = 24;
  c.n_layer = 2;
  c.n_head = 3;
  return c;
}

Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  std::vector<double> ids(static_cast<size_t>(B * T));
  const std::vector<double> u = rand({B * T}, {}, &g).to_vector<double>();
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = std::floor(u[i] * static_cast<double>(vocab));
  return from_vector(ids, {B, T}, DType::i64);
}

// One training step: forward, loss, backward, the optimizer's step.
void train_step(const nn::GPT& model, Optimizer& optimizer, const Tensor& ids) {
  const int64_t T = ids.size(1);
  model.loss(ids.slice(1, 0, T - 1), ids.slice(1, 1, T)).backward();
  optimizer.step();
  optimizer.zero_grad();
}

std::string rows_text(const std::vector<OpProfiler::Row>& rows) {
  std::string out;
  for (const OpProfiler::Row& r : rows) out += "  " + r.label + " -> " + op_family(r.label) + "\n";
  return out;
}

int64_t bytes_of(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  return n;
}

TEST(OpFamily, NamesTheOpsFolderOfEachKindOfLabel) {
  EXPECT_EQ(op_family("forward Matmul"), "matmul");
  EXPECT_EQ(op_family("backward MatmulBackward"), "matmul");
  EXPECT_EQ(op_family("forward LinearGelu"), "matmul");
  EXPECT_EQ(op_family("backward LoraLinearBackward"), "matmul");
  // cuDNN's attention node carries a backend tag, in its forward label too.
  EXPECT_EQ(op_family("forward ScaledDotProductAttentionBackward(cuDNN)"), "attention");
  EXPECT_EQ(op_family("backward ScaledDotProductAttentionBackward(cuDNN)"), "attention");
  EXPECT_EQ(op_family("backward AddLayerNormBackward"), "norm");
  EXPECT_EQ(op_family("forward LogSoftmax"), "softmax");
  EXPECT_EQ(op_family("forward LinearCrossEntropy"), "loss");
  EXPECT_EQ(op_family("forward gelu"), "elementwise");
  EXPECT_EQ(op_family("backward mulBackward"), "elementwise");  // x * x keeps the unary op's name
  EXPECT_EQ(op_family("forward Cast"), "elementwise");
  EXPECT_EQ(op_family("backward EmbeddingBackward"), "embedding");
  EXPECT_EQ(op_family("forward Dropout"), "dropout");
  EXPECT_EQ(op_family("backward Conv2dBackward"), "conv");
  EXPECT_EQ(op_family("forward Sum"), "reduction");
  EXPECT_EQ(op_family("backward TransposeBackward"), "shape");
  EXPECT_EQ(op_family("forward ToDevice"), "shape");
  EXPECT_EQ(op_family("forward MaskedFill"), "where");
  EXPECT_EQ(op_family("after backward"), "optimizer");
  EXPECT_EQ(op_family("backward (between nodes)"), "autograd");
  EXPECT_EQ(op_family("backward AccumulateGrad"), "autograd");
  EXPECT_EQ(op_family("backward CheckpointBackward"), "autograd");
  // Neither a profiler label nor an op of ops/.
  EXPECT_EQ(op_family("start"), "other");
  EXPECT_EQ(op_family("forward Frobnicate"), "other");
  EXPECT_EQ(op_family("backward"), "other");
  EXPECT_EQ(op_family(""), "other");
}

// Every interval of real GPT steps on the CPU (fused and unfused ops, dropout, LoRA, checkpointed
// blocks) falls in a family of its own: none is "other".
TEST(OpFamily, EveryLabelOfATinyGptTrainingStepHasAFamily) {
  std::set<std::string> families;
  const Tensor ids = random_ids(2, 9, 37, 1);
  {
    nn::GPTConfig c = tiny_config();
    c.dropout = 0.1;
    Generator gen(2);
    nn::GPT model(c, &gen);
    AdamW optimizer(model.parameters(), AdamWOptions(1e-3));
    OpProfiler profiler(Device("cpu"));
    for (int step = 0; step < 2; ++step) {
      train_step(model, optimizer, ids);
      profiler.step();
    }
    const std::vector<OpProfiler::Row> rows = profiler.rows();
    ASSERT_FALSE(rows.empty());
    for (const OpProfiler::Row& r : rows) {
      EXPECT_NE(op_family(r.label), "other") << r.label << " in\n" << rows_text(rows);
      families.insert(op_family(r.label));
    }
  }
  {
    Generator gen(3);
    nn::GPT model(tiny_config(), &gen);
    model.set_fused_ops(false);
    model.set_checkpointing(nn::GPTCheckpointing::parse("blocks"));
    nn::LoRAOptions lora;
    lora.r = 2;
    lora.target_modules = {"c_attn", "c_proj", "c_fc"};
    nn::apply_lora(model, lora, &gen);
    AdamW optimizer(model.trainable_parameters(), AdamWOptions(1e-3));
    OpProfiler profiler(Device("cpu"));
    train_step(model, optimizer, ids);
    profiler.step();
    const std::vector<OpProfiler::Row> rows = profiler.rows();
    for (const OpProfiler::Row& r : rows) {
      EXPECT_NE(op_family(r.label), "other") << r.label << " in\n" << rows_text(rows);
      families.insert(op_family(r.label));
    }
  }
  // The CPU runs attention as its composite (matmul, masked_fill, softmax): no "attention" row.
  for (const char* f : {"matmul", "norm", "softmax", "loss", "elementwise", "embedding", "dropout", "shape", "where",
                        "optimizer", "autograd"}) {
    EXPECT_EQ(families.count(f), 1u) << "no interval of family " << f;
  }
}

TEST(MemoryBreakdown, CountsParametersGradientsAndAdamWStateExactlyOnTheCpu) {
  Generator gen(4);
  nn::GPT model(tiny_config(), &gen);
  const std::vector<Tensor> params = model.parameters();
  const int64_t param_bytes = bytes_of(params);
  const int64_t n = static_cast<int64_t>(params.size());
  ASSERT_GT(param_bytes, 0);
  AdamW optimizer(params, AdamWOptions(1e-3));
  const Tensor ids = random_ids(2, 9, 37, 5);
  model.loss(ids.slice(1, 0, 8), ids.slice(1, 1, 9)).backward();
  optimizer.step();

  const MemoryBreakdown m = train::memory_breakdown(model, optimizer, Device("cpu"));
  EXPECT_EQ(m.parameters, param_bytes);  // f32: numel * 4, the tied head counted once
  EXPECT_EQ(m.gradients, param_bytes);   // every parameter has an f32 gradient
  // Two f32 moments per parameter and an i64 step count per parameter tensor.
  EXPECT_EQ(m.optimizer_state, 2 * param_bytes + 8 * n);
  EXPECT_FALSE(m.on_device);
  EXPECT_EQ(m.peak, 0);
  EXPECT_EQ(m.reserved, 0);
  EXPECT_EQ(m.activations, 0);
  EXPECT_EQ(m.workspaces, 0);

  optimizer.zero_grad();  // frees the gradients
  EXPECT_EQ(train::memory_breakdown(model, optimizer, Device("cpu")).gradients, 0);
}

TEST(MemoryBreakdown, CountsAParameterOfTheOptimizerThatTheModuleDoesNotHold) {
  Generator gen(14);
  nn::GPT model(tiny_config(), &gen);
  const int64_t model_bytes = bytes_of(model.parameters());
  Tensor extra = randn({4, 6}, {}, &gen).requires_grad_();  // 96 bytes
  std::vector<Tensor> params = model.parameters();
  params.push_back(extra);
  AdamW optimizer(params, AdamWOptions(1e-3));
  const Tensor ids = random_ids(2, 9, 37, 15);
  add(model.loss(ids.slice(1, 0, 8), ids.slice(1, 1, 9)), sum(extra)).backward();
  const MemoryBreakdown m = train::memory_breakdown(model, optimizer, Device("cpu"));
  EXPECT_EQ(m.parameters, model_bytes + 96);
  EXPECT_EQ(m.gradients, model_bytes + 96);
  EXPECT_EQ(m.optimizer_state, 2 * (model_bytes + 96) + 8 * static_cast<int64_t>(params.size()));
}

TEST(MemoryBreakdown, AdamWAutocastCopiesAreOptimizerState) {
  Generator gen(6);
  nn::GPT model(tiny_config(), &gen);
  const std::vector<Tensor> params = model.parameters();
  const int64_t param_bytes = bytes_of(params);
  const int64_t n = static_cast<int64_t>(params.size());
  AdamW optimizer(params, AdamWOptions(1e-3).autocast_copies(DType::bf16));
  const Tensor ids = random_ids(2, 9, 37, 7);
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    model.loss(ids.slice(1, 0, 8), ids.slice(1, 1, 9)).backward();
  }
  optimizer.step();  // writes the bf16 copies: half the f32 parameters' bytes
  const MemoryBreakdown m = train::memory_breakdown(model, optimizer, Device("cpu"));
  EXPECT_EQ(m.optimizer_state, 2 * param_bytes + 8 * n + param_bytes / 2);
}

TEST(MemoryBreakdown, LoraCountsTheFrozenWeightsButOnlyTheAdaptersGradientsAndState) {
  Generator gen(8);
  nn::GPT model(tiny_config(), &gen);
  nn::LoRAOptions lora;
  lora.r = 2;
  lora.target_modules = {"c_attn"};
  nn::apply_lora(model, lora, &gen);
  const std::vector<Tensor> trainable = model.trainable_parameters();
  AdamW optimizer(trainable, AdamWOptions(1e-3));
  const Tensor ids = random_ids(2, 9, 37, 9);
  model.loss(ids.slice(1, 0, 8), ids.slice(1, 1, 9)).backward();
  const MemoryBreakdown m = train::memory_breakdown(model, optimizer, Device("cpu"));
  EXPECT_EQ(m.parameters, bytes_of(model.parameters()));
  EXPECT_EQ(m.gradients, bytes_of(trainable));
  EXPECT_EQ(m.optimizer_state, 2 * bytes_of(trainable) + 8 * static_cast<int64_t>(trainable.size()));
}

TEST(MemoryBreakdown, OnCudaTheRestOfThePeakIsActivations) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(10);
  nn::GPT model(tiny_config(), &gen);
  model.to(cuda_device(0));
  const int64_t param_bytes = bytes_of(model.parameters());
  AdamW optimizer(model.parameters(), AdamWOptions(1e-3));
  const Tensor ids = random_ids(2, 9, 37, 11).to(cuda_device(0));
  cuda::reset_peak_memory(0);
  model.loss(ids.slice(1, 0, 8), ids.slice(1, 1, 9)).backward();
  optimizer.step();
  const MemoryBreakdown m = train::memory_breakdown(model, optimizer, cuda_device(0));
  EXPECT_TRUE(m.on_device);
  EXPECT_EQ(m.parameters, param_bytes);
  EXPECT_EQ(m.gradients, param_bytes);
  const int64_t held = m.parameters + m.gradients + m.optimizer_state + m.workspaces;
  EXPECT_GE(m.peak, held);
  EXPECT_EQ(m.activations, m.peak - held);
  EXPECT_GE(m.reserved, m.peak);
  // The CPU holds none of it.
  EXPECT_EQ(train::memory_breakdown(model, optimizer, Device("cpu")).parameters, 0);
}

// The shares printed after each family (the lines "  <family> <ms> ms <share>%").
std::vector<double> shares_in(const std::string& report, const std::string& section_start,
                              const std::string& section_end, std::set<std::string>* names) {
  const size_t begin = report.find(section_start);
  const size_t end = report.find(section_end, begin);
  std::istringstream lines(report.substr(begin, end - begin));
  std::string line;
  std::getline(lines, line);  // the heading
  std::vector<double> shares;
  while (std::getline(lines, line)) {
    char name[64];
    double ms = 0, share = 0;
    if (std::sscanf(line.c_str(), " %63s %lf ms %lf%%", name, &ms, &share) == 3) {
      shares.push_back(share);
      if (names != nullptr) names->insert(name);
    }
  }
  return shares;
}

TEST(RunReport, ShowsEveryFamilyWithSharesThatAddUpAndTheModulesAndMemory) {
  Generator gen(12);
  nn::GPT model(tiny_config(), &gen);
  AdamW optimizer(model.parameters(), AdamWOptions(1e-3));
  const Tensor ids = random_ids(2, 9, 37, 13);
  OpProfiler profiler(Device("cpu"));
  for (int step = 0; step < 3; ++step) {
    const int64_t T = ids.size(1);
    model.loss(ids.slice(1, 0, T - 1), ids.slice(1, 1, T)).backward();
    optimizer.step();
    profiler.step();
  }
  train::RunReportInput input;
  input.profiler = &profiler;
  input.module_rows = {{"transformer.h.0", 3.0, 3}, {"transformer.h.1", 6.0, 3}};
  input.memory = train::memory_breakdown(model, optimizer, Device("cpu"));
  optimizer.zero_grad();
  input.steps = 3;
  input.seconds = 0.6;
  const std::string report = train::run_report(input);

  EXPECT_NE(report.find("3 steps in 0.6 s: 200.0 ms per step"), std::string::npos) << report;
  std::set<std::string> want;
  for (const OpProfiler::Row& r : profiler.rows()) want.insert(op_family(r.label));
  std::set<std::string> got;
  const std::vector<double> shares = shares_in(report, "time per step by op family", "time per step by module", &got);
  EXPECT_EQ(got, want) << report;
  double total = 0;
  for (double s : shares) total += s;
  // Each share is rounded to 0.1%.
  EXPECT_NEAR(total, 100.0, 0.05 * static_cast<double>(shares.size()) + 1e-9) << report;
  // The modules, slowest first, per profiled step.
  const size_t h1 = report.find("transformer.h.1"), h0 = report.find("transformer.h.0");
  ASSERT_NE(h1, std::string::npos) << report;
  EXPECT_LT(h1, h0) << report;
  EXPECT_NE(report.find("2.000 ms   66.7%", h1), std::string::npos) << report;
  EXPECT_NE(report.find("1.000 ms   33.3%", h0), std::string::npos) << report;
  EXPECT_NE(report.find("no device memory figures"), std::string::npos) << report;
  EXPECT_NE(report.find("optimizer state"), std::string::npos) << report;
}

TEST(RunReport, ShowsTenModulesAndTheRestInOneRow) {
  train::RunReportInput input;
  input.steps = 2;
  for (int i = 0; i < 12; ++i) input.module_rows.push_back({"m" + std::to_string(i), 2.0 * (i + 1), 2});
  const std::string report = train::run_report(input);
  EXPECT_NE(report.find("m11"), std::string::npos) << report;
  EXPECT_NE(report.find("m2 "), std::string::npos) << report;
  EXPECT_EQ(report.find("m1 "), std::string::npos) << report;
  // m0 and m1: 2 + 4 ms over 2 steps, 6 / 156 of the time.
  EXPECT_NE(report.find("(2 more modules)                              3.000 ms    3.8%"), std::string::npos) << report;
}

TEST(RunReport, MemorySharesOfTheDevicePeakAddUp) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  train::RunReportInput input;
  input.memory.on_device = true;
  input.memory.parameters = 256 * kMiB;
  input.memory.gradients = 256 * kMiB;
  input.memory.optimizer_state = 512 * kMiB;
  input.memory.peak = 2048 * kMiB;
  input.memory.activations = 1024 * kMiB;
  input.memory.reserved = 3072 * kMiB;
  const std::string report = train::run_report(input);
  EXPECT_NE(report.find("no op profile was taken"), std::string::npos) << report;
  EXPECT_NE(report.find("memory: peak 2.00 GiB allocated, 3.00 GiB reserved"), std::string::npos) << report;
  EXPECT_NE(report.find("256.00 MiB   12.5%"), std::string::npos) << report;
  EXPECT_NE(report.find("1.00 GiB   50.0%"), std::string::npos) << report;
  // Without a workspace figure the activations row says it holds them.
  EXPECT_NE(report.find("activations, temporaries, workspaces"), std::string::npos) << report;
  EXPECT_EQ(report.find("no device memory figures"), std::string::npos) << report;
}

}  // namespace
}  // namespace mt::testing
