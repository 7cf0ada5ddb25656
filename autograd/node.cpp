#include "autograd/node.h"

#include <atomic>

#include "autograd/anomaly.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/profiler.h"
#include "core/view.h"

namespace mt::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};

// Tensor::requires_grad_ for factories (core/ calls it through its opaque hook).
const bool g_hook_installed = [] {
  detail::set_requires_grad_hook([](Tensor& t) { t.requires_grad_(true); });
  return true;
}();
}  // namespace

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1)) {}

// Graph teardown without recursion: a node hands its children to a thread-local
// work list, and only the outermost destructor drains it. Saved tensors hold no
// nodes (Note [Saved tensors hold no history]), so next_edges is the only path.
Node::~Node() {
  thread_local std::vector<std::shared_ptr<Node>> pending;
  thread_local bool draining = false;
  for (Edge& e : next_edges) {
    if (e.fn) pending.push_back(std::move(e.fn));
  }
  next_edges.clear();
  if (draining) return;
  draining = true;
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    n.reset();  // may run ~Node, which only appends to `pending`
  }
  draining = false;
}

namespace {

// The node that can rebuild t, saved under RebuildSavedGuard: t must be that node's output as it
// came out (contiguous, never written to since) for the rebuilt values to be t's.
AutogradMeta* rebuildable(const Tensor& t) {
  if (!is_rebuild_saved_enabled() || t.version() != 0 || !t.is_contiguous()) return nullptr;
  AutogradMeta* m = meta_if_exists(t);
  if (m == nullptr || !m->grad_fn || !m->grad_fn->can_rebuild_output(m->output_nr)) return nullptr;
  const std::vector<TensorMeta>& outputs = m->grad_fn->output_meta;
  if (m->output_nr >= outputs.size() || outputs[m->output_nr].shape != t.shape() ||
      outputs[m->output_nr].dtype != t.dtype()) {
    return nullptr;
  }
  return m;
}

}  // namespace

Tensor Node::rebuild_output(uint32_t i) const {
  MT_INTERNAL_ASSERT(false, "autograd: ", name(), " cannot rebuild its output ", i);
  return Tensor();
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  if (AutogradMeta* m = rebuildable(t)) {
    rebuild_ = true;
    producer_ = m->grad_fn;
    output_nr_ = m->output_nr;
    return;
  }
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd_meta = nullptr;  // data only: no history (see node.h)
  data_ = Tensor(std::move(impl));
  version_ = t.version();
}

Tensor SavedTensor::unpack(const Node& owner) const {
  MT_CHECK(!owner.released, "backward: trying to backward through the graph a second time: ", owner.name(),
           " has already freed its saved tensors; pass retain_graph=true to the first backward()");
  if (rebuild_) {
    const std::shared_ptr<Node> producer = producer_.lock();
    MT_INTERNAL_ASSERT(producer != nullptr, "autograd: ", owner.name(),
                       " reads a rebuilt tensor whose producing node is gone");
    return producer->rebuild_output(output_nr_);
  }
  MT_CHECK(data_.defined(), "backward: ", owner.name(), " reads a tensor that was never saved (an internal error)");
  MT_CHECK(data_.version() == version_, "backward: a tensor saved by ", owner.name(),
           " for its gradient was modified in place afterwards (version ", version_, " at save, ", data_.version(),
           " now); clone it before the in-place op");
  return data_;
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor leaf(leaf_);
  AutogradMeta& m = meta(leaf);
  Tensor grad = std::move(grad_outputs.at(0));
  for (const auto& hook : m.leaf_hooks) {
    Tensor replaced = hook(grad);
    if (replaced.defined()) grad = std::move(replaced);
  }
  if (grad.dtype() != leaf.dtype()) grad = raw::to(grad, leaf.dtype());  // accumulate in the leaf's dtype
  if (!m.grad.defined()) {
    // Own the gradient: the incoming tensor may alias another buffer of the graph,
    // unless this handle is its only owner (then it is taken as is, without a copy)
    // or the leaf asked for the gradient as it comes (checkpoint's recompute inputs).
    m.grad = m.keep_incoming_grad || owns_whole_storage(grad) ? grad : raw::clone(grad);
  } else {
    raw::accumulate_(m.grad, grad);
  }
  for (const auto& hook : m.post_accumulate_hooks) hook(leaf);
  return {};
}

AutogradMeta& meta(const Tensor& t) {
  MT_CHECK(t.defined(), "autograd: operation on an undefined tensor");
  auto& slot = t.impl()->autograd_meta;
  if (!slot) slot = std::make_shared<AutogradMeta>();
  return *slot;
}

bool owns_whole_storage(const Tensor& t) {
  return t.impl_use_count() == 1 && t.storage().use_count() == 1 && t.offset() == 0 &&
         t.nbytes() == t.storage()->nbytes() && t.is_contiguous();  // not a slice keeping a bigger buffer
}

AutogradMeta* meta_if_exists(const Tensor& t) { return t.defined() ? t.impl()->autograd_meta.get() : nullptr; }

// ---- recording ----

bool requires_grad(const Tensor& t) {
  const AutogradMeta* m = meta_if_exists(t);
  return m != nullptr && m->requires_grad;
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (requires_grad(t)) return true;
  }
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (requires_grad(t)) return true;
  }
  return false;
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_if_exists(t);
  if (m == nullptr || !m->requires_grad) return Edge{};
  if (m->grad_fn) return Edge{m->grad_fn, m->output_nr};
  std::shared_ptr<AccumulateGrad> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m->grad_accumulator = acc;
  }
  return Edge{acc, 0};
}

std::string forward_op_name(const Node& node) {
  std::string name = node.name();
  const std::string suffix = "Backward";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  return name;
}

void record(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  node->next_edges.clear();
  node->input_meta.clear();
  for (const Tensor& in : inputs) {
    node->next_edges.push_back(in.defined() ? gradient_edge(in) : Edge{});
    node->input_meta.push_back(in.defined() ? TensorMeta::of(in) : TensorMeta{});
    if (in.defined() && in.is_cuda() && !node->has_stream) {
      node->has_stream = true;
      node->stream = cuda::current_stream(in.device().index);
    }
  }
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    AutogradMeta& m = meta(out);
    MT_INTERNAL_ASSERT(!m.grad_fn, "record: output already has history");
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = i;
    node->output_meta.push_back(TensorMeta::of(out));
  }
  anomaly::check_forward_outputs(*node, outputs);
  if (OpProfiler::active()) {
    node->profiler_module = OpProfiler::current_module();
    OpProfiler::mark("forward " + forward_op_name(*node), node->profiler_module);
  }
}

// A rebuilt output is freed as this node's backward starts: every node that saved it has run,
// and this one's formula never reads its own output (a second backward rebuilds it again).
std::vector<Tensor> LambdaNode::apply(std::vector<Tensor>&& grad_outputs) {
  rebuilt_ = Tensor();
  if (adding_fn_) return adding_fn_(grad_outputs, std::vector<Tensor>(next_edges.size()), *this);
  return fn_(grad_outputs, *this);
}

std::vector<Tensor> LambdaNode::apply_adding(std::vector<Tensor>&& grad_outputs, const std::vector<Tensor>& sums) {
  if (!adding_fn_) return apply(std::move(grad_outputs));
  rebuilt_ = Tensor();
  return adding_fn_(grad_outputs, sums, *this);
}

void LambdaNode::release_saved() {
  for (auto& entry : saved_) entry.second.reset();
  rebuilt_ = Tensor();
}

// Made once for every node that saved the output (a norm's feeds q, k and v) and kept until this
// node's backward starts: those nodes run before it.
Tensor LambdaNode::rebuild_output(uint32_t i) const {
  MT_INTERNAL_ASSERT(can_rebuild_output(i), "autograd: ", name_, " cannot rebuild its output ", i);
  if (!rebuilt_.defined()) {
    NoGradGuard no_grad;
    rebuilt_ = rebuild_(*this);
  }
  return rebuilt_;
}

void LambdaNode::save(std::string_view name, const Tensor& t) {
  MT_INTERNAL_ASSERT(find_saved(name) == nullptr, "autograd: ", name_, " saves two tensors named '", name, "'");
  if (t.defined()) saved_.emplace_back(name, SavedTensor(t));
}

const SavedTensor* LambdaNode::find_saved(std::string_view name) const {
  for (const auto& entry : saved_) {
    if (entry.first == name) return &entry.second;
  }
  return nullptr;
}

Tensor LambdaNode::saved_tensor(std::string_view name) const {
  const SavedTensor* saved = find_saved(name);
  if (saved == nullptr) {
    std::string names;
    for (const auto& entry : saved_) names += detail::str_cat(names.empty() ? "" : ", ", entry.first);
    MT_CHECK(false, "backward: ", name_, " reads the saved tensor '", name, "', which its forward did not save (",
             names.empty() ? std::string("it saved none") : "it saved " + names, ")");
  }
  return saved->unpack(*this);
}

Tensor LambdaNode::saved_tensor_or_none(std::string_view name) const {
  const SavedTensor* saved = find_saved(name);
  return saved == nullptr ? Tensor() : saved->unpack(*this);
}

}  // namespace mt::autograd
