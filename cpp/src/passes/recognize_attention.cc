// Pass recognize_attention (before autodiff): attention becomes one graphtrain::Attention node
// that reads the heads where the projection wrote them.
//
// - Written out, softmax(Q K^T * c + Mask) V (c a scalar constant: `/ sqrt(d)` or `* scale`,
//   either optional; Mask a float mask that broadcasts to the scores, such as a causal -inf
//   triangle or a [b, 1, 1, t] padding bias) becomes Attention(Q, K, V, Mask) with attribute scale;
//   so does softmax(masked_fill(Q K^T * c, hide, -inf)) V (nanoGPT's spelling: a Where), with
//   the bool mask Not(hide).
//   Captured, that is two batched GEMMs, a softmax and the [b, h, t, t] scores and probabilities
//   in between; autodiff would stash the probabilities and build four GEMMs and a SoftmaxGrad.
//   Attention's kernels never write the scores, skip the keys a causal or padding mask hides, and
//   its gradient recomputes the probabilities from one log-sum-exp per row.
// - An Attention whose K and V are transformers' repeat_kv of grouped key/value heads (Unsqueeze,
//   Expand, Reshape: Llama, Mistral, Qwen2) reads the grouped heads: its kernels take Hq a
//   multiple of Hk, so no repeated copies are written forward or summed backward.
// - An Attention (from the above, or torch's scaled_dot_product_attention) whose Q, K and V are
//   the heads transposed out of [..., t, h, d] (perm swapping the dims before the last) and whose
//   output is transposed back the same way takes heads_inside=1: it reads [..., t, h, d] in place
//   through strides and writes its output in that layout, and its gradient does the same, so
//   neither graph has a Transpose around attention. A single-input Concat (transformers' key/value
//   cache with nothing cached), an Identity or a Reshape to the same shape in between is seen
//   through.
// - Such an Attention whose Q, K and V are the three equal parts of one Split of X's last dim, each
//   reshaped to [..., t, h, d] (a fused qkv projection), takes X whole (packed=1, heads=h): no
//   Split forward, no Concat of dQ, dK, dV backward.
// - A packed Attention whose X is the projection's bias Add (X = Y + b, b of shape [3 h d]) takes
//   Y and b (input 4) and adds b to what it reads: the forward does not write X, and autodiff
//   gives b the gradient the Add would (dX summed over the rows).
//
// - An Attention whose mask, computed from constants (then perhaps expanded), lets every query see
//   every key takes none, and one that hides exactly the keys after each query takes none and
//   causal=1: transformers' bidirectional and causal masks without padding, which it materializes
//   under torch.export.
//
// Matches only where the inner values (scores, probabilities) are read by nothing else and Q, K
// and V have the same batch and head dims (MatMul would broadcast them; Attention does not).
// One difference in results: a row whose every key is masked gives zeros (torch's
// scaled_dot_product_attention does the same) where the written-out softmax gives NaN.
#include <limits>
#include <string>
#include <vector>

#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "passes/pattern.h"

namespace graphtrain {
namespace {

const SymShape* shape_of(const Value* v) {
  return v && v->type.shape ? &*v->type.shape : nullptr;
}

bool float32(const Value* v) {
  return v && v->type.dtype == DType::kFloat32;
}

std::vector<int64_t> identity_perm(size_t rank) {
  std::vector<int64_t> p(rank);
  for (size_t i = 0; i < rank; ++i) p[i] = static_cast<int64_t>(i);
  return p;
}

// The permutation that swaps dims a and b of a tensor of `rank` dims.
std::vector<int64_t> swap_perm(size_t rank, size_t a, size_t b) {
  std::vector<int64_t> p = identity_perm(rank);
  std::swap(p[a], p[b]);
  return p;
}

// K for K^T = kt: kt's last two dims swapped. When kt is itself a Transpose of x, K is one
// Transpose of x, or x itself (q @ k.transpose(-2, -1) of heads transposed out of [b, t, h, d]
// gives the heads' Transpose); else a new Transpose of kt.
Value* untransposed(Graph& g, Value* kt, const std::string& scope) {
  size_t r = shape_of(kt)->size();
  std::vector<int64_t> swap = swap_perm(r, r - 2, r - 1);
  Value* src = kt;
  std::vector<int64_t> perm = swap;
  Node* t = kt->producer();
  if (t && t->op_type == "Transpose" && t->domain.empty() && t->has_attr("perm")) {
    std::vector<int64_t> inner = t->attr_ints("perm");  // kt = x.permute(inner)
    if (inner.size() == r) {
      // K = kt.permute(swap) = x.permute(inner[swap[i]])
      for (size_t i = 0; i < r; ++i) perm[i] = inner[static_cast<size_t>(swap[i])];
      src = t->input(0);
    }
  }
  if (perm == identity_perm(r)) return src;
  Node* k = g.add_node("Transpose", {src}, {g.unique_name("attention_key")});
  k->attributes["perm"] = Attribute::of(perm);
  k->scope = scope;
  infer_shapes(g);
  return k->output(0);
}

// Q, K^T and V fit one Attention: the same rank, 2 or more, and batch and head dims; E shared by
// Q and K, L by K and V (MatMul would broadcast the batch dims; Attention does not).
bool attention_operands(const Value* q, const Value* kt, const Value* v) {
  const SymShape *sq = shape_of(q), *skt = shape_of(kt), *sv = shape_of(v);
  if (!sq || !skt || !sv || sq->size() < 2 || skt->size() != sq->size() || sv->size() != sq->size())
    return false;
  size_t r = sq->size();
  for (size_t i = 0; i + 2 < r; ++i)
    if (!((*skt)[i] == (*sq)[i]) || !((*sv)[i] == (*sq)[i])) return false;
  return (*skt)[r - 2] == (*sq)[r - 1] && (*sv)[r - 2] == (*skt)[r - 1];
}

// Identity, a single-input Concat, or a Reshape to the same shape: its output is its input 0.
bool is_copy(const Node& p) {
  if (!p.domain.empty()) return false;
  if (p.op_type == "Identity") return true;
  if (p.op_type == "Concat") return p.inputs().size() == 1;
  const SymShape *in = shape_of(p.input(0)), *out = shape_of(p.output(0));
  return p.op_type == "Reshape" && in && out && *in == *out;
}

// What `v` is a copy of.
Value* through_copies(Value* v) {
  while (v->producer() && is_copy(*v->producer())) v = v->producer()->input(0);
  return v;
}

// Removes `n`, a Transpose or a copy, if nothing reads its outputs, then the Transposes and copies
// above it that become unread.
void remove_if_unread(Graph& g, Node* n) {
  if (!n->domain.empty() || (n->op_type != "Transpose" && !is_copy(*n))) return;
  for (Value* out : n->outputs())
    if (out && (!out->uses().empty() || is_graph_output(g, out))) return;
  std::vector<Value*> ins = n->inputs();
  g.remove_node(n);
  for (Value* in : ins)
    if (in && in->producer()) remove_if_unread(g, in->producer());
}

// softmax(Q K^T * c + Mask) V -> Attention(Q, K, V, Mask).
size_t fuse_written_attention(Graph& graph) {
  auto scores = [] {
    return Pattern::op({"MatMul"}, {Pattern::any("q"), Pattern::any("kt")}, "qk");
  };
  // The softmax's input: the scores, scaled or not (Mul or Div by c; c * S), plus a mask or not
  // (on either side of the Add).
  std::vector<Pattern> unmasked = {scores(), Pattern::op({"Mul", "Div"}, {scores()}, "scale"),
                                   Pattern::op({"Mul"}, {Pattern::any(), scores()}, "scale")};
  std::vector<Pattern> inputs = unmasked;
  for (const Pattern& x : unmasked) {
    inputs.push_back(Pattern::op({"Add"}, {x, Pattern::any("mask")}, "add"));
    inputs.push_back(Pattern::op({"Add"}, {Pattern::any("mask"), x}, "add"));
    // masked_fill(cond, -inf): where cond holds, the key is hidden; or where(cond, x, -inf).
    inputs.push_back(
        Pattern::op({"Where"}, {Pattern::any("hide"), Pattern::any("fill"), x}, "where"));
    inputs.push_back(
        Pattern::op({"Where"}, {Pattern::any("show"), x, Pattern::any("fill")}, "where"));
  }
  size_t fused = 0;
  for (const Pattern& in : inputs) {
    Pattern p = Pattern::op({"MatMul"},
                            {Pattern::op({"Softmax"}, {in}, "softmax"), Pattern::any("v")}, "pv");
    fused += rewrite_matches(graph, p, [](Graph& g, const Match& m) {
      auto node = [&](const char* name) {
        auto it = m.nodes.find(name);
        return it == m.nodes.end() ? nullptr : it->second;
      };
      Node* qk = m.node("qk");
      Node* sm = m.node("softmax");
      Node* pv = m.node("pv");
      Node* scale = node("scale");
      Node* add = node("add");
      Node* where = node("where");
      Value* q = m.value("q");
      Value* kt = m.value("kt");
      Value* v = m.value("v");
      Value* s = qk->output(0);
      if (!softmax_over_last_axis(g, *sm) || !float32(q) || !float32(kt) || !float32(v) ||
          !attention_operands(q, kt, v))
        return false;
      float factor = 1.0f;
      if (scale) {
        std::optional<float> f = scalar_factor(*scale, s);
        if (!f) return false;
        factor = *f;
      }
      Value* mask = nullptr;
      if (add) {
        mask = m.value("mask");
        // A float mask that broadcasts to the scores without widening them.
        if (mask == s || !float32(mask) || !shape_of(add->output(0)) || !shape_of(s) ||
            !(*shape_of(add->output(0)) == *shape_of(s)))
          return false;
      }
      if (where) {  // a bool mask filling -inf that does not widen the scores
        const Tensor* fill = constant_value(m.value("fill"));
        Value* cond = m.values.count("hide") ? m.value("hide") : m.value("show");
        if (!fill || fill->numel() != 1 || fill->dtype() != DType::kFloat32 ||
            fill->data<float>()[0] != -std::numeric_limits<float>::infinity() || !cond ||
            cond->type.dtype != DType::kBool || !shape_of(where->output(0)) || !shape_of(s) ||
            !(*shape_of(where->output(0)) == *shape_of(s)))
          return false;
      }
      std::vector<Node*> matched = {qk, sm, pv};
      if (scale) matched.push_back(scale);
      if (add) matched.push_back(add);
      if (where) matched.push_back(where);
      if (!fusable_without_cycle(matched)) return false;
      std::string scope = common_scope(matched);
      std::vector<Value*> ins = {q, untransposed(g, kt, scope), v};
      if (where && m.values.count("hide")) {  // Attention's bool mask is true where it attends
        Node* show = g.add_node("Not", {m.value("hide")}, {g.unique_name("attention_mask")});
        show->scope = scope;
        mask = show->output(0);
      } else if (where) {
        mask = m.value("show");
      }
      if (mask) ins.push_back(mask);
      Node* att =
          g.add_node("Attention", ins,
                     {"", g.unique_name(pv->name + "_lse"), g.unique_name(pv->name + "_seed")},
                     kGraphtrainDomain, g.unique_name("attention"));
      att->attributes["scale"] = Attribute::of(factor);
      att->scope = scope;
      g.move_output(pv->output(0), att, 0);
      g.remove_node(pv);
      g.remove_node(sm);
      if (add) g.remove_node(add);
      if (where) g.remove_node(where);
      if (scale) g.remove_node(scale);
      g.remove_node(qk);
      if (kt->producer()) remove_if_unread(g, kt->producer());
      return true;
    });
  }
  return fused;
}

// A new Attention with n's attributes and scope, reading `ins`, replaces n (its outputs moved).
Node* replace_attention(Graph& graph, Node* n, const std::vector<Value*>& ins) {
  Node* att = graph.add_node("Attention", ins, {}, kGraphtrainDomain, n->name);
  att->attributes = n->attributes;
  att->scope = n->scope;
  for (size_t i = 0; i < n->outputs().size(); ++i)
    if (n->output(i)) graph.move_output(n->output(i), att, i);
  graph.remove_node(n);
  return att;
}

// The Attention nodes, listed first: a rewrite removes nodes around the one it rewrites (never
// another Attention).
std::vector<Node*> attention_nodes(const Graph& graph) {
  std::vector<Node*> found;
  for (Node* n : graph.topological_order())
    if (n->qualified_op() == "graphtrain::Attention") found.push_back(n);
  return found;
}

// K0 where `v` is transformers' repeat_kv of it: Reshape(Expand(Unsqueeze(K0, r - 3), [..., Hk, n,
// L, E]), [..., Hk n, L, E]) for K0 [..., Hk, L, E] of rank r, each key/value head repeated for
// the n query heads that read it; else null.
Value* unrepeated_heads(const Value* v) {
  Node* reshape = v ? v->producer() : nullptr;
  Node* expand =
      reshape && reshape->op_type == "Reshape" && reshape->domain.empty() && reshape->input(0)
          ? reshape->input(0)->producer()
          : nullptr;
  Node* unsq = expand && expand->op_type == "Expand" && expand->domain.empty() && expand->input(0)
                   ? expand->input(0)->producer()
                   : nullptr;
  if (!unsq || unsq->op_type != "Unsqueeze" || !unsq->domain.empty() || !unsq->input(0))
    return nullptr;
  Value* k0 = unsq->input(0);
  const SymShape *s0 = shape_of(k0), *se = shape_of(expand->output(0)), *sv = shape_of(v);
  if (!s0 || !se || !sv || s0->size() < 3 || se->size() != s0->size() + 1 ||
      sv->size() != s0->size())
    return nullptr;
  const size_t r = s0->size(), h = r - 3;  // the heads' dim
  const SymDim& n = (*se)[h + 1];
  if (!n.is_constant() || !(*s0)[h].is_constant() || !(*sv)[h].is_constant() ||
      *(*sv)[h].constant() != *(*s0)[h].constant() * *n.constant())
    return nullptr;
  for (size_t i = 0; i < r; ++i)
    if (!((*se)[i < h + 1 ? i : i + 1] == (*s0)[i]) || (i != h && !((*sv)[i] == (*s0)[i])))
      return nullptr;
  return k0;
}

// An Attention whose K and V are repeat_kv's of grouped key/value heads reads those heads: its
// kernels take Hq a multiple of Hk (query head h reads key/value head h / (Hq / Hk)), so the
// forward writes no repeated copies and the backward sums no gradients over the repeats.
size_t fold_kv_repeats(Graph& graph) {
  size_t folded = 0;
  for (Node* n : attention_nodes(graph)) {
    if (n->attr_int("heads_inside", 0) != 0 || n->attr_int("packed", 0) != 0) continue;
    Value* k = unrepeated_heads(n->input(1));
    Value* v = unrepeated_heads(n->input(2));
    if (!k || !v || !float32(k) || !float32(v) ||
        !(shape_of(k)->at(shape_of(k)->size() - 3) == shape_of(v)->at(shape_of(v)->size() - 3)))
      continue;
    std::vector<Value*> ins = n->inputs();
    Value *old_k = ins[1], *old_v = ins[2];
    ins[1] = k;
    ins[2] = v;
    replace_attention(graph, n, ins);
    for (Value* old : {old_k, old_v})
      if (old->producer()) remove_if_unread(graph, old->producer());
    ++folded;
  }
  return folded;
}

// Attention between Transposes of the heads -> Attention with heads_inside=1.
size_t fold_head_transposes(Graph& graph) {
  size_t folded = 0;
  for (Node* n : attention_nodes(graph)) {
    if (n->attr_int("heads_inside", 0) != 0) continue;
    const SymShape* sq = shape_of(n->input(0));
    if (!sq || sq->size() < 3) continue;
    size_t r = sq->size();
    std::vector<int64_t> heads = swap_perm(r, r - 3, r - 2);
    auto heads_transpose = [&](Node* t) {
      return t && t->op_type == "Transpose" && t->domain.empty() && t->attr_ints("perm") == heads;
    };
    // Q, K and V: each the heads transposed out of a value.
    std::vector<Value*> ins = n->inputs();
    bool ok = true;
    for (size_t i = 0; i < 3 && ok; ++i) {
      Node* t = through_copies(n->input(i))->producer();
      ok = heads_transpose(t);
      if (ok) ins[i] = t->input(0);
    }
    // Y: read only by the Transpose that puts the heads back (through copies).
    Value* y = n->output(0);
    std::vector<Node*> chain;
    while (ok) {
      if (!y || y->uses().size() != 1 || is_graph_output(graph, y)) {
        ok = false;
        break;
      }
      Node* reader = y->uses()[0].first;
      if (heads_transpose(reader)) {
        chain.push_back(reader);
        break;
      }
      if (!is_copy(*reader) || reader->input(0) != y) ok = false;
      chain.push_back(reader);
      y = reader->output(0);
    }
    if (!ok) continue;
    Node* att = graph.add_node("Attention", ins, {}, kGraphtrainDomain, n->name);
    att->attributes = n->attributes;
    att->attributes["heads_inside"] = Attribute::of(int64_t{1});
    att->scope = n->scope;
    graph.move_output(chain.back()->output(0), att, 0);
    for (size_t i = 1; i < n->outputs().size(); ++i)
      if (n->output(i)) graph.move_output(n->output(i), att, i);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) graph.remove_node(*it);
    std::vector<Value*> old = n->inputs();
    graph.remove_node(n);
    for (Value* in : old)
      if (in && in->producer()) remove_if_unread(graph, in->producer());
    ++folded;
  }
  return folded;
}

// An Attention (heads_inside) whose Q, K and V are the three equal parts of one Split of X's last
// dim, each reshaped to [..., L, H, E] -> Attention(X) with packed=1, heads=H: it reads the three
// parts of each row of X in place, and its gradient writes dX whole (no Split, no Concat).
size_t pack_qkv(Graph& graph) {
  size_t packed = 0;
  for (Node* n : attention_nodes(graph)) {
    if (n->attr_int("heads_inside", 0) == 0 || n->attr_int("packed", 0) != 0) continue;
    Node* split = nullptr;
    std::vector<Node*> reshapes;
    bool ok = true;
    for (size_t i = 0; i < 3 && ok; ++i) {
      Value* in = n->input(i);
      Node* r = in ? in->producer() : nullptr;
      ok = r && r->op_type == "Reshape" && r->domain.empty() && read_only_by(graph, in, n) &&
           r->input(0) && r->input(0)->producer() && r->input(0)->producer_output() == int(i);
      if (!ok) break;
      Node* s = r->input(0)->producer();
      ok = (i == 0 || s == split) && read_only_by(graph, r->input(0), r);
      split = s;
      reshapes.push_back(r);
    }
    if (!ok || split->op_type != "Split" || !split->domain.empty() || split->outputs().size() != 3)
      continue;
    Value* x = split->input(0);
    const SymShape *sx = shape_of(x), *sq = shape_of(n->input(0));
    if (!sx || !sq || sq->size() != sx->size() + 1) continue;
    int64_t axis = split->attr_int("axis", 0);
    if (axis != -1 && axis != static_cast<int64_t>(sx->size()) - 1) continue;
    // Equal parts, and Q, K, V all [x's dims but the last..., H, E] with H known.
    bool fits = sq->back().is_constant() && (*sq)[sq->size() - 2].is_constant();
    for (size_t i = 0; i + 1 < sx->size() && fits; ++i) fits = (*sq)[i] == (*sx)[i];
    for (size_t i = 1; i < 3 && fits; ++i)
      fits = shape_of(n->input(i)) && *shape_of(n->input(i)) == *sq && shape_of(split->output(i)) &&
             shape_of(split->output(0)) &&
             *shape_of(split->output(i)) == *shape_of(split->output(0));
    if (!fits) continue;
    int64_t heads = *(*sq)[sq->size() - 2].constant();
    std::vector<Value*> ins = {x, nullptr, nullptr};
    if (n->input(3)) ins.push_back(n->input(3));
    Node* att = replace_attention(graph, n, ins);
    att->attributes.erase("heads_inside");
    att->attributes["packed"] = Attribute::of(int64_t{1});
    att->attributes["heads"] = Attribute::of(heads);
    for (Node* r : reshapes) graph.remove_node(r);
    graph.remove_node(split);
    ++packed;
  }
  return packed;
}

// A packed Attention whose X = Add(Y, b), b a float [3 D] and Y of X's shape, X read by nothing
// else -> Attention(Y, -, -, mask, b).
size_t fold_qkv_bias(Graph& graph) {
  size_t folded = 0;
  for (Node* n : attention_nodes(graph)) {
    if (n->attr_int("packed", 0) == 0 || n->input(4)) continue;
    Value* x = n->input(0);
    Node* add = x->producer();
    if (!add || add->op_type != "Add" || !add->domain.empty() || !read_only_by(graph, x, n) ||
        add->inputs().size() != 2)
      continue;
    const SymShape* sx = shape_of(x);
    Value *y = nullptr, *b = nullptr;
    for (size_t i = 0; i < 2 && sx && !sx->empty(); ++i) {
      Value *first = add->input(i), *second = add->input(1 - i);
      const SymShape *sf = shape_of(first), *ss = shape_of(second);
      if (sf && *sf == *sx && ss && ss->size() == 1 && (*ss)[0] == sx->back() &&
          second->type.dtype == DType::kFloat32) {
        y = first;
        b = second;
        break;
      }
    }
    if (!y) continue;
    replace_attention(graph, n, {y, nullptr, nullptr, n->input(3), b});
    graph.remove_node(add);
    ++folded;
  }
  return folded;
}

}  // namespace

// Which keys a mask computed from constants lets each query see: every key (a mask that hides
// nothing), keys up to the query's own position (a causal mask, top-left aligned), or neither.
enum class MaskKind { kOther, kOpen, kCausal };

MaskKind constant_mask_kind(const Tensor& t) {
  bool is_bool = t.dtype() == DType::kBool;
  if (!is_bool && t.dtype() != DType::kFloat32) return MaskKind::kOther;
  auto visible = [&](int64_t i, bool& hidden) {  // element i: seen, hidden, or neither
    if (is_bool) {
      hidden = !t.data<bool>()[i];
      return !hidden;
    }
    float v = t.data<float>()[i];
    hidden = v <= -1e30f;  // -inf, or torch's finfo(float32).min: exp() of it is 0
    return v == 0.0f;
  };
  bool open = true, causal = t.rank() >= 2;
  int64_t lq = causal ? t.dim(t.rank() - 2) : 0, lk = causal ? t.dim(t.rank() - 1) : 0;
  causal = causal && lq == lk && lq * lk == t.numel();  // one [L, L] for every batch and head
  for (int64_t i = 0; i < t.numel() && (open || causal); ++i) {
    bool hidden = false, seen = visible(i, hidden);
    if (!seen && !hidden) return MaskKind::kOther;
    open &= seen;
    if (causal) causal = seen == (i % lk <= i / lk);
  }
  return open ? MaskKind::kOpen : causal ? MaskKind::kCausal : MaskKind::kOther;
}

// An Attention whose mask is computed from constants (then perhaps expanded to the batch) and
// hides nothing, or hides exactly the keys after each query, takes no mask (and causal=1): its
// kernels read no mask and autodiff stashes none. transformers materializes both masks under
// torch.export (its bidirectional mask even without padding; its causal mask without padding).
size_t drop_constant_masks(Graph& graph) {
  size_t dropped = 0;
  for (Node* n : graph.topological_order()) {
    if (n->qualified_op() != "graphtrain::Attention" || n->inputs().size() < 4 || !n->input(3))
      continue;
    const Value* mask = n->input(3);
    while (mask->producer() && is_onnx_op(mask->producer(), "Expand"))
      mask = mask->producer()->input(0);
    std::optional<Tensor> t = evaluate_constant(mask, int64_t{1} << 22);
    MaskKind kind = t ? constant_mask_kind(*t) : MaskKind::kOther;
    if (kind == MaskKind::kOther) continue;
    if (kind == MaskKind::kCausal) {
      const SymShape* q = shape_of(n->input(0));
      const SymShape* k = shape_of(n->input(1));
      bool inside = n->attr_int("heads_inside", 0) != 0;  // [..., L, H, E] else [..., H, L, E]
      size_t at = inside ? 3 : 2;
      // The mask's [L, L] must be the scores' own: Lq == Lk == L.
      if (n->attr_int("packed", 0) != 0 || !q || !k || q->size() < at || k->size() < at ||
          (*q)[q->size() - at] != SymDim(t->dim(t->rank() - 1)) ||
          (*k)[k->size() - at] != SymDim(t->dim(t->rank() - 1)))
        continue;
      n->attributes["causal"] = Attribute::of(int64_t{1});
    }
    graph.replace_input(n, 3, nullptr);
    ++dropped;
  }
  return dropped;
}

size_t recognize_attention(Graph& graph) {
  infer_shapes(graph);
  size_t n = fuse_written_attention(graph);
  if (n) infer_shapes(graph);
  n += drop_constant_masks(graph);
  n += fold_kv_repeats(graph);
  n += fold_head_transposes(graph);
  n += pack_qkv(graph);
  return n + fold_qkv_bias(graph);
}

}  // namespace graphtrain
