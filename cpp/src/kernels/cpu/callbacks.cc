// CPU kernel of the callback ops (graphtrain/callback.h): hands the node's inputs to the host
// program and takes its outputs back.
#include "graphtrain/callback.h"
#include "kernels/cpu/common.h"

namespace graphtrain::cpu {
namespace {

void run_callback(KernelContext& ctx) {
  HostCallback fn = host_callback();
  const Node& node = ctx.node();
  if (!fn)
    ctx.fail("this node calls back into Python (" + node.qualified_op() +
             "), but no Python host is attached: run the graph from graphtrain's Python package");
  std::vector<Tensor> inputs;
  inputs.reserve(ctx.num_inputs());
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    inputs.push_back(ctx.has_input(i) ? ctx.input(i) : Tensor());
  std::vector<Tensor> outputs = fn(node, inputs);
  if (outputs.size() != ctx.num_outputs())
    ctx.fail(str_cat("the Python callback returned ", outputs.size(), " tensors, the node has ",
                     ctx.num_outputs(), " outputs"));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) {
      if (ctx.output_requested(i))
        ctx.fail(str_cat("the Python callback returned no tensor for output ", i, " ('",
                         node.output(i)->name(), "'), which the graph reads"));
      continue;
    }
    ctx.set_output(i, std::move(outputs[i]));
  }
}

const bool registered = [] {
  for (const char* op : kCallbackOps) register_kernel(GT, op, {}, run_callback);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
