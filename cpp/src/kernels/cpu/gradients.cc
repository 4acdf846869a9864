// CPU kernels of the gradient ops in the graphtrain domain (emitted by the gradient rules).
#include <cmath>
#include <cstring>

#include "core/slicing.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

constexpr const char* GT = kGraphtrainDomain;
constexpr DType F32 = DType::kFloat32;

Shape shape_input(KernelContext& ctx, size_t i) {
  std::vector<int64_t> v = ctx.input(i).to_int64_vector();
  return Shape(v.begin(), v.end());
}

// Elementwise dX = f(dY, A) over same-shaped inputs.
template <typename F>
void binary_same(KernelContext& ctx, F f) {
  const Tensor& dy = ctx.input(0);
  const Tensor& a = ctx.input(1);
  if (dy.shape() != a.shape()) ctx.fail("inputs must have the same shape");
  Tensor& dx = ctx.allocate_output(0, F32, dy.shape());
  const float* g = dy.data<float>();
  const float* pa = a.data<float>();
  float* o = dx.data<float>();
  parallel_for(ctx, dy.numel(), 4, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) vec::store(o + i, f(vec::load(g + i), vec::load(pa + i)));
    for (; i < hi; ++i) o[i] = f(g[i], pa[i]);
  });
}

// SumToShape(grad, shape): sums grad over the axes that broadcasting added or stretched.
void sum_to_shape(KernelContext& ctx) {
  const Tensor& g = ctx.input(0);
  Shape target = shape_input(ctx, 1);
  if (g.shape() == target) {
    ctx.set_output(0, g);
    return;
  }
  size_t r = g.rank(), k = target.size();
  if (k > r) ctx.fail(str_cat("cannot reduce ", g.shape(), " to ", target));
  // Output index i of the target corresponds to axis i + (r - k) of g.
  Tensor& out = ctx.allocate_output(0, F32, target);
  std::memset(out.raw_data(), 0, out.nbytes());
  std::vector<int64_t> out_strides(r, 0);
  int64_t st = 1;
  for (size_t i = k; i-- > 0;) {
    int64_t gd = g.dim(i + r - k);
    if (target[i] != gd && target[i] != 1)
      ctx.fail(str_cat("cannot reduce ", g.shape(), " to ", target));
    out_strides[i + r - k] = target[i] == 1 ? 0 : st;
    st *= target[i];
  }
  const float* pg = g.data<float>();
  float* po = out.data<float>();
  int64_t n = g.numel();
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t e = 0; e < n; ++e) {
    po[off] += pg[e];
    for (size_t d = r; d-- > 0;) {
      off += out_strides[d];
      if (++idx[d] < g.dim(d)) break;
      off -= out_strides[d] * idx[d];
      idx[d] = 0;
    }
  }
}

// dY with the reduced axes restored, as a tensor of X's shape (divided by the count for a mean).
void reduce_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape xs = shape_input(ctx, 1);
  int64_t rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> axes =
      ctx.has_input(2) ? ctx.input(2).to_int64_vector() : std::vector<int64_t>{};
  bool noop = ctx.node().attr_int("noop_with_empty_axes", 0) != 0;
  bool mean = ctx.node().attr_int("mean", 0) != 0;
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  if (axes.empty() && noop) {
    std::memcpy(dx.raw_data(), dy.raw_data(), dx.nbytes());
    return;
  }
  std::vector<bool> reduced(xs.size(), axes.empty());
  for (int64_t a : axes) reduced[static_cast<size_t>(axis_of(ctx, a, rank))] = true;
  // dY viewed with keepdims: stride 0 on reduced axes.
  std::vector<int64_t> strides(xs.size(), 0);
  int64_t st = 1, count = 1;
  for (size_t i = xs.size(); i-- > 0;) {
    if (reduced[i]) {
      count *= xs[i];
      continue;
    }
    strides[i] = st;
    st *= xs[i];
  }
  if (st != dy.numel())
    ctx.fail(str_cat("gradient of ", dy.numel(), " elements does not match ", xs));
  float scale = mean && count ? 1.0f / static_cast<float>(count) : 1.0f;
  Tensor tmp = dy;
  copy_strided(ctx, tmp, xs, strides, 0, dx);
  if (scale != 1.0f) {
    float* p = dx.data<float>();
    for (int64_t i = 0; i < dx.numel(); ++i) p[i] *= scale;
  }
}

template <bool kLog>
void softmax_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& y = ctx.input(1);
  int64_t rank = static_cast<int64_t>(y.rank());
  Tensor& dx = ctx.allocate_output(0, F32, y.shape());
  if (y.numel() == 0) return;
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), rank);
  int64_t n = y.dim(static_cast<size_t>(axis)), inner = 1;
  for (int64_t i = axis + 1; i < rank; ++i) inner *= y.dim(static_cast<size_t>(i));
  const float* g = dy.data<float>();
  const float* py = y.data<float>();
  float* o = dx.data<float>();
  parallel_for(ctx, y.numel() / n, n * 4, [&](int64_t lo, int64_t hi) {
    for (int64_t l = lo; l < hi; ++l) {
      int64_t base = (l / inner) * n * inner + l % inner;
      float dot = 0;
      for (int64_t i = 0; i < n; ++i)
        dot += kLog ? g[base + i * inner] : g[base + i * inner] * py[base + i * inner];
      for (int64_t i = 0; i < n; ++i) {
        int64_t k = base + i * inner;
        o[k] = kLog ? g[k] - vec::exp(py[k]) * dot : py[k] * (g[k] - dot);
      }
    }
  });
}

void layer_norm_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& scale = ctx.input(2);
  const Tensor& mean = ctx.input(3);
  const Tensor& inv = ctx.input(4);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), rank);
  int64_t cols = 1;
  for (int64_t i = axis; i < rank; ++i) cols *= x.dim(static_cast<size_t>(i));
  int64_t rows = cols ? x.numel() / cols : 0;
  const float* g = dy.data<float>();
  const float* px = x.data<float>();
  const float* w = scale.data<float>();
  const float* pm = mean.data<float>();
  const float* pi = inv.data<float>();
  float* dx =
      ctx.output_requested(0) ? ctx.allocate_output(0, F32, x.shape()).data<float>() : nullptr;
  int threads = ctx.pool().num_threads();
  // Per-thread partial sums for dScale and dBias, added in thread order (deterministic).
  std::vector<std::vector<double>> dw(static_cast<size_t>(threads),
                                      std::vector<double>(static_cast<size_t>(cols), 0.0));
  std::vector<std::vector<double>> db = dw;
  int64_t chunk = (rows + threads - 1) / std::max(threads, 1);
  ctx.pool().parallel_for(threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      auto& dwt = dw[static_cast<size_t>(t)];
      auto& dbt = db[static_cast<size_t>(t)];
      for (int64_t r = t * chunk; r < std::min(rows, (t + 1) * chunk); ++r) {
        const float* gr = g + r * cols;
        const float* xr = px + r * cols;
        float mu = pm[r], iv = pi[r];
        float sum_d = 0, sum_dx = 0;
        for (int64_t i = 0; i < cols; ++i) {
          float xh = (xr[i] - mu) * iv;
          float d = gr[i] * w[i];
          sum_d += d;
          sum_dx += d * xh;
          dwt[static_cast<size_t>(i)] += gr[i] * xh;
          dbt[static_cast<size_t>(i)] += gr[i];
        }
        if (dx) {
          float inv_n = 1.0f / static_cast<float>(cols);
          for (int64_t i = 0; i < cols; ++i) {
            float xh = (xr[i] - mu) * iv;
            dx[r * cols + i] = iv * (gr[i] * w[i] - inv_n * (sum_d + xh * sum_dx));
          }
        }
      }
    }
  });
  for (size_t out = 1; out <= 2; ++out) {
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

void gather_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape data_shape = shape_input(ctx, 1);
  std::vector<int64_t> indices = ctx.input(2).to_int64_vector();
  int64_t rank = static_cast<int64_t>(data_shape.size());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  Tensor& dx = ctx.allocate_output(0, F32, data_shape);
  std::memset(dx.raw_data(), 0, dx.nbytes());
  int64_t outer = 1, inner = 1, n = data_shape[static_cast<size_t>(axis)];
  for (int64_t i = 0; i < axis; ++i) outer *= data_shape[static_cast<size_t>(i)];
  for (int64_t i = axis + 1; i < rank; ++i) inner *= data_shape[static_cast<size_t>(i)];
  int64_t k = static_cast<int64_t>(indices.size());
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  // Parallel over the inner dim blocks: each thread owns columns, so the scatter-add has no races
  // and every element sums its contributions in index order (deterministic).
  parallel_for(ctx, inner, outer * k, [&](int64_t c0, int64_t c1) {
    for (int64_t ob = 0; ob < outer; ++ob)
      for (int64_t j = 0; j < k; ++j) {
        int64_t idx = indices[static_cast<size_t>(j)];
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n) continue;
        const float* src = g + (ob * k + j) * inner;
        float* dst = o + (ob * n + idx) * inner;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
  });
}

void dropout_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& mask = ctx.input(1);
  float ratio = ctx.has_input(2) ? ctx.input(2).data<float>()[0] : 0.5f;
  bool training = ctx.has_input(3) && ctx.input(3).data<bool>()[0];
  if (!training || ratio == 0.0f) {
    ctx.set_output(0, dy);
    return;
  }
  float scale = ratio < 1.0f ? 1.0f / (1.0f - ratio) : 0.0f;
  Tensor& dx = ctx.allocate_output(0, F32, dy.shape());
  const float* g = dy.data<float>();
  const bool* m = mask.data<bool>();
  float* o = dx.data<float>();
  parallel_for(ctx, dy.numel(), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) o[i] = m[i] ? g[i] * scale : 0.0f;
  });
}

void sce_grad(KernelContext& ctx) {
  const Tensor& dloss = ctx.input(0);
  const Tensor& logp = ctx.input(1);
  std::vector<int64_t> labels = ctx.input(2).to_int64_vector();
  const float* w = ctx.has_input(3) ? ctx.input(3).data<float>() : nullptr;
  std::string reduction = ctx.node().attr_string("reduction", "mean");
  bool has_ignore = ctx.node().has_attr("ignore_index");
  int64_t ignore = ctx.node().attr_int("ignore_index", 0);
  int64_t n = logp.dim(0), c = logp.dim(1);
  int64_t spatial = n * c != 0 ? logp.numel() / (n * c) : 0;
  double weight_sum = 0;
  for (int64_t label : labels)
    if (!(has_ignore && label == ignore) && label >= 0 && label < c)
      weight_sum += w ? w[label] : 1.0;
  Tensor& dx = ctx.allocate_output(0, F32, logp.shape());
  const float* lp = logp.data<float>();
  const float* dl = dloss.data<float>();
  float* o = dx.data<float>();
  parallel_for(ctx, n * spatial, c * 2, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      int64_t i = item / spatial, s = item % spatial;
      int64_t label = labels[static_cast<size_t>(item)];
      bool skip = (has_ignore && label == ignore) || label < 0 || label >= c;
      float coef = 0;
      if (!skip) {
        float wl = w ? w[label] : 1.0f;
        if (reduction == "none")
          coef = wl * dl[item];
        else if (reduction == "sum")
          coef = wl * dl[0];
        else
          coef = static_cast<float>(wl * dl[0] / weight_sum);
      }
      if (spatial == 1) {  // contiguous classes: vectorized
        float* row = o + i * c;
        if (skip) {
          std::fill(row, row + c, 0.0f);
        } else {
          vec::map(lp + i * c, row, c, [coef](auto v) { return coef * vec::exp(v); });
          row[label] -= coef;
        }
        continue;
      }
      for (int64_t k = 0; k < c; ++k) {
        int64_t at = (i * c + k) * spatial + s;
        o[at] = skip ? 0.0f : coef * (vec::exp(lp[at]) - (k == label ? 1.0f : 0.0f));
      }
    }
  });
}

void max_pool_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  std::vector<int64_t> idx = ctx.input(1).to_int64_vector();
  Shape xs = shape_input(ctx, 2);
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  std::memset(dx.raw_data(), 0, dx.nbytes());
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  int64_t total = dx.numel();
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i] >= 0 && idx[i] < total) o[idx[i]] += g[i];
}

void global_average_pool_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape xs = shape_input(ctx, 1);
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  int64_t planes = xs[0] * xs[1];
  int64_t spatial = planes ? shape_numel(xs) / planes : 0;
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  for (int64_t p = 0; p < planes; ++p) {
    float v = g[p] / static_cast<float>(spatial);
    std::fill(o + p * spatial, o + (p + 1) * spatial, v);
  }
}

void slice_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape xs = shape_input(ctx, 1);
  std::vector<int64_t> starts = ctx.input(2).to_int64_vector(),
                       ends = ctx.input(3).to_int64_vector();
  std::vector<int64_t> axes, steps;
  if (ctx.has_input(4)) axes = ctx.input(4).to_int64_vector();
  if (ctx.has_input(5)) steps = ctx.input(5).to_int64_vector();
  int64_t rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> start(xs.size(), 0), step(xs.size(), 1);
  for (size_t k = 0; k < starts.size(); ++k) {
    int64_t a = axes.empty() ? static_cast<int64_t>(k) : axis_of(ctx, axes[k], rank);
    int64_t st = steps.empty() ? 1 : steps[k];
    start[static_cast<size_t>(a)] =
        slice_axis(xs[static_cast<size_t>(a)], starts[k], ends[k], st).start;
    step[static_cast<size_t>(a)] = st;
  }
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  std::memset(dx.raw_data(), 0, dx.nbytes());
  std::vector<int64_t> xstr = contiguous_strides(xs);
  int64_t base = 0;
  std::vector<int64_t> strides(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    base += start[i] * xstr[i];
    strides[i] = xstr[i] * step[i];
  }
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  std::vector<int64_t> idx(dy.rank(), 0);
  int64_t off = base;
  for (int64_t e = 0; e < dy.numel(); ++e) {
    o[off] = g[e];
    for (size_t d = dy.rank(); d-- > 0;) {
      off += strides[d];
      if (++idx[d] < dy.dim(d)) break;
      off -= strides[d] * idx[d];
      idx[d] = 0;
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
      if (training) {
        double s = 0, sq = 0;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < spatial; ++k) s += px[(i * c + ch) * spatial + k];
        mu = s / count;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < spatial; ++k) {
            double d = px[(i * c + ch) * spatial + k] - mu;
            sq += d * d;
          }
        var = sq / count;
      }
      double inv = 1.0 / std::sqrt(var + eps);
      double sum_g = 0, sum_gx = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < spatial; ++k) {
          int64_t at = (i * c + ch) * spatial + k;
          sum_g += g[at];
          sum_gx += g[at] * (px[at] - mu) * inv;
        }
      if (dscale) dscale[ch] = static_cast<float>(sum_gx);
      if (dbias) dbias[ch] = static_cast<float>(sum_g);
      if (!dx) continue;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < spatial; ++k) {
          int64_t at = (i * c + ch) * spatial + k;
          double v = g[at];
          if (training) {
            double xh = (px[at] - mu) * inv;
            v = v - sum_g / count - xh * sum_gx / count;
          }
          dx[at] = static_cast<float>(scale[ch] * inv * v);
        }
    }
  });
}

const bool registered = [] {
  register_kernel(GT, "SumToShape", {F32}, sum_to_shape);
  register_kernel(GT, "ReduceGrad", {F32}, reduce_grad);
  register_kernel(GT, "ReluGrad", {F32}, [](KernelContext& ctx) {
    binary_same(ctx, [](auto g, auto y) { return y > 0.0f ? g : decltype(g){}; });
  });
  register_kernel(GT, "SigmoidGrad", {F32}, [](KernelContext& ctx) {
    binary_same(ctx, [](auto g, auto y) { return g * y * (1.0f - y); });
  });
  register_kernel(GT, "TanhGrad", {F32}, [](KernelContext& ctx) {
    binary_same(ctx, [](auto g, auto y) { return g * (1.0f - y * y); });
  });
  register_kernel(GT, "LeakyReluGrad", {F32}, [](KernelContext& ctx) {
    float alpha = ctx.node().attr_float("alpha", 0.01f);
    binary_same(ctx, [alpha](auto g, auto x) { return x > 0.0f ? g : g * alpha; });
  });
  register_kernel(GT, "GeluGrad", {F32}, [](KernelContext& ctx) {
    if (ctx.node().attr_string("approximate", "none") == "tanh") {
      binary_same(ctx, [](auto g, auto x) {
        const float k = 0.79788456080286536f, c = 0.044715f;
        auto t = vec::tanh(k * (x + c * x * x * x));
        return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x));
      });
    } else {
      binary_same(ctx, [](auto g, auto x) {
        auto cdf = 0.5f * (1.0f + vec::erf(x * 0.70710678118654752f));
        auto pdf = vec::exp(-0.5f * x * x) * 0.39894228040143268f;
        return g * (cdf + x * pdf);
      });
    }
  });
  register_kernel(GT, "SoftmaxGrad", {F32}, softmax_grad<false>);
  register_kernel(GT, "LogSoftmaxGrad", {F32}, softmax_grad<true>);
  register_kernel(GT, "LayerNormalizationGrad", {F32}, layer_norm_grad);
  register_kernel(GT, "GatherGrad", {F32}, gather_grad);
  register_kernel(GT, "DropoutGrad", {F32}, dropout_grad);
  register_kernel(GT, "SoftmaxCrossEntropyLossGrad", {F32}, sce_grad);
  register_kernel(GT, "MaxPoolGrad", {F32}, max_pool_grad);
  register_kernel(GT, "GlobalAveragePoolGrad", {F32}, global_average_pool_grad);
  register_kernel(GT, "SliceGrad", {F32}, slice_grad);
  register_kernel(GT, "BatchNormalizationGrad", {F32}, batch_norm_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
