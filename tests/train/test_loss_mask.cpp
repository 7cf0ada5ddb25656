// A fine-tuning token file's loss mask, end to end through TokenData and the GPT's loss: the
// prompt's positions carry no loss (the mean is over completion targets alone) and no gradient.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/data/token_file.h"
#include "core/random.h"
#include "ops/nn/gpt.h"
#include "ops/ops.h"
#include "train/data_source.h"

namespace mt::train {
namespace {

class LossMask : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("mt_loss_mask_" + std::to_string(::getpid()) + ".tok")).string();
    // Examples of 6 prompt tokens then 4 completion tokens, packed: mask 0 0 0 0 0 0 1 1 1 1 ...
    std::mt19937 rng(7);
    for (int i = 0; i < 200; ++i) {
      tokens_.push_back(rng() % kVocab);
      mask_.push_back(i % 10 >= 6 ? 1 : 0);
    }
    data::write_token_file(path_, tokens_, mask_, kVocab);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  static constexpr int64_t kVocab = 50;
  std::string path_;
  std::vector<uint32_t> tokens_;
  std::vector<uint8_t> mask_;
};

TEST_F(LossMask, PromptTargetsCarryNoLossAndNoGradient) {
  TokenData data(path_, data::BatcherOptions(4, 16).shuffle(false));
  const Batch batch = data.next();
  const auto targets = batch.targets.to_vector<int64_t>();
  // Window b starts at token 16b; the target of position t is token 16b + t + 1, masked by its mask byte.
  int64_t trained = 0;
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t t = 0; t < 16; ++t) {
      const size_t k = static_cast<size_t>(16 * b + t + 1);
      EXPECT_EQ(targets[16 * b + t], mask_[k] ? static_cast<int64_t>(tokens_[k]) : -100) << b << "," << t;
      trained += mask_[k];
    }
  }
  EXPECT_EQ(batch.count, trained);
  ASSERT_GT(trained, 0);
  ASSERT_LT(trained, 64);

  nn::GPTConfig config;
  config.vocab_size = kVocab;
  config.n_positions = 16;
  config.n_embd = 32;
  config.n_layer = 1;
  config.n_head = 2;
  Generator init(3);
  nn::GPT model(config, &init);
  const double loss = model.loss(batch.inputs, batch.targets).item();

  // The same mean by hand, over the trained targets alone.
  Tensor logits = model.forward(batch.inputs).detach().reshape({-1, kVocab});
  const auto log_probs = log_softmax(logits, -1).to_vector<double>();
  double sum = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] != -100) sum -= log_probs[i * kVocab + static_cast<size_t>(targets[i])];
  }
  EXPECT_NEAR(loss, sum / static_cast<double>(trained), 1e-5);

  // Every target counted would give another loss: the mask changed something.
  std::vector<double> unmasked;
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t t = 0; t < 16; ++t) unmasked.push_back(tokens_[static_cast<size_t>(16 * b + t + 1)]);
  }
  const Tensor all = from_vector(unmasked, batch.targets.shape(), TensorOptions().dtype(batch.targets.dtype()));
  EXPECT_GT(std::abs(model.loss(batch.inputs, all).item() - loss), 1e-3);

  // No gradient reaches the logits of a prompt position.
  logits.requires_grad_();
  cross_entropy(logits, batch.targets.reshape({-1})).backward();
  const auto grad = logits.grad().to_vector<double>();
  for (size_t i = 0; i < targets.size(); ++i) {
    double row = 0;
    for (int64_t v = 0; v < kVocab; ++v) row += std::abs(grad[i * kVocab + static_cast<size_t>(v)]);
    if (targets[i] == -100) {
      EXPECT_EQ(row, 0.0) << "position " << i;
    } else {
      EXPECT_GT(row, 0.0) << "position " << i;
    }
  }
}

}  // namespace
}  // namespace mt::train
