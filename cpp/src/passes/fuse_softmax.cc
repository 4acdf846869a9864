// Pass fuse_softmax: attention's scale, additive mask and softmax become one pass over the scores.
// - Forward: Softmax over the last axis of (X * c or X / c) + Mask, of X * c or X / c, or of
//   X + Mask (c a scalar constant, Mask broadcast to X) becomes graphtrain::FusedSoftmax(X, Mask)
//   with attribute scale.
// - Backward: SoftmaxGrad followed by a Mul or Div by a scalar constant (the scale's gradient)
//   becomes one SoftmaxGrad with attribute scale.
// The scaled scores and their sum with the mask are never written.
#include <optional>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

bool same_shape(const Value* a, const Value* b) {
  return a && b && a->type.shape && b->type.shape && *a->type.shape == *b->type.shape;
}

bool float_input(const Node& n) {
  return n.input(0) && n.input(0)->type.dtype == DType::kFloat32;
}

// The scaled operand of a Mul/Div node: the input that is not the constant.
Value* scaled_operand(const Node& n) {
  if (n.op_type == "Div") return n.input(0);
  return constant_value(n.input(1)) ? n.input(0) : n.input(1);
}

}  // namespace

size_t fuse_softmax(Graph& graph) {
  infer_shapes(graph);  // the axis and the mask's broadcast need ranks
  size_t fused = 0;
  auto scale_node = [] {
    return Pattern::op({"Mul", "Div"}, {}, "scale").where([](const Node& n) {
      return float_input(n) && scalar_factor(n, scaled_operand(n)).has_value();
    });
  };
  // Softmax(Add(scale(X), Mask)), Mask on either side; Softmax(scale(X)); Softmax(Add(X, Mask)).
  std::vector<Pattern> patterns;
  for (size_t side : {0, 1}) {
    std::vector<Pattern> add_inputs = {Pattern::any("mask"), Pattern::any("mask")};
    add_inputs[side] = scale_node();
    patterns.push_back(Pattern::op({"Softmax"}, {Pattern::op({"Add"}, add_inputs, "add")}, "sm"));
  }
  patterns.push_back(Pattern::op({"Softmax"}, {scale_node()}, "sm"));
  patterns.push_back(Pattern::op(
      {"Softmax"}, {Pattern::op({"Add"}, {Pattern::any("x"), Pattern::any("mask")}, "add")}, "sm"));

  for (const Pattern& p : patterns) {
    fused += rewrite_matches(graph, p, [](Graph& g, const Match& m) {
      Node* sm = m.node("sm");
      if (!softmax_over_last_axis(g, *sm) || !float_input(*sm)) return false;
      auto node = [&](const char* name) {
        auto it = m.nodes.find(name);
        return it == m.nodes.end() ? nullptr : it->second;
      };
      Node* scale = node("scale");
      Node* add = node("add");
      Value* x = scale ? scaled_operand(*scale) : m.value("x");
      float factor = scale ? *scalar_factor(*scale, x) : 1.0f;
      // The mask broadcasts to X's shape (it does not widen the scores) and is float.
      if (!same_shape(x, sm->output(0))) return false;
      std::vector<Value*> inputs = {x};
      if (add) {
        Value* mask = m.value("mask");
        if (!mask || mask->type.dtype != DType::kFloat32) return false;
        inputs.push_back(mask);
      }
      Node* f = g.add_node("FusedSoftmax", inputs, {}, kGraphtrainDomain, sm->name);
      f->attributes["scale"] = Attribute::of(factor);
      f->scope = sm->scope;
      g.move_output(sm->output(0), f, 0);
      g.remove_node(sm);
      if (add) g.remove_node(add);
      if (scale) g.remove_node(scale);
      return true;
    });
  }

  // Backward: scale(SoftmaxGrad(dY, Y)) -> SoftmaxGrad(dY, Y) with scale.
  Pattern grad = Pattern::op({"graphtrain::SoftmaxGrad"}, {}, "grad");
  Pattern scaled = Pattern::op({"Mul", "Div"}, {grad}, "scale").where([](const Node& n) {
    return scalar_factor(n, n.input(0)).has_value();
  });
  std::vector<Pattern> grads = {scaled, Pattern::op({"Mul"}, {Pattern::any(), grad}, "scale")};
  for (const Pattern& p : grads) {
    fused += rewrite_matches(graph, p, [](Graph& g, const Match& m) {
      Node* gr = m.node("grad");
      Node* scale = m.node("scale");
      std::optional<float> factor = scalar_factor(*scale, gr->output(0));
      if (!factor) return false;
      Node* f = g.add_node("SoftmaxGrad", gr->inputs(), {}, kGraphtrainDomain, gr->name);
      f->attributes = gr->attributes;
      f->attributes["scale"] = Attribute::of(gr->attr_float("scale", 1.0f) * *factor);
      f->scope = gr->scope;
      g.move_output(scale->output(0), f, 0);
      g.remove_node(scale);
      g.remove_node(gr);
      return true;
    });
  }
  return fused;
}

}  // namespace graphtrain
