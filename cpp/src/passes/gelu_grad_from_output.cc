// Pass gelu_grad_from_output: a GeluGrad whose forward GELU's output the backward graph reads
// anyway (the next Linear's weight gradient needs it) takes that output as a third input.
// GELU(x) = x Phi(x), so Phi(x) = y / x: the gradient no longer evaluates erf's tail (or, for the
// tanh form, the sigmoid's exponential). Nothing is stashed that was not already.
#include "graphtrain/passes.h"

namespace graphtrain {

size_t gelu_grad_from_output(Graph& graph) {
  size_t rewritten = 0;
  for (Node* n : graph.nodes()) {
    if (n->op_type != "GeluGrad" || n->domain != kGraphtrainDomain || n->inputs().size() != 2 ||
        !n->input(0) || !n->input(1) || !n->output(0))
      continue;
    // The autodiff rule names the forward output: a backward graph's input (the stashed values
    // keep the forward names), or, where forward and backward are one graph, the Gelu of X.
    Value* y = graph.find(n->attr_string("forward_output", ""));
    Value* x = n->input(1);
    if (!y || y->is_initializer()) continue;
    if (const Node* p = y->producer()) {
      if (p->op_type != "Gelu" || !p->domain.empty() || p->input(0) != x ||
          p->attr_string("approximate", "none") != n->attr_string("approximate", "none"))
        continue;
    } else if (y->type.dtype != x->type.dtype ||
               (y->type.shape && x->type.shape && *y->type.shape != *x->type.shape)) {
      continue;
    }
    Node* f = graph.add_node("GeluGrad", {n->input(0), x, y}, {}, kGraphtrainDomain, n->name);
    f->attributes = n->attributes;
    f->scope = n->scope;
    graph.move_output(n->output(0), f, 0);
    graph.remove_node(n);
    ++rewritten;
  }
  return rewritten;
}

}  // namespace graphtrain
