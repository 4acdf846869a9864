// drop_zero_gradients: the backward graph of a call where some outputs' gradients are zero. torch
// passes None for an output nothing differentiates (a language model's logits returned beside its
// loss, the keys and values a transformers model returns as its cache), and the backward graph,
// built for every float output, would carry that zero through the gradients of the ops that made
// the output (the cache's Transposes, Reshapes and Split) and add it to the gradient that reaches
// the same value by another path (the logits: a [tokens, vocab] Add). A value is known zero when it
// is such an input, or what a linear op makes of known zeros (a Transpose of one, a Concat of
// only zeros); a sum of a known zero and a value of the sum's shape is that value. What then reads
// nothing is removed. The inputs stay, so the graph is fed as before. Not a pipeline pass:
// GraphModule makes such a graph per pattern of missing gradients, from the backward graph before
// its passes.
#include <algorithm>
#include <unordered_set>

#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

// Ops whose outputs are all zero when their first input is (the others are shapes, axes, indices,
// or factors): ONNX's, and graphtrain's gradients of Slice and Gather and its Rotary.
bool zero_from_first_input(const Node& n) {
  static const std::unordered_set<std::string> onnx = {
      "Identity", "Transpose", "Reshape",   "Squeeze", "Unsqueeze", "Flatten", "Expand",
      "Slice",    "Split",     "ReduceSum", "Neg",     "Cast",      "Tile"};
  static const std::unordered_set<std::string> ours = {"SliceGrad", "GatherGrad", "Rotary"};
  return n.domain.empty() ? onnx.count(n.op_type) != 0
                          : n.domain == kGraphtrainDomain && ours.count(n.op_type) != 0;
}

}  // namespace

size_t drop_zero_gradients(Graph& graph, const std::vector<std::string>& zero_inputs) {
  std::unordered_set<const Value*> zero;
  for (const std::string& name : zero_inputs) zero.insert(graph.get(name));
  auto is_zero = [&](const Value* v) { return v && zero.count(v) != 0; };
  size_t dropped = 0;
  for (Node* n : graph.topological_order()) {
    if (n->inputs().empty()) continue;
    const auto& in = n->inputs();
    if (zero_from_first_input(*n) && is_zero(in[0])) {
      for (Value* y : n->outputs())
        if (y) zero.insert(y);
      continue;
    }
    if (!n->domain.empty()) continue;
    const std::string& op = n->op_type;
    bool all_zero = std::all_of(in.begin(), in.end(), is_zero);
    if (((op == "Concat" || op == "Add" || op == "Sub") && all_zero) ||
        (op == "Mul" && std::any_of(in.begin(), in.end(), is_zero))) {
      for (Value* y : n->outputs())
        if (y) zero.insert(y);
      continue;
    }
    Value* y = n->output(0);
    if (op != "Add" || in.size() != 2 || !y || is_graph_output(graph, y)) continue;
    for (size_t i = 0; i < 2; ++i) {
      Value* x = in[1 - i];
      if (!is_zero(in[i]) || !x || !x->type.shape || !y->type.shape ||
          *x->type.shape != *y->type.shape || x->type.dtype != y->type.dtype)
        continue;
      graph.replace_all_uses(y, x);
      ++dropped;
      break;
    }
  }
  if (dropped) eliminate_dead_nodes(graph);
  return dropped;
}

}  // namespace graphtrain
