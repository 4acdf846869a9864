// Optimizer steps over many tensors at once, with PyTorch's update rules in PyTorch's order of
// operations, so a run matches torch.optim within float rounding. TrainingSession and
// graphtrain.optim (AdamW, SGD over torch's own tensors) both call these; the work of all tensors
// is split into chunks run on one thread pool.
#pragma once

#include <cstdint>
#include <vector>

namespace graphtrain {

class ThreadPool;

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  bool amsgrad = false;
  bool maximize = false;
};

struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;  // amsgrad only
  int64_t numel;
  double step;  // the step count after this step (1 on the first)
};

// torch.optim.AdamW's step: param *= 1 - lr wd; m = lerp(m, g, 1 - b1);
// v = v b2 + (1 - b2) g g; param += -lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void adamw_step(ThreadPool& pool, const std::vector<AdamWTensor>& tensors,
                const AdamWOptions& options);

struct SGDOptions {
  double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

struct SGDTensor {
  float* param;
  const float* grad;
  float* momentum_buffer;  // momentum != 0 only
  int64_t numel;
  bool first;  // the buffer is new: it starts as the (decayed) gradient
};

// torch.optim.SGD's step: d = g + wd p; buf = first ? d : buf momentum + (1 - dampening) d;
// d = nesterov ? d + momentum buf : buf; param += -lr d.
void sgd_step(ThreadPool& pool, const std::vector<SGDTensor>& tensors, const SGDOptions& options);

}  // namespace graphtrain
