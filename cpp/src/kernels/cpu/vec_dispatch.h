// The transcendental elementwise loops (exp, erf, tanh and the activations built on them), on the
// widest float vectors the CPU has: 16 lanes where it has AVX-512 (chosen at run time, so one
// build runs on AVX2 machines too), 8 otherwise. Results are the same formulas either way.
#pragma once

#include <cstdint>

namespace graphtrain::cpu {

enum class VecOp {
  kExp,
  kTanh,
  kErf,
  kSigmoid,
  kGelu,
  kGeluTanh,
  // two inputs (dY, X)
  kGeluGrad,
  kGeluTanhGrad,
  // two inputs (G, U): silu(G) * U
  kSiluMul,
  kSilu,  // silu(a) = a * sigmoid(a): SiluMul without U
};

// y[i] = op(a[i]) or op(a[i], b[i]) for i < n.
void vec_apply(VecOp op, const float* a, const float* b, float* y, int64_t n);

// sum[i] = a[i] + b[i] and y[i] = op(sum[i]) for i < n (op takes one input): what an Add and then
// op compute, the GELU of a bias add in one pass over the data.
void vec_add_apply(VecOp op, const float* a, const float* b, float* sum, float* y, int64_t n);

// y[i] = GELU(s) and d[i] = GELU'(s) for s = a[i] + b[i] (b not null) or a[i], and sum[i] = s
// where sum is not null (erf form, or tanh with `tanh`): graphtrain::Gelu's forward with its
// derivative (math::gelu_*_with_derivative), a bias add before it in the same pass.
void vec_gelu_with_derivative(bool tanh, const float* a, const float* b, float* sum, float* y,
                              float* d, int64_t n);

// out[i] = GeluGrad(dy[i], x[i]) from the forward's output y[i] = GELU(x[i]) as well (erf form, or
// tanh with `tanh`): math::gelu_*_grad_from_output.
void vec_gelu_grad_from_output(bool tanh, const float* dy, const float* x, const float* y,
                               float* out, int64_t n);

// The gradient of y = silu(g) * u (VecOp::kSiluMul; u null: 1, VecOp::kSilu) for i < n, the
// sigmoid computed again from g:
// du[i] = dy silu(g) and dg[i] = dy u s (1 + g (1 - s)), s = sigmoid(g), each where not null.
void vec_silu_mul_grad(const float* dy, const float* g, const float* u, float* dg, float* du,
                       int64_t n);

// y[i] = scale * exp(x[i] - shift) for i < n; returns the sum of exp(x[i] - shift). Every
// x[i] - shift is at most ~88 (shift the max of x, or 0 for log-probabilities): exp's overflow
// lanes are not computed.
float vec_exp_sum(const float* x, float* y, int64_t n, float shift, float scale = 1.0f);

// One row of a softmax cross-entropy: returns the log-sum-exp of x[0..n) and writes g[i] =
// coef * softmax(x)[i], less coef at `label` (the scores' gradient for the loss coef * -log
// p[label], label in [0, n)). g may be x.
float vec_cross_entropy_row(const float* x, float* g, int64_t n, int64_t label, float coef);

// Attention's tiles of scores, held transposed: t[c * 16 + r] is query row r's score for key c
// (c < cols, r < 16; rows r >= `rows` are padding), so that a row's max and sum are lane-wise
// sums down the columns, with no per-row reduction or call. Each column first gets the mask's
// column added (m[c * ld_m + r], where m is not null), then -inf on the padding rows and, with
// causal_row0 >= 0, on the rows before the key (c > causal_row0 + r).
constexpr int64_t kAttentionTileRows = 16;
// The softmax of each row, in place; lse[r] for r < rows: the row's log-sum-exp (-inf, and zero
// probabilities, for a row that sees nothing).
void vec_attention_softmax_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                             int64_t causal_row0, float* lse);
// The probabilities again from the forward's log-sum-exps: exp(score - lse[r]) (lse: 16 values).
void vec_attention_exp_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                         int64_t causal_row0, const float* lse);
// ds = p * (ds - d[r]) over a transposed tile: the scores' gradient from dP (in ds) and
// D = rowsum(dY * Y) (d: 16 values).
void vec_attention_grad_t(const float* p, float* ds, int64_t cols, const float* d);

// y = softmax(x * scale + m) over n floats; m: n values (m_runs), one value for the row, or null.
void vec_softmax_row(const float* x, const float* m, bool m_runs, float scale, float* y, int64_t n);

// dx = scale * y * (dy - sum(dy * y)) over n floats (softmax's gradient along a row).
void vec_softmax_grad_row(const float* dy, const float* y, float scale, float* dx, int64_t n);

// C[i, j] = alpha * sum_p A(i, p) B[p, j] (+ C[i, j] when accumulating) for i < m, j < n, p < k,
// with A(i, p) = a[i * a_row + p * a_col] (so A may be read transposed), B and C row-major with
// rows ldb and ldc apart. Register-tiled, for the small products of operands that sit in the
// caches (attention's per-head blocks), where a BLAS call's packing costs more than the product.
void vec_small_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                    int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                    int64_t ldc);

// LayerNormalization over rows r0..r1 of `cols` floats, each row held in registers (one read of
// it): y = (x - mean) / sqrt(var + eps) * gamma (+ beta), mean and inv = 1 / sqrt(var + eps) per
// row where not null. With res, x + res (+ add, a bias over the row) is normalized and written to
// sum (AddLayerNormalization). With rms, the mean is taken as 0 (RMSNormalization: x / sqrt(mean
// of x^2 + eps) * gamma). Returns false, doing nothing, for a row width it has no register form of
// (not a multiple of the vector width, or over 16 vectors): the caller loops itself.
struct LayerNormRows {
  const float* x = nullptr;
  const float* res = nullptr;
  const float* add = nullptr;
  float* sum = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float eps = 1e-5f;
  float* y = nullptr;
  float* mean = nullptr;
  float* inv = nullptr;
  int64_t cols = 0;
  bool rms = false;
};
bool vec_layer_norm_rows(const LayerNormRows& a, int64_t r0, int64_t r1);

// LayerNormalization's gradient over rows r0..r1, each row in registers: dx = inv * (dy * w -
// mean(dy * w) - xhat * mean(dy * w * xhat)) (+ res, a gradient to add) where dx is not null, and
// dw[c] += dy * xhat, db[c] += dy (float partial sums the caller adds up). With rms
// (RMSNormalization's gradient) the mean is 0 and the mean(dy * w) term and db go: dx = inv *
// (dy * w - xhat * mean(dy * w * xhat)). Returns false, doing nothing, for a row width it has no
// register form of (over 8 vectors).
struct LayerNormGradRows {
  const float* dy = nullptr;
  const float* x = nullptr;
  const float* w = nullptr;
  const float* mean = nullptr;
  const float* inv = nullptr;
  const float* res = nullptr;
  float* dx = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  int64_t cols = 0;
  bool rms = false;
};
bool vec_layer_norm_grad_rows(const LayerNormGradRows& a, int64_t r0, int64_t r1);

// Whether vec_apply runs on AVX-512 here.
bool vec_uses_avx512();

}  // namespace graphtrain::cpu
