// Pass recognize_silu_mul (before autodiff): a SwiGLU MLP's elementwise part, silu(G) * U (the
// Llama family's act_fn(gate_proj(x)) * up_proj(x), silu written x * sigmoid(x) as torch's silu
// translates), becomes one graphtrain::SiluMul(G, U).
//
// The written-out form's backward reads the sigmoid and silu(G), which the forward writes and
// stashes besides G and U; SiluMul's gradient, one SiluMulGrad(dY, G, U) -> (dG, dU), computes
// the sigmoid again from G. Per [tokens, ffn] of a step: two writes of the forward and two
// stashed tensors fewer, and the backward one pass in place of two.
//
// Taken: the products in either operand order; G and U float32 of one known shape; the sigmoid and
// silu(G) read by nothing else. A SiLU whose output is not multiplied so (a convolutional net's
// activation) becomes SiluMul(G) without U: the forward writes Y alone (not the sigmoid too), and
// its gradient reads G and dY alone.
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

// silu(G) written x * Sigmoid(g) (the rewrite checks x == g), the sigmoid first or second.
Pattern silu_pattern(bool sigmoid_first) {
  Pattern sig = Pattern::op({"Sigmoid"}, {Pattern::any("g")}, "sigmoid");
  return Pattern::op({"Mul"},
                     sigmoid_first ? std::vector<Pattern>{sig, Pattern::any("x")}
                                   : std::vector<Pattern>{Pattern::any("x"), sig},
                     "silu");
}

}  // namespace

size_t recognize_silu_mul(Graph& graph) {
  size_t fused = 0;
  for (bool sigmoid_first : {false, true})
    for (bool silu_first : {false, true}) {
      Pattern silu = silu_pattern(sigmoid_first);
      Pattern product = Pattern::op({"Mul"},
                                    silu_first ? std::vector<Pattern>{silu, Pattern::any("u")}
                                               : std::vector<Pattern>{Pattern::any("u"), silu},
                                    "product");
      fused += rewrite_matches(graph, product, [](Graph& g, const Match& m) {
        Value* x = m.value("g");
        Value* u = m.value("u");
        if (m.value("x") != x || !x || !u || x->type.dtype != DType::kFloat32 ||
            u->type.dtype != DType::kFloat32 || !x->type.shape || !u->type.shape ||
            *x->type.shape != *u->type.shape)
          return false;
        Node* silu = m.node("silu");
        Node* sigmoid = m.node("sigmoid");
        replace_node(g, m.node("product"), "SiluMul", kGraphtrainDomain, {x, u});
        g.remove_node(silu);
        g.remove_node(sigmoid);
        return true;
      });
    }
  // Then a bare SiLU (MobileViT's, EfficientNet's activations): SiluMul(G) without U.
  for (bool sigmoid_first : {false, true}) {
    fused += rewrite_matches(graph, silu_pattern(sigmoid_first), [](Graph& g, const Match& m) {
      Value* x = m.value("g");
      if (m.value("x") != x || !x || x->type.dtype != DType::kFloat32) return false;
      Node* sigmoid = m.node("sigmoid");
      replace_node(g, m.node("silu"), "SiluMul", kGraphtrainDomain, {x});
      g.remove_node(sigmoid);
      return true;
    });
  }
  return fused;
}

}  // namespace graphtrain
