// Shape inference: Resize (output dims from `sizes` or floor(input dim * scale) on the resized
// axes) and ResizeGrad (the input's shape, its second input).
#include <cmath>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

void resize(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  if (!in) {
    ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
    return;
  }
  int64_t rank = static_cast<int64_t>(in->size());
  std::vector<int64_t> axes = ctx.node().attr_ints("axes");
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  for (int64_t& a : axes) a = normalize_axis(ctx, a, rank);
  SymShape out = *in;
  const std::vector<SymDim>* sizes = ctx.has_input(3) ? ctx.input_values(3) : nullptr;
  const Tensor* scales = ctx.has_input(2) ? ctx.input_constant(2) : nullptr;
  if (scales && scales->numel() == 0) scales = nullptr;
  if (sizes && !sizes->empty()) {
    if (sizes->size() != axes.size())
      ctx.fail(str_cat("sizes must have ", axes.size(), " elements (one per resized axis), got ",
                       sizes->size()));
    for (size_t k = 0; k < axes.size(); ++k) out[static_cast<size_t>(axes[k])] = (*sizes)[k];
  } else if (scales) {
    if (static_cast<size_t>(scales->numel()) != axes.size())
      ctx.fail(str_cat("scales must have ", axes.size(), " elements (one per resized axis), got ",
                       scales->numel()));
    for (size_t k = 0; k < axes.size(); ++k) {
      SymDim& d = out[static_cast<size_t>(axes[k])];
      double s = scales->data<float>()[k];
      auto c = d.constant();
      if (c)
        d = static_cast<int64_t>(std::floor(static_cast<double>(*c) * s));
      else if (s != std::floor(s))
        d = SymDim::fresh("resize");
      else if (s != 1.0)  // an integer scale of a symbolic dim
        d = d * static_cast<int64_t>(s);
    }
  } else {
    for (int64_t a : axes) out[static_cast<size_t>(a)] = SymDim::fresh("resize");
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
}

const bool registered = [] {
  register_shape_inferer("", "Resize", resize);
  register_shape_inferer(kGraphtrainDomain, "ResizeGrad",
                         [](InferenceContext& ctx) { infer_shape_from_values(ctx, 0, 1); });
  return true;
}();

}  // namespace
}  // namespace graphtrain
