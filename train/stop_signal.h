// Note [Stopping on a signal]: a training run that saves checkpoints listens for SIGTERM, SIGINT
// and SIGUSR1 (a scheduler's warning before it kills a job, Ctrl-C, a user's request). The first
// one asks the loop to finish its step, write a checkpoint and return, so the job exits 0 and
// resumes where it stopped; a second one ends the process at once (exit 128 + signal). Under
// mpirun the decision is collective: every rank asks after every step, and a signal delivered to
// one rank stops them all after the same step.
#pragma once

#include <cstdint>
#include <string>

#include "distributed/process_group.h"

namespace mt::train {

// Installs the handlers (idempotent).
void install_stop_handlers();
// Why the run stops after `step`: "--stop-at" (step == stop_at, a planned stop; 0 never),
// "SIGTERM" / "SIGINT" / "SIGUSR1", "a signal to another rank", or empty to go on. A collective
// when `group` has more than one rank.
std::string stop_reason(int64_t step, int64_t stop_at, dist::ProcessGroup* group);
// Forgets a signal received (tests, and programs that train twice).
void clear_stop_signal();

}  // namespace mt::train
