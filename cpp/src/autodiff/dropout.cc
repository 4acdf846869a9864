// Gradient rule: Dropout (its mask is the forward's second output).
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

void dropout(Ctx& c) {
  std::vector<Value*> ins = {c.output_grad(0), c.output(1), c.input(1), c.input(2)};
  while (!ins.empty() && !ins.back()) ins.pop_back();
  c.set_grad(0, c.op("DropoutGrad", ins, {}, GT));
}

const bool registered = [] {
  register_gradient("", "Dropout", dropout);
  return true;
}();

}  // namespace
}  // namespace graphtrain
