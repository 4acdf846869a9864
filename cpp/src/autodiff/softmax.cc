// Gradient rules: Softmax, LogSoftmax and SoftmaxCrossEntropyLoss (ONNX's and graphtrain's).
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

void softmax_cross_entropy(Ctx& c) {
  std::map<std::string, Attribute> attrs;
  const Node& n = c.node();
  attrs["reduction"] = Attribute::of(n.attr_string("reduction", "mean"));
  if (n.has_attr("ignore_index")) attrs["ignore_index"] = int_attr(n.attr_int("ignore_index", 0));
  // The gradient reads the scores, not log_prob: the forward then writes log_prob only where
  // something else reads it.
  attrs["from_scores"] = int_attr(1);
  std::vector<Value*> ins = {c.output_grad(0), c.input(0), c.input(1)};
  if (c.input(2)) ins.push_back(c.input(2));
  c.set_grad(0, c.op("SoftmaxCrossEntropyLossGrad", ins, attrs, GT));
}

const bool registered = [] {
  register_gradient("", "Softmax", [](Ctx& c) {
    c.set_grad(0, c.op("SoftmaxGrad", {c.output_grad(0), c.output(0)},
                       {{"axis", int_attr(c.node().attr_int("axis", -1))}}, GT));
  });
  register_gradient("", "LogSoftmax", [](Ctx& c) {
    c.set_grad(0, c.op("LogSoftmaxGrad", {c.output_grad(0), c.output(0)},
                       {{"axis", int_attr(c.node().attr_int("axis", -1))}}, GT));
  });
  register_gradient("", "SoftmaxCrossEntropyLoss", softmax_cross_entropy);
  // graphtrain's (fuse_loss_gradient): the forward writes the gradient for dloss = 1 (output 1,
  // added on request); the backward scales it by dloss, or hands it on when dloss is 1.
  register_gradient(GT, "SoftmaxCrossEntropyLoss", [](Ctx& c) {
    std::map<std::string, Attribute> attrs;
    attrs["reduction"] = Attribute::of(c.node().attr_string("reduction", "mean"));
    attrs["unit"] = int_attr(1);
    c.set_grad(0, c.op("SoftmaxCrossEntropyLossGrad", {c.output_grad(0), c.output(1)}, attrs, GT));
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
