#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>

namespace mt::train {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int signal) {
  if (g_stop_signal != 0) _exit(128 + signal);
  g_stop_signal = signal;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
}

std::string stop_reason(int64_t step, int64_t stop_at, dist::ProcessGroup* group) {
  const int signal = g_stop_signal;
  const bool here = signal != 0 || step == stop_at;
  const bool anywhere =
      group != nullptr && group->world_size() > 1 ? group->mean_over_ranks(here ? 1.0 : 0.0) > 0.0 : here;
  if (!anywhere) return "";
  if (signal != 0) return signal_name(signal);
  return step == stop_at ? "--stop-at" : "a signal to another rank";
}

void clear_stop_signal() { g_stop_signal = 0; }

}  // namespace mt::train
