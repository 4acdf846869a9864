// Shape inference: LayerNormalization, RMSNormalization, BatchNormalization and their gradient
// ops.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

void layer_norm(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  if (!in) {
    for (size_t i = 0; i < 3; ++i) ctx.set_output(i, i ? DType::kFloat32 : dtype, std::nullopt);
    return;
  }
  int64_t rank = static_cast<int64_t>(in->size());
  int64_t axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), rank);
  ctx.set_output(0, dtype, *in);
  SymShape stat = *in;
  for (int64_t i = axis; i < rank; ++i) stat[static_cast<size_t>(i)] = SymDim(1);
  DType stash = from_onnx(static_cast<int>(ctx.node().attr_int("stash_type", 1)));
  ctx.set_output(1, stash, stat);
  ctx.set_output(2, stash, stat);
}

// graphtrain::RMSNormalization(X, Scale) -> (Y, InvStdDev): LayerNormalization's without Mean.
void rms_norm(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  if (!in) {
    ctx.set_output(0, dtype, std::nullopt);
    ctx.set_output(1, DType::kFloat32, std::nullopt);
    return;
  }
  int64_t rank = static_cast<int64_t>(in->size());
  int64_t axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), rank);
  ctx.set_output(0, dtype, *in);
  SymShape stat = *in;
  for (int64_t i = axis; i < rank; ++i) stat[static_cast<size_t>(i)] = SymDim(1);
  ctx.set_output(1, DType::kFloat32, stat);
}

void batch_norm(InferenceContext& ctx) {
  const SymShape* x = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  ctx.set_output(0, dtype, x ? std::optional<SymShape>(*x) : std::nullopt);
  const SymShape* mean = ctx.input_shape(3);
  for (size_t i = 1; i < 3; ++i)
    ctx.set_output(i, ctx.input_dtype(3), mean ? std::optional<SymShape>(*mean) : std::nullopt);
}

const bool registered = [] {
  for (const char* op : {"LayerNormalizationGrad", "BatchNormalizationGrad"})
    register_shape_inferer(GT, op, [](InferenceContext& ctx) {
      infer_like_input(ctx, 0, 1);
      infer_like_input(ctx, 1, 2);
      infer_like_input(ctx, 2, 2);
    });
  register_shape_inferer("", "LayerNormalization", layer_norm);
  // (A, R, Scale, [B], [Bias]) -> LayerNormalization's outputs and the sum A + R (+ Bias).
  register_shape_inferer(GT, "AddLayerNormalization", [](InferenceContext& ctx) {
    layer_norm(ctx);
    infer_like_input(ctx, 3, 0);
  });
  register_shape_inferer(GT, "RMSNormalization", rms_norm);
  // (A, R, Scale, [Bias]) -> RMSNormalization's outputs and the sum A + R (+ Bias).
  register_shape_inferer(GT, "AddRMSNormalization", [](InferenceContext& ctx) {
    rms_norm(ctx);
    infer_like_input(ctx, 2, 0);
  });
  register_shape_inferer(GT, "RMSNormalizationGrad", [](InferenceContext& ctx) {
    infer_like_input(ctx, 0, 1);
    infer_like_input(ctx, 1, 2);
  });
  register_shape_inferer("", "BatchNormalization", batch_norm);
  register_shape_inferer(kGraphtrainDomain, "BatchNormalization", batch_norm);
  return true;
}();

}  // namespace
}  // namespace graphtrain
