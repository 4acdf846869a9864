// Gradient rules: unary math and activations, binary arithmetic with broadcasting, Where, Cast,
// Identity, StopGradient.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

void pow_rule(Ctx& c) {
  Value* g = c.output_grad(0);
  Value* a = c.input(0);
  Value* e = c.input(1);
  if (!is_floating(e->type.dtype))
    e = c.op("Cast", {e}, {{"to", int_attr(to_onnx(DType::kFloat32))}});
  if (c.wants(0)) {
    Value* da =
        c.op("Mul", {c.op("Mul", {g, e}), c.op("Pow", {a, c.op("Sub", {e, c.constant(1.0f)})})});
    c.set_grad_reduced(0, da);
  }
  if (c.wants(1))
    c.set_grad_reduced(1, c.op("Mul", {c.op("Mul", {g, c.output(0)}), c.op("Log", {a})}));
}

const bool registered = [] {
  register_gradient("", "Add", [](Ctx& c) {
    c.set_grad_reduced(0, c.output_grad(0));
    c.set_grad_reduced(1, c.output_grad(0));
  });
  register_gradient("", "Sub", [](Ctx& c) {
    c.set_grad_reduced(0, c.output_grad(0));
    if (c.wants(1)) c.set_grad_reduced(1, c.op("Neg", {c.output_grad(0)}));
  });
  register_gradient("", "Mul", [](Ctx& c) {
    if (c.wants(0)) c.set_grad_reduced(0, c.op("Mul", {c.output_grad(0), c.input(1)}));
    if (c.wants(1)) c.set_grad_reduced(1, c.op("Mul", {c.output_grad(0), c.input(0)}));
  });
  register_gradient("", "Div", [](Ctx& c) {
    Value* g = c.output_grad(0);
    if (c.wants(0)) c.set_grad_reduced(0, c.op("Div", {g, c.input(1)}));
    if (c.wants(1))
      c.set_grad_reduced(1,
                         c.op("Neg", {c.op("Div", {c.op("Mul", {g, c.output(0)}), c.input(1)})}));
  });
  register_gradient("", "Pow", pow_rule);
  register_gradient("", "Neg", [](Ctx& c) { c.set_grad(0, c.op("Neg", {c.output_grad(0)})); });
  register_gradient("", "Abs", [](Ctx& c) {
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.op("Sign", {c.input(0)})}));
  });
  for (const char* op : {"Sign", "Floor", "Ceil", "Round"})
    register_gradient("", op, [](Ctx&) {});  // zero almost everywhere, as torch's
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
  register_gradient(GT, "Log1p", [](Ctx& c) {
    c.set_grad(0, c.op("Div", {c.output_grad(0), c.op("Add", {c.input(0), c.constant(1.0f)})}));
  });
  register_gradient(GT, "Expm1", [](Ctx& c) {  // d/dx (e^x - 1) = y + 1
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.op("Add", {c.output(0), c.constant(1.0f)})}));
  });
  register_gradient("", "Softplus", [](Ctx& c) {  // d/dx log(1 + e^x) = sigmoid(x)
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.op("Sigmoid", {c.input(0)})}));
  });
  register_gradient("", "Sigmoid", [](Ctx& c) {
    c.set_grad(0, c.op("SigmoidGrad", {c.output_grad(0), c.output(0)}, {}, GT));
  });
  register_gradient("", "Tanh", [](Ctx& c) {
    c.set_grad(0, c.op("TanhGrad", {c.output_grad(0), c.output(0)}, {}, GT));
  });
  register_gradient("", "Gelu", [](Ctx& c) {
    // forward_output: the GELU's output by name, not as an input (which would stash it), and
    // forward_output_views: its Reshapes and Flattens (transformers' Conv1D flattens it before
    // its addmm, and the view is what the backward reads), for gelu_grad_from_output where the
    // backward reads one of them anyway.
    Value* y = c.node().output(0);
    std::map<std::string, Attribute> attrs = {
        {"approximate", Attribute::of(c.node().attr_string("approximate", "none"))},
        {"forward_output", Attribute::of(y->name())}};
    std::vector<std::string> views;
    for (auto [user, index] : y->uses())
      if (index == 0 && user->domain.empty() &&
          (user->op_type == "Reshape" || user->op_type == "Flatten") && user->output(0))
        views.push_back(user->output(0)->name());
    if (!views.empty()) attrs["forward_output_views"] = Attribute::of(views);
    c.set_grad(0, c.op("GeluGrad", {c.output_grad(0), c.input(0)}, attrs, GT));
  });
  // graphtrain::Gelu (stash_gelu_derivative): its forward writes the derivative at X (output 1,
  // made here), so the gradient is one product; X itself is no longer stashed for it.
  register_gradient(GT, "Gelu", [](Ctx& c) {
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.output(1)}));
  });
  // graphtrain::SiluMul (recognize_silu_mul): one SiluMulGrad reading G and U, stashed as the
  // written-out product's and sigmoid's gradients stashed them, but not the sigmoid and silu(G).
  register_gradient(GT, "SiluMul", [](Ctx& c) {
    std::vector<Value*> g = c.op_n("SiluMulGrad", {c.output_grad(0), c.input(0), c.input(1)}, 2, {},
                                   GT, {c.wants(0), c.wants(1)});
    for (size_t i = 0; i < 2; ++i)
      if (g[i]) c.set_grad(i, g[i]);
  });
  register_gradient("", "Cos", [](Ctx& c) {
    c.set_grad(0, c.op("Neg", {c.op("Mul", {c.output_grad(0), c.op("Sin", {c.input(0)})})}));
  });
  register_gradient("", "Sin", [](Ctx& c) {
    c.set_grad(0, c.op("Mul", {c.output_grad(0), c.op("Cos", {c.input(0)})}));
  });
  // torch's maximum/minimum: the gradient goes to the larger (smaller) input, half to each on ties.
  for (const char* op : {"Max", "Min"})
    register_gradient("", op, [](Ctx& c) {
      const char* wins = c.node().op_type == "Max" ? "Greater" : "Less";
      Value* g = c.output_grad(0);
      Value* zero = c.constant(0.0f);
      Value* tie = c.op("Equal", {c.input(0), c.input(1)});
      Value* half = c.op("Mul", {g, c.constant(0.5f)});
      for (size_t i = 0; i < 2; ++i) {
        if (!c.wants(i)) continue;
        Value* win = c.op(wins, {c.input(i), c.input(1 - i)});
        c.set_grad_reduced(i, c.op("Where", {win, g, c.op("Where", {tie, half, zero})}));
      }
    });
  // torch's clamp: the gradient passes where min <= x <= max; a tensor bound gets it where it
  // binds.
  register_gradient("", "Clip", [](Ctx& c) {
    Value* x = c.input(0);
    Value* g = c.output_grad(0);
    Value* zero = c.constant(0.0f);
    Value* inside = nullptr;
    for (size_t i = 1; i < 3; ++i) {
      if (!c.input(i)) continue;
      Value* ok = c.op(i == 1 ? "GreaterOrEqual" : "LessOrEqual", {x, c.input(i)});
      inside = inside ? c.op("And", {inside, ok}) : ok;
      if (c.wants(i)) c.set_grad_reduced(i, c.op("Where", {ok, zero, g}));
    }
    c.set_grad(0, inside ? c.op("Where", {inside, g, zero}) : g);
  });
  register_gradient("", "Identity", [](Ctx& c) { c.set_grad(0, c.output_grad(0)); });
  register_gradient("", "Cast", [](Ctx& c) {
    DType from = c.input(0)->type.dtype;
    Value* g = c.output_grad(0);
    c.set_grad(0, from == c.output(0)->type.dtype
                      ? g
                      : c.op("Cast", {g}, {{"to", int_attr(to_onnx(from))}}));
  });
  register_gradient("", "Where", [](Ctx& c) {
    Value* g = c.output_grad(0);
    Value* zero = c.constant(0.0f);
    if (c.wants(1)) c.set_grad_reduced(1, c.op("Where", {c.input(0), g, zero}));
    if (c.wants(2)) c.set_grad_reduced(2, c.op("Where", {c.input(0), zero, g}));
  });
  // StopGradient (torch's detach): the value passes, its gradient does not.
  register_gradient(GT, "StopGradient", [](Ctx&) {});
  return true;
}();

}  // namespace
}  // namespace graphtrain
