// Shape inference: ops that move, select or create data (Reshape, Transpose, Gather, Slice, ...),
// with symbolic values propagated through shape computations.
#include <algorithm>

#include "core/slicing.h"
#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

SymShape to_sym(const Shape& s) {
  return SymShape(s.begin(), s.end());
}

std::optional<SymShape> shape_or_none(const SymShape* s) {
  return s ? std::optional<SymShape>(*s) : std::nullopt;
}

SymDim product(const SymShape& s, size_t begin, size_t end) {
  SymDim p(1);
  for (size_t i = begin; i < end; ++i) p = p * s[i];
  return p;
}

// Constant ints of an input given either as input (opset >= 13) or attribute (older opsets).
std::optional<std::vector<int64_t>> ints_input_or_attr(InferenceContext& ctx, size_t input,
                                                       const char* attr) {
  if (ctx.has_input(input)) {
    const auto* vals = ctx.input_values(input);
    if (!vals) return std::nullopt;
    std::vector<int64_t> out;
    for (const auto& d : *vals) {
      auto c = d.constant();
      if (!c) return std::nullopt;
      out.push_back(*c);
    }
    return out;
  }
  if (ctx.node().has_attr(attr)) return ctx.node().attr_ints(attr);
  return std::vector<int64_t>{};
}

void reshape(InferenceContext& ctx) {
  DType dtype = ctx.input_dtype(0);
  const SymShape* in = ctx.input_shape(0);
  const auto* target = ctx.input_values(1);
  if (!target) {
    const SymShape* ts = ctx.input_shape(1);
    if (ts && ts->size() == 1 && ts->at(0).constant()) {
      SymShape out;
      for (int64_t i = 0; i < *ts->at(0).constant(); ++i) out.push_back(SymDim::fresh("reshape"));
      ctx.set_output(0, dtype, out);
    } else {
      ctx.set_output(0, dtype, std::nullopt);
    }
    return;
  }
  bool allowzero = ctx.node().attr_int("allowzero", 0) != 0;
  SymShape out;
  int infer_at = -1;
  for (size_t i = 0; i < target->size(); ++i) {
    const SymDim& d = (*target)[i];
    auto c = d.constant();
    if (c && *c == -1) {
      if (infer_at >= 0) ctx.fail("the target shape has more than one -1");
      infer_at = static_cast<int>(i);
      out.emplace_back(1);
    } else if (c && *c == 0 && !allowzero) {
      if (!in || i >= in->size()) {
        out.push_back(SymDim::fresh("reshape"));
      } else {
        out.push_back((*in)[i]);
      }
    } else {
      out.push_back(d);
    }
  }
  if (infer_at >= 0) {
    auto& slot = out[static_cast<size_t>(infer_at)];
    if (in) {
      SymDim known(1);
      for (size_t i = 0; i < out.size(); ++i)
        if (static_cast<int>(i) != infer_at) known = known * out[i];
      auto q = product(*in, 0, in->size()).exact_div(known);
      slot = q ? *q : SymDim::fresh("reshape");
    } else {
      slot = SymDim::fresh("reshape");
    }
  }
  ctx.set_output(0, dtype, out);
  if (out.size() <= 1)
    if (const auto* v = ctx.input_values(0)) ctx.set_output_values(0, *v);
}

void transpose(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  std::vector<int64_t> perm = ctx.node().attr_ints("perm");
  if (perm.empty())
    for (int64_t i = static_cast<int64_t>(in->size()) - 1; i >= 0; --i) perm.push_back(i);
  if (perm.size() != in->size())
    ctx.fail(str_cat("perm ", perm, " does not match rank ", in->size()));
  SymShape out;
  for (int64_t p : perm)
    out.push_back(
        (*in)[static_cast<size_t>(normalize_axis(ctx, p, static_cast<int64_t>(in->size())))]);
  ctx.set_output(0, ctx.input_dtype(0), out);
}

void gather(InferenceContext& ctx) {
  const SymShape* data = ctx.input_shape(0);
  const SymShape* idx = ctx.input_shape(1);
  if (!data || !idx) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  int64_t axis =
      normalize_axis(ctx, ctx.node().attr_int("axis", 0), static_cast<int64_t>(data->size()));
  SymShape out(data->begin(), data->begin() + axis);
  out.insert(out.end(), idx->begin(), idx->end());
  out.insert(out.end(), data->begin() + axis + 1, data->end());
  ctx.set_output(0, ctx.input_dtype(0), out);
  // Gather on a shape vector: pick the symbolic entries.
  const auto* vals = ctx.input_values(0);
  const auto* ids = ctx.input_values(1);
  if (vals && ids && data->size() == 1) {
    std::vector<SymDim> picked;
    for (const auto& i : *ids) {
      auto c = i.constant();
      if (!c) return;
      int64_t k = *c < 0 ? *c + static_cast<int64_t>(vals->size()) : *c;
      if (k < 0 || k >= static_cast<int64_t>(vals->size())) return;
      picked.push_back((*vals)[static_cast<size_t>(k)]);
    }
    ctx.set_output_values(0, picked);
  }
}

void unsqueeze(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  auto axes = ints_input_or_attr(ctx, 1, "axes");
  if (!in || !axes) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  int64_t rank = static_cast<int64_t>(in->size() + axes->size());
  std::vector<int64_t> norm;
  for (int64_t a : *axes) norm.push_back(normalize_axis(ctx, a, rank));
  std::sort(norm.begin(), norm.end());
  SymShape out;
  size_t src = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (std::binary_search(norm.begin(), norm.end(), i))
      out.emplace_back(1);
    else
      out.push_back((*in)[src++]);
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  if (in->empty())
    if (const auto* v = ctx.input_values(0)) ctx.set_output_values(0, *v);
}

void squeeze(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  auto axes = ints_input_or_attr(ctx, 1, "axes");
  if (!in || !axes) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  int64_t rank = static_cast<int64_t>(in->size());
  std::vector<int64_t> norm;
  for (int64_t a : *axes) norm.push_back(normalize_axis(ctx, a, rank));
  SymShape out;
  for (int64_t i = 0; i < rank; ++i) {
    const SymDim& d = (*in)[static_cast<size_t>(i)];
    bool listed = std::find(norm.begin(), norm.end(), i) != norm.end();
    auto c = d.constant();
    if (listed && c && *c != 1) ctx.fail(str_cat("cannot squeeze axis ", i, " of size ", *c));
    bool drop = norm.empty() ? (c && *c == 1) : listed;
    if (!drop) out.push_back(d);
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  if (out.empty())
    if (const auto* v = ctx.input_values(0)) ctx.set_output_values(0, *v);
}

void concat(InferenceContext& ctx) {
  DType dtype = ctx.input_dtype(0);
  std::optional<SymShape> out;
  int64_t axis = ctx.node().attr(std::string("axis"), Attribute::Kind::kInt).i;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const SymShape* s = ctx.input_shape(i);
    if (!s) return ctx.set_output(0, dtype, std::nullopt);
    int64_t a = normalize_axis(ctx, axis, static_cast<int64_t>(s->size()));
    if (!out) {
      out = *s;
      continue;
    }
    if (out->size() != s->size()) ctx.fail("inputs have different ranks");
    (*out)[static_cast<size_t>(a)] = (*out)[static_cast<size_t>(a)] + (*s)[static_cast<size_t>(a)];
  }
  ctx.set_output(0, dtype, out);
  std::vector<SymDim> values;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const auto* v = ctx.input_values(i);
    if (!v) return;
    values.insert(values.end(), v->begin(), v->end());
  }
  ctx.set_output_values(0, values);
}

void slice(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  auto starts = ints_input_or_attr(ctx, 1, "starts");
  auto ends = ints_input_or_attr(ctx, 2, "ends");
  auto axes = ints_input_or_attr(ctx, 3, "axes");
  auto steps = ints_input_or_attr(ctx, 4, "steps");
  if (!in || !starts || !ends || !axes || !steps) {
    if (in) {
      SymShape out;
      for (size_t i = 0; i < in->size(); ++i) out.push_back(SymDim::fresh("slice"));
      return ctx.set_output(0, dtype, out);
    }
    return ctx.set_output(0, dtype, std::nullopt);
  }
  if (starts->size() != ends->size()) ctx.fail("starts and ends differ in length");
  int64_t rank = static_cast<int64_t>(in->size());
  SymShape out = *in;
  for (size_t k = 0; k < starts->size(); ++k) {
    int64_t axis = axes->empty() ? static_cast<int64_t>(k) : normalize_axis(ctx, (*axes)[k], rank);
    int64_t step = steps->empty() ? 1 : (*steps)[k];
    if (step == 0) ctx.fail("a slice step is 0");
    const SymDim& d = (*in)[static_cast<size_t>(axis)];
    auto c = d.constant();
    int64_t s = (*starts)[k], e = (*ends)[k];
    if (c) {
      out[static_cast<size_t>(axis)] = slice_axis(*c, s, e, step).count;
    } else if (step == 1 && s >= 0 && e >= INT32_MAX) {
      out[static_cast<size_t>(axis)] = d - SymDim(s);  // x[s:]
    } else if (step == 1 && s == 0 && e < 0) {
      out[static_cast<size_t>(axis)] = d + SymDim(e);  // x[:-k]
    } else if (step == 1 && s >= 0 && e >= 0 && e < INT32_MAX) {
      out[static_cast<size_t>(axis)] = SymDim::fresh("slice");  // min(e, d) - s: unknown
    } else {
      out[static_cast<size_t>(axis)] = SymDim::fresh("slice");
    }
  }
  ctx.set_output(0, dtype, out);
  const auto* vals = ctx.input_values(0);
  if (vals && rank == 1) {
    int64_t step = steps->empty() ? 1 : (*steps)[0];
    SliceAxis r = slice_axis(static_cast<int64_t>(vals->size()), (*starts)[0], (*ends)[0], step);
    std::vector<SymDim> picked;
    for (int64_t i = 0; i < r.count; ++i)
      picked.push_back((*vals)[static_cast<size_t>(r.start + i * r.step)]);
    ctx.set_output_values(0, picked);
  }
}

void split(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  DType dtype = ctx.input_dtype(0);
  size_t n = ctx.num_outputs();
  if (n == 0) ctx.fail("Split needs at least one output");
  if (!in) {
    for (size_t i = 0; i < n; ++i) ctx.set_output(i, dtype, std::nullopt);
    return;
  }
  int64_t axis =
      normalize_axis(ctx, ctx.node().attr_int("axis", 0), static_cast<int64_t>(in->size()));
  auto sizes = ints_input_or_attr(ctx, 1, "split");
  const SymDim& d = (*in)[static_cast<size_t>(axis)];
  for (size_t i = 0; i < n; ++i) {
    SymShape out = *in;
    if (sizes && !sizes->empty()) {
      if (sizes->size() != n)
        ctx.fail(str_cat("split has ", sizes->size(), " sizes for ", n, " outputs"));
      out[static_cast<size_t>(axis)] = (*sizes)[i];
    } else if (auto c = d.constant()) {
      int64_t chunk = (*c + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
      out[static_cast<size_t>(axis)] = std::min(chunk, *c - chunk * static_cast<int64_t>(i));
    } else if (auto q = d.exact_div(SymDim(static_cast<int64_t>(n)))) {
      out[static_cast<size_t>(axis)] = *q;
    } else {
      out[static_cast<size_t>(axis)] = SymDim::fresh("split");
    }
    ctx.set_output(i, dtype, out);
  }
}

void flatten(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  int64_t rank = static_cast<int64_t>(in->size());
  int64_t axis = ctx.node().attr_int("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) ctx.fail(str_cat("axis ", axis, " is out of range for rank ", rank));
  ctx.set_output(0, ctx.input_dtype(0),
                 SymShape{product(*in, 0, static_cast<size_t>(axis)),
                          product(*in, static_cast<size_t>(axis), in->size())});
}

void constant(InferenceContext& ctx) {
  const Node& n = ctx.node();
  if (const Tensor* t = n.attr_tensor("value")) {
    ctx.set_output(0, t->dtype(), to_sym(t->shape()));
    if ((t->dtype() == DType::kInt64 || t->dtype() == DType::kInt32) && t->rank() <= 1 &&
        t->numel() <= 64) {
      std::vector<SymDim> v;
      for (int64_t x : t->to_int64_vector()) v.emplace_back(x);
      ctx.set_output_values(0, v);
    }
  } else if (n.has_attr("value_float")) {
    ctx.set_output(0, DType::kFloat32, SymShape{});
  } else if (n.has_attr("value_floats")) {
    ctx.set_output(0, DType::kFloat32,
                   SymShape{SymDim(static_cast<int64_t>(n.attr_floats("value_floats").size()))});
  } else if (n.has_attr("value_int")) {
    ctx.set_output(0, DType::kInt64, SymShape{});
    ctx.set_output_values(0, {SymDim(n.attr_int("value_int", 0))});
  } else if (n.has_attr("value_ints")) {
    auto ints = n.attr_ints("value_ints");
    ctx.set_output(0, DType::kInt64, SymShape{SymDim(static_cast<int64_t>(ints.size()))});
    ctx.set_output_values(0, std::vector<SymDim>(ints.begin(), ints.end()));
  } else {
    ctx.fail("needs one of the attributes value, value_float(s), value_int(s)");
  }
}

void constant_of_shape(InferenceContext& ctx) {
  const Tensor* v = ctx.node().attr_tensor("value");
  DType dtype = v ? v->dtype() : DType::kFloat32;
  const auto* vals = ctx.input_values(0);
  if (vals) return ctx.set_output(0, dtype, SymShape(vals->begin(), vals->end()));
  const SymShape* s = ctx.input_shape(0);
  if (s && s->size() == 1 && s->at(0).constant()) {
    SymShape out;
    for (int64_t i = 0; i < *s->at(0).constant(); ++i) out.push_back(SymDim::fresh("cos"));
    return ctx.set_output(0, dtype, out);
  }
  ctx.set_output(0, dtype, std::nullopt);
}

void shape_op(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, DType::kInt64, SymShape{SymDim::fresh("rank")});
  int64_t rank = static_cast<int64_t>(in->size());
  int64_t start = ctx.node().attr_int("start", 0), end = ctx.node().attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  ctx.set_output(0, DType::kInt64, SymShape{SymDim(end - start)});
  ctx.set_output_values(0, SymShape(in->begin() + start, in->begin() + end));
}

void range(InferenceContext& ctx) {
  DType dtype = ctx.input_dtype(0);
  const Tensor* s = ctx.input_constant(0);
  const Tensor* l = ctx.input_constant(1);
  const Tensor* d = ctx.input_constant(2);
  const auto* lv = ctx.input_values(1);
  const auto* sv = ctx.input_values(0);
  const auto* dv = ctx.input_values(2);
  if (sv && lv && dv && sv->size() == 1 && dv->size() == 1 && lv->size() == 1 &&
      sv->at(0).constant() == 0 && dv->at(0).constant() == 1)
    return ctx.set_output(0, dtype, SymShape{lv->at(0)});  // arange(n)
  if (s && l && d && dtype == DType::kInt64) {
    int64_t a = s->data<int64_t>()[0], b = l->data<int64_t>()[0], c = d->data<int64_t>()[0];
    if (c == 0) ctx.fail("delta is 0");
    int64_t n = std::max<int64_t>(0, (b - a + c + (c > 0 ? -1 : 1)) / c);
    return ctx.set_output(0, dtype, SymShape{SymDim(n)});
  }
  ctx.set_output(0, dtype, SymShape{SymDim::fresh("range")});
}

void expand(InferenceContext& ctx) {
  const SymShape* in = ctx.input_shape(0);
  const auto* target = ctx.input_values(1);
  if (!in || !target) return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
  ctx.set_output(0, ctx.input_dtype(0),
                 broadcast_shapes(ctx, *in, SymShape(target->begin(), target->end())));
}

const bool registered = [] {
  register_shape_inferer("", "ScatterND", [](InferenceContext& ctx) { infer_like_input(ctx); });
  register_shape_inferer("", "Reshape", reshape);
  register_shape_inferer("", "Transpose", transpose);
  register_shape_inferer("", "Gather", gather);
  register_shape_inferer(kGraphtrainDomain, "Gather", gather);
  register_shape_inferer("", "GatherElements", [](InferenceContext& ctx) {
    const SymShape* idx = ctx.input_shape(1);
    ctx.set_output(0, ctx.input_dtype(0), idx ? std::optional<SymShape>(*idx) : std::nullopt);
  });
  register_shape_inferer(kGraphtrainDomain, "GatherElementsGrad",
                         [](InferenceContext& ctx) { infer_shape_from_values(ctx, 0, 1); });
  register_shape_inferer("", "Pad", [](InferenceContext& ctx) {
    const SymShape* x = ctx.input_shape(0);
    const auto* pads = ctx.input_values(1);
    if (!x || !pads || pads->size() != 2 * x->size())
      return ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
    SymShape out = *x;
    for (size_t i = 0; i < x->size(); ++i) out[i] = out[i] + (*pads)[i] + (*pads)[i + x->size()];
    ctx.set_output(0, ctx.input_dtype(0), out);
  });
  register_shape_inferer("", "Unsqueeze", unsqueeze);
  register_shape_inferer("", "Squeeze", squeeze);
  register_shape_inferer("", "Concat", concat);
  register_shape_inferer("", "Slice", slice);
  register_shape_inferer("", "Split", split);
  register_shape_inferer("", "Flatten", flatten);
  register_shape_inferer("", "Constant", constant);
  register_shape_inferer("", "ConstantOfShape", constant_of_shape);
  register_shape_inferer("", "Shape", shape_op);
  register_shape_inferer("", "Range", range);
  register_shape_inferer("", "Expand", expand);
  register_shape_inferer("", "Trilu", [](InferenceContext& ctx) {
    ctx.set_output(0, ctx.input_dtype(0), shape_or_none(ctx.input_shape(0)));
  });
  for (const char* op : {"GatherGrad", "SliceGrad"})
    register_shape_inferer(kGraphtrainDomain, op,
                           [](InferenceContext& ctx) { infer_shape_from_values(ctx, 0, 1); });
  return true;
}();

}  // namespace
}  // namespace graphtrain
