// CPU kernels: Softmax, LogSoftmax and SoftmaxCrossEntropyLoss, and their gradients.
#include <cmath>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_dispatch.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

// exp(x - max) of n scores spaced `stride` apart into e (spaced `e_stride` apart; e may be x), and
// their sum; returns the max (0 for a line of -inf, whose sum is then 0: no inf - inf).
float exp_line(const float* x, int64_t n, int64_t stride, float* e, int64_t e_stride, float* sum) {
  float mx = -std::numeric_limits<float>::infinity();
  if (stride == 1) {
    mx = vec::max(x, n);
  } else {
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i * stride]);
  }
  if (std::isinf(mx) && mx < 0) mx = 0;
  if (stride == 1 && e_stride == 1) {
    *sum = vec_exp_sum(x, e, n, mx);
  } else {
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += e[i * e_stride] = vec::exp(x[i * stride] - mx);
    *sum = s;
  }
  return mx;
}

// Softmax or log-softmax of `n` values spaced `stride` apart.
template <bool kLog>
void softmax_line(const float* x, float* y, int64_t n, int64_t stride) {
  float sum = 0;
  // y holds exp(x - max) first (for log-softmax only as scratch).
  const float mx = exp_line(x, n, stride, y, stride, &sum);
  if (kLog) {
    float lse = std::log(sum) + mx;
    for (int64_t i = 0; i < n; ++i) y[i * stride] = x[i * stride] - lse;
  } else {
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) y[i * stride] *= inv;
  }
}

template <bool kLog>
void softmax(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t rank = static_cast<int64_t>(x.rank());
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  if (rank == 0) {
    y.data<float>()[0] = kLog ? 0.0f : 1.0f;
    return;
  }
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), rank);
  int64_t n = x.dim(static_cast<size_t>(axis)), inner = 1;
  for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dim(static_cast<size_t>(i));
  int64_t lines = x.numel() / n;
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, lines, n * 4, [&](int64_t lo, int64_t hi) {
    for (int64_t l = lo; l < hi; ++l) {
      int64_t o = l / inner, in = l % inner;
      int64_t base = o * n * inner + in;
      softmax_line<kLog>(px + base, py + base, n, inner);
    }
  });
}

// graphtrain::FusedSoftmax(X, [Mask]): softmax over the last axis of X * scale + Mask, Mask
// broadcast to X (fuse_softmax makes it from attention's scale, mask and softmax).
void fused_softmax(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() == 0) ctx.fail("X must have rank 1 or more");
  const float scale = ctx.node().attr_float("scale", 1.0f);
  const int64_t n = x.dim(x.rank() - 1);
  Tensor& y = ctx.allocate_output(0, F32, x.shape());
  if (x.numel() == 0) return;
  const Tensor* mask = ctx.has_input(1) ? &ctx.input(1) : nullptr;
  if (mask && mask->dtype() != F32) ctx.fail("Mask must be float32, got " + mask->describe());
  Broadcaster bc(ctx, {&x.shape(), mask ? &mask->shape() : &x.shape()});
  if (bc.out_shape() != x.shape())
    ctx.fail("Mask " + mask->describe() + " does not broadcast to X " + x.describe());
  const int64_t inner = bc.inner();  // a multiple of n: the last dim is never coalesced away
  const bool mask_runs = bc.inner_stride(1) == 1;
  const float* px = x.data<float>();
  const float* pm = mask ? mask->data<float>() : nullptr;
  float* py = y.data<float>();
  auto line = [&](const float* xr, float* yr, const float* mr) {
    vec_softmax_row(xr, mr, mask_runs, scale, yr, n);
  };
  parallel_for(ctx, x.numel() / n, n * 8, [&](int64_t lo, int64_t hi) {
    int64_t off[2] = {0, 0};
    for (int64_t l = lo; l < hi;) {
      // The lines of one broadcast row share its mask offset: computed once per row.
      int64_t at = l * n, row = at / inner, within = at % inner;
      if (pm) bc.offsets(row, off);
      for (; l < hi && within < inner; ++l, within += n) {
        const float* mr = pm ? pm + off[1] + (mask_runs ? within : 0) : nullptr;
        line(px + l * n, py + l * n, mr);
      }
    }
  });
}

// A cross-entropy's labels (attribute ignore_index, optional class weights w): which items are
// skipped (ignored, or a label outside [0, classes)) and the mean's divisor, the weights of the
// items that count.
struct Labels {
  std::vector<int64_t> values;
  const float* w = nullptr;
  bool has_ignore = false;
  int64_t ignore = 0, classes = 0;
  double weight_sum = 0;

  Labels(const KernelContext& ctx, const Tensor& labels, const float* weights, int64_t c)
      : values(labels.to_int64_vector()),
        w(weights),
        has_ignore(ctx.node().has_attr("ignore_index")),
        ignore(ctx.node().attr_int("ignore_index", 0)),
        classes(c) {
    for (int64_t label : values)
      if (!skipped(label)) weight_sum += w ? w[label] : 1.0;
  }
  bool skipped(int64_t label) const {
    return (has_ignore && label == ignore) || label < 0 || label >= classes;
  }
};

// SoftmaxCrossEntropyLoss (ONNX: outputs loss and log_prob), and graphtrain's (kUnitGrad:
// outputs loss and, when requested, the gradient of the scores for dloss = 1, written from the
// exponentials the loss computes anyway; fuse_loss_gradient makes it, for [N, C] scores and a
// mean or sum reduction).
template <bool kUnitGrad>
void softmax_cross_entropy(KernelContext& ctx) {
  const Tensor& scores = ctx.input(0);
  const Tensor& labels_t = ctx.input(1);
  if (scores.rank() < 2) ctx.fail("scores must have rank 2 or more ([N, C, ...])");
  int64_t n = scores.dim(0), c = scores.dim(1);
  int64_t spatial = n * c != 0 ? scores.numel() / (n * c) : 0;
  Shape item_shape = scores.shape();
  item_shape.erase(item_shape.begin() + 1);
  if (labels_t.shape() != item_shape)
    ctx.fail(str_cat("labels must have shape ", item_shape, " for scores ", scores.shape(),
                     ", got ", labels_t.shape()));
  const float* w = nullptr;
  if (ctx.has_input(2)) {
    const Tensor& wt = ctx.input(2);
    if (wt.rank() != 1 || wt.dim(0) != c) ctx.fail(str_cat("weights must have shape [", c, "]"));
    w = wt.data<float>();
  }
  const Labels lab(ctx, labels_t, w, c);
  const std::vector<int64_t>& labels = lab.values;
  const bool has_ignore = lab.has_ignore;
  const int64_t ignore = lab.ignore;
  const double weight_sum = lab.weight_sum;
  std::string reduction = ctx.node().attr_string("reduction", "mean");

  // The log-sum-exp of each item's scores; log_prob (scores - lse, in [N, C, spatial] layout) only
  // when something reads it: the gradient reads the scores (4 MB of a GPT's logits not written).
  // kUnitGrad: output 1 is the scores' gradient for dloss = 1, coef * (softmax - onehot), coef =
  // w[label] (/ weight_sum for the mean): each row's exponentials are written there and scaled.
  const float* ps = scores.data<float>();
  float* pl = ctx.output_requested(1)
                  ? ctx.allocate_output(1, DType::kFloat32, scores.shape()).data<float>()
                  : nullptr;
  if (kUnitGrad && (spatial != 1 || (reduction != "mean" && reduction != "sum")))
    ctx.fail("the gradient in the forward needs scores [N, C] and a mean or sum reduction");
  std::vector<float> lse(static_cast<size_t>(n * spatial));
  // Each item's score at its label, read before the row is written: the gradient may be written
  // over the scores (in place: graphtrain's kernel declares it, and the memory plan makes the
  // stashed gradient take over the logits' storage where they die here).
  std::vector<float> picked(static_cast<size_t>(n * spatial));
  parallel_for(ctx, n * spatial, c * 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> e(kUnitGrad && pl ? 0 : static_cast<size_t>(c));
    for (int64_t l = lo; l < hi; ++l) {
      int64_t i = l / spatial, s = l % spatial;
      int64_t base = i * c * spatial + s;
      const int64_t item_label = labels[static_cast<size_t>(l)];
      picked[static_cast<size_t>(l)] =
          lab.skipped(item_label) ? 0.0f : ps[base + item_label * spatial];
      if (kUnitGrad && pl) {  // spatial == 1: rows of c scores
        float coef = 0;
        if (!lab.skipped(item_label)) {
          double wl = w ? w[item_label] : 1.0;
          coef = static_cast<float>(reduction == "mean" ? wl / weight_sum : wl);
        }
        lse[static_cast<size_t>(l)] =
            vec_cross_entropy_row(ps + base, pl + base, c, coef != 0 ? item_label : 0, coef);
        continue;
      }
      float sum = 0;
      float mx = exp_line(ps + base, c, spatial, e.data(), 1, &sum);
      float v = lse[static_cast<size_t>(l)] = mx + std::log(sum);
      if (pl) {
        for (int64_t k = 0; k < c; ++k) pl[base + k * spatial] = ps[base + k * spatial] - v;
      }
    }
  });
  std::vector<float> loss(static_cast<size_t>(n * spatial));
  for (int64_t idx = 0; idx < n * spatial; ++idx) {
    int64_t label = labels[static_cast<size_t>(idx)];
    if (has_ignore && label == ignore) {
      loss[static_cast<size_t>(idx)] = 0;
      continue;
    }
    if (label < 0 || label >= c)
      ctx.fail(str_cat("label ", label, " at position ", idx, " is outside [0, ", c, ")"));
    float wl = w ? w[label] : 1.0f;
    loss[static_cast<size_t>(idx)] =
        -wl * (picked[static_cast<size_t>(idx)] - lse[static_cast<size_t>(idx)]);
  }
  if (reduction == "none") {
    Tensor& out = ctx.allocate_output(0, DType::kFloat32, item_shape);
    std::copy(loss.begin(), loss.end(), out.data<float>());
    return;
  }
  double total = 0;
  for (float v : loss) total += v;
  Tensor& out = ctx.allocate_output(0, DType::kFloat32, {});
  if (reduction == "sum")
    out.data<float>()[0] = static_cast<float>(total);
  else if (reduction == "mean")
    out.data<float>()[0] = static_cast<float>(total / weight_sum);
  else
    ctx.fail("reduction must be none, sum or mean, not '" + reduction + "'");
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
  // scale: the gradient of a scale before the softmax, folded in by fuse_softmax.
  const float scale = ctx.node().attr_float("scale", 1.0f);
  parallel_for(ctx, y.numel() / n, n * 4, [&](int64_t lo, int64_t hi) {
    for (int64_t l = lo; l < hi; ++l) {
      int64_t base = (l / inner) * n * inner + l % inner;
      if (!kLog && inner == 1) {  // the last axis: whole vectors
        vec_softmax_grad_row(g + base, py + base, scale, o + base, n);
        continue;
      }
      float dot = 0;
      for (int64_t i = 0; i < n; ++i)
        dot += kLog ? g[base + i * inner] : g[base + i * inner] * py[base + i * inner];
      for (int64_t i = 0; i < n; ++i) {
        int64_t k = base + i * inner;
        o[k] = scale * (kLog ? g[k] - vec::exp(py[k]) * dot : py[k] * (g[k] - dot));
      }
    }
  });
}

// SoftmaxCrossEntropyLossGrad(dloss, log_prob or scores (from_scores=1), labels, weights?): the
// gradient of the scores, coef * (softmax - onehot(label)). With unit=1: (dloss, the gradient for
// dloss = 1 that graphtrain::SoftmaxCrossEntropyLoss wrote), scaled by the scalar dloss: that
// gradient itself, no copy, when dloss is 1 (loss.backward() of the loss).
void sce_grad(KernelContext& ctx) {
  const Tensor& dloss = ctx.input(0);
  if (ctx.node().attr_int("unit", 0) != 0) {
    const Tensor& unit = ctx.input(1);
    if (dloss.numel() != 1 || dloss.dtype() != F32)
      ctx.fail("dloss must be a float32 scalar (a mean or sum reduction), got " + dloss.describe());
    const float d = dloss.data<float>()[0];
    if (d == 1.0f) return ctx.set_output(0, unit);
    Tensor& dx = ctx.allocate_output(0, F32, unit.shape());
    const float* u = unit.data<float>();
    float* o = dx.data<float>();
    parallel_for(ctx, unit.numel(), 1, [&](int64_t lo, int64_t hi) {
      vec::map(u + lo, o + lo, hi - lo, [d](auto x) { return x * d; });
    });
    return;
  }
  const Tensor& logp = ctx.input(1);
  const bool from_scores = ctx.node().attr_int("from_scores", 0) != 0;
  const float* w = ctx.has_input(3) ? ctx.input(3).data<float>() : nullptr;
  std::string reduction = ctx.node().attr_string("reduction", "mean");
  int64_t n = logp.dim(0), c = logp.dim(1);
  int64_t spatial = n * c != 0 ? logp.numel() / (n * c) : 0;
  const Labels lab(ctx, ctx.input(2), w, c);
  const std::vector<int64_t>& labels = lab.values;
  const double weight_sum = lab.weight_sum;
  Tensor& dx = ctx.allocate_output(0, F32, logp.shape());
  const float* lp = logp.data<float>();
  const float* dl = dloss.data<float>();
  float* o = dx.data<float>();
  parallel_for(ctx, n * spatial, c * 2, [&](int64_t lo, int64_t hi) {
    std::vector<float> e(from_scores && spatial != 1 ? static_cast<size_t>(c) : 0);
    for (int64_t item = lo; item < hi; ++item) {
      int64_t i = item / spatial, s = item % spatial;
      int64_t label = labels[static_cast<size_t>(item)];
      bool skip = lab.skipped(label);
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
        } else if (from_scores) {  // exp(x - max) into the row, then scaled by coef / sum
          float sum = 0;
          exp_line(lp + i * c, c, 1, row, 1, &sum);
          const float k = coef / sum;
          vec::map(row, row, c, [k](auto x) { return x * k; });
          row[label] -= coef;
        } else {
          vec_exp_sum(lp + i * c, row, c, 0.0f, coef);  // coef * exp(log_prob)
          row[label] -= coef;
        }
        continue;
      }
      float inv = 0;  // softmax = e[k] * inv, from the scores
      if (from_scores && !skip) {
        float sum = 0;
        exp_line(lp + i * c * spatial + s, c, spatial, e.data(), 1, &sum);
        inv = 1.0f / sum;
      }
      for (int64_t k = 0; k < c; ++k) {
        int64_t at = (i * c + k) * spatial + s;
        float p = from_scores ? e[static_cast<size_t>(k)] * inv : vec::exp(lp[at]);
        o[at] = skip ? 0.0f : coef * (p - (k == label ? 1.0f : 0.0f));
      }
    }
  });
}

const bool registered = [] {
  register_kernel("", "Softmax", {DType::kFloat32}, softmax<false>);
  register_kernel(GT, "FusedSoftmax", {F32}, fused_softmax, 0, in_place({{0, 0}}));
  register_kernel("", "LogSoftmax", {DType::kFloat32}, softmax<true>);
  register_kernel("", "SoftmaxCrossEntropyLoss", {DType::kFloat32}, softmax_cross_entropy<false>);
  register_kernel(GT, "SoftmaxCrossEntropyLoss", {F32}, softmax_cross_entropy<true>, 0,
                  in_place({{1, 0}}));  // the gradient over the scores
  register_kernel(GT, "SoftmaxGrad", {F32}, softmax_grad<false>);
  register_kernel(GT, "LogSoftmaxGrad", {F32}, softmax_grad<true>);
  register_kernel(GT, "SoftmaxCrossEntropyLossGrad", {F32}, sce_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
