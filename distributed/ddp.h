// DistributedDataParallel: every rank holds the same model, computes gradients on its own
// shard of the batch, and the gradients are averaged over the ranks during backward.
//
//   auto& group = mt::dist::ProcessGroup::init();
//   mt::dist::DistributedDataParallel ddp(model, group);   // checks and broadcasts rank 0's weights
//   for (...) {
//     ddp.zero_grad();                  // instead of optimizer.zero_grad()
//     model.loss(x, y).backward();      // buckets are all-reduced as their gradients become ready
//     ddp.synchronize();                // waits for the last bucket; reports unused parameters
//     optimizer.step();
//   }
//
// Trainable parameters (frozen ones cost nothing) are packed, in reverse registration order
// (roughly the order backward produces their gradients), into buckets of one dtype and device:
// the first up to first_bucket_mb, the others up to bucket_cap_mb. Each parameter's grad is a
// view into its bucket, so all-reducing the bucket needs no copy. A post-accumulate hook marks a
// parameter ready; a bucket whose parameters are all ready is all-reduced (averaged), buckets
// strictly in index order so that every rank issues the same collectives in the same order. On
// CUDA the reduction runs on the communicator's own stream, ordered after the gradients by an
// event, while backward goes on computing the next buckets' gradients; only synchronize()
// makes the compute stream wait for the reductions (the host never waits).
// no_sync() lets gradients accumulate locally over micro-batches; the next synchronised
// backward reduces the sum. Each bucket's all-reduce is launched inside a range named
// "all-reduce bucket N (size)" (core/nvtx.h): on the host it spans the launch, and nsys shows the
// NCCL kernel it queued.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_context.h"
#include "distributed/process_group.h"
#include "ops/nn/module.h"
#include "optim/optimizer.h"

namespace mt::dist {

class DDPOptions {
 public:
  DDPOptions& bucket_cap_mb(double mb) {
    bucket_cap_mb_ = mb;
    return *this;
  }
  DDPOptions& first_bucket_mb(double mb) {
    first_bucket_mb_ = mb;
    return *this;
  }
  // Parameters that get no gradient in a step are all-reduced as zeros instead of raising an error.
  DDPOptions& find_unused_parameters(bool on) {
    find_unused_ = on;
    return *this;
  }
  double bucket_cap_mb() const { return bucket_cap_mb_; }
  double first_bucket_mb() const { return first_bucket_mb_; }
  bool find_unused_parameters() const { return find_unused_; }

 private:
  double bucket_cap_mb_ = 25.0;
  double first_bucket_mb_ = 1.0;
  bool find_unused_ = false;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, ProcessGroup& group, const DDPOptions& options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  void zero_grad();    // zeroes the buckets and points every grad at its slice
  void synchronize();  // after backward: every bucket reduced; throws naming unused parameters
  // synchronize(), then optimizer.step(), with the update of every bucket but the last
  // overlapped with the last bucket's all-reduce. The last bucket holds the first layers'
  // gradients (a GPT's tied embedding among them), final only when backward ends, so its
  // reduction cannot hide behind backward; the rest of the update hides it instead. The
  // optimizer is called twice, each time seeing only the gradients it may use (an optimizer
  // skips a parameter without one), so every parameter gets the update one step() would give:
  // true of an optimizer whose update of a parameter reads only its own gradient and state, as
  // SGD's and AdamW's do (their step counts are per parameter).
  // A step that needs every gradient at once (a GradScaler's unscale, gradient clipping) calls
  // synchronize() and its own step instead.
  void step(Optimizer& optimizer);

  // While alive, backward accumulates gradients locally (no communication).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp) { ddp_.no_sync_ = true; }
    ~NoSync() { ddp_.no_sync_ = false; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };
  NoSync no_sync() { return NoSync(*this); }

  size_t num_buckets() const { return buckets_.size(); }
  // Milliseconds the last synchronize() or step() left the compute stream waiting for
  // communication that backward (and, in step(), the update) did not hide (CUDA: device time between two events, read
  // with a host wait; CPU: the host's wait). 0 before the first synchronize or in a world of one.
  double last_exposed_comm_ms();
  // Parameter names of bucket i, in bucket order.
  std::vector<std::string> bucket_parameters(size_t i) const;

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket;
    int64_t offset;  // elements into the bucket
    bool ready = false;
  };
  struct Bucket {
    Tensor flat;  // [numel] in the parameters' dtype and device
    std::vector<size_t> params;
    size_t pending = 0;
    bool reduced = false;
    std::unique_ptr<Work> work;  // the reduction in flight, until synchronize()
    // Made once with the buckets, not per step: the range around its all-reduce (core/nvtx.h),
    // "all-reduce bucket 3 (24.00 MiB)", and the collective's name in errors and timeouts.
    std::string range_name;
    std::string what;
  };

  void check_and_broadcast(nn::Module& module);
  void build_buckets(const DDPOptions& options);
  Tensor slot(const Param& p) const;
  void on_ready(size_t index);
  void reduce_ready_buckets();
  // Before the waits: a parameter without a gradient is an error naming it, or (with
  // find_unused_parameters) a zero gradient whose bucket is reduced now.
  void settle_unused_parameters();
  // The compute stream (or the host, on the CPU) waits for the buckets in flight: all of them,
  // or those in [first, last); wait_for_reductions also times that wait into `timer`, for
  // last_exposed_comm_ms (synchronize and step only).
  void wait_for_works(size_t first = 0, size_t last = SIZE_MAX);
  struct WaitTimer {
    std::unique_ptr<cuda::Event> begin, end;
    double host_ms = 0;
    bool used = false;  // in the last synchronize or step
  };
  void wait_for_reductions(WaitTimer& timer, size_t first = 0, size_t last = SIZE_MAX);
  void reset_iteration();

  ProcessGroup& group_;
  DDPOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  bool no_sync_ = false;
  // Exposed communication of the last synchronize() or step(): events around the waits (CUDA)
  // or the host's wait in milliseconds (CPU); step() waits twice, once per timer.
  WaitTimer head_wait_, tail_wait_;
};

}  // namespace mt::dist
