#include "core/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/view.h"

// The data section is copied byte for byte into tensors, which hold host-order elements.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace mt {
namespace {

// Note [safetensors validation]
// A file is checked completely before any tensor is made from it, as the reference
// implementation (safetensors/src/tensor.rs) does: the header length is within the file and
// under kMaxHeaderBytes; the header is a well-formed JSON object with no duplicate keys (the
// JSON parser would keep the last one silently, so a callback watches for them); every entry
// has exactly dtype (a known name), shape (non-negative integers) and data_offsets (two
// non-negative integers, begin <= end) and a byte size equal to end - begin; and the entries,
// ordered by offset, cover the data section exactly: no overlap, no gap, nothing after the
// last. JSON objects are unordered, so "sorted" means the ranges form one sequence.
// Two limits keep a hostile header from crashing the reader rather than failing it: the
// nesting depth (a valid header nests 3 levels; the parser does not recurse, but dump(),
// which prints a bad value into the message, recurses once per level), and, for an empty
// tensor, the product of its non-zero dimensions (its strides are built from it, in int64_t).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr int kMaxHeaderDepth = 64;
constexpr const char* kMetadataKey = "__metadata__";

using json = nlohmann::json;

using detail::fail_file;

std::string errno_text(int err) { return std::strerror(err); }

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::f64, "F64"},        {DType::f32, "F32"},        {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::i64, "I64"},        {DType::i32, "I32"},        {DType::u8, "U8"},   {DType::boolean, "BOOL"},
    {DType::f8e4m3, "F8_E4M3"}, {DType::f8e5m2, "F8_E5M2"},
};

const char* safetensors_name(DType dtype) {
  for (const auto& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  MT_INTERNAL_ASSERT(false, "safetensors: no name for dtype ", dtype_name(dtype));
  return "";
}

bool parse_safetensors_dtype(const std::string& name, DType* out) {
  for (const auto& d : kDTypeNames) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------- reading

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Parses the header, remembering the first duplicate key (nlohmann::json keeps the last silently).
json parse_header(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string top_key;                      // the tensor entry being parsed
  std::string duplicate;
  json::parser_callback_t watch = [&](int depth, json::parse_event_t event, json& parsed) {
    const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= kMaxHeaderDepth) {
      fail_file(path, "safetensors header nests deeper than ", kMaxHeaderDepth, " levels (a valid header nests 3)");
    }
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!keys.back().insert(key).second && duplicate.empty()) {
        duplicate = keys.size() == 1 ? detail::str_cat("tensor name '", key, "' appears twice in the header")
                                     : detail::str_cat("key '", key, "' appears twice in the entry '", top_key, "'");
      }
      if (keys.size() == 1) top_key = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, watch);
  } catch (const json::exception& e) {
    fail_file(path, "safetensors header is not valid JSON: ", e.what());
  }
  if (!duplicate.empty()) fail_file(path, "safetensors header: ", duplicate);
  if (!header.is_object())
    fail_file(path, "safetensors header is not a JSON object (it is a ", header.type_name(), ")");
  return header;
}

// A non-negative JSON integer; false for anything else (floats, strings, negative numbers).
bool as_unsigned(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// A non-empty tensor's element count is bounded by its bytes in the file; an empty one's
// non-zero dimensions are bounded by nothing else.
void check_empty_extent(const std::string& path, const std::string& where, const Shape& shape) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t extent = 1;
  for (int64_t d : shape) {
    const auto dim = static_cast<uint64_t>(d);
    if (dim > 1 && extent > kMax / dim) {
      fail_file(path, where, ": empty tensor of shape ", shape_str(shape),
                " is too large: its non-zero dimensions multiply to more than 2^63 - 1");
    }
    extent *= std::max<uint64_t>(dim, 1);
  }
}

Entry parse_entry(const std::string& path, const std::string& name, const json& j, uint64_t data_bytes) {
  const std::string where = detail::str_cat("tensor '", name, "'");
  if (!j.is_object()) fail_file(path, where, ": entry is not a JSON object (it is a ", j.type_name(), ")");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(field)) fail_file(path, where, ": missing \"", field, "\"");
  }
  for (const auto& item : j.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      fail_file(path, where, ": unexpected key \"", item.key(), "\"");
    }
  }
  Entry e;
  e.name = name;

  const json& dtype = j.at("dtype");
  if (!dtype.is_string()) fail_file(path, where, ": \"dtype\" must be a string, got ", dtype.dump());
  if (!parse_safetensors_dtype(dtype.get<std::string>(), &e.dtype)) {
    fail_file(path, where, ": unknown dtype \"", dtype.get<std::string>(),
              "\" (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 U8 BOOL)");
  }

  const json& shape = j.at("shape");
  if (!shape.is_array()) fail_file(path, where, ": \"shape\" must be an array of integers, got ", shape.dump());
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    fail_file(path, where, ": shape ", shape.dump(), " has ", shape.size(), " dimensions; at most ", kMaxDims,
              " are supported");
  }
  uint64_t nbytes = element_size(e.dtype);
  bool overflow = false;
  for (const json& d : shape) {
    if (!d.is_number_integer()) fail_file(path, where, ": \"shape\" must be an array of integers, got ", shape.dump());
    uint64_t dim = 0;
    if (!as_unsigned(d, &dim)) fail_file(path, where, ": negative dimension ", d.dump(), " in shape ", shape.dump());
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail_file(path, where, ": dimension ", d.dump(), " is too large");
    }
    e.shape.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && nbytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
    nbytes *= dim;
  }
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {  // an empty tensor: no bytes whatever
    check_empty_extent(path, where, e.shape);
    overflow = false;
    nbytes = 0;
  }

  const json& offsets = j.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !as_unsigned(offsets[0], &e.begin) ||
      !as_unsigned(offsets[1], &e.end)) {
    fail_file(path, where, ": \"data_offsets\" must be [begin, end] with non-negative integers, got ", offsets.dump());
  }
  if (e.begin > e.end) {
    fail_file(path, where, ": data_offsets [", e.begin, ", ", e.end, "] are reversed (begin > end)");
  }
  if (e.end > data_bytes) {
    fail_file(path, where, ": data_offsets [", e.begin, ", ", e.end, "] are out of the data section, which holds ",
              data_bytes, " bytes");
  }
  if (overflow || nbytes != e.end - e.begin) {
    fail_file(path, where, ": shape ", shape_str(e.shape), " of ", dtype_name(e.dtype), " needs ",
              overflow ? std::string("more than 2^64") : std::to_string(nbytes), " bytes but data_offsets [", e.begin,
              ", ", e.end, "] hold ", e.end - e.begin, " bytes");
  }
  return e;
}

// The ranges, ordered by offset, must tile [0, data_bytes) exactly.
void check_coverage(const std::string& path, std::vector<Entry>& entries, uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      fail_file(path, "tensors '", previous->name, "' (data_offsets [", previous->begin, ", ", previous->end,
                "]) and '", e.name, "' (data_offsets [", e.begin, ", ", e.end, "]) overlap in the data section");
    }
    if (e.begin > covered) {
      if (previous == nullptr) {
        fail_file(path, "gap in the data section: bytes [0, ", e.begin, ") before the first tensor '", e.name,
                  "' belong to no tensor");
      }
      fail_file(path, "gap in the data section: bytes [", covered, ", ", e.begin, ") between tensors '", previous->name,
                "' and '", e.name, "' belong to no tensor");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes) {
    if (previous == nullptr)
      fail_file(path, "the data section holds ", data_bytes, " bytes but the header has no tensors");
    fail_file(path, "gap in the data section: bytes [", covered, ", ", data_bytes, ") after the last tensor '",
              previous->name, "' belong to no tensor");
  }
}

void read_exact(std::ifstream& in, const std::string& path, uint64_t offset, void* dst, uint64_t n,
                const std::string& what) {
  if (n == 0) return;
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (!in || static_cast<uint64_t>(in.gcount()) != n) {
    const int err = errno;
    fail_file(path, "cannot read ", what, " (", n, " bytes at offset ", offset,
              "): ", err ? errno_text(err) : std::string("unexpected end of file"));
  }
}

// A safetensors file opened and its header validated: the stream, the entries, the metadata.
struct OpenedFile {
  std::ifstream in;
  uint64_t data_start = 0;
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

OpenedFile open_safetensors(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_file(path, "cannot open safetensors file: ", errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail_file(path, "cannot open safetensors file: not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  errno = 0;
  OpenedFile out;
  std::ifstream& in = out.in;
  in.open(path, std::ios::binary);
  if (!in) fail_file(path, "cannot open safetensors file: ", errno_text(errno));

  if (file_bytes < 8) {
    fail_file(path, "file is ", file_bytes, " bytes, shorter than the 8-byte header length of a safetensors file");
  }
  unsigned char prefix[8];
  read_exact(in, path, 0, prefix, 8, "the header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | prefix[i];
  if (header_bytes > kMaxHeaderBytes) {
    fail_file(path, "safetensors header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  }
  if (header_bytes > file_bytes - 8) {
    fail_file(path, "safetensors header length ", header_bytes, " is larger than the ", file_bytes - 8,
              " bytes after the length field");
  }
  std::string text(header_bytes, '\0');
  read_exact(in, path, 8, text.data(), header_bytes, "the header");
  out.data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - out.data_start;

  const json header = parse_header(path, text);
  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey) {
      if (!item.value().is_object()) {
        fail_file(path, "\"__metadata__\" must be an object of strings, got ", item.value().type_name());
      }
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string()) {
          fail_file(path, "\"__metadata__\" value of key '", m.key(), "' must be a string, got ", m.value().dump());
        }
        out.metadata.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, item.key(), item.value(), data_bytes));
  }
  check_coverage(path, out.entries, data_bytes);
  return out;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path, Device device) {
  OpenedFile file = open_safetensors(path);
  SafetensorsFile out;
  out.metadata = std::move(file.metadata);
  for (const Entry& e : file.entries) {
    Tensor t = empty(e.shape, TensorOptions().dtype(e.dtype));
    read_exact(file.in, path, file.data_start + e.begin, t.data_ptr(), t.nbytes(),
               detail::str_cat("tensor '", e.name, "'"));
    if (e.dtype == DType::boolean) {
      const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (bytes[i] > 1) {
          fail_file(path, "tensor '", e.name, "' (BOOL) holds byte ", static_cast<int>(bytes[i]), " at element ", i,
                    "; BOOL bytes must be 0 or 1");
        }
      }
    }
    out.tensors.emplace(e.name, device == kCPU ? t : raw::to(t, device));
  }
  return out;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  OpenedFile file = open_safetensors(path);
  SafetensorsHeader out;
  out.metadata = std::move(file.metadata);
  for (const Entry& e : file.entries) out.tensors.emplace(e.name, std::make_pair(e.dtype, e.shape));
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything that can be checked is checked before the filesystem is touched.
  std::vector<std::pair<std::string, Tensor>> host;  // contiguous CPU copies, in name order
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail_file(path, "cannot save safetensors file: a tensor has an empty name");
    if (name == kMetadataKey) fail_file(path, "cannot save safetensors file: \"__metadata__\" is reserved");
    if (!t.defined()) fail_file(path, "cannot save safetensors file: tensor '", name, "' is undefined");
    Tensor c = raw::to(raw::contiguous(t), kCPU);
    header[name] = {
        {"dtype", safetensors_name(c.dtype())}, {"shape", c.shape()}, {"data_offsets", {offset, offset + c.nbytes()}}};
    offset += c.nbytes();
    host.emplace_back(name, std::move(c));
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    fail_file(path, "cannot save safetensors file: a tensor name or metadata string is not valid UTF-8 (", e.what(),
              ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // as the reference does: data starts 8-byte aligned
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  write_file_atomically(path, "safetensors file", [&](const ChunkWriter& write) {
    write(prefix, sizeof(prefix));
    write(text.data(), text.size());
    for (const auto& [name, t] : host) write(t.data_ptr(), t.nbytes());
  });
}

}  // namespace mt
