#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/elementwise_math.h"
#include "kernels/cpu/vec_dispatch.h"
#include "kernels/cpu/vec_dispatch_impl.h"

namespace graphtrain::cpu {
namespace {

// vec_apply and vec_exp_sum (16 lanes on an AVX-512 machine, 8 elsewhere) against the scalar
// twins of the same formulas, on lengths with and without a tail, and on values from tiny to
// overflowing, infinities and NaN.
TEST(VecDispatch, WideLoopsMatchTheScalarFormulas) {
  std::vector<float> a, b;
  for (int i = 0; i < 203; ++i) {
    a.push_back(std::sin(0.7f * i) * (i % 7 == 0 ? 40.0f : 3.0f));
    b.push_back(std::cos(0.3f * i));
  }
  a[5] = std::numeric_limits<float>::infinity();
  a[6] = -std::numeric_limits<float>::infinity();
  a[7] = std::numeric_limits<float>::quiet_NaN();
  a[8] = 1e-30f;
  a[9] = 100.0f;
  struct Case {
    VecOp op;
    float (*scalar)(float, float);
  };
  const Case cases[] = {
      {VecOp::kExp, [](float x, float) { return vec::exp(x); }},
      {VecOp::kTanh, [](float x, float) { return vec::tanh(x); }},
      {VecOp::kErf, [](float x, float) { return vec::erf(x); }},
      {VecOp::kSigmoid, [](float x, float) { return math::sigmoid(x); }},
      {VecOp::kGelu, [](float x, float) { return math::gelu_erf(x); }},
      {VecOp::kGeluTanh, [](float x, float) { return math::gelu_tanh(x); }},
      {VecOp::kGeluGrad, [](float g, float x) { return math::gelu_erf_grad(g, x); }},
      {VecOp::kGeluTanhGrad, [](float g, float x) { return math::gelu_tanh_grad(g, x); }},
  };
  for (int64_t n : {203, 32, 7}) {
    for (const Case& c : cases) {
      std::vector<float> y(static_cast<size_t>(n));
      vec_apply(c.op, a.data(), b.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        float want = c.scalar(a[i], b[i]);
        if (std::isnan(want) || std::isinf(want)) {
          EXPECT_EQ(std::isnan(y[i]), std::isnan(want)) << static_cast<int>(c.op) << " at " << i;
          if (std::isinf(want)) {
            EXPECT_EQ(y[i], want) << static_cast<int>(c.op) << " at " << i;
          }
          continue;
        }
        EXPECT_NEAR(y[i], want, 2e-6f * std::max(1.0f, std::fabs(want)))
            << "op " << static_cast<int>(c.op) << " x " << a[i] << " avx512 " << vec_uses_avx512();
      }
    }
  }
  std::vector<float> x(a.begin() + 10, a.end()), y(x.size());
  float sum = vec_exp_sum(x.data(), y.data(), static_cast<int64_t>(x.size()), 3.0f, 0.5f);
  double want = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    float e = vec::exp(x[i] - 3.0f);
    want += e;
    EXPECT_NEAR(y[i], 0.5f * e, 2e-6f * std::max(1.0f, e));
  }
  EXPECT_NEAR(sum, want, 1e-5 * want);

  // GeluGrad from the GELU's output: the scalar twin on every lane, and the gradient from X alone
  // within float rounding (0, a tiny X, infinities and NaN included).
  for (bool tanh : {false, true}) {
    std::vector<float> y(a.size()), d(a.size()), d_x(a.size());
    for (size_t i = 0; i < a.size(); ++i)
      y[i] = tanh ? math::gelu_tanh(a[i]) : math::gelu_erf(a[i]);
    std::vector<float> x = a;
    x[11] = 0.0f;
    x[12] = 1e-25f;
    y[11] = 0.0f;
    y[12] = 5e-26f;
    const int64_t n = static_cast<int64_t>(x.size());
    vec_gelu_grad_from_output(tanh, b.data(), x.data(), y.data(), d.data(), n);
    vec_apply(tanh ? VecOp::kGeluTanhGrad : VecOp::kGeluGrad, b.data(), x.data(), d_x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      float twin = tanh ? math::gelu_tanh_grad_from_output(b[i], x[i], y[i])
                        : math::gelu_erf_grad_from_output(b[i], x[i], y[i]);
      if (std::isnan(twin)) {
        EXPECT_TRUE(std::isnan(d[i])) << i;
        continue;
      }
      EXPECT_NEAR(d[i], twin, 1e-6f * std::max(1.0f, std::fabs(twin)))
          << "tanh " << tanh << " x " << x[i];
      EXPECT_NEAR(d[i], d_x[i], 2e-6f * std::max(1.0f, std::fabs(b[i])))
          << "tanh " << tanh << " x " << x[i];
    }
    EXPECT_EQ(d[11], 0.5f * b[11]);
  }

  // Shifted by the max, as softmax does: the lanes exp_nonpositive leaves out must not matter.
  // -inf and arguments below -87.34 give 0, a NaN stays NaN, a tiny positive argument (a
  // log-probability rounded up) is exp's.
  std::vector<float> z = {0.0f,   -1e-30f, 2e-7f,
                          -87.0f, -87.5f,  -200.0f,
                          -1e30f, -0.5f,   -std::numeric_limits<float>::infinity(),
                          -10.0f, -3.25f,  -60.0f,
                          -88.0f, -0.125f, -7.0f,
                          -40.0f, -1.0f,   -2.0f,
                          -86.9f, 1e-6f};
  std::vector<float> e(z.size());
  vec_exp_sum(z.data(), e.data(), static_cast<int64_t>(z.size()), 0.0f);
  for (size_t i = 0; i < z.size(); ++i)
    EXPECT_NEAR(e[i], vec::exp(z[i]), 2e-6f * std::max(1.0f, vec::exp(z[i]))) << "x " << z[i];
  EXPECT_EQ(e[5], 0.0f);
  EXPECT_EQ(e[8], 0.0f);
  z[3] = std::numeric_limits<float>::quiet_NaN();
  vec_exp_sum(z.data(), e.data(), static_cast<int64_t>(z.size()), 0.0f);
  EXPECT_TRUE(std::isnan(e[3]));
}

// GELU with its derivative (graphtrain::Gelu's forward), with a bias add and without: GELU equal to
// vec_apply's to the bit, the derivative within float rounding of the double-precision derivative
// (erf: Phi + x phi; tanh: d/dx x (1 + tanh u) / 2), dY times it of GeluGrad's result, the sum
// written where asked; lengths with and without a 16-lane tail, infinities and NaN.
TEST(VecDispatch, GeluWithDerivativeMatchesTheDerivative) {
  std::vector<float> a, b;
  for (int i = 0; i < 203; ++i) {
    a.push_back(std::sin(0.7f * i) * (i % 7 == 0 ? 9.0f : 3.0f));
    b.push_back(std::cos(0.3f * i));
  }
  a[5] = std::numeric_limits<float>::infinity();
  a[6] = -std::numeric_limits<float>::infinity();
  a[7] = std::numeric_limits<float>::quiet_NaN();
  a[8] = 0.0f;
  auto derivative = [](bool tanh, double x) {
    if (!tanh)
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
    const double k = std::sqrt(2 / M_PI), c = 0.044715, t = std::tanh(k * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
  };
  for (bool tanh : {false, true})
    for (bool biased : {false, true})
      for (int64_t n : {203, 32, 7}) {
        std::vector<float> s(n), y(n), d(n), plain(n), grad(n);
        std::vector<float> x(a.begin(), a.begin() + n);
        if (biased)
          for (int64_t i = 0; i < n; ++i) x[i] = a[i] + b[i];
        vec_gelu_with_derivative(tanh, a.data(), biased ? b.data() : nullptr,
                                 biased ? s.data() : nullptr, y.data(), d.data(), n);
        vec_apply(tanh ? VecOp::kGeluTanh : VecOp::kGelu, x.data(), nullptr, plain.data(), n);
        vec_apply(tanh ? VecOp::kGeluTanhGrad : VecOp::kGeluGrad, b.data(), x.data(), grad.data(),
                  n);
        for (int64_t i = 0; i < n; ++i) {
          SCOPED_TRACE(testing::Message() << "tanh " << tanh << " x " << x[i] << " n " << n);
          if (biased) {
            EXPECT_EQ(std::memcmp(&s[i], &x[i], sizeof(float)), 0);
          }
          if (std::isnan(plain[i])) {
            EXPECT_TRUE(std::isnan(y[i]));
          } else {
            EXPECT_EQ(y[i], plain[i]);
          }
          if (std::isinf(x[i]) || std::isnan(x[i])) continue;
          EXPECT_NEAR(d[i], derivative(tanh, x[i]), 3e-6);
          EXPECT_NEAR(b[i] * d[i], grad[i], 4e-6f * std::max(1.0f, std::fabs(grad[i])));
        }
      }
}

// exp against the C library over the float range, 1 ulp or better; results that would fall
// below FLT_MIN are 0 (the clamped lanes compute a normal float, never a subnormal one) and
// those past the overflow threshold infinity.
// vec_softmax_row (rows held in registers up to 4 vectors, then the looped form) and
// vec_softmax_grad_row against double-precision formulas: every length class, a mask that runs
// along the row, one mask value for the row, no mask, and masked-out (-inf) entries.
TEST(VecDispatch, SoftmaxRowsMatchTheFormula) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 5, 8, 16, 24, 32, 48, 64, 80, 100}) {
    std::vector<float> x(static_cast<size_t>(n)), m(x.size()), g(x.size()), y(x.size()),
        dx(x.size());
    for (int64_t i = 0; i < n; ++i) {
      x[static_cast<size_t>(i)] = std::sin(0.9f * static_cast<float>(i)) * 4.0f;
      m[static_cast<size_t>(i)] = i % 3 == 2 ? -inf : 0.25f * static_cast<float>(i % 4);
      g[static_cast<size_t>(i)] = std::cos(0.4f * static_cast<float>(i));
    }
    for (int mode = 0; mode < 3; ++mode) {  // mask along the row, one value, none
      const float scale = 0.35f;
      const float* mp = mode == 2 ? nullptr : m.data();
      vec_softmax_row(x.data(), mp, mode == 0, scale, y.data(), n);
      std::vector<double> z(x.size());
      double mx = -inf, sum = 0;
      for (size_t i = 0; i < z.size(); ++i) {
        z[i] = x[i] * double{scale} + (mode == 0 ? m[i] : mode == 1 ? m[0] : 0.0);
        mx = std::max(mx, z[i]);
      }
      for (double& v : z) sum += v = std::exp(v - mx);
      double dot = 0;
      for (size_t i = 0; i < z.size(); ++i) {
        EXPECT_NEAR(y[i], z[i] / sum, 2e-7) << "n " << n << " mode " << mode << " i " << i;
        dot += g[i] * double{y[i]};
      }
      vec_softmax_grad_row(g.data(), y.data(), scale, dx.data(), n);
      for (size_t i = 0; i < z.size(); ++i)
        EXPECT_NEAR(dx[i], scale * y[i] * (g[i] - dot), 1e-6) << "n " << n << " i " << i;
    }
  }
}

TEST(VecDispatch, SmallGemmMatchesTheProduct) {
  // Every panel width and row remainder: n over 1..4 vectors of either width plus a ragged tail,
  // m past one register tile, A read as stored and transposed, C written and accumulated into.
  for (int64_t m : {1, 5, 13, 64})
    for (int64_t n : {3, 8, 16, 32, 40, 64, 77})
      for (int64_t k : {1, 32, 64})
        for (int mode = 0; mode < 4; ++mode) {
          bool trans = mode & 1, accumulate = mode & 2;
          std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * (n + 3)));
          std::vector<float> c(static_cast<size_t>(m * (n + 5)));
          for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.7f * static_cast<float>(i));
          for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.3f * static_cast<float>(i));
          for (size_t i = 0; i < c.size(); ++i) c[i] = 0.5f - 0.01f * static_cast<float>(i % 97);
          std::vector<float> c0 = c;
          int64_t a_row = trans ? 1 : k, a_col = trans ? m : 1;
          const float alpha = 0.75f;
          vec_small_gemm(m, n, k, alpha, a.data(), a_row, a_col, b.data(), n + 3, accumulate,
                         c.data(), n + 5);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n + 5; ++j) {
              size_t at = static_cast<size_t>(i * (n + 5) + j);
              if (j >= n) {  // past the columns: untouched
                ASSERT_EQ(c[at], c0[at]);
                continue;
              }
              double s = 0;
              for (int64_t p = 0; p < k; ++p)
                s += double{a[static_cast<size_t>(i * a_row + p * a_col)]} *
                     b[static_cast<size_t>(p * (n + 3) + j)];
              double want = alpha * s + (accumulate ? c0[at] : 0.0);
              ASSERT_NEAR(c[at], want, 1e-5 * (1 + std::abs(want)))
                  << "m " << m << " n " << n << " k " << k << " mode " << mode << " at " << i << ","
                  << j;
            }
        }
}

// Attention's transposed tiles (t[c * 16 + r]: row r, key c), on the dispatched loops (16 lanes
// here) and on the 8-lane ones an AVX2 machine runs, against double-precision formulas: a full
// tile and one with padding rows, with and without a mask and causal hiding, and a row that sees
// nothing (zeros, lse -inf). Then the probabilities again from the lse, and dS.
TEST(VecDispatch, AttentionTilesMatchTheFormulas) {
  const float inf = std::numeric_limits<float>::infinity();
  constexpr int64_t R = kAttentionTileRows;
  const int64_t cols = 37, ld_m = 24;
  std::vector<float> scores(static_cast<size_t>(cols * R)), mask(static_cast<size_t>(cols * ld_m));
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = 3.0f * std::sin(0.37f * i);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < ld_m; ++r)
      mask[static_cast<size_t>(c * ld_m + r)] = r == 3 ? -inf
                                                : (c + r) % 5 == 0
                                                    ? -inf
                                                    : 0.1f * static_cast<float>((c * r) % 7);
  using Fn = void (*)(float*, int64_t, int64_t, const float*, int64_t, int64_t, float*);
  using ExpFn = void (*)(float*, int64_t, int64_t, const float*, int64_t, int64_t, const float*);
  struct Impl {
    const char* name;
    Fn softmax;
    ExpFn exp;
    void (*grad)(const float*, float*, int64_t, const float*);
  };
  const Impl impls[] = {
      {"dispatched", vec_attention_softmax_t, vec_attention_exp_t, vec_attention_grad_t},
      {"8 lanes", vec::attention_softmax_t<vec::f8>, vec::attention_exp_t<vec::f8>,
       vec::attention_grad_t<vec::f8>}};
  for (const Impl& impl : impls)
    for (int64_t rows : {R, int64_t{11}})
      for (bool masked : {false, true})
        for (int64_t causal_row0 : {int64_t{-1}, int64_t{0}, int64_t{9}}) {
          std::vector<float> t = scores, lse(R, 0.0f);
          const float* m = masked ? mask.data() : nullptr;
          impl.softmax(t.data(), cols, rows, m, ld_m, causal_row0, lse.data());
          std::vector<float> p = t, again = scores;
          impl.exp(again.data(), cols, rows, m, ld_m, causal_row0, lse.data());
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<double> z(static_cast<size_t>(cols));
            double mx = -inf, sum = 0;
            for (int64_t c = 0; c < cols; ++c) {
              double v = scores[static_cast<size_t>(c * R + r)] +
                         (masked ? mask[static_cast<size_t>(c * ld_m + r)] : 0.0f);
              if (causal_row0 >= 0 && c > causal_row0 + r) v = -inf;
              z[static_cast<size_t>(c)] = v;
              mx = std::max(mx, v);
            }
            if (mx == -inf) {  // sees nothing: row 3 under the mask
              EXPECT_EQ(lse[static_cast<size_t>(r)], -inf) << impl.name << " row " << r;
              for (int64_t c = 0; c < cols; ++c) {
                EXPECT_EQ(p[static_cast<size_t>(c * R + r)], 0.0f);
                EXPECT_EQ(again[static_cast<size_t>(c * R + r)], 0.0f);
              }
              continue;
            }
            for (double& v : z) sum += v = std::exp(v - mx);
            EXPECT_NEAR(lse[static_cast<size_t>(r)], mx + std::log(sum), 1e-5) << impl.name;
            for (int64_t c = 0; c < cols; ++c) {
              size_t at = static_cast<size_t>(c * R + r);
              EXPECT_NEAR(p[at], z[static_cast<size_t>(c)] / sum, 2e-7)
                  << impl.name << " rows " << rows << " mask " << masked << " causal "
                  << causal_row0 << " at " << r << "," << c;
              EXPECT_NEAR(again[at], p[at], 1e-6) << impl.name << " at " << r << "," << c;
            }
          }
          for (int64_t r = rows; r < R; ++r)  // padding rows: zero probabilities
            for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(p[static_cast<size_t>(c * R + r)], 0.0f);
          std::vector<float> ds(t.size()), d(R);
          for (size_t i = 0; i < ds.size(); ++i) ds[i] = std::cos(0.21f * i);
          for (int64_t r = 0; r < R; ++r) d[static_cast<size_t>(r)] = 0.1f * r;
          std::vector<float> ds0 = ds;
          impl.grad(p.data(), ds.data(), cols, d.data());
          for (size_t i = 0; i < ds.size(); ++i)
            ASSERT_FLOAT_EQ(ds[i], p[i] * (ds0[i] - d[i % R])) << impl.name << " at " << i;
        }
}

// LayerNormalization's rows in registers (AddLayerNormalization's sum included) and its
// gradient (a residual gradient added), dispatched and on 8 lanes, against double-precision
// formulas; a width with no register form is refused (false) and left untouched.
TEST(VecDispatch, LayerNormRowsMatchTheFormulas) {
  using Rows = bool (*)(const LayerNormRows&, int64_t, int64_t);
  using GradRows = bool (*)(const LayerNormGradRows&, int64_t, int64_t);
  const struct {
    const char* name;
    Rows rows;
    GradRows grad;
    int64_t lanes;
  } impls[] = {
      {"dispatched", vec_layer_norm_rows, vec_layer_norm_grad_rows, vec_uses_avx512() ? 16 : 8},
      {"8 lanes", vec::layer_norm_rows<vec::f8>, vec::layer_norm_grad_rows<vec::f8>, 8}};
  const int64_t n = 5;
  for (const auto& impl : impls)
    for (int64_t k : {1, 2, 4, 8, 16, 17}) {
      const int64_t cols = k * impl.lanes;
      auto wave = [](int64_t size, float f, float scale, float shift) {
        std::vector<float> v(static_cast<size_t>(size));
        for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(f * i) + shift;
        return v;
      };
      std::vector<float> x = wave(n * cols, 0.37f, 2.0f, 0.5f), res = wave(n * cols, 0.11f, 1, 0);
      std::vector<float> add = wave(cols, 0.9f, 0.3f, 0), gamma = wave(cols, 0.23f, 0.5f, 1);
      std::vector<float> beta = wave(cols, 0.71f, 0.2f, 0), dy = wave(n * cols, 0.53f, 1, 0);
      for (bool residual : {false, true}) {
        std::vector<float> y(x.size(), -7.0f), sum(x.size()), mean(n), inv(n);
        LayerNormRows a{x.data(),
                        residual ? res.data() : nullptr,
                        residual ? add.data() : nullptr,
                        sum.data(),
                        gamma.data(),
                        residual ? nullptr : beta.data(),
                        1e-5f,
                        y.data(),
                        mean.data(),
                        inv.data(),
                        cols};
        bool done = impl.rows(a, 0, n);
        ASSERT_EQ(done, k <= (impl.lanes == 16 ? 16 : 8)) << impl.name << " cols " << cols;
        if (!done) {
          EXPECT_EQ(y[0], -7.0f);
          continue;
        }
        std::vector<double> xs(static_cast<size_t>(cols));
        for (int64_t r = 0; r < n; ++r) {
          double mu = 0, var = 0;
          for (int64_t c = 0; c < cols; ++c) {
            size_t i = static_cast<size_t>(r * cols + c);
            xs[static_cast<size_t>(c)] = residual ? double{x[i]} + res[i] + add[c] : x[i];
            if (residual) {
              EXPECT_NEAR(sum[i], xs[static_cast<size_t>(c)], 1e-6);
            }
            mu += xs[static_cast<size_t>(c)];
          }
          mu /= cols;
          for (double v : xs) var += (v - mu) * (v - mu);
          double iv = 1 / std::sqrt(var / cols + 1e-5);
          EXPECT_NEAR(mean[r], mu, 1e-6) << impl.name << " cols " << cols;
          EXPECT_NEAR(inv[r], iv, 1e-5 * iv);
          for (int64_t c = 0; c < cols; ++c) {
            double want =
                (xs[static_cast<size_t>(c)] - mu) * iv * gamma[c] + (residual ? 0 : beta[c]);
            EXPECT_NEAR(y[static_cast<size_t>(r * cols + c)], want, 2e-5)
                << impl.name << " cols " << cols << " at " << r << "," << c;
          }
        }
        // The gradient at the same rows (x, or the residual sum), with a gradient to add.
        const float* xin = residual ? sum.data() : x.data();
        std::vector<float> dx(x.size()), dw(cols, 0.0f), db(cols, 0.0f);
        LayerNormGradRows ga{dy.data(),   xin,        gamma.data(),
                             mean.data(), inv.data(), residual ? res.data() : nullptr,
                             dx.data(),   dw.data(),  db.data(),
                             cols};
        bool grad_done = impl.grad(ga, 0, n);
        ASSERT_EQ(grad_done, k <= (impl.lanes == 16 ? 8 : 4)) << impl.name << " cols " << cols;
        if (!grad_done) continue;
        std::vector<double> want_dw(static_cast<size_t>(cols), 0), want_db = want_dw;
        for (int64_t r = 0; r < n; ++r) {
          double sd = 0, sdx = 0;
          std::vector<double> xh(static_cast<size_t>(cols));
          for (int64_t c = 0; c < cols; ++c) {
            size_t i = static_cast<size_t>(r * cols + c);
            xh[static_cast<size_t>(c)] = (double{xin[i]} - mean[r]) * inv[r];
            sd += double{dy[i]} * gamma[c];
            sdx += double{dy[i]} * gamma[c] * xh[static_cast<size_t>(c)];
            want_dw[static_cast<size_t>(c)] += dy[i] * xh[static_cast<size_t>(c)];
            want_db[static_cast<size_t>(c)] += dy[i];
          }
          for (int64_t c = 0; c < cols; ++c) {
            size_t i = static_cast<size_t>(r * cols + c);
            double want = inv[r] * (double{dy[i]} * gamma[c] - sd / cols -
                                    xh[static_cast<size_t>(c)] * sdx / cols) +
                          (residual ? res[i] : 0.0);
            EXPECT_NEAR(dx[i], want, 1e-4) << impl.name << " cols " << cols << " at " << i;
          }
        }
        for (int64_t c = 0; c < cols; ++c) {
          EXPECT_NEAR(dw[c], want_dw[static_cast<size_t>(c)], 1e-4) << impl.name;
          EXPECT_NEAR(db[c], want_db[static_cast<size_t>(c)], 1e-4) << impl.name;
        }
      }
    }
}

TEST(VecMath, ExpWithinOneUlp) {
  auto ulps = [](float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    return std::abs(ia - ib);
  };
  int worst = 0;
  for (float x = -87.33f; x < 88.37f; x += 0.0037f + std::fabs(x) * 1e-4f) {
    float want = static_cast<float>(std::exp(static_cast<double>(x)));
    vec::f8 v = vec::exp(vec::splat(x));
    worst = std::max({worst, ulps(vec::exp(x), want), ulps(v[3], want)});
  }
  EXPECT_LE(worst, 1);
  for (float x : {-87.34f, -88.0f, -200.0f, -std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(vec::exp(x), 0.0f) << x;
    EXPECT_EQ(vec::exp(vec::splat(x))[0], 0.0f) << x;
  }
  EXPECT_EQ(vec::exp(88.4f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(vec::exp(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace graphtrain::cpu
