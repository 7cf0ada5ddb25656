#include "autograd/checkpoint.h"

#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/profiler.h"
#include "core/cuda_context.h"
#include "core/nvtx.h"
#include "core/random.h"

namespace mt {

namespace {

// The passes of the segments this thread is running, innermost last: true for a recomputation.
thread_local std::vector<bool> t_segment_passes;

// Records a segment's pass for in_checkpointed_segment() and in_recomputation() while it lives.
class SegmentPass {
 public:
  explicit SegmentPass(bool recomputation) { t_segment_passes.push_back(recomputation); }
  ~SegmentPass() { t_segment_passes.pop_back(); }
  SegmentPass(const SegmentPass&) = delete;
  SegmentPass& operator=(const SegmentPass&) = delete;
};

// Where every default generator stands: restoring it replays the same random draws.
class RngState {
 public:
  static RngState capture() {
    RngState s;
    s.offsets_.emplace_back(kCPU, default_generator(kCPU).offset());
    for (int d = 0; d < cuda::device_count(); ++d) {
      const Device device(DeviceType::cuda, d);
      s.offsets_.emplace_back(device, default_generator(device).offset());
    }
    return s;
  }
  void restore() const {
    for (const auto& [device, offset] : offsets_) default_generator(device).set_offset(offset);
  }

 private:
  std::vector<std::pair<Device, uint64_t>> offsets_;
};

struct AutocastState {
  bool cpu_enabled, cuda_enabled;
  DType cpu_dtype, cuda_dtype;
  static AutocastState capture() {
    return {autocast::is_enabled(DeviceType::cpu), autocast::is_enabled(DeviceType::cuda),
            autocast::dtype(DeviceType::cpu), autocast::dtype(DeviceType::cuda)};
  }
};

// The module scope the segment was recorded in, open again while it is recomputed (when a
// profiler is active), so that OpProfiler::module_rows() charges the recomputed ops outside the
// segment's submodules (a block's residual adds, an attention core) to the module whose forward
// ran them, as in the forward.
class ModuleScopeAgain {
 public:
  explicit ModuleScopeAgain(const std::string* module) : open_(module != nullptr && OpProfiler::active()) {
    if (open_) OpProfiler::push_module(*module);
  }
  ~ModuleScopeAgain() {
    if (open_) OpProfiler::pop_module();
  }
  ModuleScopeAgain(const ModuleScopeAgain&) = delete;
  ModuleScopeAgain& operator=(const ModuleScopeAgain&) = delete;

 private:
  bool open_;
};

class CheckpointBackward : public autograd::Node {
 public:
  CheckpointBackward(CheckpointFn fn, const std::vector<Tensor>& inputs, RngState rng, AutocastState autocast)
      : fn_(std::move(fn)), rng_(std::move(rng)), autocast_(autocast), rebuild_saved_(is_rebuild_saved_enabled()) {
    for (const Tensor& t : inputs) {
      saved_.emplace_back(t);
      input_requires_grad_.push_back(autograd::requires_grad(t));
    }
  }
  std::string name() const override { return "CheckpointBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    std::vector<Tensor> inputs;  // fresh leaves: the inner backward leaves their gradients in grad()
    for (size_t i = 0; i < saved_.size(); ++i) {
      Tensor t = saved_[i].unpack(*this).detach();
      if (input_requires_grad_[i]) {
        t.requires_grad_(true);
        autograd::meta(t).keep_incoming_grad = true;  // no copy: the gradient is passed straight on
      }
      inputs.push_back(t);
    }
    const std::vector<Tensor> outputs = recompute(inputs);

    std::vector<Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (autograd::requires_grad(outputs[i])) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) autograd::run_backward(roots, grads, /*retain_graph=*/false);

    std::vector<Tensor> grad_inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor g = input_requires_grad_[i] ? inputs[i].grad() : Tensor();
      // An input the segment did not use (or used without a path to the outputs) gets zeros.
      if (input_requires_grad_[i] && !g.defined()) g = zeros_like(inputs[i]);
      grad_inputs.push_back(g);
    }
    return grad_inputs;
  }

  void release_saved() override {
    for (auto& s : saved_) s.reset();
    fn_ = nullptr;
  }

 private:
  // Re-runs the segment with recording under the forward's random and autocast states.
  std::vector<Tensor> recompute(const std::vector<Tensor>& inputs) {
    MT_CHECK(fn_ != nullptr, "checkpoint: backward through a segment whose graph was already freed; pass ",
             "retain_graph=true to the first backward to go through it twice");
    const RngState now = RngState::capture();
    rng_.restore();
    std::vector<Tensor> outputs;
    try {
      const nvtx::Range range("checkpoint recompute");
      const ModuleScopeAgain scope(profiler_module);
      GradModeGuard grad_on(true);
      AutocastGuard cpu(DeviceType::cpu, autocast_.cpu_dtype, autocast_.cpu_enabled);
      AutocastGuard cuda(DeviceType::cuda, autocast_.cuda_dtype, autocast_.cuda_enabled);
      const RebuildSavedGuard rebuild(rebuild_saved_);
      const SegmentPass pass(/*recomputation=*/true);
      outputs = fn_(inputs);
    } catch (...) {
      now.restore();
      throw;
    }
    now.restore();
    check_same_outputs(outputs);
    return outputs;
  }

  void check_same_outputs(const std::vector<Tensor>& outputs) const {
    MT_CHECK(outputs.size() == output_meta.size(), "checkpoint: the recomputation returned ", outputs.size(),
             " outputs but the forward returned ", output_meta.size(), "; the segment must be deterministic");
    for (size_t i = 0; i < outputs.size(); ++i) {
      const autograd::TensorMeta& want = output_meta[i];
      MT_CHECK(outputs[i].shape() == want.shape && outputs[i].dtype() == want.dtype,
               "checkpoint: the recomputation gave output ", i, " of shape ", shape_str(outputs[i].shape()), " ",
               dtype_name(outputs[i].dtype()), " but the forward gave ", shape_str(want.shape), " ",
               dtype_name(want.dtype), "; the segment must compute the same shapes and dtypes when re-run");
    }
  }

  CheckpointFn fn_;
  std::vector<autograd::SavedTensor> saved_;
  std::vector<bool> input_requires_grad_;
  RngState rng_;
  AutocastState autocast_;
  bool rebuild_saved_;  // RebuildSavedGuard's state in the forward
};

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  MT_CHECK(fn != nullptr, "checkpoint: the segment function is empty");
  for (size_t i = 0; i < inputs.size(); ++i) MT_CHECK(inputs[i].defined(), "checkpoint: input ", i, " is undefined");
  if (!is_grad_enabled()) return fn(inputs);

  RngState rng = RngState::capture();
  const AutocastState autocast = AutocastState::capture();
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    const SegmentPass pass(/*recomputation=*/false);
    outputs = fn(inputs);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    MT_CHECK(outputs[i].defined(), "checkpoint: the segment returned an undefined output ", i);
    MT_CHECK_T(DTypeError, is_floating(outputs[i].dtype()), "checkpoint: output ", i, " is ",
               dtype_name(outputs[i].dtype()), "; a segment's outputs must be floating, for gradients to flow");
    outputs[i] = outputs[i].detach();  // a fresh handle: an output may be an input or a view of one
  }
  auto node = std::make_shared<CheckpointBackward>(fn, inputs, std::move(rng), autocast);
  autograd::record(node, inputs, outputs);
  return outputs;
}

bool in_checkpointed_segment() { return !t_segment_passes.empty(); }

// Under NoGradGuard a segment is just called and pushes no pass: what runs then is not the
// recomputation, whose outputs nobody reads, even inside one.
bool in_recomputation() { return !t_segment_passes.empty() && t_segment_passes.back() && is_grad_enabled(); }

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  MT_CHECK(fn != nullptr, "checkpoint: the segment function is empty");
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{input})[0];
}

}  // namespace mt
