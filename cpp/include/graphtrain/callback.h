// Callback nodes: ops whose kernel calls back into the host program. The engine knows the host
// only through one registered function (the Python bindings register theirs), so it stays free of
// Python and PyTorch. The ops, all in graphtrain's domain:
//
//   Hook(x_0..x_n-1) -> (y_p..y_n-1, ctx)   subscribers at a module boundary; attributes `module`,
//                                            `kind` ("pre" or "post"), `num_passive` = p (leading
//                                            inputs the hook reads but does not replace)
//   HookGrad(ctx, dy_p..dy_n-1) -> (dx_p..dx_n-1)
//   PythonOp(x...) -> (y..., ctx)            a torch.autograd.Function kept opaque; `func_name` ...
//   PythonOpGrad(ctx, dy...) -> (dx...)      calls the function's backward with the same context
//   ATenOp(x...) -> (y..., ctx)              a PyTorch (ATen) op without a native kernel: `target`
//                                            names it, `info` holds its non-tensor arguments,
//                                            `output_shapes` / `output_dtypes` come from the
//                                            capture
//   ATenOpGrad(ctx, dy...) -> (dx...)        its gradient, through torch autograd
//   ShardGather(anchor..., shard) -> full    ZeRO stage 3 (graphtrain.distributed.zero3, or
//                                            DeepSpeed's through ZeROOffloadSubscriber): the full
//                                            flat parameters of sharding group `group` (`padded`
//                                            elements; `shard_size` per rank); the `num_passive`
//                                            leading anchors are read only to place the node at
//                                            its module's boundary; `unit`, `uses` are the host's
//   ShardGatherGrad(dfull) -> dshard         hands the full gradient to the host, which reduces
//                                            it into the shards (attributes: the gather's)
//
// The gradient builder does not stash a ShardGather's output (or views of it) for the backward:
// the backward graph gathers again (a ShardGather with `recompute` = 1, anchored to the gradient
// that reaches its first reader), so full parameters live only around their use.
//
// `ctx` is an int64 scalar that the host maps to what its forward kept for the backward; the
// gradient builder stashes it like any value the backward reads.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graphtrain/graph.h"
#include "graphtrain/symbolic.h"
#include "graphtrain/tensor.h"

namespace graphtrain {

// Runs a callback node: `inputs` has one entry per node input (undefined where absent); the result
// has one entry per node output (undefined where the host produced none; an error if requested).
using HostCallback =
    std::function<std::vector<Tensor>(const Node& node, const std::vector<Tensor>& inputs)>;

// The callback ops, in graphtrain's domain.
inline constexpr const char* kCallbackOps[] = {"Hook",         "HookGrad",       "PythonOp",
                                               "PythonOpGrad", "ATenOp",         "ATenOpGrad",
                                               "ShardGather",  "ShardGatherGrad"};

// Installs the host's callback (an empty function removes it). Running a callback node without
// one throws an Error naming the node.
void set_host_callback(HostCallback fn);

// The installed host callback (an empty function when none is).
HostCallback host_callback();

// Callback ops have effects outside the graph: dead-code elimination keeps them.
bool is_callback_op(const Node& node);

// Shape inference of a PythonOp by its `func_name`: input shapes (symbolic dims) and dtypes in,
// output shapes and dtypes out. Without one, outputs get fresh dims of their declared rank.
struct PythonOpShapes {
  std::vector<SymShape> shapes;
  std::vector<DType> dtypes;
};
using PythonOpInferer = std::function<PythonOpShapes(const Node& node, const PythonOpShapes& in)>;
// Registers (or, with an empty function, removes) the inferer of `func_name`.
void register_python_op_inferer(const std::string& func_name, PythonOpInferer fn);
// The inferer registered for `func_name` (an empty function when none is).
PythonOpInferer find_python_op_inferer(const std::string& func_name);

}  // namespace graphtrain
