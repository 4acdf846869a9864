// CPU kernels: MatMul (numpy semantics, batched with broadcasting) and Gemm.
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "graphtrain/error.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);
#ifdef GRAPHTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/dnnl_common.h"
#endif

namespace graphtrain::cpu {
namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
// oneDNN's sgemm from this many multiply-adds (m * n * k) up: 10-20% faster than OpenBLAS on the
// linear layers' shapes, slower on attention's per-head products (64 x 64 x 32), which stay on
// OpenBLAS (bench/results/gemm.md).
constexpr int64_t kDnnlMinWork = int64_t{1} << 20;
}  // namespace

#ifdef GRAPHTRAIN_HAVE_DNNL
namespace {

// x W^T (B transposed, A not: every linear layer's forward). dnnl_sgemm runs 3-15% slower on it
// than on the same product with B stored [K, N] (1024 x 512 x 128: 100-106 against 110-112
// GFLOP/s at one thread; 256 x 256 x 1024: 97 against 112). Where op(A) has enough rows to pay
// for it, sgemm copies a B of at most kPlainBMaxFloats to [K, N] first (gpt bench step at one
// thread: -0.54 ms, encoder -0.59 ms); the rest runs on oneDNN's matmul primitive, whose brgemm
// kernels read W^T in place at 110-114 GFLOP/s hot (the mlp bench model, 256 rows: -0.89 ms a
// step at one thread, -0.61 at two, against dnnl_sgemm). With 1024 rows the copy still wins in
// the step (-0.29 ms on gpt): the copy streams the cold weights once. The primitive takes its
// scratchpad from the caller, where dnnl_sgemm allocates its packing buffers (1-2 MB) on every
// call. One primitive per shape, made on first use (a JIT compile) and kept.
constexpr int64_t kPlainBMinRows = 512;
constexpr int64_t kPlainBMaxFloats = int64_t{1} << 20;
struct MatMulPrim {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_desc_t a, b, c, scratch;
  ~MatMulPrim() {
    if (prim) dnnl_primitive_destroy(prim);
  }
};

// The primitive computing C[m, n] = alpha * A[m, k] * B^T + beta * C (B stored [n, k]), or null
// where oneDNN has none.
std::shared_ptr<MatMulPrim> make_matmul(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                        int64_t ldc, float alpha, float beta) {
  dnnl_engine_t engine = dnnl_cpu_engine();
  if (!engine) return nullptr;
  auto p = std::make_shared<MatMulPrim>();
  dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
  dnnl_dims_t as = {lda, 1}, bs = {1, ldb}, cs = {ldc, 1};
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  bool ok =
      dnnl_memory_desc_init_by_strides(&p->a, 2, ad, dnnl_f32, as) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&p->b, 2, bd, dnnl_f32, bs) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&p->c, 2, cd, dnnl_f32, cs) == dnnl_success &&
      dnnl_primitive_attr_create(&attr) == dnnl_success &&
      dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && alpha != 1.0f)
    ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
  if (ok && beta != 0.0f)
    ok = dnnl_post_ops_create(&post) == dnnl_success &&
         dnnl_post_ops_append_sum(post, beta) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, post) == dnnl_success;
  dnnl_matmul_desc_t desc;
  if (ok) ok = dnnl_matmul_desc_init(&desc, &p->a, &p->b, nullptr, &p->c) == dnnl_success;
  if (ok) {
    OneOmpThread one;  // the blocking it picks is for the one thread it will run on
    ok = dnnl_primitive_desc_create(&pd, &desc, attr, engine, nullptr) == dnnl_success &&
         dnnl_primitive_create(&p->prim, pd) == dnnl_success;
  }
  if (ok) p->scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (post) dnnl_post_ops_destroy(post);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return ok ? p : nullptr;
}

// The cached primitive for these arguments (null: none). At most kMaxPrims shapes are kept; a
// process that makes more (sizes that change every call) starts the cache again.
std::shared_ptr<MatMulPrim> matmul_prim(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                        int64_t ldc, float alpha, float beta) {
  constexpr size_t kMaxPrims = 256;
  struct Key {
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    bool operator<(const Key& o) const {
      return std::tie(m, n, k, lda, ldb, ldc, alpha, beta) <
             std::tie(o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.alpha, o.beta);
    }
  };
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<MatMulPrim>> cache;
  Key key{m, n, k, lda, ldb, ldc, alpha, beta};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  std::shared_ptr<MatMulPrim> p = make_matmul(m, n, k, lda, ldb, ldc, alpha, beta);
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxPrims) cache.clear();
  return cache.emplace(key, p).first->second;
}

// C = alpha * A B^T + beta * C on the matmul primitive; false (nothing written) where oneDNN has
// none for the shape.
bool dnnl_matmul_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  std::shared_ptr<MatMulPrim> p = matmul_prim(m, n, k, lda, ldb, ldc, alpha, beta);
  if (!p) return false;
  // This thread's stream, kept between calls; the scratchpad is its first oneDNN workspace.
  struct Stream {
    dnnl_stream_t stream = nullptr;
    Stream() {
      if (dnnl_stream_create(&stream, dnnl_cpu_engine(), dnnl_stream_default_flags) != dnnl_success)
        stream = nullptr;
    }
    ~Stream() {
      if (stream) dnnl_stream_destroy(stream);
    }
  };
  thread_local Stream t;
  if (!t.stream) return false;
  void* scratch = dnnl_workspace(0, std::max<size_t>(dnnl_memory_desc_get_size(&p->scratch), 1));
  dnnl_engine_t engine = dnnl_cpu_engine();
  dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr, ms = nullptr;
  bool ok = dnnl_memory_create(&ma, &p->a, engine, const_cast<float*>(a)) == dnnl_success &&
            dnnl_memory_create(&mb, &p->b, engine, const_cast<float*>(b)) == dnnl_success &&
            dnnl_memory_create(&mc, &p->c, engine, c) == dnnl_success &&
            dnnl_memory_create(&ms, &p->scratch, engine, scratch) == dnnl_success;
  if (ok) {
    dnnl_exec_arg_t args[] = {
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
    OneOmpThread one;
    ok = dnnl_primitive_execute(p->prim, t.stream, 4, args) == dnnl_success &&
         dnnl_stream_wait(t.stream) == dnnl_success;
  }
  for (dnnl_memory_t mem : {ma, mb, mc, ms})
    if (mem) dnnl_memory_destroy(mem);
  if (!ok) throw Error("oneDNN's matmul failed on a " + str_cat(m, " x ", n, " x ", k) + " GEMM");
  return true;
}

}  // namespace
#endif

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
    if (!trans_a && trans_b && dnnl_matmul_bt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    OneOmpThread one;
    dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c,
               ldc);
    return;
  }
#endif
  cblas_sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// 8 x 8 blocks in registers (three rounds of shuffles), the edges one by one.
void transpose_matrix(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst,
                      int64_t ld_dst) {
  using vec::f8;
  using I = vec::i8;
  int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) {
    int64_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) {
      f8 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = vec::load(src + (r0 + i) * ld_src + c0);
      for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], I{0, 8, 1, 9, 4, 12, 5, 13});
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], I{2, 10, 3, 11, 6, 14, 7, 15});
      }
      for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; ++j) {
          u[i + 2 * j] = __builtin_shuffle(t[i + j], t[i + j + 2], I{0, 1, 8, 9, 4, 5, 12, 13});
          u[i + 2 * j + 1] =
              __builtin_shuffle(t[i + j], t[i + j + 2], I{2, 3, 10, 11, 6, 7, 14, 15});
        }
      for (int i = 0; i < 4; ++i) {  // u[i]: columns i and i + 4 of rows 0-3; u[i + 4]: rows 4-7
        vec::store(dst + (c0 + i) * ld_dst + r0,
                   __builtin_shuffle(u[i], u[i + 4], I{0, 1, 2, 3, 8, 9, 10, 11}));
        vec::store(dst + (c0 + i + 4) * ld_dst + r0,
                   __builtin_shuffle(u[i], u[i + 4], I{4, 5, 6, 7, 12, 13, 14, 15}));
      }
    }
    for (; c0 < cols; ++c0)
      for (int64_t i = r0; i < r0 + 8; ++i) dst[c0 * ld_dst + i] = src[i * ld_src + c0];
  }
  for (; r0 < rows; ++r0)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r0] = src[r0 * ld_src + c];
}

void sgemm(KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
#ifdef GRAPHTRAIN_HAVE_DNNL
  if (trans_b && m >= kPlainBMinRows && n * k <= kPlainBMaxFloats && m * n * k >= kDnnlMinWork) {
    // Kept per thread between calls: no allocation, and no page faults, per GEMM.
    thread_local std::vector<float> plain_b;
    if (plain_b.size() < static_cast<size_t>(n * k)) plain_b.resize(static_cast<size_t>(n * k));
    transpose_matrix(b, n, k, ldb, plain_b.data(), n);
    b = plain_b.data();
    ldb = n;
    trans_b = false;
  }
#endif
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

// One GEMM per batch i, A at pa + off_a[i], B at pb + off_b[i], C at pc + off_c[i]: spread over
// the pool by batch when there are enough batches (or they are small), else one after the other,
// each split over the pool.
void batched_sgemm(KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* pa, int64_t lda, const std::vector<int64_t>& off_a,
                   const float* pb, int64_t ldb, const std::vector<int64_t>& off_b, float* pc,
                   int64_t ldc, const std::vector<int64_t>& off_c) {
  int64_t batch = static_cast<int64_t>(off_c.size());
  if (batch >= ctx.pool().num_threads() || m * n * k < (1 << 18)) {
    ctx.pool().parallel_for(batch, 1, [&](int64_t lo, int64_t hi) {
      for (size_t i = static_cast<size_t>(lo); i < static_cast<size_t>(hi); ++i)
        sgemm_serial(ta, tb, m, n, k, alpha, pa + off_a[i], lda, pb + off_b[i], ldb, 0.0f,
                     pc + off_c[i], ldc);
    });
  } else {
    for (size_t i = 0; i < off_c.size(); ++i)
      sgemm(ctx, ta, tb, m, n, k, alpha, pa + off_a[i], lda, pb + off_b[i], ldb, 0.0f,
            pc + off_c[i], ldc);
  }
}

// A GEMM operand or result seen through a permutation of its stored dims: logical dim i is the
// stored dim perm[i] (its size, its stride); an empty perm is the identity.
struct Strided {
  Shape shape;
  std::vector<int64_t> strides;
};

Strided permuted(const Shape& stored, const std::vector<int64_t>& perm) {
  std::vector<int64_t> st = contiguous_strides(stored);
  if (perm.empty()) return {stored, st};
  Strided v;
  for (int64_t p : perm) {
    v.shape.push_back(stored[static_cast<size_t>(p)]);
    v.strides.push_back(st[static_cast<size_t>(p)]);
  }
  return v;
}

// FusedMatMul with permA / permB / permY (fold_transposes folded a Transpose of an operand, or of
// the result, into the GEMM): each batch's matrices are read and written in place, through
// strides, with no transposed copy. Logical A = Transpose(input 0, permA), then transA; the same
// for B; the stored output = Transpose(logical Y, permY).
void matmul_permuted(KernelContext& ctx, const Tensor& a, const Tensor& b, bool ta, bool tb,
                     float alpha) {
  const Node& node = ctx.node();
  std::vector<int64_t> perm_a = node.attr_ints("permA"), perm_b = node.attr_ints("permB"),
                       perm_y = node.attr_ints("permY");
  for (const auto* p : {&perm_a, &perm_b})
    if (!p->empty() && p->size() != (p == &perm_a ? a.rank() : b.rank()))
      ctx.fail("permA / permB must have one entry per dim of their input");
  Strided la = permuted(a.shape(), perm_a), lb = permuted(b.shape(), perm_b);
  if (la.shape.size() < 2 || lb.shape.size() < 2) ctx.fail("permuted operands need rank 2 or more");
  auto swap_last = [](Strided& v) {
    size_t r = v.shape.size();
    std::swap(v.shape[r - 1], v.shape[r - 2]);
    std::swap(v.strides[r - 1], v.strides[r - 2]);
  };
  if (ta) swap_last(la);
  if (tb) swap_last(lb);
  size_t ra = la.shape.size(), rb = lb.shape.size();
  int64_t m = la.shape[ra - 2], k = la.shape[ra - 1], n = lb.shape[rb - 1];
  if (lb.shape[rb - 2] != k)
    ctx.fail(str_cat("inner dimensions differ: ", k, " and ", lb.shape[rb - 2]));
  // Each matrix as BLAS reads it: row-major with a leading dimension, or its transpose.
  auto as_blas = [&](const Strided& v, bool* trans, int64_t* ld) {
    size_t r = v.shape.size();
    if (v.strides[r - 1] == 1) {
      *trans = false;
      *ld = std::max<int64_t>(v.strides[r - 2], v.shape[r - 1]);
    } else if (v.strides[r - 2] == 1) {
      *trans = true;
      *ld = std::max<int64_t>(v.strides[r - 1], v.shape[r - 2]);
    } else {
      ctx.fail("a permuted operand's last two dims must include its stored last dim");
    }
  };
  bool blas_ta = false, blas_tb = false;
  int64_t lda = 0, ldb = 0;
  as_blas(la, &blas_ta, &lda);
  as_blas(lb, &blas_tb, &ldb);
  Shape ba(la.shape.begin(), la.shape.end() - 2), bb(lb.shape.begin(), lb.shape.end() - 2);
  Broadcaster bc(ctx, {&ba, &bb});
  Shape batch = bc.out_shape(), logical_y = batch;
  logical_y.push_back(m);
  logical_y.push_back(n);
  if (!perm_y.empty() && perm_y.size() != logical_y.size())
    ctx.fail("permY must have one entry per output dim");
  Shape stored_y = logical_y;
  for (size_t i = 0; i < perm_y.size(); ++i)
    stored_y[i] = logical_y[static_cast<size_t>(perm_y[i])];
  Tensor& out = ctx.allocate_output(0, DType::kFloat32, stored_y);
  if (out.numel() == 0) return;
  // Logical Y dim j lives at stored dim i with perm_y[i] == j.
  std::vector<int64_t> ys = contiguous_strides(stored_y), y_strides(logical_y.size());
  for (size_t i = 0; i < logical_y.size(); ++i)
    y_strides[perm_y.empty() ? i : static_cast<size_t>(perm_y[i])] = ys[i];
  size_t ry = logical_y.size();
  if (y_strides[ry - 1] != 1) ctx.fail("permY must keep the output's last dim last");
  int64_t ldc = std::max<int64_t>(y_strides[ry - 2], n);
  // Per batch: element offsets of A, B and Y (broadcast batch dims read offset 0).
  int64_t nbatch = shape_numel(batch);
  std::vector<int64_t> off_a(static_cast<size_t>(nbatch)), off_b(off_a), off_y(off_a);
  for (int64_t i = 0; i < nbatch; ++i) {
    int64_t rem = i, oa = 0, ob = 0, oy = 0;
    for (size_t d = batch.size(); d-- > 0;) {
      int64_t idx = rem % batch[d];
      rem /= batch[d];
      size_t lead = batch.size() - d;  // dims from the right, batch dims only
      if (lead <= ba.size() && ba[ba.size() - lead] != 1) oa += idx * la.strides[ba.size() - lead];
      if (lead <= bb.size() && bb[bb.size() - lead] != 1) ob += idx * lb.strides[bb.size() - lead];
      oy += idx * y_strides[d];
    }
    off_a[static_cast<size_t>(i)] = oa;
    off_b[static_cast<size_t>(i)] = ob;
    off_y[static_cast<size_t>(i)] = oy;
  }
  batched_sgemm(ctx, blas_ta, blas_tb, m, n, k, alpha, a.data<float>(), lda, off_a, b.data<float>(),
                ldb, off_b, out.data<float>(), ldc, off_y);
}

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
  if (ctx.node().has_attr("permA") || ctx.node().has_attr("permB") || ctx.node().has_attr("permY"))
    return matmul_permuted(ctx, a, b, ta, tb, alpha);
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
  std::vector<int64_t> off_a(static_cast<size_t>(batch)), off_b(off_a), off_y(off_a);
  for (int64_t i = 0; i < batch; ++i) off_y[static_cast<size_t>(i)] = i * m * n;
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
  batched_sgemm(ctx, ta, tb, m, n, k, alpha, pa, lda, off_a, pb, ldb, off_b, po, n, off_y);
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

// graphtrain::GroupedMatMul(X [S, K], W [E, K, N] (transB: [E, N, K]), offsets [E]) -> Y [S, N]:
// a mixture of experts' grouped product. Rows offsets[e - 1] .. offsets[e] of X (the tokens routed
// to expert e, sorted by expert) are multiplied by W[e]; rows past offsets[E - 1] are zero.

// Each expert's end row, checked against X's rows.
std::vector<int64_t> group_ends(const KernelContext& ctx, const Tensor& offsets, int64_t rows,
                                int64_t experts) {
  if (offsets.dtype() != DType::kInt32 && offsets.dtype() != DType::kInt64)
    ctx.fail("offsets must be int32 or int64, got " + offsets.describe());
  if (offsets.rank() != 1 || offsets.numel() != experts)
    ctx.fail(str_cat("offsets must have one element per expert (", experts, "), got shape ",
                     offsets.shape()));
  std::vector<int64_t> ends(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    int64_t end =
        offsets.dtype() == DType::kInt32 ? offsets.data<int32_t>()[e] : offsets.data<int64_t>()[e];
    int64_t start = e ? ends[static_cast<size_t>(e - 1)] : 0;
    if (end < start || end > rows)
      ctx.fail(str_cat("offsets must rise from 0 to at most the ", rows, " rows of X; expert ", e,
                       " ends at ", end, " after ", start));
    ends[static_cast<size_t>(e)] = end;
  }
  return ends;
}

void grouped_matmul(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  bool tb = ctx.node().attr_int("transB", 0) != 0;
  if (x.rank() != 2 || w.rank() != 3) ctx.fail("X must have rank 2 and W rank 3");
  int64_t s = x.dim(0), k = x.dim(1), experts = w.dim(0);
  int64_t n = tb ? w.dim(1) : w.dim(2);
  if ((tb ? w.dim(2) : w.dim(1)) != k)
    ctx.fail(str_cat("X's rows of ", k, " do not match W of shape ", w.shape()));
  std::vector<int64_t> ends = group_ends(ctx, ctx.input(2), s, experts);
  Tensor& y = ctx.allocate_output(0, F32, {s, n});
  float* py = y.data<float>();
  int64_t start = 0;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t end = ends[static_cast<size_t>(e)];
    if (end > start)
      sgemm(ctx, false, tb, end - start, n, k, 1.0f, x.data<float>() + start * k, k,
            w.data<float>() + e * k * n, tb ? k : n, 0.0f, py + start * n, n);
    start = end;
  }
  std::fill(py + start * n, py + s * n, 0.0f);
}

// GroupedMatMulGrad(dY, X, W, offsets) -> (dX, dW), each when requested.
void grouped_matmul_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& w = ctx.input(2);
  bool tb = ctx.node().attr_int("transB", 0) != 0;
  int64_t s = x.dim(0), k = x.dim(1), experts = w.dim(0), n = dy.dim(1);
  std::vector<int64_t> ends = group_ends(ctx, ctx.input(3), s, experts);
  const float* g = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  if (ctx.output_requested(0)) {
    float* dx = ctx.allocate_output(0, F32, x.shape()).data<float>();
    int64_t start = 0;
    for (int64_t e = 0; e < experts; ++e) {  // dX = dY W[e]^T (transB: dY W[e])
      int64_t end = ends[static_cast<size_t>(e)];
      if (end > start)
        sgemm(ctx, false, !tb, end - start, k, n, 1.0f, g + start * n, n, pw + e * k * n,
              tb ? k : n, 0.0f, dx + start * k, k);
      start = end;
    }
    std::fill(dx + start * k, dx + s * k, 0.0f);
  }
  if (ctx.output_requested(1)) {
    float* dw = ctx.allocate_output(1, F32, w.shape()).data<float>();
    int64_t start = 0;
    for (int64_t e = 0; e < experts; ++e) {  // dW[e] = X^T dY (transB: dY^T X) over its rows
      int64_t end = ends[static_cast<size_t>(e)], rows = end - start;
      float* out = dw + e * k * n;
      if (rows == 0)
        std::fill(out, out + k * n, 0.0f);
      else if (tb)
        sgemm(ctx, true, false, n, k, rows, 1.0f, g + start * n, n, px + start * k, k, 0.0f, out,
              k);
      else
        sgemm(ctx, true, false, k, n, rows, 1.0f, px + start * k, k, g + start * n, n, 0.0f, out,
              n);
      start = end;
    }
  }
}

const bool registered = [] {
  register_kernel(kGraphtrainDomain, "GroupedMatMul", {DType::kFloat32}, grouped_matmul);
  register_kernel(kGraphtrainDomain, "GroupedMatMulGrad", {DType::kFloat32}, grouped_matmul_grad);
  register_kernel("", "MatMul", {DType::kFloat32}, matmul);
  register_kernel(kGraphtrainDomain, "FusedMatMul", {DType::kFloat32}, matmul);
  register_kernel("", "Gemm", {DType::kFloat32}, gemm);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
