// TensorBoard event files: scalars written as TensorBoard's own writers write them, and read back.
//
// A file is a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// whose data is one serialised Event (train/tensorboard_event.proto). The first event carries the
// file version "brain.Event:2", which tells TensorBoard to purge by session restarts (see below);
// each add_scalar() is one event holding one Summary value (tag, float simple_value, step, wall time).
//
// Note [Resumed runs in TensorBoard]
// A run that resumes from a checkpoint repeats the steps an interrupted run had logged after that
// checkpoint. TensorBoard's answer, with purge_orphaned_data on (its default), is a SessionLog START
// event: on reading one at step s it drops every event of a step >= s it has read before. A resumed
// run therefore passes `resume_step` = the first step it will log (the checkpoint's step + 1), and
// writes a new file whose name sorts after the earlier run's, since TensorBoard reads a directory's
// files in name order.
//
// Writing needs protobuf; tensorboard_available() says whether this build has it. Without it the
// writer's constructor and the readers throw mt::Error saying what to install. The protobuf types stay
// inside the library: nothing here includes a protobuf header.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mt::train {

// Whether this build writes and reads event files (protobuf was found when it was configured).
bool tensorboard_available();

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new file in it, named as TensorBoard's writers name theirs:
  // events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter> (the seconds raised, when needed,
  // above those of every events file already there, so the new file sorts last); writes the
  // file_version event. `resume_step` > 0 also writes a SessionLog START at that step
  // (Note [Resumed runs in TensorBoard]). Throws FileError naming the path and the system's reason.
  explicit TensorBoardWriter(const std::string& dir, int64_t resume_step = 0);
  ~TensorBoardWriter();  // closes the file; a failure there is lost: call close() to see it
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar event; `value` is stored as a float (TensorBoard's simple_value), `wall_time` in unix
  // seconds. Buffered: it reaches the file on flush(), close() or when the buffer fills.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  // Hands everything written so far to the file (fflush), so that TensorBoard reading the file while
  // the run goes on sees it. Throws FileError (disk full, ...) naming the file.
  void flush();
  // Flushes and closes the file, throwing FileError if either fails. Later calls do nothing; adding
  // to a closed writer is an error.
  void close();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

struct ScalarEvent {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};

// Every scalar of an event file, in file order. Checks each record's framing and both CRCs, and
// throws FileError naming the file, the record's index and byte offset, and what is wrong (a
// truncated record, a CRC mismatch, an event that does not parse).
std::vector<ScalarEvent> read_tensorboard_scalars(const std::string& path);

// The steps of the file's SessionLog START events, in file order (checked as above).
std::vector<int64_t> read_tensorboard_start_steps(const std::string& path);

}  // namespace mt::train
