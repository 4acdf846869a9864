// Shape inference: Attention and AttentionGrad.
#include <optional>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// What the shapes of Q (or packed X), K and V give: Y's shape, LSE's ([..., Hq, Lq]) and Lk.
struct Shapes {
  SymShape y, rows;
  SymDim lk;
};

// Layouts: [..., H, L, E] (default), [..., L, H, E] (heads_inside), or one X [..., L, 3 H E]
// (packed, attribute heads).
std::optional<Shapes> attention_shapes(InferenceContext& ctx, const SymShape* q, const SymShape* k,
                                       const SymShape* v) {
  const Node& n = ctx.node();
  if (n.attr_int("packed", 0) != 0) {
    int64_t heads = n.attr_int("heads", 0);
    if (!q) return std::nullopt;
    std::optional<SymDim> e =
        q->size() >= 2 ? q->back().exact_div(SymDim(3 * heads)) : std::nullopt;
    if (heads <= 0 || !e)
      ctx.fail(str_cat("packed Q, K and V must be [..., L, 3 * heads * E] with heads (", heads,
                       ") >= 1; got ", sym_shape_to_string(*q)));
    Shapes s;
    s.rows.assign(q->begin(), q->end() - 2);
    s.rows.push_back(SymDim(heads));
    s.rows.push_back((*q)[q->size() - 2]);
    s.y.assign(q->begin(), q->end() - 1);  // [..., L, H, E]
    s.y.push_back(SymDim(heads));
    s.y.push_back(*e);
    s.lk = (*q)[q->size() - 2];
    return s;
  }
  if (!q || !k || !v) return std::nullopt;
  bool inside = n.attr_int("heads_inside", 0) != 0;
  size_t rank = inside ? 3 : 2;
  if (q->size() < rank || v->size() != q->size() || k->size() != q->size())
    ctx.fail(str_cat("Q, K and V must have the same rank, ", rank, " or more; got ",
                     sym_shape_to_string(*q), ", ", sym_shape_to_string(*k), " and ",
                     sym_shape_to_string(*v)));
  Shapes s;
  s.y = *q;
  s.y.back() = v->back();
  s.rows.assign(q->begin(), q->end() - 1);
  if (inside) std::swap(s.rows[s.rows.size() - 1], s.rows[s.rows.size() - 2]);  // [..., H, L]
  s.lk = (*k)[k->size() - (inside ? 3 : 2)];
  return s;
}

void attention(InferenceContext& ctx) {
  DType dtype = ctx.input_dtype(0);
  if (ctx.num_inputs() > 4 && ctx.has_input(4)) {  // packed: the qkv projection's bias
    if (ctx.node().attr_int("packed", 0) == 0) ctx.fail("a qkv bias (input 4) needs packed=1");
    const SymShape *x = ctx.input_shape(0), *b = ctx.input_shape(4);
    if (x && b && !x->empty() && (b->size() != 1 || (*b)[0] != x->back()))
      ctx.fail(str_cat("the qkv bias must be [", x->back().to_string(), "] (X's last dim), got ",
                       sym_shape_to_string(*b)));
  }
  ctx.set_output(2, DType::kInt64, SymShape{});
  std::optional<Shapes> s =
      attention_shapes(ctx, ctx.input_shape(0), ctx.input_shape(1), ctx.input_shape(2));
  ctx.set_output(0, dtype, s ? std::optional<SymShape>(s->y) : std::nullopt);
  ctx.set_output(1, DType::kFloat32, s ? std::optional<SymShape>(s->rows) : std::nullopt);
  // The probabilities kept for the backward (training): a 1-D tensor whose size the kernel
  // chooses (empty for long sequences).
  if (ctx.num_outputs() > 3) ctx.set_output(3, DType::kFloat32, std::nullopt);
}

const bool registered = [] {
  register_shape_inferer(GT, "Attention", attention);
  // Rotary(X, Cos, Sin) -> Y of X's shape.
  register_shape_inferer(GT, "Rotary", [](InferenceContext& ctx) { infer_like_input(ctx, 0, 0); });
  // AttentionGrad(dY, Q, K, V, ..., P?) -> (dQ, dK, dV, dMask [..., Hq, Lq, Lk]); packed: (dX, -,
  // -, dMask).
  register_shape_inferer(GT, "AttentionGrad", [](InferenceContext& ctx) {
    for (size_t i = 0; i < 3; ++i) infer_like_input(ctx, i, i + 1);
    if (ctx.num_outputs() < 4) return;
    std::optional<Shapes> s =
        attention_shapes(ctx, ctx.input_shape(1), ctx.input_shape(2), ctx.input_shape(3));
    if (!s) return ctx.set_output(3, DType::kFloat32, std::nullopt);
    SymShape m = s->rows;
    m.push_back(s->lk);
    ctx.set_output(3, DType::kFloat32, m);
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
