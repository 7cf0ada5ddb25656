// Everything a training program needs: tensors, autograd and every op family.
//   #include "ops/ops.h"
#pragma once

#include "autograd/grad_mode.h"
#include "core/random.h"
#include "core/tensor.h"
#include "ops/elementwise/elementwise.h"
#include "ops/reduction/reduction.h"
#include "ops/shape/shape.h"
