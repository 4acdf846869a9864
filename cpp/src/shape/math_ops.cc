// Shape inference: MatMul, Gemm, reductions, normalization, losses.
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

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

void batch_norm(InferenceContext& ctx) {
  const SymShape* x = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  ctx.set_output(0, dtype, x ? std::optional<SymShape>(*x) : std::nullopt);
  const SymShape* mean = ctx.input_shape(3);
  for (size_t i = 1; i < 3; ++i)
    ctx.set_output(i, ctx.input_dtype(3), mean ? std::optional<SymShape>(*mean) : std::nullopt);
}

const bool registered = [] {
  register_shape_inferer("", "MatMul", matmul);
  register_shape_inferer(kGraphtrainDomain, "FusedMatMul", matmul);
  register_shape_inferer("", "Gemm", gemm);
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"})
    register_shape_inferer("", op, reduce);
  register_shape_inferer("", "LayerNormalization", layer_norm);
  register_shape_inferer("", "SoftmaxCrossEntropyLoss", softmax_cross_entropy);
  register_shape_inferer("", "Conv", conv);
  register_shape_inferer("", "MaxPool", pool);
  register_shape_inferer("", "AveragePool", pool);
  register_shape_inferer("", "GlobalAveragePool", global_pool);
  register_shape_inferer("", "BatchNormalization", batch_norm);
  register_shape_inferer(kGraphtrainDomain, "BatchNormalization", batch_norm);
  return true;
}();

}  // namespace
}  // namespace graphtrain
