// Gradient rules: data movement (Reshape, Transpose, Concat, Split, Slice, Gather, Expand) and
// neural-network ops (Softmax, LayerNormalization, Dropout, losses, Conv, pooling, BatchNorm).
#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

using Ctx = GradientContext;
constexpr const char* GT = kGraphtrainDomain;

Attribute I(int64_t v) {
  return Attribute::of(v);
}

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
  Value* split = c.op("Concat", sizes, {{"axis", I(0)}});
  size_t n = c.node().inputs().size();
  std::vector<bool> want;
  for (size_t i = 0; i < n; ++i) want.push_back(true);
  std::vector<Value*> parts =
      c.op_n("Split", {c.output_grad(0), split}, n, {{"axis", I(axis)}}, "", want);
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
  c.set_grad(0, c.op("Concat", parts, {{"axis", I(c.node().attr_int("axis", 0))}}));
}

void slice(Ctx& c) {
  std::vector<Value*> ins = {c.output_grad(0), c.shape_of(c.input(0)), c.input(1), c.input(2)};
  if (c.input(3) || c.input(4)) ins.push_back(c.input(3));
  if (c.input(4)) ins.push_back(c.input(4));
  c.set_grad(0, c.op("SliceGrad", ins, {}, GT));
}

void layer_norm(Ctx& c) {
  Value* mean = c.output(1);
  Value* inv = c.output(2);
  bool has_bias = c.input(2) != nullptr;
  std::vector<Value*> g =
      c.op_n("LayerNormalizationGrad", {c.output_grad(0), c.input(0), c.input(1), mean, inv}, 3,
             {{"axis", I(c.node().attr_int("axis", -1))}}, GT,
             {c.wants(0), c.wants(1), has_bias && c.wants(2)});
  for (size_t i = 0; i < 3; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

void batch_norm(Ctx& c) {
  const Node& n = c.node();
  std::vector<Value*> g =
      c.op_n("BatchNormalizationGrad",
             {c.output_grad(0), c.input(0), c.input(1), c.input(3), c.input(4)}, 3,
             {{"epsilon", Attribute::of(n.attr_float("epsilon", 1e-5f))},
              {"training_mode", I(n.domain == GT ? 1 : n.attr_int("training_mode", 0))}},
             GT, {c.wants(0), c.wants(1), c.wants(2)});
  for (size_t i = 0; i < 3; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

void conv(Ctx& c) {
  std::map<std::string, Attribute> attrs = c.node().attributes;
  bool bias = c.input(2) != nullptr;
  std::vector<Value*> g = c.op_n("ConvGrad", {c.output_grad(0), c.input(0), c.input(1)}, 3, attrs,
                                 GT, {c.wants(0), c.wants(1), bias && c.wants(2)});
  for (size_t i = 0; i < 3; ++i)
    if (g[i]) c.set_grad(i, g[i]);
}

void dropout(Ctx& c) {
  std::vector<Value*> ins = {c.output_grad(0), c.output(1), c.input(1), c.input(2)};
  while (!ins.empty() && !ins.back()) ins.pop_back();
  c.set_grad(0, c.op("DropoutGrad", ins, {}, GT));
}

void softmax_cross_entropy(Ctx& c) {
  std::map<std::string, Attribute> attrs;
  const Node& n = c.node();
  attrs["reduction"] = Attribute::of(n.attr_string("reduction", "mean"));
  if (n.has_attr("ignore_index")) attrs["ignore_index"] = I(n.attr_int("ignore_index", 0));
  std::vector<Value*> ins = {c.output_grad(0), c.output(1), c.input(1)};
  if (c.input(2)) ins.push_back(c.input(2));
  c.set_grad(0, c.op("SoftmaxCrossEntropyLossGrad", ins, attrs, GT));
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
  register_gradient("", "Gather", [](Ctx& c) {
    c.set_grad(0, c.op("GatherGrad", {c.output_grad(0), c.shape_of(c.input(0)), c.input(1)},
                       {{"axis", I(c.node().attr_int("axis", 0))}}, GT));
  });
  register_gradient("", "Trilu", [](Ctx& c) {
    std::vector<Value*> ins = {c.output_grad(0)};
    if (c.input(1)) ins.push_back(c.input(1));
    c.set_grad(0, c.op("Trilu", ins, {{"upper", I(c.node().attr_int("upper", 1))}}));
  });
  register_gradient("", "Softmax", [](Ctx& c) {
    c.set_grad(0, c.op("SoftmaxGrad", {c.output_grad(0), c.output(0)},
                       {{"axis", I(c.node().attr_int("axis", -1))}}, GT));
  });
  register_gradient("", "LogSoftmax", [](Ctx& c) {
    c.set_grad(0, c.op("LogSoftmaxGrad", {c.output_grad(0), c.output(0)},
                       {{"axis", I(c.node().attr_int("axis", -1))}}, GT));
  });
  register_gradient("", "LayerNormalization", layer_norm);
  register_gradient("", "BatchNormalization", batch_norm);
  register_gradient(GT, "BatchNormalization", batch_norm);
  // StopGradient (torch's detach): the value passes, its gradient does not.
  register_gradient(GT, "StopGradient", [](Ctx&) {});
  register_gradient("", "Conv", conv);
  register_gradient("", "Dropout", dropout);
  register_gradient("", "SoftmaxCrossEntropyLoss", softmax_cross_entropy);
  register_gradient("", "MaxPool", [](Ctx& c) {
    c.set_grad(
        0, c.op("MaxPoolGrad", {c.output_grad(0), c.output(1), c.shape_of(c.input(0))}, {}, GT));
  });
  register_gradient("", "AveragePool", [](Ctx& c) {
    c.set_grad(0, c.op("AveragePoolGrad", {c.output_grad(0), c.shape_of(c.input(0))},
                       c.node().attributes, GT));
  });
  register_gradient("", "GlobalAveragePool", [](Ctx& c) {
    c.set_grad(0,
               c.op("GlobalAveragePoolGrad", {c.output_grad(0), c.shape_of(c.input(0))}, {}, GT));
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
