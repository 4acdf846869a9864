// Pass fuse_loss_gradient (before autodiff): the softmax cross-entropy loss computes its gradient
// in the forward pass.
//
// SoftmaxCrossEntropyLoss over [N, C] scores computes exp(score - max) of every score for the
// log-sum-exp; its gradient, coef * (softmax - onehot), needs them again, and the backward used to
// read the scores back from memory and recompute them (a GPT's [tokens, vocab] logits: 4 MB and a
// million exponentials). graphtrain::SoftmaxCrossEntropyLoss writes the gradient for dloss = 1
// from the exponentials it has (its output 1, made when autodiff asks for it), and the backward's
// SoftmaxCrossEntropyLossGrad (unit=1) scales it by dloss, or hands it on unchanged when dloss is
// 1, as for loss.backward(). The gradient is stashed in place of the scores, which the backward
// no longer reads: the same bytes.
//
// Only with a mean or sum reduction (dloss a scalar), [N, C] scores, and no reader of log_prob.
#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {

size_t fuse_loss_gradient(Graph& graph) {
  std::vector<Node*> losses;
  for (Node* n : graph.nodes())
    if (n->op_type == "SoftmaxCrossEntropyLoss" && n->domain.empty()) losses.push_back(n);
  size_t fused = 0;
  for (Node* n : losses) {
    std::string reduction = n->attr_string("reduction", "mean");
    const Value* scores = n->input(0);
    Value* log_prob = n->output(1);
    bool log_prob_read =
        log_prob && (!log_prob->uses().empty() || is_graph_output(graph, log_prob));
    if ((reduction != "mean" && reduction != "sum") || log_prob_read || !n->output(0) ||
        !scores->type.shape || scores->type.shape->size() != 2 ||
        scores->type.dtype != DType::kFloat32)
      continue;
    replace_node(graph, n, "SoftmaxCrossEntropyLoss", kGraphtrainDomain, n->inputs());
    ++fused;
  }
  return fused;
}

}  // namespace graphtrain
