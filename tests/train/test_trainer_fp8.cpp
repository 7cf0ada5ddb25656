// The Trainer with options.fp8 (CPU emulation of the FP8 GEMMs): a tiny GPT trains as its bf16
// run does; logged steps carry the scale health (metrics scalars and a piece of the progress
// line), its overflow counts adding up to the states'; validation runs in FP8 and leaves the
// training run bit for bit as it was; a resumed run repeats the straight one; and the options it
// refuses are clear errors.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/data/token_file.h"
#include "core/random.h"
#include "ops/nn/fp8_state_dict.h"
#include "ops/nn/gpt.h"
#include "ops/ops.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

// Every Linear's sides are multiples of 16, as FP8 GEMMs need: c_attn [48, 16], c_fc [64, 16], ...
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

// [rows, 8] random ids and next-token targets.
Batch make_batch(int64_t rows, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<double> inputs, targets;
  for (int64_t i = 0; i < rows * 8; ++i) {
    inputs.push_back(static_cast<double>(random() % 32));
    targets.push_back(static_cast<double>(random() % 32));
  }
  const TensorOptions ids = TensorOptions().dtype(DType::i64);
  const Tensor target_tensor = from_vector(targets, {rows, 8}, ids);
  return Batch{from_vector(inputs, {rows, 8}, ids), target_tensor, count_targets(target_tensor)};
}

TrainerOptions fp8_options(int64_t steps, std::optional<Fp8Recipe> fp8 = Fp8Recipe::delayed()) {
  TrainerOptions o;
  o.name = "test";
  o.steps = steps;
  o.quiet = true;
  o.log_every = 1;
  o.optimizer.lr = 1e-2;
  o.optimizer.warmup = 0;
  o.amp = DType::bf16;
  o.fp8 = fp8;
  return o;
}

LossFn gpt_loss(const nn::GPT& model) {
  return [&model](const Batch& b) { return model.loss(b.inputs, b.targets); };
}

struct TrainedRun {
  std::vector<StepMetrics> logged;
  std::vector<double> losses;
  std::vector<float> weights;
  std::string out;  // stdout, when not quiet
};

// Trains a fresh tiny GPT on one fixed batch; `setup` may change the trainer before fit().
TrainedRun train(TrainerOptions o, const std::function<void(Trainer&, nn::GPT&)>& setup = {}) {
  auto model = tiny_gpt();
  FunctionData data([] { return make_batch(4, 11); });
  Trainer trainer(*model, data, gpt_loss(*model), o);
  TrainedRun run;
  trainer.on_step_end([&run](const StepMetrics& m) {
    run.logged.push_back(m);
    run.losses.push_back(m.value("loss"));
  });
  if (setup) setup(trainer, *model);
  if (!o.quiet) ::testing::internal::CaptureStdout();
  trainer.fit();
  if (!o.quiet) run.out = ::testing::internal::GetCapturedStdout();
  for (const Tensor& p : model->parameters()) {
    const std::vector<float> v = p.to_vector<float>();
    run.weights.insert(run.weights.end(), v.begin(), v.end());
  }
  return run;
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

TEST(TrainerFp8, TrainsCloseToTheBf16RunAndReportsTheScalesHealth) {
  TrainerOptions bf16 = fp8_options(30, std::nullopt);
  const TrainedRun ref = train(bf16);
  for (const Fp8Recipe& recipe : {Fp8Recipe::delayed(), Fp8Recipe::current()}) {
    const TrainedRun got = train(fp8_options(30, recipe));
    const std::string what = recipe.str();
    ASSERT_EQ(got.losses.size(), 30u) << what;
    EXPECT_LT(got.losses.back(), 0.7 * got.losses.front()) << what;
    for (size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_LT(std::abs(got.losses[i] - ref.losses[i]), 0.03 * ref.losses[i]) << what << " step " << i + 1;
    }
    EXPECT_LT(std::abs(mean_of_last(got.losses, 5) - mean_of_last(ref.losses, 5)), 0.02 * mean_of_last(ref.losses, 5))
        << what;
    const bool delayed = recipe.scaling == Fp8Recipe::Scaling::delayed;
    for (const StepMetrics& m : got.logged) {
      // Current scaling reports its latest casts' scales, and never a saturated cast.
      ASSERT_FALSE(std::isnan(m.value("fp8_overflows"))) << what << " step " << m.step;
      if (delayed) EXPECT_GE(m.value("fp8_overflows"), 0.0);
      if (!delayed) EXPECT_EQ(m.value("fp8_overflows"), 0.0);
      EXPECT_GT(m.value("fp8_scale_min"), 0.0);
      EXPECT_LT(m.value("fp8_scale_min"), m.value("fp8_scale_max")) << "x, W and dy have scales of their own";
    }
  }
  for (const StepMetrics& m : ref.logged) EXPECT_TRUE(std::isnan(m.value("fp8_scale_max"))) << "no FP8, no scales";
}

// The overflows of each record are those since the previous one: one forced at step 3 (a scale far
// too large for the input of one layer) shows in step 3's record, and the records add up to the
// states' own count.
TEST(TrainerFp8, OverflowsAreCountedSinceTheLastRecord) {
  int64_t counted_by_the_states = -1;
  const TrainedRun run = train(fp8_options(5), [&](Trainer& trainer, nn::GPT& model) {
    trainer.on_step_end([&counted_by_the_states, &m = model](const StepMetrics& step) {
      if (step.step == 5) counted_by_the_states = nn::fp8_health(m).overflows;
      if (step.step != 2) return;
      for (const auto& [path, child] : m.named_modules()) {
        if (auto* linear = dynamic_cast<nn::Linear*>(child.get())) {
          linear->fp8_state->input.scale.fill_(1e6);
          linear->fp8_state->input.scale_inv.fill_(1e-6);
          return;
        }
      }
    });
  });
  ASSERT_EQ(run.logged.size(), 5u);
  double total = 0;
  for (const StepMetrics& m : run.logged) total += m.value("fp8_overflows");
  EXPECT_GE(run.logged[2].value("fp8_overflows"), 1.0);
  EXPECT_EQ(total, static_cast<double>(counted_by_the_states)) << "no overflow counted twice or lost";
}

TEST(TrainerFp8, TheProgressLineAndTheMetricsFileCarryTheScalesHealth) {
  const std::string jsonl =
      (fs::temp_directory_path() / ("mt_trainer_fp8_metrics_" + std::to_string(::getpid()) + ".jsonl")).string();
  TrainerOptions o = fp8_options(4);
  o.quiet = false;
  o.progress = ProgressMode::lines;
  o.log_every = 2;
  o.metrics.jsonl_path = jsonl;
  const TrainedRun run = train(o);
  const std::regex line(R"(test: step +4/4 \| loss [0-9.]+ \| .* \| loss scale off \| )"
                        R"(fp8 ovf [0-9]+ scale [0-9]\.[0-9]e[+-][0-9]+\.\.[0-9]\.[0-9]e[+-][0-9]+ \| eta )");
  EXPECT_TRUE(std::regex_search(run.out, line)) << run.out;
  EXPECT_NE(run.out.find("bf16 autocast, FP8 Linear layers (delayed scaling (history 16, amax max, margin 0))"),
            std::string::npos)
      << run.out;
  const std::vector<MetricsRecord> records = read_metrics_jsonl(jsonl);
  ASSERT_EQ(records.size(), 3u);  // steps 1, 2 and 4
  for (const MetricsRecord& r : records) {
    for (const char* key : {"fp8_overflows", "fp8_scale_min", "fp8_scale_max"}) {
      EXPECT_TRUE(r.scalars.count(key)) << key << " at step " << r.step;
    }
  }
  fs::remove(jsonl);
}

// Validation runs in FP8 (another loss than the same weights give in bf16) on copies of the
// states: a run validating every other step trains bit for bit as one that never validates, and
// two validations in a row agree.
TEST(TrainerFp8, ValidationRunsInFp8AndLeavesTheTrainingRunAsItWas) {
  const TrainedRun plain = train(fp8_options(6));
  FunctionData val([] { return make_batch(4, 99); });
  double first = 0, again = 0, in_bf16 = 0;
  std::vector<double> val_losses;
  std::map<std::string, std::vector<double>> states_before, states_after;
  TrainerOptions o = fp8_options(6);
  o.eval_every = 2;
  o.eval_batches = 2;
  const TrainedRun validated = train(o, [&](Trainer& trainer, nn::GPT& model) {
    trainer.set_validation(val);
    trainer.on_validation([&](int64_t, double loss) { val_losses.push_back(loss); });
    trainer.on_step_end([&, &model = model, &trainer = trainer](const StepMetrics& m) {
      if (m.step != 6) return;
      const auto dump = [&] {
        std::map<std::string, std::vector<double>> values;
        for (const auto& [key, t] : nn::fp8_state_dict(model)) values[key] = t.to_vector<double>();
        return values;
      };
      states_before = dump();
      first = trainer.evaluate();
      again = trainer.evaluate();
      states_after = dump();
      FunctionData unused([] { return make_batch(4, 1); });
      Trainer bf16(model, unused, gpt_loss(model), fp8_options(1, std::nullopt));
      bf16.set_validation(val);
      in_bf16 = bf16.evaluate();
    });
  });
  EXPECT_EQ(validated.losses, plain.losses);
  EXPECT_EQ(validated.weights, plain.weights);
  EXPECT_EQ(val_losses.size(), 3u);
  EXPECT_EQ(first, again);
  EXPECT_EQ(states_after, states_before);
  EXPECT_NE(first, in_bf16) << "validation ran in FP8";
  EXPECT_LT(std::abs(first - in_bf16), 0.03 * in_bf16);
}

TEST(TrainerFp8, AResumedRunRepeatsTheStraightRun) {
  const fs::path dir = fs::temp_directory_path() / ("mt_trainer_fp8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tokens = (dir / "train.tok").string();
  std::vector<uint16_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 32));
  data::write_token_file(tokens, ids, 32);
  const auto run = [&](int64_t stop_at, bool resume, const std::string& save_dir) {
    auto model = tiny_gpt();
    TokenData data(tokens, data::BatcherOptions(2, 8).seed(3));
    TrainerOptions o = fp8_options(6);
    o.save_dir = (dir / save_dir).string();
    o.stop_at = stop_at;
    o.resume = resume;
    Trainer trainer(*model, data, gpt_loss(*model), o);
    std::vector<double> losses;
    trainer.on_step_end([&](const StepMetrics& m) { losses.push_back(m.value("loss")); });
    trainer.fit();
    return losses;
  };
  const std::vector<double> straight = run(0, false, "straight");
  const std::vector<double> before = run(3, false, "resumed");
  const std::vector<double> after = run(0, true, "resumed");
  ASSERT_EQ(straight.size(), 6u);
  ASSERT_EQ(before.size(), 3u);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(std::vector<double>(straight.begin() + 3, straight.end()), after);
  fs::remove_all(dir);
}

TEST(TrainerFp8, Fp8WithoutBf16AutocastOrWithBlockCheckpointingIsAClearError) {
  auto model = tiny_gpt();
  FunctionData data([] { return make_batch(2, 1); });
  TrainerOptions o = fp8_options(2);
  o.amp.reset();
  std::string msg = error_message_of([&] { Trainer(*model, data, gpt_loss(*model), o); });
  EXPECT_NE(msg.find("Trainer: FP8 (options.fp8) runs inside bf16 autocast, so options.amp must be bf16; got none "
                     "(f32)"),
            std::string::npos)
      << msg;
  o.amp = DType::f16;
  msg = error_message_of([&] { Trainer(*model, data, gpt_loss(*model), o); });
  EXPECT_NE(msg.find("options.amp must be bf16; got f16"), std::string::npos) << msg;
  o = fp8_options(2, Fp8Recipe::delayed(/*history_len=*/0));
  msg = error_message_of([&] { Trainer(*model, data, gpt_loss(*model), o); });
  EXPECT_NE(msg.find("history_len"), std::string::npos) << msg;

  model->set_checkpointing("blocks");
  Trainer trainer(*model, data, gpt_loss(*model), fp8_options(2));
  msg = error_message_of([&] { trainer.fit(); });
  EXPECT_NE(msg.find("cannot run inside a gradient-checkpointed segment"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'selective'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mt::train
