// Single-precision matrix multiply on the BLAS library (pinned to one thread), parallelized by
// graphtrain's pool over row blocks.
#pragma once

#include <cstdint>

#include "graphtrain/ops.h"

namespace graphtrain::cpu {

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major; op(A) is [M,K], op(B) is [K,N].
void sgemm(KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc);
// The same on the calling thread only (inside a parallel loop).
void sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc);

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols.
void transpose_matrix(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst,
                      int64_t ld_dst);

}  // namespace graphtrain::cpu
