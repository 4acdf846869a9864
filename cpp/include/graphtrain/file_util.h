// File helpers: whole-file reads and atomic writes (temporary file, fsync, rename).
#pragma once

#include <string>
#include <string_view>

namespace graphtrain {

// Throws ModelFileError naming the path and the system's reason.
std::string read_file(const std::string& path);
// Writes `data` to a temporary file in the same folder, flushes it to disk and renames it over
// `path`, so a crash leaves either the old file or the new one, never half of one.
void write_file_atomic(const std::string& path, std::string_view data);
std::string parent_dir(const std::string& path);
std::string file_name(const std::string& path);

}  // namespace graphtrain
