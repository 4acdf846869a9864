// Pass recognize_gelu (before autodiff): GELU written out in elementary ops becomes one Gelu node.
//
// Models write GELU by hand: transformers' NewGELUActivation (GPT-2, GPT-Neo, GPT-J, CodeGen) is
//   0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))),
// FastGELU and BLOOM write the same function in another order, and older BERT code writes
// x * 0.5 * (1 + erf(x / sqrt(2))). Captured, each is a chain of 6-9 elementwise ops; autodiff
// then stashes three of its intermediates and builds a gradient chain twice as long. As one Gelu
// (approximate "tanh" or "none") the forward is one op and the backward one GeluGrad reading x.
//
// The match is by value, not by spelling: around each Tanh (or Erf), a region of elementwise ops
// with scalar constants that computes y from one tensor x, whose inner values nothing else reads,
// is evaluated (in double) at sample points; where it equals GELU within float rounding
// everywhere, it is GELU. Runs on the captured graph before autodiff, so the gradient is Gelu's.
#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

constexpr size_t kMaxRegion = 16;  // nodes; the longest spelling above has 9

bool elementwise(const Node& n) {
  static const std::set<std::string> ops = {"Add", "Sub",  "Mul", "Div",        "Pow",
                                            "Neg", "Tanh", "Erf", "Reciprocal", "Sqrt"};
  return n.domain.empty() && ops.count(n.op_type) && n.outputs().size() == 1;
}

// The value of a float scalar constant, or nullptr.
const float* scalar(const Value* v) {
  const Tensor* t = constant_value(v);
  if (!t || !t->defined() || t->numel() != 1 || t->dtype() != DType::kFloat32) return nullptr;
  return t->data<float>();
}

// The nodes computing `y` from `x` and scalar constants, producers first; empty when `y` also
// depends on another tensor, needs a non-elementwise op, or takes more than kMaxRegion nodes.
std::vector<Node*> region_between(Value* x, Value* y) {
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  bool ok = true;
  std::function<void(Value*)> visit = [&](Value* v) {
    if (!ok || v == x || scalar(v)) return;
    Node* p = v->producer();
    if (!p || !elementwise(*p) || v->type.dtype != DType::kFloat32) {
      ok = false;
      return;
    }
    if (!seen.insert(p).second) return;
    for (Value* in : p->inputs()) visit(in);
    order.push_back(p);
    if (order.size() > kMaxRegion) ok = false;
  };
  visit(y);
  if (!ok) order.clear();
  return order;
}

// The region's function at x, in double.
double evaluate(const std::vector<Node*>& region, const Value* x, double at) {
  std::unordered_map<const Value*, double> val;
  auto get = [&](const Value* v) {
    if (v == x) return at;
    if (const float* c = scalar(v)) return static_cast<double>(*c);
    return val.at(v);
  };
  for (const Node* n : region) {
    double a = get(n->input(0));
    double b = n->inputs().size() > 1 ? get(n->input(1)) : 0.0;
    double r = 0;
    const std::string& op = n->op_type;
    if (op == "Add") r = a + b;
    if (op == "Sub") r = a - b;
    if (op == "Mul") r = a * b;
    if (op == "Div") r = a / b;
    if (op == "Pow") r = std::pow(a, b);
    if (op == "Neg") r = -a;
    if (op == "Tanh") r = std::tanh(a);
    if (op == "Erf") r = std::erf(a);
    if (op == "Reciprocal") r = 1.0 / a;
    if (op == "Sqrt") r = std::sqrt(a);
    val[n->output(0)] = r;
  }
  return val.at(region.back()->output(0));
}

// Whether the region computes GELU ("tanh": its tanh approximation) at points over its range.
bool computes_gelu(const std::vector<Node*>& region, const Value* x, bool tanh) {
  for (double at : {-7.0, -3.1, -1.7, -0.9, -0.35, -0.02, 0.0, 0.013, 0.4, 0.8, 1.3, 2.6, 5.5}) {
    double want =
        tanh ? 0.5 * at * (1 + std::tanh(0.7978845608028654 * (at + 0.044715 * at * at * at)))
             : 0.5 * at * (1 + std::erf(at / std::sqrt(2.0)));
    double got = evaluate(region, x, at);
    if (!(std::fabs(got - want) <= 2e-6 * std::fabs(want) + 1e-7)) return false;
  }
  return true;
}

// Replaces the region computing y with one Gelu, if y = GELU(x) for a value x in y's elementwise
// cone (tried nearest first) and the region's inner values are read by nobody else; the nodes it
// removes go into `removed`.
bool rewrite_at(Graph& g, Node* seed, Value* y, std::unordered_set<Node*>& removed) {
  std::vector<Node*> cone;  // producers first
  std::unordered_set<Node*> seen;
  std::function<void(Value*)> visit = [&](Value* v) {
    Node* p = v ? v->producer() : nullptr;
    if (!p || !elementwise(*p) || !seen.insert(p).second || seen.size() > 2 * kMaxRegion) return;
    for (Value* in : p->inputs()) visit(in);
    cone.push_back(p);
  };
  visit(y);
  std::vector<Value*> xs;
  for (auto it = cone.rbegin(); it != cone.rend(); ++it)
    for (Value* in : (*it)->inputs())
      if (in && !scalar(in) && std::find(xs.begin(), xs.end(), in) == xs.end()) xs.push_back(in);
  const auto& outs = g.outputs();
  bool tanh = seed->op_type == "Tanh";
  for (Value* x : xs) {
    std::vector<Node*> region = region_between(x, y);
    if (region.empty() || std::find(region.begin(), region.end(), seed) == region.end()) continue;
    if (x->type.dtype != DType::kFloat32 || !x->type.shape || !y->type.shape ||
        *x->type.shape != *y->type.shape)
      continue;
    std::unordered_set<Node*> inside(region.begin(), region.end());
    bool sealed = true;
    for (Node* n : region) {
      if (n->output(0) == y) continue;
      if (std::find(outs.begin(), outs.end(), n->output(0)) != outs.end()) sealed = false;
      for (const auto& use : n->output(0)->uses())
        if (!inside.count(use.first)) sealed = false;
    }
    if (!sealed || !computes_gelu(region, x, tanh)) continue;
    Node* gelu = g.add_node("Gelu", {x}, {}, "", region.back()->name);
    gelu->attributes["approximate"] = Attribute::of(std::string(tanh ? "tanh" : "none"));
    gelu->scope = common_scope(region);
    g.move_output(y, gelu, 0);
    for (auto it = region.rbegin(); it != region.rend(); ++it) {
      removed.insert(*it);
      g.remove_node(*it);
    }
    return true;
  }
  return false;
}

}  // namespace

size_t recognize_gelu(Graph& graph) {
  infer_shapes(graph);  // x and y must have one shape
  size_t rewrites = 0;
  std::vector<Node*> seeds;
  for (Node* n : graph.topological_order())
    if (n->domain.empty() && (n->op_type == "Tanh" || n->op_type == "Erf")) seeds.push_back(n);
  std::unordered_set<Node*> removed;
  for (Node* seed : seeds) {
    if (removed.count(seed)) continue;
    // y: the seed's output carried forward through single readers, farthest first.
    std::vector<Value*> ys;
    Value* v = seed->output(0);
    for (int step = 0; step < 4 && v; ++step) {
      const auto& uses = v->uses();
      if (uses.size() != 1 || !elementwise(*uses[0].first)) break;
      v = uses[0].first->output(0);
      ys.push_back(v);
    }
    for (auto it = ys.rbegin(); it != ys.rend(); ++it) {
      if (rewrite_at(graph, seed, *it, removed)) {
        ++rewrites;
        break;
      }
    }
  }
  return rewrites;
}

}  // namespace graphtrain
