// CPU kernels: LayerNormalization and BatchNormalization (inference and training mode).
#include <cmath>

#include "kernels/cpu/common.h"

namespace graphtrain::cpu {
namespace {

void layer_norm(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), rank);
  float eps = ctx.node().attr_float("epsilon", 1e-5f);
  int64_t cols = 1;
  for (int64_t i = axis; i < rank; ++i) cols *= x.dim(static_cast<size_t>(i));
  int64_t rows = cols ? x.numel() / cols : 0;
  if (scale.numel() != cols) ctx.fail(str_cat("Scale must have ", cols, " elements"));
  const float* bias = nullptr;
  if (ctx.has_input(2)) {
    if (ctx.input(2).numel() != cols) ctx.fail(str_cat("B must have ", cols, " elements"));
    bias = ctx.input(2).data<float>();
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  Shape stat_shape = x.shape();
  for (int64_t i = axis; i < rank; ++i) stat_shape[static_cast<size_t>(i)] = 1;
  float* mean_out = ctx.output_requested(1)
                        ? ctx.allocate_output(1, DType::kFloat32, stat_shape).data<float>()
                        : nullptr;
  float* inv_out = ctx.output_requested(2)
                       ? ctx.allocate_output(2, DType::kFloat32, stat_shape).data<float>()
                       : nullptr;
  const float* px = x.data<float>();
  const float* g = scale.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, rows, cols * 3, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = px + r * cols;
      float* yr = py + r * cols;
      float sum = 0;
      for (int64_t i = 0; i < cols; ++i) sum += xr[i];
      float mean = sum / static_cast<float>(cols);
      float sq = 0;
      for (int64_t i = 0; i < cols; ++i) {
        float d = xr[i] - mean;
        sq += d * d;
      }
      float inv = 1.0f / std::sqrt(sq / static_cast<float>(cols) + eps);
      if (bias)
        for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - mean) * inv * g[i] + bias[i];
      else
        for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - mean) * inv * g[i];
      if (mean_out) mean_out[r] = mean;
      if (inv_out) inv_out[r] = inv;
    }
  });
}

void batch_norm(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.fail("X must have rank 2 or more ([N, C, ...])");
  int64_t n = x.dim(0), c = x.dim(1);
  int64_t spatial = n * c != 0 ? x.numel() / (n * c) : 0;
  for (size_t i = 1; i < 5; ++i)
    if (ctx.input(i).numel() != c) ctx.fail(str_cat("input ", i, " must have ", c, " elements"));
  const float* scale = ctx.input(1).data<float>();
  const float* bias = ctx.input(2).data<float>();
  const float* in_mean = ctx.input(3).data<float>();
  const float* in_var = ctx.input(4).data<float>();
  float eps = ctx.node().attr_float("epsilon", 1e-5f);
  float momentum = ctx.node().attr_float("momentum", 0.9f);
  bool training = ctx.node().attr_int("training_mode", 0) != 0;
  // graphtrain::BatchNormalization follows PyTorch: always batch statistics, `momentum` weighs
  // the new statistics, and the running variance takes the unbiased batch variance.
  bool torch_style = ctx.node().domain == kGraphtrainDomain;
  if (torch_style) {
    training = true;
    momentum = 1.0f - momentum;
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  std::vector<float> mean(in_mean, in_mean + c), var(in_var, in_var + c);
  if (training) {
    int64_t count = n * spatial;
    ctx.pool().parallel_for(c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float* p = px + (i * c + ch) * spatial;
          for (int64_t k = 0; k < spatial; ++k) s += p[k];
        }
        double m = s / static_cast<double>(count), sq = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float* p = px + (i * c + ch) * spatial;
          for (int64_t k = 0; k < spatial; ++k) sq += (p[k] - m) * (p[k] - m);
        }
        mean[static_cast<size_t>(ch)] = static_cast<float>(m);
        var[static_cast<size_t>(ch)] = static_cast<float>(sq / static_cast<double>(count));
      }
    });
    if (ctx.output_requested(1)) {
      float* rm = ctx.allocate_output(1, DType::kFloat32, ctx.input(3).shape()).data<float>();
      for (int64_t ch = 0; ch < c; ++ch)
        rm[ch] = in_mean[ch] * momentum + mean[static_cast<size_t>(ch)] * (1 - momentum);
    }
    if (ctx.output_requested(2)) {
      float* rv = ctx.allocate_output(2, DType::kFloat32, ctx.input(4).shape()).data<float>();
      float unbias = torch_style && count > 1
                         ? static_cast<float>(count) / static_cast<float>(count - 1)
                         : 1.0f;
      for (int64_t ch = 0; ch < c; ++ch)
        rv[ch] = in_var[ch] * momentum + var[static_cast<size_t>(ch)] * unbias * (1 - momentum);
    }
  }
  parallel_for(ctx, n * c, spatial * 2, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t ch = r % c;
      float inv = 1.0f / std::sqrt(var[static_cast<size_t>(ch)] + eps);
      float a = scale[ch] * inv, b = bias[ch] - mean[static_cast<size_t>(ch)] * a;
      const float* p = px + r * spatial;
      float* q = py + r * spatial;
      for (int64_t k = 0; k < spatial; ++k) q[k] = p[k] * a + b;
    }
  });
}

const bool registered = [] {
  register_kernel("", "LayerNormalization", {DType::kFloat32}, layer_norm);
  register_kernel("", "BatchNormalization", {DType::kFloat32}, batch_norm);
  register_kernel(kGraphtrainDomain, "BatchNormalization", {DType::kFloat32}, batch_norm);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
