// Callback nodes (see graphtrain/callback.h): the kernels that hand a node's inputs to the host
// program and take its outputs back, and the PythonOp shape-inferer registry.
#include "graphtrain/callback.h"

#include <map>
#include <mutex>
#include <shared_mutex>

#include "graphtrain/error.h"
#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

struct Host {
  std::shared_mutex mutex;
  HostCallback fn;
};

Host& host() {
  static Host h;
  return h;
}

struct InfererRegistry {
  std::mutex mutex;
  std::map<std::string, PythonOpInferer> by_name;
};

InfererRegistry& inferers() {
  static InfererRegistry r;
  return r;
}

constexpr const char* kCallbackOps[] = {"Hook", "HookGrad", "PythonOp", "PythonOpGrad"};

void run_callback(KernelContext& ctx) {
  HostCallback fn;
  {
    std::shared_lock lock(host().mutex);
    fn = host().fn;
  }
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
  for (const char* op : kCallbackOps) register_kernel(kGraphtrainDomain, op, {}, run_callback);
  return true;
}();

}  // namespace

void set_host_callback(HostCallback fn) {
  std::unique_lock lock(host().mutex);
  host().fn = std::move(fn);
}

bool is_callback_op(const Node& node) {
  if (node.domain != kGraphtrainDomain) return false;
  for (const char* op : kCallbackOps)
    if (node.op_type == op) return true;
  return false;
}

void register_python_op_inferer(const std::string& func_name, PythonOpInferer fn) {
  std::lock_guard lock(inferers().mutex);
  if (fn)
    inferers().by_name[func_name] = std::move(fn);
  else
    inferers().by_name.erase(func_name);
}

PythonOpInferer find_python_op_inferer(const std::string& func_name) {
  std::lock_guard lock(inferers().mutex);
  auto it = inferers().by_name.find(func_name);
  return it == inferers().by_name.end() ? PythonOpInferer() : it->second;
}

}  // namespace graphtrain
