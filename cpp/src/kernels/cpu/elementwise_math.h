// The formulas of the float elementwise ops, once: each is callable on one float and on 8 lanes
// (vec::f8), and both the single-op kernels (elementwise.cc) and FusedElementwise
// (fused_elementwise.cc) use them, so a fused graph computes what the unfused one computes.
#pragma once

#include <cmath>

#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu::math {
inline namespace GRAPHTRAIN_VEC_ISA {

inline constexpr auto sigmoid = [](auto x) { return 1.0f / (1.0f + vec::exp(-x)); };
inline constexpr auto relu = [](auto x) { return x > 0.0f ? x : decltype(x){}; };
inline constexpr auto gelu_erf = [](auto x) {
  return 0.5f * x * (1.0f + vec::erf(x * 0.70710678118654752f));
};
inline constexpr auto gelu_tanh = [](auto x) {
  const float k = 0.79788456080286536f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + vec::tanh(k * (x + 0.044715f * x * x * x)));
};

// Gradients: g is dY; y the forward output, x the forward input.
inline constexpr auto relu_grad = [](auto g, auto y) { return y > 0.0f ? g : decltype(g){}; };
inline constexpr auto sigmoid_grad = [](auto g, auto y) { return g * y * (1.0f - y); };
inline constexpr auto tanh_grad = [](auto g, auto y) { return g * (1.0f - y * y); };
inline constexpr auto gelu_erf_grad = [](auto g, auto x) {
  auto e = vec::exp(-0.5f * x * x);  // serves the erf and the density
  auto cdf = 0.5f * (1.0f + vec::erf_given_exp(x * 0.70710678118654752f, e));
  return g * (cdf + x * e * 0.39894228040143268f);
};
inline constexpr auto gelu_tanh_grad = [](auto g, auto x) {
  const float k = 0.79788456080286536f, c = 0.044715f;
  auto t = vec::tanh(k * (x + c * x * x * x));
  return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x));
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
