// Gradient rules: Conv, MaxPool, AveragePool, GlobalAveragePool.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

void conv(Ctx& c) {
  std::map<std::string, Attribute> attrs = c.node().attributes;
  bool bias = c.input(2) != nullptr;
  std::vector<Value*> g = c.op_n("ConvGrad", {c.output_grad(0), c.input(0), c.input(1)}, 3, attrs,
                                 GT, {c.wants(0), c.wants(1), bias && c.wants(2)});
  for (size_t i = 0; i < 3; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

const bool registered = [] {
  register_gradient("", "Conv", conv);
  register_gradient("", "MaxPool", [](Ctx& c) {
    c.set_grad(
        0, c.op("MaxPoolGrad", {c.output_grad(0), c.output(1), c.shape_of(c.input(0))}, {}, GT));
  });
  register_gradient("", "AveragePool", [](Ctx& c) {
    c.set_grad(0, c.op("AveragePoolGrad", {c.output_grad(0), c.shape_of(c.input(0))},
                       c.node().attributes, GT));
  });
  register_gradient("", "GlobalAveragePool", [](Ctx& c) {
    c.set_grad(0,
               c.op("GlobalAveragePoolGrad", {c.output_grad(0), c.shape_of(c.input(0))}, {}, GT));
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
