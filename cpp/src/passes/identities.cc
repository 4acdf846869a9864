// Pass identities: Identity and StopGradient nodes pass their input on; after autodiff neither
// does anything (StopGradient only told the gradient builder where gradients stop), and a Concat of
// one input is its input (transformers' key/value cache concatenates a first step's keys to
// nothing). Their readers read the input directly. A node whose output is a graph output stays, so
// outputs keep their names and never alias a graph input; a one-input Concat there becomes an
// Identity, which hands its input on without the Concat's copy, where that input is a node's
// output no one else reads (so the graph output aliases no input and no other output).
#include <unordered_set>

#include "graphtrain/passes.h"

namespace graphtrain {

size_t eliminate_identities(Graph& graph) {
  std::unordered_set<const Value*> outputs(graph.outputs().begin(), graph.outputs().end());
  size_t removed = 0;
  for (Node* n : graph.topological_order()) {
    bool concat = n->op_type == "Concat" && n->domain.empty();
    bool identity = (n->op_type == "Identity" && n->domain.empty()) ||
                    (n->op_type == "StopGradient" && n->domain == kGraphtrainDomain) || concat;
    if (!identity || n->inputs().size() != 1 || !n->input(0)) continue;
    Value* out = n->output(0);
    if (!out) continue;
    if (outputs.count(out)) {
      // Only a value this Concat alone reads, made by a node: the output aliases nothing else.
      Value* in = n->input(0);
      if (!concat || !in->producer() || in->uses().size() != 1 || outputs.count(in)) continue;
      Node* id = graph.add_node("Identity", {in}, {""});
      id->scope = n->scope;
      graph.move_output(out, id, 0);
    } else {
      graph.replace_all_uses(out, n->input(0));
    }
    graph.remove_node(n);
    ++removed;
  }
  return removed;
}

}  // namespace graphtrain
