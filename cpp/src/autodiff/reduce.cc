// Gradient rules: ReduceSum, ReduceMean, ReduceMax, ReduceMin, CumSum and TopK.
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

// ReduceSum and ReduceMean: ReduceGrad spreads dY back over the reduced axes.
Value* axes_of(Ctx& c) {
  if (c.input(1)) return c.input(1);
  const Node& n = c.node();
  return n.has_attr("axes") ? c.constant_ints(n.attr_ints("axes")) : nullptr;
}

Value* spread(Ctx& c, Value* g, bool mean) {
  const Node& n = c.node();
  std::vector<Value*> ins = {g, c.shape_of(c.input(0))};
  if (Value* axes = axes_of(c)) ins.push_back(axes);
  return c.op("ReduceGrad", ins,
              {{"keepdims", int_attr(n.attr_int("keepdims", 1))},
               {"noop_with_empty_axes", int_attr(n.attr_int("noop_with_empty_axes", 0))},
               {"mean", int_attr(mean ? 1 : 0)}},
              GT);
}

// ReduceMax and ReduceMin: the gradient goes to the extreme elements, shared among ties.
void reduce_extreme(Ctx& c) {
  Value* x = c.input(0);
  Value* y_full = spread(c, c.output(0), false);
  Value* mask =
      c.op("Cast", {c.op("Equal", {x, y_full})}, {{"to", int_attr(to_onnx(DType::kFloat32))}});
  std::vector<Value*> sum_in = {mask};
  Value* axes = axes_of(c);
  if (axes) sum_in.push_back(axes);
  Value* count =
      c.op("ReduceSum", sum_in, {{"keepdims", int_attr(c.node().attr_int("keepdims", 1))}});
  Value* share = c.op("Div", {c.output_grad(0), count});
  c.set_grad(0, c.op("Mul", {spread(c, share, false), mask}));
}

const bool registered = [] {
  register_gradient("", "TopK", [](Ctx& c) {  // the values' gradient back at their indices
    c.set_grad(0,
               c.op("GatherElementsGrad", {c.output_grad(0), c.shape_of(c.input(0)), c.output(1)},
                    {{"axis", int_attr(c.node().attr_int("axis", -1))}}, GT));
  });
  // A running sum's gradient is the running sum of the gradient taken the other way.
  register_gradient("", "CumSum", [](Ctx& c) {
    const Node& n = c.node();
    c.set_grad(0, c.op("CumSum", {c.output_grad(0), c.input(1)},
                       {{"exclusive", int_attr(n.attr_int("exclusive", 0))},
                        {"reverse", int_attr(1 - n.attr_int("reverse", 0))}}));
  });
  register_gradient("", "ReduceSum",
                    [](Ctx& c) { c.set_grad(0, spread(c, c.output_grad(0), false)); });
  register_gradient("", "ReduceMean",
                    [](Ctx& c) { c.set_grad(0, spread(c, c.output_grad(0), true)); });
  register_gradient("", "ReduceMax", reduce_extreme);
  register_gradient("", "ReduceMin", reduce_extreme);
  return true;
}();

}  // namespace
}  // namespace graphtrain
