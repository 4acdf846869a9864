#include <map>
#include <mutex>
#include <set>

#include "graphtrain/error.h"
#include "graphtrain/log.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::pair<std::string, std::string>, ShapeInferer> inferers;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string key_domain(const std::string& d) {
  return d == "ai.onnx" ? "" : d;
}

}  // namespace

const TensorType& InferenceContext::input_type(size_t i) const {
  const Value* v = node_.input(i);
  if (!v) fail("input " + std::to_string(i) + " is required but absent");
  return v->type;
}

const SymShape* InferenceContext::input_shape(size_t i) const {
  const Value* v = node_.input(i);
  return v && v->type.shape ? &*v->type.shape : nullptr;
}

const Tensor* InferenceContext::input_constant(size_t i) const {
  return constant_value(node_.input(i));
}

const std::vector<SymDim>* InferenceContext::input_values(size_t i) const {
  const Value* v = node_.input(i);
  if (!v) return nullptr;
  if (v->sym_value) return &*v->sym_value;
  const Tensor* t = constant_value(v);
  if (t && (t->dtype() == DType::kInt64 || t->dtype() == DType::kInt32) && t->rank() <= 1 &&
      t->numel() <= 64) {
    auto values = std::make_unique<std::vector<SymDim>>();
    for (int64_t x : t->to_int64_vector()) values->emplace_back(x);
    scratch_.push_back(std::move(values));
    return scratch_.back().get();
  }
  return nullptr;
}

void InferenceContext::set_output(size_t i, DType dtype, std::optional<SymShape> shape) {
  Value* v = node_.output(i);
  if (!v) return;
  v->type.dtype = dtype;
  v->type.shape = std::move(shape);
}

void InferenceContext::set_output_values(size_t i, std::vector<SymDim> values) {
  Value* v = node_.output(i);
  if (v) v->sym_value = std::move(values);
}

void InferenceContext::fail(const std::string& message) const {
  throw GraphError("shape inference, " + node_.describe() + ": " + message);
}

void register_shape_inferer(const std::string& domain, const std::string& op_type,
                            ShapeInferer fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.inferers[{key_domain(domain), op_type}] = std::move(fn);
}

const ShapeInferer* find_shape_inferer(const std::string& domain, const std::string& op_type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.inferers.find({key_domain(domain), op_type});
  return it == r.inferers.end() ? nullptr : &it->second;
}

std::vector<std::string> ops_with_shape_inferer() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [key, fn] : r.inferers) out.push_back(qualified_op_name(key.first, key.second));
  return out;
}

void infer_shapes(Graph& graph) {
  std::set<std::string> unknown_reported;
  for (Node* node : graph.topological_order()) {
    const ShapeInferer* fn = find_shape_inferer(node->domain, node->op_type);
    if (!fn) {
      if (unknown_reported.insert(node->qualified_op()).second)
        GT_DEVINFO("shape inference: no inferer for op ", node->qualified_op(), " (first at ",
                   node->describe(), "); its outputs get unknown shapes");
      for (Value* out : node->outputs())
        if (out) out->type.shape.reset();
      continue;
    }
    InferenceContext ctx(*node, graph);
    (*fn)(ctx);
  }
}

SymShape broadcast_shapes(const InferenceContext& ctx, const SymShape& a, const SymShape& b) {
  size_t rank = std::max(a.size(), b.size());
  SymShape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const SymDim* da = i < rank - a.size() ? nullptr : &a[i - (rank - a.size())];
    const SymDim* db = i < rank - b.size() ? nullptr : &b[i - (rank - b.size())];
    if (!da) {
      out[i] = *db;
      continue;
    }
    if (!db) {
      out[i] = *da;
      continue;
    }
    auto ca = da->constant(), cb = db->constant();
    if (*da == *db)
      out[i] = *da;
    else if (ca && *ca == 1)
      out[i] = *db;
    else if (cb && *cb == 1)
      out[i] = *da;
    else if (ca && cb)
      ctx.fail("cannot broadcast shapes " + sym_shape_to_string(a) + " and " +
               sym_shape_to_string(b));
    else if (ca)
      out[i] = *da;  // the symbolic side must be 1 or equal to the constant
    else if (cb)
      out[i] = *db;
    else
      out[i] = SymDim::fresh("bcast");
  }
  return out;
}

int64_t normalize_axis(const InferenceContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    ctx.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

void infer_like_input(InferenceContext& ctx, size_t out, size_t in) {
  if (!ctx.has_input(in)) return ctx.set_output(out, DType::kFloat32, std::nullopt);
  const SymShape* s = ctx.input_shape(in);
  ctx.set_output(out, ctx.input_dtype(in), s ? std::optional<SymShape>(*s) : std::nullopt);
}

void infer_shape_from_values(InferenceContext& ctx, size_t out, size_t in) {
  const auto* v = ctx.input_values(in);
  ctx.set_output(out, DType::kFloat32,
                 v ? std::optional<SymShape>(SymShape(v->begin(), v->end())) : std::nullopt);
}

}  // namespace graphtrain
