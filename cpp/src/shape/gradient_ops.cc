// Shape inference of the gradient ops in the graphtrain domain.
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// Output `out` gets the shape of input `in`.
void like_input(InferenceContext& ctx, size_t out, size_t in) {
  if (!ctx.has_input(in)) return ctx.set_output(out, DType::kFloat32, std::nullopt);
  const SymShape* s = ctx.input_shape(in);
  ctx.set_output(out, DType::kFloat32, s ? std::optional<SymShape>(*s) : std::nullopt);
}

// Output `out` gets the shape held by the int64 input `in` (a Shape of some forward value).
void shape_from_values(InferenceContext& ctx, size_t out, size_t in) {
  const auto* v = ctx.input_values(in);
  ctx.set_output(out, DType::kFloat32,
                 v ? std::optional<SymShape>(SymShape(v->begin(), v->end())) : std::nullopt);
}

const bool registered = [] {
  for (const char* op : {"ReluGrad", "SigmoidGrad", "TanhGrad", "LeakyReluGrad", "GeluGrad",
                         "SoftmaxGrad", "LogSoftmaxGrad", "DropoutGrad"})
    register_shape_inferer(GT, op, [](InferenceContext& ctx) { like_input(ctx, 0, 0); });
  for (const char* op : {"SumToShape", "ReduceGrad", "GatherGrad", "GlobalAveragePoolGrad",
                         "AveragePoolGrad", "SliceGrad"})
    register_shape_inferer(GT, op, [](InferenceContext& ctx) { shape_from_values(ctx, 0, 1); });
  register_shape_inferer(GT, "MaxPoolGrad",
                         [](InferenceContext& ctx) { shape_from_values(ctx, 0, 2); });
  register_shape_inferer(GT, "SoftmaxCrossEntropyLossGrad",
                         [](InferenceContext& ctx) { like_input(ctx, 0, 1); });
  for (const char* op : {"LayerNormalizationGrad", "BatchNormalizationGrad"})
    register_shape_inferer(GT, op, [](InferenceContext& ctx) {
      like_input(ctx, 0, 1);
      like_input(ctx, 1, 2);
      like_input(ctx, 2, 2);
    });
  register_shape_inferer(GT, "ConvGrad", [](InferenceContext& ctx) {
    like_input(ctx, 0, 1);
    like_input(ctx, 1, 2);
    const SymShape* w = ctx.input_shape(2);
    ctx.set_output(2, DType::kFloat32,
                   w ? std::optional<SymShape>(SymShape{(*w)[0]}) : std::nullopt);
  });
  register_shape_inferer("", "Sign", [](InferenceContext& ctx) {
    const SymShape* s = ctx.input_shape(0);
    ctx.set_output(0, ctx.input_dtype(0), s ? std::optional<SymShape>(*s) : std::nullopt);
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
