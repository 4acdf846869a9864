// A small pattern matcher for rewrites, so a fusion reads as a pattern and a replacement:
//
//   Pattern t = Pattern::op({"Transpose"}, {Pattern::any("x")}, "t").where(swaps_last_two);
//   Pattern p = Pattern::op({"MatMul", "graphtrain::FusedMatMul"}, {t, Pattern::any("b")}, "mm");
//   rewrite_matches(graph, p, [](Graph& g, const Match& m) { ... return true; });
//
// A pattern is an op (one of several qualified names) whose inputs match sub-patterns in order
// (inputs beyond the listed ones match anything), or `any`, which matches any value (absent ones
// too). Matched nodes and values are kept by name. An inner node's output must be read only by
// the match and be no graph output, unless the pattern allows sharing, so a rewrite that removes
// the match never loses a value someone else reads.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graphtrain/graph.h"

namespace graphtrain {

struct Match {
  const Graph* graph = nullptr;  // set by rewrite_matches: its outputs are never inner values
  std::map<std::string, Node*> nodes;
  std::map<std::string, Value*> values;
  Node* node(const std::string& name) const { return nodes.at(name); }
  Value* value(const std::string& name) const { return values.at(name); }
};

class Pattern {
 public:
  static Pattern op(std::vector<std::string> ops, std::vector<Pattern> inputs = {},
                    std::string name = "");
  static Pattern any(std::string name = "");
  // An extra condition on the matched node.
  Pattern& where(std::function<bool(const Node&)> condition);
  // An inner node whose outputs others read too may match (it stays for them).
  Pattern& shared();

  // Whether `root` matches this op pattern, filling `m`.
  bool match(Node* root, Match& m) const;

 private:
  bool match_value(Value* v, Match& m, bool inner) const;
  std::vector<std::string> ops_;  // empty: `any`
  std::vector<Pattern> inputs_;
  std::string name_;
  std::function<bool(const Node&)> condition_;
  bool shared_ = false;
};

// Calls `rewrite` for every node, in topological order, that matches `pattern` (as matched at that
// moment); returns how many rewrites returned true. Nodes removed by an earlier rewrite are
// skipped.
size_t rewrite_matches(Graph& graph, const Pattern& pattern,
                       const std::function<bool(Graph&, const Match&)>& rewrite);

// Whether `nodes`, replaced by one node, leave the graph acyclic: no value they read from outside
// is computed from any of them (a node placed after another's output, like a ShardGather after
// its module's input, can read a shared inner value).
bool fusable_without_cycle(const std::vector<Node*>& nodes);

// Replaces `n` by a node of `op_type` in `domain` reading `inputs`, with n's name, attributes and
// scope; n's output 0 (the value, its name and its readers) becomes the new node's output 0, and
// n is removed (its other outputs must be unread). Returns the new node.
Node* replace_node(Graph& g, Node* n, const std::string& op_type, const std::string& domain,
                   const std::vector<Value*>& inputs);

// Whether v is one of the graph's outputs.
bool is_graph_output(const Graph& g, const Value* v);

// Whether n is an ONNX (default domain) node of op `op`; false for null.
inline bool is_onnx_op(const Node* n, const char* op) {
  return n && n->op_type == op && n->domain.empty();
}

// Whether v is read by nothing but `reader` (once) and is no graph output: a rewrite that removes
// `reader` may remove v's producer too.
bool read_only_by(const Graph& g, const Value* v, const Node* reader);

// The multiplier of `x` in `n`, a Mul or Div of x by a float scalar constant (x / c: 1 / c);
// nullopt for anything else.
std::optional<float> scalar_factor(const Node& n, const Value* x);

// Whether a Softmax normalizes over its input's last axis (before opset 13 it flattens from
// `axis`, default 1: the last axis only when it says so).
bool softmax_over_last_axis(const Graph& g, const Node& softmax);

// The deepest module scope containing every node ("a.b.c" and "a.b.d" -> "a.b"), for the node a
// rewrite puts in their place.
std::string common_scope(const std::vector<Node*>& nodes);

}  // namespace graphtrain
