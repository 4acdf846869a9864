// Shape inference: Softmax, LogSoftmax, SoftmaxCrossEntropyLoss and their gradient ops.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

void softmax_cross_entropy(InferenceContext& ctx) {
  const SymShape* scores = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  std::string reduction = ctx.node().attr_string("reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    ctx.fail("reduction must be none, sum or mean, not '" + reduction + "'");
  if (!scores) {
    ctx.set_output(0, dtype,
                   reduction == "none" ? std::nullopt : std::optional<SymShape>(SymShape{}));
    ctx.set_output(1, dtype, std::nullopt);
    return;
  }
  if (scores->size() < 2) ctx.fail("scores must have rank 2 or more ([N, C, ...])");
  SymShape per_item = *scores;
  per_item.erase(per_item.begin() + 1);
  ctx.set_output(0, dtype, reduction == "none" ? per_item : SymShape{});
  ctx.set_output(1, dtype, *scores);
}

const bool registered = [] {
  register_shape_inferer(GT, "FusedSoftmax",
                         [](InferenceContext& ctx) { infer_like_input(ctx, 0, 0); });
  for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"})
    register_shape_inferer(GT, op, [](InferenceContext& ctx) { infer_like_input(ctx, 0, 0); });
  register_shape_inferer(GT, "SoftmaxCrossEntropyLossGrad",
                         [](InferenceContext& ctx) { infer_like_input(ctx, 0, 1); });
  register_shape_inferer("", "SoftmaxCrossEntropyLoss", softmax_cross_entropy);
  // graphtrain's: output 1 is the scores' gradient for dloss = 1 (fuse_loss_gradient).
  register_shape_inferer(GT, "SoftmaxCrossEntropyLoss", softmax_cross_entropy);
  for (const char* op : {"Softmax", "LogSoftmax"})
    register_shape_inferer("", op, [](InferenceContext& ctx) { infer_like_input(ctx); });
  return true;
}();

}  // namespace
}  // namespace graphtrain
