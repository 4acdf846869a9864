// Pass stash_gelu_derivative (before autodiff): a GELU writes its derivative in the forward, where
// it has the exponential (and erf's tail, or the tanh form's sigmoid) at hand, and the backward's
// gradient becomes one product, dX = dY * GELU'(X).
//
// GeluGrad used to evaluate the exponential and the tail again from the stashed X (or from Y and
// X: gelu_grad_from_output): ~30 vector instructions an element, the most expensive elementwise
// op of a transformer's backward after attention. graphtrain::Gelu computes Y, and its output 1,
// the derivative, only where autodiff asks for it (a GELU whose input needs no gradient, and every
// inference graph, computes Y alone); the derivative is stashed in place of X, which the backward
// no longer reads: the same bytes. A bias Add before the GELU stays in the forward's one pass
// (fuse_elementwise), which now writes Y and the derivative and no longer the biased X.
//
// Only for float32 GELUs of approximate "none" or "tanh" (ONNX's Gelu, or recognize_gelu's).
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {

size_t stash_gelu_derivative(Graph& graph) {
  std::vector<Node*> gelus;
  for (Node* n : graph.nodes()) {
    std::string approx = n->attr_string("approximate", "none");
    if (n->op_type == "Gelu" && n->domain.empty() && (approx == "none" || approx == "tanh") &&
        n->inputs().size() == 1 && n->input(0) && n->input(0)->type.dtype == DType::kFloat32 &&
        n->output(0))
      gelus.push_back(n);
  }
  for (Node* n : gelus) replace_node(graph, n, "Gelu", kGraphtrainDomain, n->inputs());
  return gelus.size();
}

}  // namespace graphtrain
