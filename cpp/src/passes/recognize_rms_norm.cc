// Pass recognize_rms_norm (before autodiff): RMSNorm written out, as transformers' LlamaRMSNorm
// (and Mistral's, Qwen2's, T5's, Gemma's) spells it and as graphtrain translates torch's rms_norm,
//   Y = X * 1 / sqrt(mean(X^2 over the last axis) + eps) [* W]
// becomes one graphtrain::RMSNormalization(X, W) (W all ones when there is none): the forward one
// pass over each row in place of five ops, the backward one RMSNormalizationGrad in place of a
// dozen elementwise ops and two reductions, reading X and the inverse RMS the forward kept.
//
// The spellings taken: X^2 as Pow(X, 2) or X * X; ReduceMean over the last axis, keepdims; eps a
// float scalar constant added on either side; the inverse as Reciprocal(Sqrt(.)) or Pow(., -0.5)
// times X (either side), or X / Sqrt(.); W a float [D] (D the last dim) on either side of the
// product; Identity nodes (a float32 model's dtype casts) between the product and W, and before X.
// Every inner value is read by the chain alone, and X is float32.
#include <optional>
#include <vector>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

std::optional<float> scalar_of(const Value* v) {
  const Tensor* t = constant_value(v);
  if (!t || t->numel() != 1 || t->dtype() != DType::kFloat32) return std::nullopt;
  return t->data<float>()[0];
}

// The one node reading v, where v is no graph output and is read once; else null.
Node* sole_reader(const Graph& g, const Value* v) {
  if (!v || v->uses().size() != 1 || is_graph_output(g, v)) return nullptr;
  return v->uses()[0].first;
}

// sole_reader past Identity nodes (LlamaRMSNorm's .to(input_dtype) on a float32 model), which
// join `chain`.
Node* sole_reader_past_identities(const Graph& g, const Value* v, std::vector<Node*>& chain) {
  Node* n = sole_reader(g, v);
  while (is_onnx_op(n, "Identity")) {
    chain.push_back(n);
    n = sole_reader(g, n->output(0));
  }
  return n;
}

// The input of `n` (a two-input op) other than `v`, or null when v is not exactly one of them.
Value* other_input(const Node* n, const Value* v) {
  if (!n || n->inputs().size() != 2) return nullptr;
  if (n->input(0) == v && n->input(1) != v) return n->input(1);
  if (n->input(1) == v && n->input(0) != v) return n->input(0);
  return nullptr;
}

bool mean_over_last_axis(const Node& n, int64_t rank) {
  if (n.attr_int("keepdims", 1) != 1) return false;
  std::vector<int64_t> axes = n.attr_ints("axes");
  if (n.inputs().size() > 1 && n.input(1)) {
    const Tensor* t = constant_value(n.input(1));
    if (!t) return false;
    axes = t->to_int64_vector();
  }
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1);
}

struct RmsChain {
  Value* x = nullptr;
  Value* w = nullptr;  // null: no weight
  float eps = 0;
  std::vector<Node*> nodes;  // in order; the last one's output 0 is Y
};

// The chain that starts at `mean` (a ReduceMean), or nullopt.
std::optional<RmsChain> match_chain(const Graph& g, Node* mean) {
  if (!is_onnx_op(mean, "ReduceMean")) return std::nullopt;
  RmsChain c;
  Node* sq = mean->input(0) ? mean->input(0)->producer() : nullptr;
  if (is_onnx_op(sq, "Pow") && scalar_of(sq->input(1)) == 2.0f)
    c.x = sq->input(0);
  else if (is_onnx_op(sq, "Mul") && sq->input(0) == sq->input(1))
    c.x = sq->input(0);
  const SymShape* sx = c.x ? c.x->type.shape ? &*c.x->type.shape : nullptr : nullptr;
  if (!c.x || c.x->type.dtype != DType::kFloat32 || !sx || sx->empty() ||
      sole_reader(g, sq->output(0)) != mean ||
      !mean_over_last_axis(*mean, static_cast<int64_t>(sx->size())))
    return std::nullopt;
  c.nodes = {sq, mean};
  Node* add = sole_reader(g, mean->output(0));
  Value* eps = other_input(add, mean->output(0));
  if (!is_onnx_op(add, "Add") || !scalar_of(eps)) return std::nullopt;
  c.eps = *scalar_of(eps);
  c.nodes.push_back(add);
  // The inverse RMS (Reciprocal(Sqrt(.)) or Pow(., -0.5)) times X, or X over Sqrt(.).
  Node* n = sole_reader(g, add->output(0));
  Node* inverse = nullptr;
  Node* product = nullptr;
  if (is_onnx_op(n, "Sqrt")) {
    c.nodes.push_back(n);
    Node* next = sole_reader(g, n->output(0));
    if (is_onnx_op(next, "Div") && next->input(0) == c.x && next->input(1) == n->output(0))
      product = next;
    else if (is_onnx_op(next, "Reciprocal"))
      inverse = next;
  } else if (is_onnx_op(n, "Pow") && n->input(0) == add->output(0) &&
             scalar_of(n->input(1)) == -0.5f) {
    inverse = n;
  }
  if (inverse) {
    c.nodes.push_back(inverse);
    product = sole_reader(g, inverse->output(0));
    if (!is_onnx_op(product, "Mul") || other_input(product, inverse->output(0)) != c.x)
      return std::nullopt;
  }
  if (!product) return std::nullopt;
  c.nodes.push_back(product);
  // A weight of shape [D] multiplied in.
  std::vector<Node*> identities;
  Node* scale = sole_reader_past_identities(g, product->output(0), identities);
  Value* normalized = identities.empty() ? product->output(0) : identities.back()->output(0);
  Value* w = other_input(scale, normalized);
  if (is_onnx_op(scale, "Mul") && w && w->type.dtype == DType::kFloat32 && w->type.shape &&
      w->type.shape->size() == 1 && w->type.shape->front() == sx->back()) {
    c.w = w;
    c.nodes.insert(c.nodes.end(), identities.begin(), identities.end());
    c.nodes.push_back(scale);
  }
  if (!fusable_without_cycle(c.nodes)) return std::nullopt;
  return c;
}

}  // namespace

size_t recognize_rms_norm(Graph& graph) {
  infer_shapes(graph);
  std::vector<RmsChain> chains;
  for (Node* n : graph.topological_order())
    if (auto c = match_chain(graph, n)) chains.push_back(std::move(*c));
  size_t fused = 0;
  for (RmsChain& c : chains) {
    Value* w = c.w;
    if (!w) {  // all ones: the dim must be known
      const SymDim& d = c.x->type.shape->back();
      if (!d.is_constant()) continue;
      w = graph.add_initializer(
          graph.unique_name("rms_norm_ones"),
          Tensor::from_vector(DType::kFloat32, {*d.constant()},
                              std::vector<float>(static_cast<size_t>(*d.constant()), 1.0f)));
    }
    // X before the Identity nodes that hand it on (LlamaRMSNorm's .to(float32)): the norm reads
    // the residual stream, so fuse_layer_norm can take its Add (an Identity left unread goes with
    // dead_code).
    Value* x = c.x;
    while (is_onnx_op(x->producer(), "Identity")) x = x->producer()->input(0);
    Node* y = c.nodes.back();
    Node* rms = graph.add_node("RMSNormalization", {x, w}, {""}, kGraphtrainDomain,
                               graph.unique_name("RMSNormalization"));
    rms->attributes["axis"] = Attribute::of(int64_t{-1});
    rms->attributes["epsilon"] = Attribute::of(c.eps);
    rms->scope = common_scope(c.nodes);
    graph.move_output(y->output(0), rms, 0);
    for (auto it = c.nodes.rbegin(); it != c.nodes.rend(); ++it) graph.remove_node(*it);
    ++fused;
  }
  return fused;
}

}  // namespace graphtrain
