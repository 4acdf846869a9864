// Shape inference: reductions, ReduceGrad, SumToShape, ArgMax / ArgMin, CumSum and TopK.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// Axes given as input (ReduceSum from opset 13, the others from 18) or attribute.
void reduce(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  if (!in) return ctx.set_output(0, dtype, std::nullopt);
  bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  bool noop_empty = ctx.node().attr_int("noop_with_empty_axes", 0) != 0;
  std::vector<int64_t> axes;
  if (ctx.has_input(1)) {
    const auto* v = ctx.input_values(1);
    if (!v) {
      if (keep) {
        SymShape out;
        for (size_t i = 0; i < in->size(); ++i) out.push_back(SymDim::fresh("reduce"));
        return ctx.set_output(0, dtype, out);
      }
      return ctx.set_output(0, dtype, std::nullopt);
    }
    for (const auto& d : *v) {
      auto c = d.constant();
      if (!c) return ctx.set_output(0, dtype, std::nullopt);
      axes.push_back(*c);
    }
  } else {
    axes = ctx.node().attr_ints("axes");
  }
  int64_t rank = static_cast<int64_t>(in->size());
  if (axes.empty() && noop_empty) return ctx.set_output(0, dtype, *in);
  std::vector<bool> reduced(in->size(), axes.empty());
  for (int64_t a : axes) reduced[static_cast<size_t>(normalize_axis(ctx, a, rank))] = true;
  SymShape out;
  for (size_t i = 0; i < in->size(); ++i) {
    if (!reduced[i])
      out.push_back((*in)[i]);
    else if (keep)
      out.emplace_back(1);
  }
  ctx.set_output(0, dtype, out);
}

// ArgMax / ArgMin: int64 indices along attribute `axis`, kept as a dim of 1 unless keepdims=0.
void arg_reduce(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, DType::kInt64, std::nullopt);
  int64_t rank = static_cast<int64_t>(in->size());
  size_t axis = static_cast<size_t>(normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank));
  bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  SymShape out;
  for (size_t i = 0; i < in->size(); ++i) {
    if (i != axis)
      out.push_back((*in)[i]);
    else if (keep)
      out.emplace_back(1);
  }
  ctx.set_output(0, DType::kInt64, out);
}

// TopK: values and int64 indices, the axis cut to K (a constant, or a fresh dim).
void top_k(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  std::optional<SymShape> out;
  if (in) {
    out = *in;
    size_t axis = static_cast<size_t>(
        normalize_axis(ctx, ctx.node().attr_int("axis", -1), static_cast<int64_t>(in->size())));
    const std::vector<SymDim>* k = ctx.input_values(1);
    (*out)[axis] = k && k->size() == 1 ? (*k)[0] : SymDim::fresh("topk");
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  ctx.set_output(1, DType::kInt64, out);
}

const bool registered = [] {
  register_shape_inferer("", "TopK", top_k);
  register_shape_inferer("", "ArgMax", arg_reduce);
  register_shape_inferer("", "ArgMin", arg_reduce);
  register_shape_inferer("", "CumSum", [](InferenceContext& ctx) { infer_like_input(ctx); });
  for (const char* op : {"SumToShape", "ReduceGrad"})
    register_shape_inferer(GT, op,
                           [](InferenceContext& ctx) { infer_shape_from_values(ctx, 0, 1); });
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"})
    register_shape_inferer("", op, reduce);
  return true;
}();

}  // namespace
}  // namespace graphtrain
