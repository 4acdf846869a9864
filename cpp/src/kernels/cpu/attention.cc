// CPU kernels: Attention (torch's scaled_dot_product_attention) and AttentionGrad.
//
//   Attention(Q [..., Hq, Lq, E], K [..., Hk, Lk, E], V [..., Hk, Lk, Ev], mask?)
//     -> (Y [..., Hq, Lq, Ev], LSE [..., Hq, Lq], seed)
//
// Hq a multiple of Hk (grouped-query heads: query head h reads key/value head h / (Hq / Hk)).
// mask: bool (true = attend) or float (added to the scores), broadcast to [..., Hq, Lq, Lk].
// Attributes: scale (default 1/sqrt(E)), causal (top-left aligned, as torch), dropout (p), and
// heads_inside (1: Q, K, V, Y and their gradients are [..., L, H, E], the layout a projection
// writes before the heads are transposed out, read and written through strides; LSE and the mask
// keep the [..., H, Lq(, Lk)] layout), packed with heads (1: one X [..., L, 3 H E] holds Q, K and
// V side by side in each row, a fused projection's output; Y is [..., L, H, E], the gradient is
// one dX). Packed, an optional input 4 is the projection's bias [3 H E], added to each row of X as
// it is read (recognize_attention folds the projection's bias Add into the Attention: X is
// neither written with the bias nor read twice).
//
// Tiled as flash attention: a thread holds one block of scores (kTileQ rows x up to kBlockK keys)
// at a time and keeps a running max and sum per query row; the T x T probabilities never exist.
// The backward recomputes the probabilities from LSE (the log-sum-exp of each row's scores). A
// fully masked row gives zeros, as torch does. Dropout masks come from a counter-based generator
// keyed by `seed` and the element's (batch, head, row, column), so the backward regenerates them.
//
// Each tile of query rows computes only the keys up to the last one a row of it may see (causal,
// or a mask whose trailing keys are masked out for these rows: a causal or padding mask), so a
// causal product does about half the work. The per-tile products are register-tiled small GEMMs
// (vec_small_gemm) over blocks that sit in L1/L2; products with K^T or V^T read a transposed copy
// of the keys or values, made once per block.
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

constexpr int64_t kBlockQ = 64;  // query rows of a forward task
constexpr int64_t kTileQ = 16;   // query rows of one block of scores
constexpr int64_t kBlockK = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline bool keep(uint64_t key, uint64_t index, float p) {
  return uniform(key, index) >= p;
}

// dst[r * cols + c] = src[r * ld + c] + bias[c]: rows of one head of a packed X with the fused
// projection's bias added, contiguous (the same single rounding as the Add it replaces).
void add_bias_rows(const float* src, int64_t ld, int64_t rows, int64_t cols, const float* bias,
                   float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[r * ld + c] + bias[c];
}

// p[r * ld + c] = 0 for r < rows, c < cols, with vector stores: rows of a head's gradient (32 or
// 64 floats) are too short for a memset call to pay (the backward zeroes ~3 rows per query row).
// The zero comes from a volatile read, or GCC turns the loop back into memset calls.
volatile float zero_value = 0.0f;
void zero_rows(float* p, int64_t rows, int64_t cols, int64_t ld) {
  const vec::f8 zero = vec::splat(zero_value);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * ld;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) vec::store(row + c, zero);
    for (; c < cols; ++c) row[c] = zero[0];
  }
}

// t[c * ld + j] += bias[c] for c < rows, j < cols: the bias of a transposed block (keys or values
// as columns).
void add_bias_transposed(float* t, int64_t ld, int64_t rows, int64_t cols, const float* bias) {
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t j = 0; j < cols; ++j) t[c * ld + j] += bias[c];
}

// Where one operand's heads are: head h of batch b starts at element at(b, h), and its rows are
// `row` elements apart.
struct Operand {
  int64_t base = 0, batch = 0, head = 0, row = 0;
  int64_t at(int64_t b, int64_t h) const { return base + b * batch + h * head; }
};

// The geometry of one call, shared by the forward and backward kernels.
struct Geometry {
  int64_t batch = 1;  // product of the batch dims
  int64_t hq = 1, hk = 1, lq = 0, lk = 0, e = 0, ev = 0;
  float scale = 1, dropout = 0;
  bool causal = false;
  Operand oq, ok, ov, oy;  // Q and dQ, K and dK, V and dV, Y and dY
  Shape rows;              // LSE's shape: [batch..., Hq, Lq] ([Lq] without heads)
  // The mask (may be absent), with element strides over (batch, head, row, column); 0 where
  // broadcast.
  const void* mask = nullptr;
  bool mask_bool = false;
  // Packed: the projection's bias [3 D] (input 4 of Attention, 8 of AttentionGrad), or null.
  const float* bias = nullptr;
  // The bias of operand o's head h: packed rows hold Q, K, V at columns base + h * head.
  const float* bias_of(const Operand& o, int64_t h) const { return bias + o.base + h * o.head; }
  int64_t m_b = 0, m_h = 0, m_q = 0, m_k = 0;
  uint64_t key = 0;
  // With a mask: for each tile of kTileQ query rows (and each batch and head the mask varies
  // over), one past the last key a row of the tile may see.
  std::vector<int64_t> ends;
  int64_t tiles = 0;

  int64_t group() const { return hq / hk; }
  // Keys a query row may see: all, or (causal) up to its own position.
  int64_t key_end(int64_t row_end) const { return causal ? std::min(lk, row_end) : lk; }

  bool masked_out(int64_t b, int64_t h, int64_t row, int64_t col) const {
    int64_t i = b * m_b + h * m_h + row * m_q + col * m_k;
    return mask_bool ? !static_cast<const bool*>(mask)[i]
                     : static_cast<const float*>(mask)[i] == kNegInf;
  }
  // Fills `ends` (run once per call: the mask usually broadcasts over batch and heads).
  void find_mask_ends(ThreadPool& pool) {
    tiles = (lq + kTileQ - 1) / kTileQ;
    int64_t nb = m_b ? batch : 1, nh = m_h ? hq : 1;
    ends.assign(static_cast<size_t>(nb * nh * tiles), 0);
    pool.parallel_for(nb * nh * tiles, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t b = i / (nh * tiles), h = i / tiles % nh, q0 = i % tiles * kTileQ;
        int64_t q1 = std::min(lq, q0 + kTileQ), end = 0;
        for (int64_t c = key_end(q1) - 1; c >= 0 && end == 0; --c)
          for (int64_t r = q0; r < q1; ++r)
            if (!masked_out(b, h, r, c)) {
              end = c + 1;
              break;
            }
        ends[static_cast<size_t>(i)] = end;
      }
    });
  }
  // One past the last key a row of [q0, q0 + nq) may see (q0 a multiple of kTileQ).
  int64_t visible_end(int64_t b, int64_t h, int64_t q0, int64_t nq) const {
    if (!mask) return key_end(q0 + nq);
    int64_t end = 0;
    int64_t base = ((m_b ? b : 0) * (m_h ? hq : 1) + (m_h ? h : 0)) * tiles;
    for (int64_t t = q0 / kTileQ; t * kTileQ < q0 + nq; ++t)
      end = std::max(end, ends[static_cast<size_t>(base + t)]);
    return end;
  }

  // scores[r][c] = scale * (Q K^T)[q0 + r][k0 + c] + mask, -inf where masked out; qrows: query
  // row q0, the rows ldq apart; kt: the transposed keys from key k0 on, [e, nk] with rows ldkt
  // apart.
  void scores(const float* qrows, int64_t ldq, const float* kt, int64_t ldkt, int64_t b, int64_t h,
              int64_t q0, int64_t nq, int64_t k0, int64_t nk, float* s) const {
    vec_small_gemm(nq, nk, e, scale, qrows, ldq, 1, kt, ldkt, false, s, nk);
    if (mask) {
      for (int64_t r = 0; r < nq; ++r) {
        int64_t base = b * m_b + h * m_h + (q0 + r) * m_q + k0 * m_k;
        float* row = s + r * nk;
        if (mask_bool) {
          const bool* mp = static_cast<const bool*>(mask) + base;
          int64_t c = 0;
          if (m_k == 1)  // a row of the mask: 8 flags at a time
            for (; c + 8 <= nk; c += 8) {
              using Bytes = uint8_t __attribute__((vector_size(8)));
              Bytes flags;
              std::memcpy(&flags, mp + c, sizeof(flags));
              vec::i8 seen = __builtin_convertvector(flags, vec::i8) != 0;
              vec::store(row + c, seen ? vec::load(row + c) : vec::splat(kNegInf));
            }
          for (; c < nk; ++c)
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

// Q, K and V: three tensors, or (attribute packed) q alone, [..., L, 3 D] holding them side by
// side in each row (a fused projection's output), with attribute heads.
Geometry geometry(KernelContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor* mask, const Tensor* bias) {
  Geometry g;
  const Node& n = ctx.node();
  size_t r = q.rank();
  Shape batch_dims;
  if (n.attr_int("packed", 0) != 0) {
    int64_t heads = n.attr_int("heads", 0), width = r >= 2 ? q.dim(r - 1) : 0;
    if (r < 2 || heads <= 0 || width % (3 * heads) != 0)
      ctx.fail(str_cat("packed Q, K and V must be [..., L, 3 * heads * E] with heads (", heads,
                       ") >= 1; got ", q.shape()));
    batch_dims.assign(q.shape().begin(), q.shape().end() - 2);
    g.hq = g.hk = heads;
    g.lq = g.lk = q.dim(r - 2);
    g.e = g.ev = width / (3 * heads);
    int64_t d = width / 3;
    g.oq = {0, g.lq * width, g.e, width};
    g.ok = {d, g.lq * width, g.e, width};
    g.ov = {2 * d, g.lq * width, g.e, width};
    g.oy = {0, g.lq * d, g.e, d};  // Y [..., L, H, E]
    if (bias) {
      if (bias->dtype() != F32 || bias->numel() != width)
        ctx.fail(str_cat("the qkv bias must be float32 with ", width,
                         " elements (X's last dim), got ", bias->describe()));
      g.bias = bias->data<float>();
    }
  } else {
    if (bias) ctx.fail("a qkv bias (Attention's input 4) needs packed=1");
    bool inside = n.attr_int("heads_inside", 0) != 0;
    if (r < (inside ? 3u : 2u) || k.rank() != r || v.rank() != r)
      ctx.fail(str_cat("Q, K and V must have the same rank, ", inside ? 3 : 2, " or more; got ",
                       q.shape(), ", ", k.shape(), ", ", v.shape()));
    for (size_t i = 0; i + 3 < r; ++i) {
      if (k.dim(i) != q.dim(i) || v.dim(i) != q.dim(i))
        ctx.fail(str_cat("Q, K and V must have the same batch dims; got ", q.shape(), ", ",
                         k.shape(), ", ", v.shape()));
      batch_dims.push_back(q.dim(i));
    }
    // The dims (heads, rows) of the layout: [..., H, L, D] or [..., L, H, D].
    size_t hd = inside ? r - 2 : r - 3, ld = inside ? r - 3 : r - 2;
    g.hq = r >= 3 ? q.dim(hd) : 1;
    g.hk = r >= 3 ? k.dim(hd) : 1;
    g.lq = q.dim(ld);
    g.lk = k.dim(ld);
    g.e = q.dim(r - 1);
    g.ev = v.dim(r - 1);
    if (k.dim(r - 1) != g.e || v.dim(ld) != g.lk || (r >= 3 && v.dim(hd) != g.hk))
      ctx.fail(str_cat("K and V do not fit Q: ", q.shape(), ", ", k.shape(), ", ", v.shape()));
    if (g.hk == 0 || g.hq % g.hk != 0)
      ctx.fail(
          str_cat("query heads (", g.hq, ") must be a multiple of key/value heads (", g.hk, ")"));
    auto layout = [inside](int64_t heads, int64_t len, int64_t d) {
      return inside ? Operand{0, len * heads * d, d, heads * d}
                    : Operand{0, heads * len * d, len * d, d};
    };
    g.oq = layout(g.hq, g.lq, g.e);
    g.ok = layout(g.hk, g.lk, g.e);
    g.ov = layout(g.hk, g.lk, g.ev);
    g.oy = layout(g.hq, g.lq, g.ev);
  }
  for (int64_t d : batch_dims) g.batch *= d;
  g.rows = batch_dims;
  if (r >= 3 || n.attr_int("packed", 0) != 0) g.rows.push_back(g.hq);
  g.rows.push_back(g.lq);
  g.scale = n.attr_float("scale", 0.0f);
  if (g.scale == 0.0f) g.scale = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(g.e, 1)));
  g.causal = n.attr_int("causal", 0) != 0;
  g.dropout = n.attr_float("dropout", 0.0f);
  if (mask) {
    if (mask->dtype() != DType::kBool && mask->dtype() != DType::kFloat32)
      ctx.fail("the mask must be bool or float32, not " + std::string(to_string(mask->dtype())));
    // Right-aligned broadcast against the scores [batch..., Hq, Lq, Lk].
    Shape full = g.rows;
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
    g.find_mask_ends(ctx.pool());
  }
  return g;
}

class AttentionKernel : public OpKernel {
 public:
  explicit AttentionKernel(const Node&) : seed_(fresh_seed()) {}

  void compute(KernelContext& ctx) override {
    bool packed = ctx.node().attr_int("packed", 0) != 0;
    const Tensor& q = ctx.input(0);
    const Tensor& k = packed ? q : ctx.input(1);
    const Tensor& v = packed ? q : ctx.input(2);
    const Tensor* mask = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    Geometry g = geometry(ctx, q, k, v, mask, ctx.has_input(4) ? &ctx.input(4) : nullptr);
    g.key = g.dropout > 0 ? mix(seed_ ^ mix(calls_++)) : 0;
    Shape ys = q.shape();
    ys.back() = g.ev;
    if (packed) {  // [..., L, 3 D] -> [..., L, H, E]
      ys.back() = g.hq;
      ys.push_back(g.ev);
    }
    Tensor& y = ctx.allocate_output(0, F32, ys);
    Tensor& lse = ctx.allocate_output(1, F32, g.rows);
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
      std::vector<float> s(static_cast<size_t>(kTileQ * kBlockK));
      std::vector<float> m(kBlockQ), l(kBlockQ), acc(static_cast<size_t>(kBlockQ * g.ev));
      std::vector<float> kt(static_cast<size_t>(g.e * kBlockK));
      // With a bias: this block's queries and the head's values, biased (contiguous rows).
      std::vector<float> qb(g.bias ? static_cast<size_t>(kBlockQ * g.e) : 0);
      std::vector<float> vb(g.bias ? static_cast<size_t>(g.lk * g.ev) : 0);
      for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / (g.hq * qblocks), h = t / qblocks % g.hq, qb_index = t % qblocks;
        int64_t q0 = qb_index * kBlockQ, nq = std::min(kBlockQ, g.lq - q0);
        int64_t hk = h / g.group();
        const float* kp = pk + g.ok.at(b, hk);
        // Query row q0 and the value rows, and their strides.
        const float* qrows = pq + g.oq.at(b, h) + q0 * g.oq.row;
        const float* vrows = pv + g.ov.at(b, hk);
        int64_t ldq = g.oq.row, ldv = g.ov.row;
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        int64_t kend = g.visible_end(b, h, q0, nq);
        if (g.bias) {
          add_bias_rows(qrows, ldq, nq, g.e, g.bias_of(g.oq, h), qb.data());
          add_bias_rows(vrows, ldv, kend, g.ev, g.bias_of(g.ov, hk), vb.data());
          qrows = qb.data();
          vrows = vb.data();
          ldq = g.e;
          ldv = g.ev;
        }
        for (int64_t k0 = 0; k0 < kend; k0 += kBlockK) {
          int64_t nk = std::min(kBlockK, kend - k0);
          transpose_matrix(kp + k0 * g.ok.row, nk, g.e, g.ok.row, kt.data(), nk);
          if (g.bias) add_bias_transposed(kt.data(), nk, g.e, nk, g.bias_of(g.ok, hk));
          for (int64_t r0 = 0; r0 < nq; r0 += kTileQ) {
            int64_t nr = std::min(kTileQ, nq - r0);
            int64_t cols = std::min(g.visible_end(b, h, q0 + r0, nr), k0 + nk) - k0;
            if (cols <= 0) continue;  // these rows see nothing here
            g.scores(qrows + r0 * ldq, ldq, kt.data(), nk, b, h, q0 + r0, nr, k0, cols, s.data());
            for (int64_t r = 0; r < nr; ++r) {
              float* row = s.data() + r * cols;
              float& mr = m[static_cast<size_t>(r0 + r)];
              float& lr = l[static_cast<size_t>(r0 + r)];
              float mx = std::max(mr, vec::max(row, cols));
              if (mx == kNegInf) {  // nothing visible yet in this row
                std::fill(row, row + cols, 0.0f);
                continue;
              }
              if (mr != kNegInf && mr != mx) {  // rescale what the row holds to the new max
                float alpha = std::exp(mr - mx);
                lr *= alpha;
                float* ar = acc.data() + (r0 + r) * g.ev;
                vec::map(ar, ar, g.ev, [alpha](auto x) { return x * alpha; });
              }
              lr += vec_exp_sum(row, row, cols, mx);
              mr = mx;
              if (g.dropout > 0)
                for (int64_t c = 0; c < cols; ++c)
                  row[c] = keep(g.key, g.element(b, h, q0 + r0 + r, k0 + c), g.dropout)
                               ? row[c] * drop_scale
                               : 0.0f;
            }
            vec_small_gemm(nr, g.ev, cols, 1.0f, s.data(), cols, 1, vrows + k0 * ldv, ldv, true,
                           acc.data() + r0 * g.ev, g.ev);
          }
        }
        float* yp = py + g.oy.at(b, h);
        for (int64_t r = 0; r < nq; ++r) {
          float lr = l[static_cast<size_t>(r)], inv = lr > 0 ? 1.0f / lr : 0.0f;
          vec::map(acc.data() + r * g.ev, yp + (q0 + r) * g.oy.row, g.ev,
                   [inv](auto x) { return x * inv; });
          pl[(b * g.hq + h) * g.lq + q0 + r] =
              lr > 0 ? m[static_cast<size_t>(r)] + std::log(lr) : kNegInf;
        }
      }
    });
  }

 private:
  uint64_t seed_ = 0;
  uint64_t calls_ = 0;
};

// AttentionGrad(dY, Q, K, V, Y, LSE, mask?, seed?) -> (dQ, dK, dV, dMask?); packed: (dY, X, -, -,
// Y, ..., qkv bias?) -> (dX, -, -, dMask?), the bias at input 8. One task per (batch, key/value
// head): it owns dK and dV of that head and dQ of the query heads reading it, so no two tasks write
// one element and every sum runs in a fixed order.
void attention_grad(KernelContext& ctx) {
  bool packed = ctx.node().attr_int("packed", 0) != 0;
  const Tensor& dy = ctx.input(0);
  const Tensor& q = ctx.input(1);
  const Tensor& k = packed ? q : ctx.input(2);
  const Tensor& v = packed ? q : ctx.input(3);
  const Tensor& y = ctx.input(4);
  const Tensor& lse = ctx.input(5);
  const Tensor* mask = ctx.has_input(6) ? &ctx.input(6) : nullptr;
  Geometry g = geometry(ctx, q, k, v, mask, ctx.has_input(8) ? &ctx.input(8) : nullptr);
  g.key = ctx.has_input(7) ? static_cast<uint64_t>(ctx.input(7).to_int64_vector()[0]) : 0;
  Tensor& dq = ctx.allocate_output(0, F32, q.shape());
  Tensor& dk = packed ? dq : ctx.allocate_output(1, F32, k.shape());
  Tensor& dv = packed ? dq : ctx.allocate_output(2, F32, v.shape());
  // dMask (only when a float mask wants a gradient): the score gradients, [..., Hq, Lq, Lk].
  float* pdm = nullptr;
  if (ctx.output_requested(3)) {
    Shape ms = g.rows;
    ms.push_back(g.lk);
    Tensor& dm = ctx.allocate_output(3, F32, ms);
    std::memset(dm.raw_data(), 0, dm.nbytes());
    pdm = dm.data<float>();
  }
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const float *pdy = dy.data<float>(), *py = y.data<float>(), *pl = lse.data<float>();
  float *pdq = dq.data<float>(), *pdk = dk.data<float>(), *pdv = dv.data<float>();
  float drop_scale = g.dropout < 1.0f ? 1.0f / (1.0f - g.dropout) : 0.0f;
  const int64_t ldq = g.oq.row, ldk = g.ok.row, ldv = g.ov.row, ldy = g.oy.row;
  parallel_for(ctx, g.batch * g.hk, g.group() * g.lq * g.lk * (g.e + g.ev) * 4,
               [&](int64_t t0, int64_t t1) {
                 std::vector<float> p(static_cast<size_t>(kTileQ * kBlockK));
                 std::vector<float> dp(p.size()), pd(p.size()), d(kTileQ);
                 // The head's keys and values, transposed once: [e, lk] and [ev, lk].
                 std::vector<float> kt(static_cast<size_t>(g.e * g.lk)),
                     vt(static_cast<size_t>(g.ev * g.lk));
                 // With a bias: the head's keys and each query head's queries, biased.
                 std::vector<float> kb(g.bias ? static_cast<size_t>(g.lk * g.e) : 0);
                 std::vector<float> qb(g.bias ? static_cast<size_t>(g.lq * g.e) : 0);
                 for (int64_t t = t0; t < t1; ++t) {
                   int64_t b = t / g.hk, hk = t % g.hk;
                   const float* kp = pk + g.ok.at(b, hk);
                   const float* vp = pv + g.ov.at(b, hk);
                   float* dkp = pdk + g.ok.at(b, hk);
                   float* dvp = pdv + g.ov.at(b, hk);
                   int64_t ldk_in = ldk;  // the stride of the keys read (biased: contiguous)
                   if (g.bias) {
                     add_bias_rows(kp, ldk, g.lk, g.e, g.bias_of(g.ok, hk), kb.data());
                     kp = kb.data();
                     ldk_in = g.e;
                   }
                   transpose_matrix(kp, g.lk, g.e, ldk_in, kt.data(), g.lk);
                   transpose_matrix(vp, g.lk, g.ev, ldv, vt.data(), g.lk);
                   if (g.bias)
                     add_bias_transposed(vt.data(), g.lk, g.ev, g.lk, g.bias_of(g.ov, hk));
                   // This task's slices of the gradients, zeroed here (in parallel) to be summed
                   // into.
                   zero_rows(dkp, g.lk, g.e, ldk);
                   zero_rows(dvp, g.lk, g.ev, ldv);
                   for (int64_t h = hk * g.group(); h < (hk + 1) * g.group(); ++h) {
                     const float* qp = pq + g.oq.at(b, h);
                     int64_t ldq_in = ldq;
                     if (g.bias) {
                       add_bias_rows(qp, ldq, g.lq, g.e, g.bias_of(g.oq, h), qb.data());
                       qp = qb.data();
                       ldq_in = g.e;
                     }
                     const float* dyp = pdy + g.oy.at(b, h);
                     const float* yp = py + g.oy.at(b, h);
                     const float* lp = pl + (b * g.hq + h) * g.lq;
                     float* dqp = pdq + g.oq.at(b, h);
                     int64_t rows = (b * g.hq + h) * g.lq;  // the head's first row in LSE and dMask
                     for (int64_t q0 = 0; q0 < g.lq; q0 += kTileQ) {
                       int64_t nq = std::min(kTileQ, g.lq - q0);
                       for (int64_t r = 0; r < nq; ++r) {  // D = rowsum(dY * Y)
                         d[static_cast<size_t>(r)] =
                             vec::dot_centered(dyp + (q0 + r) * ldy, yp + (q0 + r) * ldy, g.ev, 0);
                       }
                       zero_rows(dqp + q0 * ldq, nq, g.e, ldq);
                       int64_t kend = g.visible_end(b, h, q0, nq);
                       for (int64_t k0 = 0; k0 < kend; k0 += kBlockK) {
                         int64_t nk = std::min(kBlockK, kend - k0);
                         g.scores(qp + q0 * ldq_in, ldq_in, kt.data() + k0, g.lk, b, h, q0, nq, k0,
                                  nk, p.data());
                         vec_exp_rows(p.data(), nq, nk, lp + q0);  // P = exp(S - LSE), 0 masked
                         // dP = dY V^T
                         vec_small_gemm(nq, nk, g.ev, 1.0f, dyp + q0 * ldy, ldy, 1, vt.data() + k0,
                                        g.lk, false, dp.data(), nk);
                         const float* pk_used = p.data();  // the probabilities dV takes
                         if (g.dropout > 0) {
                           // dV takes the dropped probabilities; dP reaches P through the same
                           // mask.
                           for (int64_t r = 0; r < nq; ++r)
                             for (int64_t c = 0; c < nk; ++c) {
                               bool kept = keep(g.key, g.element(b, h, q0 + r, k0 + c), g.dropout);
                               size_t i = static_cast<size_t>(r * nk + c);
                               pd[i] = kept ? p[i] * drop_scale : 0.0f;
                               dp[i] *= kept ? drop_scale : 0.0f;
                             }
                           pk_used = pd.data();
                         }
                         vec_small_gemm(nk, g.ev, nq, 1.0f, pk_used, 1, nk, dyp + q0 * ldy, ldy,
                                        true, dvp + k0 * ldv, ldv);
                         for (int64_t r = 0; r < nq; ++r) {  // dS = P * (dP - D), into dp
                           float* ds = dp.data() + r * nk;
                           const float* pr = p.data() + r * nk;
                           float dr = d[static_cast<size_t>(r)];
                           for (int64_t c = 0; c < nk; ++c) ds[c] = pr[c] * (ds[c] - dr);
                           if (pdm)
                             std::memcpy(pdm + (rows + q0 + r) * g.lk + k0, ds, sizeof(float) * nk);
                         }
                         vec_small_gemm(nq, g.e, nk, g.scale, dp.data(), nk, 1, kp + k0 * ldk_in,
                                        ldk_in, true, dqp + q0 * ldq, ldq);
                         vec_small_gemm(nk, g.e, nq, g.scale, dp.data(), 1, nk, qp + q0 * ldq_in,
                                        ldq_in, true, dkp + k0 * ldk, ldk);
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
