// CPU kernels: Conv (1-D and 2-D, strides, padding, dilation, groups) on graphtrain's direct
// kernels where it is depthwise (conv_depthwise.cc), on oneDNN's where it has one (conv_dnnl.cc),
// else by im2col + GEMM; MaxPool,
// AveragePool and GlobalAveragePool, and their gradients.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/conv_depthwise.h"
#include "kernels/cpu/conv_dnnl.h"
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

ConvShape conv_shape(const Geometry& g, int64_t m, int64_t group) {
  return {g.n,  g.c,  g.h,  g.w,   m,     group, g.kh,  g.kw, g.sh,
          g.sw, g.dh, g.dw, g.ph0, g.pw0, g.ph1, g.pw1, g.oh, g.ow};
}

Shape output_shape(const Shape& x, int64_t channels, const Geometry& g) {
  if (x.size() == 3) return {g.n, channels, g.ow};
  return {g.n, channels, g.oh, g.ow};
}

// The input planes of im2col and col2im are read through a zero-padded copy when the conv pads
// (the padding is part of the plane), so every (kernel tap, output position) reads inside it:
// taps[(i*kw + j)*oh*ow + oy*ow + ox] = (oy*sh + i*dh) * padded width + ox*sw + j*dw. Both are
// then flat branch-free loops over the table, whatever the feature map's size (a 2 x 2 map made
// the nested loops all overhead).
bool padded(const Geometry& g) {
  return g.ph0 || g.ph1 || g.pw0 || g.pw1;
}
int64_t padded_width(const Geometry& g) {
  return g.w + g.pw0 + g.pw1;
}
int64_t padded_plane_size(const Geometry& g) {
  return padded(g) ? (g.h + g.ph0 + g.ph1) * padded_width(g) : 0;
}

std::vector<int32_t> tap_offsets(const Geometry& g) {
  std::vector<int32_t> t(static_cast<size_t>(g.kh * g.kw * g.oh * g.ow));
  int64_t wp = padded_width(g);
  size_t k = 0;
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox)
          t[k++] = static_cast<int32_t>((oy * g.sh + i * g.dh) * wp + ox * g.sw + j * g.dw);
  return t;
}

// col[(c*kh + i)*kw + j, oy*ow + ox] = x[c, oy*sh - ph + i*dh, ox*sw - pw + j*dw] (0 outside);
// rows of col are `ld` apart (the columns of several images side by side). `plane` holds
// padded_plane_size(g) floats.
void im2col(const float* x, int64_t channels, const Geometry& g, const int32_t* taps, float* col,
            int64_t ld, float* plane) {
  int64_t n_taps = g.kh * g.kw, cols = g.oh * g.ow, wp = padded_width(g);
  bool pad = padded(g);
  if (pad) std::fill(plane, plane + padded_plane_size(g), 0.0f);
  for (int64_t c = 0; c < channels; ++c) {
    const float* src = x + c * g.h * g.w;
    if (pad) {
      for (int64_t y = 0; y < g.h; ++y)
        std::memcpy(plane + (y + g.ph0) * wp + g.pw0, src + y * g.w, g.w * sizeof(float));
      src = plane;  // its border stays zero: only the interior is written
    }
    for (int64_t t = 0; t < n_taps; ++t) {
      float* dst = col + (c * n_taps + t) * ld;
      const int32_t* at = taps + t * cols;
      for (int64_t p = 0; p < cols; ++p) dst[p] = src[at[p]];
    }
  }
}

// Convolutions run as GEMMs over chunks of images: the im2col columns of a chunk's images side by
// side, so a layer with small feature maps (4 columns per image at 2 x 2) still makes GEMMs of
// a useful width. A chunk aims at kChunkColumns columns, and its col matrix stays under
// kChunkBytes (it is reused while it is in the core's L2). Measured on hf-resnet's layers: the
// backward of its 2 x 2 maps 1.49 -> 1.08 ms; wider chunks lose on the larger maps.
constexpr int64_t kChunkColumns = 128;
constexpr int64_t kChunkBytes = 512 << 10;

// Images per chunk: enough for kChunkColumns, within kChunkBytes, and leaving a chunk per thread.
int64_t images_per_chunk(const Geometry& g, int64_t kdim, int threads) {
  int64_t cols = g.oh * g.ow;
  int64_t nb = std::max<int64_t>(1, kChunkColumns / std::max<int64_t>(cols, 1));
  nb = std::min(nb, std::max<int64_t>(1, kChunkBytes / (4 * kdim * std::max<int64_t>(cols, 1))));
  nb = std::max<int64_t>(1, std::min(nb, g.n / std::max(threads, 1)));
  int64_t chunks = (g.n + nb - 1) / nb;
  return (g.n + chunks - 1) / chunks;  // balanced: 32 images by at most 28 are 2 chunks of 16
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
  const ConvShape shape = conv_shape(g, m, group);
  if (runs_depthwise(shape)) {
    depthwise_conv_forward(ctx.pool(), shape, px, pw, bias, py);
    return;
  }
  if (dnnl_conv_forward(ctx.pool(), shape, px, pw, bias, py)) return;
  bool pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph0 == 0 && g.pw0 == 0 &&
                   g.ph1 == 0 && g.pw1 == 0;
  int threads = ctx.pool().num_threads();
  std::vector<int32_t> taps = pointwise ? std::vector<int32_t>{} : tap_offsets(g);
  // Images [b0, b0 + nb), one group: Y = W @ col. One image of a pointwise conv reads X itself;
  // a chunk of several writes its GEMM to `out` and spreads it over the images.
  auto run_chunk = [&](int64_t b0, int64_t nb, int64_t gi, std::vector<float>& col,
                       std::vector<float>& out, std::vector<float>& plane, bool parallel_gemm) {
    int64_t ld = nb * cols;
    const float* src = px + (b0 * g.c + gi * cg) * g.h * g.w;
    if (!pointwise || nb > 1) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* xin = px + ((b0 + b) * g.c + gi * cg) * g.h * g.w;
        if (pointwise)
          for (int64_t c = 0; c < cg; ++c)
            std::memcpy(col.data() + c * ld + b * cols, xin + c * cols, cols * sizeof(float));
        else
          im2col(xin, cg, g, taps.data(), col.data() + b * cols, ld, plane.data());
      }
      src = col.data();
    }
    float* dst = nb == 1 ? py + (b0 * m + gi * mg) * cols : out.data();
    if (parallel_gemm)
      sgemm(ctx, false, false, mg, ld, kdim, 1.0f, pw + gi * mg * kdim, kdim, src, ld, 0.0f, dst,
            ld);
    else
      sgemm_serial(false, false, mg, ld, kdim, 1.0f, pw + gi * mg * kdim, kdim, src, ld, 0.0f, dst,
                   ld);
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t o = 0; o < mg; ++o) {
        float* row = py + ((b0 + b) * m + gi * mg + o) * cols;
        if (nb > 1) std::memcpy(row, dst + o * ld + b * cols, cols * sizeof(float));
        if (bias) {
          float bv = bias[gi * mg + o];
          for (int64_t k = 0; k < cols; ++k) row[k] += bv;
        }
      }
  };
  if (g.n >= threads) {
    int64_t nb = images_per_chunk(g, kdim, threads);
    int64_t chunks = (g.n + nb - 1) / nb;
    ctx.pool().parallel_for(chunks, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> col(pointwise && nb == 1 ? 0 : static_cast<size_t>(kdim * nb * cols));
      std::vector<float> out(nb == 1 ? 0 : static_cast<size_t>(mg * nb * cols));
      std::vector<float> plane(static_cast<size_t>(padded_plane_size(g)));
      for (int64_t c = lo; c < hi; ++c)
        for (int64_t gi = 0; gi < group; ++gi) {
          int64_t b0 = c * nb;
          run_chunk(b0, std::min(nb, g.n - b0), gi, col, out, plane, false);
        }
    });
  } else {
    std::vector<float> col(pointwise ? 0 : static_cast<size_t>(kdim * cols)), out;
    std::vector<float> plane(static_cast<size_t>(padded_plane_size(g)));
    for (int64_t b = 0; b < g.n; ++b)
      for (int64_t gi = 0; gi < group; ++gi) run_chunk(b, 1, gi, col, out, plane, true);
  }
}

// The adjoint of im2col: x[c, iy, ix] += col[(c*kh + i)*kw + j, oy*ow + ox], rows `ld` apart.
void col2im(const float* col, int64_t channels, const Geometry& g, const int32_t* taps, float* x,
            int64_t ld, float* plane) {
  int64_t n_taps = g.kh * g.kw, cols = g.oh * g.ow, wp = padded_width(g);
  bool pad = padded(g);
  for (int64_t c = 0; c < channels; ++c) {
    float* dst = x + c * g.h * g.w;
    float* acc = dst;
    if (pad) {
      acc = plane;
      std::fill(plane, plane + padded_plane_size(g), 0.0f);
    }
    for (int64_t t = 0; t < n_taps; ++t) {
      const float* src = col + (c * n_taps + t) * ld;
      const int32_t* at = taps + t * cols;
      for (int64_t p = 0; p < cols; ++p) acc[at[p]] += src[p];
    }
    if (pad)
      for (int64_t y = 0; y < g.h; ++y) {
        const float* row = plane + (y + g.ph0) * wp + g.pw0;
        for (int64_t k = 0; k < g.w; ++k) dst[y * g.w + k] += row[k];
      }
  }
}

// ConvGrad by im2col + GEMM: per chunk of images and group, dY gathered as [mg, nb * cols] (as is
// for one image); dW += dY @ col^T; dcol = W^T @ dY spread back over the images' dX.
void im2col_conv_grad(KernelContext& ctx, const Geometry& g, int64_t m, int64_t group,
                      const float* pdy, const float* px, const float* pw, float* dx, float* dw) {
  int64_t cg = g.c / group, mg = m / group, kdim = cg * g.kh * g.kw, cols = g.oh * g.ow;
  bool want_w = dw != nullptr;
  if (dx) std::fill(dx, dx + g.n * g.c * g.h * g.w, 0.0f);
  int threads = ctx.pool().num_threads();
  std::vector<int32_t> taps = tap_offsets(g);
  int64_t nb = images_per_chunk(g, kdim, threads);
  int64_t chunks = (g.n + nb - 1) / nb;
  int parts = static_cast<int>(std::min<int64_t>(threads, chunks));
  std::vector<std::vector<float>> dw_parts(static_cast<size_t>(parts));
  ctx.pool().parallel_for(parts, 1, [&](int64_t t0, int64_t t1) {
    size_t col_size = static_cast<size_t>(kdim * nb * cols);
    std::vector<float> col(want_w ? col_size : 0), dcol(dx ? col_size : 0),
        dyc(nb == 1 ? 0 : static_cast<size_t>(mg * nb * cols)),
        plane(static_cast<size_t>(padded_plane_size(g)));
    for (int64_t t = t0; t < t1; ++t) {
      auto& part = dw_parts[static_cast<size_t>(t)];
      if (want_w) part.assign(static_cast<size_t>(m * kdim), 0.0f);
      for (int64_t c = t; c < chunks; c += parts) {
        int64_t b0 = c * nb, n = std::min(nb, g.n - b0), ld = n * cols;
        for (int64_t gi = 0; gi < group; ++gi) {
          const float* dyg = pdy + (b0 * m + gi * mg) * cols;
          if (n > 1) {
            for (int64_t b = 0; b < n; ++b)
              for (int64_t o = 0; o < mg; ++o)
                std::memcpy(dyc.data() + o * ld + b * cols,
                            pdy + ((b0 + b) * m + gi * mg + o) * cols, cols * sizeof(float));
            dyg = dyc.data();
          }
          if (want_w) {
            for (int64_t b = 0; b < n; ++b)
              im2col(px + ((b0 + b) * g.c + gi * cg) * g.h * g.w, cg, g, taps.data(),
                     col.data() + b * cols, ld, plane.data());
            sgemm_serial(false, true, mg, kdim, ld, 1.0f, dyg, ld, col.data(), ld, 1.0f,
                         part.data() + gi * mg * kdim, kdim);
          }
          if (dx) {
            sgemm_serial(true, false, kdim, ld, mg, 1.0f, pw + gi * mg * kdim, kdim, dyg, ld, 0.0f,
                         dcol.data(), ld);
            for (int64_t b = 0; b < n; ++b)
              col2im(dcol.data() + b * cols, cg, g, taps.data(),
                     dx + ((b0 + b) * g.c + gi * cg) * g.h * g.w, ld, plane.data());
          }
        }
      }
    }
  });
  if (want_w) {
    std::fill(dw, dw + m * kdim, 0.0f);
    for (auto& part : dw_parts)
      if (!part.empty())
        for (int64_t i = 0; i < m * kdim; ++i) dw[i] += part[static_cast<size_t>(i)];
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
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* dx = ctx.output_requested(0)
                  ? ctx.allocate_output(0, DType::kFloat32, x.shape()).data<float>()
                  : nullptr;
  float* dw = ctx.output_requested(1)
                  ? ctx.allocate_output(1, DType::kFloat32, w.shape()).data<float>()
                  : nullptr;
  const ConvShape shape = conv_shape(g, m, group);
  if (dx || dw) {
    if (runs_depthwise(shape))
      depthwise_conv_backward(ctx.pool(), shape, pdy, px, pw, dx, dw);
    else if (!dnnl_conv_backward(ctx.pool(), shape, pdy, px, pw, dx, dw))
      im2col_conv_grad(ctx, g, m, group, pdy, px, pw, dx, dw);
  }
  if (ctx.output_requested(2)) {
    int64_t cols = g.oh * g.ow;
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
  // The first tap inside the input of each output row's and column's window (i0, j0), or -1 when
  // a window has none (ceil_mode).
  auto first_inside = [](int64_t out, int64_t stride, int64_t pad, int64_t dil, int64_t k,
                         int64_t size) -> int64_t {
    int64_t start = out * stride - pad;
    int64_t first = start >= 0 ? 0 : (-start + dil - 1) / dil;
    return first < std::min(k, (size - start + dil - 1) / dil) ? first : -1;
  };
  std::vector<int64_t> i0(static_cast<size_t>(g.oh)), j0(static_cast<size_t>(g.ow));
  for (int64_t oy = 0; oy < g.oh; ++oy)
    i0[static_cast<size_t>(oy)] = first_inside(oy, g.sh, g.ph0, g.dh, g.kh, g.h);
  for (int64_t ox = 0; ox < g.ow; ++ox)
    j0[static_cast<size_t>(ox)] = first_inside(ox, g.sw, g.pw0, g.dw, g.kw, g.w);
  // Each plane is read through a copy padded with -inf out to every window's extent (the pads
  // and ceil_mode's overhang), so all taps are in bounds and padding never wins. Per output row
  // the taps run outer and the row's outputs inner: each output's running max is its own chain,
  // and a row's chains overlap (one output at a time took ~10 cycles per tap).
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Tap t = i * kw + j of a window lies i * dh rows and j * dw columns from its origin: its
  // offset in the input plane (no division per output).
  std::vector<int64_t> tap_offset(static_cast<size_t>(g.kh * g.kw));
  for (int64_t t = 0; t < g.kh * g.kw; ++t)
    tap_offset[static_cast<size_t>(t)] = t / g.kw * g.dh * g.w + t % g.kw * g.dw;
  int64_t hp = std::max(g.ph0 + g.h, (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1);
  int64_t wp = std::max(g.pw0 + g.w, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1);
  parallel_for(ctx, g.n * g.c, g.oh * g.ow * g.kh * g.kw, [&](int64_t lo, int64_t hi) {
    std::vector<float> plane(static_cast<size_t>(hp * wp), neg_inf), best(g.ow);
    std::vector<int32_t> tap(g.ow);
    for (int64_t p = lo; p < hi; ++p) {
      const float* src = px + p * g.h * g.w;
      for (int64_t y = 0; y < g.h; ++y)  // the border stays -inf
        std::memcpy(plane.data() + (y + g.ph0) * wp + g.pw0, src + y * g.w, g.w * sizeof(float));
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const float* base = plane.data() + oy * g.sh * wp;
        int64_t fi = i0[static_cast<size_t>(oy)];
        for (int64_t ox = 0; ox < g.ow; ++ox) {  // start from the window's first tap inside
          int64_t fj = j0[static_cast<size_t>(ox)];
          bool any = fi >= 0 && fj >= 0;
          best[ox] = any ? base[fi * g.dh * wp + ox * g.sw + fj * g.dw] : neg_inf;
          tap[ox] = any ? static_cast<int32_t>(fi * g.kw + fj) : -1;
        }
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const float* r = base + i * g.dh * wp + j * g.dw;
            int32_t t = static_cast<int32_t>(i * g.kw + j);
            for (int64_t ox = 0; ox < g.ow; ++ox) {  // the first NaN wins, else the first max
              float v = r[ox * g.sw], b = best[ox];
              bool take = (v > b) | ((v != v) & (b == b));
              best[ox] = take ? v : b;
              tap[ox] = take ? t : tap[ox];
            }
          }
        float* yrow = py + (p * g.oh + oy) * g.ow;
        std::copy(best.begin(), best.end(), yrow);
        if (idx) {
          int64_t* irow = idx + (p * g.oh + oy) * g.ow;
          // The input index of the row's first window origin (oy * sh - ph0, -pw0); output ox adds
          // ox * sw and its winning tap's offset.
          int64_t origin = p * g.h * g.w + (oy * g.sh - g.ph0) * g.w - g.pw0;
          for (int64_t ox = 0; ox < g.ow; ++ox)
            irow[ox] =
                tap[ox] < 0 ? -1 : origin + ox * g.sw + tap_offset[static_cast<size_t>(tap[ox])];
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
