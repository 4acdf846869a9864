#include "graphtrain/output_capture.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <regex>

#include "graphtrain/error.h"
#include "graphtrain/log.h"

namespace graphtrain {
namespace {

std::mutex g_capture_mutex;
bool g_capture_active = false;

// Lines that native libraries print during capture and graph building and that never need a
// user's action. Each entry is an ECMAScript regex matched against the whole line.
const std::vector<std::regex>& noise_patterns() {
  static const std::vector<std::regex> patterns = [] {
    const char* sources[] = {
        R"(\s*)",                                                  // blank lines
        R"(.*torch\._dynamo.*\bhit config\.recompile_limit\b.*)",  // dynamo chatter
        R"(W\d{4} .*torch/_export/.*)",                            // glog-style export notes
        R"(.*TracerWarning: Converting a tensor to a Python .*)",  // tracer hints
        R"(.*UserWarning: TypedStorage is deprecated.*)",          // storage deprecation
        R"(.*Using a non-full backward hook when the forward contains.*)",
        R"(.*_export/non_strict_utils\.py.*)",
        R"(\s*warnings\.warn\(.*)",     // the echo of a warn call
        R"(.*\[graphtrain-noise\].*)",  // tests mark lines this way
    };
    std::vector<std::regex> out;
    for (const char* s : sources)
      out.emplace_back(s, std::regex::ECMAScript | std::regex::optimize);
    return out;
  }();
  return patterns;
}

int open_temp() {
  int fd = static_cast<int>(::memfd_create("graphtrain-capture", MFD_CLOEXEC));
  if (fd < 0) {
    const char* dir = std::getenv("TMPDIR");
    std::string path = std::string(dir && *dir ? dir : "/tmp") + "/graphtrain-capture-XXXXXX";
    fd = ::mkostemp(path.data(), O_CLOEXEC);
    if (fd < 0)
      throw Error("output capture: cannot create a temporary file in " + path + ": " +
                  std::strerror(errno));
    ::unlink(path.c_str());
  }
  // With stdout or stderr closed the new descriptor may be 1 or 2; move it out of their way.
  if (fd <= 2) {
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    ::close(fd);
    fd = high;
  }
  return fd;
}

std::string read_all(int fd) {
  std::string text;
  if (::lseek(fd, 0, SEEK_SET) < 0) return text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

bool is_known_noise(std::string_view line) {
  for (const auto& re : noise_patterns())
    if (std::regex_match(line.begin(), line.end(), re)) return true;
  return false;
}

CapturedOutput filter_captured(std::string phase, std::string_view text, bool keep_all) {
  CapturedOutput out;
  out.phase = std::move(phase);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!keep_all && is_known_noise(line))
      ++out.suppressed;
    else
      out.kept.emplace_back(line);
    start = end + 1;
  }
  return out;
}

void emit_captured(const CapturedOutput& out) {
  if (!out.kept.empty()) {
    std::string msg = str_cat(out.phase, ": native output (", out.kept.size(), " line(s) shown, ",
                              out.suppressed, " known-useless line(s) suppressed):");
    for (const auto& line : out.kept) msg += str_cat("\n  ", line);
    GT_WARNING(msg);
  } else if (out.suppressed > 0) {
    GT_DEVINFO(out.phase, ": ", out.suppressed,
               " known-useless line(s) of native output suppressed");
  }
}

OutputCapture::OutputCapture(std::string phase) : phase_(std::move(phase)) {
  std::lock_guard<std::mutex> lock(g_capture_mutex);
  if (g_capture_active) return;  // another capture holds the descriptors
  std::fflush(stdout);
  std::fflush(stderr);
  temp_fd_ = open_temp();
  for (int i = 0; i < 2; ++i) {
    int fd = i + 1;
    was_open_[i] = ::fcntl(fd, F_GETFD) != -1;
    if (was_open_[i]) saved_fd_[i] = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    ::dup2(temp_fd_, fd);
  }
  g_capture_active = true;
}

OutputCapture::~OutputCapture() {
  if (finished_) return;
  try {
    finish_and_emit();
  } catch (...) {
    // A destructor must not throw; the streams were restored by finish() before any emission.
  }
}

CapturedOutput OutputCapture::finish() {
  if (finished_) return CapturedOutput{phase_, {}, 0};
  finished_ = true;
  if (temp_fd_ < 0) return CapturedOutput{phase_, {}, 0};
  std::string text;
  {
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    std::fflush(stdout);
    std::fflush(stderr);
    for (int i = 0; i < 2; ++i) {
      int fd = i + 1;
      if (saved_fd_[i] >= 0) {
        ::dup2(saved_fd_[i], fd);
        ::close(saved_fd_[i]);
        saved_fd_[i] = -1;
      } else if (!was_open_[i]) {
        ::close(fd);  // it was closed before the capture: leave it closed
      }
    }
    text = read_all(temp_fd_);
    ::close(temp_fd_);
    temp_fd_ = -1;
    g_capture_active = false;
  }
  bool keep_all = Logger::global().level() == LogLevel::kVerbose;
  return filter_captured(phase_, text, keep_all);
}

void OutputCapture::finish_and_emit() {
  emit_captured(finish());
}

}  // namespace graphtrain
