// DistributedDataParallel under `mpirun -np 2` on the CPU (MPI), run by ctest:
//  1. after N steps every rank holds bit-identical parameters, equal within f32 rounding to a
//     single process trained on the concatenated batch (rank 0 trains that reference too);
//  2. no_sync() accumulation over two micro-batches equals one step on both;
//  3. a parameter without a gradient is reported by name on every rank;
//  4. a model that differs between ranks is refused at construction;
//  5. with --die-at-step K, rank 1 exits abruptly at step K (the kill test: the launcher must
//     end the job with an error, never hang);
//  7. step(optimizer), whose update of the early buckets overlaps the last bucket's all-reduce,
//     gives the parameters synchronize() + optimizer.step() gives, bit for bit (AdamW, several
//     buckets, and a parameter the optimizer holds outside the model, updated once per step);
//  6. with --hang-at-step K, rank 1 stops answering at step K without dying (the timeout test:
//     rank 0's collective must give up after MT_COLLECTIVE_TIMEOUT_S and end the job);
//  8. each bucket's all-reduce is a range named after the bucket (core/nvtx.h), in a host trace.
// --device cuda runs it all on each rank's GPU (local rank), through NCCL.
// Prints "ddp_mpi: PASS" on rank 0 and exits 0 when every check holds; runs as a world of one too.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/cuda_context.h"
#include "core/nvtx.h"

#include "distributed/ddp.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace {

using mt::Tensor;

class Mlp : public mt::nn::Module {
 public:
  explicit Mlp(bool with_unused = false, int64_t hidden = 16) {
    mt::Generator g(42);  // the same weights on every rank, so the broadcast is also checked below
    register_module("fc1", fc1, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(8, hidden), &g));
    register_module("fc2", fc2, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(hidden, 4), &g));
    if (with_unused) register_module("spare", spare, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(4, 4), &g));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(mt::relu(fc1->forward(x))); }
  std::shared_ptr<mt::nn::Linear> fc1, fc2, spare;
};

struct Batch {
  Tensor x, y;  // [16, 8], [16]
};

Batch global_batch(int step, const mt::Device& device) {
  mt::Generator g(1000 + static_cast<uint64_t>(step));
  const Tensor x = mt::randn({16, 8}, {}, &g);
  const Tensor y = mt::mul(mt::rand({16}, {}, &g), 3.999).to(mt::DType::i64);
  return {x.to(device), y.to(device)};
}

int failures = 0;
void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "ddp_mpi: rank %d: FAILED: %s\n", rank, what.c_str());
    ++failures;
  }
}

double max_relative_difference(mt::nn::Module& a, mt::nn::Module& b) {
  double worst = 0;
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i].second.to_vector<double>(), vb = pb[i].second.to_vector<double>();
    for (size_t j = 0; j < va.size(); ++j) worst = std::max(worst, std::abs(va[j] - vb[j]) / (std::abs(vb[j]) + 1e-3));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  int die_at_step = -1, hang_at_step = -1;
  std::string device_name = "cpu";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--die-at-step") == 0) die_at_step = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--hang-at-step") == 0) hang_at_step = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--device") == 0) device_name = argv[i + 1];
  }
  try {
    auto& group = mt::dist::ProcessGroup::init();
    const int rank = group.rank(), world = group.world_size();
    const int64_t shard = 16 / world;
    const mt::Device device = device_name == "cuda"
                                  ? mt::cuda_device(group.local_rank() % std::max(1, mt::cuda::device_count()))
                                  : mt::Device(device_name);
    if (device.is_cuda()) mt::cuda::set_current_device(device.index);

    // 1. DDP equals one process on the whole batch; ranks agree bit for bit.
    Mlp model, reference;
    model.to(device);
    reference.to(device);
    if (rank == 1) {  // a different start on rank 1: the broadcast must overwrite it
      mt::NoGradGuard no_grad;
      model.fc1->weight.fill_(0.5);
    }
    mt::dist::DistributedDataParallel ddp(model, group, mt::dist::DDPOptions().first_bucket_mb(0.0001));
    check(ddp.num_buckets() >= 2, "the 0.1 KiB first bucket should split the parameters", rank);
    mt::SGD opt(model.parameters(), mt::SGDOptions(0.1));
    mt::SGD ref_opt(reference.parameters(), mt::SGDOptions(0.1));
    for (int step = 0; step < 5; ++step) {
      if (step == die_at_step && rank == 1) {
        std::fprintf(stderr, "ddp_mpi: rank 1 exits abruptly at step %d (--die-at-step)\n", step);
        std::fflush(stderr);
        _exit(3);
      }
      if (step == hang_at_step && rank == 1) {
        std::fprintf(stderr, "ddp_mpi: rank 1 stops answering at step %d (--hang-at-step)\n", step);
        std::fflush(stderr);
        sleep(600);
      }
      const Batch b = global_batch(step, device);
      ddp.zero_grad();
      mt::cross_entropy(model.forward(b.x.narrow(0, rank * shard, shard)), b.y.narrow(0, rank * shard, shard))
          .backward();
      ddp.synchronize();
      opt.step();
      ref_opt.zero_grad();
      mt::cross_entropy(reference.forward(b.x), b.y).backward();
      ref_opt.step();
    }
    const double vs_reference = max_relative_difference(model, reference);
    check(vs_reference < 1e-5, "DDP vs one process on the whole batch: " + std::to_string(vs_reference), rank);
    // Bit-identical across ranks: rank 0's values broadcast and compared exactly.
    int differ = 0;
    for (const auto& [name, p] : model.named_parameters()) {
      const Tensor root = p.detach().clone();
      group.broadcast_(root, 0);
      differ += root.to_vector<float>() != p.to_vector<float>();
    }
    const Tensor differ_count = mt::from_vector({static_cast<double>(differ)}, {1}, mt::DType::f64);
    group.all_reduce_(differ_count, mt::dist::ReduceOp::sum);
    check(differ_count.item() == 0, "parameters differ between ranks", rank);

    // 2. no_sync: two micro-batches accumulated, then one synchronised backward.
    Mlp accumulated, single;
    accumulated.to(device);
    single.to(device);
    mt::dist::DistributedDataParallel ddp_acc(accumulated, group);
    mt::dist::DistributedDataParallel ddp_single(single, group);
    const Batch b = global_batch(99, device);
    const Tensor x = b.x.narrow(0, rank * shard, shard), y = b.y.narrow(0, rank * shard, shard);
    ddp_acc.zero_grad();
    {
      auto guard = ddp_acc.no_sync();
      mt::mul(mt::cross_entropy(accumulated.forward(x.narrow(0, 0, shard / 2)), y.narrow(0, 0, shard / 2)), 0.5)
          .backward();
      ddp_acc.synchronize();  // a no-op inside no_sync
    }
    mt::mul(
        mt::cross_entropy(accumulated.forward(x.narrow(0, shard / 2, shard / 2)), y.narrow(0, shard / 2, shard / 2)),
        0.5)
        .backward();
    ddp_acc.synchronize();
    ddp_single.zero_grad();
    mt::cross_entropy(single.forward(x), y).backward();
    ddp_single.synchronize();
    double worst = 0;
    for (size_t i = 0; i < accumulated.parameters().size(); ++i) {
      const auto a = accumulated.parameters()[i].grad().to_vector<double>();
      const auto s = single.parameters()[i].grad().to_vector<double>();
      for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::abs(a[j] - s[j]));
    }
    check(worst < 1e-6, "no_sync accumulation vs one step: " + std::to_string(worst), rank);

    // 3. Unused parameters are named, on every rank.
    Mlp with_spare(/*with_unused=*/true);
    with_spare.to(device);
    mt::dist::DistributedDataParallel ddp_spare(with_spare, group);
    ddp_spare.zero_grad();
    mt::cross_entropy(with_spare.forward(x), y).backward();
    std::string message;
    try {
      ddp_spare.synchronize();
    } catch (const mt::Error& e) {
      message = e.what();
    }
    check(message.find("got no gradient in this backward: spare.weight, spare.bias") != std::string::npos,
          "unused parameters not reported: '" + message + "'", rank);

    // 4. Different models are refused (rank 1 is wider).
    if (world > 1) {
      Mlp other(false, rank == 1 ? 17 : 16);
      other.to(device);
      message.clear();
      try {
        mt::dist::DistributedDataParallel refused(other, group);
      } catch (const mt::Error& e) {
        message = e.what();
      }
      if (rank == 1) {
        check(message.find("holds a different model than rank 0: rank 0 has 'fc1.weight:[16, 8]:f32:train', this "
                           "rank has 'fc1.weight:[17, 8]:f32:train'") != std::string::npos,
              "model mismatch not reported: '" + message + "'", rank);
      }
      if (rank == 0) {
        check(message.find("another rank holds a different model than rank 0") != std::string::npos,
              "rank 0 not told of the mismatch: '" + message + "'", rank);
      }
    }

    // 7. step(optimizer) against synchronize() + optimizer.step().
    Mlp two_phase, one_phase;
    two_phase.to(device);
    one_phase.to(device);
    const mt::dist::DDPOptions small_buckets = mt::dist::DDPOptions().first_bucket_mb(0.0001).bucket_cap_mb(0.0005);
    mt::dist::DistributedDataParallel ddp_two(two_phase, group, small_buckets),
        ddp_one(one_phase, group, small_buckets);
    check(ddp_two.num_buckets() >= 3, "the small buckets should split the parameters in three or more", rank);
    Tensor extra_two = mt::ones({3}, mt::TensorOptions().device(device)).requires_grad_();
    Tensor extra_one = mt::ones({3}, mt::TensorOptions().device(device)).requires_grad_();
    auto with_extra = [](mt::nn::Module& m, const Tensor& extra) {
      std::vector<Tensor> params = m.parameters();
      params.push_back(extra);
      return params;
    };
    const mt::AdamWOptions adamw = mt::AdamWOptions(1e-2).weight_decay(0.1);
    mt::AdamW opt_two(with_extra(two_phase, extra_two), adamw), opt_one(with_extra(one_phase, extra_one), adamw);
    for (int step = 0; step < 3; ++step) {
      const Batch sb = global_batch(200 + step, device);
      const Tensor sx = sb.x.narrow(0, rank * shard, shard), sy = sb.y.narrow(0, rank * shard, shard);
      ddp_two.zero_grad();  // the model's gradients; the extra parameter's is dropped by hand
      extra_two.set_grad(Tensor());
      mt::add(mt::cross_entropy(two_phase.forward(sx), sy), mt::sum(mt::mul(extra_two, extra_two))).backward();
      ddp_two.step(opt_two);
      ddp_one.zero_grad();
      extra_one.set_grad(Tensor());
      mt::add(mt::cross_entropy(one_phase.forward(sx), sy), mt::sum(mt::mul(extra_one, extra_one))).backward();
      ddp_one.synchronize();
      opt_one.step();
    }
    const double two_vs_one = max_relative_difference(two_phase, one_phase);
    check(two_vs_one == 0, "step(optimizer) vs synchronize() + step(): " + std::to_string(two_vs_one), rank);
    check(extra_two.to_vector<float>() == extra_one.to_vector<float>(),
          "a parameter outside the model is updated as one step() updates it", rank);

    // 8. The bucket ranges: one host trace per process ("%p": its id) around one more backward.
    const std::string trace = (std::filesystem::temp_directory_path() / "mt_ddp_mpi_trace_%p.json").string();
    mt::nvtx::start_trace(trace);
    ddp.zero_grad();
    mt::cross_entropy(model.forward(x), y).backward();
    ddp.synchronize();
    mt::nvtx::stop_trace();
    const std::string summary = mt::nvtx::trace_summary();
    for (size_t i = 0; i < ddp.num_buckets(); ++i) {
      check(summary.find("all-reduce bucket " + std::to_string(i + 1) + " (") != std::string::npos,
            "no range for bucket " + std::to_string(i + 1) + " in the trace:\n" + summary, rank);
    }
    std::filesystem::remove(
        (std::filesystem::temp_directory_path() / ("mt_ddp_mpi_trace_" + std::to_string(::getpid()) + ".json")));

    if (rank == 0) {
      std::printf("ddp_mpi: %s on %s, %zu buckets; DDP vs single process %.2e; no_sync vs one step %.2e; %s\n",
                  group.describe().c_str(), device.str().c_str(), ddp.num_buckets(), vs_reference, worst,
                  failures ? "FAIL" : "PASS");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_mpi: %s\n", e.what());
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
