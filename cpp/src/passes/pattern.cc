#include "passes/pattern.h"

#include <unordered_set>

namespace graphtrain {

Pattern Pattern::op(std::vector<std::string> ops, std::vector<Pattern> inputs, std::string name) {
  Pattern p;
  p.ops_ = std::move(ops);
  p.inputs_ = std::move(inputs);
  p.name_ = std::move(name);
  return p;
}

Pattern Pattern::any(std::string name) {
  Pattern p;
  p.name_ = std::move(name);
  return p;
}

Pattern& Pattern::where(std::function<bool(const Node&)> condition) {
  condition_ = std::move(condition);
  return *this;
}

Pattern& Pattern::shared() {
  shared_ = true;
  return *this;
}

bool Pattern::match(Node* root, Match& m) const {
  if (ops_.empty() || !root) return false;
  bool op_ok = false;
  for (const std::string& o : ops_) op_ok |= root->qualified_op() == o;
  if (!op_ok || root->inputs().size() < inputs_.size()) return false;
  if (condition_ && !condition_(*root)) return false;
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (!inputs_[i].match_value(root->input(i), m, true)) return false;
  if (!name_.empty()) m.nodes[name_] = root;
  return true;
}

bool Pattern::match_value(Value* v, Match& m, bool inner) const {
  if (ops_.empty()) {  // any
    if (!name_.empty()) m.values[name_] = v;
    return true;
  }
  if (!v || !v->producer()) return false;
  // An inner node that others read too would be lost by a rewrite that removes the match.
  if (inner && !shared_) {
    if (v->uses().size() != 1) return false;
    if (m.graph && is_graph_output(*m.graph, v)) return false;
  }
  if (!match(v->producer(), m)) return false;
  if (!name_.empty()) m.values[name_] = v;
  return true;
}

size_t rewrite_matches(Graph& graph, const Pattern& pattern,
                       const std::function<bool(Graph&, const Match&)>& rewrite) {
  size_t count = 0;
  std::unordered_set<const Node*> alive;
  for (Node* n : graph.nodes()) alive.insert(n);
  for (Node* n : graph.topological_order()) {
    // A rewrite may remove nodes later in the order: check against the graph's current nodes.
    if (!alive.count(n)) continue;
    Match m;
    m.graph = &graph;
    if (!pattern.match(n, m)) continue;
    if (rewrite(graph, m)) {
      ++count;
      alive.clear();
      for (Node* k : graph.nodes()) alive.insert(k);
    }
  }
  return count;
}

bool fusable_without_cycle(const std::vector<Node*>& nodes) {
  std::unordered_set<const Node*> inside(nodes.begin(), nodes.end());
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const Node* n : nodes)
    for (const Value* in : n->inputs())
      if (in && in->producer() && !inside.count(in->producer())) stack.push_back(in->producer());
  while (!stack.empty()) {
    const Node* m = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    for (const Value* in : m->inputs()) {
      if (!in || !in->producer()) continue;
      if (inside.count(in->producer())) return false;
      stack.push_back(in->producer());
    }
  }
  return true;
}

Node* replace_node(Graph& g, Node* n, const std::string& op_type, const std::string& domain,
                   const std::vector<Value*>& inputs) {
  Node* f = g.add_node(op_type, inputs, {}, domain, n->name);
  f->attributes = n->attributes;
  f->scope = n->scope;
  g.move_output(n->output(0), f, 0);
  g.remove_node(n);
  return f;
}

bool is_graph_output(const Graph& g, const Value* v) {
  for (const Value* out : g.outputs())
    if (out == v) return true;
  return false;
}

bool read_only_by(const Graph& g, const Value* v, const Node* reader) {
  return v && v->uses().size() == 1 && v->uses()[0].first == reader && !is_graph_output(g, v);
}

std::optional<float> scalar_factor(const Node& n, const Value* x) {
  if (n.inputs().size() != 2) return std::nullopt;
  bool div = n.op_type == "Div";
  if (div && n.input(0) != x) return std::nullopt;
  const Value* c = n.input(0) == x ? n.input(1) : n.input(0);
  const Tensor* t = constant_value(c);
  if (!t || !t->defined() || t->numel() != 1 || t->dtype() != DType::kFloat32) return std::nullopt;
  float v = t->data<float>()[0];
  if (div) return v == 0.0f ? std::nullopt : std::optional<float>(1.0f / v);
  return v;
}

bool softmax_over_last_axis(const Graph& g, const Node& softmax) {
  const Value* in = softmax.input(0);
  int64_t rank = in && in->type.shape ? static_cast<int64_t>(in->type.shape->size()) : -1;
  if (!softmax.has_attr("axis")) return g.opset("") >= 13 || rank == 2;
  int64_t axis = softmax.attr_int("axis", -1);
  return (axis == -1 && g.opset("") >= 13) || (rank > 0 && axis == rank - 1);
}

// The deepest module containing every node ("a.b.c" and "a.b.d" -> "a.b").
std::string common_scope(const std::vector<Node*>& nodes) {
  std::string scope = nodes[0]->scope;
  for (const Node* n : nodes) {
    const std::string& s = n->scope;
    size_t k = 0;
    while (k < scope.size() && k < s.size() && scope[k] == s[k]) ++k;
    bool whole = (k == scope.size() || scope[k] == '.') && (k == s.size() || s[k] == '.');
    if (!whole) {
      size_t dot = scope.rfind('.', k);
      k = dot == std::string::npos ? 0 : dot;
    }
    scope.resize(k);
  }
  return scope;
}

}  // namespace graphtrain
