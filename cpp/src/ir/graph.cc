#include "graphtrain/graph.h"

#include <algorithm>
#include <queue>

#include "graphtrain/error.h"
#include "graphtrain/strings.h"

namespace graphtrain {

std::string TensorType::to_string() const {
  std::string out = graphtrain::to_string(dtype);
  out += shape ? sym_shape_to_string(*shape) : "[?]";
  return out;
}

Attribute Attribute::of(float v) {
  Attribute a;
  a.kind = Kind::kFloat;
  a.f = v;
  return a;
}
Attribute Attribute::of(int64_t v) {
  Attribute a;
  a.kind = Kind::kInt;
  a.i = v;
  return a;
}
Attribute Attribute::of(std::string v) {
  Attribute a;
  a.kind = Kind::kString;
  a.s = std::move(v);
  return a;
}
Attribute Attribute::of(Tensor v) {
  Attribute a;
  a.kind = Kind::kTensor;
  a.t = std::move(v);
  return a;
}
Attribute Attribute::of(std::vector<float> v) {
  Attribute a;
  a.kind = Kind::kFloats;
  a.floats = std::move(v);
  return a;
}
Attribute Attribute::of(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Kind::kInts;
  a.ints = std::move(v);
  return a;
}
Attribute Attribute::of(std::vector<std::string> v) {
  Attribute a;
  a.kind = Kind::kStrings;
  a.strings = std::move(v);
  return a;
}

const char* to_string(Attribute::Kind kind) {
  switch (kind) {
    case Attribute::Kind::kFloat:
      return "float";
    case Attribute::Kind::kInt:
      return "int";
    case Attribute::Kind::kString:
      return "string";
    case Attribute::Kind::kTensor:
      return "tensor";
    case Attribute::Kind::kFloats:
      return "floats";
    case Attribute::Kind::kInts:
      return "ints";
    case Attribute::Kind::kStrings:
      return "strings";
  }
  return "?";
}

const Attribute& Node::attr(const std::string& n, Attribute::Kind kind) const {
  auto it = attributes.find(n);
  if (it == attributes.end())
    throw GraphError(describe() + ": required attribute '" + n + "' is missing");
  if (it->second.kind != kind)
    throw GraphError(str_cat(describe(), ": attribute '", n, "' is of kind ",
                             to_string(it->second.kind), ", expected ", to_string(kind)));
  return it->second;
}

int64_t Node::attr_int(const std::string& n, int64_t def) const {
  return has_attr(n) ? attr(n, Attribute::Kind::kInt).i : def;
}
float Node::attr_float(const std::string& n, float def) const {
  return has_attr(n) ? attr(n, Attribute::Kind::kFloat).f : def;
}
std::string Node::attr_string(const std::string& n, const std::string& def) const {
  return has_attr(n) ? attr(n, Attribute::Kind::kString).s : def;
}
std::vector<int64_t> Node::attr_ints(const std::string& n, std::vector<int64_t> def) const {
  return has_attr(n) ? attr(n, Attribute::Kind::kInts).ints : def;
}
std::vector<float> Node::attr_floats(const std::string& n) const {
  return has_attr(n) ? attr(n, Attribute::Kind::kFloats).floats : std::vector<float>{};
}
const Tensor* Node::attr_tensor(const std::string& n) const {
  return has_attr(n) ? &attr(n, Attribute::Kind::kTensor).t : nullptr;
}

std::string qualified_op_name(const std::string& domain, const std::string& op_type) {
  return domain.empty() ? op_type : domain + "::" + op_type;
}

std::string Node::qualified_op() const {
  return qualified_op_name(domain, op_type);
}

std::string Node::describe() const {
  std::string out = "node '" + name + "' (" + qualified_op() + ")";
  if (!scope.empty()) out += " in module '" + scope + "'";
  return out;
}

Value* Graph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : it->second;
}

Value* Graph::get(std::string_view name) const {
  Value* v = find(name);
  if (!v)
    throw GraphError("graph '" + this->name + "' has no value named '" + std::string(name) + "'");
  return v;
}

Value* Graph::add_value(const std::string& name) {
  if (name.empty()) throw GraphError("graph '" + this->name + "': a value needs a name");
  if (by_name_.count(name))
    throw GraphError("graph '" + this->name + "': value '" + name +
                     "' is defined twice (a value has one producer)");
  values_.push_back(std::unique_ptr<Value>(new Value(name)));
  Value* v = values_.back().get();
  by_name_[name] = v;
  return v;
}

std::string Graph::unique_name(std::string_view prefix) {
  for (;;) {
    std::string candidate = str_cat(prefix, "_", name_counter_++);
    if (!by_name_.count(candidate)) return candidate;
  }
}

Value* Graph::add_input(const std::string& name, TensorType type) {
  Value* v = add_value(name);
  v->type = std::move(type);
  inputs_.push_back(v);
  return v;
}

Value* Graph::add_initializer(const std::string& name, Tensor tensor) {
  Value* v = add_value(name);
  v->type.dtype = tensor.dtype();
  SymShape shape;
  for (int64_t d : tensor.shape()) shape.emplace_back(d);
  v->type.shape = shape;
  v->initializer = std::move(tensor);
  return v;
}

void Graph::add_output(Value* v) {
  outputs_.push_back(v);
}

void Graph::promote_to_input(Value* v) {
  if (!v->is_initializer()) throw GraphError("'" + v->name() + "' is not an initializer");
  v->initializer = Tensor();
  inputs_.push_back(v);
}

Node* Graph::add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                      const std::vector<std::string>& outputs, const std::string& domain,
                      const std::string& name) {
  nodes_.push_back(std::unique_ptr<Node>(new Node()));
  Node* n = nodes_.back().get();
  n->serial_ = nodes_made_++;
  n->op_type = op_type;
  n->domain = domain;
  n->name = name.empty() ? unique_name(op_type) : name;
  n->inputs_ = inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i]) inputs[i]->uses_.emplace_back(n, static_cast<int>(i));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].empty()) {
      n->outputs_.push_back(nullptr);
      continue;
    }
    Value* v = add_value(outputs[i]);
    v->producer_ = n;
    v->producer_output_ = static_cast<int>(i);
    n->outputs_.push_back(v);
  }
  return n;
}

Value* Graph::add_op(const std::string& op_type, const std::vector<Value*>& inputs,
                     std::map<std::string, Attribute> attributes, const std::string& domain) {
  Node* n = add_node(op_type, inputs, {unique_name(op_type + "_out")}, domain);
  n->attributes = std::move(attributes);
  return n->outputs_[0];
}

void Graph::remove_node(Node* node) {
  for (Value* out : node->outputs_)
    if (out && !out->uses_.empty())
      throw GraphError("cannot remove " + node->describe() + ": its output '" + out->name() +
                       "' is still used");
  for (Value* in : node->inputs_)
    if (in) std::erase_if(in->uses_, [node](const auto& u) { return u.first == node; });
  for (Value* out : node->outputs_) {
    if (!out) continue;
    by_name_.erase(out->name());
    std::erase_if(values_, [out](const auto& p) { return p.get() == out; });
  }
  std::erase_if(nodes_, [node](const auto& p) { return p.get() == node; });
}

Value* Graph::set_node_output(Node* node, size_t index, const std::string& name) {
  if (index < node->outputs_.size() && node->outputs_[index])
    throw GraphError(node->describe() + " already has output " + std::to_string(index));
  Value* v = add_value(name);
  v->producer_ = node;
  v->producer_output_ = static_cast<int>(index);
  if (node->outputs_.size() <= index) node->outputs_.resize(index + 1, nullptr);
  node->outputs_[index] = v;
  return v;
}

void Graph::replace_input(Node* node, size_t index, Value* v) {
  Value* old = node->inputs_.at(index);
  if (old) {
    auto& uses = old->uses_;
    auto it = std::find(uses.begin(), uses.end(), std::make_pair(node, static_cast<int>(index)));
    if (it != uses.end()) uses.erase(it);
  }
  node->inputs_[index] = v;
  if (v) v->uses_.emplace_back(node, static_cast<int>(index));
}

void Graph::replace_all_uses(Value* from, Value* to) {
  auto uses = from->uses_;
  for (auto [node, index] : uses) replace_input(node, static_cast<size_t>(index), to);
  for (auto& out : outputs_)
    if (out == from) out = to;
}

const Tensor* constant_value(const Value* v) {
  if (!v) return nullptr;
  if (v->is_initializer()) return &v->initializer;
  const Node* p = v->producer();
  if (p && p->op_type == "Constant" && p->domain.empty()) return p->attr_tensor("value");
  return nullptr;
}

void Graph::move_output(Value* v, Node* to, size_t index) {
  if (index < to->outputs_.size() && to->outputs_[index])
    throw GraphError(to->describe() + " already has output " + std::to_string(index));
  if (Node* from = v->producer_) from->outputs_[static_cast<size_t>(v->producer_output_)] = nullptr;
  if (to->outputs_.size() <= index) to->outputs_.resize(index + 1, nullptr);
  to->outputs_[index] = v;
  v->producer_ = to;
  v->producer_output_ = static_cast<int>(index);
}

std::vector<Value*> Graph::initializers() const {
  std::vector<Value*> out;
  for (const auto& v : values_)
    if (v->is_initializer()) out.push_back(v.get());
  return out;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

std::vector<Node*> Graph::topological_order() const {
  // Kahn's algorithm; of the nodes ready, the earliest inserted runs first. The insertion order
  // is a schedule: a graph's own order for an imported one, and for a gradient graph the order
  // the builder emitted (each forward node's gradients together, in reverse), so that a layer's
  // weight gradient is computed (and its inputs freed, its gradient handed on) before the next
  // layer's input gradient rather than all at the end.
  std::unordered_map<const Node*, size_t> index;
  std::unordered_map<const Node*, size_t> pending;
  for (size_t k = 0; k < nodes_.size(); ++k) {
    const Node* n = nodes_[k].get();
    index[n] = k;
    size_t count = 0;
    for (Value* in : n->inputs_)
      if (in && in->producer_) ++count;
    pending[n] = count;
  }
  std::vector<Node*> order;
  order.reserve(nodes_.size());
  auto later = [&](const Node* a, const Node* b) { return index.at(a) > index.at(b); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later)> ready(later);
  for (const auto& n : nodes_)
    if (pending[n.get()] == 0) ready.push(n.get());
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    order.push_back(n);
    for (Value* out : n->outputs_) {
      if (!out) continue;
      for (auto [user, idx] : out->uses_)
        if (--pending[user] == 0) ready.push(user);
    }
  }
  if (order.size() != nodes_.size()) {
    for (const auto& n : nodes_)
      if (pending[n.get()] != 0)
        throw GraphError("graph '" + name + "' has a cycle through " + n->describe());
  }
  return order;
}

int64_t Graph::opset(const std::string& domain) const {
  auto it = opset_imports.find(domain);
  if (it != opset_imports.end()) return it->second;
  if (domain == "ai.onnx") return opset("");
  return 0;
}

}  // namespace graphtrain
