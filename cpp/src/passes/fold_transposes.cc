// Pass fold_transposes: a Transpose that swaps the last two dims of a MatMul operand, and that
// only this MatMul reads, is folded into the GEMM as transA / transB (graphtrain::FusedMatMul):
// the GEMM reads the operand transposed in place and no transposed copy is made. Attention's
// q @ k^T, and the gradient graphs' transposed weights, are the usual cases.
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

bool swaps_last_two(const Node& t) {
  std::vector<int64_t> perm = t.attr_ints("perm");
  if (perm.empty()) {  // no perm: all dims reversed, a swap for rank 2
    const Value* in = t.input(0);
    return in && in->type.shape && in->type.shape->size() == 2;
  }
  size_t r = perm.size();
  if (r < 2) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

}  // namespace

size_t fold_transposes(Graph& graph) {
  size_t folded = 0;
  for (size_t side : {0, 1}) {
    std::vector<Pattern> inputs = {Pattern::any(), Pattern::any()};
    inputs[side] = Pattern::op({"Transpose"}, {Pattern::any("x")}, "t").where(swaps_last_two);
    Pattern matmul = Pattern::op({"MatMul", "graphtrain::FusedMatMul"}, inputs, "mm");
    folded += rewrite_matches(graph, matmul, [side](Graph& g, const Match& m) {
      Node* mm = m.node("mm");
      const char* flag = side == 0 ? "transA" : "transB";
      int64_t was = mm->attr_int(flag, 0);
      mm->op_type = "FusedMatMul";
      mm->domain = kGraphtrainDomain;
      mm->attributes[flag] = Attribute::of(int64_t{1 - was});
      g.replace_input(mm, side, m.value("x"));
      g.remove_node(m.node("t"));
      return true;
    });
  }
  return folded;
}

}  // namespace graphtrain
