// SwiGLU (ops/elementwise/swiglu.h): op-contract cases (an odd size for the element tail, a
// large one for the packed CUDA loop), values against silu(gate) * up with the same gradients,
// and errors.
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

MT_OP_CASE(OpCase("swiglu", "swiglu_odd").inputs({{3, 7}, {3, 7}}).compute([](const In& x) {
  return swiglu(x[0], x[1]);
}));
MT_OP_CASE(OpCase("swiglu", "swiglu_packed")
               .inputs({{4, 2, 257}, {4, 2, 257}})
               .compute([](const In& x) { return swiglu(x[0], x[1]); })
               .no_gradcheck("swiglu_odd checks the same formulas in f64; this case sizes the CUDA packs"));
// A transposed gate: the op reads it through a contiguous copy.
MT_OP_CASE(OpCase("swiglu", "swiglu_strided_gate").inputs({{5, 4}, {4, 5}}).compute([](const In& x) {
  return swiglu(x[0].transpose(0, 1), x[1]);
}));

void expect_equals_silu_times_up(Device device, DType dtype, double tol) {
  Generator gen(8);
  const Tensor g0 = (randn({6, 300}, DType::f32, &gen) * 4.0).to(dtype).to(device);
  const Tensor u0 = randn({6, 300}, DType::f32, &gen).to(dtype).to(device);
  const Tensor dy = randn({6, 300}, DType::f32, &gen).to(dtype).to(device);
  Tensor g1 = g0.clone().requires_grad_(), u1 = u0.clone().requires_grad_();
  Tensor g2 = g0.clone().requires_grad_(), u2 = u0.clone().requires_grad_();
  const Tensor fused = swiglu(g1, u1), composite = mul(silu(g2), u2);
  EXPECT_EQ(fused.dtype(), dtype);
  sum(mul(fused, dy)).backward();
  sum(mul(composite, dy)).backward();
  EXPECT_LE(relative_norm_error(fused, composite), tol);
  EXPECT_LE(relative_norm_error(g1.grad(), g2.grad()), tol);
  EXPECT_LE(relative_norm_error(u1.grad(), u2.grad()), tol);
}

// The composite rounds silu(gate) to the dtype before the product; the fused op does not.
TEST(Swiglu, EqualsSiluTimesUp) {
  expect_equals_silu_times_up(kCPU, DType::f32, 1e-6);
  expect_equals_silu_times_up(kCPU, DType::bf16, 1e-2);
}
TEST(Swiglu, CudaEqualsSiluTimesUp) {
  MT_SKIP_WITHOUT_CUDA();
  expect_equals_silu_times_up(gpu(), DType::f32, 1e-6);
  expect_equals_silu_times_up(gpu(), DType::bf16, 1e-2);
}

TEST(Swiglu, ErrorsNameTheOpShapesAndDtypes) {
  expect_contains(error_of([] { swiglu(ones({2, 3}), ones({3, 2})); }), {"swiglu", "[2, 3]", "[3, 2]"});
  expect_contains(error_of([] { swiglu(ones({2, 3}), ones({2, 3}, DType::f64)); }), {"swiglu", "f32", "f64"});
  expect_contains(error_of([] { swiglu(ones({2}, DType::i64), ones({2}, DType::i64)); }), {"swiglu"});
}

}  // namespace
}  // namespace mt::testing
