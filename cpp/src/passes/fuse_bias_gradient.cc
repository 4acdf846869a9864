// Pass fuse_bias_gradient: the gradient of a bias added before a GELU, ReduceSum(dX) over every
// axis but the last (keepdims 0), becomes GeluGrad's second output. The GeluGrad kernel sums each
// block of rows right after writing it, while they are in the cache, instead of a ReduceSum
// reading the whole dX back (gpt's MLP: 2 MB a layer). The sums are taken in the ReduceSum
// kernel's order (common.h's column sums), so the gradient keeps its bits. The ReduceSum may read
// dX through a Reshape or Flatten that keeps the last dim (transformers' Conv1D sums the rows of
// a [tokens, features] view).
#include <algorithm>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

// Whether `v`'s last dim is `last` and ReduceSum `r` (reading v) sums every other axis of it into
// a vector (keepdims 0).
bool sums_all_but_last(const Node& r, const Value* v, const SymDim& last) {
  if (!v->type.shape || v->type.shape->empty() || v->type.shape->back() != last) return false;
  if (r.attr_int("keepdims", 1) != 0 || r.inputs().size() != 2 || !r.input(1)) return false;
  const Tensor* axes_t = constant_value(r.input(1));
  if (!axes_t || (axes_t->dtype() != DType::kInt64 && axes_t->dtype() != DType::kInt32))
    return false;
  const int64_t rank = static_cast<int64_t>(v->type.shape->size());
  std::vector<int64_t> axes = axes_t->to_int64_vector();
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  if (static_cast<int64_t>(axes.size()) != rank - 1) return false;
  for (int64_t i = 0; i + 1 < rank; ++i)
    if (axes[static_cast<size_t>(i)] != i) return false;
  return true;
}

}  // namespace

size_t fuse_bias_gradient(Graph& graph) {
  infer_shapes(graph);  // the match compares shapes: every value gets its type first
  size_t rewritten = 0;
  for (Node* g : graph.nodes()) {
    if (g->op_type != "GeluGrad" || g->domain != kGraphtrainDomain || g->outputs().size() > 1 ||
        !g->output(0) || !g->output(0)->type.shape || g->output(0)->type.shape->empty())
      continue;
    Value* dx = g->output(0);
    const SymDim last = dx->type.shape->back();
    // The readers of dX and of its views that keep the last dim.
    std::vector<std::pair<Node*, Node*>> candidates;  // (ReduceSum, the view it reads or null)
    for (const auto& [reader, _] : dx->uses()) {
      if (reader->op_type == "ReduceSum" && reader->domain.empty()) {
        candidates.emplace_back(reader, nullptr);
      } else if ((reader->op_type == "Reshape" || reader->op_type == "Flatten") &&
                 reader->domain.empty() && reader->output(0)) {
        for (const auto& [r2, __] : reader->output(0)->uses())
          if (r2->op_type == "ReduceSum" && r2->domain.empty()) candidates.emplace_back(r2, reader);
      }
    }
    for (auto [sum, view] : candidates) {
      const Value* summed = view ? view->output(0) : dx;
      if (!sums_all_but_last(*sum, summed, last) || sum->input(0) != summed || !sum->output(0))
        continue;
      graph.move_output(sum->output(0), g, 1);
      graph.remove_node(sum);
      if (view && view->output(0)->uses().empty() && !is_graph_output(graph, view->output(0)))
        graph.remove_node(view);
      ++rewritten;
      break;
    }
  }
  return rewritten;
}

}  // namespace graphtrain
