// Internal: the element loops behind copy, fill and random factories, one
// implementation per device. Callers validate; these assume valid input.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels {

enum class Distribution { uniform, normal };

// dst and src have equal shapes (src already expanded) and live on the same device
// (or src on the CPU for the CUDA versions' host-staging callers: not allowed here).
void copy_cpu(const Tensor& dst, const Tensor& src);
void accumulate_cpu(const Tensor& dst, const Tensor& src);  // dst += src (src converted to dst's dtype)
void fill_cpu(const Tensor& dst, double value);
void random_cpu(const Tensor& dst, Distribution dist, double a, double b, uint64_t seed, uint64_t offset);

void copy_cuda(const Tensor& dst, const Tensor& src);
void accumulate_cuda(const Tensor& dst, const Tensor& src);
void fill_cuda(const Tensor& dst, double value);
// dst (contiguous) gets start + i * step at flat index i, rounded as the CPU's arange rounds.
void arange_cuda(const Tensor& dst, double start, double step);
void random_cuda(const Tensor& dst, Distribution dist, double a, double b, uint64_t seed, uint64_t offset);

}  // namespace mt::kernels
