// Vectorized float math for the CPU kernels, written with GCC/Clang vector extensions (f8: 8
// lanes, AVX2 registers on x86-64-v3, two NEON registers on Arm; the math functions take any
// float vector type, and vec_dispatch.cc runs them on 16 lanes where the CPU has AVX-512). Each
// function has a scalar twin computing the same formula, used for loop tails, so a result never
// depends on its position.
//
// Everything here is in the inline namespace GRAPHTRAIN_VEC_ISA: the translation unit built for
// AVX-512 names it differently, so its copies of these inline functions (compiled with AVX-512
// instructions) are never merged with, or chosen by the linker for, everybody else's.
//
// exp: Cody-Waite range reduction and a degree-6 polynomial (the classic Cephes coefficients),
// within 2 ulp over the float range. erf: a Maclaurin polynomial near 0 and Abramowitz & Stegun
// 7.1.26 elsewhere (relative error under 3e-7). tanh: an odd
// polynomial near 0 and 1 - 2 / (exp(2x) + 1) elsewhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef GRAPHTRAIN_VEC_ISA
#define GRAPHTRAIN_VEC_ISA base
#endif

namespace graphtrain::cpu::vec {
inline namespace GRAPHTRAIN_VEC_ISA {

using f8 = float __attribute__((vector_size(32)));
using i8 = int32_t __attribute__((vector_size(32)));
using f16 = float __attribute__((vector_size(64)));

// The int32 vector of a float vector's width.
template <typename F>
struct IntVec {
  typedef int32_t type __attribute__((vector_size(sizeof(F))));
};
template <>
struct IntVec<float> {
  using type = int32_t;
};

// Loads and stores of any vector type F.
template <typename F>
inline F load_as(const float* p) {
  F v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename F>
inline void store_as(float* p, F v) {
  std::memcpy(p, &v, sizeof(v));
}

inline f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, f8 v) {
  std::memcpy(p, &v, sizeof(v));
}
// x in every lane (`V{} + x` would add: -0 + 0 is +0, so the compiler must keep the add).
template <typename V>
inline V splat_as(float x) {
  V v{x};  // x in lane 0, zeros elsewhere: then lane 0 everywhere
  return __builtin_shuffle(v, typename IntVec<V>::type{});
}
inline f8 splat(float x) {
  return splat_as<f8>(x);
}

// Streaming loops prefetch what they read this many floats (4 KiB) ahead. A loop whose math
// limits how many of its loads are in flight outruns the hardware prefetcher: on a 2-core Intel
// Xeon VM, GeluGrad over 2 MiB fresh from memory took 1.2 ms, 0.4 ms with this. A prefetch past
// the end of an array never faults; its address is computed as an integer, since pointer
// arithmetic past the array would be undefined.
constexpr int64_t kPrefetchAhead = 1024;
inline void prefetch(const float* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) +
                                                   kPrefetchAhead * sizeof(float)));
}

// ---- exp ----
template <typename F, typename I>
inline F exp_impl(F x) {
  const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  // Below x_min the result is 0 (e^x_min is just above FLT_MIN): clamped lanes then compute a
  // normal float, never a subnormal one, which costs a microcode assist per element.
  const float x_max = 88.3762626647949f, x_min = -87.3365f;
  F xc = x > x_max ? F{} + x_max : x;
  xc = xc < x_min ? F{} + x_min : xc;
  F fn = xc * log2e;
  // Round to nearest (add and subtract 1.5 * 2^23), at most 127 so that 2^n below is a normal
  // float (the remainder r then reaches ln2 / 2 + 1e-6 at x_max, within the polynomial's range).
  fn = (fn + 12582912.0f) - 12582912.0f;
  fn = fn > 127.0f ? F{} + 127.0f : fn;
  F r = xc - fn * ln2_hi - fn * ln2_lo;
  F r2 = r * r;
  F p = F{} + (1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r2 + r + 1.0f;
  // 2^n for n = -126..127, built in the exponent bits.
  I n;
  if constexpr (sizeof(F) == sizeof(float))
    n = static_cast<I>(fn);
  else
    n = __builtin_convertvector(fn, I);
  I bits = (n + 127) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof(F));
  F y = p * scale;
  y = x > x_max ? F{} + __builtin_inff() : y;
  y = x < x_min ? F{} : y;
  y = x != x ? x : y;  // nan stays nan
  return y;
}

template <typename F>
inline F exp(F x) {
  return exp_impl<F, typename IntVec<F>::type>(x);
}
// exp of arguments at most ~88 (x - max, x - log-sum-exp: softmax, attention, cross-entropy;
// -x^2 / 2): the same results as exp, with fewer instructions where it has its own 16-lane form.
template <typename F>
inline F exp_nonpositive(F x) {
  return exp(x);
}

#if defined(__AVX512F__)
// exp on 16 lanes with AVX-512's own instructions, where the translation unit is compiled for it:
// exp_impl's formula (the same clamps, rounding, polynomial and 2^n), with vrndscaleps for the
// rounding, vscalefps for 2^n and mask moves for the special lanes: 19 instructions, not 31.
// (GCC 12 warns of the intrinsics' own undefined pass-through operands: silenced here.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// The rounded exponent fn = round(xc * log2(e)) of a clamped argument xc, and e^xc from it: the
// range reduction and polynomial of exp_impl, 2^fn by vscalefps (fn at most 127).
inline __m512 exp_exponent16(__m512 xc) {
  return _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline __m512 exp_reduced16(__m512 xc, __m512 fn) {
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, fn);
}
inline f16 exp(f16 v) {
  const __m512 x = reinterpret_cast<__m512>(v);
  const float x_max = 88.3762626647949f, x_min = -87.3365f;
  __m512 xc = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(x_max)), _mm512_set1_ps(x_min));
  __m512 y = exp_reduced16(xc, _mm512_min_ps(exp_exponent16(xc), _mm512_set1_ps(127.0f)));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(x_max), _CMP_GT_OQ),
                         _mm512_set1_ps(__builtin_inff()));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(x_min), _CMP_LT_OQ),
                         _mm512_setzero_ps());
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  // nan stays nan
  return reinterpret_cast<f16>(y);
}
// exp's 16 lanes without the lanes an argument at most x_max never needs: no overflow to
// infinity, no cap on 2^n, and no NaN lane, since a NaN passes through max (its second operand)
// and the arithmetic after it: 14 instructions, not 19.
inline f16 exp_nonpositive(f16 v) {
  const __m512 x = reinterpret_cast<__m512>(v);
  const __m512 x_min = _mm512_set1_ps(-87.3365f);
  __m512 xc = _mm512_max_ps(x_min, x);
  __m512 y = exp_reduced16(xc, exp_exponent16(xc));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x_min, _CMP_LT_OQ), _mm512_setzero_ps());
  return reinterpret_cast<f16>(y);
}
#pragma GCC diagnostic pop
#endif

// ---- erf ----
template <typename F>
inline F erf_small(F x) {  // |x| < 0.5: 2/sqrt(pi) * (x - x^3/3 + x^5/10 - ...)
  F z = x * x;
  F p = F{} + (-1.0f / 75600.0f);  // x^15 term / x: 1/(7! * 15)
  p = p * z + 1.0f / 9360.0f;      // 1/(6! * 13)
  p = p * z - 1.0f / 1320.0f;
  p = p * z + 1.0f / 216.0f;
  p = p * z - 1.0f / 42.0f;
  p = p * z + 1.0f / 10.0f;
  p = p * z - 1.0f / 3.0f;
  p = p * z + 1.0f;
  return x * p * 1.12837916709551257f;
}

// |x| >= 0.5: Abramowitz & Stegun 7.1.26, erf(|x|) = 1 - t (a1 + t (a2 + ... + t a5)) e^(-x^2),
// t = 1 / (1 + p |x|), absolute error under 1.5e-7 (relative under 3e-7 from 0.5 up); below 0.5
// the Maclaurin series keeps the relative error small near 0. Both are branch-free polynomials,
// so 8 lanes cost one exp and one division. erf_given_exp takes e^(-x^2) from the caller (GELU's
// gradient needs that exponential anyway).
template <typename F>
inline F erf_given_exp(F x, F exp_neg_x2) {
  F a = x < 0.0f ? -x : x;
  F t = 1.0f / (1.0f + 0.3275911f * a);
  F r = t * 1.061405429f - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  F y = 1.0f - r * t * exp_neg_x2;
  y = x < 0.0f ? -y : y;
  return a < 0.5f ? erf_small(x) : y;
}
inline float erf_given_exp(float x, float exp_neg_x2) {
  float a = std::fabs(x);
  if (a < 0.5f) return erf_small(x);
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float r = t * 1.061405429f - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  float y = 1.0f - r * t * exp_neg_x2;
  return x < 0.0f ? -y : y;
}

// erfc(a) for a = |z| >= 0 from the same approximation: t (a1 + ... + t a5) e^(-z^2), absolute
// error under 1.5e-7 and no cancellation where erfc is small. GELU needs only 1 +- erf(z), so it
// takes this, without erf's small-argument branch.
template <typename F>
inline F erfc_of_abs(F a, F exp_neg_z2) {
  F t = 1.0f / (1.0f + 0.3275911f * a);
  F r = t * 1.061405429f - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  return r * t * exp_neg_z2;
}

template <typename F>
inline F erf(F x) {
  return erf_given_exp(x, exp(-(x * x)));
}

// ---- tanh ----
template <typename F>
inline F tanh_small(F x) {  // |x| < 0.625 (Cephes tanhf polynomial)
  F z = x * x;
  F p = F{} + (-5.70498872745E-3f);
  p = p * z + 2.06390887954E-2f;
  p = p * z - 5.37397155531E-2f;
  p = p * z + 1.33314422036E-1f;
  p = p * z - 3.33332819422E-1f;
  return x + x * z * p;
}

template <typename F>
inline F tanh(F x) {
  F a = x < 0.0f ? -x : x;
  F big = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? tanh_small(x) : big;
}
inline float tanh(float x) {
  float a = std::fabs(x);
  if (a < 0.625f) return tanh_small(x);
  float big = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  return x < 0 ? -big : big;
}

// Applies f (callable on vector type V and on float) to n floats.
template <typename V = f8, typename F>
inline void map(const float* x, float* y, int64_t n, F f) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch(x + i);
    store_as(y + i, f(load_as<V>(x + i)));
  }
  for (; i < n; ++i) y[i] = f(x[i]);
}

// The 8 lanes added pairwise.
inline float lane_sum(f8 acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The lanes of an 8- or 16-lane vector added pairwise, and their largest.
template <typename V>
inline float lanes_sum(V v) {
  if constexpr (sizeof(V) == 64)
    return lane_sum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  else
    return lane_sum(v);
}
template <typename V>
inline float lanes_max(V v) {
  f8 m;
  if constexpr (sizeof(V) == 64) {
    f8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    f8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    m = hi > lo ? hi : lo;
  } else {
    m = v;
  }
  float r = m[0];
  for (int j = 1; j < 8; ++j) r = m[j] > r ? m[j] : r;
  return r;
}

// Reductions over n floats, 8 lanes at a time (the order of additions is fixed by n alone).
inline float sum(const float* x, int64_t n) {
  f8 acc = f8{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load(x + i);
  float s = lane_sum(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

// sum (x[i] - c)^2 and sum g[i] * (x[i] - c) over n floats, 8 lanes at a time.
inline float sum_sq_centered(const float* x, int64_t n, float c) {
  f8 acc = f8{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f8 d = load(x + i) - c;
    acc += d * d;
  }
  float s = lane_sum(acc);
  for (; i < n; ++i) s += (x[i] - c) * (x[i] - c);
  return s;
}
inline float dot_centered(const float* g, const float* x, int64_t n, float c) {
  f8 acc = f8{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load(g + i) * (load(x + i) - c);
  float s = lane_sum(acc);
  for (; i < n; ++i) s += g[i] * (x[i] - c);
  return s;
}

// The largest of n floats, NaNs ignored (like std::max(max, x) in a loop); -inf when none.
inline float max(const float* x, int64_t n) {
  // Four running maxima, so that the compares do not wait on one another.
  f8 acc = splat(-INFINITY), a1 = acc, a2 = acc, a3 = acc;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    f8 v0 = load(x + i), v1 = load(x + i + 8), v2 = load(x + i + 16), v3 = load(x + i + 24);
    acc = v0 > acc ? v0 : acc;
    a1 = v1 > a1 ? v1 : a1;
    a2 = v2 > a2 ? v2 : a2;
    a3 = v3 > a3 ? v3 : a3;
  }
  for (; i + 8 <= n; i += 8) {
    f8 v = load(x + i);
    acc = v > acc ? v : acc;
  }
  acc = a1 > acc ? a1 : acc;
  a2 = a3 > a2 ? a3 : a2;
  acc = a2 > acc ? a2 : acc;
  float m = lanes_max(acc);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace GRAPHTRAIN_VEC_ISA
}  // namespace graphtrain::cpu::vec
