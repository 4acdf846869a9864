// Pass identities: Identity and StopGradient nodes pass their input on; after autodiff neither
// does anything (StopGradient only told the gradient builder where gradients stop). Their readers
// read the input directly. A node whose output is a graph output stays, so outputs keep their names
// and never alias a graph input.
#include <unordered_set>

#include "graphtrain/passes.h"

namespace graphtrain {

size_t eliminate_identities(Graph& graph) {
  std::unordered_set<const Value*> outputs(graph.outputs().begin(), graph.outputs().end());
  size_t removed = 0;
  for (Node* n : graph.topological_order()) {
    bool identity = (n->op_type == "Identity" && n->domain.empty()) ||
                    (n->op_type == "StopGradient" && n->domain == kGraphtrainDomain);
    if (!identity || n->inputs().size() != 1 || !n->input(0)) continue;
    Value* out = n->output(0);
    if (!out || outputs.count(out)) continue;
    graph.replace_all_uses(out, n->input(0));
    graph.remove_node(n);
    ++removed;
  }
  return removed;
}

}  // namespace graphtrain
