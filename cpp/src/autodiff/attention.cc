// Gradient rule: Attention. Q, K, V (or packed, X and its bias), Y and LSE are stashed, and the
// probabilities P (output 3), which the forward keeps only for short sequences: otherwise P is
// empty and the backward recomputes them from the log-sum-exp (and, with dropout, its seed). A
// float mask that wants a gradient (a learned position bias) gets the score gradients, reduced to
// its shape.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

const bool registered = [] {
  register_gradient(kGraphtrainDomain, "Attention", [](GradientContext& c) {
    const Node& n = c.node();
    bool mask_grad = c.input(3) && c.wants(3);
    // Packed: one X holds Q, K and V (inputs 1 and 2 absent), and one dX is its gradient.
    bool packed = n.attr_int("packed", 0) != 0;
    // A packed Attention's qkv bias (input 4) goes to AttentionGrad's input 8; its gradient is
    // dX summed over the rows, as the bias Add it replaces would have made it.
    Value* bias = n.inputs().size() > 4 ? c.input(4) : nullptr;
    std::vector<Value*> ins = {c.output_grad(0), c.input(0),  c.input(1), c.input(2),
                               c.output(0),      c.output(1), c.input(3)};
    ins.push_back(n.attr_float("dropout", 0.0f) > 0 ? c.output(2) : nullptr);
    ins.push_back(bias);
    ins.push_back(c.output(3));  // P
    bool bias_grad = bias && c.wants(4);
    std::vector<Value*> g =
        c.op_n("AttentionGrad", ins, 4, n.attributes, kGraphtrainDomain,
               {c.wants(0) || bias_grad, !packed && c.wants(1), !packed && c.wants(2), mask_grad});
    if (bias_grad) c.set_grad_reduced(4, g[0]);
    for (size_t i = 0; i < 3; ++i)
      if (g[i] && c.wants(i)) c.set_grad(i, g[i]);
    if (mask_grad) c.set_grad_reduced(3, g[3]);  // summed over the dims the mask broadcasts
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
