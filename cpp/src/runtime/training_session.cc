#include "graphtrain/training_session.h"

#include <cmath>
#include <cstring>
#include <set>
#include <unordered_set>

#include "graphtrain/autodiff.h"
#include "graphtrain/error.h"
#include "graphtrain/log.h"
#include "graphtrain/onnx_io.h"
#include "graphtrain/ops.h"
#include "graphtrain/optimizers.h"
#include "graphtrain/passes.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"

namespace graphtrain {
namespace {

const std::string kParam = "param/", kGrad = "grad/", kM = "optimizer.m/", kV = "optimizer.v/",
                  kState = "state/", kStep = "optimizer/step", kKind = "optimizer/kind";

void add_into(ThreadPool& pool, Tensor& acc, const Tensor& g) {
  float* a = acc.data<float>();
  const float* b = g.data<float>();
  pool.parallel_for(acc.numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] += b[i];
  });
}

Tensor bytes_tensor(const std::string& s) {
  Tensor t = Tensor::empty(DType::kUInt8, {static_cast<int64_t>(s.size())});
  if (!s.empty()) std::memcpy(t.raw_data(), s.data(), s.size());
  return t;
}

}  // namespace

TrainingSession::TrainingSession(const std::string& onnx_path, TrainingConfig config)
    : TrainingSession(load_onnx(onnx_path), std::move(config)) {}

TrainingSession::TrainingSession(Graph graph, TrainingConfig config)
    : original_(std::move(graph)), config_(std::move(config)) {
  set_optimizer(config_.optimizer);
  Graph g = clone_graph(original_);
  infer_shapes(g);
  // The loss.
  loss_ = config_.loss;
  if (loss_.empty()) {
    if (g.outputs().size() != 1)
      throw GraphError(str_cat("model '", g.name, "' has ", g.outputs().size(),
                               " outputs: name the loss output (TrainingConfig::loss / --loss)"));
    loss_ = g.outputs()[0]->name();
  }
  Value* loss = g.find(loss_);
  if (!loss) {
    std::string names;
    for (Value* v : g.outputs()) names += (names.empty() ? "" : ", ") + v->name();
    throw GraphError("model '" + g.name + "' has no value named '" + loss_ +
                     "' for the loss; its outputs are: " + names);
  }
  if (!is_floating(loss->type.dtype))
    throw GraphError("loss '" + loss_ + "' is " + to_string(loss->type.dtype) +
                     ", not a floating-point value");
  if (loss->type.shape) {
    SymDim n(1);
    for (const SymDim& d : *loss->type.shape) n = n * d;
    if (n.constant() != 1)
      throw GraphError("loss '" + loss_ + "' has shape " + sym_shape_to_string(*loss->type.shape) +
                       "; training needs a scalar loss (reduce it with a mean or a sum)");
  }
  // Parameters: the trainable initializers, promoted to graph inputs.
  std::vector<Value*> inits = g.initializers();
  if (config_.trainable.empty()) {
    for (Value* v : inits)
      if (v->initializer.dtype() == DType::kFloat32) config_.trainable.push_back(v->name());
  }
  std::set<std::string> trainable(config_.trainable.begin(), config_.trainable.end());
  // Batch-norm running statistics: state the forward graph updates, not trained.
  std::set<std::string> state_names;
  for (Node* n : g.nodes()) {
    if (n->op_type != "BatchNormalization" || n->attr_int("training_mode", 0) == 0) continue;
    for (size_t k = 1; k <= 2; ++k) {
      Value* in = n->input(2 + k);
      Value* out = n->output(k);
      if (in && out && in->is_initializer()) {
        state_names.insert(in->name());
        state_updates_.emplace_back(out->name(), in->name());
      }
    }
  }
  for (const auto& name : config_.trainable) {
    Value* v = g.find(name);
    if (!v || !v->is_initializer())
      throw GraphError("'" + name + "' is not an initializer of model '" + g.name +
                       "' and cannot be trained");
    if (v->initializer.dtype() != DType::kFloat32)
      throw GraphError("'" + name + "' is " + to_string(v->initializer.dtype()) +
                       "; only float32 parameters train");
    if (state_names.count(name)) continue;
    param_names_.push_back(name);
  }
  for (Value* v : g.inputs()) data_inputs_.push_back(v->name());
  for (const auto& name : param_names_) {
    Value* v = g.get(name);
    params_[name] = v->initializer.clone();
    grads_[name] = Tensor::zeros(DType::kFloat32, params_[name].shape());
    g.promote_to_input(v);
  }
  for (const auto& name : state_names) {
    Value* v = g.get(name);
    state_[name] = v->initializer.clone();
    g.promote_to_input(v);
  }
  optimize_graph(g, "captured", true);  // the passes that run before autodiff
  // The eval graph: forward only, loss out.
  {
    Graph e = clone_graph(g);
    e.set_outputs({e.get(loss_)});
    eliminate_dead_nodes(e);
    optimize_graph(e, "eval");
    eval_ = std::make_unique<Session>(std::move(e), config_.session);
  }
  // The training graphs: loss first, then the state updates.
  std::vector<Value*> outs = {loss};
  for (const auto& [out, st] : state_updates_) outs.push_back(g.get(out));
  g.set_outputs(outs);
  GradientGraphs gg = build_gradient_graphs(g, {{loss_}, true, param_names_});
  stashed_ = gg.stashed;
  grad_names_ = gg.grads;
  for (size_t i = 0; i < param_names_.size(); ++i)
    if (grad_names_[i].empty())
      GT_WARNING("parameter '", param_names_[i], "' does not affect the loss '", loss_,
                 "'; its gradient stays zero");
  optimize_graph(gg.forward, "forward");
  optimize_graph(gg.backward, "backward");
  forward_ = std::make_unique<Session>(std::move(gg.forward), config_.session);
  backward_ = std::make_unique<Session>(std::move(gg.backward), config_.session);
  GT_INFO("TrainingSession for '", original_.name, "': ", param_names_.size(),
          " parameter(s), loss '", loss_, "', ", stashed_.size(), " stashed value(s)");
}

TrainingSession::~TrainingSession() = default;

void TrainingSession::set_optimizer(OptimizerConfig config) {
  if (config.kind != "adamw" && config.kind != "sgd")
    throw OptionError("optimizer '" + config.kind + "' is not known; use adamw or sgd");
  if (!(config.lr > 0))
    throw OptionError(str_cat("learning rate must be positive, got ", config.lr));
  config_.optimizer = std::move(config);
}

std::vector<Tensor> TrainingSession::feeds(const std::map<std::string, Tensor>& inputs,
                                           const Session& session) const {
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const auto& d : data_inputs_) known |= d == name;
    if (!known) {
      std::string names;
      for (const auto& d : data_inputs_) names += (names.empty() ? "" : ", ") + d;
      throw InputError("model '" + original_.name + "' has no input named '" + name +
                       "'; its inputs are: " + names);
    }
  }
  std::vector<Tensor> out;
  for (const auto& name : session.input_names()) {
    auto p = params_.find(name);
    if (p != params_.end()) {
      out.push_back(p->second);
      continue;
    }
    auto s = state_.find(name);
    if (s != state_.end()) {
      out.push_back(s->second);
      continue;
    }
    auto it = inputs.find(name);
    if (it == inputs.end())
      throw InputError("input '" + name + "' of model '" + original_.name + "' was not given");
    out.push_back(it->second);
  }
  return out;
}

float TrainingSession::scalar_loss(const Tensor& t) const {
  if (t.numel() != 1)
    throw Error(
        str_cat("loss '", loss_, "' has shape ", t.shape(), "; training needs a scalar loss"));
  return t.data<float>()[0];
}

float TrainingSession::train_step(const std::map<std::string, Tensor>& inputs) {
  std::vector<Tensor> outs = forward_->run(feeds(inputs, *forward_));
  float loss = scalar_loss(outs[0]);
  for (size_t i = 0; i < state_updates_.size(); ++i)
    state_[state_updates_[i].second] = outs[1 + i].clone();
  std::vector<Tensor> stash(outs.begin() + 1 + static_cast<long>(state_updates_.size()),
                            outs.end());
  std::vector<Tensor> grads = backward_->run(stash);
  size_t k = 0;
  for (size_t i = 0; i < param_names_.size(); ++i) {
    if (grad_names_[i].empty()) continue;
    add_into(pool(), grads_[param_names_[i]], grads[k++]);
  }
  return loss;
}

float TrainingSession::eval_step(const std::map<std::string, Tensor>& inputs) {
  return scalar_loss(eval_->run(feeds(inputs, *eval_))[0]);
}

void TrainingSession::zero_grad() {
  for (auto& [name, g] : grads_) std::memset(g.raw_data(), 0, g.nbytes());
}

void TrainingSession::optimizer_step() {
  const OptimizerConfig& o = config_.optimizer;
  ++steps_;
  if (o.kind == "adamw") {
    std::vector<AdamWTensor> tensors;
    for (const auto& name : param_names_) {
      Tensor& p = params_[name];
      Tensor& m = opt_m_[name];
      Tensor& v = opt_v_[name];
      if (!m.defined()) {
        m = Tensor::zeros(DType::kFloat32, p.shape());
        v = Tensor::zeros(DType::kFloat32, p.shape());
      }
      tensors.push_back({p.data<float>(), grads_[name].data<float>(), m.data<float>(),
                         v.data<float>(), nullptr, p.numel(), static_cast<double>(steps_)});
    }
    adamw_step(pool(), tensors, {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
    return;
  }
  std::vector<SGDTensor> tensors;
  for (const auto& name : param_names_) {
    Tensor& p = params_[name];
    Tensor& buf = opt_m_[name];
    bool first = !buf.defined();
    if (o.momentum != 0 && first) buf = Tensor::zeros(DType::kFloat32, p.shape());
    tensors.push_back({p.data<float>(), grads_[name].data<float>(),
                       o.momentum != 0 ? buf.data<float>() : nullptr, p.numel(), first});
  }
  sgd_step(pool(), tensors, {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
}

ThreadPool& TrainingSession::pool() const {
  return config_.session.pool ? *config_.session.pool : ThreadPool::global();
}

const Tensor& TrainingSession::parameter(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) throw Error("no parameter named '" + name + "'");
  return it->second;
}

const Tensor& TrainingSession::gradient(const std::string& name) const {
  auto it = grads_.find(name);
  if (it == grads_.end()) throw Error("no parameter named '" + name + "'");
  return it->second;
}

void TrainingSession::save_checkpoint(const std::string& path) const {
  Graph ck;
  ck.name = "graphtrain_checkpoint";
  ck.opset_imports[""] = 18;
  for (const auto& [name, t] : params_) ck.add_initializer(kParam + name, t);
  for (const auto& [name, t] : state_) ck.add_initializer(kState + name, t);
  for (const auto& [name, t] : opt_m_) ck.add_initializer(kM + name, t);
  for (const auto& [name, t] : opt_v_) ck.add_initializer(kV + name, t);
  ck.add_initializer(kStep, Tensor::scalar_int64(steps_));
  ck.add_initializer(kKind, bytes_tensor(config_.optimizer.kind));
  save_onnx(ck, path);  // atomic: temporary file, fsync, rename
}

void TrainingSession::load_checkpoint(const std::string& path) {
  Graph ck = load_onnx(path);
  std::map<std::string, Tensor> found;
  for (Value* v : ck.initializers()) found[v->name()] = v->initializer;
  auto fail = [&](const std::string& what) {
    throw ModelFileError("checkpoint '" + path + "': " + what);
  };
  if (!found.count(kStep) || !found.count(kKind))
    fail("not a graphtrain checkpoint (no optimizer/step)");
  const Tensor& kind = found[kKind];
  std::string saved_kind(static_cast<const char*>(kind.raw_data()),
                         static_cast<size_t>(kind.numel()));
  if (saved_kind != config_.optimizer.kind)
    fail("it holds " + saved_kind + " state but this session uses " + config_.optimizer.kind);
  auto take = [&](const std::string& key, const Tensor& like, const std::string& what) {
    auto it = found.find(key);
    if (it == found.end()) fail(what + " is missing");
    if (it->second.shape() != like.shape() || it->second.dtype() != like.dtype())
      fail(what + " is " + it->second.describe() + ", the model has " + like.describe());
    return it->second.clone();
  };
  std::map<std::string, Tensor> params, state, m, v;
  for (const auto& [name, t] : params_)
    params[name] = take(kParam + name, t, "parameter '" + name + "'");
  for (const auto& [name, t] : state_) state[name] = take(kState + name, t, "state '" + name + "'");
  for (const auto& [key, t] : found) {
    if (key.rfind(kM, 0) == 0) {
      std::string name = key.substr(kM.size());
      if (!params_.count(name)) fail("optimizer state for unknown parameter '" + name + "'");
      m[name] = take(key, params_[name], "optimizer state of '" + name + "'");
    } else if (key.rfind(kV, 0) == 0) {
      std::string name = key.substr(kV.size());
      if (!params_.count(name)) fail("optimizer state for unknown parameter '" + name + "'");
      v[name] = take(key, params_[name], "optimizer state of '" + name + "'");
    }
  }
  params_ = std::move(params);
  state_ = std::move(state);
  opt_m_ = std::move(m);
  opt_v_ = std::move(v);
  steps_ = found[kStep].data<int64_t>()[0];
}

void TrainingSession::export_for_inference(const std::string& path) const {
  Graph g = clone_graph(original_);
  for (Value* v : g.initializers()) {
    auto p = params_.find(v->name());
    if (p != params_.end()) v->initializer = p->second.clone();
    auto s = state_.find(v->name());
    if (s != state_.end()) v->initializer = s->second.clone();
  }
  save_onnx(g, path);
}

}  // namespace graphtrain
