#include "kernels/cpu/vec_dispatch.h"

#include "kernels/cpu/vec_dispatch_impl.h"

namespace graphtrain::cpu {

#if defined(__x86_64__)
namespace avx512 {  // vec_dispatch_avx512.cc
void apply(VecOp op, const float* a, const float* b, float* y, int64_t n);
void add_apply(VecOp op, const float* a, const float* b, float* sum, float* y, int64_t n);
void gelu_grad_from_output(bool tanh, const float* dy, const float* x, const float* y, float* out,
                           int64_t n);
void gelu_with_derivative(bool tanh, const float* a, const float* b, float* sum, float* y, float* d,
                          int64_t n);
void silu_mul_grad(const float* dy, const float* g, const float* u, float* dg, float* du,
                   int64_t n);
float exp_sum(const float* x, float* y, int64_t n, float shift, float scale);
float cross_entropy_row(const float* x, float* g, int64_t n, int64_t label, float coef);
void attention_softmax_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                         int64_t causal_row0, float* lse);
void attention_exp_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                     int64_t causal_row0, const float* lse);
void attention_grad_t(const float* p, float* ds, int64_t cols, const float* d);
bool layer_norm_rows(const LayerNormRows& a, int64_t r0, int64_t r1);
bool layer_norm_grad_rows(const LayerNormGradRows& a, int64_t r0, int64_t r1);
void softmax_row(const float* x, const float* m, bool m_runs, float scale, float* y, int64_t n);
void softmax_grad_row(const float* dy, const float* y, float scale, float* dx, int64_t n);
void small_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);
}  // namespace avx512

bool vec_uses_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return yes;
}
#else
bool vec_uses_avx512() {
  return false;
}
#endif

void vec_apply(VecOp op, const float* a, const float* b, float* y, int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::apply(op, a, b, y, n);
#endif
  vec::apply<vec::f8>(op, a, b, y, n);
}

void vec_add_apply(VecOp op, const float* a, const float* b, float* sum, float* y, int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::add_apply(op, a, b, sum, y, n);
#endif
  vec::add_apply<vec::f8>(op, a, b, sum, y, n);
}

void vec_gelu_grad_from_output(bool tanh, const float* dy, const float* x, const float* y,
                               float* out, int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::gelu_grad_from_output(tanh, dy, x, y, out, n);
#endif
  vec::gelu_grad_from_output<vec::f8>(tanh, dy, x, y, out, n);
}

void vec_silu_mul_grad(const float* dy, const float* g, const float* u, float* dg, float* du,
                       int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::silu_mul_grad(dy, g, u, dg, du, n);
#endif
  vec::silu_mul_grad<vec::f8>(dy, g, u, dg, du, n);
}

void vec_gelu_with_derivative(bool tanh, const float* a, const float* b, float* sum, float* y,
                              float* d, int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::gelu_with_derivative(tanh, a, b, sum, y, d, n);
#endif
  vec::gelu_with_derivative<vec::f8>(tanh, a, b, sum, y, d, n);
}

float vec_exp_sum(const float* x, float* y, int64_t n, float shift, float scale) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::exp_sum(x, y, n, shift, scale);
#endif
  return vec::exp_sum<vec::f8>(x, y, n, shift, scale);
}

float vec_cross_entropy_row(const float* x, float* g, int64_t n, int64_t label, float coef) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::cross_entropy_row(x, g, n, label, coef);
#endif
  return vec::cross_entropy_row<vec::f8>(x, g, n, label, coef);
}

void vec_attention_softmax_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                             int64_t causal_row0, float* lse) {
#if defined(__x86_64__)
  if (vec_uses_avx512())
    return avx512::attention_softmax_t(t, cols, rows, m, ld_m, causal_row0, lse);
#endif
  vec::attention_softmax_t<vec::f8>(t, cols, rows, m, ld_m, causal_row0, lse);
}

void vec_attention_exp_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                         int64_t causal_row0, const float* lse) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::attention_exp_t(t, cols, rows, m, ld_m, causal_row0, lse);
#endif
  vec::attention_exp_t<vec::f8>(t, cols, rows, m, ld_m, causal_row0, lse);
}

void vec_attention_grad_t(const float* p, float* ds, int64_t cols, const float* d) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::attention_grad_t(p, ds, cols, d);
#endif
  vec::attention_grad_t<vec::f8>(p, ds, cols, d);
}

bool vec_layer_norm_rows(const LayerNormRows& a, int64_t r0, int64_t r1) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::layer_norm_rows(a, r0, r1);
#endif
  return vec::layer_norm_rows<vec::f8>(a, r0, r1);
}

bool vec_layer_norm_grad_rows(const LayerNormGradRows& a, int64_t r0, int64_t r1) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::layer_norm_grad_rows(a, r0, r1);
#endif
  return vec::layer_norm_grad_rows<vec::f8>(a, r0, r1);
}

void vec_softmax_row(const float* x, const float* m, bool m_runs, float scale, float* y,
                     int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::softmax_row(x, m, m_runs, scale, y, n);
#endif
  vec::softmax_row<vec::f8>(x, m, m_runs, scale, y, n);
}

void vec_softmax_grad_row(const float* dy, const float* y, float scale, float* dx, int64_t n) {
#if defined(__x86_64__)
  if (vec_uses_avx512()) return avx512::softmax_grad_row(dy, y, scale, dx, n);
#endif
  vec::softmax_grad_row<vec::f8>(dy, y, scale, dx, n);
}

void vec_small_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                    int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                    int64_t ldc) {
#if defined(__x86_64__)
  if (vec_uses_avx512())
    return avx512::small_gemm(m, n, k, alpha, a, a_row, a_col, b, ldb, accumulate, c, ldc);
#endif
  vec::small_gemm<vec::f8>(m, n, k, alpha, a, a_row, a_col, b, ldb, accumulate, c, ldc);
}

}  // namespace graphtrain::cpu
