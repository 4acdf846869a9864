// Depthwise convolution by direct loops (conv_depthwise.h), one NCHW plane at a time.
//
// Each input plane is read through a padded, phased copy (Phased): zero-padded where the
// convolution pads, and split by column phase for a column stride s, so that the taps of output
// columns ox, ox + 1, ... read consecutive floats at any stride or dilation: padded (r, c) is at
// (c % s) * rows * cols + r * cols + c / s. A tap (i, j) then reads at offset(i dh, j dw) + oy sh
// cols + ox, and every loop below runs over 8 output columns a vector:
//
//   forward       Y[oy, ox] = B + sum over taps of W[t] Xp[oy sh cols + offset(t) + ox]
//   dX, stride 1  the same correlation of dY, padded by the kernel's extent, with W flipped
//   dX, strides   dXp[oy sh cols + offset(t) + ox] += W[t] dY[oy, ox], then cropped to dX
//   dW            dW[t] = sum over images, oy, ox of dY[oy, ox] Xp[oy sh cols + offset(t) + ox]
//
// Sums in registers are kept independent (several rows, or several taps, at a time), so the
// multiply-adds do not wait on each other's latency. Planes are spread over the pool; dW over
// channels, each summing its images in order.
//
// Output rows narrower than a vector (MobileNet's 4 x 4 and 2 x 2 maps) run channels last
// instead: 8 channels a vector (below). MobileNetV2's [16, 288, 4, 4] layer: forward 0.87 ->
// 0.11 ms, backward 1.9 -> 0.35 ms.
#include "kernels/cpu/conv_depthwise.h"

#include <algorithm>
#include <vector>

#include "graphtrain/options.h"
#include "graphtrain/thread_pool.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

using vec::f8;
constexpr int64_t kLanes = 8;

// A plane padded by (top, left, bottom, right) and split into `phases` column phases.
struct Phased {
  int64_t rows, width, phases, cols;  // padded rows and width; columns of one phase
  Phased(int64_t h, int64_t w, int64_t top, int64_t left, int64_t bottom, int64_t right,
         int64_t stride)
      : rows(h + top + bottom),
        width(w + left + right),
        phases(stride),
        cols((width + stride - 1) / stride) {}
  int64_t size() const { return phases * rows * cols; }
  int64_t at(int64_t r, int64_t c) const {
    return (c % phases) * rows * cols + r * cols + c / phases;
  }
};

// d[q] = s[q * P] for q < n (P a compile-time stride vectorizes; 0 for a stride known at run time).
// Plain loops, not memcpy / memset calls: rows here are a few dozen floats.
template <int P>
void gather_every(const float* s, int64_t stride, float* d, int64_t n) {
  for (int64_t q = 0; q < n; ++q) d[q] = s[q * (P ? P : stride)];
}
template <int P>
void scatter_every(const float* s, float* d, int64_t stride, int64_t n) {
  for (int64_t q = 0; q < n; ++q) d[q * (P ? P : stride)] = s[q];
}
// Calls f(phase, first column c >= c0 of that phase, its index q in the phase, count) for the
// columns [c0, c1) of a Phased row, phase by phase.
template <typename F>
void for_phases(const Phased& p, int64_t c0, int64_t c1, F f) {
  for (int64_t ph = 0; ph < p.phases; ++ph) {
    int64_t q = (std::max(c0, ph) - ph + p.phases - 1) / p.phases, c = q * p.phases + ph;
    if (c < c1) f(ph, c, q, (c1 - c + p.phases - 1) / p.phases);
  }
}

// src (src_rows x src_cols) placed at (top, left) of the padded plane dst (a Phased layout);
// top and left may be negative (src rows before the plane are left out). Only the window is
// written: the rest of dst must be zero already, as a fresh buffer is and stays for every plane
// of one convolution (the window is the same), so a plane costs no fill.
void place(const float* src, int64_t src_rows, int64_t src_cols, int64_t top, int64_t left,
           const Phased& p, float* dst) {
  const int64_t c0 = std::max<int64_t>(0, left), c1 = std::min(p.width, left + src_cols);
  for (int64_t r = std::max<int64_t>(0, top); r < std::min(p.rows, top + src_rows); ++r) {
    const float* s = src + (r - top) * src_cols - left;  // s[c]: padded column c
    float* d = dst + r * p.cols;
    for_phases(p, c0, c1, [&](int64_t ph, int64_t c, int64_t q, int64_t n) {
      float* out = d + ph * p.rows * p.cols + q;
      if (p.phases == 1)
        gather_every<1>(s + c, 1, out, n);
      else if (p.phases == 2)
        gather_every<2>(s + c, 2, out, n);
      else
        gather_every<0>(s + c, p.phases, out, n);
    });
  }
}

// dst (rows x cols) = the padded plane's window at (top, left) of src (a Phased layout).
void take(const float* src, const Phased& p, int64_t top, int64_t left, int64_t rows, int64_t cols,
          float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + (r + top) * p.cols;
    float* d = dst + r * cols - left;  // d[c]: padded column c
    for_phases(p, left, left + cols, [&](int64_t ph, int64_t c, int64_t q, int64_t n) {
      const float* in = s + ph * p.rows * p.cols + q;
      if (p.phases == 1)
        scatter_every<1>(in, d + c, 1, n);
      else if (p.phases == 2)
        scatter_every<2>(in, d + c, 2, n);
      else
        scatter_every<0>(in, d + c, p.phases, n);
    });
  }
}

// The offsets of the taps (i dh, j dw) in a Phased plane, in W's order.
std::vector<int64_t> tap_offsets(const ConvShape& s, const Phased& p) {
  std::vector<int64_t> off;
  for (int64_t i = 0; i < s.kh; ++i)
    for (int64_t j = 0; j < s.kw; ++j) off.push_back(p.at(i * s.dh, j * s.dw));
  return off;
}

// Output rows [oy, oy + R) and columns [ox, ox + V * 8) of `correlate`.
template <int R, int V>
inline void correlate_tile(const float* src, int64_t row_step, const int64_t* off, const float* w,
                           int64_t taps, int64_t oy, int64_t ox, float bias, float* out,
                           int64_t ow) {
  f8 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = vec::splat(bias);
  const float* base = src + oy * row_step + ox;
  for (int64_t t = 0; t < taps; ++t) {
    f8 wt = vec::splat(w[t]);
    const float* p = base + off[t];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] += wt * vec::load(p + r * row_step + v * kLanes);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) vec::store(out + (oy + r) * ow + ox + v * kLanes, acc[r][v]);
}

// Rows [oy, oy + R) of `correlate`: vector tiles, then the last columns one by one.
template <int R>
void correlate_rows(const float* src, int64_t row_step, const int64_t* off, const float* w,
                    int64_t taps, int64_t oy, int64_t ow, float bias, float* out) {
  int64_t ox = 0;
  for (; ox + 2 * kLanes <= ow; ox += 2 * kLanes)
    correlate_tile<R, 2>(src, row_step, off, w, taps, oy, ox, bias, out, ow);
  for (; ox + kLanes <= ow; ox += kLanes)
    correlate_tile<R, 1>(src, row_step, off, w, taps, oy, ox, bias, out, ow);
  for (int r = 0; r < R; ++r)
    for (int64_t x = ox; x < ow; ++x) {
      const float* p = src + (oy + r) * row_step + x;
      float a = bias;
      for (int64_t t = 0; t < taps; ++t) a += w[t] * p[off[t]];
      out[(oy + r) * ow + x] = a;
    }
}

// out[oy * ow + ox] = bias + sum over taps t of w[t] * src[oy * row_step + off[t] + ox]: 8 sums in
// flight, 4 rows of 2 vectors, or 8 rows of one where a row is narrower.
void correlate(const float* src, int64_t row_step, const int64_t* off, const float* w, int64_t taps,
               int64_t oh, int64_t ow, float bias, float* out) {
  int64_t oy = 0;
  if (ow < 2 * kLanes)
    for (; oy + 8 <= oh; oy += 8) correlate_rows<8>(src, row_step, off, w, taps, oy, ow, bias, out);
  for (; oy + 4 <= oh; oy += 4) correlate_rows<4>(src, row_step, off, w, taps, oy, ow, bias, out);
  for (; oy < oh; ++oy) correlate_rows<1>(src, row_step, off, w, taps, oy, ow, bias, out);
}

// g[t] = sum over images b and (oy, ox) of dy[b * dy_step + oy * ow + ox] *
// src[b * src_step + oy * row_step + off[t] + ox] for G taps: G independent sums in registers,
// each vector of dY loaded once for all of them.
template <int G>
void tap_group(const float* dy, int64_t dy_step, const float* src, int64_t src_step,
               int64_t row_step, const int64_t* off, int64_t images, int64_t oh, int64_t ow,
               float* g) {
  const int64_t vec_cols = ow / kLanes * kLanes;  // the rest one by one
  f8 acc[G] = {};
  float sum[G] = {};
  for (int64_t b = 0; b < images; ++b)
    for (int64_t oy = 0; oy < oh; ++oy) {
      const float* d = dy + b * dy_step + oy * ow;
      const float* r = src + b * src_step + oy * row_step;
      for (int64_t ox = 0; ox < vec_cols; ox += kLanes) {
        f8 dv = vec::load(d + ox);
        for (int k = 0; k < G; ++k) acc[k] += dv * vec::load(r + off[k] + ox);
      }
      for (int64_t ox = vec_cols; ox < ow; ++ox)
        for (int k = 0; k < G; ++k) sum[k] += d[ox] * r[off[k] + ox];
    }
  for (int k = 0; k < G; ++k) {
    for (int l = 0; l < kLanes; ++l) sum[k] += acc[k][l];
    g[k] = sum[k];
  }
}

// tap_group over all the taps, in balanced groups of at most 8.
void tap_gradients(const float* dy, int64_t dy_step, const float* src, int64_t src_step,
                   int64_t row_step, const std::vector<int64_t>& off, int64_t images, int64_t oh,
                   int64_t ow, float* g) {
  const int64_t taps = static_cast<int64_t>(off.size());
  for (int64_t k = 0, groups = (taps + 7) / 8; k < taps; --groups) {
    const int64_t size = (taps - k + groups - 1) / groups;  // at most 8: as even as they come
    const int64_t* o = off.data() + k;
    switch (size) {
#define GT_GROUP(G)                                                               \
  case G:                                                                         \
    tap_group<G>(dy, dy_step, src, src_step, row_step, o, images, oh, ow, g + k); \
    break;
      GT_GROUP(1)
      GT_GROUP(2)
      GT_GROUP(3)
      GT_GROUP(4)
      GT_GROUP(5)
      GT_GROUP(6)
      GT_GROUP(7)
      GT_GROUP(8)
#undef GT_GROUP
    }
    k += size;
  }
}

Phased input_layout(const ConvShape& s) {
  return Phased(s.h, s.w, s.ph0, s.pw0, s.ph1, s.pw1, s.sw);
}

// ---- small planes: channels last ----------------------------------------------------------------
// Rows narrower than a vector (MobileNet's 4 x 4 and 2 x 2 maps) leave the plane loops above
// scalar. There the channels are the vector: each image is transposed to [rows][width][C], padded,
// and every loop runs over 8 channels a vector, the weights transposed to [taps][C].

bool channels_last(const ConvShape& s) {
  return s.ow < kLanes && s.c >= kLanes;
}

// dst[((r + top) * width + q + left) * C + ch] = src[(ch * h + r) * w + q]: one image's planes into
// a padded channels-last buffer (only the window is written; the padding stays zero).
void to_channels_last(const float* src, int64_t channels, int64_t h, int64_t w, int64_t top,
                      int64_t left, int64_t width, float* dst) {
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q)
        dst[((r + top) * width + q + left) * channels + ch] = src[(ch * h + r) * w + q];
}

// The inverse: dst[(ch * h + r) * w + q] = src[((r + top) * width + q + left) * C + ch].
void from_channels_last(const float* src, int64_t channels, int64_t h, int64_t w, int64_t top,
                        int64_t left, int64_t width, float* dst) {
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q)
        dst[(ch * h + r) * w + q] = src[((r + top) * width + q + left) * channels + ch];
}

// What every channels-last kernel shares: the padded layout, the taps' offsets in it, the weights
// as [taps][C].
struct ChannelsLast {
  int64_t rows, width, taps;
  std::vector<int64_t> off;  // tap t at off[t] floats from an output position's base
  std::vector<float> wt;
  ChannelsLast(const ConvShape& s, const float* w)
      : rows(s.h + s.ph0 + s.ph1), width(s.w + s.pw0 + s.pw1), taps(s.kh * s.kw) {
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j) off.push_back((i * s.dh * width + j * s.dw) * s.c);
    wt.resize(static_cast<size_t>(taps * s.c));
    for (int64_t ch = 0; ch < s.c; ++ch)
      for (int64_t t = 0; t < taps; ++t) wt[static_cast<size_t>(t * s.c + ch)] = w[ch * taps + t];
  }
  int64_t size(const ConvShape& s) const { return rows * width * s.c; }
  int64_t base(const ConvShape& s, int64_t oy, int64_t ox) const {
    return (oy * s.sh * width + ox * s.sw) * s.c;
  }
};

// y[pos][c] = bias[c] + sum_t wt[t][c] x[base + off[t]][c] for one output position, 4 vectors of
// channels at a time (independent sums), then one, then the last channels one by one.
void channels_last_position(const ChannelsLast& L, int64_t channels, const float* x,
                            const float* bias, float* y) {
  int64_t c = 0;
  for (; c + 4 * kLanes <= channels; c += 4 * kLanes) {
    f8 acc[4];
    for (int k = 0; k < 4; ++k) acc[k] = bias ? vec::load(bias + c + k * kLanes) : f8{};
    for (int64_t t = 0; t < L.taps; ++t) {
      const float* wv = L.wt.data() + t * channels + c;
      const float* xv = x + L.off[static_cast<size_t>(t)] + c;
      for (int k = 0; k < 4; ++k) acc[k] += vec::load(wv + k * kLanes) * vec::load(xv + k * kLanes);
    }
    for (int k = 0; k < 4; ++k) vec::store(y + c + k * kLanes, acc[k]);
  }
  for (; c + kLanes <= channels; c += kLanes) {
    f8 acc = bias ? vec::load(bias + c) : f8{};
    for (int64_t t = 0; t < L.taps; ++t)
      acc += vec::load(L.wt.data() + t * channels + c) *
             vec::load(x + L.off[static_cast<size_t>(t)] + c);
    vec::store(y + c, acc);
  }
  for (; c < channels; ++c) {
    float a = bias ? bias[c] : 0.0f;
    for (int64_t t = 0; t < L.taps; ++t)
      a += L.wt[static_cast<size_t>(t * channels + c)] * x[L.off[static_cast<size_t>(t)] + c];
    y[c] = a;
  }
}

// acc[c] += a[c] * b[c] over `channels` floats.
void multiply_add(float* acc, const float* a, const float* b, int64_t channels) {
  int64_t c = 0;
  for (; c + kLanes <= channels; c += kLanes)
    vec::store(acc + c, vec::load(acc + c) + vec::load(a + c) * vec::load(b + c));
  for (; c < channels; ++c) acc[c] += a[c] * b[c];
}

void channels_last_forward(ThreadPool& pool, const ConvShape& s, const float* x, const float* w,
                           const float* b, float* y) {
  const ChannelsLast L(s, w);
  pool.parallel_for(s.n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> xt(static_cast<size_t>(L.size(s)));
    std::vector<float> yt(static_cast<size_t>(s.oh * s.ow * s.c));
    for (int64_t img = lo; img < hi; ++img) {
      to_channels_last(x + img * s.c * s.h * s.w, s.c, s.h, s.w, s.ph0, s.pw0, L.width, xt.data());
      for (int64_t oy = 0; oy < s.oh; ++oy)
        for (int64_t ox = 0; ox < s.ow; ++ox)
          channels_last_position(L, s.c, xt.data() + L.base(s, oy, ox), b,
                                 yt.data() + (oy * s.ow + ox) * s.c);
      from_channels_last(yt.data(), s.c, s.oh, s.ow, 0, 0, s.ow, y + img * s.c * s.oh * s.ow);
    }
  });
}

// dX by scattering each output position's gradient over its taps (any stride), dW as each image's
// sums over positions, added in image order.
void channels_last_backward(ThreadPool& pool, const ConvShape& s, const float* dy, const float* x,
                            const float* w, float* dx, float* dw) {
  const ChannelsLast L(s, w);
  const int64_t out_image = s.c * s.oh * s.ow, in_image = s.c * s.h * s.w;
  std::vector<float> dw_images(dw ? static_cast<size_t>(s.n * L.taps * s.c) : 0);
  pool.parallel_for(s.n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> xt(dw ? static_cast<size_t>(L.size(s)) : 0);
    std::vector<float> acc(dx ? static_cast<size_t>(L.size(s)) : 0);
    std::vector<float> dyt(static_cast<size_t>(out_image));
    for (int64_t img = lo; img < hi; ++img) {
      to_channels_last(dy + img * out_image, s.c, s.oh, s.ow, 0, 0, s.ow, dyt.data());
      if (dx) std::fill(acc.begin(), acc.end(), 0.0f);
      if (dw) to_channels_last(x + img * in_image, s.c, s.h, s.w, s.ph0, s.pw0, L.width, xt.data());
      float* g = dw ? dw_images.data() + img * L.taps * s.c : nullptr;
      for (int64_t oy = 0; oy < s.oh; ++oy)
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          const float* d = dyt.data() + (oy * s.ow + ox) * s.c;
          const int64_t base = L.base(s, oy, ox);
          for (int64_t t = 0; t < L.taps; ++t) {
            const int64_t at = base + L.off[static_cast<size_t>(t)];
            if (dx) multiply_add(acc.data() + at, L.wt.data() + t * s.c, d, s.c);
            if (g) multiply_add(g + t * s.c, xt.data() + at, d, s.c);
          }
        }
      if (dx)
        from_channels_last(acc.data(), s.c, s.h, s.w, s.ph0, s.pw0, L.width, dx + img * in_image);
    }
  });
  if (dw)
    for (int64_t ch = 0; ch < s.c; ++ch)
      for (int64_t t = 0; t < L.taps; ++t) {
        float sum = 0;
        for (int64_t img = 0; img < s.n; ++img)
          sum += dw_images[static_cast<size_t>((img * L.taps + t) * s.c + ch)];
        dw[ch * L.taps + t] = sum;
      }
}

}  // namespace

bool runs_depthwise(const ConvShape& s) {
  return s.group > 1 && s.group == s.c && s.m == s.c &&
         Options::global().get_string("conv_algorithm") == "AUTO";
}

void depthwise_conv_forward(ThreadPool& pool, const ConvShape& s, const float* x, const float* w,
                            const float* b, float* y) {
  if (channels_last(s)) return channels_last_forward(pool, s, x, w, b, y);
  const Phased layout = input_layout(s);
  const std::vector<int64_t> off = tap_offsets(s, layout);
  const int64_t taps = s.kh * s.kw;
  pool.parallel_for(s.n * s.c, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(layout.size()));
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t c = p % s.c;
      place(x + p * s.h * s.w, s.h, s.w, s.ph0, s.pw0, layout, buf.data());
      correlate(buf.data(), s.sh * layout.cols, off.data(), w + c * taps, taps, s.oh, s.ow,
                b ? b[c] : 0.0f, y + p * s.oh * s.ow);
    }
  });
}

void depthwise_conv_backward(ThreadPool& pool, const ConvShape& s, const float* dy, const float* x,
                             const float* w, float* dx, float* dw) {
  if (channels_last(s)) return channels_last_backward(pool, s, dy, x, w, dx, dw);
  const int64_t taps = s.kh * s.kw, out_plane = s.oh * s.ow;
  if (dx && s.sh == 1 && s.sw == 1) {
    // dY placed in a plane padded by the kernel's extent less the conv's pads; W flipped.
    const Phased layout(s.h, s.w, 0, 0, (s.kh - 1) * s.dh, (s.kw - 1) * s.dw, 1);
    const std::vector<int64_t> off = tap_offsets(s, layout);
    pool.parallel_for(s.n * s.c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> buf(static_cast<size_t>(layout.size())),
          flipped(static_cast<size_t>(taps));
      for (int64_t p = lo; p < hi; ++p) {
        const float* wc = w + (p % s.c) * taps;
        std::reverse_copy(wc, wc + taps, flipped.begin());
        place(dy + p * out_plane, s.oh, s.ow, (s.kh - 1) * s.dh - s.ph0, (s.kw - 1) * s.dw - s.pw0,
              layout, buf.data());
        correlate(buf.data(), layout.cols, off.data(), flipped.data(), taps, s.h, s.w, 0.0f,
                  dx + p * s.h * s.w);
      }
    });
  } else if (dx) {
    const Phased layout = input_layout(s);
    const std::vector<int64_t> off = tap_offsets(s, layout);
    const int64_t row_step = s.sh * layout.cols, vec_cols = s.ow / kLanes * kLanes;
    pool.parallel_for(s.n * s.c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> acc(static_cast<size_t>(layout.size()));
      for (int64_t p = lo; p < hi; ++p) {
        const float* wc = w + (p % s.c) * taps;
        const float* d = dy + p * out_plane;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t oy = 0; oy < s.oh; ++oy)
          for (int64_t t = 0; t < taps; ++t) {
            float* row = acc.data() + oy * row_step + off[static_cast<size_t>(t)];
            const float* drow = d + oy * s.ow;
            const f8 wt = vec::splat(wc[t]);
            int64_t ox = 0;
            for (; ox < vec_cols; ox += kLanes)
              vec::store(row + ox, vec::load(row + ox) + wt * vec::load(drow + ox));
            for (; ox < s.ow; ++ox) row[ox] += wc[t] * drow[ox];
          }
        take(acc.data(), layout, s.ph0, s.pw0, s.h, s.w, dx + p * s.h * s.w);
      }
    });
  }
  if (dw) {
    // Per channel: every image's input plane, then the taps' sums over all of them.
    const Phased layout = input_layout(s);
    const std::vector<int64_t> off = tap_offsets(s, layout);
    const int64_t plane = layout.size();
    pool.parallel_for(s.c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> planes(static_cast<size_t>(s.n * plane));
      for (int64_t c = lo; c < hi; ++c) {
        for (int64_t b = 0; b < s.n; ++b)
          place(x + (b * s.c + c) * s.h * s.w, s.h, s.w, s.ph0, s.pw0, layout,
                planes.data() + b * plane);
        tap_gradients(dy + c * out_plane, s.c * out_plane, planes.data(), plane, s.sh * layout.cols,
                      off, s.n, s.oh, s.ow, dw + c * taps);
      }
    });
  }
}

}  // namespace graphtrain::cpu
