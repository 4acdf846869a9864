// CPU kernels: Conv (1-D and 2-D, strides, padding, dilation, groups) by im2col + GEMM, MaxPool,
// AveragePool and GlobalAveragePool, and their gradients.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"

namespace graphtrain::cpu {
namespace {

// A 2-D window geometry; 1-D inputs are handled as height 1.
struct Geometry {
  int64_t n, c, h, w;          // input
  int64_t kh, kw;              // kernel
  int64_t sh, sw, dh, dw;      // strides, dilations
  int64_t ph0, pw0, ph1, pw1;  // pads: begin, end
  int64_t oh, ow;              // output
};

Geometry geometry(KernelContext& ctx, const Shape& x, std::vector<int64_t> kernel, bool ceil_mode) {
  const Node& node = ctx.node();
  size_t spatial = x.size() - 2;
  if (spatial < 1 || spatial > 2)
    ctx.fail(str_cat("supports 1-D and 2-D windows, got an input of rank ", x.size()));
  auto ints = [&](const char* name, size_t count, int64_t def) {
    std::vector<int64_t> v = node.attr_ints(name, std::vector<int64_t>(count, def));
    if (v.size() != count) ctx.fail(str_cat("attribute ", name, " must have ", count, " values"));
    return v;
  };
  if (kernel.size() != spatial) ctx.fail(str_cat("kernel_shape must have ", spatial, " values"));
  std::vector<int64_t> strides = ints("strides", spatial, 1), dil = ints("dilations", spatial, 1);
  std::vector<int64_t> pads = ints("pads", 2 * spatial, 0);
  for (size_t i = 0; i < spatial; ++i)
    if (kernel[i] < 1 || strides[i] < 1 || dil[i] < 1 || pads[i] < 0 || pads[i + spatial] < 0)
      ctx.fail("kernel_shape, strides and dilations must be positive and pads not negative");
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  Shape in(x.begin() + 2, x.end());
  std::vector<int64_t> out(spatial);
  for (size_t i = 0; i < spatial; ++i) {
    int64_t eff = (kernel[i] - 1) * dil[i] + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out[i] = (in[i] + strides[i] - 1) / strides[i];
      int64_t total = std::max<int64_t>(0, (out[i] - 1) * strides[i] + eff - in[i]);
      int64_t small = total / 2;
      pads[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      pads[i + spatial] = total - pads[i];
    } else {
      if (auto_pad == "VALID")
        pads[i] = pads[i + spatial] = 0;
      else if (auto_pad != "NOTSET")
        ctx.fail("unknown auto_pad '" + auto_pad + "'");
      int64_t span = in[i] + pads[i] + pads[i + spatial] - eff;
      if (span < 0)
        ctx.fail(str_cat("the window (", eff, ") is larger than the padded input (", in[i], ")"));
      out[i] = (ceil_mode ? (span + strides[i] - 1) / strides[i] : span / strides[i]) + 1;
      if (ceil_mode && (out[i] - 1) * strides[i] >= in[i] + pads[i]) --out[i];
    }
  }
  Geometry g{};
  g.n = x[0];
  g.c = x[1];
  bool two = spatial == 2;
  g.h = two ? in[0] : 1;
  g.w = in.back();
  g.kh = two ? kernel[0] : 1;
  g.kw = kernel.back();
  g.sh = two ? strides[0] : 1;
  g.sw = strides.back();
  g.dh = two ? dil[0] : 1;
  g.dw = dil.back();
  g.ph0 = two ? pads[0] : 0;
  g.pw0 = pads[spatial - 1];
  g.ph1 = two ? pads[2] : 0;
  g.pw1 = pads[2 * spatial - 1];
  g.oh = two ? out[0] : 1;
  g.ow = out.back();
  return g;
}

Shape output_shape(const Shape& x, int64_t channels, const Geometry& g) {
  if (x.size() == 3) return {g.n, channels, g.ow};
  return {g.n, channels, g.oh, g.ow};
}

// col[(c*kh + i)*kw + j, oy*ow + ox] = x[c, oy*sh - ph + i*dh, ox*sw - pw + j*dw] (0 outside).
void im2col(const float* x, int64_t channels, const Geometry& g, float* col) {
  int64_t cols = g.oh * g.ow;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        float* dst = col + ((c * g.kh + i) * g.kw + j) * cols;
        const float* src = x + c * g.h * g.w;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          int64_t iy = oy * g.sh - g.ph0 + i * g.dh;
          float* row = dst + oy * g.ow;
          if (iy < 0 || iy >= g.h) {
            std::fill(row, row + g.ow, 0.0f);
            continue;
          }
          const float* srow = src + iy * g.w;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            int64_t ix = ox * g.sw - g.pw0 + j * g.dw;
            row[ox] = (ix >= 0 && ix < g.w) ? srow[ix] : 0.0f;
          }
        }
      }
}

void conv(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  if (x.rank() != w.rank() || x.rank() < 3) ctx.fail("X and W must have the same rank, 3 or 4");
  std::vector<int64_t> kernel = ctx.node().attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(w.shape().begin() + 2, w.shape().end());
  Geometry g = geometry(ctx, x.shape(), kernel, false);
  int64_t group = ctx.node().attr_int("group", 1);
  int64_t m = w.dim(0), cg = w.dim(1);
  if (group <= 0 || g.c != cg * group || m % group != 0)
    ctx.fail(str_cat("X has ", g.c, " channels, W ", w.shape(), ", group ", group,
                     ": channels must equal W.shape[1] * group"));
  Tensor& y = ctx.allocate_output(0, DType::kFloat32, output_shape(x.shape(), m, g));
  const float* bias = nullptr;
  if (ctx.has_input(2)) {
    if (ctx.input(2).numel() != m) ctx.fail(str_cat("B must have ", m, " elements"));
    bias = ctx.input(2).data<float>();
  }
  int64_t mg = m / group, kdim = cg * g.kh * g.kw, cols = g.oh * g.ow;
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* py = y.data<float>();
  bool pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph0 == 0 && g.pw0 == 0 &&
                   g.ph1 == 0 && g.pw1 == 0;
  auto run_image = [&](int64_t b, std::vector<float>& col, bool parallel_gemm) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const float* xin = px + (b * g.c + gi * cg) * g.h * g.w;
      const float* src = xin;
      if (!pointwise) {
        im2col(xin, cg, g, col.data());
        src = col.data();
      }
      float* yout = py + (b * m + gi * mg) * cols;
      if (parallel_gemm)
        sgemm(ctx, false, false, mg, cols, kdim, 1.0f, pw + gi * mg * kdim, kdim, src, cols, 0.0f,
              yout, cols);
      else
        sgemm_serial(false, false, mg, cols, kdim, 1.0f, pw + gi * mg * kdim, kdim, src, cols, 0.0f,
                     yout, cols);
      if (bias)
        for (int64_t o = 0; o < mg; ++o) {
          float bv = bias[gi * mg + o];
          float* row = yout + o * cols;
          for (int64_t k = 0; k < cols; ++k) row[k] += bv;
        }
    }
  };
  size_t col_size = pointwise ? 0 : static_cast<size_t>(kdim * cols);
  if (g.n >= ctx.pool().num_threads()) {
    ctx.pool().parallel_for(g.n, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> col(col_size);
      for (int64_t b = lo; b < hi; ++b) run_image(b, col, false);
    });
  } else {
    std::vector<float> col(col_size);
    for (int64_t b = 0; b < g.n; ++b) run_image(b, col, true);
  }
}

// The adjoint of im2col: x[c, iy, ix] += col[(c*kh + i)*kw + j, oy*ow + ox].
void col2im(const float* col, int64_t channels, const Geometry& g, float* x) {
  int64_t cols = g.oh * g.ow;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* src = col + ((c * g.kh + i) * g.kw + j) * cols;
        float* dst = x + c * g.h * g.w;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          int64_t iy = oy * g.sh - g.ph0 + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          const float* row = src + oy * g.ow;
          float* drow = dst + iy * g.w;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            int64_t ix = ox * g.sw - g.pw0 + j * g.dw;
            if (ix >= 0 && ix < g.w) drow[ix] += row[ox];
          }
        }
      }
}

// ConvGrad(dY, X, W) -> dX, dW, dB with Conv's attributes.
void conv_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& w = ctx.input(2);
  std::vector<int64_t> kernel = ctx.node().attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(w.shape().begin() + 2, w.shape().end());
  Geometry g = geometry(ctx, x.shape(), kernel, false);
  int64_t group = ctx.node().attr_int("group", 1);
  int64_t m = w.dim(0), cg = w.dim(1);
  if (group <= 0 || g.c != cg * group || m % group != 0) ctx.fail("X, W and group do not match");
  int64_t mg = m / group, kdim = cg * g.kh * g.kw, cols = g.oh * g.ow;
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* dx = nullptr;
  if (ctx.output_requested(0)) {
    Tensor& t = ctx.allocate_output(0, DType::kFloat32, x.shape());
    std::memset(t.raw_data(), 0, t.nbytes());
    dx = t.data<float>();
  }
  bool want_w = ctx.output_requested(1);
  int threads = ctx.pool().num_threads();
  int64_t per = (g.n + threads - 1) / std::max(threads, 1);
  std::vector<std::vector<float>> dw_parts(static_cast<size_t>(threads));
  ctx.pool().parallel_for(threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::vector<float> col(static_cast<size_t>(kdim * cols)),
          dcol(static_cast<size_t>(kdim * cols));
      auto& dw = dw_parts[static_cast<size_t>(t)];
      if (want_w) dw.assign(static_cast<size_t>(m * kdim), 0.0f);
      for (int64_t b = t * per; b < std::min(g.n, (t + 1) * per); ++b)
        for (int64_t gi = 0; gi < group; ++gi) {
          const float* dyg = pdy + (b * m + gi * mg) * cols;
          if (want_w) {
            im2col(px + (b * g.c + gi * cg) * g.h * g.w, cg, g, col.data());
            sgemm_serial(false, true, mg, kdim, cols, 1.0f, dyg, cols, col.data(), cols, 1.0f,
                         dw.data() + gi * mg * kdim, kdim);
          }
          if (dx) {
            sgemm_serial(true, false, kdim, cols, mg, 1.0f, pw + gi * mg * kdim, kdim, dyg, cols,
                         0.0f, dcol.data(), cols);
            col2im(dcol.data(), cg, g, dx + (b * g.c + gi * cg) * g.h * g.w);
          }
        }
    }
  });
  if (want_w) {
    float* dw = ctx.allocate_output(1, DType::kFloat32, w.shape()).data<float>();
    std::fill(dw, dw + m * kdim, 0.0f);
    for (auto& part : dw_parts)
      if (!part.empty())
        for (int64_t i = 0; i < m * kdim; ++i) dw[i] += part[static_cast<size_t>(i)];
  }
  if (ctx.output_requested(2)) {
    float* db = ctx.allocate_output(2, DType::kFloat32, {m}).data<float>();
    for (int64_t o = 0; o < m; ++o) {
      double s = 0;
      for (int64_t b = 0; b < g.n; ++b) {
        const float* row = pdy + (b * m + o) * cols;
        for (int64_t k = 0; k < cols; ++k) s += row[k];
      }
      db[o] = static_cast<float>(s);
    }
  }
}

void max_pool(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 3) ctx.fail("X must have rank 3 or 4");
  if (ctx.node().attr_int("storage_order", 0) != 0) ctx.fail("storage_order 1 is not supported");
  Geometry g = geometry(ctx, x.shape(),
                        ctx.node().attr(std::string("kernel_shape"), Attribute::Kind::kInts).ints,
                        ctx.node().attr_int("ceil_mode", 0) != 0);
  Shape out_shape = output_shape(x.shape(), g.c, g);
  Tensor& y = ctx.allocate_output(0, DType::kFloat32, out_shape);
  int64_t* idx = ctx.output_requested(1)
                     ? ctx.allocate_output(1, DType::kInt64, out_shape).data<int64_t>()
                     : nullptr;
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, g.n * g.c, g.oh * g.ow * g.kh * g.kw, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const float* src = px + p * g.h * g.w;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        // The window rows inside the input: i in [i0, i1).
        int64_t y0 = oy * g.sh - g.ph0;
        int64_t i0 = y0 >= 0 ? 0 : (-y0 + g.dh - 1) / g.dh;
        int64_t i1 = std::min(g.kh, (g.h - y0 + g.dh - 1) / g.dh);
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          int64_t x0 = ox * g.sw - g.pw0;
          int64_t j0 = x0 >= 0 ? 0 : (-x0 + g.dw - 1) / g.dw;
          int64_t j1 = std::min(g.kw, (g.w - x0 + g.dw - 1) / g.dw);
          float best = -std::numeric_limits<float>::infinity();
          int64_t arg = -1;
          for (int64_t i = i0; i < i1; ++i) {
            const float* row = src + (y0 + i * g.dh) * g.w + x0;
            for (int64_t j = j0; j < j1; ++j) {
              float v = row[j * g.dw];
              if (arg < 0 || v > best || (v != v && best == best)) {
                best = v;
                arg = (y0 + i * g.dh) * g.w + x0 + j * g.dw;
              }
            }
          }
          int64_t o = (p * g.oh + oy) * g.ow + ox;
          py[o] = best;
          if (idx) idx[o] = arg < 0 ? -1 : p * g.h * g.w + arg;
        }
      }
    }
  });
}

void average_pool(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 3) ctx.fail("X must have rank 3 or 4");
  Geometry g = geometry(ctx, x.shape(),
                        ctx.node().attr(std::string("kernel_shape"), Attribute::Kind::kInts).ints,
                        ctx.node().attr_int("ceil_mode", 0) != 0);
  bool include_pad = ctx.node().attr_int("count_include_pad", 0) != 0;
  Tensor& y = ctx.allocate_output(0, DType::kFloat32, output_shape(x.shape(), g.c, g));
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, g.n * g.c, g.oh * g.ow * g.kh * g.kw, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const float* src = px + p * g.h * g.w;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          float sum = 0;
          int64_t count = 0, padded = 0;
          for (int64_t i = 0; i < g.kh; ++i) {
            int64_t iy = oy * g.sh - g.ph0 + i * g.dh;
            for (int64_t j = 0; j < g.kw; ++j) {
              int64_t ix = ox * g.sw - g.pw0 + j * g.dw;
              // Positions in the explicit padding count with count_include_pad; positions past
              // it (ceil_mode overhang) never do.
              if (iy >= -g.ph0 && iy < g.h + g.ph1 && ix >= -g.pw0 && ix < g.w + g.pw1) ++padded;
              if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
              sum += src[iy * g.w + ix];
              ++count;
            }
          }
          int64_t div = include_pad ? padded : count;
          py[(p * g.oh + oy) * g.ow + ox] = div ? sum / static_cast<float>(div) : 0.0f;
        }
    }
  });
}

// AveragePoolGrad(dY, shape of X): each output's gradient spread evenly over its window.
void average_pool_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  std::vector<int64_t> xs = ctx.input(1).to_int64_vector();
  Shape xshape(xs.begin(), xs.end());
  Geometry g = geometry(ctx, xshape,
                        ctx.node().attr(std::string("kernel_shape"), Attribute::Kind::kInts).ints,
                        ctx.node().attr_int("ceil_mode", 0) != 0);
  bool include_pad = ctx.node().attr_int("count_include_pad", 0) != 0;
  Tensor& dx = ctx.allocate_output(0, DType::kFloat32, xshape);
  std::memset(dx.raw_data(), 0, dx.nbytes());
  const float* pg = dy.data<float>();
  float* po = dx.data<float>();
  parallel_for(ctx, g.n * g.c, g.oh * g.ow * g.kh * g.kw, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      float* dst = po + p * g.h * g.w;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          int64_t count = 0, padded = 0;
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j) {
              int64_t iy = oy * g.sh - g.ph0 + i * g.dh, ix = ox * g.sw - g.pw0 + j * g.dw;
              if (iy >= -g.ph0 && iy < g.h + g.ph1 && ix >= -g.pw0 && ix < g.w + g.pw1) ++padded;
              if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ++count;
            }
          int64_t div = include_pad ? padded : count;
          if (!div) continue;
          float v = pg[(p * g.oh + oy) * g.ow + ox] / static_cast<float>(div);
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j) {
              int64_t iy = oy * g.sh - g.ph0 + i * g.dh, ix = ox * g.sw - g.pw0 + j * g.dw;
              if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) dst[iy * g.w + ix] += v;
            }
        }
    }
  });
}

void global_average_pool(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 3) ctx.fail("X must have rank 3 or more");
  Shape out_shape = x.shape();
  int64_t spatial = 1;
  for (size_t i = 2; i < out_shape.size(); ++i) {
    spatial *= out_shape[i];
    out_shape[i] = 1;
  }
  Tensor& y = ctx.allocate_output(0, DType::kFloat32, out_shape);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, x.dim(0) * x.dim(1), spatial, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      double s = 0;
      for (int64_t k = 0; k < spatial; ++k) s += px[p * spatial + k];
      py[p] = static_cast<float>(s / static_cast<double>(spatial));
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

const bool registered = [] {
  register_kernel("", "Conv", {DType::kFloat32}, conv);
  register_kernel("", "MaxPool", {DType::kFloat32}, max_pool);
  register_kernel("", "AveragePool", {DType::kFloat32}, average_pool);
  register_kernel("", "GlobalAveragePool", {DType::kFloat32}, global_average_pool);
  register_kernel(kGraphtrainDomain, "ConvGrad", {DType::kFloat32}, conv_grad);
  register_kernel(kGraphtrainDomain, "AveragePoolGrad", {DType::kFloat32}, average_pool_grad);
  register_kernel(GT, "MaxPoolGrad", {F32}, max_pool_grad);
  register_kernel(GT, "GlobalAveragePoolGrad", {F32}, global_average_pool_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
