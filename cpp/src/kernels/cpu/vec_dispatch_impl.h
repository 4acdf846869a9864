// The loops of vec_dispatch.h for one vector type V, included by vec_dispatch.cc (8 lanes) and
// vec_dispatch_avx512.cc (16 lanes, in its own GRAPHTRAIN_VEC_ISA namespace).
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/elementwise_math.h"
#include "kernels/cpu/vec_dispatch.h"

namespace graphtrain::cpu::vec {
inline namespace GRAPHTRAIN_VEC_ISA {

template <typename V, typename F>
inline void map2(const float* a, const float* b, float* y, int64_t n, F f) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch(a + i);
    prefetch(b + i);
    store_as(y + i, f(load_as<V>(a + i), load_as<V>(b + i)));
  }
  for (; i < n; ++i) y[i] = f(a[i], b[i]);
}

#if defined(__AVX512F__)
// GELU (erf form) and its gradient on 16 lanes with AVX-512's own instructions: the formulas of
// elementwise_math.h (erfc's A&S tail, the density from the same exponential) with two cheaper
// steps, ~30 instructions a vector where the generic form takes ~45:
// - e^(-x^2 / 2) is exp_nonpositive's: its argument is never positive;
// - 1 / (1 + p |z|) is a 14-bit reciprocal estimate and one Newton step (relative error near
//   2^-28), not a division.
// Phi reads x clamped to [-16, 16] (NaN kept), where it is already 1 or 0 to float precision,
// so an infinite x never meets 0 * inf inside the reciprocal; x itself multiplies the result, so
// GELU(-inf) and the gradient at +-inf are NaN, as the scalar formulas give. Every element, the
// tail's too, goes through these instructions (masked loads and stores), so a result never depends
// on its position.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
inline __m512 exp_of_nonpositive(__m512 x) {
  return reinterpret_cast<__m512>(exp_nonpositive(reinterpret_cast<f16>(x)));
}
// Phi(x) given e = e^(-x^2 / 2): erfc(|x| / sqrt 2) / 2 below zero, 1 minus that above.
inline __m512 gelu_phi(__m512 x, __m512 e) {
  __m512 a = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
  __m512 d = _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f));
  __m512 t0 = _mm512_rcp14_ps(d);
  __m512 t = _mm512_mul_ps(t0, _mm512_fnmadd_ps(d, t0, _mm512_set1_ps(2.0f)));
  __m512 r = _mm512_fmadd_ps(t, _mm512_set1_ps(1.061405429f), _mm512_set1_ps(-1.453152027f));
  r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(1.421413741f));
  r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(-0.284496736f));
  r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(0.254829592f));
  __m512 h = _mm512_mul_ps(_mm512_mul_ps(r, t), _mm512_mul_ps(e, _mm512_set1_ps(0.5f)));
  __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), h), neg, h);
}
inline __m512 gelu_clamp(__m512 x) {  // min / max return their second operand on a NaN
  return _mm512_max_ps(_mm512_set1_ps(-16.0f), _mm512_min_ps(_mm512_set1_ps(16.0f), x));
}
inline __m512 half_x_squared_neg(__m512 x) {
  return _mm512_mul_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(-0.5f));
}
template <typename F>
inline void map16(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch(a + i);
    if (b) prefetch(b + i);
    _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(a + i), b ? _mm512_loadu_ps(b + i) : __m512{}));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 va = _mm512_maskz_loadu_ps(m, a + i);
    __m512 vb = b ? _mm512_maskz_loadu_ps(m, b + i) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(y + i, m, f(va, vb));
  }
}
inline __m512 gelu16_of(__m512 v) {
  __m512 c = gelu_clamp(v);
  return _mm512_mul_ps(v, gelu_phi(c, exp_of_nonpositive(half_x_squared_neg(c))));
}
inline void gelu16(const float* x, float* y, int64_t n) {
  map16(x, nullptr, y, n, [](__m512 v, __m512) { return gelu16_of(v); });
}
// s = a + b, y = GELU(s): the tail, too, through the same instructions.
inline void add_gelu16(const float* a, const float* b, float* s, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch(a + i);
    prefetch(b + i);
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    _mm512_storeu_ps(s + i, v);
    _mm512_storeu_ps(y + i, gelu16_of(v));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
    _mm512_mask_storeu_ps(s + i, m, v);
    _mm512_mask_storeu_ps(y + i, m, gelu16_of(v));
  }
}
inline void gelu_grad16(const float* g, const float* x, float* y, int64_t n) {
  map16(g, x, y, n, [](__m512 dy, __m512 v) {
    __m512 c = gelu_clamp(v);
    __m512 e = exp_of_nonpositive(half_x_squared_neg(c));
    __m512 density = _mm512_mul_ps(_mm512_mul_ps(v, e), _mm512_set1_ps(0.39894228040143268f));
    return _mm512_mul_ps(dy, _mm512_add_ps(gelu_phi(c, e), density));
  });
}
// GeluGrad from x and y = GELU(x): gelu_grad16's density, Phi = y / x.
inline __m512 gelu_grad_from_output16_of(__m512 dy, __m512 v, __m512 y) {
  __m512 c = gelu_clamp(v);
  __m512 e = exp_of_nonpositive(half_x_squared_neg(c));
  __m512 density = _mm512_mul_ps(_mm512_mul_ps(v, e), _mm512_set1_ps(0.39894228040143268f));
  __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(1e-20f), _CMP_LT_OQ);
  __m512 ratio = _mm512_mask_mov_ps(_mm512_div_ps(y, v), tiny, _mm512_set1_ps(0.5f));
  return _mm512_mul_ps(dy, _mm512_add_ps(ratio, density));
}
inline void gelu_grad_from_output16(const float* g, const float* x, const float* y, float* o,
                                    int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch(g + i);
    prefetch(x + i);
    prefetch(y + i);
    _mm512_storeu_ps(o + i,
                     gelu_grad_from_output16_of(_mm512_loadu_ps(g + i), _mm512_loadu_ps(x + i),
                                                _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(
        o + i, m,
        gelu_grad_from_output16_of(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, x + i),
                                   _mm512_maskz_loadu_ps(m, y + i)));
  }
}
// GELU and its derivative of s = a + b (or a), sum = s where not null: gelu16_of's Phi and
// gelu_grad16's density, so that dY times the derivative is gelu_grad16's result.
inline void gelu_with_derivative16_of(__m512 v, __m512& y, __m512& d) {
  __m512 c = gelu_clamp(v);
  __m512 e = exp_of_nonpositive(half_x_squared_neg(c));
  __m512 phi = gelu_phi(c, e);
  y = _mm512_mul_ps(v, phi);
  d = _mm512_add_ps(phi, _mm512_mul_ps(_mm512_mul_ps(v, e), _mm512_set1_ps(0.39894228040143268f)));
}
inline void gelu_with_derivative16(const float* a, const float* b, float* s, float* y, float* d,
                                   int64_t n) {
  auto one = [&](int64_t i, __mmask16 m) {
    __m512 v = _mm512_maskz_loadu_ps(m, a + i);
    if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b + i));
    if (s) _mm512_mask_storeu_ps(s + i, m, v);
    __m512 vy, vd;
    gelu_with_derivative16_of(v, vy, vd);
    _mm512_mask_storeu_ps(y + i, m, vy);
    _mm512_mask_storeu_ps(d + i, m, vd);
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch(a + i);
    if (b) prefetch(b + i);
    one(i, 0xffff);
  }
  if (i < n) one(i, static_cast<__mmask16>((1u << (n - i)) - 1));
}
#pragma GCC diagnostic pop
#endif

template <typename V>
void gelu_grad_from_output(bool tanh, const float* g, const float* x, const float* y, float* o,
                           int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if (!tanh) return gelu_grad_from_output16(g, x, y, o, n);
  }
#endif
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  auto run = [&](auto f) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      prefetch(g + i);
      prefetch(x + i);
      store_as(o + i, f(load_as<V>(g + i), load_as<V>(x + i), load_as<V>(y + i)));
    }
    for (; i < n; ++i) o[i] = f(g[i], x[i], y[i]);
  };
  if (tanh)
    run(math::gelu_tanh_grad_from_output);
  else
    run(math::gelu_erf_grad_from_output);
}

template <typename V>
void gelu_with_derivative(bool tanh, const float* a, const float* b, float* sum, float* y, float* d,
                          int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if (!tanh) return gelu_with_derivative16(a, b, sum, y, d, n);
  }
#endif
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  auto run = [&](auto f) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      prefetch(a + i);
      V x = load_as<V>(a + i);
      if (b) {
        prefetch(b + i);
        x += load_as<V>(b + i);
      }
      if (sum) store_as(sum + i, x);
      auto [vy, vd] = f(x);
      store_as(y + i, vy);
      store_as(d + i, vd);
    }
    for (; i < n; ++i) {
      float x = b ? a[i] + b[i] : a[i];
      if (sum) sum[i] = x;
      auto [vy, vd] = f(x);
      y[i] = vy;
      d[i] = vd;
    }
  };
  if (tanh)
    run(math::gelu_tanh_with_derivative);
  else
    run(math::gelu_erf_with_derivative);
}

template <typename V>
void apply(VecOp op, const float* a, const float* b, float* y, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if (op == VecOp::kGelu) return gelu16(a, y, n);
    if (op == VecOp::kGeluGrad) return gelu_grad16(a, b, y, n);
  }
#endif
  switch (op) {
    case VecOp::kExp:
      return map<V>(a, y, n, [](auto x) { return exp(x); });
    case VecOp::kTanh:
      return map<V>(a, y, n, [](auto x) { return tanh(x); });
    case VecOp::kErf:
      return map<V>(a, y, n, [](auto x) { return erf(x); });
    case VecOp::kSigmoid:
      return map<V>(a, y, n, math::sigmoid);
    case VecOp::kGelu:
      return map<V>(a, y, n, math::gelu_erf);
    case VecOp::kGeluTanh:
      return map<V>(a, y, n, math::gelu_tanh);
    case VecOp::kGeluGrad:
      return map2<V>(a, b, y, n, math::gelu_erf_grad);
    case VecOp::kGeluTanhGrad:
      return map2<V>(a, b, y, n, math::gelu_tanh_grad);
    case VecOp::kSiluMul:
      return map2<V>(a, b, y, n, math::silu_mul);
    case VecOp::kSilu:
      return map<V>(a, y, n, math::silu);
  }
}

template <typename V>
void silu_mul_grad(const float* dy, const float* g, const float* u, float* dg, float* du,
                   int64_t n) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  auto both = [&](auto d, auto gv, auto uv, auto store_g, auto store_u) {
    auto s = math::sigmoid(gv);
    if (du) store_u(d * (gv * s));
    if (dg) store_g(d * uv * s * (1.0f + gv * (1.0f - s)));
  };
  int64_t i = 0;
  if (!u) {  // y = silu(g)
    for (; i + kLanes <= n; i += kLanes) {
      V gv = load_as<V>(g + i), s = math::sigmoid(gv);
      store_as(dg + i, load_as<V>(dy + i) * s * (1.0f + gv * (1.0f - s)));
    }
    for (; i < n; ++i) {
      float s = math::sigmoid(g[i]);
      dg[i] = dy[i] * s * (1.0f + g[i] * (1.0f - s));
    }
    return;
  }
  for (; i + kLanes <= n; i += kLanes)
    both(
        load_as<V>(dy + i), load_as<V>(g + i), load_as<V>(u + i), [&](V v) { store_as(dg + i, v); },
        [&](V v) { store_as(du + i, v); });
  for (; i < n; ++i)
    both(
        dy[i], g[i], u[i], [&](float v) { dg[i] = v; }, [&](float v) { du[i] = v; });
}

template <typename V>
void add_apply(VecOp op, const float* a, const float* b, float* sum, float* y, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if (op == VecOp::kGelu) return add_gelu16(a, b, sum, y, n);
  }
#endif
  for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  apply<V>(op, sum, nullptr, y, n);
}

template <typename V>
float exp_sum(const float* x, float* y, int64_t n, float shift, float scale) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V acc{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch(x + i);
    V e = exp_nonpositive(load_as<V>(x + i) - shift);
    acc += e;
    store_as(y + i, e * scale);
  }
  float s = lanes_sum(acc);
  for (; i < n; ++i) {
    float e = exp(x[i] - shift);
    s += e;
    y[i] = e * scale;
  }
  return s;
}

// Attention's transposed tiles (vec_dispatch.h): a column of kAttentionTileRows rows is kV
// vectors.
template <typename V>
struct Tile {
  static constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  static constexpr int kV = static_cast<int>(kAttentionTileRows / kLanes);
  static_assert(kAttentionTileRows % kLanes == 0);
  // Lane i of vector j: row j * kLanes + i.
  static V rows_of(int j) {
    V r;
    for (int64_t i = 0; i < kLanes; ++i) r[i] = static_cast<float>(j * kLanes + i);
    return r;
  }
  // Column c with the mask added and the hidden rows at -inf, into x.
  static void column(const float* t, int64_t c, int64_t rows, const float* m, int64_t ld_m,
                     int64_t causal_row0, V* x) {
    // Rows r < first come before key c (causal); rows r >= rows are padding.
    const int64_t first = causal_row0 >= 0 ? c - causal_row0 : 0;
    for (int j = 0; j < kV; ++j) {
      V v = load_as<V>(t + c * kAttentionTileRows + j * kLanes);
      if (m) v += load_as<V>(m + c * ld_m + j * kLanes);
      if (first > j * kLanes || rows < (j + 1) * kLanes) {
        V r = rows_of(j);
        v = (r < static_cast<float>(first)) | (r >= static_cast<float>(rows)) ? V{} - INFINITY : v;
      }
      x[j] = v;
    }
  }
};

template <typename V>
void attention_softmax_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                         int64_t causal_row0, float* lse) {
  using T = Tile<V>;
  constexpr int64_t L = T::kLanes, R = kAttentionTileRows;
  V top[T::kV], sum[T::kV];
  for (int j = 0; j < T::kV; ++j) top[j] = V{} - INFINITY;
  for (int64_t c = 0; c < cols; ++c) {
    V x[T::kV];
    T::column(t, c, rows, m, ld_m, causal_row0, x);
    for (int j = 0; j < T::kV; ++j) {
      store_as(t + c * R + j * L, x[j]);
      top[j] = x[j] > top[j] ? x[j] : top[j];
    }
  }
  V shift[T::kV];  // a row that sees nothing: exp(-inf - 0) = 0, not exp(-inf + inf)
  for (int j = 0; j < T::kV; ++j) {
    shift[j] = top[j] == V{} - INFINITY ? V{} : top[j];
    sum[j] = V{};
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int j = 0; j < T::kV; ++j) {
      V e = exp_nonpositive(load_as<V>(t + c * R + j * L) - shift[j]);
      sum[j] += e;
      store_as(t + c * R + j * L, e);
    }
  V inv[T::kV];
  for (int j = 0; j < T::kV; ++j) inv[j] = sum[j] > 0.0f ? 1.0f / sum[j] : V{};
  for (int64_t c = 0; c < cols; ++c)
    for (int j = 0; j < T::kV; ++j)
      store_as(t + c * R + j * L, load_as<V>(t + c * R + j * L) * inv[j]);
  for (int64_t r = 0; r < rows; ++r) {
    float s = sum[r / L][r % L];
    lse[r] = s > 0.0f ? top[r / L][r % L] + std::log(s) : -INFINITY;
  }
}

template <typename V>
void attention_exp_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                     int64_t causal_row0, const float* lse) {
  using T = Tile<V>;
  constexpr int64_t L = T::kLanes, R = kAttentionTileRows;
  V shift[T::kV];  // a row that saw nothing (lse -inf) is all -inf: exp(-inf - 0) = 0
  for (int j = 0; j < T::kV; ++j) {
    V l = load_as<V>(lse + j * L);
    shift[j] = l == V{} - INFINITY ? V{} : l;
  }
  for (int64_t c = 0; c < cols; ++c) {
    V x[T::kV];
    T::column(t, c, rows, m, ld_m, causal_row0, x);
    for (int j = 0; j < T::kV; ++j) store_as(t + c * R + j * L, exp_nonpositive(x[j] - shift[j]));
  }
}

template <typename V>
void attention_grad_t(const float* p, float* ds, int64_t cols, const float* d) {
  using T = Tile<V>;
  constexpr int64_t L = T::kLanes, R = kAttentionTileRows;
  V dv[T::kV];
  for (int j = 0; j < T::kV; ++j) dv[j] = load_as<V>(d + j * L);
  for (int64_t c = 0; c < cols; ++c)
    for (int j = 0; j < T::kV; ++j) {
      float* o = ds + c * R + j * L;
      store_as(o, load_as<V>(p + c * R + j * L) * (load_as<V>(o) - dv[j]));
    }
}

// LayerNorm of rows of K vectors held in registers (vec_dispatch.h).
template <typename V, int K>
void layer_norm_rows_k(const LayerNormRows& a, int64_t r0, int64_t r1) {
  constexpr int64_t L = sizeof(V) / sizeof(float), kCols = K * L;
  const float n = static_cast<float>(kCols);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = r * kCols;
    V v[K];
    for (int k = 0; k < K; ++k) v[k] = load_as<V>(a.x + at + k * L);
    if (a.res) {  // the residual sum first, then normalized like any x
      for (int k = 0; k < K; ++k) {
        v[k] += load_as<V>(a.res + at + k * L);
        if (a.add) v[k] += load_as<V>(a.add + k * L);
        store_as(a.sum + at + k * L, v[k]);
      }
    }
    float mean = 0.0f;
    if (!a.rms) {
      V s = v[0];
      for (int k = 1; k < K; ++k) s += v[k];
      mean = lanes_sum(s) / n;
    }
    V q{};
    for (int k = 0; k < K; ++k) {
      V c = v[k] - mean;
      q += c * c;
    }
    const float inv = 1.0f / std::sqrt(lanes_sum(q) / n + a.eps);
    for (int k = 0; k < K; ++k) {
      V y = (v[k] - mean) * inv * load_as<V>(a.gamma + k * L);
      if (a.beta) y += load_as<V>(a.beta + k * L);
      store_as(a.y + at + k * L, y);
    }
    if (a.mean) a.mean[r] = mean;
    if (a.inv) a.inv[r] = inv;
  }
}

// f(std::integral_constant<int, K>) for the K in 1..kMax with cols = K vectors of V; false, with
// no call, where there is none.
template <typename V, int kMax, int K = 1, typename F>
bool for_row_vectors(int64_t cols, F&& f) {
  if constexpr (K > kMax) {
    return false;
  } else {
    if (cols != K * static_cast<int64_t>(sizeof(V) / sizeof(float)))
      return for_row_vectors<V, kMax, K + 1>(cols, f);
    f(std::integral_constant<int, K>{});
    return true;
  }
}

template <typename V>
bool layer_norm_rows(const LayerNormRows& a, int64_t r0, int64_t r1) {
  constexpr int kMax = sizeof(V) == 64 ? 16 : 8;  // row vectors that fit the registers
  return for_row_vectors<V, kMax>(a.cols, [&](auto k) { layer_norm_rows_k<V, k()>(a, r0, r1); });
}

template <typename V, int K>
void layer_norm_grad_rows_k(const LayerNormGradRows& a, int64_t r0, int64_t r1) {
  constexpr int64_t L = sizeof(V) / sizeof(float), kCols = K * L;
  const float inv_n = 1.0f / static_cast<float>(kCols);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = r * kCols;
    const float mu = a.rms ? 0.0f : a.mean[r], iv = a.inv[r];
    V xh[K], d[K], sum_d{}, sum_dx{};
    for (int k = 0; k < K; ++k) {
      V g = load_as<V>(a.dy + at + k * L);
      xh[k] = (load_as<V>(a.x + at + k * L) - mu) * iv;
      d[k] = g * load_as<V>(a.w + k * L);
      sum_d += d[k];
      sum_dx += d[k] * xh[k];
      store_as(a.dw + k * L, load_as<V>(a.dw + k * L) + g * xh[k]);
      if (!a.rms) store_as(a.db + k * L, load_as<V>(a.db + k * L) + g);
    }
    if (!a.dx) continue;
    const float md = a.rms ? 0.0f : inv_n * lanes_sum(sum_d), mdx = inv_n * lanes_sum(sum_dx);
    for (int k = 0; k < K; ++k) {
      V o = iv * (d[k] - (md + xh[k] * mdx));
      if (a.res) o += load_as<V>(a.res + at + k * L);
      store_as(a.dx + at + k * L, o);
    }
  }
}

template <typename V>
bool layer_norm_grad_rows(const LayerNormGradRows& a, int64_t r0, int64_t r1) {
  constexpr int kMax = sizeof(V) == 64 ? 8 : 4;  // x-hat and dy * w of a row in the registers
  return for_row_vectors<V, kMax>(a.cols,
                                  [&](auto k) { layer_norm_grad_rows_k<V, k()>(a, r0, r1); });
}

// A row of K vectors held in registers: z = x * scale + mask, its max, exp and normalization, one
// read of x and one write of y.
template <typename V, int K>
void softmax_row_in_registers(const float* x, const float* m, bool runs, float add, float scale,
                              float* y) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V z[K];
  V top = V{} - INFINITY;
  for (int k = 0; k < K; ++k) {
    z[k] = load_as<V>(x + k * kLanes) * scale + (runs ? load_as<V>(m + k * kLanes) : V{} + add);
    top = z[k] > top ? z[k] : top;
  }
  float mx = lanes_max(top);
  if (std::isinf(mx) && mx < 0) mx = 0;  // all -inf: avoid inf - inf
  V total{};
  for (int k = 0; k < K; ++k) {
    z[k] = exp_nonpositive(z[k] - mx);
    total += z[k];
  }
  const float inv = 1.0f / lanes_sum(total);
  for (int k = 0; k < K; ++k) store_as(y + k * kLanes, z[k] * inv);
}

template <typename V>
void softmax_row(const float* x, const float* m, bool m_runs, float scale, float* y, int64_t n) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  const bool runs = m && m_runs;
  const float add = m && !m_runs ? m[0] : 0.0f;
  if (n % kLanes == 0) {  // attention's rows (64 keys: 4 vectors of 16)
    switch (n / kLanes) {
      case 1:
        return softmax_row_in_registers<V, 1>(x, m, runs, add, scale, y);
      case 2:
        return softmax_row_in_registers<V, 2>(x, m, runs, add, scale, y);
      case 3:
        return softmax_row_in_registers<V, 3>(x, m, runs, add, scale, y);
      case 4:
        return softmax_row_in_registers<V, 4>(x, m, runs, add, scale, y);
      default:
        break;
    }
  }
  V top = V{} - INFINITY;
  float tail_top = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V z = load_as<V>(x + i) * scale + (runs ? load_as<V>(m + i) : V{} + add);
    store_as(y + i, z);
    top = z > top ? z : top;
  }
  for (; i < n; ++i) {
    y[i] = x[i] * scale + (runs ? m[i] : add);
    tail_top = y[i] > tail_top ? y[i] : tail_top;
  }
  float mx = std::max(lanes_max(top), tail_top);
  if (std::isinf(mx) && mx < 0) mx = 0;
  const float inv = 1.0f / exp_sum<V>(y, y, n, mx, 1.0f);
  for (i = 0; i + kLanes <= n; i += kLanes) store_as(y + i, load_as<V>(y + i) * inv);
  for (; i < n; ++i) y[i] *= inv;
}

// Lanes i < n (n < the lane count) of p, the others `fill`; and a store of lanes i < n. With
// AVX-512, masked loads and stores: a row's tail goes through the same instructions as its body.
template <typename V>
inline V load_part(const float* p, int64_t n, float fill) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64)
    return reinterpret_cast<V>(
        _mm512_mask_loadu_ps(_mm512_set1_ps(fill), static_cast<__mmask16>((1u << n) - 1), p));
#endif
  V v = V{} + fill;
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
template <typename V>
inline void store_part(float* p, V v, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), reinterpret_cast<__m512>(v));
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}

// vec_cross_entropy_row: three passes over a row that sits in L1 (max; exponentials and their
// sum; the scale), each on whole vectors, the tail a partial one (masked with AVX-512).
template <typename V>
float cross_entropy_row(const float* x, float* g, int64_t n, int64_t label, float coef) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  const V neg_inf = V{} - INFINITY;
  V m0 = neg_inf, m1 = neg_inf;  // two running maxima: the compares do not wait on one another
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    V a = load_as<V>(x + i), b = load_as<V>(x + i + kLanes);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
  }
  for (; i < n; i += kLanes) {
    V a = i + kLanes <= n ? load_as<V>(x + i) : load_part<V>(x + i, n - i, -INFINITY);
    m0 = a > m0 ? a : m0;
  }
  float mx = lanes_max(m1 > m0 ? m1 : m0);  // NaN scores: the row's sum and loss are NaN below
  if (std::isinf(mx) && mx < 0) mx = 0;
  V acc{};
  for (i = 0; i + kLanes <= n; i += kLanes) {
    V e = exp_nonpositive(load_as<V>(x + i) - mx);
    acc += e;
    store_as(g + i, e);
  }
  if (i < n) {  // -inf fill: exp gives 0 in the padding lanes
    V e = exp_nonpositive(load_part<V>(x + i, n - i, -INFINITY) - mx);
    acc += e;
    store_part(g + i, e, n - i);
  }
  const float sum = lanes_sum(acc);
  const float k = coef / sum;
  for (i = 0; i + kLanes <= n; i += kLanes) store_as(g + i, load_as<V>(g + i) * k);
  if (i < n) store_part(g + i, load_part<V>(g + i, n - i, 0.0f) * k, n - i);
  if (coef != 0) g[label] -= coef;
  return mx + std::log(sum);
}

// dx = scale * y * (dy - sum(dy * y)) over n floats: softmax's gradient along a row.
template <typename V>
void softmax_grad_row(const float* dy, const float* y, float scale, float* dx, int64_t n) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V acc{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += load_as<V>(dy + i) * load_as<V>(y + i);
  float dot = lanes_sum(acc);
  for (; i < n; ++i) dot += dy[i] * y[i];
  for (i = 0; i + kLanes <= n; i += kLanes)
    store_as(dx + i, (load_as<V>(y + i) * (load_as<V>(dy + i) - dot)) * scale);
  for (; i < n; ++i) dx[i] = (y[i] * (dy[i] - dot)) * scale;
}

// One register tile of small_gemm: rows i < MR, columns of NV vectors from c (and b).
template <typename V, int MR, int NV>
inline void gemm_tile(int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
                      const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V sum[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) sum[i][j] = V{};
  for (int64_t p = 0; p < k; ++p) {
    V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = load_as<V>(b + p * ldb + j * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      V av = splat_as<V>(a[i * a_row + p * a_col]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) sum[i][j] += av * bv[j];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      float* cp = c + i * ldc + j * kLanes;
      V r = sum[i][j] * alpha;
      store_as(cp, accumulate ? r + load_as<V>(cp) : r);
    }
}

// One tile of `rows` (at most MR) rows of a panel of NV vectors.
template <typename V, int MR, int NV>
inline void gemm_panel_rest(int64_t rows, int64_t k, float alpha, const float* a, int64_t a_row,
                            int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                            int64_t ldc) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return gemm_panel_rest<V, MR - 1, NV>(rows, k, alpha, a, a_row, a_col, b, ldb, accumulate, c,
                                            ldc);
  }
  gemm_tile<V, MR, NV>(k, alpha, a, a_row, a_col, b, ldb, accumulate, c, ldc);
}

template <typename V, int NV>
inline void gemm_panel(int64_t m, int64_t k, float alpha, const float* a, int64_t a_row,
                       int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                       int64_t ldc) {
  // As many rows as the registers hold: NV accumulators a row, NV for B, one for A, one spare.
  constexpr int kRegisters = sizeof(V) == 64 ? 32 : 16;
  constexpr int kRows = std::min(12, (kRegisters - NV - 2) / NV);
  // Tiles of equal height (16 rows: two of 8, not 12 and a thin 4, which waits on its loads).
  int64_t tiles = (m + kRows - 1) / kRows;
  for (int64_t i = 0; i < m;) {
    int64_t rows = (m - i + tiles - 1) / tiles;
    --tiles;
    gemm_panel_rest<V, kRows, NV>(rows, k, alpha, a + i * a_row, a_row, a_col, b, ldb, accumulate,
                                  c + i * ldc, ldc);
    i += rows;
  }
}

// C[i, j] = alpha * sum_p A(i, p) B[p, j] (+ C[i, j] when accumulating), A(i, p) = a[i * a_row +
// p * a_col]: register tiles of rows x vectors over operands that sit in L1/L2.
template <typename V>
void small_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                int64_t ldc) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kWide = sizeof(V) == 64 ? 4 : 2;  // vectors in the widest panel
  int64_t j = 0;
  for (; j + kWide * kLanes <= n; j += kWide * kLanes)
    gemm_panel<V, kWide>(m, k, alpha, a, a_row, a_col, b + j, ldb, accumulate, c + j, ldc);
  if constexpr (kWide == 4) {
    if (j + 2 * kLanes <= n) {
      gemm_panel<V, 2>(m, k, alpha, a, a_row, a_col, b + j, ldb, accumulate, c + j, ldc);
      j += 2 * kLanes;
    }
  }
  for (; j + kLanes <= n; j += kLanes)
    gemm_panel<V, 1>(m, k, alpha, a, a_row, a_col, b + j, ldb, accumulate, c + j, ldc);
  if constexpr (kLanes > 8) {  // 8 columns left (a head of 8): half a vector
    if (j + 8 <= n) {
      gemm_panel<f8, 1>(m, k, alpha, a, a_row, a_col, b + j, ldb, accumulate, c + j, ldc);
      j += 8;
    }
  }
  for (; j < n; ++j)  // the last columns, fewer than a vector
    for (int64_t i = 0; i < m; ++i) {
      float s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[i * a_row + p * a_col] * b[p * ldb + j];
      c[i * ldc + j] = alpha * s + (accumulate ? c[i * ldc + j] : 0.0f);
    }
}

}  // namespace GRAPHTRAIN_VEC_ISA
}  // namespace graphtrain::cpu::vec
