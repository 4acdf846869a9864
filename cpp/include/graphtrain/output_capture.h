// Scoped capture of the process's stdout and stderr at the file-descriptor level, so output that
// native libraries print is caught too. Used around noisy phases (graph capture, graph building),
// never around the training step. On finish the descriptors are restored, every descriptor the
// capture opened is closed, the captured lines are filtered against known-useless patterns (nothing
// is filtered at VERBOSE) and what remains is re-emitted through the logger as one record.
//
// Descriptors are process-wide: while one capture is active, a capture started by another thread
// or nested inside it does not redirect again; its output lands in the active capture (or, once
// that one has finished, on the real streams). Nothing is ever lost or left redirected.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace graphtrain {

struct CapturedOutput {
  std::string phase;
  std::vector<std::string> kept;  // lines to show, in order
  size_t suppressed = 0;          // known-useless lines dropped
};

class OutputCapture {
 public:
  explicit OutputCapture(std::string phase);
  ~OutputCapture();  // finishes and emits, if finish() was not called
  OutputCapture(const OutputCapture&) = delete;
  OutputCapture& operator=(const OutputCapture&) = delete;

  // Restores the streams and returns the filtered lines; later calls return an empty result.
  CapturedOutput finish();
  // finish() and emit the result through the logger.
  void finish_and_emit();
  // Whether this capture redirected the descriptors (false when another capture was active).
  bool redirecting() const { return temp_fd_ >= 0; }

 private:
  std::string phase_;
  bool finished_ = false;
  int temp_fd_ = -1;
  int saved_fd_[2] = {-1, -1};
  bool was_open_[2] = {false, false};
};

// Whether a captured line matches the list of known-useless patterns.
bool is_known_noise(std::string_view line);

// Splits captured text into lines and filters them (unless `keep_all`).
CapturedOutput filter_captured(std::string phase, std::string_view text, bool keep_all);

// One record: WARNING with the kept lines when any remain, else DEVINFO with the count.
void emit_captured(const CapturedOutput& out);

}  // namespace graphtrain
