// The gradient graph builder. From a forward graph, the outputs that receive gradients and the
// inputs that want them, it builds a backward graph and a forward graph that also returns exactly
// the values the backward graph reads ("stashed" values).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graphtrain/graph.h"

namespace graphtrain {

struct GradientRequest {
  // Forward outputs that receive gradients.
  std::vector<std::string> outputs;
  // When true, each output's incoming gradient is ones (a scalar loss); otherwise the backward
  // graph takes one input per output, named "<output>_grad", supplied at run time.
  bool seed_with_ones = false;
  // Forward graph inputs or initializers that want gradients.
  std::vector<std::string> wrt;
};

struct GradientGraphs {
  Graph forward;   // the forward graph; its outputs: the original ones, then `stashed`
  Graph backward;  // inputs: `grad_inputs`, then `stashed`; outputs: one per non-empty `grads`
  std::vector<std::string> stashed;      // forward values the backward graph reads
  std::vector<std::string> grad_inputs;  // incoming gradients (empty when seeded with ones)
  // Per `wrt` entry: the backward output holding its gradient, or "" when no requested output
  // depends on it (its gradient is zero).
  std::vector<std::string> grads;
};

// Throws GraphError naming the op and the input when an op on a gradient path has no rule.
GradientGraphs build_gradient_graphs(const Graph& forward, const GradientRequest& request);

// An int64 attribute value (rules build attribute maps from int literals and booleans).
inline Attribute int_attr(int64_t v) {
  return Attribute::of(v);
}

// ---- gradient rules -----------------------------------------------------------------------------

class GradientBuilder;

// What a rule sees: the forward node (in the graph being built), the gradients of its outputs,
// and which inputs want a gradient. Rules emit ordinary nodes through op().
class GradientContext {
 public:
  GradientContext(GradientBuilder& builder, Node& node, std::vector<Value*> output_grads,
                  std::vector<bool> wants)
      : builder_(builder),
        node_(node),
        output_grads_(std::move(output_grads)),
        wants_(std::move(wants)) {}

  Node& node() const { return node_; }
  Value* input(size_t i) const { return node_.input(i); }
  // The forward output i; for an optional output the forward node did not produce, the builder
  // adds it (LayerNormalization's mean, Dropout's mask, MaxPool's indices, ...).
  Value* output(size_t i);
  // Incoming gradient of output i, or nullptr when nothing downstream needs it.
  Value* output_grad(size_t i) const {
    return i < output_grads_.size() ? output_grads_[i] : nullptr;
  }
  bool wants(size_t input) const { return input < wants_.size() && wants_[input]; }
  void set_grad(size_t input, Value* grad);
  // Runs `replace` on input i's whole gradient once every reader of the input has given its part
  // (when the pass reaches the input's producer, or at the end for a graph input), with a context
  // of this node; what it returns becomes the gradient. Torch runs a tensor's hooks so, on its
  // summed gradient.
  using Replacer = std::function<Value*(GradientContext&, Value*)>;
  void on_whole_grad(size_t input, Replacer replace);
  // The same for a value upstream of input i (the rule knows they are one tensor in torch).
  void on_whole_grad(size_t input, Value* upstream, Replacer replace);
  // Sets input i's gradient to `grad` reduced to the input's shape (undoes broadcasting), when
  // the input wants one.
  void set_grad_reduced(size_t input, Value* grad);

  // Emits a node in the gradient graph; returns its first output.
  Value* op(const std::string& op_type, const std::vector<Value*>& inputs,
            std::map<std::string, Attribute> attributes = {}, const std::string& domain = "");
  // Emits a node with several outputs; returns them (nullptr where `want` is false).
  std::vector<Value*> op_n(const std::string& op_type, const std::vector<Value*>& inputs,
                           size_t num_outputs, std::map<std::string, Attribute> attributes = {},
                           const std::string& domain = "", std::vector<bool> want = {});
  Value* constant(float value);  // a float32 scalar
  Value* constant_ints(const std::vector<int64_t>& values);
  Value* shape_of(Value* v);  // Shape(v), computed in the forward pass (only the shape is kept)
  // grad reduced to the shape of `like` (undoes broadcasting), symbolic shapes included.
  Value* reduce_to_shape(Value* grad, Value* like);

  [[noreturn]] void fail(const std::string& message) const;

 private:
  GradientBuilder& builder_;
  Node& node_;
  std::vector<Value*> output_grads_;
  std::vector<bool> wants_;
};

using GradientRule = std::function<void(GradientContext&)>;
void register_gradient(const std::string& domain, const std::string& op_type, GradientRule rule);
const GradientRule* find_gradient(const std::string& domain, const std::string& op_type);
// Every op with a gradient rule, as "Op" (ONNX domain) or "domain::Op".
std::vector<std::string> ops_with_gradient();

}  // namespace graphtrain
