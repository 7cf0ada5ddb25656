// CPU dropout loop: one Philox counter per four consecutive elements, exactly
// as philox::uniform_at numbers them (and as the CUDA kernel does).
#include <algorithm>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "core/random.h"
#include "ops/dropout/dropout_kernels.h"

namespace mt::ops {

void dropout_cpu(const Tensor& out, const Tensor& in, const DropoutMask& mask) {
  const int64_t n = in.numel();
  const int64_t groups = (n + 3) / 4;
  // The input's offsets by the joint strided walk (division once per task); groups split
  // across the cores, each element's number set by its index alone.
  const cpu::StridedWalk<1> walk(in.shape(), {&in.strides()});
  dispatch_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A scale = static_cast<A>(mask.scale);
    T* o = static_cast<T*>(out.data_ptr());  // contiguous
    const T* x = static_cast<const T*>(in.data_ptr());
    cpu::parallel_for(groups, cpu::kParallelGrain / 4, [&](int64_t first_group, int64_t end_group) {
      int64_t i = first_group * 4;
      philox::Words words{};
      walk.run(i, std::min(n, end_group * 4), [&](const auto& off) {
        if (i % 4 == 0) words = philox::generate(mask.seed, mask.offset + static_cast<uint64_t>(i / 4));
        const bool keep = static_cast<double>(philox::uniform(words.w[i % 4])) >= mask.p;
        o[i] = convert<T>(convert<A>(x[off[0]]) * (keep ? scale : A(0)));
        ++i;
      });
    });
  });
}

}  // namespace mt::ops
