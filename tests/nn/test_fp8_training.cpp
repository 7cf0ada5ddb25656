// Training under FP8 autocast (ops/fp8/fp8_autocast.h): a tiny GPT trains close to its bf16 run;
// with the guard off a model is today's bit for bit and its state_dict unchanged; the weights are
// cast once per optimizer step across micro-batches; LM heads stay in bf16; gradient checkpointing
// of whole blocks is refused; and a training checkpoint carries the FP8 states, so a resumed run
// repeats the uninterrupted one bit for bit. CUDA versions skip without a GPU.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "core/safetensors.h"
#include "ops/backends.h"
#include "ops/fp8/fp8_autocast.h"
#include "ops/nn/fp8_state_dict.h"
#include "ops/nn/gpt.h"
#include "ops/nn/llama.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/training_checkpoint.h"
#include "tests/nn/fp8_test_models.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

// A model and its optimizer.
struct Trainee {
  explicit Trainee(uint64_t seed, Device device = kCPU) {
    Generator gen(seed);
    model = std::make_shared<GPT>(fp8_gpt_config(), &gen);
    model->to(device);
    opt = std::make_unique<AdamW>(model->parameters(), AdamWOptions(3e-3).weight_decay(0.0));
  }
  std::shared_ptr<GPT> model;
  std::unique_ptr<AdamW> opt;
};

// The loss of one forward under bf16 autocast, inside an Fp8AutocastGuard when a recipe is given.
Tensor loss_of(const CausalLM& model, const TokenBatch& b, const std::optional<Fp8Recipe>& fp8) {
  const DeviceType type = b.x.device().type;
  AutocastGuard amp(type, DType::bf16);
  std::optional<Fp8AutocastGuard> guard;
  if (fp8) guard.emplace(type, *fp8);
  return model.loss(b.x, b.y);
}

// `steps` optimizer steps of `micro` micro-batches each; the losses as f64.
std::vector<double> train(Trainee& t, const TokenBatch& b, const std::optional<Fp8Recipe>& fp8, int steps,
                          int micro = 1) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    t.opt->zero_grad();
    for (int i = 0; i < micro; ++i) {
      const Tensor loss = loss_of(*t.model, b, fp8);
      loss.backward();
      losses.push_back(loss.item());
    }
    t.opt->step();
  }
  return losses;
}

std::vector<std::vector<float>> weights(const Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to(kCPU).to_vector<float>());
  return out;
}

// 30 steps each from the same weights: the FP8 runs' losses fall as the bf16 run's do, within 5%
// of it at every step and 2% over the last five (on the CPU the largest gap is 0.44%).
void expect_trains_close_to_bf16(Device device) {
  const TokenBatch b = make_batch(device);
  Trainee bf16(1, device);
  const std::vector<double> ref = train(bf16, b, std::nullopt, 30);
  for (const Fp8Recipe& recipe : {Fp8Recipe::delayed(), Fp8Recipe::current()}) {
    Trainee t(1, device);
    const std::vector<double> got = train(t, b, recipe, 30);
    const std::string what = recipe.str() + " on " + device.str();
    EXPECT_LT(got.back(), 0.5 * got.front()) << what;
    EXPECT_LT(mean_of_last(got, 5), mean_of_last(got, 10) + 1e-9) << what << ": still falling";
    const double gap = std::abs(mean_of_last(got, 5) - mean_of_last(ref, 5)) / mean_of_last(ref, 5);
    EXPECT_LT(gap, 0.02) << what << ": fp8 " << mean_of_last(got, 5) << " bf16 " << mean_of_last(ref, 5);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT(std::abs(got[i] - ref[i]), 0.05 * ref[i]) << what << " step " << i;
    }
    for (Linear* l : linears_of(*t.model)) EXPECT_NE(l->fp8_state, nullptr) << "every Linear ran in FP8";
  }
}

TEST(Fp8Training, TinyGptTrainsCloseToBf16) { expect_trains_close_to_bf16(kCPU); }

// Off, the model is today's: the same loss and gradients bit for bit, no FP8 state, the same
// state_dict; after an FP8 run the state_dict is still the same names.
TEST(Fp8Training, GuardOffIsTodaysModelBitForBit) {
  const TokenBatch b = make_batch(kCPU);
  Trainee t(2);
  const auto grads_with = [&](bool guard_off) {
    t.opt->zero_grad();
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    std::optional<Fp8AutocastGuard> off;
    if (guard_off) off.emplace(DeviceType::cpu, Fp8Recipe(), /*enabled=*/false);
    const Tensor loss = t.model->loss(b.x, b.y);
    loss.backward();
    std::vector<std::vector<float>> out = {loss.to_vector<float>()};
    for (const Tensor& p : t.model->parameters()) out.push_back(p.grad().to_vector<float>());
    return out;
  };
  EXPECT_EQ(grads_with(false), grads_with(true));
  for (Linear* l : linears_of(*t.model)) EXPECT_EQ(l->fp8_state, nullptr);
  EXPECT_TRUE(fp8_state_dict(*t.model).empty());
  std::vector<std::string> names;
  for (const auto& [name, tensor] : t.model->state_dict()) names.push_back(name);
  train(t, b, Fp8Recipe::delayed(), 1);
  std::vector<std::string> after;
  for (const auto& [name, tensor] : t.model->state_dict()) after.push_back(name);
  EXPECT_EQ(after, names);
  EXPECT_FALSE(fp8_state_dict(*t.model).empty());
}

// Note [FP8 weight cache]: every layer casts its weight once for the two micro-batches of a step,
// and again after the step.
TEST(Fp8Training, WeightsAreCastOncePerOptimizerStep) {
  const TokenBatch b = make_batch(kCPU);
  Trainee t(3);
  train(t, b, Fp8Recipe::delayed(), 1, /*micro=*/2);
  const std::vector<Linear*> layers = linears_of(*t.model);
  ASSERT_EQ(layers.size(), 8u);
  for (Linear* l : layers) EXPECT_EQ(l->fp8_state->weight_cache.casts, 1);
  train(t, b, Fp8Recipe::delayed(), 2, /*micro=*/2);
  for (Linear* l : layers) EXPECT_EQ(l->fp8_state->weight_cache.casts, 3);
}

TEST(Fp8Training, LlamasUntiedHeadStaysBf16) {
  LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 32;
  Generator gen(4);
  Llama model(c, &gen);
  ASSERT_NE(model.lm_head, nullptr);
  EXPECT_TRUE(model.lm_head->fp8_excluded);
  const TokenBatch b = make_batch(kCPU);
  loss_of(model, b, Fp8Recipe::current()).backward();
  EXPECT_EQ(model.lm_head->fp8_state, nullptr);
  EXPECT_NE(model.model->layers[0]->self_attn->q_proj->fp8_state, nullptr);
  EXPECT_NE(model.model->layers[0]->mlp->down_proj->fp8_state, nullptr);
}

TEST(Fp8Training, BlockCheckpointingIsRefusedAndSelectiveWorks) {
  const TokenBatch b = make_batch(kCPU);
  Trainee t(5);
  t.model->set_checkpointing(GPTCheckpointing::parse("blocks"));
  const std::string msg = error_message_of([&] { loss_of(*t.model, b, Fp8Recipe::delayed()); });
  EXPECT_NE(msg.find("gradient-checkpointed segment"), std::string::npos) << msg;
  t.model->set_checkpointing(GPTCheckpointing::parse("selective"));
  EXPECT_EQ(train(t, b, Fp8Recipe::delayed(), 1).size(), 1u);
}

// Train 3 steps, save a training checkpoint (model, optimizer, FP8 states), train 2 more; a fresh
// model restored from the file trains the same 2 steps bit for bit. Without the FP8 states (fresh
// ones, scale 1) the same weights and moments give other losses: the states are what it takes.
void expect_resume_bit_for_bit(Device device) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mt_fp8_resume_" + std::to_string(::getpid()) + "_" + device.str() + ".safetensors"))
                               .string();
  const TokenBatch b = make_batch(device);
  const Fp8Recipe recipe = Fp8Recipe::delayed(4);
  Trainee a(6, device);
  train(a, b, recipe, 3);
  save_training_checkpoint(path, TrainingState{a.model.get(), a.opt.get()});
  const std::vector<double> want = train(a, b, recipe, 2);

  Trainee resumed(7, device);
  TrainingState state{resumed.model.get(), resumed.opt.get()};
  load_training_checkpoint(path, state);
  EXPECT_EQ(train(resumed, b, recipe, 2), want);
  EXPECT_EQ(weights(*resumed.model), weights(*a.model));
  for (const auto& [key, t] : fp8_state_dict(*a.model)) {
    EXPECT_EQ(t.to(kCPU).to_vector<double>(), fp8_state_dict(*resumed.model).at(key).to(kCPU).to_vector<double>())
        << key;
  }

  Trainee fresh_states(8, device);
  TrainingState fresh{fresh_states.model.get(), fresh_states.opt.get()};
  load_training_checkpoint(path, fresh);
  load_fp8_state_dict(*fresh_states.model, {});
  EXPECT_NE(train(fresh_states, b, recipe, 2), want);

  const SafetensorsFile file = load_safetensors(path);
  EXPECT_EQ(file.tensors.count("fp8.transformer.h.0.attn.c_attn.recipe"), 1u);
  EXPECT_EQ(file.tensors.count("fp8.transformer.h.1.mlp.c_proj.grad_output.amax_history"), 1u);
  std::filesystem::remove(path);
}

TEST(Fp8Training, ResumeFromACheckpointRepeatsTheRunBitForBit) { expect_resume_bit_for_bit(kCPU); }

TEST(Fp8Training, CheckpointsOfRunsWithoutFp8HaveNoFp8Entries) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mt_fp8_none_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  Trainee t(9);
  train(t, make_batch(kCPU), std::nullopt, 1);
  save_training_checkpoint(path, TrainingState{t.model.get(), t.opt.get()});
  for (const auto& [name, tensor] : load_safetensors(path).tensors) EXPECT_NE(name.rfind("fp8.", 0), 0u) << name;
  std::filesystem::remove(path);
  const std::string msg = error_message_of([&] { load_fp8_state_dict(*t.model, {{"lm_head.recipe", zeros({4})}}); });
  EXPECT_NE(msg.find("unexpected key 'lm_head.recipe'"), std::string::npos) << msg;
}

TEST(Fp8TrainingCuda, TinyGptTrainsCloseToBf16) {
  MT_SKIP_WITHOUT_CUDA();
  expect_trains_close_to_bf16(cuda0());
}

TEST(Fp8TrainingCuda, ResumeFromACheckpointRepeatsTheRunBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  backends::set_deterministic_algorithms(true);  // cuDNN's attention backward, as resumes need
  expect_resume_bit_for_bit(cuda0());
  backends::set_deterministic_algorithms(false);
}

}  // namespace
}  // namespace mt::nn
