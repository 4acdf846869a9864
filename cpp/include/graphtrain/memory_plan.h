// Memory planning: the intermediates of a run laid out in one arena by their lifetimes.
//
// A Session records its first run for each binding of input shapes: every output a kernel
// allocates, its size, the step that made it and the last step that held it, whether it outlived
// the run (a graph output, a stashed value, anything handed outside), and where an in-place
// kernel could have written into an input that dies at that step. plan_memory turns that record
// into arena offsets: buffers whose lifetimes do not overlap share bytes, and an in-place output
// takes its input's bytes. Later runs with the same shapes place those outputs in the arena
// instead of allocating them (cpp/src/runtime/run_memory.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace graphtrain {

// One allocation of a run.
struct BufferUse {
  size_t bytes = 0;
  size_t first_step = 0;  // the step whose kernel allocated it
  size_t last_step = 0;   // the last step after which it was still held
  bool outside = false;   // outlived the run or was handed outside: not planned
  // An earlier buffer this one may share bytes with: that buffer dies at this buffer's first step
  // and the kernel declared that it may write this output over that input. -1: none.
  int inplace_of = -1;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // per buffer: byte offset in the arena, -1 when not planned
  size_t arena_bytes = 0;        // the arena's size
  size_t planned_bytes = 0;      // the planned buffers' sizes added up
  size_t inplace = 0;            // buffers placed over their input
  size_t outside_bytes = 0;      // bytes of the buffers left out of the arena
  // Per buffer left out of the arena that a kernel writes in place over a dying input (an output
  // or stashed value that takes over its input's bytes): that input's buffer, then allocated
  // apart too (the arena's bytes are the next run's). -1: none.
  std::vector<int> takes;
  std::vector<bool> lent;  // per buffer: some buffer takes it over
};

// Offsets are multiples of kArenaAlignment. Buffers whose [first_step, last_step] overlap get
// disjoint bytes, except a buffer placed in place over the one it names, which ends where it
// starts. A buffer that outlives the run takes over the one it names (`takes`) when that one is
// no other buffer's in-place input or output. Greedy by size: the largest buffers are placed first,
// each at the lowest offset that is free for its whole lifetime.
inline constexpr size_t kArenaAlignment = 64;
MemoryPlan plan_memory(const std::vector<BufferUse>& buffers);

}  // namespace graphtrain
