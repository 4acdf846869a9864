#include "graphtrain/verifier.h"

#include <set>
#include <unordered_set>

#include "graphtrain/error.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

// Standard ops whose listed inputs share one element type ("T" in the ONNX schemas).
const std::set<std::string>& same_type_ops() {
  static const std::set<std::string> ops = {
      "Add",  "Sub",     "Mul", "Div", "Pow_", "MatMul", "Gemm",        "Concat",        "Equal",
      "Less", "Greater", "Max", "Min", "Sum",  "Mean",   "LessOrEqual", "GreaterOrEqual"};
  return ops;
}

}  // namespace

void verify(const Graph& graph) {
  std::unordered_set<const Value*> available;
  for (Value* v : graph.inputs()) available.insert(v);
  for (Value* v : graph.initializers()) available.insert(v);
  for (Node* n : graph.topological_order()) {  // throws on a cycle
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      Value* in = n->inputs()[i];
      if (!in) continue;
      if (!available.count(in))
        throw GraphError(str_cat("graph '", graph.name, "': ", n->describe(), " input ", i, " '",
                                 in->name(),
                                 "' is dangling: no node, graph input or initializer "
                                 "produces it"));
    }
    if (n->domain.empty() && same_type_ops().count(n->op_type)) {
      size_t count = n->op_type == "Gemm" ? 2 : n->inputs().size();
      const Value* first = nullptr;
      for (size_t i = 0; i < count && i < n->inputs().size(); ++i) {
        const Value* in = n->inputs()[i];
        if (!in || in->type.dtype == DType::kUndefined) continue;
        if (!first) {
          first = in;
        } else if (in->type.dtype != first->type.dtype) {
          throw GraphError(str_cat("graph '", graph.name, "': ", n->describe(),
                                   " has inputs of different element types: '", first->name(),
                                   "' is ", to_string(first->type.dtype), ", '", in->name(),
                                   "' is ", to_string(in->type.dtype)));
        }
      }
    }
    for (Value* out : n->outputs())
      if (out) available.insert(out);
  }
  for (Value* out : graph.outputs())
    if (!available.count(out))
      throw GraphError("graph '" + graph.name + "': output '" + out->name() +
                       "' is not produced by any node, input or initializer");
}

}  // namespace graphtrain
