// Pass fold_pad_into_conv (before autodiff): a Conv reading a zero Pad of its input reads the input
// itself, the Pad's amounts added to its own pads. TensorFlow's "SAME" padding, spelled out as
// F.pad before every convolution (transformers' MobileNetV1/V2, EfficientNet-style ports, and ONNX
// files converted from TensorFlow), then costs no padded copy forward and no cropping of the
// gradient backward: the convolution kernels take asymmetric pads.
//
// Taken: Pad in constant mode with value 0 (absent or a zero constant), constant pads that are
// not negative and zero on the batch and channel dims, no axes input; a Conv without auto_pad. A
// Pad that other nodes read too stays for them.
#include <algorithm>

#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

// The pads of a zero Pad of a rank-`rank` tensor ([begin..., end...]), or nullopt.
std::optional<std::vector<int64_t>> zero_pads(const Node& pad, size_t rank) {
  if (pad.attr_string("mode", "constant") != "constant" || pad.input(3)) return std::nullopt;
  const Tensor* pads = constant_value(pad.input(1));
  if (!pads || pads->dtype() != DType::kInt64) return std::nullopt;
  std::vector<int64_t> p = pads->to_int64_vector();
  if (p.size() != 2 * rank) return std::nullopt;
  if (const Value* v = pad.input(2)) {
    const Tensor* fill = constant_value(v);
    if (!fill || fill->numel() != 1 || fill->dtype() != DType::kFloat32 ||
        fill->data<float>()[0] != 0.0f)
      return std::nullopt;
  }
  if (std::any_of(p.begin(), p.end(), [](int64_t x) { return x < 0; })) return std::nullopt;
  if (p[0] != 0 || p[1] != 0 || p[rank] != 0 || p[rank + 1] != 0) return std::nullopt;
  return p;
}

}  // namespace

size_t fold_pad_into_conv(Graph& graph) {
  Pattern pad = Pattern::op({"Pad"}, {Pattern::any("x")}, "pad").shared();
  Pattern conv = Pattern::op({"Conv"}, {pad}, "conv");
  return rewrite_matches(graph, conv, [](Graph& g, const Match& m) {
    Node* c = m.node("conv");
    Node* p = m.node("pad");
    Value* x = m.value("x");
    if (!x || !x->type.shape || c->attr_string("auto_pad", "NOTSET") != "NOTSET") return false;
    const size_t rank = x->type.shape->size();
    if (rank < 3) return false;
    auto extra = zero_pads(*p, rank);
    if (!extra) return false;
    const size_t spatial = rank - 2;
    std::vector<int64_t> pads = c->attr_ints("pads", std::vector<int64_t>(2 * spatial, 0));
    if (pads.size() != 2 * spatial) return false;
    for (size_t i = 0; i < spatial; ++i) {
      pads[i] += (*extra)[2 + i];
      pads[spatial + i] += (*extra)[rank + 2 + i];
    }
    c->attributes["pads"] = Attribute::of(pads);
    g.replace_input(c, 0, x);
    if (p->outputs()[0]->uses().empty() && !is_graph_output(g, p->outputs()[0])) g.remove_node(p);
    return true;
  });
}

}  // namespace graphtrain
