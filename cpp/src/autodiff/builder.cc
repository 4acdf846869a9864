// The gradient graph builder: reverse-mode differentiation over the IR, then a split of the
// combined graph into a forward graph (with stashed outputs) and a backward graph.
#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "graphtrain/autodiff.h"
#include "graphtrain/callback.h"
#include "graphtrain/error.h"
#include "graphtrain/log.h"
#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "graphtrain/strings.h"

namespace graphtrain {

// ---- rule registry ------------------------------------------------------------------------------

namespace {

struct RuleRegistry {
  std::mutex mutex;
  std::map<std::pair<std::string, std::string>, GradientRule> rules;
};

RuleRegistry& rules() {
  static RuleRegistry r;
  return r;
}

bool is_float(const Value* v) {
  return v && is_floating(v->type.dtype);
}

void infer_node(Graph& g, Node* n) {
  if (const ShapeInferer* fn = find_shape_inferer(n->domain, n->op_type)) {
    InferenceContext ctx(*n, g);
    (*fn)(ctx);
  }
}

}  // namespace

void register_gradient(const std::string& domain, const std::string& op_type, GradientRule rule) {
  auto& r = rules();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rules[{domain == "ai.onnx" ? "" : domain, op_type}] = std::move(rule);
}

const GradientRule* find_gradient(const std::string& domain, const std::string& op_type) {
  auto& r = rules();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.rules.find({domain == "ai.onnx" ? "" : domain, op_type});
  return it == r.rules.end() ? nullptr : &it->second;
}

std::vector<std::string> ops_with_gradient() {
  auto& r = rules();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [key, rule] : r.rules) out.push_back(qualified_op_name(key.first, key.second));
  return out;
}

// ---- re-gathering sharded parameters in the backward graph ------------------------------------

namespace {

// Ops that only view or convert their first input: a view of gathered parameters is cheap to
// recompute from a new gather.
bool is_view_op(const Node* n) {
  static const std::unordered_set<std::string> views = {
      "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
      "Flatten",  "Slice",   "Split",     "Cast",    "Expand"};
  return n->domain.empty() && views.count(n->op_type) != 0;
}

bool is_gather(const Node* n) {
  return n && n->domain == kGraphtrainDomain && n->op_type == "ShardGather";
}

// A copy of forward node p in the backward graph, reading `inputs`: its outputs named
// "<name>_again" with p's types, recorded in `again` (p's output -> the copy's), the copy in
// `in_bwd` and `out`.
Node* copy_into_backward(Graph& g, const Node* p, const std::vector<Value*>& inputs,
                         std::unordered_map<const Value*, Value*>& again,
                         std::unordered_set<const Node*>& in_bwd, std::vector<Node*>& out) {
  std::vector<std::string> names;
  for (Value* o : p->outputs()) names.push_back(o ? g.unique_name(o->name() + "_again") : "");
  Node* copy = g.add_node(p->op_type, inputs, names, p->domain, p->name + "_again");
  copy->attributes = p->attributes;
  copy->scope = p->scope;
  for (size_t k = 0; k < p->outputs().size(); ++k) {
    if (!p->output(k)) continue;
    copy->output(k)->type = p->output(k)->type;
    copy->output(k)->sym_value = p->output(k)->sym_value;
    again[p->output(k)] = copy->output(k);
  }
  in_bwd.insert(copy);
  out.push_back(copy);
  return copy;
}

// The backward graph reads forward values; those that are a ShardGather's output or views of one
// are recomputed in it (a new ShardGather, anchored to the gradient its first reader receives, then
// the views) instead of being stashed, so that a ZeRO stage-3 model's full parameters are not held
// from forward to backward (graphtrain/callback.h). Returns `bwd` with the new nodes placed just
// before their first readers.
std::vector<Node*> regather_in_backward(Graph& g, const std::vector<Node*>& bwd,
                                        const std::unordered_set<const Value*>& grad_inputs) {
  bool any = false;
  for (Node* n : g.nodes()) any |= is_gather(n);
  if (!any) return bwd;
  std::unordered_set<const Node*> in_bwd(bwd.begin(), bwd.end());
  std::unordered_map<const Value*, Value*> again;  // forward value -> its backward recomputation
  std::vector<Node*> out;
  std::function<Value*(Value*, Value*)> recompute = [&](Value* v, Value* anchor) -> Value* {
    if (auto it = again.find(v); it != again.end()) return it->second;
    Node* p = v->producer();
    if (!p || in_bwd.count(p) || !(is_gather(p) || is_view_op(p))) return nullptr;
    std::vector<Value*> inputs;
    if (is_gather(p)) {
      size_t shard = static_cast<size_t>(p->attr_int("num_passive", 0));
      if (anchor) inputs.push_back(anchor);
      inputs.push_back(p->input(shard));
    } else {
      Value* source = recompute(p->input(0), anchor);
      if (!source) return nullptr;
      inputs = p->inputs();
      inputs[0] = source;
    }
    Node* copy = copy_into_backward(g, p, inputs, again, in_bwd, out);
    if (is_gather(p)) {
      copy->attributes["num_passive"] = Attribute::of(static_cast<int64_t>(anchor ? 1 : 0));
      copy->attributes["recompute"] = Attribute::of(int64_t{1});
    }
    return again.at(v);
  };
  for (Node* n : bwd) {
    Value* anchor = nullptr;  // the first input the backward computes: the gradient arriving
    for (Value* in : n->inputs())
      if (in && (grad_inputs.count(in) || (in->producer() && in_bwd.count(in->producer())))) {
        anchor = in;
        break;
      }
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      Value* in = n->input(i);
      if (!in || grad_inputs.count(in)) continue;
      if (Value* r = recompute(in, anchor)) g.replace_input(n, i, r);
    }
    out.push_back(n);
  }
  return out;
}

// A forward Transpose whose output only GEMMs of the backward read is recomputed in the backward
// from its input instead of stashed: the stash holds the input (the same bytes), and in both
// graphs the Transposes are then read by GEMMs alone and fold into them (fold_transposes) instead
// of being copied in the forward: attention's per-head q, k and v. (Read by another op, as
// scaled_dot_product_attention's Attention, it would be one more copy: it stays stashed.) Returns
// `bwd` with the new nodes placed just before their first readers.
std::vector<Node*> transpose_in_backward(Graph& g, const std::vector<Node*>& bwd,
                                         const std::unordered_set<const Value*>& grad_inputs) {
  std::unordered_set<const Node*> in_bwd(bwd.begin(), bwd.end());
  // A graph output is computed and held anyway: stashing it costs nothing.
  std::unordered_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  auto gemm = [](const Node* n) {
    return (n->op_type == "MatMul" && n->domain.empty()) ||
           (n->op_type == "FusedMatMul" && n->domain == kGraphtrainDomain);
  };
  auto gemms_read_in_backward = [&](const Value* v) {
    for (const auto& [reader, slot] : v->uses())
      if (in_bwd.count(reader) && !gemm(reader)) return false;
    return true;
  };
  std::unordered_map<const Value*, Value*> again;  // forward Transpose output -> its recomputation
  std::vector<Node*> out;
  for (Node* n : bwd) {
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      Value* in = n->input(i);
      Node* p = in ? in->producer() : nullptr;
      if (!p || grad_inputs.count(in) || outputs.count(in) || in_bwd.count(p) ||
          p->op_type != "Transpose" || !p->domain.empty() ||
          (!again.count(in) && !gemms_read_in_backward(in)))
        continue;
      if (!again.count(in)) copy_into_backward(g, p, {p->input(0)}, again, in_bwd, out);
      g.replace_input(n, i, again.at(in));
    }
    out.push_back(n);
  }
  return out;
}

}  // namespace

// ---- the builder --------------------------------------------------------------------------------

class GradientBuilder {
 public:
  explicit GradientBuilder(Graph& g) : g_(g) {}

  Graph& graph() { return g_; }

  std::vector<Value*> emit(const std::string& op_type, const std::vector<Value*>& inputs,
                           size_t num_outputs, std::map<std::string, Attribute> attributes,
                           const std::string& domain, const std::vector<bool>& want,
                           const std::string& scope) {
    std::vector<std::string> names;
    for (size_t i = 0; i < num_outputs; ++i)
      names.push_back(i < want.size() && !want[i] ? "" : g_.unique_name(op_type + "_grad"));
    Node* n = g_.add_node(op_type, inputs, names, domain, g_.unique_name(op_type + "_Grad"));
    n->attributes = std::move(attributes);
    n->scope = scope;
    builder_nodes_.insert(n);
    infer_node(g_, n);
    return n->outputs();
  }

  Value* shape_of(Value* v, const std::string& scope) {
    auto it = shapes_.find(v);
    if (it != shapes_.end()) return it->second;
    return shapes_[v] = emit("Shape", {v}, 1, {}, "", {}, scope)[0];
  }

  void add_grad(Value* v, Value* grad) { contributions_[v].push_back(grad); }

  void on_whole_grad(Value* v, Node* node, GradientContext::Replacer replace) {
    replacers_[v].push_back({node, std::move(replace)});
  }

  // The sum of the contributions to v's gradient (nullptr when there are none), through the
  // replacements waiting for it (the first registered runs last: hooks run in forward order).
  Value* total_grad(Value* v, const std::string& scope) {
    auto it = contributions_.find(v);
    Value* total = nullptr;
    if (it != contributions_.end() && !it->second.empty()) {
      std::vector<Value*>& parts = it->second;
      while (parts.size() > 1) {  // pairwise: a balanced tree of Adds
        std::vector<Value*> next;
        for (size_t i = 0; i + 1 < parts.size(); i += 2)
          next.push_back(emit("Add", {parts[i], parts[i + 1]}, 1, {}, "", {}, scope)[0]);
        if (parts.size() % 2) next.push_back(parts.back());
        parts = next;
      }
      total = parts[0];
    }
    auto r = replacers_.find(v);
    if (r != replacers_.end() && total) {
      std::vector<std::pair<Node*, GradientContext::Replacer>> pending = std::move(r->second);
      replacers_.erase(r);
      for (auto f = pending.rbegin(); f != pending.rend() && total; ++f) {
        GradientContext ctx(*this, *f->first, {}, {});
        total = f->second(ctx, total);
      }
      contributions_[v] = {total};
    }
    return total;
  }

  const std::unordered_set<const Node*>& builder_nodes() const { return builder_nodes_; }
  void mark(const Node* n) { builder_nodes_.insert(n); }

 private:
  Graph& g_;
  std::unordered_set<const Node*> builder_nodes_;
  std::unordered_map<const Value*, Value*> shapes_;
  std::unordered_map<const Value*, std::vector<Value*>> contributions_;
  std::unordered_map<const Value*, std::vector<std::pair<Node*, GradientContext::Replacer>>>
      replacers_;
};

Value* GradientContext::output(size_t i) {
  Value* v = node_.output(i);
  if (v) return v;
  Graph& g = builder_.graph();
  v = g.set_node_output(&node_, i, g.unique_name(node_.name + "_out" + std::to_string(i)));
  infer_node(g, &node_);
  return v;
}

void GradientContext::on_whole_grad(size_t input, Replacer replace) {
  on_whole_grad(input, node_.input(input), std::move(replace));
}

void GradientContext::on_whole_grad(size_t input, Value* upstream, Replacer replace) {
  if (wants(input)) builder_.on_whole_grad(upstream, &node_, std::move(replace));
}

void GradientContext::set_grad(size_t input, Value* grad) {
  if (!wants(input) || !grad) return;
  builder_.add_grad(node_.input(input), grad);
}

Value* GradientContext::op(const std::string& op_type, const std::vector<Value*>& inputs,
                           std::map<std::string, Attribute> attributes, const std::string& domain) {
  return builder_.emit(op_type, inputs, 1, std::move(attributes), domain, {}, node_.scope)[0];
}

std::vector<Value*> GradientContext::op_n(const std::string& op_type,
                                          const std::vector<Value*>& inputs, size_t num_outputs,
                                          std::map<std::string, Attribute> attributes,
                                          const std::string& domain, std::vector<bool> want) {
  return builder_.emit(op_type, inputs, num_outputs, std::move(attributes), domain, want,
                       node_.scope);
}

Value* GradientContext::constant(float value) {
  Tensor t = Tensor::empty(DType::kFloat32, {});
  *t.data<float>() = value;
  return op("Constant", {}, {{"value", Attribute::of(t)}});
}

Value* GradientContext::constant_ints(const std::vector<int64_t>& values) {
  return op("Constant", {},
            {{"value", Attribute::of(Tensor::from_vector(
                           DType::kInt64, {static_cast<int64_t>(values.size())}, values))}});
}

void GradientContext::set_grad_reduced(size_t input, Value* grad) {
  if (wants(input)) set_grad(input, reduce_to_shape(grad, node_.input(input)));
}

Value* GradientContext::shape_of(Value* v) {
  return builder_.shape_of(v, node_.scope);
}

Value* GradientContext::reduce_to_shape(Value* grad, Value* like) {
  const auto& gs = grad->type.shape;
  const auto& ls = like->type.shape;
  if (gs && ls && gs->size() >= ls->size()) {
    size_t r = gs->size(), k = ls->size();
    std::vector<int64_t> axes;
    bool static_ok = true;
    for (size_t i = 0; i < r; ++i) {
      if (i < r - k) {
        axes.push_back(static_cast<int64_t>(i));
        continue;
      }
      const SymDim& gd = (*gs)[i];
      const SymDim& ld = (*ls)[i - (r - k)];
      if (gd == ld) continue;
      if (ld.constant() == 1)
        axes.push_back(static_cast<int64_t>(i));
      else
        static_ok = false;
    }
    if (static_ok) {
      // Stretched axes keep their size-1 dim; leading axes that broadcasting added go away.
      std::vector<int64_t> inner, leading;
      for (int64_t a : axes) (a < static_cast<int64_t>(r - k) ? leading : inner).push_back(a);
      Value* out = grad;
      if (!inner.empty())
        out =
            op("ReduceSum", {out, constant_ints(inner)}, {{"keepdims", Attribute::of(int64_t{1})}});
      if (!leading.empty())
        out = op("ReduceSum", {out, constant_ints(leading)},
                 {{"keepdims", Attribute::of(int64_t{0})}});
      return out;
    }
  }
  return op("SumToShape", {grad, shape_of(like)}, {}, kGraphtrainDomain);
}

void GradientContext::fail(const std::string& message) const {
  throw GraphError("gradient of " + node_.describe() + ": " + message);
}

GradientGraphs build_gradient_graphs(const Graph& forward, const GradientRequest& request) {
  Graph g = clone_graph(forward);
  infer_shapes(g);
  std::vector<Node*> forward_nodes = g.topological_order();

  // Which values depend on a wrt input through float values, and which reach a requested output.
  std::unordered_set<const Value*> from_wrt, to_output;
  for (const auto& name : request.wrt) {
    Value* v = g.get(name);
    if (!is_float(v))
      throw GraphError("cannot differentiate with respect to '" + name + "': it is " +
                       to_string(v->type.dtype) + ", not a floating-point value");
    from_wrt.insert(v);
  }
  for (Node* n : forward_nodes) {
    bool reached = false;
    for (Value* in : n->inputs()) reached |= in && from_wrt.count(in);
    if (reached)
      for (Value* out : n->outputs())
        if (is_float(out)) from_wrt.insert(out);
  }
  std::vector<Value*> outputs;
  for (const auto& name : request.outputs) {
    Value* v = g.get(name);
    if (!is_float(v))
      throw GraphError("output '" + name + "' is " + to_string(v->type.dtype) +
                       " and cannot receive a gradient");
    outputs.push_back(v);
    to_output.insert(v);
  }
  for (auto it = forward_nodes.rbegin(); it != forward_nodes.rend(); ++it) {
    bool reaches = false;
    for (Value* out : (*it)->outputs()) reaches |= out && to_output.count(out);
    if (reaches)
      for (Value* in : (*it)->inputs())
        if (is_float(in)) to_output.insert(in);
  }
  auto needs = [&](const Value* v) { return v && from_wrt.count(v) && to_output.count(v); };

  GradientBuilder builder(g);
  GradientGraphs result;
  // Seeds.
  std::vector<Value*> grad_inputs;
  for (Value* out : outputs) {
    if (request.seed_with_ones) {
      Value* seed;
      Shape known;
      bool is_static = out->type.shape.has_value();
      if (is_static)
        for (const SymDim& d : *out->type.shape) {
          auto c = d.constant();
          is_static = is_static && c.has_value();
          if (c) known.push_back(*c);
        }
      if (is_static) {  // a constant of ones: nothing to stash for the seed
        Tensor ones = Tensor::empty(DType::kFloat32, known);
        for (int64_t i = 0; i < ones.numel(); ++i) ones.data<float>()[i] = 1.0f;
        seed = builder.emit("Constant", {}, 1, {{"value", Attribute::of(ones)}}, "", {}, "")[0];
      } else {
        Tensor one = Tensor::empty(DType::kFloat32, {1});
        *one.data<float>() = 1.0f;
        seed = builder.emit("ConstantOfShape", {builder.shape_of(out, "")}, 1,
                            {{"value", Attribute::of(one)}}, "", {}, "")[0];
      }
      builder.add_grad(out, seed);
    } else {
      Value* in = g.add_input(out->name() + "_grad", out->type);
      grad_inputs.push_back(in);
      result.grad_inputs.push_back(in->name());
      builder.add_grad(out, in);
    }
  }

  // Reverse pass over the forward nodes.
  for (auto it = forward_nodes.rbegin(); it != forward_nodes.rend(); ++it) {
    Node* n = *it;
    std::vector<bool> wants;
    bool any_want = false;
    for (Value* in : n->inputs()) {
      wants.push_back(needs(in));
      any_want |= wants.back();
    }
    if (!any_want) continue;
    std::vector<Value*> out_grads;
    bool any_grad = false;
    for (Value* out : n->outputs()) {
      Value* gsum = out ? builder.total_grad(out, n->scope) : nullptr;
      out_grads.push_back(gsum);
      any_grad |= gsum != nullptr;
    }
    if (!any_grad) continue;
    const GradientRule* rule = find_gradient(n->domain, n->op_type);
    if (!rule) {
      std::string needed;
      for (size_t i = 0; i < wants.size(); ++i)
        if (wants[i])
          needed += (needed.empty() ? "" : ", ") + str_cat(i, " '", n->input(i)->name(), "'");
      throw GraphError("op " + n->qualified_op() + " has no gradient rule; " + n->describe() +
                       " needs gradients for input(s) " + needed +
                       ". Stop the gradient before it (detach) or use a supported op.");
    }
    GradientContext ctx(builder, *n, out_grads, wants);
    (*rule)(ctx);
  }

  std::vector<Value*> grad_outputs;
  for (const auto& name : request.wrt) {
    Value* v = g.get(name);
    Value* grad = builder.total_grad(v, "");
    if (!grad) {
      result.grads.push_back("");
      continue;
    }
    // A gradient that is a forward value or input (an Identity chain) gets its own node.
    if (!builder.builder_nodes().count(grad->producer()))
      grad = builder.emit("Identity", {grad}, 1, {}, "", {}, "")[0];
    std::string out_name = name + "_grad";
    if (g.find(out_name)) out_name = g.unique_name(out_name);
    Node* id = g.add_node("Identity", {grad}, {out_name});
    id->outputs()[0]->type = grad->type;
    grad_outputs.push_back(id->outputs()[0]);
    result.grads.push_back(out_name);
    builder.mark(id);  // part of the backward graph
  }

  // Drop what no output needs, then split.
  {
    std::vector<Value*> keep = g.outputs();
    keep.insert(keep.end(), grad_outputs.begin(), grad_outputs.end());
    std::vector<Value*> saved = g.outputs();
    g.set_outputs(keep);
    eliminate_dead_nodes(g);
    g.set_outputs(saved);
  }
  std::vector<Node*> order = g.topological_order();
  std::unordered_set<const Value*> grad_dependent(grad_inputs.begin(), grad_inputs.end());
  std::vector<Node*> fwd, bwd;
  for (Node* n : order) {
    bool depends = false;
    for (Value* in : n->inputs()) depends |= in && grad_dependent.count(in);
    bool is_seed = (n->op_type == "ConstantOfShape" || n->op_type == "Constant") &&
                   builder.builder_nodes().count(n) && is_floating(n->outputs()[0]->type.dtype);
    if (is_seed) depends = true;  // seeds and float constants belong to the backward graph
    if (depends)
      for (Value* out : n->outputs())
        if (out) grad_dependent.insert(out);
    bool is_builder = builder.builder_nodes().count(n) != 0;
    bool shape_math = true;
    for (Value* out : n->outputs())
      if (out && out->type.dtype != DType::kInt64) shape_math = false;
    if (!is_builder || (!depends && shape_math && n->op_type != "Constant"))
      fwd.push_back(n);
    else
      bwd.push_back(n);
  }
  std::unordered_set<const Value*> grad_input_set(grad_inputs.begin(), grad_inputs.end());
  bwd = regather_in_backward(g, bwd, grad_input_set);
  bwd = transpose_in_backward(g, bwd, grad_input_set);
  // Stashed values: read by the backward graph, produced by the forward one (or its inputs).
  std::unordered_set<const Node*> bwd_set(bwd.begin(), bwd.end());
  std::vector<Value*> stashed;
  std::unordered_set<const Value*> stashed_set;
  for (Node* n : bwd)
    for (Value* in : n->inputs()) {
      if (!in || grad_input_set.count(in) || stashed_set.count(in)) continue;
      Node* p = in->producer();
      if (p && bwd_set.count(p)) continue;
      if (in->is_initializer()) continue;                                // copied as is
      if (p && p->op_type == "Constant" && p->domain.empty()) continue;  // copied as is
      stashed.push_back(in);
      stashed_set.insert(in);
    }
  std::vector<Value*> fwd_outputs = g.outputs();
  fwd_outputs.insert(fwd_outputs.end(), stashed.begin(), stashed.end());
  std::vector<Value*> fwd_inputs;
  for (Value* v : g.inputs())
    if (!grad_input_set.count(v)) fwd_inputs.push_back(v);
  std::vector<Value*> bwd_inputs = grad_inputs;
  bwd_inputs.insert(bwd_inputs.end(), stashed.begin(), stashed.end());

  result.forward = extract_graph(g, fwd, fwd_inputs, fwd_outputs, forward.name);
  result.backward = extract_graph(g, bwd, bwd_inputs, grad_outputs, forward.name + "_backward");
  for (Value* v : stashed) result.stashed.push_back(v->name());
  GT_DEVINFO("gradient graphs of '", forward.name, "': forward ", result.forward.num_nodes(),
             " nodes, backward ", result.backward.num_nodes(), " nodes, ", stashed.size(),
             " stashed value(s)");
  return result;
}

}  // namespace graphtrain
