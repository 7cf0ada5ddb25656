// CPU element loops for copy (with dtype conversion), fill and random draws.
#include <cmath>
#include <cstring>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/random.h"

namespace mt::kernels {

void copy_cpu(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_all(dst.dtype(), "copy", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_all(src.dtype(), "copy", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      D* d = static_cast<D*>(dst.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      cpu::for_each_strided<2>(dst.shape(), {&dst.strides(), &src.strides()},
                               [&](const auto& off) { d[off[0]] = convert<D>(s[off[1]]); });
    });
  });
}

void accumulate_cpu(const Tensor& dst, const Tensor& src) {
  dispatch_floating(dst.dtype(), "accumulate_", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_floating(src.dtype(), "accumulate_", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      D* d = static_cast<D*>(dst.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      cpu::for_each_strided<2>(dst.shape(), {&dst.strides(), &src.strides()}, [&](const auto& off) {
        D& out = d[off[0]];
        out = convert<D>(convert<acc_t<D>>(out) + convert<acc_t<D>>(s[off[1]]));
      });
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = convert<T>(value);
    T* d = static_cast<T*>(dst.data_ptr());
    cpu::for_each_strided<1>(dst.shape(), {&dst.strides()}, [&](const auto& off) { d[off[0]] = v; });
  });
}

void random_cpu(const Tensor& dst, Distribution dist, double a, double b, uint64_t seed, uint64_t offset) {
  // Each element's number is set by its logical index alone, so the elements split across
  // the cores (a model's initialisation draws every weight here).
  const cpu::StridedWalk<1> walk(dst.shape(), {&dst.strides()});
  dispatch_floating(dst.dtype(), dist == Distribution::uniform ? "rand" : "randn", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = static_cast<T*>(dst.data_ptr());
    cpu::parallel_for(dst.numel(), cpu::kParallelGrain, [&](int64_t begin, int64_t end) {
      auto k = static_cast<uint64_t>(begin);
      walk.run(begin, end, [&](const auto& off) {
        d[off[0]] = dist == Distribution::uniform
                        ? philox::uniform_as<T>(philox::uniform_at(seed, offset, k), a, b)
                        : convert<T>(a + b * static_cast<double>(philox::normal_at(seed, offset, k)));
        ++k;
      });
    });
  });
}

}  // namespace mt::kernels
