// vec_dispatch.h's loops on 16 lanes, compiled with AVX-512 (CMakeLists.txt sets the flags for
// this file alone); called only where the CPU has it.
#if defined(__x86_64__)
#define GRAPHTRAIN_VEC_ISA avx512
#include "kernels/cpu/vec_dispatch_impl.h"

namespace graphtrain::cpu::avx512 {

void apply(VecOp op, const float* a, const float* b, float* y, int64_t n) {
  vec::apply<vec::f16>(op, a, b, y, n);
}

void add_apply(VecOp op, const float* a, const float* b, float* sum, float* y, int64_t n) {
  vec::add_apply<vec::f16>(op, a, b, sum, y, n);
}

void gelu_grad_from_output(bool tanh, const float* dy, const float* x, const float* y, float* out,
                           int64_t n) {
  vec::gelu_grad_from_output<vec::f16>(tanh, dy, x, y, out, n);
}

void gelu_with_derivative(bool tanh, const float* a, const float* b, float* sum, float* y, float* d,
                          int64_t n) {
  vec::gelu_with_derivative<vec::f16>(tanh, a, b, sum, y, d, n);
}

void silu_mul_grad(const float* dy, const float* g, const float* u, float* dg, float* du,
                   int64_t n) {
  vec::silu_mul_grad<vec::f16>(dy, g, u, dg, du, n);
}

float exp_sum(const float* x, float* y, int64_t n, float shift, float scale) {
  return vec::exp_sum<vec::f16>(x, y, n, shift, scale);
}

float cross_entropy_row(const float* x, float* g, int64_t n, int64_t label, float coef) {
  return vec::cross_entropy_row<vec::f16>(x, g, n, label, coef);
}

void attention_softmax_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                         int64_t causal_row0, float* lse) {
  vec::attention_softmax_t<vec::f16>(t, cols, rows, m, ld_m, causal_row0, lse);
}

void attention_exp_t(float* t, int64_t cols, int64_t rows, const float* m, int64_t ld_m,
                     int64_t causal_row0, const float* lse) {
  vec::attention_exp_t<vec::f16>(t, cols, rows, m, ld_m, causal_row0, lse);
}

void attention_grad_t(const float* p, float* ds, int64_t cols, const float* d) {
  vec::attention_grad_t<vec::f16>(p, ds, cols, d);
}

bool layer_norm_rows(const LayerNormRows& a, int64_t r0, int64_t r1) {
  return vec::layer_norm_rows<vec::f16>(a, r0, r1);
}

bool layer_norm_grad_rows(const LayerNormGradRows& a, int64_t r0, int64_t r1) {
  return vec::layer_norm_grad_rows<vec::f16>(a, r0, r1);
}

void softmax_row(const float* x, const float* m, bool m_runs, float scale, float* y, int64_t n) {
  vec::softmax_row<vec::f16>(x, m, m_runs, scale, y, n);
}

void softmax_grad_row(const float* dy, const float* y, float scale, float* dx, int64_t n) {
  vec::softmax_grad_row<vec::f16>(dy, y, scale, dx, n);
}

void small_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                int64_t ldc) {
  vec::small_gemm<vec::f16>(m, n, k, alpha, a, a_row, a_col, b, ldb, accumulate, c, ldc);
}

}  // namespace graphtrain::cpu::avx512
#endif
