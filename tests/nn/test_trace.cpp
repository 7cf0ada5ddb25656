// Tracing a model: ranges, host traces and the profiler's module scopes change no number a model
// computes, and a trace names every module by its path, each range inside the one around it.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/node.h"
#include "autograd/profiler.h"
#include "core/nvtx.h"
#include "ops/backends.h"
#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

std::string scratch_file(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "mt_trace_tests";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / name);
  return (dir / name).string();
}

Tensor token_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  return uniform({B, T}, 0, static_cast<double>(vocab), {}, &g).to(DType::i64);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor host = t.detach().to(kCPU).contiguous();
  std::vector<uint8_t> out(host.nbytes());
  std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

struct LossAndGrads {
  std::vector<uint8_t> loss;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> grads;
};

// One forward and backward from cleared gradients and a reseeded generator (dropout's masks).
LossAndGrads loss_and_grads(GPT& model, const Tensor& ids, const Tensor& targets) {
  for (const Tensor& p : model.parameters()) {
    Tensor handle = p;
    handle.set_grad(Tensor());
  }
  manual_seed(11);
  const Tensor loss = model.loss(ids, targets);
  loss.backward();
  LossAndGrads out{bytes_of(loss), {}};
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    if (p.grad().defined()) out.grads.emplace_back(name, bytes_of(p.grad()));
  }
  return out;
}

// Off, with NVTX ranges and a host trace, and under an OpProfiler: the same bits every time.
void expect_tracing_changes_nothing(Device device) {
  GPTConfig config = tiny_config();
  config.dropout = 0.1;
  Generator init(3);
  GPT model(config, &init);
  model.to(device);
  model.set_checkpointing(GPTCheckpointing::parse("blocks"));  // the recomputation too
  name_modules_for_tracing(model, "gpt");
  const Tensor ids = token_ids(2, 8, config.vocab_size, 5).to(device);
  const Tensor targets = token_ids(2, 8, config.vocab_size, 6).to(device);

  ASSERT_FALSE(nvtx::enabled());
  const LossAndGrads off = loss_and_grads(model, ids, targets);
  nvtx::start_trace(scratch_file("bits_" + device.str() + ".json"));
  const LossAndGrads traced = loss_and_grads(model, ids, targets);
  nvtx::stop_trace();
  LossAndGrads profiled;
  {
    OpProfiler profiler(device);
    profiled = loss_and_grads(model, ids, targets);
    profiler.step();
  }
  EXPECT_NE(nvtx::trace_summary().find("gpt.transformer.h.0.attn"), std::string::npos)
      << "the traced run had no module ranges:\n"
      << nvtx::trace_summary();
  EXPECT_EQ(traced.loss, off.loss);
  EXPECT_EQ(profiled.loss, off.loss);
  ASSERT_EQ(traced.grads.size(), off.grads.size());
  ASSERT_EQ(profiled.grads.size(), off.grads.size());
  for (size_t i = 0; i < off.grads.size(); ++i) {
    EXPECT_EQ(traced.grads[i].second, off.grads[i].second) << off.grads[i].first << " differs with ranges on";
    EXPECT_EQ(profiled.grads[i].second, off.grads[i].second) << off.grads[i].first << " differs under the profiler";
  }
}

TEST(Trace, RangesAndTheProfilerLeaveLossAndGradientsBitIdenticalOnCpu) { expect_tracing_changes_nothing(kCPU); }

TEST(Trace, RangesAndTheProfilerLeaveLossAndGradientsBitIdenticalOnCuda) {
  MT_SKIP_WITHOUT_CUDA();
  const backends::DeterministicGuard deterministic;  // cuDNN's attention backward adds with atomics otherwise
  expect_tracing_changes_nothing(Device("cuda:0"));
}

struct Event {
  std::string name;
  double ts, dur;
  int64_t tid;
  double end() const { return ts + dur; }
};

std::vector<Event> read_events(const std::string& path) {
  const nlohmann::json trace = nlohmann::json::parse(read_bytes(path));
  std::vector<Event> events;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") {
      events.push_back(Event{e.at("name").get<std::string>(), e.at("ts").get<double>(), e.at("dur").get<double>(),
                             e.at("tid").get<int64_t>()});
    }
  }
  return events;
}

bool inside(const Event& child, const Event& parent) {
  return child.tid == parent.tid && child.ts >= parent.ts && child.end() <= parent.end();
}

// Is `e` inside some event named `parent`?
bool inside_one(const Event& e, const std::vector<Event>& events, const std::string& parent) {
  for (const Event& p : events) {
    if (p.name == parent && &p != &e && inside(e, p)) return true;
  }
  return false;
}

TEST(Trace, ModulePathsNestInsideTheModelAndTheRecomputation) {
  GPTConfig config = tiny_config();
  config.n_layer = 3;
  GPT model(config);
  model.set_checkpointing(GPTCheckpointing::parse("blocks"));  // blocks 0 and 1 recomputed, 2 kept
  name_modules_for_tracing(model, "gpt");
  const Tensor ids = token_ids(2, 8, config.vocab_size, 1), targets = token_ids(2, 8, config.vocab_size, 2);
  const std::string path = scratch_file("modules.json");
  nvtx::start_trace(path);
  model.loss(ids, targets).backward();
  nvtx::stop_trace();

  const std::vector<Event> events = read_events(path);
  auto count = [&](const std::string& name) {
    int64_t n = 0;
    for (const Event& e : events) n += e.name == name;
    return n;
  };
  // Forward: gpt > gpt.transformer > gpt.transformer.h.i > attn > c_attn, once per block.
  EXPECT_EQ(count("gpt"), 1);
  EXPECT_EQ(count("gpt.transformer"), 1);
  EXPECT_EQ(count("checkpoint recompute"), 2);
  for (int block = 0; block < 3; ++block) {
    const std::string h = "gpt.transformer.h." + std::to_string(block);
    EXPECT_EQ(count(h), 1) << h;
    // A recomputed block runs its submodules again in backward, inside the recomputation.
    const int64_t runs = block < 2 ? 2 : 1;
    for (const std::string& sub : {".ln_1", ".attn", ".attn.c_attn", ".attn.c_proj", ".ln_2", ".mlp"}) {
      EXPECT_EQ(count(h + sub), runs) << h + sub;
    }
  }
  EXPECT_EQ(count("gpt.transformer.wte"), 1);
  EXPECT_EQ(count("gpt.transformer.ln_f"), 1);
  for (const Event& e : events) {
    const bool recomputed = inside_one(e, events, "checkpoint recompute");
    if (e.name.rfind("gpt.transformer.h.", 0) == 0 && e.name.find(".attn.") != std::string::npos) {
      const std::string attn = e.name.substr(0, e.name.rfind('.'));
      EXPECT_TRUE(inside_one(e, events, attn)) << e.name << " outside " << attn;
    }
    if (e.name.rfind("gpt.transformer.h.", 0) == 0 && !recomputed) {
      const std::string block = e.name.substr(0, e.name.find('.', std::string("gpt.transformer.h.").size()));
      if (e.name != block) EXPECT_TRUE(inside_one(e, events, block)) << e.name << " outside " << block;
      EXPECT_TRUE(inside_one(e, events, "gpt.transformer")) << e.name;
      EXPECT_TRUE(inside_one(e, events, "gpt")) << e.name;
    }
    if (e.name == "gpt.transformer") EXPECT_TRUE(inside_one(e, events, "gpt"));
    if (e.name == "checkpoint recompute") EXPECT_FALSE(inside_one(e, events, "gpt")) << "backward runs after forward";
  }
  // Every pair of ranges on a thread is disjoint or nested: each child within its parent.
  for (const Event& a : events) {
    for (const Event& b : events) {
      if (&a == &b || a.tid != b.tid) continue;
      const bool disjoint = a.end() <= b.ts || b.end() <= a.ts;
      EXPECT_TRUE(disjoint || inside(a, b) || inside(b, a)) << a.name << " and " << b.name << " overlap";
    }
  }
  const std::string summary = nvtx::trace_summary();
  EXPECT_NE(summary.find("gpt.transformer.h.2.mlp"), std::string::npos) << summary;
}

// A module that reports the profiler's innermost module scope during its forward.
class Probe : public Module {
 public:
  const std::string* forward() const {
    const auto scope = trace_scope();
    return OpProfiler::current_module();
  }
};

TEST(Trace, ModulesAreNamedByPathOrByTypeAndScopesOpenOnlyWhenWanted) {
  Linear lone(LinearOptions(2, 3));
  EXPECT_EQ(lone.trace_name(), "Linear");
  GPT model(tiny_config());
  EXPECT_EQ(model.trace_name(), "GPT");
  EXPECT_EQ(model.transformer->blocks[0]->attn->trace_name(), "CausalSelfAttention");
  LoRAOptions lora;
  lora.r = 2;
  lora.target_modules = {"c_attn"};
  apply_lora(model, lora);
  name_modules_for_tracing(model, "gpt");
  EXPECT_EQ(model.trace_name(), "gpt");
  EXPECT_EQ(model.transformer->blocks[1]->attn->c_attn->trace_name(), "gpt.transformer.h.1.attn.c_attn");
  EXPECT_EQ(model.transformer->h->trace_name(), "gpt.transformer.h");
  EXPECT_NE(error_message_of([&] { lone.set_trace_name(""); }).find("empty"), std::string::npos);

  // The LoRA layer opens its scope too.
  const std::string path = scratch_file("lora.json");
  nvtx::start_trace(path);
  model.forward(token_ids(1, 4, tiny_config().vocab_size, 3));
  nvtx::stop_trace();
  EXPECT_NE(nvtx::trace_summary().find("gpt.transformer.h.1.attn.c_attn "), std::string::npos) << nvtx::trace_summary();

  Probe probe;
  probe.set_trace_name("probe");
  EXPECT_EQ(probe.forward(), nullptr) << "no profiler: no module scope is kept";
  {
    OpProfiler profiler(kCPU);
    const std::string* scope = probe.forward();
    ASSERT_NE(scope, nullptr);
    EXPECT_EQ(*scope, "probe");
  }
  EXPECT_EQ(OpProfiler::current_module(), nullptr) << "the scope closed with the forward";
}

}  // namespace
}  // namespace mt::nn
