// Optimizer state and training checkpoints: exact round trips, retention, and the errors.
#include <cstdio>
#include <filesystem>

#include "core/safetensors.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "optim/training_checkpoint.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const std::string dir = (fs::temp_directory_path() / ("mt_ckpt_" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A small model trained with dropout, so that the random generator matters.
struct Trainee {
  nn::Linear layer{nn::LinearOptions(6, 3)};
  std::unique_ptr<Optimizer> opt;
  explicit Trainee(bool sgd) {
    if (sgd) {
      opt = std::make_unique<SGD>(layer.parameters(), SGDOptions(0.1).momentum(0.9));
    } else {
      opt = std::make_unique<AdamW>(layer.parameters(), AdamWOptions(1e-2));
    }
  }
  void step(int i) {
    Generator g(static_cast<uint64_t>(i));
    const Tensor x = randn({4, 6}, {}, &g);
    opt->zero_grad();
    sum(mul(dropout(layer.forward(x), 0.3, /*training=*/true), layer.forward(x))).backward();
    opt->step();
  }
  std::vector<float> weights() const { return layer.weight.to_vector<float>(); }
};

TEST(TrainingCheckpoint, ResumingGivesBitIdenticalTrainingForAdamWAndSgd) {
  for (bool sgd : {false, true}) {
    const std::string dir = scratch(sgd ? "sgd" : "adamw");
    manual_seed(3);
    Trainee straight(sgd);
    for (int i = 0; i < 6; ++i) straight.step(i);

    manual_seed(3);
    Trainee first(sgd);
    for (int i = 0; i < 3; ++i) first.step(i);
    TrainingState saved{&first.layer, first.opt.get(), nullptr, nullptr, {{"step", 3}}};
    save_training_checkpoint(dir + "/c.safetensors", saved);
    manual_seed(999);  // the generator moves on; loading must put it back

    Trainee second(sgd);
    TrainingState loaded{&second.layer, second.opt.get(), nullptr, nullptr, {}};
    load_training_checkpoint(dir + "/c.safetensors", loaded);
    EXPECT_EQ(loaded.extra.at("step"), 3);
    for (int i = 3; i < 6; ++i) second.step(i);
    EXPECT_EQ(second.weights(), straight.weights()) << (sgd ? "SGD" : "AdamW");
  }
}

TEST(TrainingCheckpoint, SchedulerAndScalerStateRoundTrip) {
  const std::string dir = scratch("sched");
  nn::Linear layer(nn::LinearOptions(2, 2));
  AdamW opt(layer.parameters(), AdamWOptions(1.0));
  WarmupCosineLR schedule(opt, 10, 100);
  GradScaler scaler(kCPU, GradScalerOptions().init_scale(1024));
  for (int i = 0; i < 7; ++i) schedule.step();
  TrainingState state{&layer, &opt, &scaler, &schedule, {}};
  save_training_checkpoint(dir + "/c.safetensors", state);

  nn::Linear layer2(nn::LinearOptions(2, 2));
  AdamW opt2(layer2.parameters(), AdamWOptions(1.0));
  WarmupCosineLR schedule2(opt2, 10, 100);
  GradScaler scaler2(kCPU);
  TrainingState state2{&layer2, &opt2, &scaler2, &schedule2, {}};
  load_training_checkpoint(dir + "/c.safetensors", state2);
  EXPECT_EQ(schedule2.last_step(), 7);
  EXPECT_EQ(schedule2.last_lr(), schedule.last_lr());
  EXPECT_EQ(scaler2.get_scale(), 1024);
  EXPECT_EQ(layer2.weight.to_vector<float>(), layer.weight.to_vector<float>());
}

TEST(TrainingCheckpoint, DirectoryKeepsTheNewestAndDropsInterruptedWrites) {
  const std::string dir = scratch("dir");
  nn::Linear layer(nn::LinearOptions(2, 2));
  std::FILE* stale = std::fopen((dir + "/step-000000003.safetensors.tmp.12345").c_str(), "w");
  ASSERT_NE(stale, nullptr);
  std::fclose(stale);
  CheckpointDirectory saves(dir, /*keep=*/2);
  EXPECT_FALSE(saves.latest().has_value());
  EXPECT_EQ(dir_entries(dir), std::vector<std::string>{});  // the stale temporary file is gone
  TrainingState state{&layer, nullptr, nullptr, nullptr, {}};
  for (int64_t step : {5, 10, 15}) saves.save(step, state);
  EXPECT_EQ(dir_entries(dir), (std::vector<std::string>{"step-000000010.safetensors", "step-000000015.safetensors"}));
  EXPECT_EQ(fs::path(*saves.latest()).filename().string(), "step-000000015.safetensors");
}

TEST(TrainingCheckpoint, ErrorsNameTheFileAndTheMismatch) {
  const std::string dir = scratch("errors");
  nn::Linear layer(nn::LinearOptions(2, 3));
  AdamW opt(layer.parameters(), AdamWOptions());
  TrainingState state{&layer, &opt, nullptr, nullptr, {}};
  save_training_checkpoint(dir + "/good.safetensors", state);

  save_safetensors(dir + "/plain.safetensors", layer.state_dict());  // not a training checkpoint
  std::string msg = error_message_of([&] { load_training_checkpoint(dir + "/plain.safetensors", state); });
  EXPECT_NE(msg.find("plain.safetensors: not a usable training checkpoint: metadata 'format' is '(missing)'"),
            std::string::npos)
      << msg;

  nn::Linear wider(nn::LinearOptions(2, 4));
  AdamW wider_opt(wider.parameters(), AdamWOptions());
  TrainingState other{&wider, &wider_opt, nullptr, nullptr, {}};
  msg = error_message_of([&] { load_training_checkpoint(dir + "/good.safetensors", other); });
  EXPECT_NE(msg.find("good.safetensors: not a usable training checkpoint: load_state_dict: 'bias' has shape [3] in the "
                     "state but [4] in the module"),
            std::string::npos)
      << msg;

  SGD sgd(layer.parameters(), SGDOptions(0.1));
  TrainingState with_sgd{&layer, &sgd, nullptr, nullptr, {}};
  msg = error_message_of([&] { load_training_checkpoint(dir + "/good.safetensors", with_sgd); });
  EXPECT_NE(msg.find("SGD::load_state_dict: unexpected entry 'g0.p0.exp_avg'"), std::string::npos) << msg;
  msg = error_message_of([&] { opt.load_state_dict({}); });
  EXPECT_NE(msg.find("AdamW::load_state_dict: the state has no 'g0.p0.exp_avg'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mt
