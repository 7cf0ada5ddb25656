#include "train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <utility>

#include "core/error.h"
#include "train/crc32c.h"

#if MT_WITH_TENSORBOARD
#include "tensorboard_event.pb.h"
#endif

namespace mt::train {
namespace {

constexpr const char* kNeedProtobuf =
    "TensorBoard event files need protobuf, which this build lacks: install libprotobuf-dev and "
    "protobuf-compiler and configure again";
constexpr const char* kFilePrefix = "events.out.tfevents.";
constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of it
constexpr size_t kFooterBytes = 4;   // uint32 masked CRC of the data

void store_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t load_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

#if MT_WITH_TENSORBOARD

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// The <unix seconds> field of an events file's name, or -1 for any other name.
int64_t name_seconds(const std::string& name) {
  const size_t n = std::strlen(kFilePrefix);
  if (name.compare(0, n, kFilePrefix) != 0) return -1;
  int64_t seconds = 0;
  size_t i = n;
  for (; i < name.size() && i < n + 18 && name[i] >= '0' && name[i] <= '9'; ++i)
    seconds = seconds * 10 + (name[i] - '0');
  return (i > n && i < name.size() && name[i] == '.') ? seconds : -1;
}

// Now, or one second past the newest events file already in `dir` if that is not earlier: TensorBoard
// reads a directory's files in name order, and a resumed run's START must come after what it purges.
int64_t file_seconds(const std::string& dir) {
  int64_t seconds = static_cast<int64_t>(std::time(nullptr));
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t existing = name_seconds(it->path().filename().string());
    if (existing >= seconds) seconds = existing + 1;
  }
  return seconds;
}

std::string serialize(const proto::Event& event) {
  std::string data;
  const bool ok = event.SerializeToString(&data);
  MT_INTERNAL_ASSERT(ok, "TensorBoard event serialisation failed");
  return data;
}

#endif  // MT_WITH_TENSORBOARD

std::string hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", static_cast<unsigned>(v));
  return text;
}

// Calls `on_record(index, offset, data, size)` for each record of the file, in order, after checking
// its framing and CRCs. (Unused in a build without protobuf.)
[[maybe_unused]] void for_each_record(
    const std::string& path, const std::function<void(int64_t, size_t, const unsigned char*, size_t)>& on_record) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::fail_file(path, "cannot open the TensorBoard event file: ", std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::fail_file(path, "cannot read the TensorBoard event file: ", std::strerror(errno));

  const auto* base = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t offset = 0;
  for (int64_t index = 0; offset < size; ++index) {
    const unsigned char* p = base + offset;
    const size_t left = size - offset;
    auto fail = [&](auto&&... what) {
      detail::fail_file(path, "record ", index, " at byte ", offset, ": ", std::forward<decltype(what)>(what)...);
    };
    if (left < kHeaderBytes) fail("truncated record: its 12-byte header has only ", left, " bytes");
    const uint32_t length_crc = static_cast<uint32_t>(load_le(p + 8, 4));
    if (masked_crc32c(p, 8) != length_crc) {
      fail("length CRC mismatch (stored ", hex32(length_crc), ", computed ", hex32(masked_crc32c(p, 8)), ")");
    }
    const uint64_t length = load_le(p, 8);
    if (length > left - kHeaderBytes || left - kHeaderBytes - length < kFooterBytes) {
      fail("truncated record: ", length, " bytes of data and 4 of CRC announced, ", left - kHeaderBytes,
           " bytes left in the file");
    }
    const unsigned char* data = p + kHeaderBytes;
    const uint32_t data_crc = static_cast<uint32_t>(load_le(data + length, 4));
    if (masked_crc32c(data, length) != data_crc) {
      fail("data CRC mismatch (stored ", hex32(data_crc), ", computed ", hex32(masked_crc32c(data, length)), ")");
    }
    try {
      on_record(index, offset, data, static_cast<size_t>(length));
    } catch (const FileError&) {
      throw;
    } catch (const std::exception& e) {
      fail(e.what());
    }
    offset += kHeaderBytes + length + kFooterBytes;
  }
}

#if MT_WITH_TENSORBOARD
// Each event of the file, parsed.
void for_each_event(const std::string& path, const std::function<void(const proto::Event&)>& on_event) {
  for_each_record(path, [&](int64_t, size_t, const unsigned char* data, size_t size) {
    proto::Event event;
    if (size > static_cast<size_t>(std::numeric_limits<int>::max()) ||
        !event.ParseFromArray(data, static_cast<int>(size))) {
      throw Error(detail::str_cat("the ", size, "-byte event does not parse"));
    }
    on_event(event);
  });
}
#endif

}  // namespace

bool tensorboard_available() {
#if MT_WITH_TENSORBOARD
  return true;
#else
  return false;
#endif
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resume_step) {
#if MT_WITH_TENSORBOARD
  MT_CHECK(resume_step >= 0, "TensorBoardWriter: resume_step must be >= 0, got ", resume_step);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) detail::fail_file(dir, "cannot create the TensorBoard directory: ", ec.message());

  static std::atomic<int64_t> counter{0};
  const std::string name = detail::str_cat(kFilePrefix, file_seconds(dir), ".", hostname(), ".",
                                           static_cast<long>(::getpid()), ".", counter++);
  path_ = (std::filesystem::path(dir) / name).string();
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) detail::fail_file(path_, "cannot create the TensorBoard event file: ", std::strerror(errno));
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    detail::fail_file(path_, "cannot open the TensorBoard event file: ", std::strerror(err));
  }

  const double now = unix_now();
  proto::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  write_record(serialize(version));
  if (resume_step > 0) {
    proto::Event start;
    start.set_wall_time(now);
    start.set_step(resume_step);
    start.mutable_session_log()->set_status(proto::SessionLog::START);
    write_record(serialize(start));
  }
  flush();
#else
  (void)dir;
  (void)resume_step;
  throw Error(kNeedProtobuf);
#endif
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
#if MT_WITH_TENSORBOARD
  proto::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  proto::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_record(serialize(event));
#else
  (void)tag;
  (void)value;
  (void)step;
  (void)wall_time;
  throw Error(kNeedProtobuf);
#endif
}

void TensorBoardWriter::write_record(const std::string& data) {
  MT_CHECK_T(FileError, file_ != nullptr, path_, ": the TensorBoard event file is already closed");
  unsigned char header[kHeaderBytes];
  store_le(header, data.size(), 8);
  store_le(header + 8, masked_crc32c(header, 8), 4);
  unsigned char footer[kFooterBytes];
  store_le(footer, masked_crc32c(data.data(), data.size()), 4);
  if (std::fwrite(header, 1, sizeof(header), file_) != sizeof(header) ||
      std::fwrite(data.data(), 1, data.size(), file_) != data.size() ||
      std::fwrite(footer, 1, sizeof(footer), file_) != sizeof(footer)) {
    detail::fail_file(path_, "cannot write the TensorBoard event file: ", std::strerror(errno));
  }
}

void TensorBoardWriter::flush() {
  if (file_ == nullptr) return;
  if (std::fflush(file_) != 0) {
    detail::fail_file(path_, "cannot write the TensorBoard event file: ", std::strerror(errno));
  }
}

void TensorBoardWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* f = std::exchange(file_, nullptr);
  const bool flushed = std::fflush(f) == 0;
  int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (flushed) err = errno;
  if (!flushed || !closed) {
    detail::fail_file(path_, "cannot write the TensorBoard event file: ", std::strerror(err));
  }
}

std::vector<ScalarEvent> read_tensorboard_scalars(const std::string& path) {
#if MT_WITH_TENSORBOARD
  std::vector<ScalarEvent> scalars;
  for_each_event(path, [&](const proto::Event& event) {
    if (!event.has_summary()) return;
    for (const proto::Summary::Value& v : event.summary().value()) {
      if (v.has_simple_value()) scalars.push_back({v.tag(), event.step(), event.wall_time(), v.simple_value()});
    }
  });
  return scalars;
#else
  (void)path;
  throw Error(kNeedProtobuf);
#endif
}

std::vector<int64_t> read_tensorboard_start_steps(const std::string& path) {
#if MT_WITH_TENSORBOARD
  std::vector<int64_t> steps;
  for_each_event(path, [&](const proto::Event& event) {
    if (event.has_session_log() && event.session_log().status() == proto::SessionLog::START) {
      steps.push_back(event.step());
    }
  });
  return steps;
#else
  (void)path;
  throw Error(kNeedProtobuf);
#endif
}

}  // namespace mt::train
