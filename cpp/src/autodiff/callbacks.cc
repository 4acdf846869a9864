// Gradient rules of the callback ops (graphtrain/callback.h): the backward node gets the forward
// node's context, so the host runs the backward that belongs to that very forward call.
#include "graphtrain/autodiff.h"
#include "graphtrain/callback.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// Emits `grad_op`(ctx, dy...) with one output per differentiable input, from `first` on.
void through_host(GradientContext& c, const std::string& grad_op, size_t first,
                  std::map<std::string, Attribute> attributes) {
  size_t n_out = c.node().outputs().size() - 1;  // the last output is the context
  size_t n_grads = c.node().inputs().size() - first;
  std::vector<Value*> ins = {c.output(n_out)};
  for (size_t i = 0; i < n_out; ++i) ins.push_back(c.output_grad(i));
  std::vector<bool> want(n_grads);
  bool any = false;
  for (size_t i = 0; i < n_grads; ++i) any |= want[i] = c.wants(first + i);
  if (!any) return;
  std::vector<Value*> grads = c.op_n(grad_op, ins, n_grads, std::move(attributes), GT, want);
  for (size_t i = 0; i < n_grads; ++i) {
    if (!grads[i]) continue;
    grads[i]->type = c.input(first + i)->type;  // a gradient has its input's type
    c.set_grad(first + i, grads[i]);
  }
}

// The value a module input passed through `pre` Hook nodes comes from.
Value* before_pre_hooks(Value* v) {
  for (Node* p = v->producer();
       p && p->domain == GT && p->op_type == "Hook" && p->attr_string("kind", "") == "pre";
       p = v->producer()) {
    size_t k = 0;
    while (p->output(k) != v) ++k;
    v = p->input(static_cast<size_t>(p->attr_int("num_passive", 0)) + k);
  }
  return v;
}

const bool registered = [] {
  // Hook(passive..., x...) -> (y..., ctx): y_i is x_i or the subscribers' replacement of it.
  // Each x_i's whole gradient (dy_i plus what x_i's other readers give it: a model's loss computed
  // inside its forward reads the logits before the module's output hook) goes through its own
  // HookGrad(ctx, g) -> dx_i, attribute `index` i, as torch runs a tensor's hooks on its summed
  // gradient; the indices are written on the forward node (`grad_values`) so the host keeps what
  // those calls need, and no more. A module's input passed through a `pre` Hook is the same torch
  // tensor as the value before it (read by other modules too, and returned as-is by an Identity):
  // hooks on it see that value's whole gradient. (Exact unless a pre subscriber replaces the
  // tensor: then torch's hooks on the replacement would see its own gradient only.)
  register_gradient(GT, "Hook", [](GradientContext& c) {
    Node& n = c.node();
    size_t first = static_cast<size_t>(n.attr_int("num_passive", 0));
    n.attributes["grad_values"] = Attribute::of(std::vector<int64_t>{});
    for (size_t i = 0; first + i < n.inputs().size(); ++i) {
      c.set_grad(first + i, c.output_grad(i));
      c.on_whole_grad(first + i, before_pre_hooks(c.input(first + i)),
                      [first, i](GradientContext& h, Value* g) {
                        Node& hook = h.node();
                        std::vector<int64_t> indices = hook.attr_ints("grad_values");
                        indices.push_back(static_cast<int64_t>(i));
                        hook.attributes["grad_values"] = Attribute::of(indices);
                        Value* dx = h.op("HookGrad", {h.output(hook.inputs().size() - first), g},
                                         {{"module", Attribute::of(hook.attr_string("module", ""))},
                                          {"kind", Attribute::of(hook.attr_string("kind", ""))},
                                          {"index", Attribute::of(static_cast<int64_t>(i))}},
                                         GT);
                        dx->type = hook.input(first + i)->type;
                        return dx;
                      });
    }
  });
  // ShardGather(anchor..., shard) -> full: the shard's gradient is the full gradient
  // reduce-scattered.
  register_gradient(GT, "ShardGather", [](GradientContext& c) {
    const Node& n = c.node();
    size_t shard = static_cast<size_t>(n.attr_int("num_passive", 0));
    if (!c.wants(shard) || !c.output_grad(0)) return;
    // The gather's own attributes (group, shard_size, and the host's: unit, uses) name what the
    // gradient belongs to; it has no anchors and is not a recomputation.
    std::map<std::string, Attribute> attributes = n.attributes;
    for (const char* name : {"num_passive", "padded", "recompute"}) attributes.erase(name);
    Value* g = c.op("ShardGatherGrad", {c.output_grad(0)}, std::move(attributes), GT);
    g->type = c.input(shard)->type;
    c.set_grad(shard, g);
  });
  register_gradient(GT, "PythonOp", [](GradientContext& c) {
    const Node& n = c.node();
    std::map<std::string, Attribute> attributes = {
        {"func_name", Attribute::of(n.attr_string("func_name", ""))}};
    if (n.has_attr("input_dtypes"))
      attributes["input_dtypes"] = Attribute::of(n.attr_ints("input_dtypes"));
    through_host(c, "PythonOpGrad", 0, std::move(attributes));
  });
  register_gradient(GT, "ATenOp", [](GradientContext& c) {
    Node& n = c.node();
    // The forward call records a torch autograd graph only through the inputs that want a
    // gradient (a BatchNorm's running statistics never do, and torch refuses them).
    std::vector<int64_t> wanted;
    for (size_t i = 0; i < n.inputs().size(); ++i) wanted.push_back(c.wants(i) ? 1 : 0);
    n.attributes["grad_inputs"] = Attribute::of(wanted);
    through_host(c, "ATenOpGrad", 0,
                 {{"target", Attribute::of(n.attr_string("target", ""))},
                  {"input_dtypes", Attribute::of(n.attr_ints("input_dtypes"))}});
  });
  return true;
}();

}  // namespace
}  // namespace graphtrain
