#include "graphtrain/output_capture.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "graphtrain/error.h"
#include "graphtrain/log.h"

namespace graphtrain {
namespace {

std::mutex g_capture_mutex;
bool g_capture_active = false;

// Lines that native libraries print during capture and graph building and that never need a
// user's action: each is a list of fragments a line must all contain (after an optional prefix).
struct NoisePattern {
  const char* prefix;                  // the trimmed line starts with this ("" for any)
  std::vector<const char*> fragments;  // and contains all of these
};

const std::vector<NoisePattern>& noise_patterns() {
  static const std::vector<NoisePattern> patterns = {
      {"", {"torch._dynamo", "hit config.recompile_limit"}},      // dynamo chatter
      {"W", {"torch/_export/"}},                                  // glog-style export notes
      {"", {"TracerWarning: Converting a tensor to a Python "}},  // tracer hints
      {"", {"UserWarning: TypedStorage is deprecated"}},
      {"", {"Using a non-full backward hook when the forward contains"}},
      {"", {"_export/non_strict_utils.py"}},
      {"warnings.warn(", {}},        // the echo of a warn call
      {"", {"[graphtrain-noise]"}},  // tests mark lines this way
  };
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
  std::string_view t = line;
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  if (t.empty()) return true;  // blank lines
  for (const auto& p : noise_patterns()) {
    if (t.substr(0, std::char_traits<char>::length(p.prefix)) != p.prefix) continue;
    bool all = true;
    for (const char* f : p.fragments) all = all && t.find(f) != std::string_view::npos;
    if (all) return true;
  }
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
