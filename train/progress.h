// Progress of long work, for a person watching. On a terminal: one line that redraws in place
// (a bar, the figures, the time left), at most ten times a second. Anywhere else (a log file, a
// pipe, a job scheduler's output): nothing is redrawn; the caller prints whole lines at an
// interval, e.g. progress_line()'s
//   mt_train: step   25/300 | loss 3.2145 | lr 6.00e-04 | ... | eta 1m05s
// Messages printed through a ProgressBar (a checkpoint written, a validation loss) appear above
// the bar, which is drawn again below them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::train {

enum class ProgressMode {
  automatic,  // a bar when stdout is a terminal, else lines
  bar,
  lines,
};

bool stdout_is_terminal();

// "1m05s", "2h03m".
std::string duration_text(double seconds);
// "<program>: step   25/300 | <fields joined by " | "> | eta 0m05s": the time left at the mean pace
// of the `done_here` steps this process ran in `seconds`.
std::string progress_line(const std::string& program, int64_t step, int64_t steps,
                          const std::vector<std::string>& fields, double seconds, int64_t done_here);

class ProgressBar {
 public:
  // label: "mt_train" or "mt_train: validation"; total: the units of work (steps, batches).
  ProgressBar(std::string label, int64_t total, ProgressMode mode = ProgressMode::automatic);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool draws() const { return draws_; }  // false: lines mode, update() prints nothing
  // `done` units of `total` are finished; done_here of them in this process (a resumed run's
  // pace counts only its own). Redraws at most every 100 ms, and always when done == total.
  void update(int64_t done, int64_t done_here, const std::vector<std::string>& fields);
  // Prints `line` (no newline needed) above the bar.
  void print(const std::string& line);
  // Ends the bar's line (a newline after its last drawing); called by the destructor.
  void close();

 private:
  void draw(int64_t done, int64_t done_here, const std::vector<std::string>& fields);
  std::string label_;
  int64_t total_;
  bool draws_;
  bool drawn_ = false;  // the cursor sits at the end of a drawn bar
  std::chrono::steady_clock::time_point start_, last_draw_;
  int64_t last_done_ = 0, last_done_here_ = 0;
  std::vector<std::string> last_fields_;
};

}  // namespace mt::train
