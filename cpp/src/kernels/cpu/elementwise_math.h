// The formulas of the float elementwise ops, once: each is callable on one float and on 8 lanes
// (vec::f8), and both the single-op kernels (elementwise.cc) and FusedElementwise
// (fused_elementwise.cc) use them, so a fused graph computes what the unfused one computes.
#pragma once

#include <cmath>
#include <utility>

#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu::math {
inline namespace GRAPHTRAIN_VEC_ISA {

inline constexpr auto sigmoid = [](auto x) { return 1.0f / (1.0f + vec::exp(-x)); };
inline constexpr auto relu = [](auto x) { return x > 0.0f ? x : decltype(x){}; };
// GELU: x Phi(x). Phi = (1 + erf(x / sqrt 2)) / 2, its tail taken directly from erfc's
// approximation (abs error 1.5e-7, so GELU's relative error stays near float rounding). The tanh
// approximation as x sigmoid(2u): (1 + tanh u) / 2 = 1 / (1 + e^(-2u)), one exp and one division.
template <typename F>
inline F gelu_phi_erf(F x, F exp_neg_half_x2) {
  F z = x * 0.70710678118654752f;
  F q = vec::erfc_of_abs(z < 0.0f ? -z : z, exp_neg_half_x2);  // erfc(|z|)
  return 0.5f * (x < 0.0f ? q : 2.0f - q);
}
inline constexpr auto gelu_erf = [](auto x) {
  return x * gelu_phi_erf(x, vec::exp(-0.5f * x * x));
};
inline constexpr float kGeluTanhK = 0.79788456080286536f, kGeluTanhC = 0.044715f;  // sqrt(2/pi)
inline constexpr auto gelu_tanh = [](auto x) {
  auto u2 = (2.0f * kGeluTanhK) * (x + kGeluTanhC * x * x * x);
  return x / (1.0f + vec::exp(-u2));
};

// Gradients: g is dY; y the forward output, x the forward input.
inline constexpr auto relu_grad = [](auto g, auto y) { return y > 0.0f ? g : decltype(g){}; };
inline constexpr auto sigmoid_grad = [](auto g, auto y) { return g * y * (1.0f - y); };
// A SwiGLU MLP's elementwise part, silu(g) * u = g sigmoid(g) u.
inline constexpr auto silu_mul = [](auto g, auto u) { return g * sigmoid(g) * u; };
inline constexpr auto silu = [](auto g) { return g * sigmoid(g); };
inline constexpr auto tanh_grad = [](auto g, auto y) { return g * (1.0f - y * y); };
inline constexpr auto gelu_erf_grad = [](auto g, auto x) {
  auto e = vec::exp(-0.5f * x * x);  // serves Phi and the density
  return g * (gelu_phi_erf(x, e) + x * e * 0.39894228040143268f);
};
// d/dx x s(2u) = s + 2 x s (1 - s) u', s the sigmoid.
inline constexpr auto gelu_tanh_grad = [](auto g, auto x) {
  auto x2 = x * x;
  auto s = 1.0f / (1.0f + vec::exp(-(2.0f * kGeluTanhK) * (x + kGeluTanhC * x2 * x)));
  return g * (s + x * s * (1.0f - s) * (2.0f * kGeluTanhK) * (1.0f + 3.0f * kGeluTanhC * x2));
};

// GELU and its derivative together (pass stash_gelu_derivative): the forward has the exponential
// (and erf's tail, or the tanh form's sigmoid) at hand, so the backward's gradient becomes
// dY * GELU'(x). GELU is gelu_erf's / gelu_tanh's to the bit, and for the erf form dY times the
// derivative is gelu_erf_grad's too; the tanh form's derivative takes the forward's exponential,
// whose argument rounds differently from gelu_tanh_grad's (a few ulps).
inline constexpr auto gelu_erf_with_derivative = [](auto x) {
  auto e = vec::exp(-0.5f * x * x);
  auto phi = gelu_phi_erf(x, e);
  return std::pair{x * phi, phi + x * e * 0.39894228040143268f};
};
inline constexpr auto gelu_tanh_with_derivative = [](auto x) {
  auto x2 = x * x;
  auto t = 1.0f + vec::exp(-((2.0f * kGeluTanhK) * (x + kGeluTanhC * x * x * x)));
  auto s = 1.0f / t;
  return std::pair{x / t,
                   s + x * s * (1.0f - s) * (2.0f * kGeluTanhK) * (1.0f + 3.0f * kGeluTanhC * x2)};
};

// The gradients from the forward's output y too (pass gelu_grad_from_output): GELU(x) = x Phi(x),
// so Phi(x), or the tanh form's sigmoid, is y / x (1/2 where |x| < 1e-20, 0 included).
inline constexpr auto gelu_ratio = [](auto x, auto y) {
  auto ax = x < 0.0f ? -x : x;
  return ax < 1e-20f ? decltype(x){} + 0.5f : y / x;
};
inline constexpr auto gelu_erf_grad_from_output = [](auto g, auto x, auto y) {
  return g * (gelu_ratio(x, y) + x * vec::exp(-0.5f * x * x) * 0.39894228040143268f);
};
inline constexpr auto gelu_tanh_grad_from_output = [](auto g, auto x, auto y) {
  auto s = gelu_ratio(x, y);
  return g * (s + x * s * (1.0f - s) * (2.0f * kGeluTanhK) * (1.0f + 3.0f * kGeluTanhC * (x * x)));
};

// x ** p for a constant exponent: the exponents models use are exact products or roots, as in
// torch (x*x for 2, x*x*x for 3, sqrt for 0.5, 1/x for -1, ...); std::pow otherwise.
inline float pow_scalar(float x, float p) {
  if (p == 2.0f) return x * x;
  if (p == 3.0f) return x * x * x;
  if (p == 1.0f) return x;
  if (p == 0.5f) return std::sqrt(x);
  if (p == -1.0f) return 1.0f / x;
  if (p == -0.5f) return 1.0f / std::sqrt(x);
  if (p == -2.0f) return 1.0f / (x * x);
  if (p == 0.0f) return 1.0f;
  return std::pow(x, p);
}

}  // namespace GRAPHTRAIN_VEC_ISA
}  // namespace graphtrain::cpu::math
