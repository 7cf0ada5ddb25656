#include "train/param_groups.h"

#include <set>

#include "ops/nn/layers.h"

namespace mt::train {

namespace {

// Calls visit(name, tensor, decayed) for each trainable parameter, once per tensor.
template <typename Visit>
void classify(const nn::Module& model, const DecayOptions& options, Visit visit) {
  std::set<std::string> embedding_paths;  // modules whose weight is an embedding table
  for (const auto& [path, module] : model.named_modules()) {
    if (dynamic_cast<const nn::Embedding*>(module.get()) != nullptr) embedding_paths.insert(path);
  }
  std::set<const TensorImpl*> seen;
  for (const auto& [name, param] : model.named_parameters()) {
    if (!param.requires_grad() || !seen.insert(param.impl()).second) continue;
    const size_t dot = name.rfind('.');
    const std::string owner = dot == std::string::npos ? std::string() : name.substr(0, dot);
    const bool embedding = embedding_paths.count(owner) > 0;
    const bool decayed = param.dim() >= 2 && (options.decay_embeddings || !embedding);
    visit(name, param, decayed);
  }
}

}  // namespace

std::vector<ParamGroup> weight_decay_groups(const nn::Module& model, const DecayOptions& options) {
  std::vector<ParamGroup> groups(2);
  groups[0].lr = groups[1].lr = options.lr;
  groups[0].weight_decay = options.weight_decay;
  groups[1].weight_decay = 0.0;
  classify(model, options, [&](const std::string&, const Tensor& param, bool decayed) {
    groups[decayed ? 0 : 1].params.push_back(param);
  });
  return groups;
}

DecayNames weight_decay_names(const nn::Module& model, const DecayOptions& options) {
  DecayNames names;
  classify(model, options, [&](const std::string& name, const Tensor&, bool decayed) {
    (decayed ? names.decayed : names.not_decayed).push_back(name);
  });
  return names;
}

}  // namespace mt::train
