// The loops of vec_dispatch.h for one vector type V, included by vec_dispatch.cc (8 lanes) and
// vec_dispatch_avx512.cc (16 lanes, in its own GRAPHTRAIN_VEC_ISA namespace).
#pragma once

#include <algorithm>

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
  float s = lanes_sum(acc);
  for (; i < n; ++i) {
    float e = exp(x[i] - shift);
    s += e;
    y[i] = e * scale;
  }
  return s;
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
    z[k] = exp(z[k] - mx);
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
