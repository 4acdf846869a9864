// Shape inference: LayerNormalization, RMSNormalization, BatchNormalization and their gradient
// ops.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// Y of X's shape, and outputs 1..n_stats (per-row statistics) of X's shape with the normalized
// dims (from `axis` on) 1.
void normalization(InferenceContext& ctx, size_t n_stats, DType stash) {
  const SymShape* in = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  std::optional<SymShape> stat;
  if (in) {
    int64_t rank = static_cast<int64_t>(in->size());
    int64_t axis = normalize_axis(ctx, ctx.node().attr_int("axis", -1), rank);
    stat = *in;
    for (int64_t i = axis; i < rank; ++i) (*stat)[static_cast<size_t>(i)] = SymDim(1);
  }
  ctx.set_output(0, dtype, in ? std::optional<SymShape>(*in) : std::nullopt);
  for (size_t i = 1; i <= n_stats; ++i) ctx.set_output(i, stash, stat);
}

// LayerNormalization -> (Y, Mean, InvStdDev).
void layer_norm(InferenceContext& ctx) {
  normalization(ctx, 2, from_onnx(static_cast<int>(ctx.node().attr_int("stash_type", 1))));
}

// graphtrain::RMSNormalization(X, Scale) -> (Y, InvStdDev).
void rms_norm(InferenceContext& ctx) {
  normalization(ctx, 1, DType::kFloat32);
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
  register_shape_inferer("", "RMSNormalization", rms_norm);  // ONNX's (opset 23)
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
