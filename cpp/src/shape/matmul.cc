// Shape inference: MatMul, FusedMatMul, Gemm and the grouped (mixture of experts) GroupedMatMul.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

void check_same(const InferenceContext& ctx, const SymDim& a, const SymDim& b, const char* what) {
  auto ca = a.constant(), cb = b.constant();
  if (ca && cb && *ca != *cb) ctx.fail(str_cat(what, " differ: ", *ca, " and ", *cb));
}

void matmul(InferenceContext& ctx) {
  const SymShape* a = ctx.input_shape(0);
  const SymShape* b = ctx.input_shape(1);
  DType dtype = ctx.input_dtype(0);
  if (!a || !b) return ctx.set_output(0, dtype, std::nullopt);
  if (a->empty() || b->empty()) ctx.fail("MatMul inputs must have rank 1 or more");
  SymShape sa = *a, sb = *b;
  // graphtrain::FusedMatMul's folded transposes: the operands seen through permA / permB.
  auto permute = [&](SymShape& s, const char* name) {
    std::vector<int64_t> perm = ctx.node().attr_ints(name);
    if (perm.empty()) return;
    if (perm.size() != s.size()) ctx.fail(str_cat(name, " must have one entry per input dim"));
    SymShape p;
    for (int64_t d : perm) p.push_back(s[static_cast<size_t>(d)]);
    s = p;
  };
  permute(sa, "permA");
  permute(sb, "permB");
  bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), SymDim(1));
  if (b_vec) sb.push_back(SymDim(1));
  // graphtrain::FusedMatMul: op(A) @ op(B) with transposes of the last two dims.
  if (ctx.node().attr_int("transA", 0)) std::swap(sa[sa.size() - 1], sa[sa.size() - 2]);
  if (ctx.node().attr_int("transB", 0)) std::swap(sb[sb.size() - 1], sb[sb.size() - 2]);
  check_same(ctx, sa.back(), sb[sb.size() - 2], "inner dimensions");
  SymShape batch =
      broadcast_shapes(ctx, SymShape(sa.begin(), sa.end() - 2), SymShape(sb.begin(), sb.end() - 2));
  SymShape out = batch;
  if (!a_vec) out.push_back(sa[sa.size() - 2]);
  if (!b_vec) out.push_back(sb.back());
  permute(out, "permY");  // the stored output: the product transposed
  ctx.set_output(0, dtype, out);
}

void gemm(InferenceContext& ctx) {
  const SymShape* a = ctx.input_shape(0);
  const SymShape* b = ctx.input_shape(1);
  DType dtype = ctx.input_dtype(0);
  if (!a || !b) return ctx.set_output(0, dtype, std::nullopt);
  if (a->size() != 2 || b->size() != 2) ctx.fail("Gemm inputs must have rank 2");
  bool ta = ctx.node().attr_int("transA", 0) != 0, tb = ctx.node().attr_int("transB", 0) != 0;
  SymDim m = ta ? (*a)[1] : (*a)[0], ka = ta ? (*a)[0] : (*a)[1];
  SymDim kb = tb ? (*b)[1] : (*b)[0], n = tb ? (*b)[0] : (*b)[1];
  check_same(ctx, ka, kb, "inner dimensions");
  ctx.set_output(0, dtype, SymShape{m, n});
}

const bool registered = [] {
  register_shape_inferer(GT, "GroupedMatMul", [](InferenceContext& ctx) {
    const SymShape* x = ctx.input_shape(0);
    const SymShape* w = ctx.input_shape(1);
    if (x && x->size() != 2) ctx.fail(str_cat("X must have rank 2, got ", x->size()));
    if (w && w->size() != 3) ctx.fail(str_cat("W must have rank 3, got ", w->size()));
    bool tb = ctx.node().attr_int("transB", 0) != 0;
    if (x && w) check_same(ctx, (*x)[1], (*w)[tb ? 2 : 1], "X's and W's inner dimensions");
    std::optional<SymShape> out;
    if (x && w) out = SymShape{(*x)[0], (*w)[tb ? 1 : 2]};
    ctx.set_output(0, ctx.input_dtype(0), out);
  });
  register_shape_inferer(GT, "GroupedMatMulGrad", [](InferenceContext& ctx) {
    infer_like_input(ctx, 0, 1);
    infer_like_input(ctx, 1, 2);
  });
  register_shape_inferer("", "MatMul", matmul);
  register_shape_inferer(kGraphtrainDomain, "FusedMatMul", matmul);
  register_shape_inferer("", "Gemm", gemm);
  return true;
}();

}  // namespace
}  // namespace graphtrain
