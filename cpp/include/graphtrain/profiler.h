// Kernel profiler. While on (option `profile`, GRAPHTRAIN_PROFILE=path.json, or start()), every
// kernel a Session runs is recorded with its op, node, module scope and input shapes, and every
// graph run as an enclosing span. The record is written as a Chrome trace (chrome://tracing,
// ui.perfetto.dev) to the option's path when the process exits, or by write().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace graphtrain {

struct ProfileEvent {
  std::string name;      // op ("MatMul", "graphtrain::AttentionGrad") or graph name for a run
  std::string category;  // "kernel" or "graph"
  std::string graph;     // the graph the kernel belongs to
  std::string node;      // node name
  std::string scope;     // module path, may be empty
  std::string shapes;    // input shapes, "[16, 64, 128], [128]"
  int64_t start_ns = 0;  // since the profiler's epoch
  int64_t duration_ns = 0;
};

struct ProfileRow {
  std::string key;  // op or module scope
  double ms = 0;    // total
  int64_t calls = 0;
};

class Profiler {
 public:
  static Profiler& global();

  // True while kernels are being recorded; a relaxed atomic read, cheap enough for every run.
  bool active() const;
  void start();
  void stop();
  void clear();
  int64_t now_ns() const;
  void record(ProfileEvent event);

  // Kernel time totals by op and by module scope (nodes without scope under "(no module)"),
  // largest first.
  std::vector<ProfileRow> by_op() const;
  std::vector<ProfileRow> by_module() const;
  size_t num_events() const;

  // The Chrome trace JSON of everything recorded.
  std::string chrome_trace() const;
  // Writes the trace atomically to `path`.
  void write(const std::string& path) const;
  // Writes to the `profile` option's path when it is set and something new was recorded.
  void flush();

  ~Profiler();

 private:
  Profiler();
  // Kernel time per key, largest first.
  std::vector<ProfileRow> totals(std::string (*key_of)(const ProfileEvent&)) const;
  struct State;
  State* state_;
};

}  // namespace graphtrain
