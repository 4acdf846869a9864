// Shape inference of the callback ops (graphtrain/callback.h): Hook passes its tensors through;
// PythonOp asks the inferer registered for its function, else gives fresh dims of the declared
// rank; ATenOp has the shapes the capture recorded.
#include <exception>
#include <mutex>
#include <set>
#include <string_view>

#include "graphtrain/callback.h"
#include "graphtrain/error.h"
#include "graphtrain/log.h"
#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

void copy_input_type(InferenceContext& ctx, size_t out, size_t in) {
  if (!ctx.has_input(in)) return;
  const SymShape* s = ctx.input_shape(in);
  ctx.set_output(out, ctx.input_dtype(in), s ? std::optional<SymShape>(*s) : std::nullopt);
}

void set_ctx_output(InferenceContext& ctx) {
  ctx.set_output(ctx.num_outputs() - 1, DType::kInt64, SymShape{});
}

void hook(InferenceContext& ctx) {
  int64_t passive = ctx.node().attr_int("num_passive", 0);
  if (passive < 0 || static_cast<size_t>(passive) > ctx.num_inputs() ||
      ctx.num_outputs() != ctx.num_inputs() - static_cast<size_t>(passive) + 1)
    ctx.fail(str_cat("a Hook with ", ctx.num_inputs(), " inputs and num_passive=", passive,
                     " must have ", ctx.num_inputs() - static_cast<size_t>(passive) + 1,
                     " outputs, has ", ctx.num_outputs()));
  for (size_t i = 0; i + 1 < ctx.num_outputs(); ++i)
    copy_input_type(ctx, i, i + static_cast<size_t>(passive));
  set_ctx_output(ctx);
}

// Once per function name, the hint that an inferer would keep the symbolic dims.
void report_fresh_dims(const std::string& func_name) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  {
    std::lock_guard lock(mutex);
    if (!reported.insert(func_name).second) return;
  }
  GT_DEVINFO("shape inference: PythonOp '", func_name,
             "' has no shape inferer; its outputs get fresh symbolic dims. Register one with "
             "graphtrain.custom_function.register_shape_inferer('",
             func_name, "', fn) or give the Function a static infer_shape(node, input_shapes, ",
             "input_dtypes) so symbolic dims flow through it");
}

void python_op(InferenceContext& ctx) {
  const Node& node = ctx.node();
  std::string name = node.attr_string("func_name", "");
  std::vector<int64_t> ranks = node.attr_ints("output_ranks");
  std::vector<int64_t> dtypes = node.attr_ints("output_dtypes");
  if (ranks.size() != dtypes.size() || ctx.num_outputs() != ranks.size() + 1)
    ctx.fail(str_cat("PythonOp '", name, "' declares ", ranks.size(), " output ranks and ",
                     dtypes.size(), " output dtypes for ", ctx.num_outputs() - 1,
                     " outputs (plus its context)"));
  PythonOpInferer inferer = find_python_op_inferer(name);
  PythonOpShapes in;
  bool shapes_known = true;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const SymShape* s = ctx.has_input(i) ? ctx.input_shape(i) : nullptr;
    if (!s) shapes_known = false;
    in.shapes.push_back(s ? *s : SymShape{});
    in.dtypes.push_back(ctx.has_input(i) ? ctx.input_dtype(i) : DType::kUndefined);
  }
  if (inferer && shapes_known) {
    PythonOpShapes out;
    try {
      out = inferer(node, in);
    } catch (const std::exception& e) {
      ctx.fail(str_cat("the shape inferer of PythonOp '", name, "' raised: ", e.what()));
    }
    if (out.shapes.size() != ranks.size() || out.dtypes.size() != ranks.size())
      ctx.fail(str_cat("the shape inferer of PythonOp '", name, "' returned ", out.shapes.size(),
                       " shapes and ", out.dtypes.size(), " dtypes; the function has ",
                       ranks.size(), " tensor outputs"));
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (static_cast<int64_t>(out.shapes[i].size()) != ranks[i])
        ctx.fail(str_cat("the shape inferer of PythonOp '", name, "' gave output ", i, " rank ",
                         out.shapes[i].size(), "; the function returned rank ", ranks[i]));
      ctx.set_output(i, out.dtypes[i], out.shapes[i]);
    }
  } else {
    if (!inferer) report_fresh_dims(name);
    for (size_t i = 0; i < ranks.size(); ++i) {
      SymShape shape;
      for (int64_t d = 0; d < ranks[i]; ++d) shape.push_back(SymDim::fresh("pyop"));
      ctx.set_output(i, from_onnx(static_cast<int>(dtypes[i])), shape);
    }
  }
  set_ctx_output(ctx);
}

// ATenOp: the output shapes torch.export recorded, one string per output with its dims separated
// by ";" ("s0;64;2*s1"), in the symbols of the graph's inputs; "?" for a dim nothing is known of.
void aten_op(InferenceContext& ctx) {
  const Node& node = ctx.node();
  std::string target = node.attr_string("target", "");
  std::vector<std::string> shapes;
  if (node.has_attr("output_shapes"))
    shapes = node.attr(std::string("output_shapes"), Attribute::Kind::kStrings).strings;
  std::vector<int64_t> dtypes = node.attr_ints("output_dtypes");
  if (shapes.size() != dtypes.size() || ctx.num_outputs() != shapes.size() + 1)
    ctx.fail(str_cat("ATenOp '", target, "' declares ", shapes.size(), " output shapes and ",
                     dtypes.size(), " output dtypes for ", ctx.num_outputs() - 1,
                     " outputs (plus its context)"));
  for (size_t i = 0; i < shapes.size(); ++i) {
    SymShape shape;
    std::string_view rest = shapes[i];
    while (!rest.empty()) {
      size_t cut = rest.find(';');
      std::string_view dim = rest.substr(0, cut);
      shape.push_back(dim == "?" ? SymDim::fresh("aten") : SymDim::parse(dim));
      rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);
    }
    ctx.set_output(i, from_onnx(static_cast<int>(dtypes[i])), shape);
  }
  set_ctx_output(ctx);
}

// PythonOpGrad / ATenOpGrad(ctx, dy...) -> dx...: the gradient builder gives each output its
// forward input's type; a graph read back from a file knows the dtypes.
void grad_through_host(InferenceContext& ctx) {
  std::vector<int64_t> dtypes = ctx.node().attr_ints("input_dtypes");
  for (size_t i = 0; i < ctx.num_outputs() && i < dtypes.size(); ++i) {
    const Value* v = ctx.node().output(i);
    if (v && v->type.dtype == DType::kUndefined)
      ctx.set_output(i, from_onnx(static_cast<int>(dtypes[i])), std::nullopt);
  }
}

const bool registered = [] {
  register_shape_inferer(GT, "Hook", hook);
  // HookGrad(ctx, dy...) -> dx...: each gradient has its forward tensor's type.
  register_shape_inferer(GT, "HookGrad", [](InferenceContext& ctx) {
    for (size_t i = 0; i < ctx.num_outputs(); ++i) copy_input_type(ctx, i, i + 1);
  });
  register_shape_inferer(GT, "PythonOp", python_op);
  register_shape_inferer(GT, "PythonOpGrad", grad_through_host);
  register_shape_inferer(GT, "ATenOp", aten_op);
  register_shape_inferer(GT, "ATenOpGrad", grad_through_host);
  // ShardGather(anchor..., shard) -> full: 1-D, `padded` elements of the shard's dtype.
  register_shape_inferer(GT, "ShardGather", [](InferenceContext& ctx) {
    size_t shard = static_cast<size_t>(ctx.node().attr_int("num_passive", 0));
    if (shard >= ctx.num_inputs()) ctx.fail("a ShardGather needs its shard after its anchors");
    ctx.set_output(0, ctx.input_dtype(shard), SymShape{SymDim(ctx.node().attr_int("padded", 0))});
  });
  // ShardGatherGrad(dfull) -> dshard: 1-D, `shard_size` elements.
  register_shape_inferer(GT, "ShardGatherGrad", [](InferenceContext& ctx) {
    size_t grad = static_cast<size_t>(ctx.node().attr_int("num_passive", 0));
    if (grad >= ctx.num_inputs())
      ctx.fail("a ShardGatherGrad needs its gradient after its anchors");
    ctx.set_output(0, ctx.input_dtype(grad),
                   SymShape{SymDim(ctx.node().attr_int("shard_size", 0))});
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
