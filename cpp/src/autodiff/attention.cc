// Gradient rule: Attention. The backward recomputes the probabilities from the forward's
// log-sum-exp (and, with dropout, its seed), so only Q, K, V, Y and LSE are stashed.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

const bool registered = [] {
  register_gradient(kGraphtrainDomain, "Attention", [](GradientContext& c) {
    if (c.input(3) && c.wants(3))
      c.fail(
          "the gradient of an attention mask is not supported; build the mask from values "
          "that need no gradient");
    const Node& n = c.node();
    std::vector<Value*> ins = {c.output_grad(0), c.input(0),  c.input(1), c.input(2),
                               c.output(0),      c.output(1), c.input(3)};
    if (n.attr_float("dropout", 0.0f) > 0) ins.push_back(c.output(2));
    while (!ins.empty() && !ins.back()) ins.pop_back();
    std::vector<Value*> g = c.op_n("AttentionGrad", ins, 3, n.attributes, kGraphtrainDomain,
                                   {c.wants(0), c.wants(1), c.wants(2)});
    for (size_t i = 0; i < 3; ++i)
      if (g[i]) c.set_grad(i, g[i]);
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
