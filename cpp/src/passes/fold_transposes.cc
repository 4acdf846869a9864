// Pass fold_transposes: Transposes around MatMuls become the GEMM's way of reading and writing
// memory (graphtrain::FusedMatMul), so no transposed copy is made:
// - a Transpose that swaps the last two dims of an operand is transA / transB (attention's
//   q @ k^T, the gradient graphs' transposed weights);
// - any other Transpose of an operand of rank 3 or more whose stored last dim stays one of the
//   two matrix dims is permA / permB: each batch's matrix is read in place through strides
//   (attention's heads split out of [batch, seq, heads, dim] with perm 0 2 1 3);
// - a Transpose of the product that keeps its last dim last is permY: the GEMM writes each batch
//   straight to its place in the transposed layout (the heads merged back).
// - a Transpose that swaps the last two dims of a product is the product of the operands
//   exchanged (B^T A^T); two Transposes in a row are one.
// Only a Transpose that GEMMs alone read (or the MatMul's output that only the Transpose reads)
// is folded.
#include "graphtrain/ops.h"
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

// A permutation of rank >= 3 whose stored last dim is one of the two matrix dims.
bool strided_operand(const Node& t) {
  std::vector<int64_t> perm = t.attr_ints("perm");
  size_t r = perm.size();
  if (r < 3 || swaps_last_two(t)) return false;
  int64_t last = static_cast<int64_t>(r - 1);
  return perm[r - 1] == last || perm[r - 2] == last;
}

// A permutation of rank >= 3 that keeps the last dim last.
bool keeps_last(const Node& t) {
  std::vector<int64_t> perm = t.attr_ints("perm");
  size_t r = perm.size();
  bool identity = true;
  for (size_t i = 0; i < r; ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  return r >= 3 && !identity && perm[r - 1] == static_cast<int64_t>(r - 1);
}

bool rank_at_least(const Value* v, size_t rank) {
  return v && v->type.shape && v->type.shape->size() >= rank;
}

bool is_matmul(const Node& n) {
  std::string op = n.qualified_op();
  return op == "MatMul" || op == "graphtrain::FusedMatMul";
}

// A Transpose's output that only GEMMs read (and no graph output): each reader folds it and the
// Transpose goes when the last one has (the backward's k read by the gradients of q and of v).
bool read_only_by_matmuls(const Graph& g, const Value* v) {
  if (is_graph_output(g, v)) return false;
  for (const auto& use : v->uses())
    if (!is_matmul(*use.first)) return false;
  return true;
}

bool has_perm(const Node& t) {
  return t.has_attr("perm");
}

// A FusedMatMul of (a, b) with `mm`'s attributes and scope, made in Transpose `t`'s place: it
// writes t's output value (which keeps its name, its readers and its place among the graph's
// outputs); t and mm go. The caller adjusts the attributes.
Node* matmul_in_place_of(Graph& g, Node* mm, Node* t, Value* a, Value* b) {
  Node* fused = g.add_node("FusedMatMul", {a, b}, {}, kGraphtrainDomain, mm->name);
  fused->attributes = mm->attributes;
  fused->scope = mm->scope;
  g.move_output(t->output(0), fused, 0);
  g.remove_node(t);
  g.remove_node(mm);
  return fused;
}

}  // namespace

size_t fold_transposes(Graph& graph) {
  infer_shapes(graph);  // a strided fold needs the other operand's rank
  size_t folded = 0;
  auto no_perm_y = [](const Node& n) { return !n.has_attr("permY"); };
  // The product with its last two dims swapped: (A B)^T = B^T A^T, the same GEMM with its
  // operands exchanged, made in the Transpose's place (a gradient's dK^T; a Transpose of the
  // leading dims after it then folds as permY below).
  Pattern product_t =
      Pattern::op({"Transpose"},
                  {Pattern::op({"MatMul", "graphtrain::FusedMatMul"}, {}, "mm").where(no_perm_y)},
                  "t")
          .where(swaps_last_two);
  folded += rewrite_matches(graph, product_t, [](Graph& g, const Match& m) {
    Node* mm = m.node("mm");
    Node* t = m.node("t");
    if (!rank_at_least(mm->input(0), 2) || !rank_at_least(mm->input(1), 2)) return false;
    int64_t ta = mm->attr_int("transA", 0), tb = mm->attr_int("transB", 0);
    Node* fused = matmul_in_place_of(g, mm, t, mm->input(1), mm->input(0));
    auto& attrs = fused->attributes;  // mm's: exchange the operands' flags and perms
    attrs["transA"] = Attribute::of(int64_t{1 - tb});
    attrs["transB"] = Attribute::of(int64_t{1 - ta});
    auto perm_a = attrs.extract("permA"), perm_b = attrs.extract("permB");
    if (perm_b) attrs["permA"] = perm_b.mapped();
    if (perm_a) attrs["permB"] = perm_a.mapped();
    return true;
  });
  // Two Transposes in a row are one (the forward's k split into heads, then transposed).
  Pattern twice =
      Pattern::op({"Transpose"},
                  {Pattern::op({"Transpose"}, {Pattern::any("x")}, "inner").where(has_perm)},
                  "outer")
          .where(has_perm);
  folded += rewrite_matches(graph, twice, [](Graph& g, const Match& m) {
    Node* outer = m.node("outer");
    std::vector<int64_t> p1 = m.node("inner")->attr_ints("perm"), p2 = outer->attr_ints("perm");
    if (p1.size() != p2.size()) return false;
    std::vector<int64_t> q(p2.size());
    bool identity = true;
    for (size_t i = 0; i < q.size(); ++i) {
      if (p2[i] < 0 || p2[i] >= static_cast<int64_t>(p1.size())) return false;
      q[i] = p1[static_cast<size_t>(p2[i])];
      identity = identity && q[i] == static_cast<int64_t>(i);
    }
    if (identity) return false;  // rare; would need its readers rewired
    outer->attributes["perm"] = Attribute::of(q);
    g.replace_input(outer, 0, m.value("x"));
    g.remove_node(m.node("inner"));
    return true;
  });
  for (size_t side : {0, 1}) {
    std::vector<Pattern> inputs = {Pattern::any(), Pattern::any()};
    inputs[side] =
        Pattern::op({"Transpose"}, {Pattern::any("x")}, "t").where(swaps_last_two).shared();
    Pattern matmul = Pattern::op({"MatMul", "graphtrain::FusedMatMul"}, inputs, "mm");
    folded += rewrite_matches(graph, matmul, [side](Graph& g, const Match& m) {
      Node* mm = m.node("mm");
      Node* t = m.node("t");
      if (!read_only_by_matmuls(g, t->output(0))) return false;
      const char* flag = side == 0 ? "transA" : "transB";
      int64_t was = mm->attr_int(flag, 0);
      mm->op_type = "FusedMatMul";
      mm->domain = kGraphtrainDomain;
      mm->attributes[flag] = Attribute::of(int64_t{1 - was});
      g.replace_input(mm, side, m.value("x"));
      if (t->output(0)->uses().empty()) g.remove_node(t);
      return true;
    });
  }
  for (size_t side : {0, 1}) {
    std::vector<Pattern> inputs = {Pattern::any(), Pattern::any()};
    inputs[side] =
        Pattern::op({"Transpose"}, {Pattern::any("x")}, "t").where(strided_operand).shared();
    const char* attr = side == 0 ? "permA" : "permB";
    Pattern matmul = Pattern::op({"MatMul", "graphtrain::FusedMatMul"}, inputs, "mm")
                         .where([attr](const Node& n) { return !n.has_attr(attr); });
    folded += rewrite_matches(graph, matmul, [side, attr](Graph& g, const Match& m) {
      Node* mm = m.node("mm");
      Node* t = m.node("t");
      if (!read_only_by_matmuls(g, t->output(0))) return false;
      if (!rank_at_least(mm->input(1 - side), 2)) return false;  // a vector operand: as is
      mm->op_type = "FusedMatMul";
      mm->domain = kGraphtrainDomain;
      mm->attributes[attr] = Attribute::of(t->attr_ints("perm"));
      g.replace_input(mm, side, m.value("x"));
      if (t->output(0)->uses().empty()) g.remove_node(t);
      return true;
    });
  }
  // The product transposed, keeping its last dim last: permY.
  Pattern product = Pattern::op({"MatMul", "graphtrain::FusedMatMul"}, {}, "mm").where(no_perm_y);
  Pattern transposed = Pattern::op({"Transpose"}, {product}, "t").where(keeps_last);
  folded += rewrite_matches(graph, transposed, [](Graph& g, const Match& m) {
    Node* mm = m.node("mm");
    Node* t = m.node("t");
    if (!rank_at_least(mm->input(0), 2) || !rank_at_least(mm->input(1), 2)) return false;
    std::vector<int64_t> perm = t->attr_ints("perm");
    Node* fused = matmul_in_place_of(g, mm, t, mm->input(0), mm->input(1));
    fused->attributes["permY"] = Attribute::of(perm);
    return true;
  });
  return folded;
}

}  // namespace graphtrain
