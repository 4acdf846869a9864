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

const bool registered = [] {
  register_gradient(GT, "Hook", [](GradientContext& c) {
    const Node& n = c.node();
    through_host(c, "HookGrad", static_cast<size_t>(n.attr_int("num_passive", 0)),
                 {{"module", Attribute::of(n.attr_string("module", ""))},
                  {"kind", Attribute::of(n.attr_string("kind", ""))}});
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
