// Dropout: validation, the (seed, offset) draw, forward and the replayed-mask backward.
#include "ops/dropout/dropout.h"

#include <cmath>

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/dropout/dropout_kernels.h"
#include "ops/elementwise/elementwise.h"
#include "ops/map.h"

namespace mt {

using autograd::LambdaNode;

namespace {

// out = in with the mask of `mask` applied (no recording); out is contiguous.
Tensor apply_mask(const Tensor& in, const ops::DropoutMask& mask) {
  Tensor out = empty(in.shape(), ops::options_of(in));
  if (in.is_cuda()) {
#if MT_WITH_CUDA
    ops::dropout_cuda(out, in, mask);
#else
    ops::throw_no_cuda("dropout");
#endif
  } else {
    ops::dropout_cpu(out, in, mask);
  }
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  ops::check_floating("dropout", x);
  MT_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must lie in [0, 1], got ", p);
  if (!training || p == 0.0) return x;

  // Everything dropped: x * 0, a product as in PyTorch, so a NaN or inf in x (or in the incoming
  // gradient) still shows as NaN; its derivative is the true one, 0.
  if (p == 1.0) return mul(x, 0.0);

  Generator& gen = generator != nullptr ? *generator : default_generator(x.device());
  ops::DropoutMask mask;
  mask.seed = gen.seed();
  mask.offset = gen.advance(static_cast<uint64_t>(x.numel()));
  mask.p = p;
  mask.scale = 1.0 / (1.0 - p);

  Tensor out = apply_mask(x, mask);
  if (autograd::needs_grad({x})) {
    // The mask is recomputed from (seed, offset): nothing but these scalars is saved.
    auto node =
        std::make_shared<LambdaNode>("DropoutBackward", [mask](const std::vector<Tensor>& g, const LambdaNode&) {
          return std::vector<Tensor>{apply_mask(g[0], mask)};
        });
    autograd::record(node, {x}, {out});
  }
  return out;
}

}  // namespace mt
