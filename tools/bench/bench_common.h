// What the benchmark programs of tools/bench share.
#pragma once

#include <algorithm>
#include <vector>

namespace bench {

// The median of the timings (the upper middle one of an even count): every benchmark reports it.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
