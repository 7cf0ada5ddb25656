#include "distributed/ddp.h"

#include <algorithm>
#include <chrono>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/nvtx.h"

namespace mt::dist {

namespace {

// "name:[shape]:dtype;" for every parameter and buffer: equal on every rank or the ranks train different models.
std::string model_signature(nn::Module& module) {
  std::string s;
  auto add = [&](const std::string& name, const Tensor& t) {
    s += name + ":" + shape_str(t.shape()) + ":" + dtype_name(t.dtype()) + (t.requires_grad() ? ":train" : "") + ";";
  };
  for (const auto& [name, t] : module.named_parameters()) add(name, t);
  for (const auto& [name, t] : module.named_buffers()) add(name, t);
  return s;
}

// The first entry where two signatures differ, for the error message.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t start = 0;
  while (true) {
    const size_t ea = a.find(';', start), eb = b.find(';', start);
    const std::string ia = a.substr(start, ea == std::string::npos ? std::string::npos : ea - start);
    const std::string ib = b.substr(start, eb == std::string::npos ? std::string::npos : eb - start);
    if (ia != ib || ea == std::string::npos || eb == std::string::npos) {
      return "rank 0 has '" + (ia.empty() ? std::string("(nothing)") : ia) + "', this rank has '" +
             (ib.empty() ? std::string("(nothing)") : ib) + "'";
    }
    start = ea + 1;
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, const DDPOptions& options)
    : group_(group), options_(options) {
  MT_CHECK(options.bucket_cap_mb() > 0 && options.first_bucket_mb() > 0,
           "DistributedDataParallel: bucket sizes must be positive, got bucket_cap_mb ", options.bucket_cap_mb(),
           " and first_bucket_mb ", options.first_bucket_mb());
  check_and_broadcast(module);
  for (const auto& [name, t] : module.named_parameters()) {
    if (t.requires_grad()) params_.push_back(Param{name, t, 0, 0});
  }
  build_buckets(options);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].tensor.register_post_accumulate_grad_hook([this, i](const Tensor&) { on_ready(i); });
  }
  zero_grad();
}

DistributedDataParallel::~DistributedDataParallel() {
  // Reductions still in flight write into the buckets: the compute stream (which frees them)
  // must wait for them first.
  wait_for_works();
}

// Every rank must hold the same model: names, shapes and dtypes are compared with rank 0's,
// then rank 0's values are copied everywhere.
void DistributedDataParallel::check_and_broadcast(nn::Module& module) {
  const std::string mine = model_signature(module);
  Tensor length = from_vector({static_cast<double>(mine.size())}, {1}, DType::i64);
  group_.broadcast_(length, 0);
  Tensor theirs = zeros({static_cast<int64_t>(length.item())}, DType::u8);
  if (group_.rank() == 0) std::copy(mine.begin(), mine.end(), static_cast<char*>(theirs.data_ptr()));
  if (theirs.numel() > 0) group_.broadcast_(theirs, 0);
  const std::string root(static_cast<const char*>(theirs.data_ptr()), static_cast<size_t>(theirs.numel()));
  // Every rank learns whether any rank differs, so all of them stop together instead of some
  // waiting forever in the broadcast below.
  const Tensor differs = from_vector({root == mine ? 0.0 : 1.0}, {1}, DType::i64);
  group_.all_reduce_(differs, ReduceOp::max);
  MT_CHECK(root == mine, "DistributedDataParallel: ", group_.describe(),
           " holds a different model than rank 0: ", first_difference(root, mine));
  MT_CHECK(differs.item() == 0, "DistributedDataParallel: ", group_.describe(),
           ": another rank holds a different model than rank 0 (its error names the difference)");
  NoGradGuard no_grad;
  auto broadcast = [&](const Tensor& t) {
    if (t.is_contiguous()) {
      group_.broadcast_(t, 0);
      t.bump_version();  // written in place by the collective: autocast's copies of t are stale
    } else {
      const Tensor copy = t.contiguous();
      group_.broadcast_(copy, 0);
      t.copy_(copy);
    }
  };
  for (const auto& [name, t] : module.named_parameters()) broadcast(t);
  for (const auto& [name, t] : module.named_buffers()) broadcast(t);
}

void DistributedDataParallel::build_buckets(const DDPOptions& options) {
  double cap = options.first_bucket_mb() * 1024 * 1024;
  double filled = 0;                           // bytes in the last bucket
  for (size_t n = params_.size(); n-- > 0;) {  // reverse registration order
    const Tensor& t = params_[n].tensor;
    const double bytes = static_cast<double>(t.nbytes());
    bool fresh = buckets_.empty();
    if (!fresh) {
      const Tensor& first = params_[buckets_.back().params.front()].tensor;
      fresh = first.dtype() != t.dtype() || first.device() != t.device() || (filled > 0 && filled + bytes > cap);
      if (fresh) cap = options.bucket_cap_mb() * 1024 * 1024;
    }
    if (fresh) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().params.push_back(n);
    filled += bytes;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t numel = 0;
    for (size_t i : buckets_[b].params) {
      params_[i].bucket = b;
      params_[i].offset = numel;
      numel += params_[i].tensor.numel();
    }
    const Tensor& like = params_[buckets_[b].params.front()].tensor;
    buckets_[b].flat = zeros({numel}, TensorOptions().dtype(like.dtype()).device(like.device()));
    const std::string size = cuda::format_bytes(buckets_[b].flat.nbytes());
    buckets_[b].range_name = detail::str_cat("all-reduce bucket ", b + 1, " (", size, ")");
    buckets_[b].what = detail::str_cat("all_reduce of DDP bucket ", b + 1, " of ", buckets_.size(), " (", size, ")");
  }
}

std::vector<std::string> DistributedDataParallel::bucket_parameters(size_t i) const {
  MT_CHECK(i < buckets_.size(), "DistributedDataParallel: bucket ", i, " of ", buckets_.size());
  std::vector<std::string> names;
  for (size_t p : buckets_[i].params) names.push_back(params_[p].name);
  return names;
}

Tensor DistributedDataParallel::slot(const Param& p) const {
  return buckets_[p.bucket].flat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.shape());
}

void DistributedDataParallel::zero_grad() {
  wait_for_works();  // a backward that threw may have left reductions writing into the buckets
  NoGradGuard no_grad;
  for (Bucket& b : buckets_) b.flat.zero_();
  for (Param& p : params_) {
    Tensor handle = p.tensor;
    handle.set_grad(slot(p));
  }
  reset_iteration();
}

void DistributedDataParallel::reset_iteration() {
  for (Param& p : params_) p.ready = false;
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.reduced = false;
  }
  next_bucket_ = 0;
}

void DistributedDataParallel::on_ready(size_t index) {
  Param& p = params_[index];
  const Tensor grad = p.tensor.grad();
  // A gradient made outside the bucket (the optimizer's zero_grad set it to none): move it in.
  if (!grad.shares_storage_with(buckets_[p.bucket].flat)) {
    NoGradGuard no_grad;
    const Tensor s = slot(p);
    s.copy_(grad);
    Tensor handle = p.tensor;
    handle.set_grad(s);
  }
  if (no_sync_) return;
  MT_CHECK(!p.ready, "DistributedDataParallel: the gradient of '", p.name,
           "' was marked ready twice in one backward; call synchronize() after each backward");
  p.ready = true;
  if (--buckets_[p.bucket].pending == 0) reduce_ready_buckets();
}

void DistributedDataParallel::reduce_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    const size_t index = next_bucket_++;
    Bucket& b = buckets_[index];
    const nvtx::Range range(b.range_name);
    b.work = group_.all_reduce_async_(b.flat, ReduceOp::average, b.what);
    b.reduced = true;
  }
}

void DistributedDataParallel::synchronize() {
  if (no_sync_) return;
  settle_unused_parameters();
  tail_wait_.used = false;
  wait_for_reductions(head_wait_);
  reset_iteration();
}

void DistributedDataParallel::step(Optimizer& optimizer) {
  MT_CHECK(!no_sync_,
           "DistributedDataParallel::step: called inside no_sync(), where gradients are not reduced; "
           "step after the synchronised backward");
  if (buckets_.size() < 2) {
    synchronize();
    optimizer.step();
    return;
  }
  settle_unused_parameters();
  const size_t last = buckets_.size() - 1;
  std::vector<const TensorImpl*> in_last_bucket;
  for (size_t index : buckets_[last].params) in_last_bucket.push_back(params_[index].tensor.impl());
  // Every parameter the optimizer holds, with its gradient, handed out per phase and restored.
  struct Held {
    Tensor param, grad;
    bool in_last_bucket;
  };
  std::vector<Held> held;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      const bool last_one = std::find(in_last_bucket.begin(), in_last_bucket.end(), p.impl()) != in_last_bucket.end();
      held.push_back({p, p.grad(), last_one});
    }
  }
  auto hand_out = [&](bool last_bucket_phase) {
    for (Held& h : held) h.param.set_grad(h.in_last_bucket == last_bucket_phase ? h.grad : Tensor());
  };
  try {
    wait_for_reductions(head_wait_, 0, last);
    hand_out(false);
    optimizer.step();  // while the last bucket is still being reduced
    wait_for_reductions(tail_wait_, last, buckets_.size());
    hand_out(true);
    optimizer.step();
  } catch (...) {
    for (Held& h : held) h.param.set_grad(h.grad);
    wait_for_works();
    reset_iteration();
    throw;
  }
  for (Held& h : held) h.param.set_grad(h.grad);
  reset_iteration();
}

void DistributedDataParallel::settle_unused_parameters() {
  std::vector<std::string> unused;
  for (const Param& p : params_) {
    if (!p.ready) unused.push_back(p.name);
  }
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 10; ++i) names += (i ? ", " : "") + unused[i];
    if (unused.size() > 10) names += ", ... (" + std::to_string(unused.size()) + " in all)";
    if (!options_.find_unused_parameters()) {
      wait_for_works();  // the buckets already launched must land before anything reuses them
      reset_iteration();
      throw Error(detail::str_cat("DistributedDataParallel: ", group_.describe(), ": these parameters got no ",
                                  "gradient in this backward: ", names,
                                  "; freeze them, or construct with DDPOptions().find_unused_parameters(true)"));
    }
    // Unused this step: their slots count as zero gradients.
    NoGradGuard no_grad;
    for (Param& p : params_) {
      if (p.ready) continue;
      // A gradient accumulated under no_sync is in the slot already: keep it. Only a slot the
      // gradient no longer points at (the optimizer set it to none) holds stale values.
      const Tensor grad = p.tensor.grad();
      if (!grad.defined() || !grad.shares_storage_with(buckets_[p.bucket].flat)) slot(p).zero_();
      Tensor handle = p.tensor;
      handle.set_grad(slot(p));
      p.ready = true;
      --buckets_[p.bucket].pending;
    }
    reduce_ready_buckets();
  }
  MT_INTERNAL_ASSERT(next_bucket_ == buckets_.size(), "DDP: ", next_bucket_, " of ", buckets_.size(),
                     " buckets reduced");
}

void DistributedDataParallel::wait_for_works(size_t first, size_t last) {
  for (size_t i = first; i < std::min(last, buckets_.size()); ++i) {
    Bucket& b = buckets_[i];
    if (b.work) b.work->wait();
    b.work.reset();
  }
}

void DistributedDataParallel::wait_for_reductions(WaitTimer& timer, size_t first, size_t last) {
  const bool on_cuda = !buckets_.empty() && buckets_.front().flat.is_cuda();
  const auto host_start = std::chrono::steady_clock::now();
  timer.used = true;
  if (on_cuda) {
    const int device = buckets_.front().flat.device().index;
    if (!timer.begin) {
      timer.begin = std::make_unique<cuda::Event>(device, cuda::Event::Timing::enabled);
      timer.end = std::make_unique<cuda::Event>(device, cuda::Event::Timing::enabled);
    }
    timer.begin->record(cuda::current_stream(device));
  }
  wait_for_works(first, last);
  if (on_cuda) timer.end->record(cuda::current_stream(buckets_.front().flat.device().index));
  timer.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start).count();
}

double DistributedDataParallel::last_exposed_comm_ms() {
  double total = 0;
  for (WaitTimer* timer : {&head_wait_, &tail_wait_}) {
    if (!timer->used) continue;
    if (!timer->end) {
      total += timer->host_ms;
      continue;
    }
    timer->end->synchronize();
    total += static_cast<double>(timer->begin->elapsed_ms(*timer->end));
  }
  return total;
}

}  // namespace mt::dist
