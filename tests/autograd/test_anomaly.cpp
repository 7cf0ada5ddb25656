// Anomaly mode names the first op that produced NaN or inf, forward or backward.
#include "autograd/anomaly.h"

#include <cmath>
#include <limits>

#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt {
namespace {

TEST(Anomaly, NamesTheForwardOpThatMadeANaN) {
  const Tensor x = from_vector({1.0, -1.0}, {2}, DType::f64).requires_grad_();
  AnomalyGuard anomaly;
  const std::string msg = error_message_of([&] { sum(log(exp(x) - 1.5)); });
  EXPECT_NE(msg.find("anomaly: forward of 'log' produced NaN in output 0 ([2] f64)"), std::string::npos) << msg;
}

TEST(Anomaly, NamesTheBackwardNodeThatMadeAnInf) {
  const Tensor x = from_vector({0.0, 4.0}, {2}, DType::f64).requires_grad_();
  const Tensor y = sum(sqrt(x));  // finite forward; d sqrt(x)/dx = inf at 0
  AnomalyGuard anomaly;
  const std::string msg = error_message_of([&] { y.backward(); });
  EXPECT_NE(msg.find("anomaly: backward of 'sqrtBackward' produced inf in the gradient for input 0 ([2] f64)"),
            std::string::npos)
      << msg;
}

// masked_fill with -inf (attention's causal mask) makes infinities on purpose: only a NaN stops it.
TEST(Anomaly, AnInfiniteMaskFillIsNoAnomalyButANaNThroughItIs) {
  const Tensor mask = from_vector({0, 1}, {2}, DType::boolean);
  AnomalyGuard anomaly;
  const Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  const Tensor scores = masked_fill(x, mask, -std::numeric_limits<double>::infinity());
  sum(softmax(scores, 0)).backward();
  EXPECT_TRUE(x.grad().defined());
  const Tensor nan_input = from_vector({std::nan(""), 2.0}, {2}, DType::f64).requires_grad_();
  const std::string msg =
      error_message_of([&] { masked_fill(nan_input, mask, -std::numeric_limits<double>::infinity()); });
  EXPECT_NE(msg.find("anomaly: forward of 'MaskedFill' produced NaN"), std::string::npos) << msg;
  const std::string overflow = error_message_of([&] { exp(mul(x, 1000.0)); });
  EXPECT_NE(overflow.find("produced inf"), std::string::npos) << overflow;
}

TEST(Anomaly, IsOffByDefaultAndTheGuardRestoresIt) {
  EXPECT_FALSE(detect_anomaly_enabled());
  {
    AnomalyGuard anomaly;
    EXPECT_TRUE(detect_anomaly_enabled());
  }
  EXPECT_FALSE(detect_anomaly_enabled());
  const Tensor x = from_vector({-1.0}, {1}, DType::f64).requires_grad_();
  EXPECT_TRUE(std::isnan(log(x).item()));  // no check, no error
}

}  // namespace
}  // namespace mt
