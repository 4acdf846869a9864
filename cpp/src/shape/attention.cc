// Shape inference: Attention and AttentionGrad.
#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// [..., L, H] -> [..., H, L] when Q, K and V hold their heads inside (attribute heads_inside).
SymShape heads_first(InferenceContext& ctx, SymShape rows) {
  if (ctx.node().attr_int("heads_inside", 0) != 0 && rows.size() >= 2)
    std::swap(rows[rows.size() - 1], rows[rows.size() - 2]);
  return rows;
}

void attention(InferenceContext& ctx) {
  const SymShape* q = ctx.input_shape(0);
  const SymShape* v = ctx.input_shape(2);
  DType dtype = ctx.input_dtype(0);
  ctx.set_output(2, DType::kInt64, SymShape{});
  if (!q || !v) {
    ctx.set_output(0, dtype, std::nullopt);
    ctx.set_output(1, DType::kFloat32, std::nullopt);
    return;
  }
  if (q->size() < 2 || v->size() != q->size())
    ctx.fail(str_cat("Q and V must have the same rank, 2 or more; got ", sym_shape_to_string(*q),
                     " and ", sym_shape_to_string(*v)));
  SymShape y = *q;
  y.back() = v->back();
  ctx.set_output(0, dtype, y);
  ctx.set_output(1, DType::kFloat32, heads_first(ctx, SymShape(q->begin(), q->end() - 1)));
}

const bool registered = [] {
  register_shape_inferer(GT, "Attention", attention);
  // AttentionGrad(dY, Q, K, V, ...) -> (dQ, dK, dV, dMask [..., Hq, Lq, Lk])
  register_shape_inferer(GT, "AttentionGrad", [](InferenceContext& ctx) {
    for (size_t i = 0; i < 3; ++i) infer_like_input(ctx, i, i + 1);
    if (ctx.num_outputs() < 4) return;
    const SymShape* q = ctx.input_shape(1);
    const SymShape* k = ctx.input_shape(2);
    bool inside = ctx.node().attr_int("heads_inside", 0) != 0;
    size_t rank = inside ? 3 : 2;
    if (!q || !k || q->size() < rank || k->size() < rank)
      return ctx.set_output(3, DType::kFloat32, std::nullopt);
    SymShape m = heads_first(ctx, SymShape(q->begin(), q->end() - 1));
    m.push_back((*k)[k->size() - (inside ? 3 : 2)]);
    ctx.set_output(3, DType::kFloat32, m);
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
