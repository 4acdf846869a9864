// Pass fuse_elementwise: chains of float elementwise ops of one output shape become one
// graphtrain::FusedElementwise node, whose kernel (kernels/cpu/fused_elementwise.cc) runs the whole
// chain in one loop over the data: GELU's tanh form (Pow, Mul, Add, Tanh, ...) and its gradient,
// bias + activation (a graphtrain::Gelu's derivative, its output 1, a second instruction of the
// program), scale + shift, a select by a comparison (hardtanh). Inputs of the chain may
// broadcast (a bias, a [B, T, 1] scale); scalar constants become constants of the program. Bool
// values (comparisons, logic, a mask from outside) are registers of 1s and 0s in the program.
//
// Nodes join a group in topological order: a node joins the group of one of its producers when
// they have the same output shape and none of its other inputs depends on that group (which
// would make a cycle). A group of one node stays as it is. Values the group makes that something
// outside reads (or graph outputs) are the fused node's outputs, under their own names.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "graphtrain/strings.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

// ONNX / graphtrain op -> the program's op name and the node inputs it reads. `kinds`: what each
// input and the output are, f float, b bool (a float input may also be a scalar constant).
struct Fusible {
  const char* domain;
  const char* op;
  int inputs;
  const char* kinds = "fff";
};

constexpr Fusible kFusible[] = {
    {"", "Add", 2},
    {"", "Sub", 2},
    {"", "Mul", 2},
    {"", "Div", 2},
    {"", "Max", 2},
    {"", "Min", 2},
    {"", "Pow", 2},
    {"", "Neg", 1},
    {"", "Abs", 1},
    {"", "Sqrt", 1},
    {"", "Reciprocal", 1},
    {"", "Exp", 1},
    {"", "Log", 1},
    {"", "Tanh", 1},
    {"", "Erf", 1},
    {"", "Sigmoid", 1},
    {"", "Relu", 1},
    {"", "LeakyRelu", 1},
    {"", "Gelu", 1},
    {"graphtrain", "Gelu", 1},  // and its derivative (output 1), a second instruction
    {"", "Sin", 1},
    {"", "Cos", 1},
    {"graphtrain", "ReluGrad", 2},
    {"graphtrain", "SigmoidGrad", 2},
    {"graphtrain", "TanhGrad", 2},
    {"graphtrain", "LeakyReluGrad", 2},
    {"graphtrain", "GeluGrad", 2},
    // Comparisons and logic make bool values, held in the program as 1s and 0s; Where reads them.
    {"", "Less", 2, "ffb"},
    {"", "Greater", 2, "ffb"},
    {"", "LessOrEqual", 2, "ffb"},
    {"", "GreaterOrEqual", 2, "ffb"},
    {"", "Equal", 2, "ffb"},
    {"", "And", 2, "bbb"},
    {"", "Or", 2, "bbb"},
    {"", "Not", 1, "bb"},
    {"", "Where", 3, "bfff"},
    {"", "Clip", 3, "ffff"},  // constant bounds only (below)
};

// A float scalar constant (initializer or Constant node) that can become a program constant.
const Tensor* scalar_constant(const Value* v) {
  const Tensor* t = constant_value(v);
  if (!t || !t->defined() || t->numel() != 1) return nullptr;
  DType d = t->dtype();
  return (d == DType::kFloat32 || d == DType::kInt64 || d == DType::kInt32) ? t : nullptr;
}

bool is_tensor(const Value* v, char kind) {
  DType want = kind == 'b' ? DType::kBool : DType::kFloat32;
  return v && v->type.dtype == want && v->type.shape.has_value();
}

// graphtrain::Gelu's derivative output (stash_gelu_derivative), or nullptr.
Value* derivative_of(const Node& n) {
  return n.op_type == "Gelu" && n.domain == kGraphtrainDomain && n.outputs().size() == 2
             ? n.output(1)
             : nullptr;
}

// The program op of a node that can be fused, or "" (a node the pass leaves alone).
std::string program_op(const Node& n) {
  const Fusible* f = nullptr;
  for (const Fusible& x : kFusible)
    if (n.op_type == x.op && n.domain == x.domain) f = &x;
  if (!f || n.inputs().size() != static_cast<size_t>(f->inputs) ||
      n.outputs().size() != (derivative_of(n) ? 2u : 1u) ||
      !is_tensor(n.output(0), f->kinds[f->inputs]))
    return "";
  size_t rank = n.output(0)->type.shape->size();
  bool any_tensor = false;
  for (size_t i = 0; i < n.inputs().size(); ++i) {
    const Value* in = n.input(i);
    if (const Tensor* c = scalar_constant(in); c && c->rank() <= rank && f->kinds[i] == 'f')
      continue;
    // A Pow's exponent and a Clip's bounds: constants.
    if (!is_tensor(in, f->kinds[i]) || (n.op_type == "Pow" && i == 1) ||
        (n.op_type == "Clip" && i > 0))
      return "";
    any_tensor = true;
  }
  if (!any_tensor) return "";
  std::string op = n.op_type;
  if ((op == "Gelu" || op == "GeluGrad") && n.attr_string("approximate", "none") == "tanh")
    op = op == "Gelu" ? "GeluTanh" : "GeluTanhGrad";
  else if ((op == "Gelu" || op == "GeluGrad") && n.attr_string("approximate", "none") != "none")
    return "";
  return op;
}

struct Group {
  std::vector<Node*> members;  // in topological order
  size_t first = 0;            // topological index of the first member
};

class Fuser {
 public:
  explicit Fuser(Graph& graph) : graph_(graph), order_(graph.topological_order()) {
    for (size_t i = 0; i < order_.size(); ++i) index_[order_[i]] = i;
  }

  size_t run() {
    for (Node* n : order_) {
      std::string op = program_op(*n);
      if (op.empty()) continue;
      ops_[n] = op;
      // n joins (and so merges) every producer's group it legally can.
      std::vector<int> joined;
      for (Value* in : n->inputs()) {
        Node* p = in ? in->producer() : nullptr;
        auto g = p ? group_of_.find(p) : group_of_.end();
        if (g == group_of_.end() || *p->output(0)->type.shape != *n->output(0)->type.shape ||
            std::find(joined.begin(), joined.end(), g->second) != joined.end())
          continue;
        joined.push_back(g->second);
        if (!acyclic(joined, n)) joined.pop_back();
      }
      int target = joined.empty() ? static_cast<int>(groups_.size()) : joined[0];
      if (joined.empty()) groups_.push_back({{}, index_[n]});
      Group& group = groups_[static_cast<size_t>(target)];
      for (size_t j = 1; j < joined.size(); ++j) {
        Group& other = groups_[static_cast<size_t>(joined[j])];
        for (Node* m : other.members) {
          group.members.push_back(m);
          group_of_[m] = target;
        }
        group.first = std::min(group.first, other.first);
        other.members.clear();
      }
      group.members.push_back(n);
      group_of_[n] = target;
    }
    size_t fused = 0;
    for (size_t g = 0; g < groups_.size(); ++g) {
      Group& group = groups_[g];
      std::sort(group.members.begin(), group.members.end(),
                [&](Node* a, Node* b) { return index_.at(a) < index_.at(b); });
      if (group.members.size() >= 2 && fuse(group, static_cast<int>(g))) ++fused;
    }
    return fused;
  }

 private:
  // Whether the groups `gs` and n, made one node, leave the graph acyclic: no value they read
  // from outside depends on any of them.
  bool acyclic(const std::vector<int>& gs, Node* n) const {
    auto inside = [&](Node* m) {
      if (m == n) return true;
      auto it = group_of_.find(m);
      return it != group_of_.end() && std::find(gs.begin(), gs.end(), it->second) != gs.end();
    };
    size_t first = index_.at(n);
    std::vector<Node*> stack;
    auto push_inputs = [&](Node* m) {
      for (Value* in : m->inputs())
        if (in && in->producer() && !inside(in->producer())) stack.push_back(in->producer());
    };
    push_inputs(n);
    for (int g : gs) {
      first = std::min(first, groups_[static_cast<size_t>(g)].first);
      for (Node* m : groups_[static_cast<size_t>(g)].members) push_inputs(m);
    }
    std::unordered_set<Node*> seen;
    while (!stack.empty()) {
      Node* m = stack.back();
      stack.pop_back();
      if (!seen.insert(m).second || index_.at(m) < first) continue;
      if (inside(m)) return false;
      for (Value* in : m->inputs())
        if (in && in->producer()) stack.push_back(in->producer());
    }
    return true;
  }

  bool in_group(Node* n, int g) const {
    auto it = group_of_.find(n);
    return it != group_of_.end() && it->second == g;
  }

  bool fuse(const Group& group, int g) {
    const SymShape& shape = *group.members.back()->output(0)->type.shape;
    std::vector<Value*> inputs;
    std::vector<float> constants;
    auto input_index = [&](Value* v) {
      for (size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i] == v) return static_cast<int>(i);
      inputs.push_back(v);
      return static_cast<int>(inputs.size() - 1);
    };
    auto constant_index = [&](float c) {
      for (size_t i = 0; i < constants.size(); ++i)
        if (std::memcmp(&constants[i], &c, sizeof(float)) == 0) return static_cast<int>(i);
      constants.push_back(c);
      return static_cast<int>(constants.size() - 1);
    };
    // One instruction per member, and one more for a graphtrain::Gelu's derivative (reading the
    // same operands): the op, its operands as (kind, index): 0 input, 1 constant, 2 instruction,
    // and the value it makes.
    std::vector<std::string> op_names;
    std::vector<std::vector<std::pair<int, int>>> operands;
    std::vector<Value*> values;
    std::unordered_map<const Value*, int> made;  // member output -> instruction
    for (Node* n : group.members) {
      std::vector<std::pair<int, int>> ops;
      for (Value* in : n->inputs()) {
        auto m = made.find(in);
        if (m != made.end())
          ops.emplace_back(2, m->second);
        else if (const Tensor* c = scalar_constant(in))
          ops.emplace_back(1, constant_index(static_cast<float>(c->as_double(0))));
        else
          ops.emplace_back(0, input_index(in));
      }
      if (n->op_type == "LeakyRelu" || n->op_type == "LeakyReluGrad")
        ops.emplace_back(1, constant_index(n->attr_float("alpha", 0.01f)));
      Value* derivative = derivative_of(*n);
      for (Value* v : {n->output(0), derivative}) {
        if (!v) continue;
        made[v] = static_cast<int>(values.size());
        op_names.push_back(ops_.at(n) + (v == derivative ? "Derivative" : ""));
        operands.push_back(ops);
        values.push_back(v);
      }
    }
    // The program's inputs must broadcast to the group's shape by themselves (a scalar constant
    // of higher rank than every input could otherwise have raised the rank).
    size_t rank = 0;
    for (Value* in : inputs) rank = std::max(rank, in->type.shape->size());
    if (rank != shape.size()) return false;
    for (size_t d = 0; d < shape.size(); ++d) {
      bool found = shape[d] == SymDim(1);
      for (Value* in : inputs) {
        const SymShape& s = *in->type.shape;
        if (d + s.size() >= shape.size() && s[d + s.size() - shape.size()] == shape[d])
          found = true;
      }
      if (!found) return false;
    }

    const int base = static_cast<int>(inputs.size() + constants.size());
    auto reg = [&](std::pair<int, int> o) {
      return o.first == 0   ? o.second
             : o.first == 1 ? static_cast<int>(inputs.size()) + o.second
                            : base + o.second;
    };
    std::vector<int64_t> args;
    for (const auto& ops : operands)
      for (size_t j = 0; j < 3; ++j) args.push_back(j < ops.size() ? reg(ops[j]) : -1);
    std::unordered_set<const Value*> graph_outputs(graph_.outputs().begin(),
                                                   graph_.outputs().end());
    std::vector<Value*> outputs;
    std::vector<int64_t> output_regs;
    for (size_t k = 0; k < values.size(); ++k) {
      Value* v = values[k];
      bool outside = graph_outputs.count(v) != 0;
      for (const auto& [reader, _] : v->uses()) outside |= !in_group(reader, g);
      if (outside) {
        outputs.push_back(v);
        output_regs.push_back(base + static_cast<int>(k));
      }
    }

    std::string name = "Fused";
    for (size_t k = 0; k < op_names.size() && name.size() < 48; ++k) name += "_" + op_names[k];
    Node* fused = graph_.add_node("FusedElementwise", inputs, {}, kGraphtrainDomain,
                                  graph_.unique_name(name));
    fused->scope = common_scope(group.members);
    fused->attributes["ops"] = Attribute::of(op_names);
    fused->attributes["args"] = Attribute::of(args);
    if (!constants.empty()) fused->attributes["constants"] = Attribute::of(constants);
    fused->attributes["outputs"] = Attribute::of(output_regs);
    std::vector<int64_t> bool_outputs;
    for (size_t o = 0; o < outputs.size(); ++o)
      if (outputs[o]->type.dtype == DType::kBool) bool_outputs.push_back(static_cast<int64_t>(o));
    if (!bool_outputs.empty()) fused->attributes["bool_outputs"] = Attribute::of(bool_outputs);
    for (size_t o = 0; o < outputs.size(); ++o) graph_.move_output(outputs[o], fused, o);
    for (size_t k = group.members.size(); k-- > 0;) graph_.remove_node(group.members[k]);
    return true;
  }

  Graph& graph_;
  std::vector<Node*> order_;
  std::unordered_map<const Node*, size_t> index_;
  std::unordered_map<const Node*, std::string> ops_;
  std::unordered_map<Node*, int> group_of_;
  std::vector<Group> groups_;
};

}  // namespace

size_t fuse_elementwise(Graph& graph) {
  infer_shapes(graph);  // the pass groups by output shape: every value gets its type first
  return Fuser(graph).run();
}

}  // namespace graphtrain
