#include "graphtrain/session.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "core/denormals.h"
#include "graphtrain/error.h"
#include "graphtrain/log.h"
#include "graphtrain/onnx_io.h"
#include "graphtrain/ops.h"
#include "graphtrain/options.h"
#include "graphtrain/passes.h"
#include "graphtrain/profiler.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"
#include "graphtrain/verifier.h"
#include "run_memory.h"

namespace graphtrain {

struct Session::Plan {
  struct Step {
    Node* node;
    std::vector<int> in;       // slot per input, -1 when absent
    std::vector<int> out;      // slot per output, -1 when not requested
    std::vector<int> release;  // slots whose last reader is this step
    size_t type_input = 0;
    DType kernel_dtype = DType::kUndefined;
    std::unique_ptr<OpKernel> kernel;
    const KernelDef* def = nullptr;
  };
  std::vector<Step> steps;
  size_t num_slots = 0;
  std::vector<int> input_slots;
  std::vector<int> output_slots;
  std::vector<std::pair<int, Tensor>> constants;
  SessionMemory memory;
  // GRAPHTRAIN_DISABLE_PASSES=memory_plan, or the compute optimizer off: every output allocated.
  bool plan_memory = true;
  bool memory_reported = false;  // planning off: the first run reported its memory
};

namespace {

std::string list_ops(const std::vector<std::string>& ops) {
  std::string out;
  for (size_t i = 0; i < ops.size(); ++i) out += (i ? ", " : "") + ops[i];
  return out;
}

// `order` with each Shape / Size node moved up to just after the node that makes its input (to the
// front for a graph input): it reads no data, so it should not keep a buffer alive until it runs
// (a backward's Shape of the logits, sorted after the loss, kept 4 MB of them past the loss and
// its in-place gradient). Every other node keeps its place.
std::vector<Node*> metadata_reads_first(const std::vector<Node*>& order) {
  auto metadata_only = [](const Node* n) {
    return n->domain.empty() && (n->op_type == "Shape" || n->op_type == "Size") &&
           n->inputs().size() == 1 && n->input(0);
  };
  std::unordered_map<const Node*, std::vector<Node*>> after;  // producer -> its Shape readers
  std::vector<Node*> out, first;
  for (Node* n : order)
    if (metadata_only(n))
      (n->input(0)->producer() ? after[n->input(0)->producer()] : first).push_back(n);
  std::vector<Node*> pending;
  auto emit = [&](Node* n) {
    pending.push_back(n);
    while (!pending.empty()) {
      Node* m = pending.back();
      pending.pop_back();
      out.push_back(m);
      auto it = after.find(m);
      if (it == after.end()) continue;
      for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) pending.push_back(*r);
    }
  };
  for (Node* n : first) emit(n);
  for (Node* n : order)
    if (!metadata_only(n)) emit(n);
  return out;
}

}  // namespace

Session::Session(const std::string& onnx_path, SessionOptions options)
    : Session(load_onnx(onnx_path), std::move(options)) {}

Session::Session(Graph graph, SessionOptions options)
    : graph_(std::move(graph)), options_(std::move(options)), plan_(std::make_unique<Plan>()) {
  verify(graph_);
  infer_shapes(graph_);
  Plan& plan = *plan_;
  plan.plan_memory = pass_enabled(kMemoryPlanPass);
  std::unordered_map<const Value*, int> slot;
  auto slot_of = [&](const Value* v) {
    auto [it, inserted] = slot.emplace(v, static_cast<int>(slot.size()));
    return it->second;
  };
  for (Value* v : graph_.inputs()) plan.input_slots.push_back(slot_of(v));
  for (Value* v : graph_.initializers()) plan.constants.emplace_back(slot_of(v), v->initializer);

  std::vector<Node*> order = metadata_reads_first(graph_.topological_order());
  std::unordered_map<int, size_t> last_use;
  for (Node* node : order) {
    Plan::Step step;
    step.node = node;
    const KernelDef* any = find_any_kernel(node->domain, node->op_type, options_.device);
    if (!any) {
      throw GraphError(
          "graph '" + graph_.name + "': " + node->describe() + ": op " + node->qualified_op() +
          " has no " + options_.device +
          " kernel in graphtrain. Supported ops: " + list_ops(registered_ops(options_.device)));
    }
    step.type_input = any->type_input;
    for (Value* in : node->inputs()) {
      int s = in ? slot_of(in) : -1;
      step.in.push_back(s);
      if (s >= 0) last_use[s] = plan.steps.size();
    }
    for (Value* out : node->outputs()) step.out.push_back(out ? slot_of(out) : -1);
    plan.steps.push_back(std::move(step));
  }
  for (Value* v : graph_.outputs()) plan.output_slots.push_back(slot_of(v));
  plan.num_slots = slot.size();

  std::vector<bool> keep(plan.num_slots, false);
  for (int s : plan.output_slots) keep[static_cast<size_t>(s)] = true;
  for (auto& [s, t] : plan.constants) keep[static_cast<size_t>(s)] = true;
  for (auto [s, step] : last_use)
    if (!keep[static_cast<size_t>(s)]) plan.steps[step].release.push_back(s);
}

Session::~Session() = default;

const MemoryPlan* Session::memory_plan() const {
  auto it = plan_->memory.bindings.find(plan_->memory.last);
  return it == plan_->memory.bindings.end() ? nullptr : &it->second.plan;
}

std::vector<std::string> Session::input_names() const {
  std::vector<std::string> out;
  for (Value* v : graph_.inputs()) out.push_back(v->name());
  return out;
}

std::vector<std::string> Session::output_names() const {
  std::vector<std::string> out;
  for (Value* v : graph_.outputs()) out.push_back(v->name());
  return out;
}

std::vector<Tensor> Session::run(const std::map<std::string, Tensor>& feeds) {
  std::vector<Tensor> inputs;
  for (Value* v : graph_.inputs()) {
    auto it = feeds.find(v->name());
    if (it == feeds.end())
      throw InputError("graph '" + graph_.name + "': input '" + v->name() + "' (" +
                       v->type.to_string() + ") was not given");
    inputs.push_back(it->second);
  }
  for (const auto& [name, t] : feeds) {
    bool known = false;
    for (Value* v : graph_.inputs()) known |= v->name() == name;
    if (!known)
      throw InputError("graph '" + graph_.name + "' has no input named '" + name +
                       "'; its inputs are: " + list_ops(input_names()));
  }
  return run(inputs);
}

std::vector<Tensor> Session::run(const std::vector<Tensor>& inputs) {
  return run(std::vector<Tensor>(inputs));
}

std::vector<Tensor> Session::run(std::vector<Tensor>&& inputs) {
  Plan& plan = *plan_;
  const auto& graph_inputs = graph_.inputs();
  if (inputs.size() != graph_inputs.size())
    throw InputError(str_cat("graph '", graph_.name, "' takes ", graph_inputs.size(), " inputs (",
                             list_ops(input_names()), "), got ", inputs.size()));
  // Check element types and bind symbolic dims, so a mismatch is named here, not deep in a kernel.
  std::map<std::string, int64_t> bindings;
  std::map<std::string, std::string> bound_by;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = graph_inputs[i];
    const Tensor& t = inputs[i];
    if (!t.defined()) throw InputError("input '" + v->name() + "' is an undefined tensor");
    if (v->type.dtype != DType::kUndefined && t.dtype() != v->type.dtype)
      throw InputError("input '" + v->name() + "' must be " + to_string(v->type.dtype) + ", got " +
                       t.describe());
    if (!v->type.shape) continue;
    const SymShape& shape = *v->type.shape;
    if (shape.size() != t.rank())
      throw InputError(str_cat("input '", v->name(), "' must have rank ", shape.size(), " (",
                               v->type.to_string(), "), got ", t.describe()));
    for (size_t d = 0; d < shape.size(); ++d) {
      const SymDim& dim = shape[d];
      if (auto c = dim.constant()) {
        if (*c != t.dim(d))
          throw InputError(str_cat("input '", v->name(), "' dim ", d, " must be ", *c, " (",
                                   v->type.to_string(), "), got ", t.describe()));
      } else if (dim.is_symbol()) {
        std::string sym = dim.to_string();
        auto [it, inserted] = bindings.emplace(sym, t.dim(d));
        if (inserted) {
          bound_by[sym] = v->name();
        } else if (it->second != t.dim(d)) {
          throw InputError(str_cat("input '", v->name(), "' dim ", d, " ('", sym, "') is ",
                                   t.dim(d), ", but input '", bound_by[sym], "' has '", sym,
                                   "' = ", it->second));
        }
      }
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = graph_inputs[i];
    if (!v->type.shape) continue;
    for (size_t d = 0; d < v->type.shape->size(); ++d) {
      auto want = (*v->type.shape)[d].evaluate(bindings);
      if (want && *want != inputs[i].dim(d))
        throw InputError(str_cat("input '", v->name(), "' dim ", d, " must be ",
                                 (*v->type.shape)[d].to_string(), " = ", *want, ", got ",
                                 inputs[i].describe()));
    }
  }

  // Declared before the slots, so that the run's tensors are gone when it returns the workspace.
  RunMemory memory(plan.memory, graph_.name, inputs, plan.steps.size(), plan.plan_memory);
  std::vector<Tensor> slots(plan.num_slots);
  for (size_t i = 0; i < inputs.size(); ++i)
    slots[static_cast<size_t>(plan.input_slots[i])] = std::move(inputs[i]);
  for (const auto& [s, t] : plan.constants) slots[static_cast<size_t>(s)] = t;
  ThreadPool& pool = options_.pool ? *options_.pool : ThreadPool::global();
  ThreadPool::Busy busy(pool);  // workers wait for the next kernel spinning, not asleep
  FlushDenormals flush;
  Profiler& profiler = Profiler::global();
  const bool tracing = profiler.active();
  const int64_t run_start = tracing ? profiler.now_ns() : 0;
  // GRAPHTRAIN_PRINT_MEMORY_STATS: the first run that follows a plan (or the first run, when
  // planning is off) reports the plan and measures the bytes the run's tensors hold at once.
  std::optional<MemoryPlan> report;
  if (Options::global().get_bool("print_memory_stats")) {
    if (const MemoryPlan* p = memory.plan_to_report()) report = *p;
  }
  const bool measure = report || (!plan.plan_memory && !plan.memory_reported &&
                                  Options::global().get_bool("print_memory_stats"));
  int64_t live_peak = 0;
  auto live_bytes = [&] {
    std::unordered_map<const Storage*, size_t> held;  // views share their storage: count once
    for (const Tensor& t : slots)
      if (t.defined() && t.storage()->owned()) held[t.storage().get()] = t.storage()->bytes();
    int64_t sum = static_cast<int64_t>(memory.workspace_bytes());  // the arena's tensors
    for (auto [storage, bytes] : held) sum += static_cast<int64_t>(bytes);
    return sum;
  };

  for (Plan::Step& step : plan.steps) {
    std::vector<const Tensor*> ins;
    ins.reserve(step.in.size());
    for (int s : step.in) ins.push_back(s >= 0 ? &slots[static_cast<size_t>(s)] : nullptr);
    std::vector<Tensor*> outs;
    outs.reserve(step.out.size());
    for (int s : step.out) outs.push_back(s >= 0 ? &slots[static_cast<size_t>(s)] : nullptr);
    DType dtype =
        step.type_input < ins.size() && ins[step.type_input] && ins[step.type_input]->defined()
            ? ins[step.type_input]->dtype()
            : DType::kUndefined;
    if (!step.kernel || dtype != step.kernel_dtype) {
      const KernelDef* def =
          find_kernel(step.node->domain, step.node->op_type, options_.device, dtype);
      if (!def) {
        std::vector<std::string> names;
        for (DType d : kernel_dtypes(step.node->domain, step.node->op_type, options_.device))
          names.push_back(to_string(d));
        throw Error(str_cat(step.node->describe(), ": no ", options_.device,
                            " kernel for element type ", to_string(dtype), " of input ",
                            step.type_input, "; supported: ", list_ops(names)));
      }
      step.kernel = def->factory(*step.node);
      step.kernel_dtype = dtype;
      step.def = def;
    }
    const size_t step_index = static_cast<size_t>(&step - plan.steps.data());
    memory.begin_step(step_index, *step.node, ins, step.def->inplace);
    if (tracing) {
      std::string shapes;
      for (size_t i = 0; i < ins.size(); ++i)
        shapes +=
            str_cat(i ? ", " : "", ins[i] && ins[i]->defined() ? shape_to_string(ins[i]->shape())
                                                               : std::string("-"));
      KernelContext ctx(*step.node, std::move(ins), std::move(outs), pool, &memory);
      int64_t t0 = profiler.now_ns();
      step.kernel->compute(ctx);
      profiler.record({step.node->qualified_op(), "kernel", graph_.name, step.node->name,
                       step.node->scope, std::move(shapes), t0, profiler.now_ns() - t0});
    } else {
      KernelContext ctx(*step.node, std::move(ins), std::move(outs), pool, &memory);
      step.kernel->compute(ctx);
    }
    if (measure) live_peak = std::max(live_peak, live_bytes());
    for (int s : step.release) slots[static_cast<size_t>(s)] = Tensor();
    memory.end_step();
  }

  if (tracing)
    profiler.record(
        {graph_.name, "graph", graph_.name, "", "", "", run_start, profiler.now_ns() - run_start});
  std::vector<Tensor> result;
  for (int s : plan.output_slots) result.push_back(slots[static_cast<size_t>(s)]);
  slots.clear();
  memory.finish();
  if (measure) {
    plan.memory_reported = true;
    MemoryStats m = memory_stats();
    std::string planned =
        report
            ? str_cat("planned: ", report->planned_bytes, " bytes of intermediates in an arena of ",
                      report->arena_bytes, " bytes (", report->inplace, " written in place), ",
                      report->outside_bytes, " bytes of outputs and stashed values apart; ")
            : std::string("no memory plan; ");
    GT_INFO("graph '", graph_.name, "': ", planned, "its tensors held at most ", live_peak,
            " bytes at once (outputs included); engine tensor memory now ", m.current_bytes,
            " bytes, peak ", m.peak_bytes, " bytes, ", m.cached_bytes,
            " bytes of freed blocks cached for reuse");
  }
  return result;
}

}  // namespace graphtrain
