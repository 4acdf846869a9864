// Pass gelu_grad_from_output: a GeluGrad whose forward GELU's output the backward graph reads
// anyway (the next Linear's weight gradient needs it) takes that output as a third input.
// GELU(x) = x Phi(x), so Phi(x) = y / x: the gradient no longer evaluates erf's tail (or, for the
// tanh form, the sigmoid's exponential). Nothing is stashed that was not already.
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

bool same_type(const Value* a, const Value* b) {
  return a->type.dtype == b->type.dtype &&
         (!a->type.shape || !b->type.shape || *a->type.shape == *b->type.shape);
}

// The same number of elements (a product of symbolic dims, compared as polynomials).
bool same_count(const Value* a, const Value* b) {
  if (a->type.dtype != b->type.dtype || !a->type.shape || !b->type.shape) return false;
  SymDim na = 1, nb = 1;
  for (const SymDim& d : *a->type.shape) na = na * d;
  for (const SymDim& d : *b->type.shape) nb = nb * d;
  return na == nb;
}

// The GELU output of GeluGrad `n` (whose input 1 is the GELU's input x) as this graph holds it,
// or nullptr. The autodiff rule names it (forward_output) and its Reshapes / Flattens
// (forward_output_views): a backward graph reads a stashed value as an input of the forward's
// name; where forward and backward are one graph, the output must be the Gelu of x. A stashed
// view is read back in x's shape through a Reshape (a view, no copy).
Value* gelu_output(Graph& graph, Node* n) {
  Value* x = n->input(1);
  if (Value* y = graph.find(n->attr_string("forward_output", "")); y && !y->is_initializer()) {
    if (const Node* p = y->producer())
      return p->op_type == "Gelu" && p->domain.empty() && p->input(0) == x &&
                     p->attr_string("approximate", "none") == n->attr_string("approximate", "none")
                 ? y
                 : nullptr;
    return same_type(y, x) ? y : nullptr;
  }
  auto views = n->attributes.find("forward_output_views");
  if (views == n->attributes.end()) return nullptr;
  for (const std::string& name : views->second.strings) {
    Value* v = graph.find(name);
    if (!v || v->producer() || v->is_initializer() || !same_count(v, x)) continue;
    Value* shape = graph.add_op("Shape", {x});
    Value* y = graph.add_op("Reshape", {v, shape});
    shape->producer()->scope = y->producer()->scope = n->scope;
    return y;
  }
  return nullptr;
}

}  // namespace

size_t gelu_grad_from_output(Graph& graph) {
  size_t rewritten = 0;
  for (Node* n : graph.nodes()) {
    if (n->op_type != "GeluGrad" || n->domain != kGraphtrainDomain || n->inputs().size() != 2 ||
        !n->input(0) || !n->input(1) || !n->output(0))
      continue;
    Value* y = gelu_output(graph, n);
    if (!y) continue;
    replace_node(graph, n, "GeluGrad", kGraphtrainDomain, {n->input(0), n->input(1), y});
    ++rewritten;
  }
  return rewritten;
}

}  // namespace graphtrain
