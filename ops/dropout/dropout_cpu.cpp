// CPU dropout loop: one Philox counter per four consecutive elements, exactly
// as philox::uniform_at numbers them (and as the CUDA kernel does).
#include "core/dispatch.h"
#include "core/random.h"
#include "core/strided.h"
#include "ops/dropout/dropout_kernels.h"

namespace mt::ops {

void dropout_cpu(const Tensor& out, const Tensor& in, const DropoutMask& mask) {
  const int64_t n = in.numel();
  const StridedIndexer ii(in);
  dispatch_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A scale = static_cast<A>(mask.scale);
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    for (int64_t group = 0; group < (n + 3) / 4; ++group) {
      const philox::Words words = philox::generate(mask.seed, mask.offset + static_cast<uint64_t>(group));
      for (int lane = 0; lane < 4; ++lane) {
        const int64_t i = group * 4 + lane;
        if (i >= n) break;
        const bool keep = static_cast<double>(philox::uniform(words.w[lane])) >= mask.p;
        o[i] = convert<T>(keep ? convert<A>(x[ii.offset(i)]) * scale : A(0));
      }
    }
  });
}

}  // namespace mt::ops
