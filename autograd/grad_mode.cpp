#include "autograd/grad_mode.h"

namespace mt {

namespace {
thread_local bool g_grad_enabled = true;
thread_local bool g_rebuild_saved = false;
}  // namespace

bool is_grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

bool is_rebuild_saved_enabled() { return g_rebuild_saved; }
void set_rebuild_saved_enabled(bool enabled) { g_rebuild_saved = enabled; }

}  // namespace mt
