// Shape inference: Dropout and DropoutGrad.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

const bool registered = [] {
  for (const char* op : {"DropoutGrad"})
    register_shape_inferer(GT, op, [](InferenceContext& ctx) { infer_like_input(ctx, 0, 0); });
  register_shape_inferer("", "Dropout", [](InferenceContext& ctx) {
    const SymShape* s = ctx.input_shape(0);
    std::optional<SymShape> shape = s ? std::optional<SymShape>(*s) : std::nullopt;
    ctx.set_output(0, ctx.input_dtype(0), shape);
    ctx.set_output(1, DType::kBool, shape);
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
