// Where a Session's kernels put their outputs during one run (memory_plan.h describes the plan).
//
// The first run for a binding of input shapes records: outputs are fresh tensors, and each one's
// size, lifetime (by its storage, so views count) and in-place chance are noted; what is still
// alive after the run (graph outputs, stashed values) or was handed to a callback node stays out
// of the plan, except that such a buffer written in place over a dying input takes over that
// input's storage (plan.takes: both allocated apart). plan_memory lays the rest out in an arena.
// Later runs with the same shapes place those outputs in a workspace arena shared by all sessions
// of the process (runs do not overlap it: each takes one from a pool). If a placed tensor is
// still held after the run, the workspace is left to its holder and the plan is recorded again.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "graphtrain/memory_plan.h"
#include "graphtrain/ops.h"

namespace graphtrain {

// A session's plans, one per binding of input shapes.
struct SessionMemory {
  struct Binding {
    std::vector<BufferUse> uses;
    std::vector<std::vector<int>> buffer_of;  // [step][output] -> index in uses, -1: none
    MemoryPlan plan;
    bool reported = false;
  };
  std::map<std::vector<int64_t>, Binding> bindings;
  std::vector<int64_t> last;  // the binding of the latest run
};

class RunMemory : public OutputAllocator {
 public:
  // `enabled` false: every output is a fresh tensor and nothing is recorded.
  RunMemory(SessionMemory& memory, const std::string& graph_name, const std::vector<Tensor>& inputs,
            size_t num_steps, bool enabled);
  ~RunMemory() override;
  RunMemory(const RunMemory&) = delete;
  RunMemory& operator=(const RunMemory&) = delete;

  // Before step `step` runs `node` on `inputs`; `inplace`: the kernel's declared pairs.
  void begin_step(size_t step, const Node& node, const std::vector<const Tensor*>& inputs,
                  const InPlaceRule& inplace);
  Tensor allocate(size_t output, DType dtype, Shape shape) override;
  // After the step's kernel ran and the values it read last were released.
  void end_step();
  // After the run, once only its results hold tensors: records the plan, or returns the workspace.
  void finish();

  // The plan this run followed, when it followed one (for GRAPHTRAIN_PRINT_MEMORY_STATS): null
  // when it recorded or planning is off, or when the plan was already reported.
  const MemoryPlan* plan_to_report();
  size_t workspace_bytes() const;

 private:
  enum class Mode { kOff, kRecord, kPlanned };
  void release_workspace();

  SessionMemory& memory_;
  std::string graph_name_;
  std::vector<int64_t> key_;
  Mode mode_ = Mode::kOff;
  size_t step_ = 0;
  size_t num_steps_ = 0;
  bool finished_ = false;
  // Record.
  SessionMemory::Binding record_;
  std::vector<std::weak_ptr<Storage>> storage_;          // per recorded buffer
  std::unordered_map<const Storage*, int> live_;         // storage -> buffer, while it lives
  std::vector<std::pair<size_t, int>> pending_inplace_;  // (output, buffer of its input)
  // Planned.
  SessionMemory::Binding* binding_ = nullptr;
  std::shared_ptr<Arena> workspace_;
  std::vector<bool> placed_;  // per buffer: placed in this run already
  // Per buffer: the storage of one allocated apart that a result will take over (plan.takes),
  // from its allocation to that result's.
  std::vector<std::shared_ptr<Storage>> lent_;
  size_t misses_ = 0;
};

}  // namespace graphtrain
