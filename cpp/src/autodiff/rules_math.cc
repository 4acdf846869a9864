// Gradient rules: elementwise math, MatMul and Gemm, reductions.
#include <cmath>

#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

Attribute I(int64_t v) {
  return Attribute::of(v);
}

// Sets input i's gradient to `g` reduced to its shape.
void set_reduced(Ctx& c, size_t i, Value* g) {
  if (c.wants(i)) c.set_grad(i, c.reduce_to_shape(g, c.input(i)));
}

Value* ints(Ctx& c, std::vector<int64_t> v) {
  return c.constant_ints(v);
}

int64_t rank_of(Ctx& c, Value* v) {
  if (!v->type.shape) c.fail("the rank of '" + v->name() + "' must be known to differentiate");
  return static_cast<int64_t>(v->type.shape->size());
}

// alpha * op(x) @ op(y) without materializing transposes.
Value* fused(Ctx& c, Value* x, Value* y, int64_t tx, int64_t ty) {
  return c.op("FusedMatMul", {x, y}, {{"transA", I(tx)}, {"transB", I(ty)}}, GT);
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
    if (c.wants(0)) set_reduced(c, 0, fused(c, g2, b, 0, 1));
    if (c.wants(1)) set_reduced(c, 1, c.op("MatMul", {c.op("Unsqueeze", {a, ints(c, {-1})}), g2}));
    return;
  }
  if (rb == 1) {  // [..., m, k] @ [k] -> [..., m]
    Value* g2 = c.op("Unsqueeze", {g, ints(c, {-1})});
    if (c.wants(0)) set_reduced(c, 0, c.op("MatMul", {g2, c.op("Unsqueeze", {b, ints(c, {0})})}));
    if (c.wants(1)) set_reduced(c, 1, c.op("Squeeze", {fused(c, a, g2, 1, 0), ints(c, {-1})}));
    return;
  }
  if (c.wants(0)) set_reduced(c, 0, fused(c, g, b, 0, 1));
  if (c.wants(1)) {
    if (rb == 2 && ra > 2) {
      // A weight shared by every batch: one GEMM over the flattened batch, no per-batch
      // products to sum afterwards.
      Value* a2 = c.op("Flatten", {a}, {{"axis", I(ra - 1)}});
      Value* g2 = c.op("Flatten", {g}, {{"axis", I(ra - 1)}});
      c.set_grad(1, fused(c, a2, g2, 1, 0));
    } else {
      set_reduced(c, 1, fused(c, a, g, 1, 0));
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
  if (c.wants(0)) set_reduced(c, 0, ta ? fused(c, b, g, tb, 1) : fused(c, g, b, 0, 1 - tb));
  if (c.wants(1)) {
    if (rb == 2 && ra > 2 && !ta) {
      // A weight shared by every batch (a linear layer): one GEMM over the flattened batch.
      Value* a2 = c.op("Flatten", {a}, {{"axis", I(ra - 1)}});
      Value* g2 = c.op("Flatten", {g}, {{"axis", I(ra - 1)}});
      c.set_grad(1, tb ? fused(c, g2, a2, 1, 0) : fused(c, a2, g2, 1, 0));
    } else {
      set_reduced(c, 1, tb ? fused(c, g, a, 1, ta) : fused(c, a, g, 1 - ta, 0));
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
    return c.op("Gemm", {x, y},
                {{"alpha", Attribute::of(alpha)}, {"transA", I(tx)}, {"transB", I(ty)}});
  };
  if (c.wants(0)) c.set_grad(0, ta ? gemm_op(b, g, tb, 1) : gemm_op(g, b, 0, 1 - tb));
  if (c.wants(1)) c.set_grad(1, tb ? gemm_op(g, a, 1, ta) : gemm_op(a, g, 1 - ta, 0));
  if (c.wants(2)) set_reduced(c, 2, beta == 1.0f ? g : c.op("Mul", {g, c.constant(beta)}));
}

void pow_rule(Ctx& c) {
  Value* g = c.output_grad(0);
  Value* a = c.input(0);
  Value* e = c.input(1);
  if (!is_floating(e->type.dtype)) e = c.op("Cast", {e}, {{"to", I(to_onnx(DType::kFloat32))}});
  if (c.wants(0)) {
    Value* da =
        c.op("Mul", {c.op("Mul", {g, e}), c.op("Pow", {a, c.op("Sub", {e, c.constant(1.0f)})})});
    set_reduced(c, 0, da);
  }
  if (c.wants(1)) set_reduced(c, 1, c.op("Mul", {c.op("Mul", {g, c.output(0)}), c.op("Log", {a})}));
}

// ReduceSum and ReduceMean: ReduceGrad spreads dY back over the reduced axes.
Value* axes_of(Ctx& c) {
  if (c.input(1)) return c.input(1);
  const Node& n = c.node();
  return n.has_attr("axes") ? c.constant_ints(n.attr_ints("axes")) : nullptr;
}

Value* spread(Ctx& c, Value* g, bool mean) {
  const Node& n = c.node();
  std::vector<Value*> ins = {g, c.shape_of(c.input(0))};
  if (Value* axes = axes_of(c)) ins.push_back(axes);
  return c.op("ReduceGrad", ins,
              {{"keepdims", I(n.attr_int("keepdims", 1))},
               {"noop_with_empty_axes", I(n.attr_int("noop_with_empty_axes", 0))},
               {"mean", I(mean ? 1 : 0)}},
              GT);
}

// ReduceMax and ReduceMin: the gradient goes to the extreme elements, shared among ties.
void reduce_extreme(Ctx& c) {
  Value* x = c.input(0);
  Value* y_full = spread(c, c.output(0), false);
  Value* mask = c.op("Cast", {c.op("Equal", {x, y_full})}, {{"to", I(to_onnx(DType::kFloat32))}});
  std::vector<Value*> sum_in = {mask};
  Value* axes = axes_of(c);
  if (axes) sum_in.push_back(axes);
  Value* count = c.op("ReduceSum", sum_in, {{"keepdims", I(c.node().attr_int("keepdims", 1))}});
  Value* share = c.op("Div", {c.output_grad(0), count});
  c.set_grad(0, c.op("Mul", {spread(c, share, false), mask}));
}

const bool registered = [] {
  register_gradient("", "Add", [](Ctx& c) {
    set_reduced(c, 0, c.output_grad(0));
    set_reduced(c, 1, c.output_grad(0));
  });
  register_gradient("", "Sub", [](Ctx& c) {
    set_reduced(c, 0, c.output_grad(0));
    if (c.wants(1)) set_reduced(c, 1, c.op("Neg", {c.output_grad(0)}));
  });
  register_gradient("", "Mul", [](Ctx& c) {
    if (c.wants(0)) set_reduced(c, 0, c.op("Mul", {c.output_grad(0), c.input(1)}));
    if (c.wants(1)) set_reduced(c, 1, c.op("Mul", {c.output_grad(0), c.input(0)}));
  });
  register_gradient("", "Div", [](Ctx& c) {
    Value* g = c.output_grad(0);
    if (c.wants(0)) set_reduced(c, 0, c.op("Div", {g, c.input(1)}));
    if (c.wants(1))
      set_reduced(c, 1, c.op("Neg", {c.op("Div", {c.op("Mul", {g, c.output(0)}), c.input(1)})}));
  });
  register_gradient("", "Pow", pow_rule);
  register_gradient("", "Neg", [](Ctx& c) { c.set_grad(0, c.op("Neg", {c.output_grad(0)})); });
  register_gradient("", "Abs", [](Ctx& c) {
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.op("Sign", {c.input(0)})}));
  });
  register_gradient("", "Sign", [](Ctx&) {});  // zero almost everywhere
  register_gradient("", "Sqrt", [](Ctx& c) {
    c.set_grad(0, c.op("Div", {c.op("Mul", {c.output_grad(0), c.constant(0.5f)}), c.output(0)}));
  });
  register_gradient("", "Reciprocal", [](Ctx& c) {
    Value* y = c.output(0);
    c.set_grad(0, c.op("Neg", {c.op("Mul", {c.output_grad(0), c.op("Mul", {y, y})})}));
  });
  register_gradient("", "Exp", [](Ctx& c) {
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.output(0)}));
  });
  register_gradient("", "Log", [](Ctx& c) {
    c.set_grad(0, c.op("Div", {c.output_grad(0), c.input(0)}));
  });
  register_gradient("", "Erf", [](Ctx& c) {
    Value* x = c.input(0);
    Value* e = c.op("Exp", {c.op("Neg", {c.op("Mul", {x, x})})});
    c.set_grad(0,
               c.op("Mul", {c.output_grad(0), c.op("Mul", {e, c.constant(1.12837916709551257f)})}));
  });
  register_gradient("", "Relu", [](Ctx& c) {
    c.set_grad(0, c.op("ReluGrad", {c.output_grad(0), c.output(0)}, {}, GT));
  });
  register_gradient("", "LeakyRelu", [](Ctx& c) {
    c.set_grad(0, c.op("LeakyReluGrad", {c.output_grad(0), c.input(0)},
                       {{"alpha", Attribute::of(c.node().attr_float("alpha", 0.01f))}}, GT));
  });
  register_gradient("", "Sigmoid", [](Ctx& c) {
    c.set_grad(0, c.op("SigmoidGrad", {c.output_grad(0), c.output(0)}, {}, GT));
  });
  register_gradient("", "Tanh", [](Ctx& c) {
    c.set_grad(0, c.op("TanhGrad", {c.output_grad(0), c.output(0)}, {}, GT));
  });
  register_gradient("", "Gelu", [](Ctx& c) {
    c.set_grad(
        0, c.op("GeluGrad", {c.output_grad(0), c.input(0)},
                {{"approximate", Attribute::of(c.node().attr_string("approximate", "none"))}}, GT));
  });
  register_gradient("", "Identity", [](Ctx& c) { c.set_grad(0, c.output_grad(0)); });
  register_gradient("", "Cast", [](Ctx& c) {
    DType from = c.input(0)->type.dtype;
    Value* g = c.output_grad(0);
    c.set_grad(0,
               from == c.output(0)->type.dtype ? g : c.op("Cast", {g}, {{"to", I(to_onnx(from))}}));
  });
  register_gradient("", "Where", [](Ctx& c) {
    Value* g = c.output_grad(0);
    Value* zero = c.constant(0.0f);
    if (c.wants(1)) set_reduced(c, 1, c.op("Where", {c.input(0), g, zero}));
    if (c.wants(2)) set_reduced(c, 2, c.op("Where", {c.input(0), zero, g}));
  });
  register_gradient("", "MatMul", matmul);
  register_gradient(GT, "FusedMatMul", fused_matmul);
  register_gradient("", "Gemm", gemm);
  register_gradient("", "ReduceSum",
                    [](Ctx& c) { c.set_grad(0, spread(c, c.output_grad(0), false)); });
  register_gradient("", "ReduceMean",
                    [](Ctx& c) { c.set_grad(0, spread(c, c.output_grad(0), true)); });
  register_gradient("", "ReduceMax", reduce_extreme);
  register_gradient("", "ReduceMin", reduce_extreme);
  return true;
}();

}  // namespace
}  // namespace graphtrain
