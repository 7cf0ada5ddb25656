#include "train/metrics.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "train/tensorboard.h"

namespace mt::train {

namespace {

// "%.17g" reads back bit for bit; JSON has no NaN or infinity.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

std::string json_string(const std::string& text) { return nlohmann::json(text).dump(); }

// Parses one line; throws FileError naming path:line.
MetricsRecord parse_line(const std::string& path, int64_t line_number, const std::string& line) {
  auto fail = [&](const std::string& what) { detail::fail_file(path, "line ", line_number, ": ", what); };
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("not JSON (") + e.what() + ")");
  }
  if (!object.is_object()) fail("expected a JSON object");
  if (!object.contains("step") || !object["step"].is_number_integer()) fail("no integer \"step\"");
  MetricsRecord record;
  record.step = object["step"].get<int64_t>();
  for (const auto& [key, value] : object.items()) {
    if (key == "step") continue;
    double number = std::numeric_limits<double>::quiet_NaN();
    if (value.is_number()) {
      number = value.get<double>();
    } else if (!value.is_null()) {
      fail("\"" + key + "\" is not a number");
    }
    if (key == "time") {
      record.time = number;
    } else {
      record.scalars[key] = number;
    }
  }
  return record;
}

// The complete lines of `path` (an unterminated last line dropped).
std::vector<std::string> complete_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::fail_file(path, "cannot open the metrics file (", std::strerror(errno), ")");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  return lines;
}

// Keeps the lines of steps <= resume_step, atomically; a missing file is a fresh one.
void truncate_after(const std::string& path, int64_t resume_step) {
  std::ifstream probe(path);
  if (!probe) return;
  probe.close();
  std::string kept;
  int64_t line_number = 0;
  for (const std::string& line : complete_lines(path)) {
    ++line_number;
    if (line.empty()) continue;
    if (parse_line(path, line_number, line).step <= resume_step) kept += line + "\n";
  }
  write_file_atomically(path, "metrics file", kept);
}

}  // namespace

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

MetricsLogger::MetricsLogger(const MetricsOptions& options, int64_t resume_step) : jsonl_path_(options.jsonl_path) {
  if (!jsonl_path_.empty()) {
    if (resume_step > 0) truncate_after(jsonl_path_, resume_step);
    jsonl_ = std::fopen(jsonl_path_.c_str(), resume_step > 0 ? "a" : "w");
    if (jsonl_ == nullptr) detail::fail_file(jsonl_path_, "cannot open for writing (", std::strerror(errno), ")");
  }
  if (!options.tensorboard_dir.empty()) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(options.tensorboard_dir, resume_step > 0 ? resume_step + 1 : 0);
  }
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

std::string MetricsLogger::tensorboard_file() const { return tensorboard_ ? tensorboard_->path() : std::string(); }

void MetricsLogger::log(int64_t step, double time, const Scalars& scalars) {
  if (jsonl_ != nullptr) {
    std::string line = "{\"step\":" + std::to_string(step) + ",\"time\":" + json_number(time);
    for (const auto& [name, value] : scalars) line += "," + json_string(name) + ":" + json_number(value);
    line += "}\n";
    if (std::fwrite(line.data(), 1, line.size(), jsonl_) != line.size() || std::fflush(jsonl_) != 0) {
      detail::fail_file(jsonl_path_, "cannot write a metrics line (", std::strerror(errno), ")");
    }
  }
  if (tensorboard_) {
    for (const auto& [name, value] : scalars) tensorboard_->add_scalar(name, value, step, time);
    tensorboard_->flush();
  }
}

std::vector<MetricsRecord> read_metrics_jsonl(const std::string& path) {
  std::vector<MetricsRecord> records;
  int64_t line_number = 0;
  for (const std::string& line : complete_lines(path)) {
    ++line_number;
    if (!line.empty()) records.push_back(parse_line(path, line_number, line));
  }
  return records;
}

}  // namespace mt::train
