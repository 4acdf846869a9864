#include <algorithm>
#include <list>
#include <map>
#include <mutex>

#include "graphtrain/error.h"
#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

struct Registry {
  std::mutex mutex;
  // (device, domain, op) -> kernels, each for some dtypes
  std::map<std::tuple<std::string, std::string, std::string>, std::list<KernelDef>>
      kernels;  // a list: pointers stay valid
};

Registry& registry() {
  static Registry r;
  return r;
}

class FunctionKernel : public OpKernel {
 public:
  explicit FunctionKernel(const std::function<void(KernelContext&)>& fn) : fn_(fn) {}
  void compute(KernelContext& ctx) override { fn_(ctx); }

 private:
  const std::function<void(KernelContext&)>& fn_;
};

}  // namespace

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i)) fail(str_cat("input ", i, " is required but absent"));
  return *inputs_[i];
}

Tensor& KernelContext::allocate_output(size_t i, DType dtype, Shape shape) {
  Tensor& slot = output_requested(i) ? *outputs_[i] : scratch_;
  slot = allocator_ ? allocator_->allocate(i, dtype, std::move(shape))
                    : Tensor::empty(dtype, std::move(shape));
  return slot;
}

void KernelContext::set_output(size_t i, Tensor t) {
  if (output_requested(i)) *outputs_[i] = std::move(t);
}

void KernelContext::fail(const std::string& message) const {
  std::string shapes;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    shapes += i ? ", " : "";
    shapes += has_input(i) ? inputs_[i]->describe() : "absent";
  }
  throw Error(node_.describe() + ": " + message + " (inputs: " + shapes + ")");
}

void register_kernel(KernelDef def) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string domain = def.domain == "ai.onnx" ? "" : def.domain;
  r.kernels[{def.device, domain, def.op_type}].push_back(std::move(def));
}

void register_stateful_kernel(const std::string& domain, const std::string& op_type,
                              std::vector<DType> dtypes, KernelFactory factory,
                              InPlaceRule inplace) {
  KernelDef def;
  def.domain = domain;
  def.op_type = op_type;
  def.dtypes = std::move(dtypes);
  def.factory = std::move(factory);
  def.inplace = std::move(inplace);
  register_kernel(std::move(def));
}

InPlaceRule in_place(InPlacePairs pairs) {
  return [pairs = std::move(pairs)](const Node&) { return pairs; };
}

void register_kernel(const std::string& domain, const std::string& op_type,
                     std::vector<DType> dtypes, std::function<void(KernelContext&)> fn,
                     size_t type_input, InPlaceRule inplace) {
  auto shared = std::make_shared<std::function<void(KernelContext&)>>(std::move(fn));
  KernelDef def;
  def.domain = domain;
  def.op_type = op_type;
  def.dtypes = std::move(dtypes);
  def.type_input = type_input;
  def.factory = [shared](const Node&) { return std::make_unique<FunctionKernel>(*shared); };
  def.inplace = std::move(inplace);
  register_kernel(std::move(def));
}

const KernelDef* find_kernel(const std::string& domain, const std::string& op_type,
                             const std::string& device, DType dtype) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.kernels.find({device, domain == "ai.onnx" ? "" : domain, op_type});
  if (it == r.kernels.end()) return nullptr;
  for (const KernelDef& def : it->second)
    if (def.dtypes.empty() ||
        std::find(def.dtypes.begin(), def.dtypes.end(), dtype) != def.dtypes.end())
      return &def;
  return nullptr;
}

const KernelDef* find_any_kernel(const std::string& domain, const std::string& op_type,
                                 const std::string& device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.kernels.find({device, domain == "ai.onnx" ? "" : domain, op_type});
  return it == r.kernels.end() || it->second.empty() ? nullptr : &it->second.front();
}

std::vector<DType> kernel_dtypes(const std::string& domain, const std::string& op_type,
                                 const std::string& device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<DType> out;
  auto it = r.kernels.find({device, domain == "ai.onnx" ? "" : domain, op_type});
  if (it != r.kernels.end())
    for (const KernelDef& def : it->second)
      out.insert(out.end(), def.dtypes.begin(), def.dtypes.end());
  return out;
}

std::vector<std::string> registered_ops(const std::string& device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [key, defs] : r.kernels)
    if (std::get<0>(key) == device)
      out.push_back(qualified_op_name(std::get<1>(key), std::get<2>(key)));
  return out;
}

}  // namespace graphtrain
