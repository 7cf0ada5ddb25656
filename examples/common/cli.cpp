#include "examples/common/cli.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "core/cuda_context.h"
#include "core/error.h"
#include "train/stop_signal.h"

#ifdef MT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace example {

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(out.data(), out.size(), fmt, again);
  va_end(again);
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

void setup(CLI::App& app, const std::string& program) {
  // Full buffering (the default when stdout is not a terminal) would hold the progress lines
  // back until exit, after an error already written to the unbuffered stderr.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  app.name(program);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given twice: the last
  app.failure_message([program](const CLI::App*, const CLI::Error& e) {
    return program + ": " + e.what() + "\nRun " + program + " --help for the options.\n";
  });
}

// ------------------------------------------------------------------ validators

namespace {

std::string shown(const std::string& input) { return input.empty() ? "''" : input; }

CLI::Validator number_check(bool allow_zero) {
  const char* what = allow_zero ? "a number >= 0" : "a positive number";
  return CLI::Validator(
      [allow_zero, what](std::string& input) {
        double value = 0;
        const bool number = CLI::detail::lexical_cast(input, value);
        if (number && (allow_zero ? value >= 0 : value > 0)) return std::string();
        return std::string("expected ") + what + ", got " + shown(input);
      },
      allow_zero ? "NONNEGATIVE" : "POSITIVE");
}

}  // namespace

CLI::Validator positive() { return number_check(/*allow_zero=*/false); }
CLI::Validator non_negative() { return number_check(/*allow_zero=*/true); }

CLI::Validator range(double low, double high) {
  const std::string bounds = format("%g to %g", low, high);
  return CLI::Validator(
      [low, high, bounds](std::string& input) {
        double value = 0;
        if (CLI::detail::lexical_cast(input, value) && value >= low && value <= high) return std::string();
        return "expected a number from " + bounds + ", got " + shown(input);
      },
      format("%g..%g", low, high));
}

CLI::Validator above_zero_up_to(double high) {
  const std::string bound = format("%g", high);
  return CLI::Validator(
      [high, bound](std::string& input) {
        double value = 0;
        if (CLI::detail::lexical_cast(input, value) && value > 0 && value <= high) return std::string();
        return "expected a number above 0, at most " + bound + ", got " + shown(input);
      },
      "(0.." + bound + "]");
}

CLI::Validator one_of(std::initializer_list<const char*> words) {
  const std::vector<std::string> accepted(words.begin(), words.end());
  std::string listed;
  for (size_t i = 0; i < accepted.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == accepted.size() ? " or " : ", ") + accepted[i];
  }
  std::string set;
  for (const std::string& word : accepted) set += (set.empty() ? "" : "|") + word;
  return CLI::Validator(
      [accepted, listed](std::string& input) {
        if (std::find(accepted.begin(), accepted.end(), input) != accepted.end()) return std::string();
        return "expected " + listed + ", got " + shown(input);
      },
      set);
}

CLI::Option* add_seed(CLI::App& app, uint64_t& seed, const std::string& what) {
  return app.add_option("--seed", seed, "seed for " + what)->capture_default_str();
}

// ------------------------------------------------------------------ device and precision

namespace {

CLI::Validator device_check() {
  return CLI::Validator(
      [](std::string& input) {
        if (input == "auto") return std::string();
        try {
          (void)mt::Device(input);
          return std::string();
        } catch (const mt::DeviceError&) {
          return "expected auto, cpu, cuda or cuda:N, got " + shown(input);
        }
      },
      "auto|cpu|cuda|cuda:N");
}

// Why no GPU can be used, in a few words: core's device_count() says only that there is none.
std::string no_gpu_reason() {
  if (!mt::cuda::built_with_cuda()) return "mixtrain was built without CUDA";
#ifdef MT_WITH_CUDA
  int driver = 0, runtime = 0, count = 0;
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t status = cudaGetDeviceCount(&count);
  cudaGetLastError();
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  if (driver == 0) return "driver not found";
  if (status == cudaErrorInsufficientDriver) {
    return "the driver supports CUDA " + version(driver) + ", older than the runtime's " + version(runtime);
  }
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) return "no GPU visible";
  if (status != cudaSuccess) return cudaGetErrorString(status);
#endif
  return "no GPU visible";
}

}  // namespace

mt::Device resolve_device(const std::string& device, const mt::dist::ProcessGroup* group) {
  const int count = mt::cuda::device_count();
  if (device == "auto" && count == 0) return mt::kCPU;
  mt::Device resolved = device == "auto" ? mt::Device("cuda") : mt::Device(device);
  if (resolved.is_cpu()) return resolved;
  MT_CHECK_T(mt::DeviceError, count > 0, "--device ", device, ": no usable CUDA device (", no_gpu_reason(), ")");
  MT_CHECK_T(mt::DeviceError, resolved.index < count, "--device ", device, ": no usable CUDA device (", count,
             count == 1 ? " GPU" : " GPUs", " visible: cuda:0",
             count == 1 ? "" : " to cuda:" + std::to_string(count - 1), ")");
  if (group != nullptr && (device == "auto" || device == "cuda")) {
    resolved = mt::Device(mt::DeviceType::cuda, group->local_rank() % count);  // one GPU a rank
  }
  mt::cuda::set_current_device(resolved.index);
  return resolved;
}

std::optional<mt::DType> resolve_amp(const std::string& amp, const mt::Device& device) {
  const std::string mode = amp == "auto" ? (device.is_cuda() ? "bf16" : "off") : amp;
  if (mode == "bf16") return mt::DType::bf16;
  if (mode == "fp16") return mt::DType::f16;
  return std::nullopt;
}

std::string Placement::describe() const {
  return device.str() + (amp ? std::string(", ") + mt::dtype_name(*amp) + " autocast" : std::string(", f32")) +
         (world_size() > 1 ? ", data parallel over " + std::to_string(world_size()) + " ranks" : std::string());
}

void PlacementFlags::add_to(CLI::App& app, AmpFlag amp_flag) {
  app.add_option("--device", device, "auto, cpu, cuda or cuda:N (auto: the GPU when there is one, else the CPU)")
      ->capture_default_str()
      ->check(device_check());
  if (amp_flag == AmpFlag::without) {
    amp = "off";
    return;
  }
  app.add_option("--amp", amp, "mixed precision: auto (bf16 on a GPU, off on the CPU), off, bf16 or fp16")
      ->capture_default_str()
      ->check(one_of({"auto", "off", "bf16", "fp16"}));
}

Placement PlacementFlags::resolve() const {
  Placement p;
  if (mt::dist::ProcessGroup::launched_by_mpi()) p.group = &mt::dist::ProcessGroup::init();
  p.device = resolve_device(device, p.group);
  p.amp = resolve_amp(amp, p.device);
  return p;
}

// ------------------------------------------------------------------ checkpoints and stopping

void CheckpointFlags::add_to(CLI::App& app) {
  app.add_option("--save-dir", save_dir,
                 "directory for training checkpoints (all a run needs to resume); SIGTERM, SIGINT or SIGUSR1 then "
                 "finish the step, write one and exit 0");
  app.add_option("--save-every", save_every, "steps between checkpoints (0: only after the last step and when stopped)")
      ->capture_default_str()
      ->check(non_negative());
  app.add_option("--keep", keep, "checkpoints kept in --save-dir")->capture_default_str()->check(positive());
  app.add_option("--stop-at", stop_at,
                 "stop after this step as SIGTERM would (checkpoint and exit 0), to run a job in slices (0: never)")
      ->capture_default_str()
      ->check(non_negative());
  app.add_flag("--resume", resume,
               "continue from the newest checkpoint in --save-dir (a fresh start if there is none)");
}

std::optional<mt::CheckpointDirectory> CheckpointFlags::open() const {
  MT_CHECK(!resume || !save_dir.empty(), "--resume needs --save-dir");
  MT_CHECK(stop_at == 0 || !save_dir.empty(), "--stop-at needs --save-dir");
  if (save_dir.empty()) return std::nullopt;
  std::optional<mt::CheckpointDirectory> directory(std::in_place, save_dir, keep);
  mt::train::install_stop_handlers();
  return directory;
}

std::string stop_reason(int64_t step, const CheckpointFlags& flags, mt::dist::ProcessGroup* group) {
  return mt::train::stop_reason(step, flags.stop_at, group);
}

void CheckpointFlags::apply_to(mt::train::TrainerOptions& options) const {
  options.save_dir = save_dir;
  options.save_every = save_every;
  options.keep = keep;
  options.stop_at = stop_at;
  options.resume = resume;
}

// ------------------------------------------------------------------ progress lines

std::string loss_scale_text(std::optional<double> scale) { return scale ? format("%g", *scale) : "off"; }

}  // namespace example
