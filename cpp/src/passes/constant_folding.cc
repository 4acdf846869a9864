// Pass constant_folding: a node whose inputs are all small constants (initializers or Constant
// nodes) is run once, now, by its own kernel, and its output becomes an initializer. The gradient
// builder makes such nodes (Pow's gradient computes the exponent p - 1); folding them lets later
// passes see plain constants. Callback nodes and random ops are never folded. evaluate_constant
// runs the same kernels on a value's constant subgraph for a pass that asks, changing nothing.
#include <cstring>

#include "graphtrain/callback.h"
#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "graphtrain/thread_pool.h"

namespace graphtrain {
namespace {

// Elements above which a constant input or output is not folded: folding is for scalars and
// small shape-like tensors, not for materializing large tensors in the graph.
constexpr int64_t kMaxElements = 4096;

bool foldable_op(const Node& n) {
  if (is_callback_op(n) || n.inputs().empty()) return false;
  for (const char* random : {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike",
                             "RandomUniformLike", "Bernoulli", "Multinomial"})
    if (n.op_type == random) return false;
  return true;
}

// Runs n's kernel on constant inputs; an undefined tensor where it has none or fails.
Tensor run_on_constants(const Node& n, const std::vector<const Tensor*>& ins) {
  const KernelDef* any = find_any_kernel(n.domain, n.op_type, "cpu");
  if (!any) return {};
  DType dtype = any->type_input < ins.size() && ins[any->type_input] ? ins[any->type_input]->dtype()
                                                                     : DType::kUndefined;
  const KernelDef* def = find_kernel(n.domain, n.op_type, "cpu", dtype);
  if (!def) return {};
  Tensor result;
  try {
    std::unique_ptr<OpKernel> kernel = def->factory(n);
    KernelContext ctx(n, ins, {&result}, ThreadPool::global());
    kernel->compute(ctx);
  } catch (const std::exception&) {
    return {};  // the node fails at run time as it would have without folding
  }
  return result;
}

std::optional<Tensor> evaluate(const Value* v, int64_t max_elements, int depth) {
  if (const Tensor* t = constant_value(v)) {
    if (!t->defined() || t->numel() > max_elements) return std::nullopt;
    return *t;
  }
  const Node* n = v->producer();
  if (!n || depth > 32 || !foldable_op(*n) || n->outputs().size() != 1) return std::nullopt;
  std::vector<Tensor> held;
  held.reserve(n->inputs().size());
  std::vector<const Tensor*> ins;
  for (const Value* in : n->inputs()) {
    if (!in) {
      ins.push_back(nullptr);
      continue;
    }
    std::optional<Tensor> t = evaluate(in, max_elements, depth + 1);
    if (!t) return std::nullopt;
    held.push_back(*t);
    ins.push_back(&held.back());
  }
  Tensor result = run_on_constants(*n, ins);
  if (!result.defined() || result.numel() > max_elements) return std::nullopt;
  return result.clone();
}

}  // namespace

std::optional<Tensor> evaluate_constant(const Value* v, int64_t max_elements) {
  return v ? evaluate(v, max_elements, 0) : std::nullopt;
}

size_t fold_constants(Graph& graph) {
  size_t folded = 0;
  const auto& outputs = graph.outputs();
  for (Node* n : graph.topological_order()) {
    if (!foldable_op(*n) || n->outputs().size() != 1 || !n->output(0)) continue;
    Value* out = n->output(0);
    if (std::find(outputs.begin(), outputs.end(), out) != outputs.end()) continue;
    std::vector<const Tensor*> ins;
    bool all_constant = true;
    for (Value* in : n->inputs()) {
      const Tensor* t = in ? constant_value(in) : nullptr;
      all_constant &= !in || (t && t->defined() && t->numel() <= kMaxElements);
      ins.push_back(t);
    }
    if (!all_constant) continue;
    Tensor result = run_on_constants(*n, ins);
    if (!result.defined() || result.numel() > kMaxElements) continue;
    // The initializer owns its data (a kernel may have returned a view of its input).
    Value* v = graph.add_initializer(graph.unique_name(out->name() + "_folded"), result.clone());
    graph.replace_all_uses(out, v);
    graph.remove_node(n);
    ++folded;
  }
  return folded;
}

}  // namespace graphtrain
