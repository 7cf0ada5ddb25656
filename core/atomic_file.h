// Atomic file replacement: `path` holds either its old content or the complete new
// content, never a mixture, whatever happens during the write (a crash, a full disk,
// an exception from the producer).
//
// The content goes to a temporary file in the same directory ("<path>.tmp.<pid>"),
// which is flushed, fsynced, closed and renamed over `path`; then the directory is
// fsynced so the rename itself survives a power cut. On any failure the temporary
// file is removed and FileError is thrown, its message starting with `path` and
// naming the step that failed and the system's reason.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace mt {

// Appends n bytes to the file being written.
using ChunkWriter = std::function<void(const void* data, size_t n)>;

// Calls produce(write) once; whatever produce writes becomes the new content of `path`.
// `what` names the kind of file in error messages ("safetensors file", "token file").
void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(const ChunkWriter& write)>& produce);

// The same for content already in memory.
void write_file_atomically(const std::string& path, const std::string& what, const std::string& content);

}  // namespace mt
