#include "ops/backends.h"

#include <atomic>

namespace mt::backends {

namespace {
std::atomic<bool> g_tf32_matmul{false};
std::atomic<bool> g_tf32_conv{true};
std::atomic<bool> g_deterministic{false};
std::atomic<bool> g_matmul_autotune{false};
}  // namespace

bool allow_tf32_matmul() { return g_tf32_matmul.load(); }
void set_allow_tf32_matmul(bool allow) { g_tf32_matmul.store(allow); }
bool allow_tf32_conv() { return g_tf32_conv.load(); }
void set_allow_tf32_conv(bool allow) { g_tf32_conv.store(allow); }
bool deterministic_algorithms() { return g_deterministic.load(); }
void set_deterministic_algorithms(bool on) { g_deterministic.store(on); }
bool matmul_autotune() { return g_matmul_autotune.load(); }
void set_matmul_autotune(bool on) { g_matmul_autotune.store(on); }

DeterministicGuard::DeterministicGuard(bool on) : was_(deterministic_algorithms()) { set_deterministic_algorithms(on); }

DeterministicGuard::~DeterministicGuard() { set_deterministic_algorithms(was_); }

TF32Guard::TF32Guard(bool matmul, bool conv) : matmul_(allow_tf32_matmul()), conv_(allow_tf32_conv()) {
  set_allow_tf32_matmul(matmul);
  set_allow_tf32_conv(conv);
}

TF32Guard::~TF32Guard() {
  set_allow_tf32_matmul(matmul_);
  set_allow_tf32_conv(conv_);
}

}  // namespace mt::backends
