// Graph passes: transformations of the forward and backward graphs after autodiff (see
// cpp/src/passes/README.md for the invariants every pass keeps). One explicit pipeline, in order;
// GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER=0 turns it off, GRAPHTRAIN_DISABLE_PASSES=a,b single passes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graphtrain/graph.h"

namespace graphtrain {

struct Pass {
  std::string name;             // as GRAPHTRAIN_DISABLE_PASSES names it
  std::string doc;              // one line
  size_t (*run)(Graph& graph);  // returns the number of rewrites
  // Runs on the captured graph before autodiff (a rewrite into an op that has a gradient rule,
  // so the gradient graph is built from it), not on the graphs autodiff makes.
  bool before_autodiff = false;
};

// The pipeline, in the order the passes run.
const std::vector<Pass>& pass_pipeline();

// The memory planner (graphtrain/memory_plan.h) is switched like a pass, under this name, though
// it runs in the Session rather than on the graph.
inline constexpr const char* kMemoryPlanPass = "memory_plan";

// Whether the pass (or kMemoryPlanPass) runs: the compute optimizer is on and
// GRAPHTRAIN_DISABLE_PASSES does not name it. Throws OptionError as optimize_graph does.
bool pass_enabled(const std::string& name);

// Runs the enabled passes of the pipeline on `graph`, each logging one DEVINFO line
// ("<label>: <pass>: N rewrites"); returns (pass, rewrites) for the passes that ran. Throws
// OptionError when GRAPHTRAIN_DISABLE_PASSES names a pass that does not exist.
// With `before_autodiff`, the passes that run on the captured graph before autodiff instead.
std::vector<std::pair<std::string, size_t>> optimize_graph(Graph& graph, const std::string& label,
                                                           bool before_autodiff = false);

// ---- passes and graph utilities (each in its own file in cpp/src/passes/) ----------------------

// GELU written out in elementwise ops (0.5 x (1 + tanh(...)) and its variants, or with erf),
// recognized by its values at sample points, becomes one Gelu; returns how many. Before autodiff.
size_t recognize_gelu(Graph& graph);

// RMSNorm written out (X / sqrt(mean(X^2 over the last axis) + eps) [* W]: Llama, Mistral, T5,
// Gemma, torch's rms_norm) becomes one graphtrain::RMSNormalization; returns how many. Before
// autodiff.
size_t recognize_rms_norm(Graph& graph);

// The rotary position embedding written out (X * Cos + rotate_half(X) * Sin: Llama, Mistral,
// Qwen2, Gemma, GPT-NeoX) becomes one graphtrain::Rotary; returns how many. Before autodiff.
size_t recognize_rotary(Graph& graph);

// A SwiGLU MLP's silu(G) * U (silu written G * Sigmoid(G)) becomes one graphtrain::SiluMul, whose
// gradient reads G and U alone; returns how many. Before autodiff.
size_t recognize_silu_mul(Graph& graph);

// A Conv reading a zero Pad (constant mode, value 0, constant non-negative pads of the spatial
// dims) reads the Pad's input, the amounts added to its pads; returns how many. Before autodiff.
size_t fold_pad_into_conv(Graph& graph);

// Attention written out (softmax(Q K^T * c + Mask) V) becomes one graphtrain::Attention; an
// Attention between Transposes of the heads reads and writes [..., t, h, d] in place
// (heads_inside), and one whose Q, K, V are the parts of one Split reads the split tensor (packed).
// Returns how many rewrites. Before autodiff.
size_t recognize_attention(Graph& graph);

// SoftmaxCrossEntropyLoss (mean or sum, [N, C] scores, log_prob unread) becomes
// graphtrain::SoftmaxCrossEntropyLoss, which writes the scores' gradient for dloss = 1 in the
// forward from the exponentials it computes anyway. Returns how many. Before autodiff.
size_t fuse_loss_gradient(Graph& graph);

// Float Gelu (approximate none or tanh) becomes graphtrain::Gelu, whose forward also writes the
// derivative at X where autodiff asks for it: the gradient is dY times it. Returns how many.
// Before autodiff.
size_t stash_gelu_derivative(Graph& graph);

// Removes nodes none of whose outputs are used or are graph outputs (callback nodes, which act
// outside the graph, stay); returns how many.
size_t eliminate_dead_nodes(Graph& graph);

// Removes Identity and StopGradient nodes (after autodiff StopGradient is an identity), their
// readers reading the input instead; one that produces a graph output stays. Returns how many.
size_t eliminate_identities(Graph& graph);

// Nodes whose inputs are all small constants are computed now; their outputs become initializers.
// Returns how many nodes were folded.
size_t fold_constants(Graph& graph);
// The value of `v` where it is computed from constants alone (each step at most `max_elements`,
// no random or callback node), by running its producers' kernels now; the graph is not changed.
std::optional<Tensor> evaluate_constant(const Value* v, int64_t max_elements = 1 << 16);

// Transposes of a MatMul operand's last two dims become the GEMM's transA / transB
// (graphtrain::FusedMatMul); returns how many were folded.
size_t fold_transposes(Graph& graph);

// Softmax over the last axis of a scaled (by a scalar constant) and/or additively masked input
// becomes graphtrain::FusedSoftmax; a SoftmaxGrad scaled by a constant takes the scale as an
// attribute. Returns how many were fused.
size_t fuse_softmax(Graph& graph);

// LayerNormalization of a residual sum A + R (+ Bias) becomes graphtrain::AddLayerNormalization,
// which also outputs the sum; a LayerNormalizationGrad's dX plus a gradient of its shape becomes
// one LayerNormalizationGrad with that gradient as input 5. Returns how many were fused.
size_t fuse_layer_norm(Graph& graph);

// A GeluGrad(dY, X) whose forward GELU output (attribute forward_output) is a graph input of the
// same shape takes it as input 2 (Phi = Y / X); returns how many did.
size_t gelu_grad_from_output(Graph& graph);

// Chains of float elementwise ops of one shape become graphtrain::FusedElementwise nodes (one loop
// over the data); returns how many fused nodes were made.
size_t fuse_elementwise(Graph& graph);

// The backward graph for a call where the gradient inputs `zero_inputs` are zero (outputs torch
// passes no gradient for): zeros are followed through linear ops (Transpose, Reshape, Split, a
// Concat of zeros, ...), a zero added to a value of the sum's shape is dropped, then what reads
// nothing. The inputs stay. Not a pipeline pass; returns how many sums were dropped.
size_t drop_zero_gradients(Graph& graph, const std::vector<std::string>& zero_inputs);

// A copy of `graph` (values, nodes, attributes, types, initializers share tensor storage).
Graph clone_graph(const Graph& graph);

// The graph of `nodes` (in order) reading `inputs` and returning `outputs`: values produced
// outside and not listed as inputs are initializers or Constants copied in, else an error.
Graph extract_graph(const Graph& from, const std::vector<Node*>& nodes,
                    const std::vector<Value*>& inputs, const std::vector<Value*>& outputs,
                    const std::string& name);

}  // namespace graphtrain
