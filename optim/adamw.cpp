#include "optim/adamw.h"

#include <map>
#include <set>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/view.h"
#include "optim/optim_kernels.h"

namespace mt {

namespace {
DType moment_dtype(const Tensor& p) { return p.dtype() == DType::f64 ? DType::f64 : DType::f32; }
}  // namespace

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW({ParamGroup{std::move(params), options.lr(), options.weight_decay()}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(std::move(groups)), options_(options) {
  MT_CHECK(options.beta1() >= 0 && options.beta1() < 1 && options.beta2() >= 0 && options.beta2() < 1,
           "AdamW: betas must be in [0, 1), got (", options.beta1(), ", ", options.beta2(), ")");
  MT_CHECK(options.eps() >= 0, "AdamW: eps must be >= 0, got ", options.eps());
  MT_CHECK_T(DTypeError, !options.autocast_copies() || is_half(*options.autocast_copies()),
             "AdamW: autocast_copies must be f16 or bf16 (an autocast region's dtype), got ",
             dtype_name(options.autocast_copies().value_or(DType::f32)));
  for (const ParamGroup& g : groups_) {
    std::vector<State> states;
    for (const Tensor& p : g.params) {
      MT_CHECK(p.is_contiguous(), "AdamW: parameters must be contiguous");
      const TensorOptions opts = TensorOptions().dtype(moment_dtype(p)).device(p.device());
      State s;
      s.exp_avg = zeros(p.shape(), opts);
      s.exp_avg_sq = zeros(p.shape(), opts);
      s.step = zeros({1}, TensorOptions().dtype(DType::i64).device(p.device()));
      if (options.master_weights() && is_half(p.dtype())) s.master = raw::to(p, DType::f32);
      states.push_back(std::move(s));
    }
    state_.push_back(std::move(states));
  }
}

void AdamW::step() { step_unless(Tensor()); }

std::map<std::string, Tensor> AdamW::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t i = 0; i < state_[g].size(); ++i) {
      const std::string prefix = "g" + std::to_string(g) + ".p" + std::to_string(i) + ".";
      const State& s = state_[g][i];
      out[prefix + "exp_avg"] = s.exp_avg;
      out[prefix + "exp_avg_sq"] = s.exp_avg_sq;
      out[prefix + "step"] = s.step;
      if (s.master.defined()) out[prefix + "master"] = s.master;
    }
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  detail::load_optimizer_state("AdamW", state_dict(), state);
}

void AdamW::step_unless(const Tensor& found_inf) {
  NoGradGuard no_grad;
  // Inside a capture, the copies are written only where it serves them: a CudaGraphStep that
  // has this optimizer prepare every replay (Note [Provided copies]).
  const bool prepared_capture = autocast::serves_in_capture(provider());
  std::set<int> uploaded;  // devices whose rates this step has written
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    optim_kernels::AdamWArgs args;
    args.lr = group.lr;
    args.beta1 = options_.beta1();
    args.beta2 = options_.beta2();
    args.eps = options_.eps();
    args.weight_decay = group.weight_decay;
    args.decoupled = options_.decoupled();
    std::map<int, std::vector<optim_kernels::AdamWTensors>> cuda_lists;  // device -> one fused update
    std::vector<std::pair<Tensor, State*>> copies;  // parameters with an autocast copy, handed over once written
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      const Tensor& p = group.params[pi];
      Tensor g = p.grad();
      if (!g.defined()) continue;
      MT_CHECK(g.shape() == p.shape() && g.device() == p.device(), "AdamW: gradient ", shape_str(g.shape()), " on ",
               g.device().str(), " does not match its parameter ", shape_str(p.shape()), " on ", p.device().str());
      g = raw::contiguous(g.dtype() == p.dtype() ? g : raw::to(g, p.dtype()));
      State& s = state_[gi][pi];
      const Tensor copy = autocast_copy_for(p, s, prepared_capture);
      const optim_kernels::AdamWTensors tensors{p, g, s.exp_avg, s.exp_avg_sq, s.step, s.master, copy};
      if (p.is_cuda()) {
        cuda_lists[p.device().index].push_back(tensors);
      } else {
        optim_kernels::advance_step_cpu(s.step, found_inf);
        optim_kernels::adamw_cpu(tensors, args, found_inf);
      }
      p.bump_version();
      if (copy.defined()) {
        // A graph that saved the old copy for its backward must not run on the new one: the
        // version moves (copy_ moves it itself).
        if (p.is_cuda()) {
          copy.bump_version();  // the kernel below writes it as it updates p
        } else {
          copy.copy_(p);
        }
        copies.emplace_back(p, &s);
      }
    }
    for (const auto& [device, list] : cuda_lists) {
      MT_CHECK_T(DeviceError, !found_inf.defined() || found_inf.device() == list.front().param.device(),
                 "AdamW: the found-inf flag is on ", found_inf.device().str(), " but parameters are on cuda:", device);
      const Tensor& rates = rates_on(device);
      if (!cuda::capturing() && uploaded.insert(device).second) upload_rates(rates);
      optim_kernels::AdamWArgs device_args = args;
      device_args.lr_on_device = static_cast<const double*>(rates.data_ptr()) + gi;
      optim_kernels::adamw_cuda(list, device_args, found_inf);
    }
    // Only now, with every update launched: a step that threw before its kernels must not leave
    // autocast a copy that was never written (a first step's copy is new memory).
    for (const auto& [p, s] : copies) provide_copy(p, *s);
  }
}

void AdamW::provide_copy(const Tensor& p, State& s) const {
  s.copy_version = p.version();
  s.copy_storage = p.storage();
  autocast::provide_copy(p, s.autocast_copy, provider());
}

const void* AdamW::provider() const { return static_cast<const Optimizer*>(this); }

bool AdamW::copy_fits(const Tensor& p, const State& s) {
  const Tensor& copy = s.autocast_copy;
  return copy.defined() && p.dtype() == DType::f32 && p.shape() == copy.shape() && p.device() == copy.device();
}

bool AdamW::copy_current(const Tensor& p, const State& s) {
  return p.version() == s.copy_version && s.copy_storage.lock() == p.storage();
}

Tensor AdamW::autocast_copy_for(const Tensor& p, State& s, bool prepared_capture) {
  const std::optional<DType>& dtype = options_.autocast_copies();
  if (!dtype || p.dtype() != DType::f32 || s.copies_off) return Tensor();
  // Note [Provided copies]: a capture writes the copies only where its replays are prepared,
  // and only into copies an eager step made (their memory must outlive the graph).
  if (cuda::capturing() && (!prepared_capture || !s.autocast_copy.defined())) {
    autocast::withdraw_copy(p, *dtype);
    // The replays rewrite p and no copy: a graph that reads the copy needs it cast again
    // before each of its replays. Replays that nobody prepares rewrite p whenever they run,
    // so that from now on no copy of p can be known to be current outside a replay either:
    // steps make none (the copy is kept only for graphs already captured to read).
    s.recast_before_replay = true;
    if (!prepared_capture) s.copies_off = true;
    return Tensor();
  }
  if (!s.autocast_copy.defined()) s.autocast_copy = empty(p.shape(), TensorOptions().dtype(*dtype).device(p.device()));
  return s.autocast_copy;
}

const Tensor& AdamW::rates_on(int device) {
  auto it = rates_on_device_.find(device);
  if (it == rates_on_device_.end()) {
    MT_CHECK(!cuda::capturing(), "AdamW: the first step on cuda:", device,
             " is inside a CUDA Graph capture; run one step eagerly first (its learning rates must be in device "
             "memory before the capture)");
    const auto groups = static_cast<int64_t>(groups_.size());
    // Filled by the caller, which uploads the rates of every step taken outside a capture.
    it =
        rates_on_device_.emplace(device, empty({groups}, TensorOptions().dtype(DType::f64).device(cuda_device(device))))
            .first;
  }
  return it->second;
}

void AdamW::upload_rates(const Tensor& rates) const {
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) rates.narrow(0, static_cast<int64_t>(g), 1).fill_(groups_[g].lr);
}

bool AdamW::prepare_replay() {
  for (const auto& [device, rates] : rates_on_device_) upload_rates(rates);
  // Note [Provided copies]. The replay reads the copies and rewrites them beside the
  // parameters. A copy is current while its parameter's version is the one it was written
  // at; a parameter written since (a load, an in-place edit), or one that the captured step
  // writes after its update (recast_before_replay), has its copy cast again here first. The
  // replay moves no version: moved here, and the copies provided anew, so that what autocast
  // serves and what saved tensors check describe the tensors as the replay leaves them; but
  // not the copies of parameters the step writes after the update (an eager step after the
  // replay casts those).
  NoGradGuard no_grad;
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t i = 0; i < state_[g].size(); ++i) {
      State& s = state_[g][i];
      const Tensor& p = groups_[g].params[i];
      if (!s.autocast_copy.defined()) continue;
      if (!copy_fits(p, s)) {  // Module::to() gave the parameter another dtype or device: no copy now
        autocast::withdraw_copy(p, s.autocast_copy.dtype());
        s.autocast_copy = Tensor();
        continue;
      }
      if (s.recast_before_replay || !copy_current(p, s)) s.autocast_copy.copy_(p);
      p.bump_version();
      s.autocast_copy.bump_version();
      if (s.recast_before_replay) {
        autocast::withdraw_copy(p, s.autocast_copy.dtype());
      } else {
        provide_copy(p, s);
      }
    }
  }
  return !rates_on_device_.empty();
}

void AdamW::after_capture() {
  // A parameter whose version moved after its copy was provided in the capture is written
  // by the captured step after its update: each replay leaves its copy behind. Once so, for
  // good: another graph of this optimizer may still be replayed.
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t i = 0; i < state_[g].size(); ++i) {
      State& s = state_[g][i];
      if (s.autocast_copy.defined() && !copy_current(groups_[g].params[i], s)) s.recast_before_replay = true;
    }
  }
}

int64_t AdamW::steps_taken() const {
  for (const auto& group : state_) {
    if (!group.empty()) return static_cast<int64_t>(group.front().step.item());
  }
  return 0;
}

}  // namespace mt
