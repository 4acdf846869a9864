#include "run_memory.h"

#include <algorithm>
#include <mutex>

#include "graphtrain/callback.h"
#include "graphtrain/log.h"

namespace graphtrain {
namespace {

constexpr size_t kMaxBindings = 8;

// Workspaces: arenas lent to runs. A run takes the smallest free one that is large enough; when
// none is, it frees the largest free one (too small) and makes one of its size, so one process
// training one model settles on one workspace of its largest graph's arena.
class WorkspacePool {
 public:
  std::shared_ptr<Arena> take(size_t bytes) {
    std::shared_ptr<Arena> drop;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if ((*it)->bytes() >= bytes && (best == free_.end() || (*it)->bytes() < (*best)->bytes()))
          best = it;
      if (best != free_.end()) {
        std::shared_ptr<Arena> a = std::move(*best);
        free_.erase(best);
        return a;
      }
      if (!free_.empty()) {
        auto largest =
            std::max_element(free_.begin(), free_.end(),
                             [](const auto& x, const auto& y) { return x->bytes() < y->bytes(); });
        drop = std::move(*largest);
        free_.erase(largest);
      }
    }
    drop.reset();
    release_cached_memory();
    return Arena::create(bytes);
  }

  void give(std::shared_ptr<Arena> arena) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(arena));
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<Arena>> free_;
};

WorkspacePool& workspaces() {
  static WorkspacePool* pool = new WorkspacePool();  // never destroyed: runs may outlive statics
  return *pool;
}

std::vector<int64_t> binding_key(const std::vector<Tensor>& inputs) {
  std::vector<int64_t> key;
  for (const Tensor& t : inputs) {
    key.push_back(static_cast<int64_t>(t.dtype()));
    key.push_back(static_cast<int64_t>(t.rank()));
    key.insert(key.end(), t.shape().begin(), t.shape().end());
  }
  return key;
}

}  // namespace

RunMemory::RunMemory(SessionMemory& memory, const std::string& graph_name,
                     const std::vector<Tensor>& inputs, size_t num_steps, bool enabled)
    : memory_(memory), graph_name_(graph_name), num_steps_(num_steps) {
  if (!enabled) return;
  key_ = binding_key(inputs);
  auto it = memory_.bindings.find(key_);
  if (it == memory_.bindings.end()) {
    mode_ = Mode::kRecord;
    record_.buffer_of.resize(num_steps);
    return;
  }
  mode_ = Mode::kPlanned;
  binding_ = &it->second;
  memory_.last = key_;
  placed_.assign(binding_->uses.size(), false);
  lent_.assign(binding_->uses.size(), nullptr);
  if (binding_->plan.arena_bytes > 0) workspace_ = workspaces().take(binding_->plan.arena_bytes);
}

RunMemory::~RunMemory() {
  if (!finished_) release_workspace();
}

void RunMemory::begin_step(size_t step, const Node& node, const std::vector<const Tensor*>& inputs,
                           const InPlaceRule& inplace) {
  step_ = step;
  if (mode_ != Mode::kRecord) return;
  pending_inplace_.clear();
  auto buffer_of = [&](const Tensor* t) {
    if (!t || !t->defined()) return -1;
    auto it = live_.find(t->storage().get());
    return it == live_.end() ? -1 : it->second;
  };
  // What a callback hands to the host may be kept there: such buffers are never planned.
  if (is_callback_op(node)) {
    for (const Tensor* t : inputs)
      if (int b = buffer_of(t); b >= 0) record_.uses[static_cast<size_t>(b)].outside = true;
    return;
  }
  if (!inplace) return;
  for (auto [out, in] : inplace(node)) {
    if (in >= inputs.size()) continue;
    const Tensor* t = inputs[in];
    int b = buffer_of(t);
    // The input must be its whole buffer, and another input reading the same buffer must read
    // the same elements.
    if (b < 0 || t->raw_data() != t->storage()->data() ||
        t->nbytes() != record_.uses[static_cast<size_t>(b)].bytes)
      continue;
    bool clean = true;
    for (const Tensor* other : inputs)
      if (other != t && buffer_of(other) == b)
        clean &= other->raw_data() == t->raw_data() && other->nbytes() == t->nbytes();
    if (clean) pending_inplace_.emplace_back(out, b);
  }
}

Tensor RunMemory::allocate(size_t output, DType dtype, Shape shape) {
  if (mode_ == Mode::kPlanned) {
    const auto& buffer_of = binding_->buffer_of;
    int b = step_ < buffer_of.size() && output < buffer_of[step_].size() ? buffer_of[step_][output]
                                                                         : -1;
    int64_t offset = b >= 0 ? binding_->plan.offsets[static_cast<size_t>(b)] : -1;
    if (offset >= 0) {
      size_t i = static_cast<size_t>(b);
      size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
      if (!placed_[i] && bytes == binding_->uses[i].bytes && workspace_) {
        placed_[i] = true;
        return workspace_->place(static_cast<size_t>(offset), dtype, std::move(shape));
      }
    }
    const std::vector<int>& takes = binding_->plan.takes;
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    if (b >= 0 && takes[static_cast<size_t>(b)] >= 0) {  // over the storage of a dying input
      std::shared_ptr<Storage> s =
          std::move(lent_[static_cast<size_t>(takes[static_cast<size_t>(b)])]);
      if (s && s->bytes() >= bytes && bytes == binding_->uses[static_cast<size_t>(b)].bytes)
        return Tensor::on_storage(std::move(s), dtype, std::move(shape));
      ++misses_;
      return Tensor::empty(dtype, std::move(shape));
    }
    if (b < 0 || offset >= 0) ++misses_;  // not what the recording run allocated here
    Tensor t = Tensor::empty(dtype, std::move(shape));
    if (b >= 0 && binding_->plan.lent[static_cast<size_t>(b)])
      lent_[static_cast<size_t>(b)] = t.storage();
    return t;
  }
  Tensor t = Tensor::empty(dtype, std::move(shape));
  if (mode_ != Mode::kRecord) return t;
  int b = static_cast<int>(record_.uses.size());
  BufferUse use;
  use.bytes = t.nbytes();
  use.first_step = use.last_step = step_;
  for (auto [out, in_buffer] : pending_inplace_)
    if (out == output) use.inplace_of = in_buffer;
  std::vector<int>& outs = record_.buffer_of[step_];
  if (outs.size() <= output) outs.resize(output + 1, -1);
  if (outs[output] >= 0) {  // allocated twice by one kernel: neither is planned
    record_.uses[static_cast<size_t>(outs[output])].outside = true;
    use.outside = true;
  }
  outs[output] = b;
  record_.uses.push_back(use);
  storage_.push_back(t.storage());
  live_[t.storage().get()] = b;
  return t;
}

void RunMemory::end_step() {
  if (mode_ != Mode::kRecord) return;
  for (auto it = live_.begin(); it != live_.end();) {
    size_t b = static_cast<size_t>(it->second);
    if (storage_[b].expired()) {
      record_.uses[b].last_step = step_;
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
}

void RunMemory::finish() {
  finished_ = true;
  if (mode_ == Mode::kPlanned) {
    release_workspace();
    if (misses_)
      GT_DEVINFO("graph '", graph_name_, "': ", misses_,
                 " outputs were not where the memory plan expected them; allocated apart");
    return;
  }
  if (mode_ != Mode::kRecord) return;
  for (auto [storage, b] : live_) {
    BufferUse& use = record_.uses[static_cast<size_t>(b)];
    if (storage_[static_cast<size_t>(b)].expired())  // read by nothing: freed with the run's slots
      use.last_step = num_steps_ ? num_steps_ - 1 : 0;
    else
      use.outside = true;  // a result, or held by something outside the run
  }
  live_.clear();
  storage_.clear();
  record_.plan = plan_memory(record_.uses);
  const MemoryPlan& p = record_.plan;
  GT_DEVINFO("graph '", graph_name_, "': memory plan: ", p.planned_bytes, " bytes of ",
             record_.uses.size(), " buffers in an arena of ", p.arena_bytes, " bytes (", p.inplace,
             " in place); ", p.outside_bytes, " bytes allocated apart");
  if (memory_.bindings.size() >= kMaxBindings) memory_.bindings.erase(memory_.bindings.begin());
  memory_.bindings[key_] = std::move(record_);
  memory_.last = key_;
}

void RunMemory::release_workspace() {
  if (!workspace_) return;
  if (workspace_.use_count() == 1) {
    workspaces().give(std::move(workspace_));
    return;
  }
  // A placed tensor outlived the run: its holder keeps this workspace; the next run records anew.
  GT_DEVINFO("graph '", graph_name_,
             "': a tensor of the memory plan is still held after the run; planning again");
  workspace_.reset();
  if (binding_) {
    memory_.bindings.erase(key_);
    binding_ = nullptr;
  }
}

const MemoryPlan* RunMemory::plan_to_report() {
  if (mode_ != Mode::kPlanned || !binding_ || binding_->reported) return nullptr;
  binding_->reported = true;
  return &binding_->plan;
}

size_t RunMemory::workspace_bytes() const {
  return workspace_ ? workspace_->bytes() : 0;
}

}  // namespace graphtrain
