// Shape inference: the random generators RandomUniformLike, RandomNormalLike and Bernoulli. The
// output has the input's shape, and the element type of the `dtype` attribute or else the input's.
#include "graphtrain/dtype.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

void random_like(InferenceContext& ctx) {
  const Node& n = ctx.node();
  DType dtype = n.has_attr("dtype") ? from_onnx(static_cast<int>(n.attr_int("dtype", 0)))
                                    : ctx.input_dtype(0);
  const SymShape* s = ctx.input_shape(0);
  ctx.set_output(0, dtype, s ? std::optional<SymShape>(*s) : std::nullopt);
}

const bool registered = [] {
  for (const char* op : {"RandomUniformLike", "RandomNormalLike", "Bernoulli"})
    register_shape_inferer("", op, random_like);
  return true;
}();

}  // namespace
}  // namespace graphtrain
