// CPU kernels: MatMul (numpy semantics, batched with broadcasting) and Gemm.
#include <cstring>

#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);
#ifdef GRAPHTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int);
#endif

namespace graphtrain::cpu {
namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
// oneDNN's sgemm from this many multiply-adds (m * n * k) up: 10-20% faster than OpenBLAS on the
// linear layers' shapes, slower on attention's per-head products (64 x 64 x 32), which stay on
// OpenBLAS (bench/results/gemm.md).
constexpr int64_t kDnnlMinWork = int64_t{1} << 20;
}  // namespace

void sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#ifdef GRAPHTRAIN_HAVE_DNNL
  if (m * n * k >= kDnnlMinWork) {
    // Debian's oneDNN threads with OpenMP: on one thread here (graphtrain's pool owns the
    // parallelism), and the calling thread's OpenMP setting put back after (in a PyTorch process
    // the OpenMP runtime is torch's, and this thread may be one torch runs ops on).
    int threads = omp_get_max_threads();
    if (threads != 1) omp_set_num_threads(1);
    dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c,
               ldc);
    if (threads != 1) omp_set_num_threads(threads);
    return;
  }
#endif
  cblas_sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void sgemm(KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  int threads = ctx.pool().num_threads();
  int64_t flops = m * n * k;
  if (threads <= 1 || flops < (1 << 18)) {
    sgemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m >= 8 * threads || m >= n) {
    // Row blocks of C: rows of op(A).
    int64_t block = std::max<int64_t>(8, (m + threads - 1) / threads);
    int64_t blocks = (m + block - 1) / block;
    ctx.pool().parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t bi = lo; bi < hi; ++bi) {
        int64_t r0 = bi * block, rows = std::min(block, m - r0);
        const float* ab = trans_a ? a + r0 : a + r0 * lda;
        sgemm_serial(trans_a, trans_b, rows, n, k, alpha, ab, lda, b, ldb, beta, c + r0 * ldc, ldc);
      }
    });
  } else {
    // Column blocks of C: columns of op(B).
    int64_t block = std::max<int64_t>(16, (n + threads - 1) / threads);
    int64_t blocks = (n + block - 1) / block;
    ctx.pool().parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t bi = lo; bi < hi; ++bi) {
        int64_t c0 = bi * block, cols = std::min(block, n - c0);
        const float* bb = trans_b ? b + c0 * ldb : b + c0;
        sgemm_serial(trans_a, trans_b, m, cols, k, alpha, a, lda, bb, ldb, beta, c + c0, ldc);
      }
    });
  }
}

namespace {

// MatMul, and graphtrain::FusedMatMul: alpha * op(A) @ op(B) with op a transpose of the last two
// dims when transA / transB is set (no transposed copy is made).
void matmul(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != DType::kFloat32 || b.dtype() != DType::kFloat32)
    ctx.fail("MatMul supports float32 inputs");
  if (a.rank() == 0 || b.rank() == 0) ctx.fail("inputs must have rank 1 or more");
  bool ta = ctx.node().attr_int("transA", 0) != 0, tb = ctx.node().attr_int("transB", 0) != 0;
  float alpha = ctx.node().attr_float("alpha", 1.0f);
  Shape sa = a.shape(), sb = b.shape();
  bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if ((a_vec && ta) || (b_vec && tb)) ctx.fail("transA / transB need inputs of rank 2 or more");
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  int64_t m = ta ? sa.back() : sa[sa.size() - 2], k = ta ? sa[sa.size() - 2] : sa.back();
  int64_t kb = tb ? sb.back() : sb[sb.size() - 2], n = tb ? sb[sb.size() - 2] : sb.back();
  if (kb != k) ctx.fail(str_cat("inner dimensions differ: ", k, " and ", kb));
  int64_t lda = sa.back(), ldb = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Broadcaster bc(ctx, {&ba, &bb});
  Shape out_shape = bc.out_shape();
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  Tensor& out = ctx.allocate_output(0, DType::kFloat32, out_shape);
  if (out.numel() == 0) return;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  int64_t batch = shape_numel(bc.out_shape());
  if (shape_numel(bb) == 1 && shape_numel(ba) == batch && !ta) {
    // B shared by every batch: one GEMM with the batches folded into M.
    sgemm(ctx, false, tb, batch * m, n, k, alpha, pa, lda, pb, ldb, 0.0f, po, n);
    return;
  }
  // General batched case: per-batch offsets of A and B from the broadcast.
  std::vector<int64_t> off_a(static_cast<size_t>(batch)), off_b(static_cast<size_t>(batch));
  {
    Shape ba1 = ba, bb1 = bb;
    ba1.push_back(1);
    bb1.push_back(1);
    Broadcaster rows(ctx, {&ba1, &bb1});
    int64_t off[2];
    int64_t idx = 0;
    for (int64_t r = 0; r < rows.rows(); ++r) {
      rows.offsets(r, off);
      for (int64_t i = 0; i < rows.inner(); ++i, ++idx) {
        off_a[static_cast<size_t>(idx)] = (off[0] + i * rows.inner_stride(0)) * m * k;
        off_b[static_cast<size_t>(idx)] = (off[1] + i * rows.inner_stride(1)) * k * n;
      }
    }
  }
  if (batch >= ctx.pool().num_threads() || m * n * k < (1 << 18)) {
    ctx.pool().parallel_for(batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        sgemm_serial(ta, tb, m, n, k, alpha, pa + off_a[static_cast<size_t>(i)], lda,
                     pb + off_b[static_cast<size_t>(i)], ldb, 0.0f, po + i * m * n, n);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i)
      sgemm(ctx, ta, tb, m, n, k, alpha, pa + off_a[static_cast<size_t>(i)], lda,
            pb + off_b[static_cast<size_t>(i)], ldb, 0.0f, po + i * m * n, n);
  }
}

void gemm(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.rank() != 2 || b.rank() != 2) ctx.fail("A and B must have rank 2");
  bool ta = ctx.node().attr_int("transA", 0) != 0, tb = ctx.node().attr_int("transB", 0) != 0;
  float alpha = ctx.node().attr_float("alpha", 1.0f), beta = ctx.node().attr_float("beta", 1.0f);
  int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb) ctx.fail(str_cat("inner dimensions differ: ", k, " and ", kb));
  Tensor& out = ctx.allocate_output(0, DType::kFloat32, {m, n});
  float* po = out.data<float>();
  float gemm_beta = 0.0f;
  if (ctx.has_input(2) && beta != 0.0f) {
    const Tensor& c = ctx.input(2);
    Shape target{m, n};
    Broadcaster bc(ctx, {&c.shape(), &target});
    if (bc.out_shape() != target)
      ctx.fail(str_cat("C of shape ", c.shape(), " does not broadcast to ", target));
    // out = beta * C broadcast (a bias row, most often), then the GEMM adds to it.
    const float* pc = c.data<float>();
    int64_t inner = bc.inner(), stride = bc.inner_stride(0);
    parallel_for(ctx, bc.rows(), inner, [&](int64_t lo, int64_t hi) {
      int64_t off[2];  // C's, the target's
      for (int64_t r = lo; r < hi; ++r) {
        bc.offsets(r, off);
        float* o = po + r * inner;
        for (int64_t i = 0; i < inner; ++i) o[i] = beta * pc[off[0] + i * stride];
      }
    });
    gemm_beta = 1.0f;
  }
  sgemm(ctx, ta, tb, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(), b.dim(1),
        gemm_beta, po, n);
}

const bool registered = [] {
  register_kernel("", "MatMul", {DType::kFloat32}, matmul);
  register_kernel(kGraphtrainDomain, "FusedMatMul", {DType::kFloat32}, matmul);
  register_kernel("", "Gemm", {DType::kFloat32}, gemm);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
