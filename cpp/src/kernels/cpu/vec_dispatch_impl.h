// The loops of vec_dispatch.h for one vector type V, included by vec_dispatch.cc (8 lanes) and
// vec_dispatch_avx512.cc (16 lanes, in its own GRAPHTRAIN_VEC_ISA namespace).
#pragma once

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

template <typename V>
void apply(VecOp op, const float* a, const float* b, float* y, int64_t n) {
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
  }
}

template <typename V>
float exp_sum(const float* x, float* y, int64_t n, float shift, float scale) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V acc{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch(x + i);
    V e = exp(load_as<V>(x + i) - shift);
    acc += e;
    store_as(y + i, e * scale);
  }
  float s = 0;
  for (int64_t k = 0; k < kLanes; ++k) s += acc[k];
  for (; i < n; ++i) {
    float e = exp(x[i] - shift);
    s += e;
    y[i] = e * scale;
  }
  return s;
}

}  // namespace GRAPHTRAIN_VEC_ISA
}  // namespace graphtrain::cpu::vec
