// Gradient rules: MatMul, FusedMatMul and Gemm (transposed operands become FusedMatMul), and
// GroupedMatMul.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

Value* ints(Ctx& c, std::vector<int64_t> v) {
  return c.constant_ints(v);
}

int64_t rank_of(Ctx& c, Value* v) {
  if (!v->type.shape) c.fail("the rank of '" + v->name() + "' must be known to differentiate");
  return static_cast<int64_t>(v->type.shape->size());
}

// alpha * op(x) @ op(y) without materializing transposes.
Value* fused(Ctx& c, Value* x, Value* y, int64_t tx, int64_t ty) {
  return c.op("FusedMatMul", {x, y}, {{"transA", int_attr(tx)}, {"transB", int_attr(ty)}}, GT);
}

void matmul(Ctx& c) {
  Value* g = c.output_grad(0);
  Value* a = c.input(0);
  Value* b = c.input(1);
  int64_t ra = rank_of(c, a), rb = rank_of(c, b);
  if (ra == 1 && rb == 1) {
    if (c.wants(0)) c.set_grad(0, c.op("Mul", {g, b}));
    if (c.wants(1)) c.set_grad(1, c.op("Mul", {g, a}));
    return;
  }
  if (ra == 1) {  // [k] @ [..., k, n] -> [..., n]
    Value* g2 = c.op("Unsqueeze", {g, ints(c, {-2})});
    if (c.wants(0)) c.set_grad_reduced(0, fused(c, g2, b, 0, 1));
    if (c.wants(1))
      c.set_grad_reduced(1, c.op("MatMul", {c.op("Unsqueeze", {a, ints(c, {-1})}), g2}));
    return;
  }
  if (rb == 1) {  // [..., m, k] @ [k] -> [..., m]
    Value* g2 = c.op("Unsqueeze", {g, ints(c, {-1})});
    if (c.wants(0))
      c.set_grad_reduced(0, c.op("MatMul", {g2, c.op("Unsqueeze", {b, ints(c, {0})})}));
    if (c.wants(1)) c.set_grad_reduced(1, c.op("Squeeze", {fused(c, a, g2, 1, 0), ints(c, {-1})}));
    return;
  }
  if (c.wants(0)) c.set_grad_reduced(0, fused(c, g, b, 0, 1));
  if (c.wants(1)) {
    if (rb == 2 && ra > 2) {
      // A weight shared by every batch: one GEMM over the flattened batch, no per-batch
      // products to sum afterwards.
      Value* a2 = c.op("Flatten", {a}, {{"axis", int_attr(ra - 1)}});
      Value* g2 = c.op("Flatten", {g}, {{"axis", int_attr(ra - 1)}});
      c.set_grad(1, fused(c, a2, g2, 1, 0));
    } else {
      c.set_grad_reduced(1, fused(c, a, g, 1, 0));
    }
  }
}

// graphtrain::FusedMatMul: Y = op(A) @ op(B), op a transpose of the last two dims when set.
void fused_matmul(Ctx& c) {
  Value* g = c.output_grad(0);
  Value* a = c.input(0);
  Value* b = c.input(1);
  int64_t ta = c.node().attr_int("transA", 0), tb = c.node().attr_int("transB", 0);
  if (c.node().attr_float("alpha", 1.0f) != 1.0f)
    c.fail("alpha other than 1 is not differentiated");
  int64_t ra = rank_of(c, a), rb = rank_of(c, b);
  if (ra < 2 || rb < 2) c.fail("FusedMatMul inputs need rank 2 or more");
  if (c.wants(0)) c.set_grad_reduced(0, ta ? fused(c, b, g, tb, 1) : fused(c, g, b, 0, 1 - tb));
  if (c.wants(1)) {
    if (rb == 2 && ra > 2 && !ta) {
      // A weight shared by every batch (a linear layer): one GEMM over the flattened batch.
      Value* a2 = c.op("Flatten", {a}, {{"axis", int_attr(ra - 1)}});
      Value* g2 = c.op("Flatten", {g}, {{"axis", int_attr(ra - 1)}});
      c.set_grad(1, tb ? fused(c, g2, a2, 1, 0) : fused(c, a2, g2, 1, 0));
    } else {
      c.set_grad_reduced(1, tb ? fused(c, g, a, 1, ta) : fused(c, a, g, 1 - ta, 0));
    }
  }
}

void gemm(Ctx& c) {
  Value* g = c.output_grad(0);
  const Node& n = c.node();
  float alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  int64_t ta = n.attr_int("transA", 0), tb = n.attr_int("transB", 0);
  Value* a = c.input(0);
  Value* b = c.input(1);
  auto gemm_op = [&](Value* x, Value* y, int64_t tx, int64_t ty) {
    return c.op(
        "Gemm", {x, y},
        {{"alpha", Attribute::of(alpha)}, {"transA", int_attr(tx)}, {"transB", int_attr(ty)}});
  };
  if (c.wants(0)) c.set_grad(0, ta ? gemm_op(b, g, tb, 1) : gemm_op(g, b, 0, 1 - tb));
  if (c.wants(1)) c.set_grad(1, tb ? gemm_op(g, a, 1, ta) : gemm_op(a, g, 1 - ta, 0));
  if (c.wants(2)) c.set_grad_reduced(2, beta == 1.0f ? g : c.op("Mul", {g, c.constant(beta)}));
}

const bool registered = [] {
  register_gradient(GT, "GroupedMatMul", [](Ctx& c) {
    std::vector<Value*> grads = c.op_n(
        "GroupedMatMulGrad", {c.output_grad(0), c.input(0), c.input(1), c.input(2)}, 2,
        {{"transB", int_attr(c.node().attr_int("transB", 0))}}, GT, {c.wants(0), c.wants(1)});
    if (c.wants(0)) c.set_grad(0, grads[0]);
    if (c.wants(1)) c.set_grad(1, grads[1]);
  });
  register_gradient("", "MatMul", matmul);
  register_gradient(GT, "FusedMatMul", fused_matmul);
  register_gradient("", "Gemm", gemm);
  return true;
}();

}  // namespace
}  // namespace graphtrain
