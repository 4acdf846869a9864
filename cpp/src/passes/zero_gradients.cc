// drop_zero_gradients: the backward graph of a call where some outputs' gradients are zero. torch
// passes None for an output nothing differentiates (a language model's logits returned beside its
// loss), and the backward graph, built for every float output, would add a zero tensor to the
// gradient that reaches the same value by another path (the logits: a [tokens, vocab] Add). Where
// a zero gradient input is added to a value of the sum's shape, the sum is that value; what then
// reads nothing is removed. The inputs stay, so the graph is fed as before. Not a pipeline pass:
// GraphModule makes such a graph per pattern of missing gradients, from the backward graph
// before its passes.
#include <unordered_set>

#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {

size_t drop_zero_gradients(Graph& graph, const std::vector<std::string>& zero_inputs) {
  std::unordered_set<const Value*> zero;
  for (const std::string& name : zero_inputs) zero.insert(graph.get(name));
  size_t dropped = 0;
  for (Node* n : graph.topological_order()) {
    if (!n->domain.empty() || n->outputs().size() != 1 || !n->output(0)) continue;
    Value* y = n->output(0);
    if (n->op_type == "Identity" && zero.count(n->input(0))) {
      zero.insert(y);
      continue;
    }
    if (n->op_type != "Add" || n->inputs().size() != 2 || is_graph_output(graph, y)) continue;
    for (size_t i = 0; i < 2; ++i) {
      Value* x = n->input(1 - i);
      if (!zero.count(n->input(i)) || !x || zero.count(x) || !x->type.shape || !y->type.shape ||
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
