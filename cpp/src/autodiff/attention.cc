// Gradient rules: Attention, and Rotary (below). Attention: Q, K, V (or packed, X and its bias), Y
// and LSE are stashed, and the probabilities P (output 3), which the forward keeps only for short
// sequences: otherwise P is empty and the backward recomputes them from the log-sum-exp (and, with
// dropout, its seed). A float mask that wants a gradient (a learned position bias) gets the score
// gradients, reduced to its shape.
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
  // Rotary: Y = X Cos + R(X) Sin (R = rotate_half; inverse: Y = X Cos + R^T(X Sin)). dX is the
  // transposed rotation of dY, dCos = dY X, and dSin = dY R(X) (inverse: X R(dY)), R as a Rotary
  // of zero Cos and unit Sin; the last two summed over the dims Cos and Sin broadcast.
  register_gradient(kGraphtrainDomain, "Rotary", [](GradientContext& c) {
    const int64_t inverse = c.node().attr_int("inverse", 0);
    Value* dy = c.output_grad(0);
    auto rotary = [&](Value* v, Value* cos, Value* sin, int64_t inv) {
      return c.op("Rotary", {v, cos, sin}, {{"inverse", int_attr(inv)}}, kGraphtrainDomain);
    };
    if (c.wants(0)) c.set_grad(0, rotary(dy, c.input(1), c.input(2), 1 - inverse));
    if (c.wants(1)) c.set_grad_reduced(1, c.op("Mul", {dy, c.input(0)}));
    if (c.wants(2)) {
      Value* zeros = c.op("Expand", {c.constant(0.0f), c.shape_of(c.input(1))});
      Value* ones = c.op("Expand", {c.constant(1.0f), c.shape_of(c.input(2))});
      Value* ds = inverse ? c.op("Mul", {c.input(0), rotary(dy, zeros, ones, 0)})
                          : c.op("Mul", {dy, rotary(c.input(0), zeros, ones, 0)});
      c.set_grad_reduced(2, ds);
    }
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
