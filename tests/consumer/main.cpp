// Built against an installed mixtrain: proves the exported package works.
#include <iostream>

#include "core/random.h"
#include "core/tensor.h"

int main() {
  mt::manual_seed(0);
  const mt::Tensor x = mt::ones({2, 3});
  const mt::Tensor r = mt::rand({2, 3});
  std::cout << x << "\n" << r << "\n";
  return x.numel() == 6 && r.dtype() == mt::DType::f32 ? 0 : 1;
}
