// Gradient rules: LayerNormalization, RMSNormalization and BatchNormalization.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

void layer_norm(Ctx& c) {
  Value* mean = c.output(1);
  Value* inv = c.output(2);
  bool has_bias = c.input(2) != nullptr;
  std::vector<Value*> g =
      c.op_n("LayerNormalizationGrad", {c.output_grad(0), c.input(0), c.input(1), mean, inv}, 3,
             {{"axis", int_attr(c.node().attr_int("axis", -1))}}, GT,
             {c.wants(0), c.wants(1), has_bias && c.wants(2)});
  for (size_t i = 0; i < 3; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

void rms_norm(Ctx& c) {
  std::vector<Value*> g =
      c.op_n("RMSNormalizationGrad", {c.output_grad(0), c.input(0), c.input(1), c.output(1)}, 2,
             {{"axis", int_attr(c.node().attr_int("axis", -1))}}, GT, {c.wants(0), c.wants(1)});
  for (size_t i = 0; i < 2; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

void batch_norm(Ctx& c) {
  const Node& n = c.node();
  std::vector<Value*> g =
      c.op_n("BatchNormalizationGrad",
             {c.output_grad(0), c.input(0), c.input(1), c.input(3), c.input(4)}, 3,
             {{"epsilon", Attribute::of(n.attr_float("epsilon", 1e-5f))},
              {"training_mode", int_attr(n.domain == GT ? 1 : n.attr_int("training_mode", 0))}},
             GT, {c.wants(0), c.wants(1), c.wants(2)});
  for (size_t i = 0; i < 3; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

const bool registered = [] {
  register_gradient("", "LayerNormalization", layer_norm);
  register_gradient("", "RMSNormalization", rms_norm);  // ONNX's (opset 23)
  register_gradient(GT, "RMSNormalization", rms_norm);
  register_gradient("", "BatchNormalization", batch_norm);
  register_gradient(GT, "BatchNormalization", batch_norm);
  return true;
}();

}  // namespace
}  // namespace graphtrain
