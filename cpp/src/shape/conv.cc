// Shape inference: Conv, pooling and their gradient ops.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// ---- convolution and pooling --------------------------------------------------------------------

struct Window {
  std::vector<int64_t> kernel, strides, dilations, pads;
};

Window window(const InferenceContext& ctx, size_t spatial, const std::vector<int64_t>& kernel) {
  const Node& n = ctx.node();
  Window w;
  w.kernel = kernel;
  w.strides = n.attr_ints("strides", std::vector<int64_t>(spatial, 1));
  w.dilations = n.attr_ints("dilations", std::vector<int64_t>(spatial, 1));
  w.pads = n.attr_ints("pads", std::vector<int64_t>(2 * spatial, 0));
  if (w.kernel.size() != spatial || w.strides.size() != spatial || w.dilations.size() != spatial ||
      w.pads.size() != 2 * spatial)
    ctx.fail(
        str_cat("kernel_shape, strides, dilations and pads must cover ", spatial, " spatial dims"));
  for (size_t i = 0; i < spatial; ++i)
    if (w.kernel[i] < 1 || w.strides[i] < 1 || w.dilations[i] < 1 || w.pads[i] < 0 ||
        w.pads[i + spatial] < 0)
      ctx.fail("kernel_shape, strides and dilations must be positive and pads not negative");
  return w;
}

SymDim window_out(const InferenceContext& ctx, const SymDim& in, const Window& w, size_t i,
                  bool ceil_mode) {
  auto c = in.constant();
  std::string pad = ctx.node().attr_string("auto_pad", "NOTSET");
  if (!c) return SymDim::fresh("conv");
  int64_t eff = (w.kernel[i] - 1) * w.dilations[i] + 1;
  if (pad == "SAME_UPPER" || pad == "SAME_LOWER") return (*c + w.strides[i] - 1) / w.strides[i];
  if (pad == "VALID") return (*c - eff) / w.strides[i] + 1;
  int64_t span = *c + w.pads[i] + w.pads[i + w.kernel.size()] - eff;
  if (span < 0)
    ctx.fail(str_cat("the window (", eff, ") is larger than the padded input (", *c, ")"));
  int64_t out = (ceil_mode ? (span + w.strides[i] - 1) / w.strides[i] : span / w.strides[i]) + 1;
  // With ceil_mode, the last window must start inside the input or left padding.
  if (ceil_mode && (out - 1) * w.strides[i] >= *c + w.pads[i]) --out;
  return out;
}

void conv(InferenceContext& ctx) {
  const SymShape* x = ctx.input_shape(0);
  const SymShape* wt = ctx.input_shape(1);
  DType dtype = ctx.input_dtype(0);
  if (!x || !wt) return ctx.set_output(0, dtype, std::nullopt);
  if (x->size() < 3 || x->size() != wt->size())
    ctx.fail("X and W must have the same rank, 3 or more");
  size_t spatial = x->size() - 2;
  std::vector<int64_t> kernel = ctx.node().attr_ints("kernel_shape");
  if (kernel.empty())
    for (size_t i = 0; i < spatial; ++i) {
      auto c = (*wt)[i + 2].constant();
      if (!c) return ctx.set_output(0, dtype, std::nullopt);
      kernel.push_back(*c);
    }
  Window w = window(ctx, spatial, kernel);
  int64_t group = ctx.node().attr_int("group", 1);
  auto cin = (*x)[1].constant(), wc = (*wt)[1].constant();
  if (cin && wc && *cin != *wc * group)
    ctx.fail(str_cat("X has ", *cin, " channels but W expects ", *wc, " x group ", group));
  SymShape out{(*x)[0], (*wt)[0]};
  for (size_t i = 0; i < spatial; ++i) out.push_back(window_out(ctx, (*x)[i + 2], w, i, false));
  ctx.set_output(0, dtype, out);
}

void pool(InferenceContext& ctx) {
  const SymShape* x = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  if (!x) return ctx.set_output(0, dtype, std::nullopt);
  if (x->size() < 3) ctx.fail("X must have rank 3 or more");
  size_t spatial = x->size() - 2;
  Window w = window(ctx, spatial,
                    ctx.node().attr(std::string("kernel_shape"), Attribute::Kind::kInts).ints);
  bool ceil_mode = ctx.node().attr_int("ceil_mode", 0) != 0;
  SymShape out{(*x)[0], (*x)[1]};
  for (size_t i = 0; i < spatial; ++i) out.push_back(window_out(ctx, (*x)[i + 2], w, i, ceil_mode));
  ctx.set_output(0, dtype, out);
  ctx.set_output(1, DType::kInt64, out);
}

void global_pool(InferenceContext& ctx) {
  const SymShape* x = ctx.input_shape(0);
  if (!x) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  SymShape out = *x;
  for (size_t i = 2; i < out.size(); ++i) out[i] = SymDim(1);
  ctx.set_output(0, ctx.input_dtype(0), out);
}

const bool registered = [] {
  for (const char* op : {"GlobalAveragePoolGrad", "AveragePoolGrad"})
    register_shape_inferer(GT, op,
                           [](InferenceContext& ctx) { infer_shape_from_values(ctx, 0, 1); });
  register_shape_inferer(GT, "MaxPoolGrad",
                         [](InferenceContext& ctx) { infer_shape_from_values(ctx, 0, 2); });
  register_shape_inferer(GT, "ConvGrad", [](InferenceContext& ctx) {
    infer_like_input(ctx, 0, 1);
    infer_like_input(ctx, 1, 2);
    const SymShape* w = ctx.input_shape(2);
    ctx.set_output(2, DType::kFloat32,
                   w ? std::optional<SymShape>(SymShape{(*w)[0]}) : std::nullopt);
  });
  register_shape_inferer("", "Conv", conv);
  register_shape_inferer("", "MaxPool", pool);
  register_shape_inferer("", "AveragePool", pool);
  register_shape_inferer("", "GlobalAveragePool", global_pool);
  return true;
}();

}  // namespace
}  // namespace graphtrain
