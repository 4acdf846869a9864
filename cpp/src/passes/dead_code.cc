// Pass dead_code: removes nodes whose outputs nothing reads and that are no graph output.
// Callback nodes stay: they act outside the graph (hooks, user Functions).
#include <unordered_set>

#include "graphtrain/callback.h"
#include "graphtrain/passes.h"

namespace graphtrain {

size_t eliminate_dead_nodes(Graph& graph) {
  size_t removed = 0;
  std::unordered_set<const Value*> outputs(graph.outputs().begin(), graph.outputs().end());
  auto order = graph.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    bool used = is_callback_op(*n);
    for (Value* out : n->outputs())
      if (out && (!out->uses().empty() || outputs.count(out))) used = true;
    if (!used) {
      graph.remove_node(n);
      ++removed;
    }
  }
  return removed;
}

}  // namespace graphtrain
