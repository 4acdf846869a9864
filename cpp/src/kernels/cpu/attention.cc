// CPU kernels: Attention (torch's scaled_dot_product_attention) and AttentionGrad.
//
//   Attention(Q [..., Hq, Lq, E], K [..., Hk, Lk, E], V [..., Hk, Lk, Ev], mask?)
//     -> (Y [..., Hq, Lq, Ev], LSE [..., Hq, Lq], seed)
//
// Hq a multiple of Hk (grouped-query heads: query head h reads key/value head h / (Hq / Hk)).
// mask: bool (true = attend) or float (added to the scores), broadcast to [..., Hq, Lq, Lk].
// Attributes: scale (default 1/sqrt(E)), causal (top-left aligned, as torch), dropout (p).
//
// Tiled as flash attention: a thread holds one block of scores (kBlockQ x kBlockK) at a time and
// keeps a running max and sum per query row; the T x T probabilities never exist. The backward
// recomputes the probabilities from LSE (the log-sum-exp of each row's scores). A fully masked row
// gives zeros, as torch does. Dropout masks come from a counter-based generator keyed by `seed`
// and the element's (batch, head, row, column), so the backward regenerates them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/random.h"
#include "kernels/cpu/vec_dispatch.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline bool keep(uint64_t key, uint64_t index, float p) {
  return uniform(key, index) >= p;
}

// The geometry of one call, shared by the forward and backward kernels.
struct Geometry {
  int64_t batch = 1;  // product of the dims before the head dim
  int64_t hq = 1, hk = 1, lq = 0, lk = 0, e = 0, ev = 0;
  float scale = 1, dropout = 0;
  bool causal = false;
  // The mask (may be absent), with element strides over (batch, head, row, column); 0 where
  // broadcast.
  const void* mask = nullptr;
  bool mask_bool = false;
  int64_t m_b = 0, m_h = 0, m_q = 0, m_k = 0;
  uint64_t key = 0;

  int64_t group() const { return hq / hk; }
  const float* q(const float* p, int64_t b, int64_t h) const { return p + (b * hq + h) * lq * e; }
  const float* k(const float* p, int64_t b, int64_t h) const { return p + (b * hk + h) * lk * e; }
  const float* v(const float* p, int64_t b, int64_t h) const { return p + (b * hk + h) * lk * ev; }
  // Keys a query row may see: all, or (causal) up to its own position.
  int64_t key_end(int64_t row_end) const { return causal ? std::min(lk, row_end) : lk; }

  // scores[r][c] = scale * (Q K^T)[q0 + r][k0 + c] + mask, -inf where masked out.
  void scores(const float* qp, const float* kp, int64_t b, int64_t h, int64_t q0, int64_t nq,
              int64_t k0, int64_t nk, float* s) const {
    sgemm_serial(false, true, nq, nk, e, scale, qp + q0 * e, e, kp + k0 * e, e, 0.0f, s, nk);
    if (mask) {
      for (int64_t r = 0; r < nq; ++r) {
        int64_t base = b * m_b + h * m_h + (q0 + r) * m_q + k0 * m_k;
        float* row = s + r * nk;
        if (mask_bool) {
          const bool* mp = static_cast<const bool*>(mask) + base;
          for (int64_t c = 0; c < nk; ++c)
            if (!mp[c * m_k]) row[c] = kNegInf;
        } else if (m_k == 1) {  // a row of the mask: added 8 lanes at a time
          const float* mp = static_cast<const float*>(mask) + base;
          int64_t c = 0;
          for (; c + 8 <= nk; c += 8) vec::store(row + c, vec::load(row + c) + vec::load(mp + c));
          for (; c < nk; ++c) row[c] += mp[c];
        } else {
          const float* mp = static_cast<const float*>(mask) + base;
          for (int64_t c = 0; c < nk; ++c) row[c] += mp[c * m_k];
        }
      }
    }
    if (causal)
      for (int64_t r = 0; r < nq; ++r)
        for (int64_t c = std::max<int64_t>(0, q0 + r + 1 - k0); c < nk; ++c)
          s[r * nk + c] = kNegInf;
  }

  uint64_t element(int64_t b, int64_t h, int64_t row, int64_t col) const {
    return static_cast<uint64_t>(((b * hq + h) * lq + row) * lk + col);
  }
};

Geometry geometry(KernelContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor* mask) {
  Geometry g;
  size_t r = q.rank();
  if (r < 2 || k.rank() != r || v.rank() != r)
    ctx.fail(str_cat("Q, K and V must have the same rank, 2 or more; got ", q.shape(), ", ",
                     k.shape(), ", ", v.shape()));
  for (size_t i = 0; i + 3 < r; ++i) {
    if (k.dim(i) != q.dim(i) || v.dim(i) != q.dim(i))
      ctx.fail(str_cat("Q, K and V must have the same batch dims; got ", q.shape(), ", ", k.shape(),
                       ", ", v.shape()));
    g.batch *= q.dim(i);
  }
  g.hq = r >= 3 ? q.dim(r - 3) : 1;
  g.hk = r >= 3 ? k.dim(r - 3) : 1;
  g.lq = q.dim(r - 2);
  g.lk = k.dim(r - 2);
  g.e = q.dim(r - 1);
  g.ev = v.dim(r - 1);
  if (k.dim(r - 1) != g.e || v.dim(r - 2) != g.lk || (r >= 3 && v.dim(r - 3) != g.hk))
    ctx.fail(str_cat("K and V do not fit Q: ", q.shape(), ", ", k.shape(), ", ", v.shape()));
  if (g.hk == 0 || g.hq % g.hk != 0)
    ctx.fail(
        str_cat("query heads (", g.hq, ") must be a multiple of key/value heads (", g.hk, ")"));
  const Node& n = ctx.node();
  g.scale = n.attr_float("scale", 0.0f);
  if (g.scale == 0.0f) g.scale = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(g.e, 1)));
  g.causal = n.attr_int("causal", 0) != 0;
  g.dropout = n.attr_float("dropout", 0.0f);
  if (mask) {
    if (mask->dtype() != DType::kBool && mask->dtype() != DType::kFloat32)
      ctx.fail("the mask must be bool or float32, not " + std::string(to_string(mask->dtype())));
    // Right-aligned broadcast against [batch..., Hq, Lq, Lk].
    Shape full(q.shape().begin(), q.shape().end() - 1);
    full.push_back(g.lk);
    if (mask->rank() > full.size())
      ctx.fail(str_cat("the mask ", mask->shape(), " has more dims than the scores ", full));
    std::vector<int64_t> st = contiguous_strides(mask->shape());
    std::vector<int64_t> strides(full.size(), 0);
    size_t off = full.size() - mask->rank();
    for (size_t i = 0; i < mask->rank(); ++i) {
      int64_t d = mask->dim(i);
      if (d != 1 && d != full[off + i])
        ctx.fail(str_cat("the mask ", mask->shape(), " does not broadcast to the scores ", full));
      strides[off + i] = d == 1 ? 0 : st[i];
    }
    size_t fr = full.size();
    g.m_k = strides[fr - 1];
    g.m_q = strides[fr - 2];
    g.m_h = fr >= 3 ? strides[fr - 3] : 0;
    // The batch dims: all broadcast, or all present (then one stride steps the flat batch index).
    size_t nb = fr >= 3 ? fr - 3 : 0;
    bool any = false, all = true;
    for (size_t i = 0; i < nb; ++i) {
      if (strides[i] != 0)
        any = true;
      else if (full[i] != 1)
        all = false;
    }
    if (any && !all) ctx.fail("the mask must broadcast over all batch dims or none");
    g.m_b = any ? strides[nb - 1] : 0;
    g.mask = mask->raw_data();
    g.mask_bool = mask->dtype() == DType::kBool;
  }
  return g;
}

class AttentionKernel : public OpKernel {
 public:
  explicit AttentionKernel(const Node&) : seed_(fresh_seed()) {}

  void compute(KernelContext& ctx) override {
    const Tensor& q = ctx.input(0);
    const Tensor& k = ctx.input(1);
    const Tensor& v = ctx.input(2);
    const Tensor* mask = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    Geometry g = geometry(ctx, q, k, v, mask);
    g.key = g.dropout > 0 ? mix(seed_ ^ mix(calls_++)) : 0;
    Shape ys = q.shape();
    ys.back() = g.ev;
    Tensor& y = ctx.allocate_output(0, F32, ys);
    Shape ls(q.shape().begin(), q.shape().end() - 1);
    Tensor& lse = ctx.allocate_output(1, F32, ls);
    if (ctx.output_requested(2))
      ctx.set_output(2, Tensor::scalar_int64(static_cast<int64_t>(g.key)));
    const float* pq = q.data<float>();
    const float* pk = k.data<float>();
    const float* pv = v.data<float>();
    float* py = y.data<float>();
    float* pl = lse.data<float>();
    int64_t qblocks = (g.lq + kBlockQ - 1) / kBlockQ;
    float drop_scale = g.dropout < 1.0f ? 1.0f / (1.0f - g.dropout) : 0.0f;
    int64_t tasks = g.batch * g.hq * qblocks;
    parallel_for(ctx, tasks, kBlockQ * g.lk * (g.e + g.ev), [&](int64_t t0, int64_t t1) {
      std::vector<float> s(static_cast<size_t>(kBlockQ * kBlockK));
      std::vector<float> m(kBlockQ), l(kBlockQ), acc(static_cast<size_t>(kBlockQ * g.ev));
      for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / (g.hq * qblocks), h = t / qblocks % g.hq, qb = t % qblocks;
        int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, g.lq - q0);
        int64_t hk = h / g.group();
        const float* qp = g.q(pq, b, h);
        const float* kp = g.k(pk, b, hk);
        const float* vp = g.v(pv, b, hk);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        int64_t kend = g.key_end(q0 + nq);
        if (kend == 0) std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t k0 = 0; k0 < kend; k0 += kBlockK) {
          int64_t nk = std::min(kBlockK, kend - k0);
          bool first = k0 == 0;  // acc holds nothing yet: the P V product is written, not added
          g.scores(qp, kp, b, h, q0, nq, k0, nk, s.data());
          for (int64_t r = 0; r < nq; ++r) {
            float* row = s.data() + r * nk;
            float mx = std::max(m[r], vec::max(row, nk));
            if (mx == kNegInf) {  // nothing visible yet in this row
              std::fill(row, row + nk, 0.0f);
              continue;
            }
            float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - mx);  // the old rows' rescale
            l[r] = l[r] * alpha + vec_exp_sum(row, row, nk, mx);
            if (!first && alpha != 1.0f)
              vec::map(acc.data() + r * g.ev, acc.data() + r * g.ev, g.ev,
                       [alpha](auto x) { return x * alpha; });
            m[r] = mx;
            if (g.dropout > 0)
              for (int64_t c = 0; c < nk; ++c)
                row[c] = keep(g.key, g.element(b, h, q0 + r, k0 + c), g.dropout)
                             ? row[c] * drop_scale
                             : 0.0f;
          }
          sgemm_serial(false, false, nq, g.ev, nk, 1.0f, s.data(), nk, vp + k0 * g.ev, g.ev,
                       first ? 0.0f : 1.0f, acc.data(), g.ev);
        }
        for (int64_t r = 0; r < nq; ++r) {
          int64_t row = (b * g.hq + h) * g.lq + q0 + r;
          float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
          vec::map(acc.data() + r * g.ev, py + row * g.ev, g.ev, [inv](auto x) { return x * inv; });
          pl[row] = l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf;
        }
      }
    });
  }

 private:
  uint64_t seed_ = 0;
  uint64_t calls_ = 0;
};

// AttentionGrad(dY, Q, K, V, Y, LSE, mask?, seed?) -> (dQ, dK, dV, dMask?). One task per (batch,
// key/value head): it owns dK and dV of that head and dQ of the query heads reading it, so no two
// tasks write one element and every sum runs in a fixed order.
void attention_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& q = ctx.input(1);
  const Tensor& k = ctx.input(2);
  const Tensor& v = ctx.input(3);
  const Tensor& y = ctx.input(4);
  const Tensor& lse = ctx.input(5);
  const Tensor* mask = ctx.has_input(6) ? &ctx.input(6) : nullptr;
  Geometry g = geometry(ctx, q, k, v, mask);
  g.key = ctx.has_input(7) ? static_cast<uint64_t>(ctx.input(7).to_int64_vector()[0]) : 0;
  Tensor& dq = ctx.allocate_output(0, F32, q.shape());
  Tensor& dk = ctx.allocate_output(1, F32, k.shape());
  Tensor& dv = ctx.allocate_output(2, F32, v.shape());
  // dMask (only when a float mask wants a gradient): the score gradients, [..., Hq, Lq, Lk].
  float* pdm = nullptr;
  if (ctx.output_requested(3)) {
    Shape ms(q.shape().begin(), q.shape().end() - 1);
    ms.push_back(g.lk);
    Tensor& dm = ctx.allocate_output(3, F32, ms);
    std::memset(dm.raw_data(), 0, dm.nbytes());
    pdm = dm.data<float>();
  }
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const float *pdy = dy.data<float>(), *py = y.data<float>(), *pl = lse.data<float>();
  float *pdq = dq.data<float>(), *pdk = dk.data<float>(), *pdv = dv.data<float>();
  float drop_scale = g.dropout < 1.0f ? 1.0f / (1.0f - g.dropout) : 0.0f;
  parallel_for(
      ctx, g.batch * g.hk, g.group() * g.lq * g.lk * (g.e + g.ev) * 4, [&](int64_t t0, int64_t t1) {
        std::vector<float> p(static_cast<size_t>(kBlockQ * kBlockK));
        std::vector<float> dp(p.size()), d(kBlockQ);
        for (int64_t t = t0; t < t1; ++t) {
          int64_t b = t / g.hk, hk = t % g.hk;
          const float* kp = g.k(pk, b, hk);
          const float* vp = g.v(pv, b, hk);
          float* dkp = pdk + (b * g.hk + hk) * g.lk * g.e;
          float* dvp = pdv + (b * g.hk + hk) * g.lk * g.ev;
          // This task's slices of the gradients, zeroed here (in parallel) to be summed
          // into.
          std::fill_n(dkp, g.lk * g.e, 0.0f);
          std::fill_n(dvp, g.lk * g.ev, 0.0f);
          std::fill_n(pdq + (b * g.hq + hk * g.group()) * g.lq * g.e, g.group() * g.lq * g.e, 0.0f);
          for (int64_t h = hk * g.group(); h < (hk + 1) * g.group(); ++h) {
            const float* qp = g.q(pq, b, h);
            int64_t rows = (b * g.hq + h) * g.lq;
            const float* dyp = pdy + rows * g.ev;
            const float* yp = py + rows * g.ev;
            const float* lp = pl + rows;
            float* dqp = pdq + rows * g.e;
            for (int64_t q0 = 0; q0 < g.lq; q0 += kBlockQ) {
              int64_t nq = std::min(kBlockQ, g.lq - q0);
              for (int64_t r = 0; r < nq; ++r)  // D = rowsum(dY * Y)
                d[static_cast<size_t>(r)] =
                    vec::dot_centered(dyp + (q0 + r) * g.ev, yp + (q0 + r) * g.ev, g.ev, 0);
              int64_t kend = g.key_end(q0 + nq);
              for (int64_t k0 = 0; k0 < kend; k0 += kBlockK) {
                int64_t nk = std::min(kBlockK, kend - k0);
                g.scores(qp, kp, b, h, q0, nq, k0, nk, p.data());
                for (int64_t r = 0; r < nq; ++r) {  // P = exp(S - LSE), 0 where masked
                  float shift = lp[q0 + r];
                  float* row = p.data() + r * nk;
                  if (shift == kNegInf) {
                    std::fill(row, row + nk, 0.0f);
                    continue;
                  }
                  vec::map(row, row, nk, [shift](auto x) { return vec::exp(x - shift); });
                }
                // dP = dY V^T
                sgemm_serial(false, true, nq, nk, g.ev, 1.0f, dyp + q0 * g.ev, g.ev, vp + k0 * g.ev,
                             g.ev, 0.0f, dp.data(), nk);
                if (g.dropout > 0) {
                  // dV takes the dropped probabilities; dP reaches P through the same
                  // mask.
                  std::vector<float> pd(p.begin(), p.begin() + nq * nk);
                  for (int64_t r = 0; r < nq; ++r)
                    for (int64_t c = 0; c < nk; ++c) {
                      bool kept = keep(g.key, g.element(b, h, q0 + r, k0 + c), g.dropout);
                      pd[static_cast<size_t>(r * nk + c)] *= kept ? drop_scale : 0.0f;
                      dp[static_cast<size_t>(r * nk + c)] *= kept ? drop_scale : 0.0f;
                    }
                  sgemm_serial(true, false, nk, g.ev, nq, 1.0f, pd.data(), nk, dyp + q0 * g.ev,
                               g.ev, 1.0f, dvp + k0 * g.ev, g.ev);
                } else {
                  sgemm_serial(true, false, nk, g.ev, nq, 1.0f, p.data(), nk, dyp + q0 * g.ev, g.ev,
                               1.0f, dvp + k0 * g.ev, g.ev);
                }
                for (int64_t r = 0; r < nq; ++r) {  // dS = P * (dP - D), into dp
                  float* ds = dp.data() + r * nk;
                  const float* pr = p.data() + r * nk;
                  float dr = d[static_cast<size_t>(r)];
                  for (int64_t c = 0; c < nk; ++c) ds[c] = pr[c] * (ds[c] - dr);
                  if (pdm) std::memcpy(pdm + (rows + q0 + r) * g.lk + k0, ds, sizeof(float) * nk);
                }
                sgemm_serial(false, false, nq, g.e, nk, g.scale, dp.data(), nk, kp + k0 * g.e, g.e,
                             1.0f, dqp + q0 * g.e, g.e);
                sgemm_serial(true, false, nk, g.e, nq, g.scale, dp.data(), nk, qp + q0 * g.e, g.e,
                             1.0f, dkp + k0 * g.e, g.e);
              }
            }
          }
        }
      });
}

const bool registered = [] {
  register_stateful_kernel(GT, "Attention", {F32},
                           [](const Node& n) { return std::make_unique<AttentionKernel>(n); });
  register_kernel(GT, "AttentionGrad", {F32}, attention_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
