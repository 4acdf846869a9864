// CPU kernels: ONNX Resize (modes nearest and linear, on the last two axes: torch's interpolate,
// nearest, nearest-exact, linear and bilinear) and its gradient ResizeGrad, which adds each
// output element's gradient into the input elements it was interpolated from.
//
// Source coordinates follow torch's arithmetic in float (upsample_*: area_pixel_compute_scale,
// guard_index_and_lambda, nearest_idx): the step is in/out for sizes and 1/scale for scales.
#include <cmath>

#include "kernels/cpu/common.h"

namespace graphtrain::cpu {
namespace {

// Per output index along one axis: the two source indices and the second one's weight (linear),
// or one source index (nearest: i1 == i0, w1 == 0).
struct AxisMap {
  std::vector<int64_t> i0, i1;
  std::vector<float> w1;
};

struct ResizePlan {
  Shape out;           // output dims
  int64_t planes = 1;  // product of the dims before the last two
  int64_t in_h = 1, in_w = 1, out_h = 1, out_w = 1;
  AxisMap h, w;
  bool linear = false;
};

float source_coordinate(const std::string& mode, int64_t o, int64_t in, int64_t out, float step,
                        float scale) {
  float x = static_cast<float>(o);
  if (mode == "asymmetric") return step * x;
  if (mode == "align_corners") return out > 1 ? x * (static_cast<float>(in - 1) / (out - 1)) : 0;
  if (mode == "pytorch_half_pixel") return out > 1 ? step * (x + 0.5f) - 0.5f : 0.0f;
  if (mode == "half_pixel_symmetric") {
    float adjustment = static_cast<float>(out) / (scale * static_cast<float>(in));
    float offset = static_cast<float>(in) * 0.5f * (1.0f - adjustment);
    return offset + step * (x + 0.5f) - 0.5f;
  }
  return step * (x + 0.5f) - 0.5f;  // half_pixel
}

AxisMap axis_map(const Node& node, bool linear, bool same, int64_t in, int64_t out, float step,
                 float scale) {
  std::string mode = node.attr_string("coordinate_transformation_mode", "half_pixel");
  std::string rounding = node.attr_string("nearest_mode", "round_prefer_floor");
  AxisMap m;
  m.i0.resize(static_cast<size_t>(out));
  m.i1.resize(static_cast<size_t>(out));
  m.w1.assign(static_cast<size_t>(out), 0.0f);
  for (int64_t o = 0; o < out; ++o) {
    size_t k = static_cast<size_t>(o);
    if (same) {  // torch and onnxruntime copy an input of the output's size, whatever the scale
      m.i0[k] = m.i1[k] = o;
      continue;
    }
    float x = source_coordinate(mode, o, in, out, step, scale);
    if (linear) {
      x = std::max(x, 0.0f);
      int64_t i = std::min(static_cast<int64_t>(std::floor(x)), in - 1);
      m.i0[k] = i;
      m.i1[k] = i + (i < in - 1 ? 1 : 0);
      m.w1[k] = std::min(std::max(x - static_cast<float>(i), 0.0f), 1.0f);
    } else {
      float r = rounding == "floor"               ? std::floor(x)
                : rounding == "ceil"              ? std::ceil(x)
                : rounding == "round_prefer_ceil" ? std::floor(x + 0.5f)
                                                  : std::ceil(x - 0.5f);  // round_prefer_floor
      m.i0[k] = m.i1[k] = std::min(std::max(static_cast<int64_t>(r), int64_t{0}), in - 1);
    }
  }
  return m;
}

// in: the input's dims; scales / sizes: the Resize inputs (either may be absent); out_dims: the
// output's dims when known (the gradient knows them from dY), else computed.
ResizePlan make_plan(const KernelContext& ctx, const Shape& in, const Tensor* scales,
                     const Tensor* sizes, const Shape* out_dims) {
  const Node& node = ctx.node();
  std::string mode = node.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear")
    ctx.fail("mode '" + mode + "' is not supported (nearest and linear are); torch's bicubic " +
             "interpolation runs through the ATen fallback");
  if (node.attr_int("antialias", 0) != 0)
    ctx.fail("antialias=1 is not supported; interpolate without antialias");
  std::string coords = node.attr_string("coordinate_transformation_mode", "half_pixel");
  if (coords == "tf_crop_and_resize")
    ctx.fail("coordinate_transformation_mode 'tf_crop_and_resize' is not supported");
  if (node.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
    ctx.fail("keep_aspect_ratio_policy other than 'stretch' is not supported");
  size_t rank = in.size();
  std::vector<int64_t> axes = node.attr_ints("axes");
  if (axes.empty())
    for (size_t i = 0; i < rank; ++i) axes.push_back(static_cast<int64_t>(i));
  for (int64_t& a : axes) {
    if (a < 0) a += static_cast<int64_t>(rank);
    if (a < 0 || a >= static_cast<int64_t>(rank))
      ctx.fail(str_cat("axis ", a, " is out of range for an input of rank ", rank));
  }
  size_t given = sizes    ? static_cast<size_t>(sizes->numel())
                 : scales ? static_cast<size_t>(scales->numel())
                          : 0;
  if (given != axes.size())
    ctx.fail(str_cat(sizes    ? "sizes"
                     : scales ? "scales"
                              : "scales or sizes",
                     " must have ", axes.size(), " elements (one per resized axis), got ", given));
  ResizePlan p;
  p.linear = mode == "linear";
  p.out = in;
  std::vector<float> step(rank, 1.0f), scale(rank, 1.0f);
  for (size_t k = 0; k < axes.size(); ++k) {
    size_t a = static_cast<size_t>(axes[k]);
    if (sizes) {
      p.out[a] = sizes->data<int64_t>()[k];
      step[a] = p.out[a] > 0 ? static_cast<float>(in[a]) / static_cast<float>(p.out[a]) : 0.0f;
      scale[a] = in[a] > 0 ? static_cast<float>(p.out[a]) / static_cast<float>(in[a]) : 1.0f;
    } else {
      float s = scales->data<float>()[k];
      if (!(s > 0.0f)) ctx.fail(str_cat("scales must be positive, got ", s, " for axis ", a));
      p.out[a] = static_cast<int64_t>(std::floor(static_cast<double>(in[a]) * s));
      step[a] = static_cast<float>(1.0 / static_cast<double>(s));
      scale[a] = s;
    }
  }
  if (out_dims) p.out = *out_dims;
  for (size_t a = 0; a + 2 < rank; ++a)
    if (p.out[a] != in[a])
      ctx.fail(str_cat("resizes axis ", a, " (", in[a], " -> ", p.out[a],
                       "); graphtrain resizes only the last two axes (torch's 1-D and 2-D "
                       "interpolation)"));
  for (size_t a = 0; a + 2 < rank; ++a) p.planes *= in[a];
  if (rank >= 2) {
    p.in_h = in[rank - 2];
    p.out_h = p.out[rank - 2];
  }
  if (rank >= 1) {
    p.in_w = in[rank - 1];
    p.out_w = p.out[rank - 1];
  }
  if ((p.in_h == 0 || p.in_w == 0) && p.out_h * p.out_w > 0)
    ctx.fail("cannot resize an empty input to a non-empty output");
  bool same = p.out == in;
  p.h = axis_map(node, p.linear, same, p.in_h, p.out_h, rank >= 2 ? step[rank - 2] : 1.0f,
                 rank >= 2 ? scale[rank - 2] : 1.0f);
  p.w = axis_map(node, p.linear, same, p.in_w, p.out_w, rank >= 1 ? step[rank - 1] : 1.0f,
                 rank >= 1 ? scale[rank - 1] : 1.0f);
  return p;
}

const Tensor* optional_input(const KernelContext& ctx, size_t i) {
  return ctx.has_input(i) && ctx.input(i).numel() > 0 ? &ctx.input(i) : nullptr;
}

// Resize(X, roi, scales, sizes) -> Y.
void resize(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  ResizePlan p = make_plan(ctx, x.shape(), optional_input(ctx, 2), optional_input(ctx, 3), nullptr);
  Tensor& y = ctx.allocate_output(0, F32, p.out);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  int64_t rows = p.planes * p.out_h;
  parallel_for(ctx, rows, p.out_w * 4, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t plane = r / p.out_h, oy = r % p.out_h;
      size_t ky = static_cast<size_t>(oy);
      const float* r0 = px + (plane * p.in_h + p.h.i0[ky]) * p.in_w;
      const float* r1 = px + (plane * p.in_h + p.h.i1[ky]) * p.in_w;
      float* out = py + r * p.out_w;
      const int64_t* i0 = p.w.i0.data();
      const int64_t* i1 = p.w.i1.data();
      const float* w1 = p.w.w1.data();
      if (!p.linear) {
        for (int64_t ox = 0; ox < p.out_w; ++ox) out[ox] = r0[i0[ox]];
        continue;
      }
      float h1 = p.h.w1[ky], h0 = 1.0f - h1;
      for (int64_t ox = 0; ox < p.out_w; ++ox) {
        float v1 = w1[ox], v0 = 1.0f - v1;
        out[ox] =
            h0 * (v0 * r0[i0[ox]] + v1 * r0[i1[ox]]) + h1 * (v0 * r1[i0[ox]] + v1 * r1[i1[ox]]);
      }
    }
  });
}

// ResizeGrad(dY, X's shape, scales, sizes) -> dX, with Resize's attributes.
void resize_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& shape = ctx.input(1);
  Shape in(shape.data<int64_t>(), shape.data<int64_t>() + shape.numel());
  ResizePlan p = make_plan(ctx, in, optional_input(ctx, 2), optional_input(ctx, 3), &dy.shape());
  Tensor& dx = ctx.allocate_output(0, F32, in);
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  // Each plane on its own: output rows of one plane add into shared input rows.
  parallel_for(ctx, p.planes, p.out_h * p.out_w * 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> acc(static_cast<size_t>(p.in_w));
    for (int64_t plane = lo; plane < hi; ++plane) {
      float* d = o + plane * p.in_h * p.in_w;
      std::fill(d, d + p.in_h * p.in_w, 0.0f);
      for (int64_t oy = 0; oy < p.out_h; ++oy) {
        const float* row = g + (plane * p.out_h + oy) * p.out_w;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t ox = 0; ox < p.out_w; ++ox) {  // along the row: into one input row
          size_t k = static_cast<size_t>(ox);
          float v1 = p.w.w1[k];
          acc[static_cast<size_t>(p.w.i0[k])] += (1.0f - v1) * row[ox];
          acc[static_cast<size_t>(p.w.i1[k])] += v1 * row[ox];
        }
        size_t ky = static_cast<size_t>(oy);
        float h1 = p.h.w1[ky], h0 = 1.0f - h1;
        float* d0 = d + p.h.i0[ky] * p.in_w;
        float* d1 = d + p.h.i1[ky] * p.in_w;
        for (int64_t ix = 0; ix < p.in_w; ++ix) d0[ix] += h0 * acc[static_cast<size_t>(ix)];
        if (h1 != 0.0f)
          for (int64_t ix = 0; ix < p.in_w; ++ix) d1[ix] += h1 * acc[static_cast<size_t>(ix)];
      }
    }
  });
}

const bool registered = [] {
  register_kernel("", "Resize", {F32}, resize);
  register_kernel(GT, "ResizeGrad", {F32}, resize_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
