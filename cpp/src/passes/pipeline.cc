// The pipeline: every pass, in the order it runs, and the switches that turn passes off.
#include <set>
#include <string_view>

#include "graphtrain/error.h"
#include "graphtrain/log.h"
#include "graphtrain/options.h"
#include "graphtrain/passes.h"
#include "graphtrain/strings.h"

namespace graphtrain {

const std::vector<Pass>& pass_pipeline() {
  static const std::vector<Pass> pipeline = {
      {"recognize_gelu",
       "GELU written out in elementwise ops (transformers' NewGELU, FastGELU, x/2 (1 + erf)) "
       "becomes one Gelu, before autodiff",
       recognize_gelu, true},
      {"recognize_rms_norm",
       "RMSNorm written out (x / sqrt(mean(x^2) + eps) * w: Llama, Mistral, T5, Gemma) becomes "
       "one RMSNormalization, one pass over each row forward and backward, before autodiff",
       recognize_rms_norm, true},
      {"recognize_rotary",
       "the rotary position embedding written out (x * cos + rotate_half(x) * sin: Llama, "
       "Mistral, Qwen2) becomes one Rotary, forward and backward one pass, before autodiff",
       recognize_rotary, true},
      {"recognize_silu_mul",
       "a SwiGLU MLP's silu(gate) * up, and a bare SiLU, become one SiluMul, whose gradient "
       "computes the sigmoid again (no sigmoid or silu stashed), before autodiff",
       recognize_silu_mul, true},
      {"fold_pad_into_conv",
       "a Conv reading a zero Pad of its input (TensorFlow's SAME padding spelled out) reads the "
       "input, the Pad's amounts added to its pads: no padded copy, no cropped gradient, before "
       "autodiff",
       fold_pad_into_conv, true},
      {"recognize_attention",
       "softmax(Q K^T * c + mask) V becomes one Attention, and Attention reads the heads (and a "
       "fused qkv projection's output, adding its bias) in place of the Transposes, the Split "
       "and the bias Add around it, before autodiff",
       recognize_attention, true},
      {"fuse_loss_gradient",
       "softmax cross-entropy writes its gradient in the forward, from the exponentials it "
       "computes anyway; the backward scales it by dloss (nothing to do when dloss is 1), before "
       "autodiff",
       fuse_loss_gradient, true},
      {"stash_gelu_derivative",
       "a GELU writes its derivative in the forward, from the exponential it computes anyway, in "
       "place of the stashed input; the gradient is one product, before autodiff",
       stash_gelu_derivative, true},
      {"identities", "readers of Identity / StopGradient read the input itself",
       eliminate_identities},
      {"constant_folding", "nodes of small constant inputs are computed once, at build time",
       fold_constants},
      {"dead_code", "nodes whose outputs nothing reads are removed", eliminate_dead_nodes},
      {"fold_transposes",
       "transposes of a MatMul operand's last two dims are read by the GEMM in place",
       fold_transposes},
      {"fuse_softmax",
       "attention's scale + mask + softmax run as one FusedSoftmax; its gradient takes the scale",
       fuse_softmax},
      {"fuse_layer_norm",
       "the residual add (and a bias) before a LayerNorm, and the residual's gradient after "
       "its gradient, run in the LayerNorm's pass",
       fuse_layer_norm},
      {"gelu_grad_from_output",
       "a GeluGrad reads its GELU's output (or a view of it) where the backward reads it anyway: "
       "Phi = Y / X, no erf tail (or exponential) to evaluate",
       gelu_grad_from_output},
      {"fuse_elementwise",
       "chains of float elementwise ops of one shape (comparisons and Where among them) run as "
       "one FusedElementwise loop",
       fuse_elementwise},
  };
  return pipeline;
}

namespace {

// The passes GRAPHTRAIN_DISABLE_PASSES names; an unknown name is an error listing the passes.
std::set<std::string> disabled_passes() {
  std::string text = Options::global().get_string("disable_passes");
  std::set<std::string> names;
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t cut = rest.find(',');
    std::string name(rest.substr(0, cut));
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) names.insert(name);
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);
  }
  std::set<std::string> known;
  std::string list;
  for (const Pass& p : pass_pipeline()) {
    known.insert(p.name);
    list += (list.empty() ? "" : ", ") + p.name;
  }
  known.insert(kMemoryPlanPass);
  list += std::string(", ") + kMemoryPlanPass;
  for (const std::string& name : names)
    if (!known.count(name))
      throw OptionError(str_cat("GRAPHTRAIN_DISABLE_PASSES names '", name,
                                "', which is no pass; the passes are: ", list));
  return names;
}

// GRAPHTRAIN_TEST_BREAK_PASS (tests of graphtrain-stats bisect only): the first float value a
// node created by the pass outputs is multiplied by 1.01, its readers and name kept.
void break_on_purpose(Graph& graph, uint64_t first_new) {
  for (Node* n : graph.topological_order()) {
    if (n->serial() < first_new || n->outputs().empty() || !n->output(0)) continue;
    Value* v = n->output(0);
    if (v->type.dtype != DType::kFloat32) continue;
    Tensor scale = Tensor::empty(DType::kFloat32, {});
    *scale.data<float>() = 1.01f;
    Value* c = graph.add_initializer(graph.unique_name("test_break_scale"), scale);
    Node* mul = graph.add_node("Mul", {c, c}, {""});
    mul->scope = n->scope;
    graph.move_output(v, mul, 0);
    Value* unbroken = graph.set_node_output(n, 0, graph.unique_name(v->name() + "_unbroken"));
    unbroken->type = v->type;
    graph.replace_input(mul, 0, unbroken);
    GT_WARNING("GRAPHTRAIN_TEST_BREAK_PASS: ", n->describe(), " now gives a wrong result");
    return;
  }
}

}  // namespace

bool pass_enabled(const std::string& name) {
  return Options::global().get_bool("enable_compute_optimizer") && !disabled_passes().count(name);
}

std::vector<std::pair<std::string, size_t>> optimize_graph(Graph& graph, const std::string& label,
                                                           bool before_autodiff) {
  std::vector<std::pair<std::string, size_t>> ran;
  if (!Options::global().get_bool("enable_compute_optimizer")) return ran;
  std::set<std::string> off = disabled_passes();
  std::string broken = Options::global().get_string("test_break_pass");
  for (const Pass& p : pass_pipeline()) {
    if (off.count(p.name) || p.before_autodiff != before_autodiff) continue;
    uint64_t first_new = graph.next_node_serial();
    size_t n = p.run(graph);
    if (p.name == broken) break_on_purpose(graph, first_new);
    GT_DEVINFO(label, ": ", p.name, ": ", n, " rewrites");
    ran.emplace_back(p.name, n);
  }
  return ran;
}

}  // namespace graphtrain
