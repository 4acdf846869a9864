// Pass recognize_rotary (before autodiff): the rotary position embedding as transformers' Llama
// family (Llama, Mistral, Qwen2, Gemma, GPT-NeoX, Phi) writes it,
//   X * Cos + rotate_half(X) * Sin,  rotate_half(X) = concat(-X[..., d/2:], X[..., :d/2]),
// becomes one graphtrain::Rotary(X, Cos, Sin) (kernels/cpu/rotary.cc): one pass over X forward in
// place of two Slices, a Neg, a Concat and the products, and one Rotary of dY backward in place of
// a Split, two SliceGrads that fill zeros, a Neg and the sums.
//
// Taken: the Add and each product in either operand order; the Slices along the last axis with
// constant bounds (0 to d/2, d/2 to the end) and unit steps; the Concat on the last axis; X float32
// with a known even last dim d, which Cos and Sin share and whose shape they broadcast to. Every
// inner value is read by the pattern alone.
//
// Then a Rotary of heads transposed out of [..., T, H, D] (Llama's q and k, rotated after
// .transpose(1, 2)) with Cos and Sin the same for every head rotates [..., T, H, D] itself and is
// transposed after: recognize_attention folds that Transpose into the Attention it feeds.
#include <map>
#include <optional>
#include <vector>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

std::optional<std::vector<int64_t>> ints_of(const Value* v) {
  const Tensor* t = constant_value(v);
  if (!t || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)) return std::nullopt;
  return t->to_int64_vector();
}

// [start, end) of a Slice of the last axis (rank `rank`) with unit steps, or nullopt.
std::optional<std::pair<int64_t, int64_t>> last_axis_slice(const Node& n, int64_t rank) {
  if (!is_onnx_op(&n, "Slice") || n.inputs().size() < 3) return std::nullopt;
  auto starts = ints_of(n.input(1)), ends = ints_of(n.input(2));
  if (!starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
  if (n.input(3)) {
    auto axes = ints_of(n.input(3));
    if (!axes || axes->size() != 1 || ((*axes)[0] != -1 && (*axes)[0] != rank - 1))
      return std::nullopt;
  } else if (rank != 1) {
    return std::nullopt;
  }
  if (n.input(4)) {
    auto steps = ints_of(n.input(4));
    if (!steps || *steps != std::vector<int64_t>{1}) return std::nullopt;
  }
  return std::make_pair((*starts)[0], (*ends)[0]);
}

// The product's operand other than one made by a Concat (rot), and rot's producer; or nulls.
std::pair<Node*, Value*> concat_operand(Node* mul) {
  for (size_t i : {0, 1})
    if (Node* p = mul->input(i) ? mul->input(i)->producer() : nullptr; is_onnx_op(p, "Concat"))
      return {p, mul->input(1 - i)};
  return {nullptr, nullptr};
}

// Whether `v` (float32) has last dim d and broadcasts to `shape`.
bool broadcasts_with_last_dim(const Value* v, const SymShape& shape, const SymDim& d) {
  if (!v || v->type.dtype != DType::kFloat32 || !v->type.shape) return false;
  const SymShape& s = *v->type.shape;
  if (s.empty() || s.size() > shape.size() || !(s.back() == d)) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const SymDim& a = s[s.size() - 1 - i];
    if (!(a == shape[shape.size() - 1 - i]) && !(a == SymDim(1))) return false;
  }
  return true;
}

// Rotary's inputs and the nodes it replaces, for an Add that is X * Cos + rotate_half(X) * Sin.
struct RotaryMatch {
  Value *x = nullptr, *cos = nullptr, *sin = nullptr;
  std::vector<Node*> nodes;  // the Add last
};

std::optional<RotaryMatch> match_rotary(const Graph& g, Node* add) {
  if (!is_onnx_op(add, "Add") || add->inputs().size() != 2) return std::nullopt;
  for (size_t side : {0, 1}) {
    Node* direct = add->input(side) ? add->input(side)->producer() : nullptr;
    Node* rotated = add->input(1 - side) ? add->input(1 - side)->producer() : nullptr;
    if (!is_onnx_op(direct, "Mul") || !is_onnx_op(rotated, "Mul")) continue;
    auto [cat, sin] = concat_operand(rotated);
    if (!cat || cat->inputs().size() != 2) continue;
    Node* neg = cat->input(0) ? cat->input(0)->producer() : nullptr;
    Node* high = is_onnx_op(neg, "Neg") && neg->input(0) ? neg->input(0)->producer() : nullptr;
    Node* low = cat->input(1) ? cat->input(1)->producer() : nullptr;
    if (!high || !low || high->input(0) != low->input(0)) continue;
    RotaryMatch m;
    m.x = low->input(0);
    m.sin = sin;
    m.cos = direct->input(0) == m.x   ? direct->input(1)
            : direct->input(1) == m.x ? direct->input(0)
                                      : nullptr;
    const SymShape* sx = m.x->type.shape ? &*m.x->type.shape : nullptr;
    if (!m.cos || m.x->type.dtype != DType::kFloat32 || !sx || sx->empty() ||
        !sx->back().is_constant())
      continue;
    const int64_t rank = static_cast<int64_t>(sx->size()), d = *sx->back().constant(), h = d / 2;
    auto lo = last_axis_slice(*low, rank), hi = last_axis_slice(*high, rank);
    int64_t axis = cat->attr_int("axis", 0);
    if (d % 2 != 0 || !lo || !hi || *lo != std::make_pair(int64_t{0}, h) || hi->first != h ||
        hi->second < d || (axis != -1 && axis != rank - 1) ||
        !broadcasts_with_last_dim(m.cos, *sx, sx->back()) ||
        !broadcasts_with_last_dim(m.sin, *sx, sx->back()))
      continue;
    m.nodes = {low, high, neg, cat, rotated, direct, add};
    bool inner_read_only =
        read_only_by(g, low->output(0), cat) && read_only_by(g, high->output(0), neg) &&
        read_only_by(g, neg->output(0), cat) && read_only_by(g, cat->output(0), rotated) &&
        read_only_by(g, rotated->output(0), add) && read_only_by(g, direct->output(0), add);
    if (inner_read_only && fusable_without_cycle(m.nodes)) return m;
  }
  return std::nullopt;
}

// Rotary(Transpose(Y)) with the heads transposed out of Y [..., T, H, D] (the dims before the
// last two swapped) and Cos, Sin the same for every head (dim -3 of 1) -> Transpose(Rotary(Y,
// Cos^T, Sin^T)): the rotation runs on the projection's layout, and the Transpose after it is the
// one recognize_attention folds into Attention (heads_inside), so no copy of the heads is made
// forward or backward. Returns how many moved.
size_t rotate_heads_in_place(Graph& graph) {
  size_t moved = 0;
  std::map<Value*, Value*> transposed;  // Cos or Sin -> its Transpose, made once
  for (Node* r : graph.topological_order()) {
    if (r->qualified_op() != "graphtrain::Rotary") continue;
    Node* t = r->input(0)->producer();
    const SymShape* sx = r->input(0)->type.shape ? &*r->input(0)->type.shape : nullptr;
    if (!is_onnx_op(t, "Transpose") || !sx || sx->size() < 3 ||
        !read_only_by(graph, t->output(0), r))
      continue;
    const size_t rank = sx->size();
    std::vector<int64_t> heads(rank);
    for (size_t i = 0; i < rank; ++i) heads[i] = static_cast<int64_t>(i);
    std::swap(heads[rank - 3], heads[rank - 2]);
    if (t->attr_ints("perm") != heads) continue;
    bool per_head_same = true;
    for (Value* cs : {r->input(1), r->input(2)}) {
      const SymShape* s = cs->type.shape ? &*cs->type.shape : nullptr;
      per_head_same &= s && s->size() == rank && (*s)[rank - 3] == SymDim(1);
    }
    if (!per_head_same) continue;
    std::vector<Value*> ins = {t->input(0)};
    for (Value* cs : {r->input(1), r->input(2)}) {
      Value*& cst = transposed[cs];
      if (!cst) {
        // Llama's cos.unsqueeze(1) becomes cos.unsqueeze(2), a view; anything else a Transpose.
        Node* u = cs->producer();
        std::optional<std::vector<int64_t>> axes =
            is_onnx_op(u, "Unsqueeze") && u->inputs().size() == 2 ? ints_of(u->input(1))
                                                                  : std::nullopt;
        const int64_t at = static_cast<int64_t>(rank) - 3;
        Node* ct;
        if (axes && axes->size() == 1 && ((*axes)[0] == at || (*axes)[0] == -3)) {
          Tensor axis = Tensor::from_vector<int64_t>(DType::kInt64, {1}, {at + 1});
          ct = graph.add_node("Unsqueeze",
                              {u->input(0), graph.add_initializer(graph.unique_name("axes"), axis)},
                              {graph.unique_name(cs->name() + "_heads")});
        } else {
          ct = graph.add_node("Transpose", {cs}, {graph.unique_name(cs->name() + "_heads")});
          ct->attributes["perm"] = Attribute::of(heads);
        }
        ct->scope = r->scope;
        cst = ct->output(0);
      }
      ins.push_back(cst);
    }
    Node* rot = graph.add_node("Rotary", ins, {graph.unique_name("rotary")}, kGraphtrainDomain,
                               graph.unique_name("Rotary"));
    rot->attributes = r->attributes;
    rot->scope = r->scope;
    Node* back = graph.add_node("Transpose", {rot->output(0)}, {""});
    back->attributes["perm"] = Attribute::of(heads);
    back->scope = r->scope;
    graph.move_output(r->output(0), back, 0);
    graph.remove_node(r);
    graph.remove_node(t);
    ++moved;
  }
  if (moved) infer_shapes(graph);
  return moved;
}

}  // namespace

size_t recognize_rotary(Graph& graph) {
  infer_shapes(graph);
  std::vector<RotaryMatch> matches;
  for (Node* n : graph.topological_order())
    if (auto m = match_rotary(graph, n)) matches.push_back(std::move(*m));
  for (RotaryMatch& m : matches) {
    Node* add = m.nodes.back();
    Node* rot = graph.add_node("Rotary", {m.x, m.cos, m.sin}, {""}, kGraphtrainDomain,
                               graph.unique_name("Rotary"));
    rot->scope = common_scope(m.nodes);
    graph.move_output(add->output(0), rot, 0);
    for (auto it = m.nodes.rbegin(); it != m.nodes.rend(); ++it) graph.remove_node(*it);
  }
  if (!matches.empty()) infer_shapes(graph);
  return matches.size() + rotate_heads_in_place(graph);
}

}  // namespace graphtrain
