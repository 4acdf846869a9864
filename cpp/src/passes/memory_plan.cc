// The memory planner: lifetimes of a run's allocations -> offsets in one arena (memory_plan.h).
#include "graphtrain/memory_plan.h"

#include <algorithm>

namespace graphtrain {
namespace {

size_t round_up(size_t bytes) {
  return std::max<size_t>(kArenaAlignment,
                          (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment);
}

// Buffers that share bytes: a chain of in-place writes, each member dying where the next begins.
struct Group {
  size_t first = 0, last = 0, bytes = 0;
  int tail = -1;  // the member a further in-place output may take over
  int64_t offset = -1;
  int members = 1;
  bool apart = false;  // taken over by a buffer that outlives the run: allocated apart, with it
};

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferUse>& buffers) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), -1);
  plan.takes.assign(buffers.size(), -1);
  plan.lent.assign(buffers.size(), false);
  std::vector<int> group_of(buffers.size(), -1);
  std::vector<Group> groups;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const BufferUse& use = buffers[b];
    // The group of the dying input this buffer may be written over, where it is its last member.
    const int a = use.inplace_of;
    Group* from_group = nullptr;
    if (a >= 0 && static_cast<size_t>(a) < b && group_of[static_cast<size_t>(a)] >= 0) {
      Group& g = groups[static_cast<size_t>(group_of[static_cast<size_t>(a)])];
      const BufferUse& from = buffers[static_cast<size_t>(a)];
      if (g.tail == a && from.last_step == use.first_step && from.bytes == use.bytes)
        from_group = &g;
    }
    if (use.outside) {
      plan.outside_bytes += use.bytes;
      // A result written in place over a dying input (an elementwise kernel's output that is
      // stashed, a gradient summed into its last term): an input that shares no bytes with
      // another buffer leaves the arena, whose bytes are the next run's, and the result takes
      // over its storage.
      if (from_group && from_group->members == 1) {
        from_group->apart = true;
        from_group->tail = -1;
        plan.takes[b] = a;
        plan.lent[static_cast<size_t>(a)] = true;
        plan.planned_bytes -= buffers[static_cast<size_t>(a)].bytes;
        ++plan.inplace;
      }
      continue;
    }
    plan.planned_bytes += use.bytes;
    if (from_group) {
      from_group->last = std::max(from_group->last, use.last_step);
      from_group->tail = static_cast<int>(b);
      ++from_group->members;
      group_of[b] = group_of[static_cast<size_t>(a)];
      ++plan.inplace;
      continue;
    }
    group_of[b] = static_cast<int>(groups.size());
    groups.push_back({use.first_step, use.last_step, round_up(use.bytes), static_cast<int>(b)});
  }

  std::vector<size_t> order(groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return groups[x].bytes != groups[y].bytes ? groups[x].bytes > groups[y].bytes
                                              : groups[x].first < groups[y].first;
  });
  std::vector<size_t> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of the placed groups alive at once
  for (size_t gi : order) {
    Group& g = groups[gi];
    if (g.apart) continue;
    busy.clear();
    for (size_t pi : placed) {
      const Group& p = groups[pi];
      if (p.first <= g.last && g.first <= p.last)
        busy.emplace_back(static_cast<size_t>(p.offset), static_cast<size_t>(p.offset) + p.bytes);
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (lo >= offset + g.bytes) break;
      offset = std::max(offset, hi);
    }
    g.offset = static_cast<int64_t>(offset);
    plan.arena_bytes = std::max(plan.arena_bytes, offset + g.bytes);
    placed.push_back(gi);
  }
  for (size_t b = 0; b < buffers.size(); ++b)
    if (group_of[b] >= 0) plan.offsets[b] = groups[static_cast<size_t>(group_of[b])].offset;
  return plan;
}

}  // namespace graphtrain
