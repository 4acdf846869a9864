// Gradient rules: data movement (Reshape, Transpose, Concat, Split, Slice, Gather, Expand, Trilu).
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

void reshape_back(Ctx& c) {
  c.set_grad(0, c.op("Reshape", {c.output_grad(0), c.shape_of(c.input(0))}));
}

void transpose(Ctx& c) {
  std::vector<int64_t> perm = c.node().attr_ints("perm");
  if (perm.empty()) {  // reversal is its own inverse
    c.set_grad(0, c.op("Transpose", {c.output_grad(0)}));
    return;
  }
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t p = perm[i] < 0 ? perm[i] + static_cast<int64_t>(perm.size()) : perm[i];
    inv[static_cast<size_t>(p)] = static_cast<int64_t>(i);
  }
  c.set_grad(0, c.op("Transpose", {c.output_grad(0)}, {{"perm", Attribute::of(inv)}}));
}

void concat(Ctx& c) {
  int64_t axis = c.node().attr_int("axis", 0);
  std::vector<Value*> sizes;
  for (size_t i = 0; i < c.node().inputs().size(); ++i) {
    Value* shape = c.shape_of(c.input(i));
    int64_t end = axis == -1 ? INT64_MAX : axis + 1;
    sizes.push_back(c.op("Slice", {shape, c.constant_ints({axis}), c.constant_ints({end})}));
  }
  Value* split = c.op("Concat", sizes, {{"axis", int_attr(0)}});
  size_t n = c.node().inputs().size();
  std::vector<bool> want;
  for (size_t i = 0; i < n; ++i) want.push_back(true);
  std::vector<Value*> parts =
      c.op_n("Split", {c.output_grad(0), split}, n, {{"axis", int_attr(axis)}}, "", want);
  for (size_t i = 0; i < n; ++i) c.set_grad(i, parts[i]);
}

void split(Ctx& c) {
  std::vector<Value*> parts;
  for (size_t i = 0; i < c.node().outputs().size(); ++i) {
    Value* g = c.output_grad(i);
    if (!g) {
      Tensor zero = Tensor::zeros(DType::kFloat32, {1});
      g = c.op("ConstantOfShape", {c.shape_of(c.output(i))}, {{"value", Attribute::of(zero)}});
    }
    parts.push_back(g);
  }
  c.set_grad(0, c.op("Concat", parts, {{"axis", int_attr(c.node().attr_int("axis", 0))}}));
}

void slice(Ctx& c) {
  std::vector<Value*> ins = {c.output_grad(0), c.shape_of(c.input(0)), c.input(1), c.input(2)};
  if (c.input(3) || c.input(4)) ins.push_back(c.input(3));
  if (c.input(4)) ins.push_back(c.input(4));
  c.set_grad(0, c.op("SliceGrad", ins, {}, GT));
}

const bool registered = [] {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
    register_gradient("", op, reshape_back);
  register_gradient("", "Transpose", transpose);
  register_gradient("", "Expand",
                    [](Ctx& c) { c.set_grad(0, c.reduce_to_shape(c.output_grad(0), c.input(0))); });
  register_gradient("", "Concat", concat);
  register_gradient("", "Split", split);
  register_gradient("", "Slice", slice);
  // ONNX's Gather, and graphtrain's, whose padding_idx row gets no gradient (an embedding's).
  for (const char* domain : {"", GT})
    register_gradient(domain, "Gather", [](Ctx& c) {
      std::map<std::string, Attribute> attrs = {{"axis", int_attr(c.node().attr_int("axis", 0))}};
      if (c.node().has_attr("padding_idx"))
        attrs["padding_idx"] = int_attr(c.node().attr_int("padding_idx", -1));
      c.set_grad(
          0, c.op("GatherGrad", {c.output_grad(0), c.shape_of(c.input(0)), c.input(1)}, attrs, GT));
    });
  register_gradient("", "GatherElements", [](Ctx& c) {
    c.set_grad(0, c.op("GatherElementsGrad", {c.output_grad(0), c.shape_of(c.input(0)), c.input(1)},
                       {{"axis", int_attr(c.node().attr_int("axis", 0))}}, GT));
  });
  // ScatterND: data's gradient where no update landed (all of it for reduction add); each
  // update's, the output gradient at its index (indices with one coordinate: rows of dims 0).
  register_gradient("", "ScatterND", [](Ctx& c) {
    Value* g = c.output_grad(0);
    bool add = c.node().attr_string("reduction", "none") == "add";
    if (c.wants(0)) {
      Tensor zero = Tensor::zeros(DType::kFloat32, {1});
      Value* zeros =
          c.op("ConstantOfShape", {c.shape_of(c.input(2))}, {{"value", Attribute::of(zero)}});
      c.set_grad(0, add ? g : c.op("ScatterND", {g, c.input(1), zeros}));
    }
    if (c.wants(2)) {
      const auto& s = c.input(1)->type.shape;
      auto q = s && !s->empty() ? s->back().constant() : std::nullopt;
      if (q != 1)
        c.fail(
            "the updates' gradient needs indices of one coordinate ([..., 1]): an index_put "
            "along the first dim");
      Value* rows = c.op("Squeeze", {c.input(1), c.constant_ints({-1})});
      c.set_grad(2, c.op("Gather", {g, rows}, {{"axis", int_attr(0)}}));
    }
  });
  // Constant padding: the gradient is the output gradient cropped back (padded by -pads).
  register_gradient("", "Pad", [](Ctx& c) {
    if (c.node().attr_string("mode", "constant") != "constant")
      c.fail("only constant-mode Pad is differentiable");
    c.set_grad(0, c.op("Pad", {c.output_grad(0), c.op("Neg", {c.input(1)})}));
  });
  register_gradient("", "Trilu", [](Ctx& c) {
    std::vector<Value*> ins = {c.output_grad(0)};
    if (c.input(1)) ins.push_back(c.input(1));
    c.set_grad(0, c.op("Trilu", ins, {{"upper", int_attr(c.node().attr_int("upper", 1))}}));
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
