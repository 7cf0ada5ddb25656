// Per-step scalars of a run, written where people look at them: a JSON-lines file and
// TensorBoard event files. One logger owns both; under mpirun only rank 0 makes one, and it
// logs figures that already hold for all ranks (the mean loss, the global tokens/s).
//
// The JSON-lines file holds one object per logged step, written whole and flushed, so a reader
// may follow it while the run goes on (a last line without its newline is still being written):
//   {"step":25,"time":1765090000.123,"loss":3.2145,"lr":0.0006,"grad_norm":0.93,"tokens_per_s":51234,...}
// "step" and "time" (Unix seconds) are on every line; the scalars are those logged at that step
// (val_loss only where validation ran; memory only on a GPU). A scalar that is NaN or infinite
// is written as null (JSON has no such numbers) and read back as NaN.
//
// Resume: a run resumed from a checkpoint at step S first drops the lines of steps after S (an
// interrupted run got further than its last checkpoint), then appends; the event files get a
// TensorBoard "session start" at S + 1, which makes TensorBoard drop the orphaned events of the
// same steps. Either way every step appears once. A fresh run starts the JSON-lines file anew.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mt::train {

class TensorBoardWriter;

using Scalars = std::vector<std::pair<std::string, double>>;

struct MetricsOptions {
  std::string jsonl_path;       // empty: no JSON-lines file
  std::string tensorboard_dir;  // empty: no event files
};

class MetricsLogger {
 public:
  // resume_step: the checkpoint's step when resuming, 0 for a fresh run.
  MetricsLogger(const MetricsOptions& options, int64_t resume_step);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Writes one record (every sink) and flushes it; `time` is wall-clock Unix seconds.
  void log(int64_t step, double time, const Scalars& scalars);
  bool writes_anything() const { return jsonl_ != nullptr || tensorboard_ != nullptr; }
  std::string tensorboard_file() const;  // the event file written, or empty

 private:
  std::string jsonl_path_;
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

struct MetricsRecord {
  int64_t step = 0;
  double time = 0;
  std::map<std::string, double> scalars;  // null values as NaN
};

// Every complete line of a metrics file, in file order. A malformed line throws FileError naming
// the file and the line; an unterminated last line (being written) is skipped.
std::vector<MetricsRecord> read_metrics_jsonl(const std::string& path);

// Wall-clock Unix seconds now.
double unix_time();

}  // namespace mt::train
