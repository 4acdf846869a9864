// Gradient rule: Resize. ResizeGrad adds each output element's gradient into the input elements
// it was interpolated from, with the forward's attributes, scales or sizes.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

const bool registered = [] {
  register_gradient("", "Resize", [](GradientContext& c) {
    std::vector<Value*> ins = {c.output_grad(0), c.shape_of(c.input(0)),
                               c.node().inputs().size() > 2 ? c.input(2) : nullptr,
                               c.node().inputs().size() > 3 ? c.input(3) : nullptr};
    while (!ins.back()) ins.pop_back();
    c.set_grad(0, c.op("ResizeGrad", ins, c.node().attributes, kGraphtrainDomain));
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
