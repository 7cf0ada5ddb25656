// AdamW parameter groups with the usual weight-decay exemptions: decay shrinks weights that
// multiply activations (matrices, convolution kernels), not the offsets and gains that set
// their scale (biases, LayerNorm/RMSNorm weights: every tensor of fewer than 2 dimensions),
// and, when asked, not the embedding tables (a rare token's row would shrink a little every step
// while its gradient is almost always zero).
//
//   auto groups = mt::train::weight_decay_groups(model, {/*weight_decay=*/0.1, /*lr=*/3e-4});
//   mt::AdamW optimizer(groups, mt::AdamWOptions(3e-4));
#pragma once

#include <string>
#include <vector>

#include "ops/nn/module.h"
#include "optim/optimizer.h"

namespace mt::train {

struct DecayOptions {
  double weight_decay = 0.1;
  double lr = 1e-3;
  bool decay_embeddings = true;  // false: nn::Embedding tables join the group without decay
};

// Two groups of the module's trainable parameters, in registration order, each tensor once
// (tied weights are one parameter): [0] decayed by weight_decay, [1] not decayed. A group may be
// empty (a LoRA model has no 1-D trainable tensors).
std::vector<ParamGroup> weight_decay_groups(const nn::Module& model, const DecayOptions& options);

// The dotted names in each group, same order (for logs and tests).
struct DecayNames {
  std::vector<std::string> decayed, not_decayed;
};
DecayNames weight_decay_names(const nn::Module& model, const DecayOptions& options);

}  // namespace mt::train
