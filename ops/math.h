// Math functions callable from host and device code with float or double.
// (CUDA's device overloads and the C library's host functions share these
// names: expf/exp, logf/log, ...; the wrappers pick the right one per type.)
#pragma once

#include <cmath>

#include "core/macros.h"

namespace mt::math {

MT_HOST_DEVICE inline float exp(float x) { return ::expf(x); }
MT_HOST_DEVICE inline double exp(double x) { return ::exp(x); }
MT_HOST_DEVICE inline float log(float x) { return ::logf(x); }
MT_HOST_DEVICE inline double log(double x) { return ::log(x); }
MT_HOST_DEVICE inline float sqrt(float x) { return ::sqrtf(x); }
MT_HOST_DEVICE inline double sqrt(double x) { return ::sqrt(x); }
MT_HOST_DEVICE inline float tanh(float x) { return ::tanhf(x); }
MT_HOST_DEVICE inline double tanh(double x) { return ::tanh(x); }
MT_HOST_DEVICE inline float erf(float x) { return ::erff(x); }
MT_HOST_DEVICE inline double erf(double x) { return ::erf(x); }
MT_HOST_DEVICE inline float pow(float x, float y) { return ::powf(x, y); }
MT_HOST_DEVICE inline double pow(double x, double y) { return ::pow(x, y); }
MT_HOST_DEVICE inline float abs(float x) { return ::fabsf(x); }
MT_HOST_DEVICE inline double abs(double x) { return ::fabs(x); }
MT_HOST_DEVICE inline float log1p(float x) { return ::log1pf(x); }
MT_HOST_DEVICE inline double log1p(double x) { return ::log1p(x); }

template <typename T>
MT_HOST_DEVICE inline T max(T a, T b) {
  return a > b ? a : b;
}
template <typename T>
MT_HOST_DEVICE inline T min(T a, T b) {
  return a < b ? a : b;
}

}  // namespace mt::math
