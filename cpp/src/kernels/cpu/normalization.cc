// CPU kernels: LayerNormalization and BatchNormalization (inference and training mode) and their
// gradients.
#include <cmath>
#include <tuple>

#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_dispatch.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

// LayerNormalization(X, Scale, [B]) over the dims from `axis` on, with outputs (Y, Mean,
// InvStdDev); and graphtrain::AddLayerNormalization(A, R, Scale, [B], [Bias]), the residual add
// fused in (fuse_layer_norm): X = A + R (+ Bias over the last dims) is output 3, written in the
// same pass over each row. graphtrain::RMSNormalization(X, Scale) -> (Y, InvStdDev) and
// graphtrain::AddRMSNormalization(A, R, Scale, [Bias]) -> (Y, InvStdDev, X) are the same with the
// mean taken as 0 and no B: Y = X / sqrt(mean(X^2) + eps) * Scale.
template <bool kAdd, bool rms>
void layer_norm(KernelContext& ctx) {
  const size_t k = kAdd ? 1 : 0;  // inputs after X (or A, R) start here
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(k + 1);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), rank);
  float eps = ctx.node().attr_float("epsilon", 1e-5f);
  int64_t cols = 1;
  for (int64_t i = axis; i < rank; ++i) cols *= x.dim(static_cast<size_t>(i));
  int64_t rows = cols ? x.numel() / cols : 0;
  if (scale.numel() != cols) ctx.fail(str_cat("Scale must have ", cols, " elements"));
  const float* bias = nullptr;
  if (!rms && ctx.has_input(k + 2)) {
    if (ctx.input(k + 2).numel() != cols) ctx.fail(str_cat("B must have ", cols, " elements"));
    bias = ctx.input(k + 2).data<float>();
  }
  // Outputs: (Y, Mean, InvStdDev, Sum), or (Y, InvStdDev, Sum) for RMSNormalization.
  const size_t mean_at = rms ? 0 : 1, inv_at = rms ? 1 : 2, sum_at = rms ? 2 : 3;
  const float* pr = nullptr;   // the residual R
  const float* pab = nullptr;  // the bias added to A
  float* ps = nullptr;         // the sum
  if (kAdd) {
    if (ctx.input(1).shape() != x.shape())
      ctx.fail("A and R must have the same shape, got " + ctx.input(1).describe());
    pr = ctx.input(1).data<float>();
    const size_t bias_at = rms ? 3 : 4;
    if (ctx.has_input(bias_at)) {
      if (ctx.input(bias_at).numel() != cols)
        ctx.fail(str_cat("Bias must have ", cols, " elements"));
      pab = ctx.input(bias_at).data<float>();
    }
    ps = ctx.allocate_output(sum_at, F32, x.shape()).data<float>();
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  Shape stat_shape = x.shape();
  for (int64_t i = axis; i < rank; ++i) stat_shape[static_cast<size_t>(i)] = 1;
  float* mean_out = mean_at && ctx.output_requested(mean_at)
                        ? ctx.allocate_output(mean_at, DType::kFloat32, stat_shape).data<float>()
                        : nullptr;
  float* inv_out = ctx.output_requested(inv_at)
                       ? ctx.allocate_output(inv_at, DType::kFloat32, stat_shape).data<float>()
                       : nullptr;
  const float* px = x.data<float>();
  const float* g = scale.data<float>();
  float* py = y.data<float>();
  LayerNormRows in_registers{px, pr, pab, ps, g, bias, eps, py, mean_out, inv_out, cols, rms};
  parallel_for(ctx, rows, cols * (kAdd ? 4 : 3), [&](int64_t lo, int64_t hi) {
    if (vec_layer_norm_rows(in_registers, lo, hi)) return;
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = px + r * cols;
      float* yr = py + r * cols;
      if (kAdd) {  // the sum first, then normalized like any X
        float* sr = ps + r * cols;
        const float* rr = pr + r * cols;
        int64_t i = 0;
        for (; i + 8 <= cols; i += 8) {
          vec::f8 v = vec::load(xr + i) + vec::load(rr + i);
          vec::store(sr + i, pab ? v + vec::load(pab + i) : v);
        }
        for (; i < cols; ++i) sr[i] = pab ? xr[i] + rr[i] + pab[i] : xr[i] + rr[i];
        xr = sr;
      }
      float mean = rms ? 0.0f : vec::sum(xr, cols) / static_cast<float>(cols);
      float sq = vec::sum_sq_centered(xr, cols, mean);
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

// A per-channel sum over the [N, C, spatial] layout: `part(offset, length)` gives the float sum of
// one run of at most kBlock elements (8 lanes wide), and the runs add up in double, so a channel
// of millions of elements keeps its precision.
template <typename Part>
double channel_sum(int64_t n, int64_t c, int64_t spatial, int64_t ch, Part part) {
  constexpr int64_t kBlock = 4096;
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < spatial; b += kBlock)
      s += part((i * c + ch) * spatial + b, std::min(kBlock, spatial - b));
  return s;
}

// Batch mean and (biased) variance of channel ch.
std::pair<double, double> channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial,
                                          int64_t ch) {
  double count = static_cast<double>(n * spatial);
  double mean = channel_sum(n, c, spatial, ch,
                            [&](int64_t at, int64_t len) { return vec::sum(x + at, len); }) /
                count;
  float m = static_cast<float>(mean);
  double var =
      channel_sum(n, c, spatial, ch,
                  [&](int64_t at, int64_t len) { return vec::sum_sq_centered(x + at, len, m); }) /
      count;
  return {mean, var};
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
        auto [m, v] = channel_moments(px, n, c, spatial, ch);
        mean[static_cast<size_t>(ch)] = static_cast<float>(m);
        var[static_cast<size_t>(ch)] = static_cast<float>(v);
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

// LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev, [R]) -> (dX, dScale, dB), and
// RMSNormalizationGrad(dY, X, Scale, InvStdDev, [R]) -> (dX, dScale): R a gradient added to dX.
template <bool rms>
void layer_norm_grad(KernelContext& ctx) {
  const size_t inv_at = rms ? 3 : 4, res_at = rms ? 4 : 5;
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& scale = ctx.input(2);
  const Tensor& inv = ctx.input(inv_at);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), rank);
  int64_t cols = 1;
  for (int64_t i = axis; i < rank; ++i) cols *= x.dim(static_cast<size_t>(i));
  int64_t rows = cols ? x.numel() / cols : 0;
  const float* g = dy.data<float>();
  const float* px = x.data<float>();
  const float* w = scale.data<float>();
  const float* pm = rms ? nullptr : ctx.input(3).data<float>();
  const float* pi = inv.data<float>();
  // R (fuse_layer_norm): a gradient added to dX, the residual's.
  const float* acc = nullptr;
  if (ctx.has_input(res_at)) {
    if (ctx.input(res_at).shape() != x.shape())
      ctx.fail("the gradient to add must have X's shape, got " + ctx.input(res_at).describe());
    acc = ctx.input(res_at).data<float>();
  }
  float* dx =
      ctx.output_requested(0) ? ctx.allocate_output(0, F32, x.shape()).data<float>() : nullptr;
  int threads = ctx.pool().num_threads();
  // Per-thread partial sums for dScale and dBias, added in thread order (deterministic).
  std::vector<std::vector<double>> dw(static_cast<size_t>(threads),
                                      std::vector<double>(static_cast<size_t>(cols), 0.0));
  std::vector<std::vector<double>> db = dw;
  int64_t chunk = (rows + threads - 1) / std::max(threads, 1);
  // dScale and dBias gather in float over blocks of kBlock rows, 8 lanes at a time, and each
  // block's sums into the thread's doubles.
  constexpr int64_t kBlock = 32;
  const float inv_n = 1.0f / static_cast<float>(cols);
  ctx.pool().parallel_for(threads, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> bw(static_cast<size_t>(cols)), bb(static_cast<size_t>(cols));
    for (int64_t t = t0; t < t1; ++t) {
      auto& dwt = dw[static_cast<size_t>(t)];
      auto& dbt = db[static_cast<size_t>(t)];
      const int64_t end = std::min(rows, (t + 1) * chunk);
      for (int64_t r0 = t * chunk; r0 < end; r0 += kBlock) {
        std::fill(bw.begin(), bw.end(), 0.0f);
        std::fill(bb.begin(), bb.end(), 0.0f);
        const int64_t r1 = std::min(end, r0 + kBlock);
        LayerNormGradRows in_registers{g, px, w, pm, pi, acc, dx, bw.data(), bb.data(), cols, rms};
        if (!vec_layer_norm_grad_rows(in_registers, r0, r1))
          for (int64_t r = r0; r < r1; ++r) {
            const float* gr = g + r * cols;
            const float* xr = px + r * cols;
            const float mu = rms ? 0.0f : pm[r], iv = pi[r];
            const vec::f8 mu8 = vec::splat(mu), iv8 = vec::splat(iv);
            // sum of d = dy * scale and of d * xhat; dScale += dy * xhat, dBias += dy
            vec::f8 acc_d{}, acc_dx{};
            int64_t i = 0;
            for (; i + 8 <= cols; i += 8) {
              vec::f8 gi = vec::load(gr + i), xh = (vec::load(xr + i) - mu8) * iv8;
              vec::f8 d = gi * vec::load(w + i);
              acc_d += d;
              acc_dx += d * xh;
              vec::store(bw.data() + i, vec::load(bw.data() + i) + gi * xh);
              vec::store(bb.data() + i, vec::load(bb.data() + i) + gi);
            }
            float sum_d = vec::lane_sum(acc_d), sum_dx = vec::lane_sum(acc_dx);
            for (; i < cols; ++i) {
              float xh = (xr[i] - mu) * iv, d = gr[i] * w[i];
              sum_d += d;
              sum_dx += d * xh;
              bw[static_cast<size_t>(i)] += gr[i] * xh;
              bb[static_cast<size_t>(i)] += gr[i];
            }
            if (!dx) continue;
            float* dr = dx + r * cols;
            const float* ar = acc ? acc + r * cols : nullptr;
            const vec::f8 a8 = vec::splat(rms ? 0.0f : inv_n * sum_d),
                          b8 = vec::splat(inv_n * sum_dx);
            for (i = 0; i + 8 <= cols; i += 8) {
              vec::f8 xh = (vec::load(xr + i) - mu8) * iv8;
              vec::f8 d = iv8 * (vec::load(gr + i) * vec::load(w + i) - (a8 + xh * b8));
              vec::store(dr + i, ar ? d + vec::load(ar + i) : d);
            }
            for (; i < cols; ++i) {
              float xh = (xr[i] - mu) * iv;
              float d =
                  iv * (gr[i] * w[i] - ((rms ? 0.0f : inv_n * sum_d) + xh * (inv_n * sum_dx)));
              dr[i] = ar ? d + ar[i] : d;
            }
          }
        for (int64_t q = 0; q < cols; ++q) {
          dwt[static_cast<size_t>(q)] += bw[static_cast<size_t>(q)];
          dbt[static_cast<size_t>(q)] += bb[static_cast<size_t>(q)];
        }
      }
    }
  });
  for (size_t out = 1; out <= (rms ? 1u : 2u); ++out) {
    if (!ctx.output_requested(out)) continue;
    float* p = ctx.allocate_output(out, F32, scale.shape()).data<float>();
    auto& parts = out == 1 ? dw : db;
    for (int64_t i = 0; i < cols; ++i) {
      double s = 0;
      for (auto& part : parts) s += part[static_cast<size_t>(i)];
      p[i] = static_cast<float>(s);
    }
  }
}

void batch_norm_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const float* scale = ctx.input(2).data<float>();
  const float* run_mean = ctx.input(3).data<float>();
  const float* run_var = ctx.input(4).data<float>();
  float eps = ctx.node().attr_float("epsilon", 1e-5f);
  bool training = ctx.node().attr_int("training_mode", 0) != 0;
  int64_t n = x.dim(0), c = x.dim(1);
  int64_t spatial = n * c != 0 ? x.numel() / (n * c) : 0;
  double count = static_cast<double>(n * spatial);
  const float* g = dy.data<float>();
  const float* px = x.data<float>();
  float* dx =
      ctx.output_requested(0) ? ctx.allocate_output(0, F32, x.shape()).data<float>() : nullptr;
  float* dscale = ctx.output_requested(1)
                      ? ctx.allocate_output(1, F32, ctx.input(2).shape()).data<float>()
                      : nullptr;
  float* dbias = ctx.output_requested(2)
                     ? ctx.allocate_output(2, F32, ctx.input(2).shape()).data<float>()
                     : nullptr;
  ctx.pool().parallel_for(c, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double mu = run_mean[ch], var = run_var[ch];
      if (training) std::tie(mu, var) = channel_moments(px, n, c, spatial, ch);
      double inv = 1.0 / std::sqrt(var + eps);
      float m = static_cast<float>(mu);
      double sum_g = channel_sum(n, c, spatial, ch,
                                 [&](int64_t at, int64_t len) { return vec::sum(g + at, len); });
      double sum_gx = inv * channel_sum(n, c, spatial, ch, [&](int64_t at, int64_t len) {
                        return vec::dot_centered(g + at, px + at, len, m);
                      });
      if (dscale) dscale[ch] = static_cast<float>(sum_gx);
      if (dbias) dbias[ch] = static_cast<float>(sum_g);
      if (!dx) continue;
      // dx = scale * inv * (g - [sum_g + xhat * sum_gx] / count in training), as a*g + b*x + k.
      double a = scale[ch] * inv, b = 0, k = 0;
      if (training) {
        b = -a * inv * sum_gx / count;
        k = -a * sum_g / count - b * mu;
      }
      float fa = static_cast<float>(a), fb = static_cast<float>(b), fk = static_cast<float>(k);
      for (int64_t i = 0; i < n; ++i) {
        int64_t at = (i * c + ch) * spatial;
        for (int64_t q = 0; q < spatial; ++q) dx[at + q] = fa * g[at + q] + fb * px[at + q] + fk;
      }
    }
  });
}

const bool registered = [] {
  register_kernel("", "LayerNormalization", {DType::kFloat32}, layer_norm<false, false>);
  register_kernel(GT, "AddLayerNormalization", {F32}, layer_norm<true, false>);
  register_kernel("", "BatchNormalization", {DType::kFloat32}, batch_norm);
  register_kernel(kGraphtrainDomain, "BatchNormalization", {DType::kFloat32}, batch_norm);
  // dX is written row by row after the row of dY (and of the added gradient) has been read.
  register_kernel(GT, "LayerNormalizationGrad", {F32}, layer_norm_grad<false>, 0,
                  in_place({{0, 0}, {0, 5}}));
  // ONNX's RMSNormalization (opset 23: Y only, stash_type float) is graphtrain's, whose InvStdDev
  // output a gradient adds to the node.
  for (const char* domain : {"", GT})
    register_kernel(domain, "RMSNormalization", {F32}, layer_norm<false, true>);
  register_kernel(GT, "AddRMSNormalization", {F32}, layer_norm<true, true>);
  register_kernel(GT, "RMSNormalizationGrad", {F32}, layer_norm_grad<true>, 0,
                  in_place({{0, 0}, {0, 4}}));
  register_kernel(GT, "BatchNormalizationGrad", {F32}, batch_norm_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
