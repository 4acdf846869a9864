// Shape inference: elementwise ops (unary, binary with broadcasting, Where, Cast) and the
// gradient ops of activations.
#include <algorithm>

#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

std::optional<SymShape> broadcast_inputs(InferenceContext& ctx, size_t first, size_t count) {
  std::optional<SymShape> out;
  for (size_t i = first; i < first + count; ++i) {
    const SymShape* s = ctx.input_shape(i);
    if (!s) return std::nullopt;
    out = out ? broadcast_shapes(ctx, *out, *s) : *s;
  }
  return out;
}

// Integer arithmetic on shape values keeps symbolic dims flowing into Reshape.
void propagate_values(InferenceContext& ctx, char op) {
  const auto* a = ctx.input_values(0);
  const auto* b = ctx.input_values(1);
  if (!a || !b || (a->size() != b->size() && a->size() != 1 && b->size() != 1)) return;
  size_t n = std::max(a->size(), b->size());
  std::vector<SymDim> out;
  for (size_t i = 0; i < n; ++i) {
    const SymDim& x = (*a)[a->size() == 1 ? 0 : i];
    const SymDim& y = (*b)[b->size() == 1 ? 0 : i];
    switch (op) {
      case '+':
        out.push_back(x + y);
        break;
      case '-':
        out.push_back(x - y);
        break;
      case '*':
        out.push_back(x * y);
        break;
      case '/': {
        auto q = x.exact_div(y);
        if (!q) return;
        out.push_back(*q);
        break;
      }
      case '%': {  // known only for constants
        auto cx = x.constant(), cy = y.constant();
        if (!cx || !cy || *cy == 0) return;
        int64_t r = *cx % *cy;
        out.push_back(r != 0 && ((r < 0) != (*cy < 0)) ? r + *cy : r);
        break;
      }
    }
  }
  ctx.set_output_values(0, std::move(out));
}

void binary(InferenceContext& ctx, DType out_dtype, char value_op) {
  ctx.set_output(0, out_dtype, broadcast_inputs(ctx, 0, 2));
  if (value_op) propagate_values(ctx, value_op);
}

const bool registered = [] {
  for (const char* op : {"Sqrt",      "Reciprocal", "Exp",      "Log",     "Neg",  "Abs",  "Relu",
                         "LeakyRelu", "Gelu",       "Tanh",     "Sigmoid", "Erf",  "Not",  "Cos",
                         "Sin",       "Clip",       "Softplus", "Floor",   "Ceil", "Round"})
    register_shape_inferer("", op, [](InferenceContext& ctx) { infer_like_input(ctx); });
  // Made by the fuse_elementwise pass: every output has the inputs' broadcast shape; float, or
  // bool where attribute bool_outputs lists it.
  register_shape_inferer(kGraphtrainDomain, "FusedElementwise", [](InferenceContext& ctx) {
    std::optional<SymShape> shape = broadcast_inputs(ctx, 0, ctx.num_inputs());
    std::vector<int64_t> bools;
    if (ctx.node().has_attr("bool_outputs")) bools = ctx.node().attr_ints("bool_outputs");
    for (size_t o = 0; o < ctx.num_outputs(); ++o) {
      bool b = std::find(bools.begin(), bools.end(), static_cast<int64_t>(o)) != bools.end();
      ctx.set_output(o, b ? DType::kBool : DType::kFloat32, shape);
    }
  });
  // graphtrain::Gelu: Y and, where made (stash_gelu_derivative), the derivative at X.
  register_shape_inferer(kGraphtrainDomain, "Gelu", [](InferenceContext& ctx) {
    for (size_t o = 0; o < ctx.num_outputs(); ++o) infer_like_input(ctx, o, 0);
  });
  // SiluMul(G, U) -> Y; SiluMulGrad(dY, G, U) -> (dG, dU).
  register_shape_inferer(kGraphtrainDomain, "SiluMul",
                         [](InferenceContext& ctx) { infer_like_input(ctx, 0, 0); });
  register_shape_inferer(kGraphtrainDomain, "SiluMulGrad", [](InferenceContext& ctx) {
    infer_like_input(ctx, 0, 1);
    infer_like_input(ctx, 1, 2);
  });
  for (const char* op : {"StopGradient", "Log1p", "Expm1"})
    register_shape_inferer(kGraphtrainDomain, op,
                           [](InferenceContext& ctx) { infer_like_input(ctx); });
  register_shape_inferer("", "Identity", [](InferenceContext& ctx) {
    infer_like_input(ctx);
    if (const auto* v = ctx.input_values(0)) ctx.set_output_values(0, *v);
  });
  register_shape_inferer("", "Add",
                         [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), '+'); });
  register_shape_inferer("", "Sub",
                         [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), '-'); });
  register_shape_inferer("", "Mul",
                         [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), '*'); });
  register_shape_inferer("", "Div",
                         [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), '/'); });
  register_shape_inferer("", "Pow",
                         [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), 0); });
  register_shape_inferer("", "Mod",
                         [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), '%'); });
  for (const char* op : {"Min", "Max"})
    register_shape_inferer("", op,
                           [](InferenceContext& ctx) { binary(ctx, ctx.input_dtype(0), 0); });
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"})
    register_shape_inferer("", op, [](InferenceContext& ctx) { binary(ctx, DType::kBool, 0); });
  register_shape_inferer("", "Where", [](InferenceContext& ctx) {
    ctx.set_output(0, ctx.input_dtype(1), broadcast_inputs(ctx, 0, 3));
  });
  register_shape_inferer("", "Cast", [](InferenceContext& ctx) {
    int64_t to = ctx.node().attr(std::string("to"), Attribute::Kind::kInt).i;
    DType dtype = from_onnx(static_cast<int>(to));
    if (dtype == DType::kUndefined)
      ctx.fail(std::string("cannot cast to ") + onnx_type_name(static_cast<int>(to)));
    const SymShape* s = ctx.input_shape(0);
    ctx.set_output(0, dtype, s ? std::optional<SymShape>(*s) : std::nullopt);
    if (is_integer(dtype))
      if (const auto* v = ctx.input_values(0)) ctx.set_output_values(0, *v);
  });
  for (const char* op : {"ReluGrad", "SigmoidGrad", "TanhGrad", "LeakyReluGrad", "GeluGrad"})
    register_shape_inferer(kGraphtrainDomain, op,
                           [](InferenceContext& ctx) { infer_like_input(ctx, 0, 0); });
  register_shape_inferer("", "Sign", [](InferenceContext& ctx) {
    const SymShape* s = ctx.input_shape(0);
    ctx.set_output(0, ctx.input_dtype(0), s ? std::optional<SymShape>(*s) : std::nullopt);
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
