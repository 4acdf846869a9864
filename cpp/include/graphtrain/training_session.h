// TrainingSession: trains an ONNX model from C++. The loss output's gradient graph is built by
// graphtrain's autodiff; parameters, gradients and optimizer state live in the session.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graphtrain/graph.h"
#include "graphtrain/session.h"
#include "graphtrain/tensor.h"

namespace graphtrain {

class ThreadPool;

struct OptimizerConfig {
  std::string kind = "adamw";  // "adamw" or "sgd", with PyTorch's update rules
  double lr = 1e-3;
  double weight_decay = 0.01;                     // AdamW: decoupled; SGD: added to the gradient
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double momentum = 0.0;                          // SGD
};

struct TrainingConfig {
  std::string loss;                    // the loss output; "" when the graph has exactly one output
  std::vector<std::string> trainable;  // initializers to train; empty: every float initializer
  OptimizerConfig optimizer;
  SessionOptions session;
};

class TrainingSession {
 public:
  TrainingSession(const std::string& onnx_path, TrainingConfig config);
  TrainingSession(Graph graph, TrainingConfig config);
  ~TrainingSession();
  TrainingSession(const TrainingSession&) = delete;
  TrainingSession& operator=(const TrainingSession&) = delete;

  // Forward and backward on one batch: returns the loss and adds the gradients to the
  // accumulated ones (call zero_grad() to clear them).
  float train_step(const std::map<std::string, Tensor>& inputs);
  // Forward only: the loss, no gradients.
  float eval_step(const std::map<std::string, Tensor>& inputs);
  void optimizer_step();
  void zero_grad();

  // Parameters, optimizer state and step count, written atomically as an ONNX file of
  // initializers (a crash mid-write leaves the previous checkpoint).
  void save_checkpoint(const std::string& path) const;
  // Throws ModelFileError naming what does not match this session's parameters.
  void load_checkpoint(const std::string& path);
  // The original model with the trained weights, as a plain ONNX model.
  void export_for_inference(const std::string& path) const;

  const std::vector<std::string>& data_inputs() const { return data_inputs_; }
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  const Tensor& parameter(const std::string& name) const;
  const Tensor& gradient(const std::string& name) const;
  int64_t optimizer_steps() const { return steps_; }
  const std::string& loss_name() const { return loss_; }
  // Values the forward graph stashes for the backward graph.
  const std::vector<std::string>& stashed() const { return stashed_; }
  void set_optimizer(OptimizerConfig config);

 private:
  std::vector<Tensor> feeds(const std::map<std::string, Tensor>& inputs,
                            const Session& session) const;
  float scalar_loss(const Tensor& t) const;
  ThreadPool& pool() const;

  Graph original_;
  TrainingConfig config_;
  std::string loss_;
  std::vector<std::string> data_inputs_;
  std::vector<std::string> param_names_;
  std::map<std::string, Tensor> params_, grads_, state_;
  std::map<std::string, Tensor> opt_m_, opt_v_;  // AdamW moments, or SGD momentum in opt_m_
  std::vector<std::pair<std::string, std::string>> state_updates_;  // forward output -> state
  std::vector<std::string> stashed_, grad_names_;
  std::unique_ptr<Session> forward_, backward_, eval_;
  int64_t steps_ = 0;
};

}  // namespace graphtrain
