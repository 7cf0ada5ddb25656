// The Trainer: accumulation, parameter groups, the warm-up's first rate, metrics files, resume.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "core/data/token_file.h"
#include "core/nvtx.h"
#include "core/random.h"
#include "ops/nn/gpt.h"
#include "ops/ops.h"
#include "tests/test_util.h"
#include "train/param_groups.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

nn::GPTConfig tiny_config() {
  nn::GPTConfig c;
  c.vocab_size = 32;
  c.n_positions = 8;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.dropout = 0.0;
  return c;
}

std::unique_ptr<nn::GPT> tiny_gpt(uint64_t seed = 7) {
  Generator init(seed);
  return std::make_unique<nn::GPT>(tiny_config(), &init);
}

// [rows, 8] random ids and next-token targets, the first `ignored` targets set to -100 (not
// trained on), so that micro-batches can hold different numbers of real targets.
Batch make_batch(int64_t rows, uint64_t seed, int64_t ignored = 0) {
  std::mt19937_64 random(seed);
  std::vector<double> inputs, targets;
  for (int64_t i = 0; i < rows * 8; ++i) {
    inputs.push_back(static_cast<double>(random() % 32));
    targets.push_back(i < ignored ? -100.0 : static_cast<double>(random() % 32));
  }
  const TensorOptions ids = TensorOptions().dtype(DType::i64);
  const Tensor target_tensor = from_vector(targets, {rows, 8}, ids);
  return Batch{from_vector(inputs, {rows, 8}, ids), target_tensor, count_targets(target_tensor)};
}

TrainerOptions quiet_options(int64_t steps) {
  TrainerOptions o;
  o.name = "test";
  o.steps = steps;
  o.quiet = true;
  o.log_every = 1;
  o.optimizer.lr = 1e-2;
  o.optimizer.warmup = 0;
  return o;
}

LossFn gpt_loss(const nn::GPT& model) {
  return [&model](const Batch& b) { return model.loss(b.inputs, b.targets); };
}

std::vector<float> flat_parameters(const nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(Trainer, AccumulatingFourMicroBatchesEqualsOneBatchFourTimesAsLarge) {
  // Micro-batches of 3 rows with different numbers of ignored targets: the step must average
  // over every real target, not over the four micro-batch means.
  std::vector<Batch> micro;
  for (int64_t i = 0; i < 4; ++i) micro.push_back(make_batch(3, 100 + i, /*ignored=*/5 * i));
  ASSERT_NE(micro[0].count, micro[3].count);
  std::vector<Tensor> inputs, targets;
  int64_t count = 0;
  for (const Batch& b : micro) {
    inputs.push_back(b.inputs);
    targets.push_back(b.targets);
    count += b.count;
  }
  const Batch big{cat(inputs, 0), cat(targets, 0), count};

  auto small_model = tiny_gpt();
  size_t next = 0;
  FunctionData small_data([&] { return micro[next++ % micro.size()]; });
  TrainerOptions o = quiet_options(3);
  o.accumulation = 4;
  Trainer small(*small_model, small_data, gpt_loss(*small_model), o);
  const TrainResult small_result = small.fit();

  auto big_model = tiny_gpt();
  FunctionData big_data([&] { return big; });
  o.accumulation = 1;
  Trainer large(*big_model, big_data, gpt_loss(*big_model), o);
  const TrainResult big_result = large.fit();

  EXPECT_NEAR(small_result.first_loss, big_result.first_loss, 1e-5 * std::abs(big_result.first_loss));
  const std::vector<float> a = flat_parameters(*small_model), b = flat_parameters(*big_model);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  // Three AdamW steps at lr 1e-2 move weights by ~3e-2; f32 rounding of the summed gradients
  // stays orders of magnitude below.
  EXPECT_LT(worst, 2e-5) << "the accumulated steps differ from the big batch's";
}

TEST(Trainer, OnCudaAccumulationEqualsOneBatchAndLoggedStepsCarryDeviceMemory) {
  MT_SKIP_WITHOUT_CUDA();
  std::vector<Batch> micro;
  for (int64_t i = 0; i < 4; ++i) micro.push_back(make_batch(3, 200 + i, /*ignored=*/4 * i));
  std::vector<Tensor> inputs, targets;
  int64_t count = 0;
  for (const Batch& b : micro) {
    inputs.push_back(b.inputs);
    targets.push_back(b.targets);
    count += b.count;
  }
  const Batch big{cat(inputs, 0), cat(targets, 0), count};
  auto run = [&](int64_t accumulation, std::vector<StepMetrics>* logged) {
    auto model = tiny_gpt();
    model->to(cuda_device(0));
    size_t next = 0;
    FunctionData data([&] { return accumulation == 1 ? big : micro[next++ % micro.size()]; });
    TrainerOptions o = quiet_options(3);
    o.device = cuda_device(0);
    o.accumulation = accumulation;
    o.report = logged != nullptr;
    Trainer trainer(*model, data, gpt_loss(*model), o);
    if (logged) trainer.on_step_end([logged](const StepMetrics& m) { logged->push_back(m); });
    const TrainResult result = trainer.fit();
    if (logged) EXPECT_NE(result.report.find("activations"), std::string::npos) << result.report;
    return flat_parameters(*model);
  };
  std::vector<StepMetrics> logged;
  const std::vector<float> a = run(4, &logged), b = run(1, nullptr);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  EXPECT_LT(worst, 5e-5) << "cuBLAS may sum the big batch in another order: f32 rounding, no more";
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_GT(logged.back().value("mem_peak_gib"), 0.0);
  EXPECT_GE(logged.back().value("mem_reserved_gib"), logged.back().value("mem_allocated_gib"));
}

TEST(Trainer, WeightDecayGroupsSpareBiasesNormGainsAndOptionallyEmbeddings) {
  auto model = tiny_gpt();
  const DecayNames with = weight_decay_names(*model, {0.1, 1e-3, /*decay_embeddings=*/true});
  const DecayNames without = weight_decay_names(*model, {0.1, 1e-3, /*decay_embeddings=*/false});
  const std::set<std::string> decayed(with.decayed.begin(), with.decayed.end());
  for (const auto& [name, p] : model->named_parameters()) {
    const bool matrix = p.dim() >= 2;
    EXPECT_EQ(decayed.count(name) > 0, matrix) << name;
  }
  EXPECT_TRUE(decayed.count("transformer.wte.weight")) << "embeddings decay by default";
  EXPECT_TRUE(decayed.count("transformer.h.0.attn.c_attn.weight"));
  EXPECT_FALSE(decayed.count("transformer.h.0.attn.c_attn.bias"));
  EXPECT_FALSE(decayed.count("transformer.h.0.ln_1.weight"));
  const std::set<std::string> spared(without.not_decayed.begin(), without.not_decayed.end());
  EXPECT_TRUE(spared.count("transformer.wte.weight") && spared.count("transformer.wpe.weight"));
  EXPECT_EQ(with.decayed.size() + with.not_decayed.size(), model->named_parameters().size());

  // The groups as AdamW sees them: decay applies to the first alone. With zero gradients AdamW
  // moves a parameter only by its decay: the decayed ones shrink, the others stay.
  const std::vector<ParamGroup> groups = weight_decay_groups(*model, {0.5, 0.1, true});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.5);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  std::vector<std::vector<float>> before;
  for (const ParamGroup& g : groups) {
    for (Tensor p : g.params) {
      before.push_back(p.to_vector<float>());
      p.set_grad(zeros_like(p));
    }
  }
  AdamW adamw(groups, AdamWOptions(0.1));
  adamw.step();
  size_t k = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (const Tensor& p : groups[gi].params) {
      const std::vector<float> after = p.to_vector<float>();
      const std::vector<float>& was = before[k++];
      for (size_t i = 0; i < after.size(); ++i) {
        const float want = gi == 0 ? was[i] * (1.0f - 0.1f * 0.5f) : was[i];
        ASSERT_NEAR(after[i], want, 1e-6f * std::abs(want) + 1e-9f) << "group " << gi;
      }
    }
  }
}

TEST(Trainer, TheWarmUpsFirstStepHasANonZeroRate) {
  auto model = tiny_gpt();
  FunctionData data([] { return make_batch(2, 1); });
  TrainerOptions o = quiet_options(3);
  o.optimizer.warmup = 4;  // longer than the run: min(warmup, steps) = 3
  Trainer trainer(*model, data, gpt_loss(*model), o);
  std::vector<double> rates;
  trainer.on_step_end([&](const StepMetrics& m) { rates.push_back(m.value("lr")); });
  trainer.fit();
  ASSERT_EQ(rates.size(), 3u);
  EXPECT_DOUBLE_EQ(rates[0], 1e-2 / 4);
  EXPECT_DOUBLE_EQ(rates[1], 2e-2 / 4);
  EXPECT_DOUBLE_EQ(rates[2], 3e-2 / 4);
}

class TrainerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_trainer_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Trains a fresh tiny GPT for `steps` (or resumes), logging every step to both files.
  TrainResult run(int64_t steps, int64_t stop_at, bool resume, bool tensorboard) {
    auto model = tiny_gpt();
    TokenData data(token_file(), data::BatcherOptions(2, 8).seed(3));
    TrainerOptions o = quiet_options(steps);
    o.metrics.jsonl_path = path("metrics.jsonl");
    if (tensorboard) o.metrics.tensorboard_dir = path("tb");
    o.save_dir = path("ck");
    o.stop_at = stop_at;
    o.resume = resume;
    Trainer trainer(*model, data, gpt_loss(*model), o);
    TokenData val(token_file(), data::BatcherOptions(2, 8).shuffle(false));
    trainer.set_validation(val);
    return trainer.fit();
  }

  std::string token_file() {
    const std::string file = path("train.tok");
    if (!fs::exists(file)) {
      std::vector<uint16_t> ids;
      for (int i = 0; i < 400; ++i) ids.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 32));
      data::write_token_file(file, ids, 32);
    }
    return file;
  }

  fs::path dir_;
};

std::vector<int64_t> steps_of(const std::vector<MetricsRecord>& records) {
  std::vector<int64_t> steps;
  for (const MetricsRecord& r : records) steps.push_back(r.step);
  return steps;
}

TEST_F(TrainerFiles, TheJsonLinesAndTheEventFilesHoldTheSameScalarsAtTheSameSteps) {
  const bool tensorboard = tensorboard_available();
  run(/*steps=*/6, /*stop_at=*/0, /*resume=*/false, tensorboard);
  const std::vector<MetricsRecord> records = read_metrics_jsonl(path("metrics.jsonl"));
  EXPECT_EQ(steps_of(records), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms"}) {
    EXPECT_TRUE(records.front().scalars.count(key)) << key;
  }
  EXPECT_TRUE(records.back().scalars.count("val_loss")) << "validation after the last step";
  EXPECT_FALSE(records.front().scalars.count("val_loss"));
  if (!tensorboard) GTEST_SKIP() << "this build has no protobuf: no event files to compare";
  std::vector<ScalarEvent> events;
  for (const auto& entry : fs::directory_iterator(path("tb"))) {
    const std::vector<ScalarEvent> file = read_tensorboard_scalars(entry.path().string());
    events.insert(events.end(), file.begin(), file.end());
  }
  size_t compared = 0;
  for (const MetricsRecord& r : records) {
    for (const auto& [tag, value] : r.scalars) {
      int matches = 0;
      for (const ScalarEvent& e : events) {
        if (e.tag != tag || e.step != r.step) continue;
        ++matches;
        EXPECT_EQ(e.value, static_cast<float>(value)) << tag << " at step " << r.step;
      }
      EXPECT_EQ(matches, 1) << tag << " at step " << r.step;
      ++compared;
    }
  }
  EXPECT_EQ(compared, events.size()) << "the event files hold scalars the JSON lines do not";
}

TEST_F(TrainerFiles, AResumedRunAppendsWithoutDuplicateSteps) {
  const bool tensorboard = tensorboard_available();
  const TrainResult first = run(/*steps=*/8, /*stop_at=*/4, /*resume=*/false, tensorboard);
  EXPECT_TRUE(first.interrupted);
  // An interrupted run got further than its checkpoint (step 4): lines of steps 5 and 6 exist.
  {
    std::ofstream out(path("metrics.jsonl"), std::ios::app);
    out << "{\"step\":5,\"time\":1,\"loss\":9}\n{\"step\":6,\"time\":1,\"loss\":9}\n";
  }
  const TrainResult second = run(/*steps=*/8, /*stop_at=*/0, /*resume=*/true, tensorboard);
  EXPECT_FALSE(second.interrupted);
  const std::vector<MetricsRecord> records = read_metrics_jsonl(path("metrics.jsonl"));
  EXPECT_EQ(steps_of(records), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_NE(records[4].scalars.at("loss"), 9.0) << "the orphaned line of step 5 survived";

  // A straight run logs the same losses (the resume is exact on the CPU).
  fs::remove_all(path("ck"));
  run(/*steps=*/8, /*stop_at=*/0, /*resume=*/false, /*tensorboard=*/false);
  const std::vector<MetricsRecord> straight = read_metrics_jsonl(path("metrics.jsonl"));
  ASSERT_EQ(straight.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(straight[i].scalars.at("loss"), records[i].scalars.at("loss")) << "step " << records[i].step;
  }
}

TEST_F(TrainerFiles, TokenDataReadsAShardedCorpusAndCountsOnlyTheTargetsOutsideTheLossMask) {
  fs::create_directories(path("corpus"));
  std::vector<uint32_t> prompt_and_answer(40);
  for (size_t i = 0; i < prompt_and_answer.size(); ++i) prompt_and_answer[i] = static_cast<uint32_t>(i % 32);
  std::vector<uint8_t> mask(40, 1);
  std::fill(mask.begin(), mask.begin() + 10, uint8_t{0});  // a 10-token prompt
  data::write_token_file(path("corpus/a.tok"), prompt_and_answer, mask, 32);
  data::write_token_file(path("corpus/b.tok"), std::vector<uint16_t>(24, 5), 32);
  // Windows of 8: 4 in a.tok (targets at 1..32, of which 1..9 are prompt), 2 in b.tok.
  TokenData data(path("corpus"), data::BatcherOptions(2, 8).seed(1));
  EXPECT_EQ(data.corpus().num_shards(), 2);
  // 54 of the 64 tokens are targets: all of b.tok and the 30 answer tokens of a.tok.
  EXPECT_EQ(data.describe(), "64 tokens in 2 shards of " + path("corpus") +
                                 ", 3 batches of 2x8 per epoch and rank, loss mask: 84.4% of tokens are targets");
  int64_t counted = 0;
  for (int i = 0; i < 3; ++i) {
    const Batch batch = data.next();
    EXPECT_EQ(batch.count, count_targets(batch.targets));
    counted += batch.count;
  }
  EXPECT_EQ(counted, 6 * 8 - 9);
}

TEST(Trainer, NvtxRangesOnOrOffLeaveTheStepsResultsUnchanged) {
  auto run = [](bool nvtx) {
    auto model = tiny_gpt();
    FunctionData data([] { return make_batch(2, 5); });
    TrainerOptions o = quiet_options(3);
    o.nvtx = nvtx;
    Trainer trainer(*model, data, gpt_loss(*model), o);
    trainer.fit();
    nvtx::set_enabled(false);
    return flat_parameters(*model);
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Trainer, TheReportSaysWhereTheTimeWentByOpFamilyAndModule) {
  auto model = tiny_gpt();
  FunctionData data([] { return make_batch(2, 5); });
  TrainerOptions o = quiet_options(9);
  o.report = true;
  Trainer trainer(*model, data, gpt_loss(*model), o);
  const TrainResult result = trainer.fit();
  for (const char* expected : {"matmul", "optimizer", "model.transformer.h.0", "parameters"}) {
    EXPECT_NE(result.report.find(expected), std::string::npos) << expected << " not in:\n" << result.report;
  }
}

TEST(ProgressBar, OnATerminalRedrawsOneLineInPlaceAndPrintsMessagesAboveIt) {
  ::testing::internal::CaptureStdout();
  {
    ProgressBar bar("run", 4, ProgressMode::bar);
    bar.update(1, 1, {"loss 2.0000"});
    bar.print("run: checkpoint x");
    bar.update(4, 4, {"loss 1.0000"});
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\rrun [#####...............] 1/4 | loss 2.0000"), std::string::npos) << out;
  EXPECT_NE(out.find("\r\033[Krun: checkpoint x\n"), std::string::npos) << out;
  EXPECT_NE(out.find("\rrun [####################] 4/4 | loss 1.0000 | eta 0m00s\033[K\n"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << "one line for the message, one ending the bar";

  ::testing::internal::CaptureStdout();
  {
    ProgressBar lines("run", 4, ProgressMode::lines);
    lines.update(4, 4, {"loss 1.0000"});
  }
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "") << "lines mode leaves the lines to the caller";
  EXPECT_EQ(progress_line("run", 25, 100, {"loss 1.5000"}, /*seconds=*/10, /*done_here=*/25),
            "run: step   25/100 | loss 1.5000 | eta 0m30s");
}

TEST(Trainer, BadOptionsAndBadBatchesAreClearErrors) {
  auto model = tiny_gpt();
  FunctionData data([] { return make_batch(2, 1); });
  TrainerOptions o = quiet_options(0);
  EXPECT_NE(error_message_of([&] { Trainer(*model, data, gpt_loss(*model), o); }).find("steps must be > 0, got 0"),
            std::string::npos);
  o = quiet_options(2);
  o.resume = true;
  EXPECT_NE(error_message_of([&] { Trainer(*model, data, gpt_loss(*model), o); }).find("needs a checkpoint directory"),
            std::string::npos);
  FunctionData empty_batches([] { return Batch{}; });
  Trainer trainer(*model, empty_batches, gpt_loss(*model), quiet_options(2));
  EXPECT_NE(error_message_of([&] { trainer.fit(); }).find("batch without inputs"), std::string::npos);
}

}  // namespace
}  // namespace mt::train
