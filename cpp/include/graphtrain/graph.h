// The IR: a graph of nodes (standard ONNX operators, or graphtrain's domain for the rest) and
// values (graph inputs, initializers, node outputs). Values are SSA: each has at most one producer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graphtrain/symbolic.h"
#include "graphtrain/tensor.h"

namespace graphtrain {

inline constexpr const char* kGraphtrainDomain = "graphtrain";

// "Add" (the ONNX domain) or "graphtrain::SoftmaxGrad": how errors and registries name an op.
std::string qualified_op_name(const std::string& domain, const std::string& op_type);

struct TensorType {
  DType dtype = DType::kUndefined;
  std::optional<SymShape> shape;  // nullopt: rank unknown
  std::string to_string() const;
};

struct Attribute {
  enum class Kind { kFloat, kInt, kString, kTensor, kFloats, kInts, kStrings };
  Kind kind = Kind::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;

  static Attribute of(float v);
  static Attribute of(int64_t v);
  static Attribute of(std::string v);
  static Attribute of(Tensor v);
  static Attribute of(std::vector<float> v);
  static Attribute of(std::vector<int64_t> v);
  static Attribute of(std::vector<std::string> v);
};
const char* to_string(Attribute::Kind kind);

class Node;

class Value {
 public:
  const std::string& name() const { return name_; }
  Node* producer() const { return producer_; }
  int producer_output() const { return producer_output_; }
  // Each (node, input index) reading this value.
  const std::vector<std::pair<Node*, int>>& uses() const { return uses_; }
  bool is_initializer() const { return initializer.defined(); }

  TensorType type;
  Tensor initializer;  // defined for constants stored in the graph
  // Shape inference: the symbolic contents of a small integer tensor (a shape being computed).
  std::optional<std::vector<SymDim>> sym_value;

 private:
  friend class Graph;
  explicit Value(std::string name) : name_(std::move(name)) {}
  std::string name_;
  Node* producer_ = nullptr;
  int producer_output_ = -1;
  std::vector<std::pair<Node*, int>> uses_;
};

class Node {
 public:
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the standard ONNX domain
  std::string scope;   // module path this node came from ("encoder.layers.0.attn"), may be empty
  std::map<std::string, Attribute> attributes;

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  // Input i, or nullptr when it is absent (left out or an empty name).
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }

  bool has_attr(const std::string& n) const { return attributes.count(n) != 0; }
  int64_t attr_int(const std::string& n, int64_t def) const;
  float attr_float(const std::string& n, float def) const;
  std::string attr_string(const std::string& n, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& n, std::vector<int64_t> def = {}) const;
  std::vector<float> attr_floats(const std::string& n) const;
  const Tensor* attr_tensor(const std::string& n) const;
  // Throws naming the node when a required attribute is missing or of another kind.
  const Attribute& attr(const std::string& n, Attribute::Kind kind) const;

  // "node 'name' (Op)", plus " in module 'scope'" when known: used in every error about a node.
  std::string describe() const;
  std::string qualified_op() const;  // "Add" or "graphtrain::SoftmaxGrad"
  // The order of creation in its graph: a node made later has a larger serial (a node's address
  // may be that of one removed before it).
  uint64_t serial() const { return serial_; }

 private:
  friend class Graph;
  Node() = default;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  uint64_t serial_ = 0;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  std::string name = "graph";
  std::map<std::string, int64_t> opset_imports;  // domain -> version ("" is ONNX)
  int64_t ir_version = 8;

  Value* find(std::string_view name) const;
  Value* get(std::string_view name) const;  // throws naming the value when absent
  // A value of the given name, which must be new.
  Value* add_value(const std::string& name);
  std::string unique_name(std::string_view prefix);

  Value* add_input(const std::string& name, TensorType type);
  Value* add_initializer(const std::string& name, Tensor tensor);
  void add_output(Value* v);
  // Turns an initializer into a graph input of the same type (its tensor is dropped).
  void promote_to_input(Value* initializer);
  void set_outputs(std::vector<Value*> outputs) { outputs_ = std::move(outputs); }
  void set_inputs(std::vector<Value*> inputs) { inputs_ = std::move(inputs); }

  // A node reading `inputs` (nullptr for an absent optional input) and producing new values named
  // `outputs` (an empty name for an absent optional output).
  Node* add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                 const std::vector<std::string>& outputs, const std::string& domain = "",
                 const std::string& name = "");
  // Convenience: one output named uniquely after the op.
  Value* add_op(const std::string& op_type, const std::vector<Value*>& inputs,
                std::map<std::string, Attribute> attributes = {}, const std::string& domain = "");
  void remove_node(Node* node);  // its outputs must be unused
  // Gives `node` an output at `index` (an optional output it did not produce before).
  Value* set_node_output(Node* node, size_t index, const std::string& name);
  void replace_input(Node* node, size_t index, Value* v);
  void replace_all_uses(Value* from, Value* to);
  // Makes `v` output `index` of `to` (a rewrite keeps the value, its name and its readers); its
  // old producer loses that output.
  void move_output(Value* v, Node* to, size_t index);

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  std::vector<Value*> initializers() const;
  size_t num_nodes() const { return nodes_.size(); }
  // The serial the next node will get: nodes made from now on have serials at least this.
  uint64_t next_node_serial() const { return nodes_made_; }
  std::vector<Node*> nodes() const;  // in insertion order
  // Producers before consumers; throws GraphError naming a node on a cycle.
  std::vector<Node*> topological_order() const;

  int64_t opset(const std::string& domain = "") const;

 private:
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<Value>> values_;
  std::unordered_map<std::string, Value*> by_name_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  int64_t name_counter_ = 0;
  uint64_t nodes_made_ = 0;  // the next node's serial
};

// The tensor a value holds when it is a constant (an initializer, or a Constant node's `value`),
// else nullptr.
const Tensor* constant_value(const Value* v);

}  // namespace graphtrain
