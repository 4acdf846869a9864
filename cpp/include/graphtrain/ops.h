// The op registries. One op is one unit: its shape inferer (cpp/src/shape/), its kernel
// (cpp/src/kernels/cpu/), later its gradient rule, each registered from the file of its family.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graphtrain/graph.h"
#include "graphtrain/tensor.h"

namespace graphtrain {

class ThreadPool;

// ---- shape inference ----------------------------------------------------------------------------

class InferenceContext {
 public:
  InferenceContext(Node& node, const Graph& graph) : node_(node), graph_(graph) {}

  const Node& node() const { return node_; }
  int64_t opset() const { return graph_.opset(node_.domain); }
  size_t num_inputs() const { return node_.inputs().size(); }
  size_t num_outputs() const { return node_.outputs().size(); }
  bool has_input(size_t i) const { return node_.input(i) != nullptr; }
  // Throws naming the node when input i is absent.
  const TensorType& input_type(size_t i) const;
  DType input_dtype(size_t i) const { return input_type(i).dtype; }
  // nullptr when the rank is unknown.
  const SymShape* input_shape(size_t i) const;
  // The input's value when it is a constant (initializer or Constant node), else nullptr.
  const Tensor* input_constant(size_t i) const;
  // The symbolic contents of an integer input of rank 0 or 1 whose elements are known (a shape
  // being computed: Shape -> Gather -> Concat -> Reshape), else nullptr.
  const std::vector<SymDim>* input_values(size_t i) const;

  void set_output(size_t i, DType dtype, std::optional<SymShape> shape);
  void set_output_values(size_t i, std::vector<SymDim> values);
  [[noreturn]] void fail(const std::string& message) const;

 private:
  Node& node_;
  const Graph& graph_;
  mutable std::vector<std::unique_ptr<std::vector<SymDim>>> scratch_;
};

using ShapeInferer = std::function<void(InferenceContext&)>;

// Registers the inferer of an op; a later registration for the same op replaces the earlier one
// (custom ops and PythonOps register theirs at run time).
void register_shape_inferer(const std::string& domain, const std::string& op_type, ShapeInferer fn);
const ShapeInferer* find_shape_inferer(const std::string& domain, const std::string& op_type);
// Every op with a shape inferer, as "Op" (ONNX domain) or "domain::Op".
std::vector<std::string> ops_with_shape_inferer();

// Infers every node's output types in topological order. Unknown ops and missing input types give
// outputs of unknown shape (one DEVINFO line per op type); contradictions (a MatMul whose inner
// dims are different constants) throw GraphError naming the node.
void infer_shapes(Graph& graph);

// Helpers for inferers.
// Numpy-style broadcast of two shapes; throws through ctx on incompatible constant dims.
SymShape broadcast_shapes(const InferenceContext& ctx, const SymShape& a, const SymShape& b);
// A negative axis counted from the end; throws through ctx when out of range.
int64_t normalize_axis(const InferenceContext& ctx, int64_t axis, int64_t rank);
// Output `out` gets the type of input `in` (unknown when the input is absent).
void infer_like_input(InferenceContext& ctx, size_t out = 0, size_t in = 0);
// Output `out` (float32) gets the shape held by the int64 input `in` (a Shape of some value).
void infer_shape_from_values(InferenceContext& ctx, size_t out, size_t in);

// ---- kernels ------------------------------------------------------------------------------------

// Where a kernel's outputs go: the session's memory plan places them in its arena.
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  virtual Tensor allocate(size_t output, DType dtype, Shape shape) = 0;
};

class KernelContext {
 public:
  // `allocator`: nullptr allocates every output as a fresh tensor.
  KernelContext(const Node& node, std::vector<const Tensor*> inputs, std::vector<Tensor*> outputs,
                ThreadPool& pool, OutputAllocator* allocator = nullptr)
      : node_(node),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)),
        pool_(pool),
        allocator_(allocator) {}

  const Node& node() const { return node_; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  bool has_input(size_t i) const {
    return i < inputs_.size() && inputs_[i] && inputs_[i]->defined();
  }
  const Tensor& input(size_t i) const;
  bool output_requested(size_t i) const { return i < outputs_.size() && outputs_[i]; }
  // Allocates output i (or a scratch tensor when the output is not requested). Where the kernel
  // definition declares (i, j) in place, output i may be placed over input j: the kernel must
  // give the same result when they share memory.
  Tensor& allocate_output(size_t i, DType dtype, Shape shape);
  // Sets output i to an existing tensor (a view or a constant).
  void set_output(size_t i, Tensor t);
  ThreadPool& pool() const { return pool_; }
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor*> outputs_;
  ThreadPool& pool_;
  OutputAllocator* allocator_;
  Tensor scratch_;
};

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual void compute(KernelContext& ctx) = 0;
};

using KernelFactory = std::function<std::unique_ptr<OpKernel>(const Node&)>;

// (output, input) pairs whose memory the kernel may share: each element of the output is written
// only after the input's element at the same index (and nothing after it) has been read, and the
// input has the output's shape. The memory planner uses a pair when the input dies at that node.
using InPlacePairs = std::vector<std::pair<size_t, size_t>>;
using InPlaceRule = std::function<InPlacePairs(const Node&)>;
// The rule of a kernel that allows the same pairs on every node.
InPlaceRule in_place(InPlacePairs pairs);

struct KernelDef {
  std::string domain;
  std::string op_type;
  std::vector<DType> dtypes;  // element types of input `type_input` this kernel handles
  KernelFactory factory;
  size_t type_input = 0;
  std::string device = "cpu";
  InPlaceRule inplace;  // empty: no output shares an input's memory
};

void register_kernel(KernelDef def);
// A kernel with per-node state: `factory` makes one for each node.
void register_stateful_kernel(const std::string& domain, const std::string& op_type,
                              std::vector<DType> dtypes, KernelFactory factory,
                              InPlaceRule inplace = nullptr);
// A kernel that needs no per-node state.
void register_kernel(const std::string& domain, const std::string& op_type,
                     std::vector<DType> dtypes, std::function<void(KernelContext&)> fn,
                     size_t type_input = 0, InPlaceRule inplace = nullptr);
// The kernel for (op, dtype of the type input, device), or nullptr.
const KernelDef* find_kernel(const std::string& domain, const std::string& op_type,
                             const std::string& device, DType dtype);
// Any kernel of the op on the device (to check that the op is supported at all), or nullptr.
const KernelDef* find_any_kernel(const std::string& domain, const std::string& op_type,
                                 const std::string& device);
// Every registered kernel's dtypes for an op on a device (for error messages).
std::vector<DType> kernel_dtypes(const std::string& domain, const std::string& op_type,
                                 const std::string& device);
std::vector<std::string> registered_ops(const std::string& device);

}  // namespace graphtrain
