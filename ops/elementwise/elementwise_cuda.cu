// CUDA instantiations of the element-wise functors (ops/elementwise/functors.h):
// the kernels themselves are the shared loops in ops/cuda/loops.cuh.
#include "ops/cuda/map_impl.cuh"
#include "ops/elementwise/functors.h"

using mt::Tensor;

MT_INSTANTIATE_MAP_BINARY(mt::fn::Add);
MT_INSTANTIATE_MAP_BINARY(mt::fn::Sub);
MT_INSTANTIATE_MAP_BINARY(mt::fn::Mul);
MT_INSTANTIATE_MAP_BINARY(mt::fn::Div);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Square);
MT_INSTANTIATE_MAP_BINARY(mt::fn::SquareGrad);
MT_INSTANTIATE_MAP_BINARY_F32_FROM_MIXED(mt::fn::Add);
MT_INSTANTIATE_MAP_BINARY_F32_FROM_MIXED(mt::fn::Sub);
MT_INSTANTIATE_MAP_BINARY_F32_FROM_MIXED(mt::fn::Mul);
MT_INSTANTIATE_MAP_BINARY_F32_FROM_MIXED(mt::fn::Div);
MT_INSTANTIATE_MAP_TERNARY(mt::fn::DivGradY);
MT_INSTANTIATE_MAP_UNARY(mt::fn::AddScalar);
MT_INSTANTIATE_MAP_UNARY(mt::fn::MulScalar);
MT_INSTANTIATE_MAP_UNARY(mt::fn::RDivScalar);
MT_INSTANTIATE_MAP_BINARY(mt::fn::RDivScalarGrad);
MT_INSTANTIATE_MAP_UNARY(mt::fn::PowScalar);
MT_INSTANTIATE_MAP_BINARY(mt::fn::PowScalarGrad);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Neg);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Exp);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Log);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Sqrt);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Rsqrt);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Abs);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Tanh);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Sigmoid);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Relu);
MT_INSTANTIATE_MAP_UNARY(mt::fn::Silu);
MT_INSTANTIATE_MAP_UNARY(mt::fn::GeluErf);
MT_INSTANTIATE_MAP_UNARY(mt::fn::GeluTanh);
MT_INSTANTIATE_MAP_BINARY(mt::fn::ExpGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::LogGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::SqrtGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::RsqrtGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::AbsGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::TanhGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::SigmoidGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::ReluGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::SiluGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::GeluErfGrad);
MT_INSTANTIATE_MAP_BINARY(mt::fn::GeluTanhGrad);
