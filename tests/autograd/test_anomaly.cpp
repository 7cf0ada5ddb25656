// Anomaly mode names the first op that produced NaN or inf, forward or backward.
#include "autograd/anomaly.h"
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
