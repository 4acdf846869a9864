// Pass constant_folding: a node whose inputs are all small constants (initializers or Constant
// nodes) is run once, now, by its own kernel, and its output becomes an initializer. The gradient
// builder makes such nodes (Pow's gradient computes the exponent p - 1); folding them lets later
// passes see plain constants. Callback nodes and random ops are never folded.
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

}  // namespace

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
    const KernelDef* any = find_any_kernel(n->domain, n->op_type, "cpu");
    if (!any) continue;
    DType dtype = any->type_input < ins.size() && ins[any->type_input]
                      ? ins[any->type_input]->dtype()
                      : DType::kUndefined;
    const KernelDef* def = find_kernel(n->domain, n->op_type, "cpu", dtype);
    if (!def) continue;
    Tensor result;
    try {
      std::unique_ptr<OpKernel> kernel = def->factory(*n);
      KernelContext ctx(*n, ins, {&result}, ThreadPool::global());
      kernel->compute(ctx);
    } catch (const std::exception&) {
      continue;  // the node fails at run time as it would have without folding
    }
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
