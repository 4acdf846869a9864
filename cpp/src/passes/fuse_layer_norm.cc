// Pass fuse_layer_norm: the residual add and the LayerNorm (or RMSNorm) after it run as one pass
// over each row.
// - Forward: LayerNormalization(A + R) (A itself may be M + Bias, Bias over the normalized dims
//   and read by nothing else) becomes graphtrain::AddLayerNormalization(A or M, R, Scale, B,
//   Bias), which also outputs the sum: the residual stream that later blocks and the backward
//   read keeps its name. RMSNormalization(A + R) (graphtrain's, or ONNX's of opset 23) the same, as
//   AddRMSNormalization(A or M, R, Scale, Bias) with the sum as output 2.
// - Backward: the norm's input gradient plus another gradient of the same shape (the residual's)
//   becomes one LayerNormalizationGrad (RMSNormalizationGrad) with that gradient as its last input.
#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

bool same_shape(const Value* a, const Value* b) {
  return a && b && a->type.shape && b->type.shape && *a->type.shape == *b->type.shape &&
         a->type.dtype == DType::kFloat32 && b->type.dtype == DType::kFloat32;
}

// The normalized dims of a LayerNormalization over the last axis: its size, or null when the
// axis is another one or the shape is unknown.
const SymDim* normalized_dim(const Node& ln) {
  const Value* x = ln.input(0);
  if (!x || !x->type.shape || x->type.shape->empty()) return nullptr;
  int64_t rank = static_cast<int64_t>(x->type.shape->size());
  int64_t axis = ln.attr_int("axis", -1);
  return axis == -1 || axis == rank - 1 ? &x->type.shape->back() : nullptr;
}

// `v` = M + Bias with Bias of shape [cols], made by an Add that only `reader` reads.
Node* bias_add(const Graph& g, Value* v, const Node* reader, const SymDim& cols) {
  Node* add = v ? v->producer() : nullptr;
  if (!add || add->op_type != "Add" || !add->domain.empty() || add->inputs().size() != 2 ||
      !read_only_by(g, v, reader))
    return nullptr;
  for (size_t i : {0, 1}) {
    const Value* b = add->input(i);
    if (b && b->type.dtype == DType::kFloat32 && b->type.shape && b->type.shape->size() == 1 &&
        b->type.shape->front() == cols && same_shape(add->input(1 - i), v))
      return add;
  }
  return nullptr;
}

}  // namespace

size_t fuse_layer_norm(Graph& graph) {
  infer_shapes(graph);
  size_t fused = 0;
  Pattern residual = Pattern::op({"Add"}, {Pattern::any("a"), Pattern::any("r")}, "add").shared();
  Pattern ln = Pattern::op(
      {"LayerNormalization", "RMSNormalization", "graphtrain::RMSNormalization"}, {residual}, "ln");
  fused += rewrite_matches(graph, ln, [](Graph& g, const Match& m) {
    Node* ln = m.node("ln");
    const bool rms = ln->op_type == "RMSNormalization";
    Node* add = m.node("add");
    Value* a = m.value("a");
    Value* r = m.value("r");
    const SymDim* cols = normalized_dim(*ln);
    if (!cols || !same_shape(a, r) || !same_shape(a, add->output(0))) return false;
    // A bias added to either side folds in too.
    Value* bias = nullptr;
    Node* biased = bias_add(g, a, add, *cols);
    if (!biased) {
      std::swap(a, r);
      biased = bias_add(g, a, add, *cols);
    }
    if (!fusable_without_cycle(biased ? std::vector<Node*>{ln, add, biased}
                                      : std::vector<Node*>{ln, add}))
      return false;
    if (biased) {  // which of its inputs is M (the other is the bias)
      size_t mi = same_shape(biased->input(0), biased->output(0)) ? 0 : 1;
      bias = biased->input(1 - mi);
      a = biased->input(mi);
    }
    std::vector<Value*> inputs = {a, r, ln->input(1)};
    if (!rms) inputs.push_back(ln->inputs().size() > 2 ? ln->input(2) : nullptr);
    inputs.push_back(bias);
    Node* f = g.add_node(rms ? "AddRMSNormalization" : "AddLayerNormalization", inputs, {},
                         kGraphtrainDomain, ln->name);
    f->attributes = ln->attributes;
    f->scope = ln->scope;
    for (size_t o = 0; o < ln->outputs().size(); ++o)
      if (ln->output(o)) g.move_output(ln->output(o), f, o);
    g.move_output(add->output(0), f, rms ? 2 : 3);
    g.remove_node(ln);
    g.remove_node(add);
    if (biased) g.remove_node(biased);
    return true;
  });

  // Backward: LayerNormalizationGrad's dX + G -> LayerNormalizationGrad(..., G), and the same for
  // RMSNormalizationGrad.
  for (size_t side : {0, 1}) {
    std::vector<Pattern> inputs = {Pattern::any("other"), Pattern::any("other")};
    inputs[side] = Pattern::op(
        {"graphtrain::LayerNormalizationGrad", "graphtrain::RMSNormalizationGrad"}, {}, "grad");
    Pattern sum = Pattern::op({"Add"}, inputs, "add");
    fused += rewrite_matches(graph, sum, [](Graph& g, const Match& m) {
      Node* grad = m.node("grad");
      Node* add = m.node("add");
      Value* other = m.value("other");
      const size_t n_inputs = grad->op_type == "RMSNormalizationGrad" ? 4 : 5;
      if (grad->inputs().size() != n_inputs || !same_shape(other, grad->output(0)) ||
          !same_shape(other, add->output(0)))
        return false;
      if (!fusable_without_cycle({grad, add})) return false;
      std::vector<Value*> inputs = grad->inputs();
      inputs.push_back(other);
      Node* f = g.add_node(grad->op_type, inputs, {}, kGraphtrainDomain, grad->name);
      f->attributes = grad->attributes;
      f->scope = grad->scope;
      g.move_output(add->output(0), f, 0);
      for (size_t o = 1; o < grad->outputs().size(); ++o)
        if (grad->output(o)) g.move_output(grad->output(o), f, o);
      g.remove_node(add);
      g.remove_node(grad);
      return true;
    });
  }
  return fused;
}

}  // namespace graphtrain
