#include "train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mt::train {

namespace {

int terminal_width() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 100;
}

std::string eta_text(double seconds, int64_t done_here, int64_t remaining) {
  if (done_here <= 0) return "eta -";
  return "eta " + duration_text(seconds / static_cast<double>(done_here) * static_cast<double>(remaining));
}

}  // namespace

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(seconds, 0.0)));
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", s / 3600, s % 3600 / 60);
  } else {
    std::snprintf(text, sizeof(text), "%lldm%02llds", s / 60, s % 60);
  }
  return text;
}

std::string progress_line(const std::string& program, int64_t step, int64_t steps,
                          const std::vector<std::string>& fields, double seconds, int64_t done_here) {
  char head[96];
  std::snprintf(head, sizeof(head), "%s: step %4lld/%lld", program.c_str(), static_cast<long long>(step),
                static_cast<long long>(steps));
  std::string line = head;
  for (const std::string& field : fields) line += " | " + field;
  return line + " | " + eta_text(seconds, std::max<int64_t>(done_here, 1), steps - step);
}

ProgressBar::ProgressBar(std::string label, int64_t total, ProgressMode mode)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      draws_(mode == ProgressMode::bar || (mode == ProgressMode::automatic && stdout_is_terminal())),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - std::chrono::seconds(1)) {}

ProgressBar::~ProgressBar() { close(); }

void ProgressBar::update(int64_t done, int64_t done_here, const std::vector<std::string>& fields) {
  if (!draws_) return;
  last_done_ = done;
  last_done_here_ = done_here;
  last_fields_ = fields;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(done, done_here, fields);
}

void ProgressBar::draw(int64_t done, int64_t done_here, const std::vector<std::string>& fields) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int bar_width = 20;
  const int filled = static_cast<int>(static_cast<double>(bar_width) * static_cast<double>(std::min(done, total_)) /
                                      static_cast<double>(total_));
  std::string line = label_ + " [" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "] " +
                     std::to_string(done) + "/" + std::to_string(total_);
  for (const std::string& field : fields) line += " | " + field;
  line += " | " + eta_text(seconds, done_here, total_ - done);
  const size_t width = static_cast<size_t>(std::max(terminal_width() - 1, 20));
  if (line.size() > width) line.resize(width);
  // Carriage return, the line, then erase what a longer previous drawing left to its right.
  std::printf("\r%s\033[K", line.c_str());
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::print(const std::string& line) {
  if (drawn_) std::printf("\r\033[K");
  std::printf("%s\n", line.c_str());
  if (drawn_) draw(last_done_, last_done_here_, last_fields_);
  std::fflush(stdout);
}

void ProgressBar::close() {
  if (!drawn_) return;
  std::printf("\n");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace mt::train
